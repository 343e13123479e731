"""`python -m bench step`: the real training step (training.fused.Pack, of one model) against the
straightforward one (models.reference), alternately, in one run."""

from __future__ import annotations

import statistics

import torch
from omegaconf import DictConfig

from bench.common import (
    MATMUL_SIZE,
    alternate,
    describe,
    figures,
    log,
    matmul_flop_rate,
    memory_measure,
    paired_ratio,
    peak_memory_bytes,
    step_flops,
)
from config.run import RunSpec
from models.reference import ReferenceTransformer, reference_step
from training.device import pick_device
from training.fused import Pack
from training.trainer import Trainer, task_spec


def bench_step(cfg: DictConfig, repeats: int) -> dict:
    """The real training step against the straightforward one, alternately."""
    device = pick_device(cfg.train.device)
    trainer = Trainer(RunSpec.of(cfg), device)
    base = ReferenceTransformer.like(trainer.model).train()
    step = Pack([trainer]).step
    base_opt = torch.optim.Adam(base.parameters(), lr=cfg.optim.lr)
    spec, generator = task_spec(cfg), torch.Generator().manual_seed(cfg.seed)
    loss = cfg.loss

    def reference() -> None:
        reference_step(base, base_opt, spec, cfg.train.batch, generator, loss.tau, loss.regularizer, device)

    matmul = matmul_flop_rate(device)
    log(f"step: {describe(cfg)} on {device}, {torch.get_num_threads()} threads, {repeats} rounds")
    times = alternate({"fused": step, "reference": reference, "matmul": matmul}, repeats, device)
    rate = statistics.median(2 * MATMUL_SIZE**3 / t for t in times["matmul"])
    flops = step_flops(cfg)
    out = {
        "command": "step",
        "config": describe(cfg),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "dtype": "float32",
        "flops_per_step": flops,
        "matmul_flop_rate": rate,
        "memory_measure": memory_measure(device),
    }
    out.update(figures(times["fused"], flops, 1, peak_memory_bytes(step, device), rate))
    out["reference"] = figures(times["reference"], flops, 1, peak_memory_bytes(reference, device), rate)
    out["speedup"] = paired_ratio(times["reference"], times["fused"])
    return out
