"""Speed and memory benchmarks and probes: `python -m bench COMMAND [options] [key=value overrides]`.

`python -m bench COMMAND --help` lists a command's options. step, pack, sweep,
step_seconds and speed_memory print JSON on stdout and progress on stderr; gpu prints JSON and a
table. The sweep driver at scale is measured where it lives, by a command of sweeper/ (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from bench.common import configure, exit_codes_help, log
from bench.pack import OP_PACKS, PACKS, QUICK, SIZES, THREADS, Plan, bench_pack, parse_size, table
from bench.speed_memory import bench_speed_memory
from bench.step import bench_step
from bench.step_seconds import bench_step_seconds
from bench.sweep import bench_sweep
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
SIZE_KEYS = ("task.n", "task.d", "task.k")  # an override of one measures pack at the configured size


@dataclass(frozen=True)
class Settings:
    """A measuring command's line, parsed: the one benchmark to run, what it measures, where it writes."""

    command: str
    cfg: DictConfig  # the overrides, composed
    overrides: list[str]  # step_seconds and sweep compose their grid's configurations from them
    repeats: int  # measured rounds per variant
    threads: int | None  # torch threads, None: PyTorch's (pack's: in plan)
    quick: bool = False  # speed_memory's
    sweep_pack: int = 0  # sweep's
    plan: Plan | None = None  # pack's
    out: Path | None = None  # the JSON, also to this file
    table: Path | None = None  # pack's table, also to this file


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
    top.set_defaults(quick=False, sweep_pack=0)  # for the commands without the option: Settings has them all
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


def pack_plan(args: argparse.Namespace, cfg: DictConfig, overrides: list[str]) -> Plan:
    """What `python -m bench pack` measures; --quick fills what the options leave.

    Without --sizes: the configured size alone when the overrides set task.n, d or k, else SIZES.
    """
    quick = QUICK if args.quick else {}
    if args.sizes:
        chosen = args.sizes
    elif any(o.split("=")[0].lstrip("+") in SIZE_KEYS for o in overrides):
        chosen = {"configured": (cfg.task.n, cfg.task.d, cfg.task.k)}
    else:
        chosen = {name: SIZES[name] for name in quick.get("sizes", SIZES)}
    return Plan(
        sizes=chosen,
        packs=args.packs or quick.get("packs", PACKS),
        threads=args.threads or quick.get("threads", THREADS),
        op_packs=args.op_packs if args.op_packs is not None else quick.get("op_packs", OP_PACKS),
        repeats=args.repeats or quick.get("repeats", 5),
        steps=args.steps,
        memory=args.memory,
        regularizers=args.regularizers or (),
    )


def parse(argv: list[str]) -> Settings:
    """The options of the measuring commands; the rest are config overrides, composed here."""
    top = parser()
    args, overrides = top.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        top.error(f"unknown option(s) {' '.join(unknown)}; config overrides are key=value")
    cfg = compose(overrides)
    if args.command == "pack":  # its --threads are counts, each measured: the plan holds them
        plan = pack_plan(args, cfg, overrides)
        return Settings(
            "pack", cfg, overrides, plan.repeats, threads=None, plan=plan, out=args.out, table=args.table
        )
    return Settings(
        args.command,
        cfg,
        overrides,
        args.repeats,
        args.threads,
        quick=args.quick,
        sweep_pack=args.sweep_pack,
        out=args.out,
    )


def measure(s: Settings) -> dict:
    """The one benchmark the command names, run: its JSON."""
    if s.command == "pack":
        return bench_pack(s.cfg, s.plan)
    configure(s.threads)
    if s.command == "step":
        return bench_step(s.cfg, s.repeats)
    if s.command == "step_seconds":
        return bench_step_seconds(s.overrides, s.repeats, s.threads)
    if s.command == "sweep":
        return bench_sweep(s.overrides, s.repeats, s.sweep_pack)
    return bench_speed_memory(s.cfg, s.repeats, s.quick)


def write_result(result: dict, settings: Settings) -> None:
    """Every output of the command, once: pack's table on stderr (and --table), then the JSON on stdout
    (and --out)."""
    if settings.command == "pack":
        text = table(result)
        log(text)
        if settings.table:
            write(settings.table, text)
    text = json.dumps(result, indent=2)
    print(text)
    if settings.out:
        write(settings.out, text)


def write(path: Path, text: str) -> None:
    """An output file (--out, --table), its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    if argv and argv[0] in PROBES:
        from importlib import import_module

        return import_module(f"bench.{argv[0]}").main(argv[1:])
    settings = parse(argv)
    result = measure(settings)
    write_result(result, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
