"""Speed and memory benchmarks and probes: `python -m bench COMMAND [options] [key=value overrides]`.

`python -m bench COMMAND --help` lists a command's options. Each command is a module of bench/ that also runs
alone, `python -m bench.COMMAND [options] [key=value overrides]`. step, pack, sweep,
step_seconds and speed_memory print JSON on stdout and progress on stderr; gpu prints JSON and a
table. The sweep driver at scale is measured where it lives, by a command of sweeper/ (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import sys

from bench import gpu, pack, speed_memory, step, step_seconds, sweep
from bench.line import exit_codes_help
from cli.entry import ArgumentParser, command
from config.help import composed_config

COMMANDS = {
    "step": step.ABOUT,
    "pack": pack.ABOUT,
    "sweep": sweep.ABOUT,
    "step_seconds": step_seconds.ABOUT,
    "speed_memory": speed_memory.ABOUT,
    "gpu": "the one-shot check of a GPU node (bench/gpu.py; `python -m bench gpu --help`)",
}


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    """The benchmark the first word names, run by its own main (`python -m bench.NAME`) on the rest."""
    name = parse(argv)
    if name == "step":
        return step.main(argv[1:])
    if name == "pack":
        return pack.main(argv[1:])
    if name == "sweep":
        return sweep.main(argv[1:])
    if name == "step_seconds":
        return step_seconds.main(argv[1:])
    if name == "speed_memory":
        return speed_memory.main(argv[1:])
    return gpu.main(argv[1:])


def parse(argv: list[str]) -> str:
    """The command the line names (its first word); the rest of the line is that command's to parse."""
    return parser().parse_args(argv[:1]).command


def parser() -> argparse.ArgumentParser:
    top = ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, about in COMMANDS.items():
        sub.add_parser(name, help=about)
    return top


if __name__ == "__main__":
    sys.exit(main())
