"""`python -m bench pack`: what packs (training.packed) pay, measured side by side in one run.

For each size (task n, d, k) and thread count: model-steps per second of solo
training and of packs of P seeds, with the FLOP rate beside each figure and
the ratio to solo (the median over rounds of paired ratios: the variants are
timed round robin, bench.common.alternate); and the operator calls of one pack
step for a few P, counted with torch.profiler (every aten:: call, nested ones
included; on CUDA also the kernel launches). A pack step whose operator count
grows with P pays per model for what a launch-bound GPU pays most: the count,
unlike the time, is the same on any machine, so a CPU shows it.

The defaults are the issue's full matrix (issue 20): the laptop size and the
paper's two, packs up to 100, threads 1 and 2, which takes the better part of
an hour on 2 cores and about 12 GB at n 512 with P 100; `--quick` measures
the laptop size at 1 thread with packs up to 10. `bench.common.pack_step` is
the one function that knows training's step entry point.

A timed call is `--steps` training steps. A step that does more than most
(tasks drawn for several steps at once, a read-back) shows in
seconds_per_step_mean, not in the median: give --steps a multiple of such a
period (e.g. train.log_every) for the amortised figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig

from bench.common import (
    alternate_with_matmul,
    describe,
    figures,
    free,
    log,
    memory_measure,
    pack_step,
    paired_ratio,
    peak_memory_bytes,
    step_flops,
)
from bench.line import out_option, parser, positive, print_json, write
from cli.entry import command
from config.compose import compose
from config.help import composed_config
from models.options import REGULARIZERS
from training.device import pick_device

ABOUT = "model-steps/s solo and in packs, and operator calls per pack step (bench/pack.py)"
SIZES = {"laptop": (128, 4, 6), "paper_k10": (512, 32, 10), "paper_k25": (512, 32, 25)}  # name: (n, d, k)
PACKS = (1, 3, 10, 30, 100)
THREADS = (1, 2)
OP_PACKS = (1, 10, 100)  # the pack sizes whose operator calls per step are counted
OP_STEPS = 3  # steps profiled one by one per pack size
QUICK = {"sizes": ("laptop",), "packs": (1, 3, 10), "threads": (1,), "op_packs": (1, 10), "repeats": 3}
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
SIZE_KEYS = ("task.n", "task.d", "task.k")  # an override of one measures the configured size


@dataclass(frozen=True)
class Plan:
    """What one run of the benchmark measures."""

    sizes: dict[str, tuple[int, int, int]]
    packs: tuple[int, ...]
    threads: tuple[int, ...]
    op_packs: tuple[int, ...]
    repeats: int
    steps: int = 1  # training steps per timed call
    memory: bool = False  # peak memory on CPU (slow: the profiler's memory timeline); always on CUDA
    regularizers: tuple[str, ...] = ()  # loss.regularizer of model i: regularizers[i % len]; () as configured


@dataclass(frozen=True)
class Settings:
    """`python -m bench pack`'s line, parsed: what it measures and where it writes."""

    cfg: DictConfig  # the overrides, composed
    plan: Plan
    device: torch.device  # train.device on this machine
    out: Path | None  # the JSON, also to this file
    table: Path | None  # the table, also to this file


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    settings = parse(argv)
    result = bench_pack(settings.cfg, settings.plan, settings.device)
    text = table(result)
    log(text)
    if settings.table:
        write(settings.table, text)
    print_json(result, settings.out)
    return 0


def parse(argv: list[str]) -> Settings:
    """The options, and the config overrides composed; the device picked once, on this machine."""
    args = pack_options().parse_intermixed_args(argv)
    cfg = compose(args.overrides)
    plan = pack_plan(args, cfg)
    return Settings(cfg, plan, pick_device(cfg.train.device), args.out, args.table)


def pack_plan(args: argparse.Namespace, cfg: DictConfig) -> Plan:
    """What the line measures; --quick fills what the options leave. Without --sizes: the configured size
    alone when the overrides set task.n, d or k, else SIZES."""
    quick = QUICK if args.quick else {}
    if args.sizes:
        chosen = args.sizes
    elif any(o.split("=")[0].lstrip("+") in SIZE_KEYS for o in args.overrides):
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


