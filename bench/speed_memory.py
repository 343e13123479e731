"""`python -m bench speed_memory`: binary against onehot, forward/backward time and peak memory over d and k.

One task of n = max(task.n, 1024) points (k up to 1024 needs n >= k); `--quick` drops k = 1024.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial

import torch
from omegaconf import DictConfig

from bench.common import alternate, log, memory_measure, peak_memory_bytes
from bench.line import Timing, print_json, timing
from cli.entry import command
from config.compose import compose
from config.help import composed_config
from models.embedding import embedding_dim
from models.losses import smoothed_objective
from models.transformer import ClusteringTransformer
from tasks.sampler import TaskSpec, sample_tasks
from training.device import pick_device

SPEED_MEMORY_D = (4, 16, 64)
SPEED_MEMORY_K = (8, 64, 256, 1024)
SPEED_MEMORY_BATCH = 1  # one task: onehot at k = 1024 is ~100 GFLOP per forward + backward
ABOUT = "binary against onehot: forward/backward time and peak memory over d and k"


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    line = parse(argv)
    result = bench_speed_memory(compose(line.overrides), line.repeats, line.args.quick, line.threads)
    print_json(result, line.out)
    return 0


def parse(argv: list[str]) -> Timing:
    """The options (and --quick: without k = 1024), and the config overrides (composed alone by main)."""
    return timing("speed_memory", ABOUT, argv, _quick_option)


def _quick_option(options: argparse.ArgumentParser) -> None:
    options.add_argument("--quick", action="store_true", help="drops k = 1024")


def bench_speed_memory(cfg: DictConfig, repeats: int, quick: bool, threads: int | None = None) -> dict:
    """Forward and backward time and peak memory, binary against onehot, over d and k (paper figure 1), on
    `threads` torch threads (None: PyTorch's)."""
    if threads:
        torch.set_num_threads(threads)
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
            models = {
                e: ClusteringTransformer(d, k, e, cfg.model.gamma, cfg.model.dropout).to(device)
                for e in ("onehot", "binary")
            }
            variants = {}
            for e, model in models.items():
                variants[f"{e}_forward"] = partial(model, X, C)
                variants[f"{e}_backward"] = (partial(_loss, model, X, C, cfg), _backward_of)
            log(f"  d={d} k={k}")
            times = alternate(variants, repeats, device)
            row = {"d": d, "k": k}
            for e, model in models.items():
                row[e] = {
                    "d_emb": embedding_dim(d, k, e),
                    "forward_seconds": statistics.median(times[f"{e}_forward"]),
                    "backward_seconds": statistics.median(times[f"{e}_backward"]),
                    "peak_memory_bytes": peak_memory_bytes(partial(_backward, model, X, C, cfg), device),
                }
            for what in ("forward_seconds", "backward_seconds", "peak_memory_bytes"):
                row[f"onehot_over_binary_{what}"] = row["onehot"][what] / max(row["binary"][what], 1e-12)
            rows.append(row)
    return {
        "command": "speed_memory",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "n": n,
        "batch": batch,
        "quick": quick,
        "memory_measure": memory_measure(device) + ", forward and backward",
        "rows": rows,
        "binary_advantage_grows_with_k": _grows_with_k(rows, ks),
    }


def _loss(model: torch.nn.Module, X: torch.Tensor, C: torch.Tensor, cfg: DictConfig) -> torch.Tensor:
    """The training loss's forward, gradients cleared: what a backward pass starts from."""
    model.zero_grad(set_to_none=True)
    return smoothed_objective(X, model(X, C), cfg.loss.tau, cfg.loss.regularizer).mean()


def _backward_of(loss: torch.Tensor) -> None:
    """The backward pass alone, timed apart from the forward that made `loss` (until 2026-12-05 backward was
    the forward + backward call's median less the forward's, clipped at 0: on a busy machine a 0, and a
    onehot/binary ratio of 1e11)."""
    loss.backward()


def _backward(model: torch.nn.Module, X: torch.Tensor, C: torch.Tensor, cfg: DictConfig) -> None:
    """Forward and backward of the training loss (its peak memory)."""
    _backward_of(_loss(model, X, C, cfg))


def _grows_with_k(rows: list[dict], ks: tuple[int, ...]) -> dict:
    """Per d and measure: does onehot/binary rise from the smallest to the largest k?"""
    out = {}
    for what in ("forward_seconds", "backward_seconds", "peak_memory_bytes"):
        key = f"onehot_over_binary_{what}"
        by_d = {d: [r[key] for r in rows if r["d"] == d] for d in SPEED_MEMORY_D}
        out[what] = {str(d): ratios[-1] > ratios[0] for d, ratios in by_d.items()}
    return out


if __name__ == "__main__":
    sys.exit(main())
