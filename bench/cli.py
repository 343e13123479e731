"""Speed and memory benchmarks and probes: `python -m bench COMMAND [options] [hydra overrides]`.

    step          the real training step against the straightforward one, alternately (bench/step.py)
    pack          solo against packed training, pack sizes 1, 2, 5, 10, 30 (bench/pack.py)
    sweep         projected wall time of the paper grid from measured step times (bench/sweep.py)
    speed_memory  binary against onehot: forward/backward time and peak memory over d and k (bench/speed_memory.py)
    gpu           the one-shot check of a GPU node: `python -m bench gpu --out FILE [--tiny]` (bench/gpu.py)
    scale         the sweep driver at 300 to 3,000 trials: `python -m bench scale [TRIALS ...]` (bench/scale.py)

The first four print JSON on stdout and progress on stderr; `gpu` and `scale`
have their own options (`python -m bench gpu --help`). Exit codes
as for every command (sweeper/exit_codes.py; 1: a check of gpu or scale failed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import configure
from config.compose import compose
from sweeper.entry import command

MEASURES = ("step", "pack", "sweep", "speed_memory")
PROBES = ("gpu", "scale")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options of the four measuring commands; the rest are config overrides."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=MEASURES + PROBES)
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds per variant (default 5)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: PyTorch's, all cores)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds (speed_memory)")
    parser.add_argument("--packs", type=str, default="1,2,5,10,30", help="pack sizes for `pack`")
    parser.add_argument(
        "--sweep-pack",
        type=int,
        default=10,
        help="`sweep`: also time packs of this many seeds per shape (0 or 1: solo only)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unknown option(s) {' '.join(unknown)}; config overrides are key=value")
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} is not allowed: an integer >= 1")
    return args, overrides


def measure(args: argparse.Namespace, overrides: list[str]) -> dict:
    cfg = compose(overrides)
    if args.command == "step":
        from bench.step import bench_step

        return bench_step(cfg, args.repeats)
    if args.command == "pack":
        from bench.pack import bench_pack

        return bench_pack(cfg, [int(p) for p in args.packs.split(",")], args.repeats)
    if args.command == "sweep":
        from bench.sweep import bench_sweep

        return bench_sweep(overrides, args.repeats, args.sweep_pack)
    from bench.speed_memory import bench_speed_memory

    return bench_speed_memory(cfg, args.repeats, args.quick)


@command("leaner-bench", own_options=True)
def main(argv: list[str]) -> int:
    if argv and argv[0] == "gpu":
        from bench import gpu

        return gpu.main(argv[1:])
    if argv and argv[0] == "scale":
        from bench import scale

        return scale.main(argv[1:])
    args, overrides = parse(argv)
    configure(args.threads)
    result = measure(args, overrides)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0
