"""`python -m bench pack`: solo against packed training (training.packed), in packs of P seeds."""

from __future__ import annotations

import statistics

import torch
from omegaconf import DictConfig

from bench.common import alternate, describe, log, memory_measure, peak_memory_bytes, seeded, step_flops
from training.loop import Trainer, pick_device
from training.packed import packed_step


def bench_pack(cfg: DictConfig, sizes: list[int], repeats: int) -> dict:
    """Model-steps per second, solo (Trainer.step) against packs of P seeds (packed_step)."""
    device = pick_device(cfg.train.device)
    solo = Trainer(cfg, device)
    packs = {P: [Trainer(seeded(cfg, cfg.seed + i), device) for i in range(P)] for P in sizes}
    log(f"pack: {describe(cfg)} on {device}, pack sizes {sizes}, {repeats} rounds")
    variants = {"solo": solo.step, **{f"pack{P}": (lambda ts=ts: packed_step(ts)) for P, ts in packs.items()}}
    times = alternate(variants, repeats, device)
    solo_seconds = statistics.median(times["solo"])
    flops = step_flops(cfg)
    rows = []
    for P in sizes:
        seconds = statistics.median(times[f"pack{P}"])
        rows.append(
            {
                "pack": P,
                "seconds_per_step": seconds,
                "model_steps_per_second": P / seconds,
                "speedup_vs_solo": statistics.median(
                    P * s / p for s, p in zip(times["solo"], times[f"pack{P}"])
                ),
                "flop_rate": P * flops / seconds,
                "peak_memory_bytes": peak_memory_bytes(lambda ts=packs[P]: packed_step(ts), device),
            }
        )
    return {
        "command": "pack",
        "config": describe(cfg),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "memory_measure": memory_measure(device),
        "solo": {
            "seconds_per_step": solo_seconds,
            "model_steps_per_second": 1 / solo_seconds,
            "peak_memory_bytes": peak_memory_bytes(solo.step, device),
        },
        "packs": rows,
    }
