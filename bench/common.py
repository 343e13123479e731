"""What every benchmark shares: the training step measured, alternate timing, peak memory, FLOP counts,
the config's description.

On a shared machine timings are noisy, so variants are measured alternately
(round robin) and medians and paired ratios are reported side by side. On an
oversubscribed machine `--threads 1` gives steadier (and there, faster)
numbers than PyTorch's default of all cores, whose threads then wait on each
other; a sweep likewise runs one thread per trial (cluster.cpus_per_trial).

Peak memory: on CUDA torch.cuda.max_memory_allocated (reset before the
measured call); on CPU the peak of live tensor bytes in PyTorch's memory
timeline (torch.profiler with profile_memory, a separate untimed call). Both
count every live tensor (inputs, weights, gradients, optimizer state), not
the process' resident set, which the allocator's caching makes meaningless.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig

from config.run import RunSpec
from models.embedding import embedding_dim
from training.fused import Pack
from training.trainer import Trainer

MATMUL_SIZE = 1024  # the dense fp32 matmul whose FLOP rate is the machine's reference


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# A variant is timed as one call, or as (prepare, run): prepare's result handed to run, only run timed (a
# backward pass alone needs the forward's loss, which must not count in its time).
Variant = Callable[[], object] | tuple[Callable[[], object], Callable[[object], object]]


def timed(variant: Variant, device: torch.device) -> float:
    """Wall seconds of one call, device work included; of (prepare, run), of run alone."""
    prepare, run = variant if isinstance(variant, tuple) else (lambda: None, lambda _: variant())
    prepared = prepare()
    sync(device)
    start = time.perf_counter()
    run(prepared)
    sync(device)
    return time.perf_counter() - start


def alternate(
    variants: dict[str, Variant], repeats: int, device: torch.device, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of each variant, measured round robin so load drifts hit all alike."""
    for variant in variants.values():
        for _ in range(warmup):
            timed(variant, device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats):
        for name, variant in variants.items():
            times[name].append(timed(variant, device))
        log(f"  round {r + 1}/{repeats}: " + ", ".join(f"{n} {t[-1]:.4f}s" for n, t in times.items()))
    return times


def paired_ratio(slow: list[float], fast: list[float]) -> float:
    """Median over rounds of slow/fast: each pair was measured back to back."""
    return statistics.median(s / f for s, f in zip(slow, fast))


def free(device: torch.device) -> None:
    """Return what dropped objects held (packs hold reference cycles) and, on CUDA, the allocator's cache:
    the next variant's peak is then its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak live tensor bytes during one call (see the module docstring)."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return int(torch.cuda.max_memory_allocated(device))
    from torch.profiler import ProfilerActivity, profile

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
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


def alternate_with_matmul(
    variants: dict[str, Variant], repeats: int, device: torch.device
) -> tuple[dict[str, list[float]], float]:
    """alternate, with the reference matmul as one more variant: each variant's seconds per call, and the
    machine's dense FLOP rate measured among them (the median over rounds, FLOP/s)."""
    times = alternate({**variants, "matmul": matmul_flop_rate(device)}, repeats, device)
    rate = statistics.median(2 * MATMUL_SIZE**3 / t for t in times.pop("matmul"))
    return times, rate


def step_flops(cfg: DictConfig) -> int:
    """Analytic FLOPs of one training step: forward plus backward (twice the forward), matmuls only.

    The forward of one task: the layer's four distance-attention modules (points to centers, points to
    points, centers to points, centers to centers: n_q queries on n_k keys), then the loss's distances.
    """
    t, qkv_mult = cfg.task, cfg.model.qkv_mult
    e = embedding_dim(t.d, t.k, cfg.model.embedding)
    w = qkv_mult * e
    forward = 2 * t.n * t.k * t.d
    for n_q, n_k in ((t.n, t.k), (t.n, t.n), (t.k, t.n), (t.k, t.k)):
        projections = 2 * e * w * (n_q + 2 * n_k) + (2 * n_q * w * e if qkv_mult > 1 else 0)
        scores = 2 * n_q * n_k * (w + 1)  # augmented vectors: one more coordinate
        forward += projections + scores + 2 * n_q * n_k * w
    return 3 * cfg.train.batch * forward


def figures(times: list[float], flops: int, models: int, peak: int | None, matmul_rate: float) -> dict:
    seconds = statistics.median(times)
    return {
        "seconds_per_step": seconds,
        "seconds_per_step_min": min(times),
        "seconds_per_step_mean": statistics.fmean(times),  # with the rare steps (chunked task draws) in it
        "model_steps_per_second": models / seconds,
        "peak_memory_bytes": peak,
        "flop_rate": models * flops / seconds,
        "flop_fraction": models * flops / seconds / matmul_rate,
    }


def memory_measure(device: torch.device) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated"
    return "peak live tensor bytes (torch.profiler memory timeline)"


def describe(cfg: DictConfig) -> dict:
    t, m = cfg.task, cfg.model
    return {
        "n": t.n,
        "d": t.d,
        "k": t.k,
        "family": t.family,
        "batch": cfg.train.batch,
        "embedding": m.embedding,
        "dropout": m.dropout,
        "qkv_mult": m.qkv_mult,
        "tau": cfg.loss.tau,
        "regularizer": cfg.loss.regularizer,
    }


def pack_step(cfgs: list[DictConfig], device: torch.device) -> Callable[[], object]:
    """One training step of the models of cfgs, as training takes it: their pack (of one: solo).

    The one place that knows training's step entry point (training.fused.Pack): adapt it when it changes.
    """
    return Pack([Trainer(RunSpec.of(cfg), device) for cfg in cfgs]).step  # freed with the returned step
