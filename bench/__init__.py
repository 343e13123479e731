"""Benchmarks and probes: `python -m bench COMMAND [options] [hydra overrides]`.

bench/__main__.py is the command (it lists them): it hands the rest of the line to the main of the benchmark
named. One module per benchmark, none importing another, each also a command of its own
(`python -m bench.pack ...`) that parses its line into plain settings, measures and writes what that returns;
bench/line.py holds what their command lines share, bench/common.py the measuring they share. Nothing in
sweeper/, models/ or tasks/ imports from here, and nothing here imports or names a module of sweeper/: the
sweep driver at scale is measured by a command of its own package (docs/cluster.md).
"""

import runpy
from pathlib import Path

# First of all: `python -m` in a folder with a config.py or models/ of its own would import those in place of
# the project's packages (cli/shadowing.py says so in one line; loaded by its path: `cli` may be shadowed).
runpy.run_path(str(Path(__file__).resolve().parent.parent / "cli" / "shadowing.py"))["check"]()
