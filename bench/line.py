"""What the benchmarks' command lines share: each benchmark's parser, the options several take, and the JSON
written.

Each benchmark is a command of its own (`python -m bench.NAME`, also `python -m bench NAME`): its module
parses its line with these (argparse's intermixed parse: options and key=value overrides in any order),
hands the settings to its measurement and writes what that returns.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cli.entry import ArgumentParser
from cli.exit_codes import TABLE


def exit_codes_help() -> str:
    """The exit codes for --help (cli/exit_codes.py's table); bench itself ends with 0, 1 or 2."""
    rows = [f"  {row.code:<4} {row.meaning}" for row in TABLE]
    return "exit codes (cli/exit_codes.py; bench: 0, 1 when the gpu check failed, 2):\n" + "\n".join(rows)


def parser(name: str, about: str) -> ArgumentParser:
    """A benchmark's parser, before its options: `python -m bench NAME [options] [key=value overrides]`. The
    overrides are its positional words; an option it does not know is an error (argparse's)."""
    options = ArgumentParser(
        prog=f"python -m bench {name}",
        usage=f"python -m bench {name} [options] [key=value overrides]",
        description=about,
        epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, composed")
    return options


def positive(text: str) -> int:
    """An option's integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: an integer >= 1")
    return int(text)


@dataclass(frozen=True)
class Timing:
    """A timing benchmark's line, parsed (step, step_seconds, speed_memory, sweep)."""

    overrides: list[str]  # as written: step composes them alone, sweep with each grid configuration
    repeats: int  # measured rounds per variant
    threads: int | None  # torch threads; None: the benchmark's default
    out: Path | None  # the JSON, also to this file
    args: argparse.Namespace  # the whole parse, for the options of one benchmark alone (--quick)


def timing(
    name: str, about: str, argv: list[str], own: Callable[[argparse.ArgumentParser], None] = lambda _: None
) -> Timing:
    """Parse a timing benchmark's line: --repeats, --threads, the options `own` adds, --out, overrides."""
    options = parser(name, about)
    options.add_argument("--repeats", type=positive, default=5, help="measured rounds per variant (5)")
    options.add_argument("--threads", type=positive, help="torch threads (default: PyTorch's, all cores)")
    own(options)
    out_option(options)
    args = options.parse_intermixed_args(argv)
    return Timing(args.overrides, args.repeats, args.threads, args.out, args)


def out_option(options: argparse.ArgumentParser) -> None:
    """--out, every benchmark's last option."""
    options.add_argument("--out", type=Path, help="also write the JSON to this file")


def print_json(result: dict, out: Path | None) -> None:
    """The benchmark's JSON on stdout, and to `out` (--out)."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        write(out, text)


def write(path: Path, text: str) -> None:
    """An output file (--out, pack's --table), its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
