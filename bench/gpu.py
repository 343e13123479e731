"""`python -m bench gpu [--out FILE] [--tiny]`: the one-shot check of a GPU node, in under 5 minutes.

What no CPU machine can show, measured on the first device of `train.device`
(CUDA when present), each check a JSON entry and a line of the printed table:

  exact       the exact Lloyd transformer equals Lloyd's step on the device (float64, TF32 off; 1e-5)
  packed      a pack trained on the device equals its models trained alone (model.dropout 0; 1e-5)
  resume      a run that crashes mid-way and resumes from its checkpoint equals one that did not (bit for
              bit), at n 64 and the paper's n 512 (train.deterministic on); two runs with it off, equal or not
  syncs       pack steps (P = 1, 10; n 512, d 32) read nothing back to the host and make no synchronizing CUDA
              call (torch.cuda.set_sync_debug_mode), draw steps included; host reads per read-back
  memory_cap  a trial's cap at its GPU share (training.gpu_share, 0.25 here): an allocation beyond it fails
              with torch.OutOfMemoryError, one within it succeeds (CUDA only: skipped on a CPU)
  steps       model-steps per second solo and in packs of 1/3/10/30/100 at bench/pack.py's sizes (n, d, k) =
              (128, 4, 6), (512, 32, 10), (512, 32, 25), onehot and binary, with the FLOP rate and peak device
              memory, and the operator calls (aten ops, kernel launches) of one pack step for P = 1, 10, 100
  compile     train.compile=cudagraphs against off (aot_eager on a CPU, where CUDA graphs do not exist)
  projection  the 3,000-model paper grid's device-hours, solo and in packs of ten (bench/sweep.py)

`--tiny` runs every check at toy sizes (the test suite runs it on the CPU).
Exit code 0 when every equality check passed, 1 otherwise: the figures are written either way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig

from bench.common import free, log
from bench.host_reads import pack_reads
from bench.line import exit_codes_help, print_json
from bench.pack import OP_PACKS, PACKS, SIZES, Plan, bench_pack
from bench.sweep import bench_sweep
from cli.entry import ArgumentParser, command
from config.compose import compose
from config.help import composed_config
from config.run import RunSpec
from models.exact import ExactLloydTransformer
from models.lloyd import lloyd_step
from tasks.sampler import TaskSpec, sample_tasks
from tracking.recorder import MemoryRecorder
from training.checkpoint import last_path, load
from training.determinism import set_deterministic
from training.device import cuda_index, pick_device
from training.fused import Pack
from training.gpu_share import cap_memory
from training.loop import train
from training.packed import train_pack
from training.trainer import Trainer

TOLERANCE = 1e-5
EQUALITY_CHECKS = ("exact", "packed", "resume", "syncs")  # the checks that set the exit code
SHAPES = ((4, 6), (32, 10), (32, 25))
EMBEDDINGS = ("onehot", "binary")
SEEDS = (153476998, 235510766, 205084180)  # the packed check's three models
# A small run that still takes every path: evaluation, the LR schedule, checkpoints.
SMALL_RUN = [
    "task.n=64",
    "train.batch=8",
    "train.steps=40",
    "train.eval_every=10",
    "train.val_batches=2",
    "model.dropout=0.0",
]


@dataclass(frozen=True)
class Setup:
    """What every check runs, composed once up front from --tiny and the device: plain data (the device
    itself is the machine's, handed to the checks beside it)."""

    tiny: bool
    exact: list[tuple[TaskSpec, int]]  # a task spec and its batch per (d, k)
    packed: list[DictConfig]  # the seeds trained alone and in one pack
    resume: list[DictConfig]  # a small n and a larger one, each crashed and resumed
    resume_off: DictConfig  # the larger n with train.deterministic off, trained twice
    syncs: list[list[DictConfig]]  # the packs whose host reads are counted
    steps: dict[str, DictConfig]  # per embedding, timed at steps_plan's sizes
    steps_plan: Plan
    compile: list[DictConfig]  # train.compile off, then compiled, each timed with compile_plan
    compile_plan: Plan
    projection: tuple[list[str], int, int]  # bench_sweep's overrides, repeats and pack


class Crash(RuntimeError):
    """Raised from the evaluation callback to stop a run as a crash would."""


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    args = parse(argv)
    device = pick_device("auto")
    setup = configure(args.tiny, device)
    report = run_checks(setup, device)
    print_json(report, args.out)
    print(table(report))
    passed = (
        all(report[key].get("ok") for key in EQUALITY_CHECKS) and report["memory_cap"].get("ok") is not False
    )
    return 0 if passed else 1


def parse(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="python -m bench gpu",
        description=__doc__,
        epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (for tests on a CPU)")
    return parser.parse_args(argv)


def configure(tiny: bool, device: torch.device) -> Setup:
    """Every check's configurations, composed here once: the checks only run them."""
    on = f"train.device={device}"
    small, large = (16, 32) if tiny else (64, 512)
    syncs = ["task.n=16", "train.batch=4", "train.eval_every=10"] if tiny else ["task.d=32", "task.k=10"]
    # On a CPU without dropout: its CPU-only fused path (models.flash_dropout) reads the size of its pattern.
    syncs += [] if device.type == "cuda" else ["model.dropout=0.0"]
    batch = ["train.batch=4"] if tiny else []
    # Tiny: no dropout, whose random masks take aot_eager three times as long to trace on a CPU (compiled
    # dropout is tests/test_packed.py's test_compiled_training_equals_eager).
    toy = [*batch, "model.dropout=0.0"] if tiny else []
    compiled = "cudagraphs" if device.type == "cuda" else "aot_eager"
    return Setup(
        tiny=tiny,
        exact=exact_tasks(tiny),
        steps_plan=steps_plan(tiny),
        compile_plan=compile_plan(tiny),
        projection=grid_run(tiny),
        packed=[compose(SMALL_RUN + [on, f"seed={s}"] + (["task.n=16"] if tiny else [])) for s in SEEDS],
        resume=[compose(SMALL_RUN + [on, f"task.n={n}"]) for n in (small, large)],
        resume_off=compose(SMALL_RUN + [on, f"task.n={large}", "train.deterministic=false"]),
        syncs=[
            [compose([*syncs, on, f"seed={s}"]) for s in range(1, P + 1)]
            for P in ((1, 3) if tiny else (1, 10))
        ],
        steps={e: compose([f"model.embedding={e}", on, *batch]) for e in EMBEDDINGS},
        compile=[compose([on, f"train.compile={mode}"] + toy) for mode in ("off", compiled)],
    )


def exact_tasks(tiny: bool) -> list[tuple[TaskSpec, int]]:
    """The exact check's tasks: a spec and its batch for each (d, k) of SHAPES (the first alone, tiny)."""
    n, batch = (64, 4) if tiny else (512, 32)
    return [(TaskSpec(n=n, d=d, k=k), batch) for d, k in (SHAPES[:1] if tiny else SHAPES)]


def steps_plan(tiny: bool) -> Plan:
    """bench/pack.py's sizes and packs, at one thread: the host's share of a device step."""
    return Plan(
        sizes={"tiny": (16, 4, 6)} if tiny else SIZES,
        packs=(1, 2) if tiny else PACKS,
        threads=(1,),
        op_packs=(1, 2) if tiny else OP_PACKS,
        repeats=1 if tiny else 3,
    )


def compile_plan(tiny: bool) -> Plan:
    """One size, solo alone: the forward compiled against eager."""
    return Plan(
        sizes={"compile": (16, 4, 6) if tiny else (512, 32, 10)},
        packs=(),
        threads=(1,),
        op_packs=(),
        repeats=1 if tiny else 5,
    )


def grid_run(tiny: bool) -> tuple[list[str], int, int]:
    """bench_sweep's overrides, repeats and pack for the grid's projection."""
    overrides = ["task.n=32", "train.batch=2", "train.val_batches=1"] if tiny else []  # n >= k = 25
    return overrides, 1 if tiny else 3, 2 if tiny else 10


def run_checks(setup: Setup, device: torch.device) -> dict:
    """Each check once, in order, each a JSON entry with its seconds; one failing hides none of the others."""
    set_deterministic(True)  # training's default, before the first CUDA operation (check_exact's)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report: dict = {
        "command": "gpu_check",
        "device": str(device),
        "device_name": name,
        "tiny": setup.tiny,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        checks: dict[str, Callable[[], object]] = {
            "exact": lambda: check_exact(device, setup.exact),
            "packed": lambda: check_packed(setup.packed, Path(tmp) / "packed"),
            "resume": lambda: check_resume(setup.resume, setup.resume_off, Path(tmp) / "resume"),
            "syncs": lambda: measure_syncs(device, setup.syncs),
            "memory_cap": lambda: check_memory_cap(device),
            "steps": lambda: measure_steps(device, setup.steps, setup.steps_plan),
            "compile": lambda: measure_compile(device, setup.compile, setup.compile_plan),
            "projection": lambda: project_grid(*setup.projection),
        }
        for key, check in checks.items():
            start = time.perf_counter()
            log(f"gpu_check: {key}")
            try:
                report[key] = check()
            except Exception as err:  # one failing check must not hide the others' figures
                report[key] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            report.setdefault("seconds", {})[key] = round(time.perf_counter() - start, 1)
    if device.type == "cuda":
        report["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    return report


def max_relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs().clamp(min=1.0)).max())


def check_exact(device: torch.device, tasks: list[tuple[TaskSpec, int]]) -> dict:
    """One layer of the exact transformer against one Lloyd step, on the device, for both lean embeddings."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    errors = {}
    for spec, batch in tasks:
        X, C = sample_tasks(spec, batch, torch.Generator().manual_seed(0))
        X, C = X.to(device, torch.float64), C.to(device, torch.float64)
        for embedding in EMBEDDINGS:
            model = ExactLloydTransformer(spec.d, spec.k, embedding).to(device, torch.float64)
            with torch.no_grad():
                errors[f"d={spec.d} k={spec.k} {embedding}"] = max_relative_error(
                    model(X, C, steps=1), lloyd_step(X, C)
                )
    worst = max(errors.values())
    return {"ok": worst <= TOLERANCE, "max_relative_error": worst, "tolerance": TOLERANCE, "cases": errors}


def check_packed(cfgs: list[DictConfig], root: Path) -> dict:
    """Three seeds trained in one pack against the same three trained alone: final weights within 1e-5."""
    solo_dirs = [root / f"solo{i}" for i in range(len(cfgs))]
    for cfg, workdir in zip(cfgs, solo_dirs):
        train(cfg, MemoryRecorder(), workdir)
    pack_dirs = [root / f"pack{i}" for i in range(len(cfgs))]
    train_pack(cfgs, [MemoryRecorder() for _ in cfgs], pack_dirs)
    worst = max(
        max_relative_error(p[name], s[name])
        for s, p in zip(_final_models(solo_dirs), _final_models(pack_dirs))
        for name in s
    )
    return {
        "ok": worst <= TOLERANCE,
        "max_relative_error": worst,
        "tolerance": TOLERANCE,
        "models": len(cfgs),
    }


def _final_models(workdirs: list[Path]) -> list[dict[str, torch.Tensor]]:
    return [load(last_path(w))["model"] for w in workdirs]


def check_resume(cfgs: list[DictConfig], off: DictConfig, root: Path) -> dict:
    """At a small n and the paper's n 512 (where attention's backward would split the keys on CUDA): a run
    crashed at its second evaluation and resumed by the same call, against an unbroken run, bit for bit
    (train.deterministic on, the default). At n 512 also two runs with it off, equal or not (a figure)."""
    runs = [{"n": cfg.task.n, **_crash_and_resume(cfg, root / f"n{cfg.task.n}")} for cfg in cfgs]
    for name in ("off1", "off2"):
        train(off, MemoryRecorder(), root / name)
    first, second = _final_models([root / "off1", root / "off2"])
    return {
        "ok": all(run["bit_equal"] for run in runs),
        "runs": runs,
        f"deterministic_off_n{off.task.n}_bit_equal": all(torch.equal(first[k], second[k]) for k in first),
    }


def _crash_and_resume(cfg: DictConfig, root: Path) -> dict:
    train(cfg, MemoryRecorder(), root / "straight")

    def crash_once(step: int, metrics: dict, workdir: Path) -> None:
        if step == 2 * cfg.train.eval_every and not (workdir / "crashed").exists():
            (workdir / "crashed").touch()
            raise Crash(f"crash at step {step}")

    recorder = MemoryRecorder()
    try:
        train(cfg, recorder, root / "resumed", on_eval=crash_once)
        crashed = False
    except Crash:
        crashed = True
    train(cfg, recorder, root / "resumed", on_eval=crash_once)
    straight, resumed = _final_models([root / "straight", root / "resumed"])
    equal = crashed and all(torch.equal(straight[name], resumed[name]) for name in straight)
    return {"crashed_and_resumed": crashed, "bit_equal": equal}


def measure_syncs(device: torch.device, packs: list[list[DictConfig]]) -> dict:
    """Pack steps at the paper's size (n 512, d 32, k 10), P = 1 and 10, after a warm-up chunk: the host's
    reads in steps and per read-back (bench.host_reads), and on CUDA the synchronizing calls
    torch.cuda.set_sync_debug_mode sees in steps. ok: no step reads or syncs, draw steps included."""
    rows = []
    for cfgs in packs:
        set_deterministic(cfgs[0].train.deterministic)
        pack = Pack([Trainer(RunSpec.of(cfg), device) for cfg in cfgs])
        pack_reads(pack, pack.chunk)  # one-time work first: kernels loaded, handles made
        rows.append(
            {
                "pack": len(cfgs),
                "chunk": pack.chunk,
                **pack_reads(pack, 2 * pack.chunk, device.type == "cuda"),
            }
        )
    return {
        "ok": all(r["reads_in_steps"] == 0 and not r["cuda_syncs_in_steps"] for r in rows),
        "sync_debug_mode": "on" if device.type == "cuda" else "CUDA only: skipped on cpu, host reads counted",
        "rows": rows,
    }


def check_memory_cap(device: torch.device, share: float = 0.25) -> dict:
    """A trial's memory cap at `share` of its GPU (a sweep's trial: training.gpu_share): within it an
    allocation succeeds, beyond it one fails with torch.OutOfMemoryError; the cap is lifted after. ok is None
    where there is no cap to check (not CUDA)."""
    if device.type != "cuda":
        return {"ok": None, "skipped": f"a trial caps CUDA memory only, and the device is {device}"}
    free(device)  # the earlier checks' memory counts against the cap
    cap = int(cap_memory(device, share) * torch.cuda.get_device_properties(device).total_memory)
    try:
        within = torch.empty(cap // 2, dtype=torch.uint8, device=device)
        del within
        try:
            torch.empty(cap + 2**20, dtype=torch.uint8, device=device)
            refused = False
        except torch.OutOfMemoryError:
            refused = True
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, cuda_index(device))
        free(device)
    return {"ok": refused, "share": share, "cap_bytes": cap, "beyond_cap_refused": refused}


def measure_steps(device: torch.device, cfgs: dict[str, DictConfig], plan: Plan) -> list[dict]:
    """Model-steps/s solo and in packs, operator calls per pack step (bench/pack.py), per size, embedding."""
    rows = []
    for embedding, cfg in cfgs.items():
        for size in bench_pack(cfg, plan, device)["sizes"]:
            (measured,) = size.pop("threads")
            rows.append({"embedding": embedding, **size, **measured})
    return rows


def measure_compile(device: torch.device, cfgs: list[DictConfig], plan: Plan) -> dict:
    """Seconds per step with the forward compiled (cudagraphs on CUDA, aot_eager elsewhere) against eager."""
    mode = cfgs[-1].train.compile
    out = {"mode": mode}
    for cfg in cfgs:
        (size_row,) = bench_pack(cfg, plan, device)["sizes"]
        # Its solo entry times a pack of one, compiled as configured.
        out[cfg.train.compile] = size_row["threads"][0]["solo"]["seconds_per_step"]
    out["speedup"] = out["off"] / out[mode]
    return out


def project_grid(overrides: list[str], repeats: int, pack: int) -> dict:
    """The paper grid's device-hours, one job at a time, solo and in packs of ten (bench/sweep.py)."""
    result = bench_sweep(overrides, repeats, pack)
    return {key: result[key] for key in ("device", "pack", "projected_hours_solo", "projected_hours_packed")}


