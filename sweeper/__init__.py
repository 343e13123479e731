"""The command lines, a module each (sweep, train, rerun, archive, preflight, mask_store, scale_probe), and
the two jobs behind them: the sweep driver (driver/) and the scale probe that measures it (scale/)."""

import runpy
from pathlib import Path

# First of all: `python -m` in a folder with a config.py or models/ of its own would import those in place of
# the project's packages (cli/shadowing.py says so in one line; loaded by its path: `cli` may be shadowed).
runpy.run_path(str(Path(__file__).resolve().parent.parent / "cli" / "shadowing.py"))["check"]()
