"""`python -m bench sweep`: the paper grid's wall time on this machine, projected from measured step times.

`--sweep-pack 0` skips the packed timing of every shape (the solo projection alone).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter

import torch
from omegaconf import DictConfig, OmegaConf

from bench.common import alternate, log, pack_step, timed
from bench.line import Timing, print_json, timing
from cli.entry import command
from config.compose import compose
from config.grid import expand
from config.help import composed_config
from models.transformer import ClusteringTransformer
from training.device import pick_device
from training.trainer import Validation

GRID_STEPS = 10_000
GRID_SHAPE_KEYS = (
    "task.d",
    "task.k",
    "model.embedding",
)  # what a step's cost depends on within the paper grid
ABOUT = "projected wall time of the paper grid from measured solo and pack steps (bench/sweep.py)"


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    line = parse(argv)
    print_json(bench_sweep(line.overrides, line.repeats, line.args.sweep_pack, line.threads), line.out)
    return 0


def parse(argv: list[str]) -> Timing:
    """The options (and --sweep-pack), and the config overrides the grid's configurations are composed
    with."""
    return timing("sweep", ABOUT, argv, _pack_option)


def _pack_option(options: argparse.ArgumentParser) -> None:
    options.add_argument(
        "--sweep-pack",
        type=int,
        default=10,
        help="also time packs of this many seeds per shape (0, 1: solo only)",
    )


def bench_sweep(overrides: list[str], repeats: int, pack: int, threads: int | None = None) -> dict:
    """Projected wall time of the paper grid (3000 models x 10000 steps) on this machine, one job at a time,
    on `threads` torch threads (None: PyTorch's).

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
    cfgs = {
        shape: compose(overrides + [f"{key}={value}" for key, value in zip(GRID_SHAPE_KEYS, shape)])
        for shape in sorted(shapes)
    }
    device = pick_device(base.train.device)
    if threads:
        torch.set_num_threads(threads)
    rows = []
    for i, (shape, cfg) in enumerate(cfgs.items()):
        d, k, embedding = shape
        log(f"sweep: shape {i + 1}/{len(shapes)} d={d} k={k} {embedding} ({shapes[shape]} configurations)")
        per_model, per_model_packed = step_seconds(cfg, pack, repeats, device)
        rows.append(
            {
                "d": d,
                "k": k,
                "embedding": embedding,
                "configurations": shapes[shape],
                "seconds_per_step_solo": per_model,
                "seconds_per_model_step_packed": per_model_packed,
            }
        )
    model_steps = [row["configurations"] * len(plan.seeds) * GRID_STEPS for row in rows]
    packed = hours(model_steps, rows, "seconds_per_model_step_packed") if pack > 1 else None
    return {
        "command": "sweep",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "pack": pack,
        "configurations": len(plan.configurations),
        "seeds": len(plan.seeds),
        "steps": GRID_STEPS,
        "projected_hours_solo": hours(model_steps, rows, "seconds_per_step_solo"),
        "projected_hours_packed": packed,
        "note": "one job at a time on this machine; per-step times include the amortised evaluation",
        "shapes": rows,
    }


def step_seconds(cfg: DictConfig, pack: int, repeats: int, device: torch.device) -> tuple[float, float]:
    """Seconds per model-step of one shape, solo and in a pack of `pack` seeds (solo's when pack < 2), each
    with its evaluation (one model on its validation set, timed after the steps) amortised over
    train.eval_every steps."""
    models = {"solo": [cfg]}
    if pack > 1:  # the pack's own step (pack_step), so the projection follows training.packed
        models["packed"] = [seeded(cfg, cfg.seed + j) for j in range(pack)]
    times = alternate({name: pack_step(cfgs, device) for name, cfgs in models.items()}, repeats, device)
    m = cfg.model
    model = ClusteringTransformer(cfg.task.d, cfg.task.k, m.embedding, m.gamma, m.dropout, m.qkv_mult)
    model, validation = model.to(device), Validation(cfg, device)
    evaluation = timed(lambda: validation(model), device) / cfg.train.eval_every
    per_model = statistics.median(times["solo"]) + evaluation
    return per_model, statistics.median(times["packed"]) / pack + evaluation if pack > 1 else per_model


def seeded(cfg: DictConfig, seed: int) -> DictConfig:
    """A copy of cfg with another seed: the models of a pack."""
    out = cfg.copy()
    out.seed = seed
    return out


def hours(model_steps: list[int], rows: list[dict], key: str) -> float:
    """The grid's hours: each shape's model-steps at its seconds per model-step."""
    return sum(steps * row[key] for steps, row in zip(model_steps, rows)) / 3600


if __name__ == "__main__":
    sys.exit(main())
