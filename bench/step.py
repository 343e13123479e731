"""`python -m bench step`: the real training step (training.fused.Pack, of one model) against the
straightforward one (models.reference), alternately, in one run."""

from __future__ import annotations

import sys

import torch
from omegaconf import DictConfig

from bench.common import (
    alternate_with_matmul,
    describe,
    figures,
    log,
    memory_measure,
    paired_ratio,
    peak_memory_bytes,
    step_flops,
)
from bench.line import Timing, print_json, timing
from cli.entry import command
from config.compose import compose
from config.help import composed_config
from config.run import RunSpec
from models.reference import ReferenceTransformer, reference_step
from training.device import pick_device
from training.fused import Pack
from training.trainer import Trainer, task_spec

ABOUT = "the real training step against the straightforward one, alternately (bench/step.py)"


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    line = parse(argv)
    print_json(bench_step(compose(line.overrides), line.repeats, line.threads), line.out)
    return 0


def parse(argv: list[str]) -> Timing:
    """The options and the config overrides (composed alone by main)."""
    return timing("step", ABOUT, argv)


def bench_step(cfg: DictConfig, repeats: int, threads: int | None = None) -> dict:
    """The real training step against the straightforward one, alternately, on `threads` torch threads
    (None: PyTorch's)."""
    device = pick_device(cfg.train.device)
    trainer = Trainer(RunSpec.of(cfg), device)
    base = ReferenceTransformer.like(trainer.model).train()
    step = Pack([trainer]).step
    base_opt = torch.optim.Adam(base.parameters(), lr=cfg.optim.lr)
    spec, generator = task_spec(cfg), torch.Generator().manual_seed(cfg.seed)
    loss = cfg.loss

    def reference() -> None:
        reference_step(base, base_opt, spec, cfg.train.batch, generator, loss.tau, loss.regularizer, device)

    if threads:
        torch.set_num_threads(threads)
    log(f"step: {describe(cfg)} on {device}, {torch.get_num_threads()} threads, {repeats} rounds")
    times, rate = alternate_with_matmul({"fused": step, "reference": reference}, repeats, device)
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


if __name__ == "__main__":
    sys.exit(main())
