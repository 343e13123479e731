"""Speed and memory benchmarks: `python -m analysis.bench COMMAND [options] [hydra overrides]`.

    step          the real training step (sweeper.train.Trainer.step) against the
                  straightforward one (models.baseline), alternately, in one run
    pack          solo against packed training (sweeper.packed), pack sizes 1, 2, 5, 10, 30
    sweep         projected wall time of the paper grid from measured step times
    speed_memory  binary against onehot: forward/backward time and peak memory over d and k

JSON on stdout, progress on stderr. On a shared machine timings are noisy, so
variants are measured alternately (round robin) and medians and paired
ratios are reported side by side. On an oversubscribed machine `--threads 1`
gives steadier (and there, faster) numbers than PyTorch's default of all
cores, whose threads then wait on each other; a sweep likewise runs one
thread per trial (cluster.cpus_per_trial).

`speed_memory` uses one task of n = max(task.n, 1024) points (k up to 1024
needs n >= k); `--quick` drops k = 1024. `sweep --sweep-pack 0` skips the
packed timing of every shape (the solo projection alone).

Peak memory: on CUDA torch.cuda.max_memory_allocated (reset before the
measured call); on CPU the peak of live tensor bytes in PyTorch's memory
timeline (torch.profiler with profile_memory, a separate untimed call). Both
count every live tensor (inputs, weights, gradients, optimizer state), not
the process' resident set, which the allocator's caching makes meaningless.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig

from models.baseline import BaselineTransformer, baseline_step
from models.embedding import embedding_dim
from sweeper.config import compose
from sweeper.entry import command
from sweeper.train import Trainer, pick_device, task_spec

MATMUL_SIZE = 1024  # the dense fp32 matmul whose FLOP rate is the machine's reference


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of one call, device work included."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def alternate(variants: dict[str, Callable[[], object]], repeats: int, device: torch.device,
              warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each variant, measured round robin so load drifts hit all alike."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn, device))
        log(f"  round {r + 1}/{repeats}: " + ", ".join(f"{n} {t[-1]:.4f}s" for n, t in times.items()))
    return times


def paired_ratio(slow: list[float], fast: list[float]) -> float:
    """Median over rounds of slow/fast: each pair was measured back to back."""
    return statistics.median(s / f for s, f in zip(slow, fast))


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak live tensor bytes during one call (see the module docstring)."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return int(torch.cuda.max_memory_allocated(device))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timeline.json"
        import warnings

        with warnings.catch_warnings():  # deprecated in favour of a CUDA-only API; still the CPU one
            warnings.simplefilter("ignore", FutureWarning)
            prof.export_memory_timeline(str(path), device="cpu")
        _, sizes = json.loads(path.read_text())
    return int(max((sum(at_time) for at_time in sizes), default=0))


def matmul_flop_rate(device: torch.device, dtype: torch.dtype = torch.float32) -> Callable[[], float]:
    """A callable measuring the dense square matmul FLOP rate once (FLOP/s)."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=dtype)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=dtype)
    a @ b

    def measure() -> float:
        return 2 * MATMUL_SIZE**3 / timed(lambda: a @ b, device)

    return measure


def attention_flops(n_q: int, n_k: int, d_emb: int, qkv_mult: int) -> int:
    """Matmul FLOPs of one distance-attention module's forward pass, one task."""
    w = qkv_mult * d_emb
    projections = 2 * d_emb * w * (n_q + 2 * n_k) + (2 * n_q * w * d_emb if qkv_mult > 1 else 0)
    scores = 2 * n_q * n_k * (w + 1)  # augmented vectors: one more coordinate
    return projections + scores + 2 * n_q * n_k * w


def forward_flops(n: int, d: int, k: int, embedding: str, qkv_mult: int = 1) -> int:
    """Matmul FLOPs of the model's forward pass plus the loss's distances, one task."""
    e = embedding_dim(d, k, embedding)
    layer = (attention_flops(n, k, e, qkv_mult) + attention_flops(n, n, e, qkv_mult)
             + attention_flops(k, n, e, qkv_mult) + attention_flops(k, k, e, qkv_mult))
    return layer + 2 * n * k * d


