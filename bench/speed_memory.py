"""The `pack`, `sweep` and `speed_memory` benchmarks of analysis.bench (see its docstring)."""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

import torch
from omegaconf import DictConfig, OmegaConf

from analysis.bench import alternate, describe, log, memory_measure, peak_memory_bytes, step_flops, timed
from models.embedding import embedding_dim
from models.losses import smoothed_objective
from models.transformer import ClusteringTransformer
from sweeper.config import compose
from sweeper.grid import expand
from sweeper.packed import packed_step
from sweeper.train import Trainer, Validation, pick_device
from tasks.sampler import TaskSpec, sample_tasks

SPEED_MEMORY_D = (4, 16, 64)
SPEED_MEMORY_K = (8, 64, 256, 1024)
SPEED_MEMORY_BATCH = 1  # one task: onehot at k = 1024 is ~100 GFLOP per forward + backward
GRID_STEPS = 10_000
GRID_SHAPE_KEYS = ("task.d", "task.k", "model.embedding")  # what a step's cost depends on within the paper grid


def run(args: argparse.Namespace, cfg: DictConfig, overrides: list[str]) -> dict:
    if args.command == "pack":
        return bench_pack(cfg, [int(p) for p in args.packs.split(",")], args.repeats)
    if args.command == "sweep":
        return bench_sweep(overrides, args.repeats, args.sweep_pack)
    return bench_speed_memory(cfg, args.repeats, args.quick)


def _seeded(cfg: DictConfig, seed: int) -> DictConfig:
    out = cfg.copy()
    out.seed = seed
    return out


def bench_pack(cfg: DictConfig, sizes: list[int], repeats: int) -> dict:
    """Model-steps per second, solo (Trainer.step) against packs of P seeds (packed_step)."""
    device = pick_device(cfg.train.device)
    solo = Trainer(cfg, device)
    packs = {P: [Trainer(_seeded(cfg, cfg.seed + i), device) for i in range(P)] for P in sizes}
    log(f"pack: {describe(cfg)} on {device}, pack sizes {sizes}, {repeats} rounds")
    variants = {"solo": solo.step, **{f"pack{P}": (lambda ts=ts: packed_step(ts)) for P, ts in packs.items()}}
    times = alternate(variants, repeats, device)
    solo_seconds = statistics.median(times["solo"])
    flops = step_flops(cfg)
    rows = []
    for P in sizes:
        seconds = statistics.median(times[f"pack{P}"])
        rows.append({"pack": P, "seconds_per_step": seconds, "model_steps_per_second": P / seconds,
                     "speedup_vs_solo": statistics.median(P * s / p for s, p in zip(times["solo"], times[f"pack{P}"])),
                     "flop_rate": P * flops / seconds,
                     "peak_memory_bytes": peak_memory_bytes(lambda ts=packs[P]: packed_step(ts), device)})
    return {"command": "pack", "config": describe(cfg), "device": str(device), "threads": torch.get_num_threads(),
            "memory_measure": memory_measure(device),
            "solo": {"seconds_per_step": solo_seconds, "model_steps_per_second": 1 / solo_seconds,
                     "peak_memory_bytes": peak_memory_bytes(solo.step, device)},
            "packs": rows}


def bench_sweep(overrides: list[str], repeats: int, pack: int) -> dict:
    """Projected wall time of the paper grid (3000 models x 10000 steps) on this machine, one job at a time.

    The step cost within the grid depends on (d, k, embedding); each such shape is
    measured once (solo step, and the per-model time in a pack of `pack` seeds), plus
    its evaluation (every train.eval_every steps), then weighted by how many of the
    grid's configurations x seeds have that shape.
    """
    base = compose(overrides + ["sweep=paper"])
    plan = expand(base.sweep)
    shapes = Counter(tuple(c.overrides.get(key, OmegaConf.select(base, key)) for key in GRID_SHAPE_KEYS)
                     for c in plan.configurations)
    device = pick_device(base.train.device)
    rows, solo_total, packed_total = [], 0.0, 0.0
    for i, (shape, count) in enumerate(sorted(shapes.items())):
        cfg = compose(overrides + [f"{key}={value}" for key, value in zip(GRID_SHAPE_KEYS, shape)])
        log(f"sweep: shape {i + 1}/{len(shapes)} d={shape[0]} k={shape[1]} {shape[2]} ({count} configurations)")
        solo = Trainer(cfg, device)
        variants = {"solo": solo.step}
        if pack > 1:
            trainers = [Trainer(_seeded(cfg, cfg.seed + j), device) for j in range(pack)]
            variants["packed"] = lambda: packed_step(trainers)
        times = alternate(variants, repeats, device)
        validation = Validation(cfg, device)
        evaluation = timed(lambda: validation(solo.model), device) / cfg.train.eval_every  # amortised per step
        per_model = statistics.median(times["solo"]) + evaluation
        per_model_packed = statistics.median(times["packed"]) / pack + evaluation if pack > 1 else per_model
        jobs = count * len(plan.seeds)
        solo_total += jobs * GRID_STEPS * per_model
        packed_total += jobs * GRID_STEPS * per_model_packed
        rows.append({"d": shape[0], "k": shape[1], "embedding": shape[2], "configurations": count,
                     "seconds_per_step_solo": per_model, "seconds_per_model_step_packed": per_model_packed})
    return {"command": "sweep", "device": str(device), "threads": torch.get_num_threads(), "pack": pack,
            "configurations": len(plan.configurations), "seeds": len(plan.seeds), "steps": GRID_STEPS,
            "projected_hours_solo": solo_total / 3600,
            "projected_hours_packed": packed_total / 3600 if pack > 1 else None,
            "note": "one job at a time on this machine; per-step times include the amortised evaluation",
            "shapes": rows}