def _details(entry: dict) -> str:
    """An equality check's figures on one line: its runs (resume) and packs (syncs) one clause each."""
    parts = []
    for run in entry.get("runs", []):
        parts.append(
            f"n={run['n']}: crashed_and_resumed={run['crashed_and_resumed']} bit_equal={run['bit_equal']}"
        )
    for row in entry.get("rows", []):
        syncs = "" if row["cuda_syncs_in_steps"] is None else f", {row['cuda_syncs_in_steps']} CUDA syncs"
        parts.append(
            f"P {row['pack']}: {row['reads_in_steps']} host reads{syncs} in {row['steps']} steps "
            f"({row['draw_steps']} drawing), {row['reads_per_read_back']} per read-back"
        )
    parts += [f"{k}={v}" for k, v in entry.items() if k not in ("ok", "cases", "runs", "rows")]
    return "; ".join(parts)


def table(report: dict) -> str:
    """The report as lines a person reads."""
    where = f"{report['device_name']} ({report['device']})"
    lines = [f"gpu_check on {where}, torch {report['torch']}, {report['date']}"]
    for key in EQUALITY_CHECKS:
        entry = report[key]
        lines.append(f"{key:<10} {'PASS' if entry.get('ok') else 'FAIL'}  {_details(entry)}")
    cap = report["memory_cap"]
    verdict = "SKIP" if cap.get("ok") is None else "PASS" if cap["ok"] else "FAIL"
    lines.append(f"memory_cap {verdict}  " + ", ".join(f"{k}={v}" for k, v in cap.items() if k != "ok"))
    steps = report["steps"]
    if isinstance(steps, list):
        for row in steps:
            packs = ", ".join(
                f"pack {p['pack']}: {p['model_steps_per_second']:.0f}/s ({p['speedup_vs_solo']:.1f}x)"
                for p in row["packs"]
            )
            calls = ", ".join(
                f"P {c['pack']}: {c['aten_ops']} ops"
                + (f" {c['kernel_launches']} launches" if c["kernel_launches"] is not None else "")
                for c in row["op_calls"]
            )
            lines.append(
                f"steps      n={row['n']} d={row['d']} k={row['k']} {row['embedding']}: solo "
                f"{row['solo']['model_steps_per_second']:.0f} model-steps/s "
                f"({row['solo']['flop_rate'] / 1e9:.2f} GFLOP/s); {packs}; per pack step {calls}"
            )
    else:
        lines.append(f"steps      {steps}")
    lines.append(f"compile    {report['compile']}")
    lines.append(f"projection {report['projection']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
