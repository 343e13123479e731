"""`python -m bench sweep`: the paper grid's wall time on this machine, projected from measured step times.

`--sweep-pack 0` skips the packed timing of every shape (the solo projection alone).
"""

from __future__ import annotations

import statistics
from collections import Counter

import torch
from omegaconf import DictConfig, OmegaConf

from bench.common import alternate, log, pack_step, seeded, timed
from config.compose import compose
from config.grid import expand
from models.transformer import ClusteringTransformer
from training.device import pick_device
from training.trainer import Validation

GRID_STEPS = 10_000
GRID_SHAPE_KEYS = (
    "task.d",
    "task.k",
    "model.embedding",
)  # what a step's cost depends on within the paper grid


def evaluation_seconds(cfg: DictConfig, device: torch.device) -> float:
    """Seconds of one evaluation of one model on its validation set (every train.eval_every steps)."""
    m = cfg.model
    model = ClusteringTransformer(cfg.task.d, cfg.task.k, m.embedding, m.gamma, m.dropout, m.qkv_mult)
    model, validation = model.to(device), Validation(cfg, device)
    return timed(lambda: validation(model), device)


def bench_sweep(overrides: list[str], repeats: int, pack: int) -> dict:
    """Projected wall time of the paper grid (3000 models x 10000 steps) on this machine, one job at a time.

    The step cost within the grid depends on (d, k, embedding); each such shape is
    measured once (solo step, and the per-model time in a pack of `pack` seeds), plus
    its evaluation (every train.eval_every steps), then weighted by how many of the
    grid's configurations x seeds have that shape.
    """
    base = compose(overrides + ["sweep=paper"])
    plan = expand(base.sweep)
    shapes = Counter(
        tuple(c.overrides.get(key, OmegaConf.select(base, key)) for key in GRID_SHAPE_KEYS)
        for c in plan.configurations
    )
    device = pick_device(base.train.device)
    rows, solo_total, packed_total = [], 0.0, 0.0
    for i, (shape, count) in enumerate(sorted(shapes.items())):
        cfg = compose(overrides + [f"{key}={value}" for key, value in zip(GRID_SHAPE_KEYS, shape)])
        d, k, embedding = shape
        log(f"sweep: shape {i + 1}/{len(shapes)} d={d} k={k} {embedding} ({count} configurations)")
        variants = {"solo": pack_step([cfg], device)}
        if pack > 1:  # the pack's own step (pack_step), so the projection follows training.packed
            variants["packed"] = pack_step([seeded(cfg, cfg.seed + j) for j in range(pack)], device)
        times = alternate(variants, repeats, device)
        evaluation = evaluation_seconds(cfg, device) / cfg.train.eval_every  # amortised per step
        per_model = statistics.median(times["solo"]) + evaluation
        per_model_packed = statistics.median(times["packed"]) / pack + evaluation if pack > 1 else per_model
        jobs = count * len(plan.seeds)
        solo_total += jobs * GRID_STEPS * per_model
        packed_total += jobs * GRID_STEPS * per_model_packed
        rows.append(
            {
                "d": d,
                "k": k,
                "embedding": embedding,
                "configurations": count,
                "seconds_per_step_solo": per_model,
                "seconds_per_model_step_packed": per_model_packed,
            }
        )
    return {
        "command": "sweep",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "pack": pack,
        "configurations": len(plan.configurations),
        "seeds": len(plan.seeds),
        "steps": GRID_STEPS,
        "projected_hours_solo": solo_total / 3600,
        "projected_hours_packed": packed_total / 3600 if pack > 1 else None,
        "note": "one job at a time on this machine; per-step times include the amortised evaluation",
        "shapes": rows,
    }