def bench_speed_memory(cfg: DictConfig, repeats: int, quick: bool) -> dict:
    """Forward and backward time and peak memory, binary against onehot, over d and k (paper figure 1)."""
    device = pick_device(cfg.train.device)
    ks = SPEED_MEMORY_K[:-1] if quick else SPEED_MEMORY_K
    n = max(cfg.task.n, max(ks))  # a task needs n >= k
    batch = SPEED_MEMORY_BATCH
    log(f"speed_memory: n={n}, batch={batch}, d {SPEED_MEMORY_D}, k {ks}, {repeats} rounds on {device}")
    rows = []
    for d in SPEED_MEMORY_D:
        for k in ks:
            X, C = sample_tasks(TaskSpec(n=n, d=d, k=k), batch, torch.Generator().manual_seed(cfg.seed))
            X, C = X.to(device), C.to(device)
            models = {e: ClusteringTransformer(d, k, e, cfg.model.gamma, cfg.model.dropout).to(device)
                      for e in ("onehot", "binary")}
            variants = {}
            for e, model in models.items():
                variants[f"{e}_forward"] = lambda m=model: m(X, C)
                variants[f"{e}_backward"] = lambda m=model: _backward(m, X, C, cfg)
            log(f"  d={d} k={k}")
            times = alternate(variants, repeats, device)
            row = {"d": d, "k": k}
            for e, model in models.items():
                forward = statistics.median(times[f"{e}_forward"])
                # backward alone: the timed call ran forward + backward
                backward = max(statistics.median(times[f"{e}_backward"]) - forward, 0.0)
                row[e] = {"d_emb": embedding_dim(d, k, e), "forward_seconds": forward, "backward_seconds": backward,
                          "peak_memory_bytes": peak_memory_bytes(lambda m=model: _backward(m, X, C, cfg), device)}
            for what in ("forward_seconds", "backward_seconds", "peak_memory_bytes"):
                row[f"onehot_over_binary_{what}"] = row["onehot"][what] / max(row["binary"][what], 1e-12)
            rows.append(row)
    return {"command": "speed_memory", "device": str(device), "threads": torch.get_num_threads(), "n": n,
            "batch": batch, "quick": quick, "memory_measure": memory_measure(device) + ", forward and backward",
            "rows": rows, "binary_advantage_grows_with_k": _grows_with_k(rows, ks)}


def _backward(model: torch.nn.Module, X: torch.Tensor, C: torch.Tensor, cfg: DictConfig) -> None:
    """Forward and backward of the training loss."""
    model.zero_grad(set_to_none=True)
    smoothed_objective(X, model(X, C), cfg.loss.tau, cfg.loss.regularizer).mean().backward()


def _grows_with_k(rows: list[dict], ks: tuple[int, ...]) -> dict:
    """Per d and measure: does onehot/binary rise from the smallest to the largest k?"""
    out = {}
    for what in ("forward_seconds", "backward_seconds", "peak_memory_bytes"):
        key = f"onehot_over_binary_{what}"
        by_d = {d: [r[key] for r in rows if r["d"] == d] for d in SPEED_MEMORY_D}
        out[what] = {str(d): ratios[-1] > ratios[0] for d, ratios in by_d.items()}
    return out