def step_flops(cfg: DictConfig) -> int:
    """Analytic FLOPs of one training step: forward plus backward (twice the forward), matmuls only."""
    t = cfg.task
    return 3 * cfg.train.batch * forward_flops(t.n, t.d, t.k, cfg.model.embedding, cfg.model.qkv_mult)


def configure(threads: int | None) -> None:
    """Threads: all cores by default (PyTorch's choice); fewer when sharing the machine."""
    if threads:
        torch.set_num_threads(threads)


def figures(times: list[float], flops: int, models: int, peak: int, matmul_rate: float) -> dict:
    seconds = statistics.median(times)
    return {"seconds_per_step": seconds, "seconds_per_step_min": min(times),
            "model_steps_per_second": models / seconds, "peak_memory_bytes": peak,
            "flop_rate": models * flops / seconds, "flop_fraction": models * flops / seconds / matmul_rate}


def bench_step(cfg: DictConfig, repeats: int) -> dict:
    """The real training step against the straightforward one, alternately."""
    device = pick_device(cfg.train.device)
    trainer = Trainer(cfg, device)
    base = BaselineTransformer.like(trainer.model).train()
    base_opt = torch.optim.Adam(base.parameters(), lr=cfg.optim.lr)
    spec, generator = task_spec(cfg), torch.Generator().manual_seed(cfg.seed)
    loss = cfg.loss

    def baseline() -> None:
        baseline_step(base, base_opt, spec, cfg.train.batch, generator, loss.tau, loss.regularizer, device)

    matmul = matmul_flop_rate(device)
    log(f"step: {describe(cfg)} on {device}, {torch.get_num_threads()} threads, {repeats} rounds")
    times = alternate({"fused": trainer.step, "baseline": baseline, "matmul": matmul}, repeats, device)
    rate = statistics.median(2 * MATMUL_SIZE**3 / t for t in times["matmul"])
    flops = step_flops(cfg)
    out = {"command": "step", "config": describe(cfg), "device": str(device), "threads": torch.get_num_threads(),
           "dtype": "float32", "flops_per_step": flops, "matmul_flop_rate": rate,
           "memory_measure": memory_measure(device)}
    out.update(figures(times["fused"], flops, 1, peak_memory_bytes(trainer.step, device), rate))
    out["baseline"] = figures(times["baseline"], flops, 1, peak_memory_bytes(baseline, device), rate)
    out["speedup"] = paired_ratio(times["baseline"], times["fused"])
    return out


def memory_measure(device: torch.device) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated"
    return "peak live tensor bytes (torch.profiler memory timeline)"


def describe(cfg: DictConfig) -> dict:
    t, m = cfg.task, cfg.model
    return {"n": t.n, "d": t.d, "k": t.k, "family": t.family, "batch": cfg.train.batch, "embedding": m.embedding,
            "dropout": m.dropout, "qkv_mult": m.qkv_mult, "tau": cfg.loss.tau, "regularizer": cfg.loss.regularizer}


COMMANDS = ("step", "pack", "sweep", "speed_memory")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m analysis.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds per variant (default 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's, all cores)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds (speed_memory, pack, sweep)")
    parser.add_argument("--packs", type=str, default="1,2,5,10,30", help="pack sizes for `pack`")
    parser.add_argument("--sweep-pack", type=int, default=10,
                        help="`sweep`: also time packs of this many seeds per shape (0 or 1: solo only)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unknown option(s) {' '.join(unknown)}; config overrides are key=value")
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} is not allowed: an integer >= 1")
    return args, overrides


@command("leaner-bench", own_options=True)
def main(argv: list[str]) -> int:
    args, overrides = parse(argv)
    configure(args.threads)
    cfg = compose(overrides)
    if args.command == "step":
        result = bench_step(cfg, args.repeats)
    else:
        from analysis import bench_more

        result = bench_more.run(args, cfg, overrides)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