def pack_options() -> argparse.ArgumentParser:
    def listed(values: tuple) -> str:
        return ",".join(map(str, values))

    options = parser("pack", ABOUT)
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
    out_option(options)
    return options


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


def parse_size(text: str) -> tuple[int, int, int]:
    """A --sizes entry: a name of SIZES or NxDxK."""
    if text in SIZES:
        return SIZES[text]
    parts = text.split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--sizes entry {text!r}: one of {', '.join(SIZES)}, or NxDxK (e.g. 128x4x6)")
    n, d, k = map(int, parts)
    return n, d, k


def regularizers(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    if not all(name in REGULARIZERS for name in names):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated names of {', '.join(REGULARIZERS)}")
    return names


def bench_pack(cfg: DictConfig, plan: Plan, device: torch.device) -> dict:
    """The benchmark's JSON: model-steps/s and operator calls per step, per size (module docstring)."""
    before = torch.get_num_threads()
    try:
        sizes = []
        for name, size in plan.sizes.items():
            sizes.append(measure_size(sized(cfg, size), name, plan, device))
            free(device)  # this size's variants, before the next size's
    finally:
        torch.set_num_threads(before)
    return {
        "command": "pack",
        "config": describe(cfg),
        "device": str(device),
        "dtype": "float32",
        "steps_per_round": plan.steps,
        "repeats": plan.repeats,
        "memory_measure": memory_measure(device),
        "regularizers": list(plan.regularizers) or [cfg.loss.regularizer],
        "sizes": sizes,
    }


def sized(cfg: DictConfig, size: tuple[int, int, int]) -> DictConfig:
    out = cfg.copy()
    out.task.n, out.task.d, out.task.k = size
    return out


def measure_size(cfg: DictConfig, name: str, plan: Plan, device: torch.device) -> dict:
    """Every thread count and pack of one size, then the operator calls of its op_packs."""
    cfgs = pack_models(cfg, plan, max((1, *plan.packs, *plan.op_packs)))
    peaks = isolated_peaks(cfgs, plan, device)  # first, while no other variant is alive
    steps = {"solo": pack_step(cfgs[:1], device)}
    steps.update({f"pack{P}": pack_step(cfgs[:P], device) for P in plan.packs})
    log(f"pack: {name} {describe(cfg)} on {device}, packs {plan.packs}, threads {plan.threads}")
    flops = step_flops(cfg)
    rows = []
    for threads in plan.threads:
        torch.set_num_threads(threads)
        rows.append(measure_threads(steps, plan, flops, device, peaks))
    calls = []
    for P in plan.op_packs:
        step = steps.get(f"pack{P}") or pack_step(cfgs[:P], device)
        step()  # warm: first calls allocate and initialise optimizer state
        calls.append({"pack": P, **op_calls(step, device)})
    t = cfg.task
    return {
        "size": name,
        "n": t.n,
        "d": t.d,
        "k": t.k,
        "flops_per_step": flops,
        "threads": rows,
        "op_calls": calls,
    }


def pack_models(cfg: DictConfig, plan: Plan, count: int) -> list[DictConfig]:
    """The configurations of the largest pack: seeds cfg.seed, cfg.seed + 1, ...; with plan.regularizers,
    model i's loss.regularizer is regularizers[i % len] (a pack P is the first P of them)."""
    cfgs = []
    for i in range(count):
        model = cfg.copy()
        model.seed = cfg.seed + i
        if plan.regularizers:
            model.loss.regularizer = plan.regularizers[i % len(plan.regularizers)]
        cfgs.append(model)
    return cfgs


def isolated_peaks(cfgs: list[DictConfig], plan: Plan, device: torch.device) -> dict[str, int]:
    """Peak memory of one step of solo and of each pack, each built alone, warmed, measured and freed before
    the next: its own weights, moments and step, nothing of another variant's (bench.common.peak_memory_bytes;
    on CPU only with plan.memory)."""
    if not (plan.memory or device.type == "cuda"):
        return {}
    peaks = {}
    for name, count in [("solo", 1), *((f"pack{P}", P) for P in plan.packs)]:
        step = pack_step(cfgs[:count], device)
        step()  # warm: the first step allocates the optimizer state and the task chunk
        peaks[name] = peak_memory_bytes(step, device)
        del step
        free(device)
    return peaks


def measure_threads(
    steps: dict[str, Callable[[], object]],
    plan: Plan,
    flops: int,
    device: torch.device,
    peaks: dict[str, int],
) -> dict:
    """Solo and every pack at the current thread count, round robin with the reference matmul; peaks: what
    isolated_peaks measured (none: not measured)."""
    variants = {name: repeat(fn, plan.steps) for name, fn in steps.items()}
    times, rate = alternate_with_matmul(variants, plan.repeats, device)
    per_step = {name: [t / plan.steps for t in ts] for name, ts in times.items()}

    out = {
        "threads": torch.get_num_threads(),
        "matmul_flop_rate": rate,
        "solo": figures(per_step["solo"], flops, 1, peaks.get("solo"), rate),
        "packs": [],
    }
    for P in plan.packs:
        row = {"pack": P, **figures(per_step[f"pack{P}"], flops, P, peaks.get(f"pack{P}"), rate)}
        row["speedup_vs_solo"] = P * paired_ratio(per_step["solo"], per_step[f"pack{P}"])
        out["packs"].append(row)
    return out


def repeat(fn: Callable[[], object], steps: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(steps):
            fn()

    return run


def op_calls(step: Callable[[], object], device: torch.device, steps: int = OP_STEPS) -> dict:
    """Operator calls of a (warm) step: aten:: calls, nested included; on CUDA also kernel launches.

    Each of `steps` steps is profiled alone: the median is the typical step, the
    max one that does more (a chunk of task draws, a read-back).
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    aten, launches = [], []
    for _ in range(steps):
        with profile(activities=activities) as prof:
            step()
        names = [event.name for event in prof.events()]
        aten.append(sum(name.startswith("aten::") for name in names))
        launches.append(sum(name in LAUNCHES for name in names))
    cuda = device.type == "cuda"
    return {
        "aten_ops": statistics.median_low(aten),
        "aten_ops_max": max(aten),
        "kernel_launches": statistics.median_low(launches) if cuda else None,
        "kernel_launches_max": max(launches) if cuda else None,
    }


def table(result: dict) -> str:
    """The JSON as a person reads it: model-steps/s (ratio to solo) [GFLOP/s], then operator calls."""
    config = result["config"]
    lines = [
        f"bench pack on {result['device']}, {config['embedding']}, batch {config['batch']}, "
        f"regularizers in turn {','.join(result['regularizers'])}"
    ]
    for size in result["sizes"]:
        lines.append(
            f"\n{size['size']} (n {size['n']}, d {size['d']}, k {size['k']}): "
            "model-steps/s (x solo) [GFLOP/s]"
        )
        packs = [row["pack"] for row in size["threads"][0]["packs"]] if size["threads"] else []
        lines.append(f"{'threads':<8}{'solo':>18}" + "".join(f"{f'pack {P}':>24}" for P in packs))
        for row in size["threads"]:
            solo = row["solo"]
            cells = [f"{solo['model_steps_per_second']:.1f} [{solo['flop_rate'] / 1e9:.2f}]"]
            cells += [
                f"{p['model_steps_per_second']:.1f} ({p['speedup_vs_solo']:.2f}x) "
                f"[{p['flop_rate'] / 1e9:.2f}]"
                for p in row["packs"]
            ]
            lines.append(f"{row['threads']:<8}{cells[0]:>18}" + "".join(f"{c:>24}" for c in cells[1:]))
        if size["op_calls"]:
            lines.append("operator calls per pack step: " + ", ".join(map(calls, size["op_calls"])))
    return "\n".join(lines)


def calls(row: dict) -> str:
    """One pack size's operator calls per step: typical (and the most, where a step did more)."""

    def count(key: str, what: str) -> str:
        most = row[f"{key}_max"]
        return f"{row[key]} {what}" + (f" (max {most})" if most != row[key] else "")

    launches = f", {count('kernel_launches', 'launches')}" if row["kernel_launches"] is not None else ""
    return f"P {row['pack']}: {count('aten_ops', 'aten')}{launches}"


if __name__ == "__main__":
    sys.exit(main())
