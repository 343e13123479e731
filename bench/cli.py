"""Speed and memory benchmarks and probes: `python -m bench COMMAND [options] [key=value overrides]`.

`python -m bench COMMAND --help` lists a command's options. step, pack, sweep,
step_seconds and speed_memory print JSON on stdout and progress on stderr; gpu prints JSON and a
table. The sweep driver at scale is measured where it lives, by a command of sweeper/ (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import configure, exit_codes_help, log, write
from bench.pack import OP_PACKS, PACKS, SIZES, THREADS, bench_pack, parse_size, plan_from, table
from cli.entry import ArgumentParser, command
from config.compose import compose
from config.help import composed_config
from models.options import REGULARIZERS

COMMANDS = {
    "step": "the real training step against the straightforward one, alternately (bench/step.py)",
    "pack": "model-steps/s solo and in packs, and operator calls per pack step (bench/pack.py)",
    "sweep": "projected wall time of the paper grid from measured solo and pack steps (bench/sweep.py)",
    "step_seconds": "seconds per training step of a sweep's onehot/binary shapes (bench/step_seconds.py)",
    "speed_memory": "binary against onehot: forward/backward time and peak memory over d and k",
    "gpu": "the one-shot check of a GPU node (bench/gpu.py; `python -m bench gpu --help`)",
}
PROBES = ("gpu",)  # with parsers of their own


def some(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers >= 1, or '' for none."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = (0,)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers >= 1")
    return values


def counts(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers >= 1, at least one."""
    if not some(text):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers >= 1, at least one")
    return some(text)


def sizes(text: str) -> dict[str, tuple[int, int, int]]:
    try:
        return {s: parse_size(s) for s in text.split(",")}
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def regularizers(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    if not all(name in REGULARIZERS for name in names):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated names of {', '.join(REGULARIZERS)}")
    return names


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: an integer >= 1")
    return int(text)


def parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    top = ArgumentParser(
        prog="python -m bench", description=__doc__, epilog=exit_codes_help(), formatter_class=raw
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, about in COMMANDS.items():
        sub.add_parser(
            name,
            help=about,
            description=about,
            usage=f"python -m bench {name} [options] [key=value overrides]",
            epilog=exit_codes_help(),
            formatter_class=raw,
        )
    for name in ("step", "sweep", "step_seconds", "speed_memory"):
        options = sub.choices[name]
        options.add_argument("--repeats", type=positive, default=5, help="measured rounds per variant (5)")
        options.add_argument("--threads", type=positive, help="torch threads (default: PyTorch's, all cores)")
    sub.choices["speed_memory"].add_argument("--quick", action="store_true", help="drops k = 1024")
    sub.choices["sweep"].add_argument(
        "--sweep-pack",
        type=int,
        default=10,
        help="also time packs of this many seeds per shape (0, 1: solo only)",
    )
    pack_options(sub.choices["pack"])
    for name in ("step", "pack", "sweep", "step_seconds", "speed_memory"):
        sub.choices[name].add_argument("--out", type=Path, help="also write the JSON to this file")
    return top


def pack_options(options: argparse.ArgumentParser) -> None:
    def listed(values: tuple) -> str:
        return ",".join(map(str, values))

    options.add_argument(
        "--sizes",
        type=sizes,
        help=f"names of {', '.join(f'{k} {v}' for k, v in SIZES.items())} or NxDxK, comma-separated "
        "(default: all, or the configured size when task.n/d/k are overridden)",
    )
    options.add_argument("--packs", type=counts, help=f"pack sizes ({listed(PACKS)})")
    options.add_argument(
        "--threads", type=counts, help=f"torch thread counts, each measured ({listed(THREADS)})"
    )
    options.add_argument(
        "--op-packs",
        type=some,
        help=f"pack sizes whose operator calls are counted ({listed(OP_PACKS)}; '' none)",
    )
    options.add_argument(
        "--regularizers",
        type=regularizers,
        help="loss.regularizer of the pack's models in turn, e.g. l2,l2,l2,ne: a pack of 12 with 9 l2 and "
        "3 ne models, as make reproduce's largest (default: the configured one for all; solo: the first)",
    )
    options.add_argument("--repeats", type=positive, help="measured rounds per variant (5)")
    options.add_argument("--steps", type=positive, default=1, help="training steps per timed call (1)")
    options.add_argument(
        "--memory", action="store_true", help="peak memory on CPU too (slow); always on CUDA"
    )
    options.add_argument(
        "--quick", action="store_true", help="laptop size, 1 thread, packs 1,3,10, ops of 1,10, 3 rounds"
    )
    options.add_argument("--table", type=Path, help="also write the table (printed on stderr) to this file")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options of the measuring commands; the rest are config overrides."""
    top = parser()
    args, overrides = top.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        top.error(f"unknown option(s) {' '.join(unknown)}; config overrides are key=value")
    return args, overrides


def measure(args: argparse.Namespace, overrides: list[str]) -> dict:
    cfg = compose(overrides)
    if args.command == "pack":
        result = bench_pack(cfg, plan_from(args, cfg, overrides))
        text = table(result)
        log(text)
        if args.table:
            write(args.table, text)
        return result
    configure(args.threads)
    if args.command == "step":
        from bench.step import bench_step

        return bench_step(cfg, args.repeats)
    if args.command == "step_seconds":
        from bench.step_seconds import bench_step_seconds

        return bench_step_seconds(overrides, args.repeats, args.threads)
    if args.command == "sweep":
        from bench.sweep import bench_sweep

        return bench_sweep(overrides, args.repeats, args.sweep_pack)
    from bench.speed_memory import bench_speed_memory

    return bench_speed_memory(cfg, args.repeats, args.quick)


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    if argv and argv[0] in PROBES:
        from importlib import import_module

        return import_module(f"bench.{argv[0]}").main(argv[1:])
    args, overrides = parse(argv)
    text = json.dumps(measure(args, overrides), indent=2)
    print(text)
    if args.out:
        write(args.out, text)
    return 0
