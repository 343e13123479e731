"""Lloyd's algorithm, batched and vectorised: the baseline everywhere."""

from __future__ import annotations

import torch


def assign(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Index of each point's nearest center, (B, n)."""
    return torch.cdist(X, C, compute_mode="donot_use_mm_for_euclid_dist").argmin(-1)


def lloyd_step(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """One Lloyd iteration: (B, n, d), (B, k, d) -> (B, k, d).

    Sums and counts per cluster come from one scatter-add over the flattened
    (task, cluster) index; an empty cluster keeps its previous center.
    """
    B, n, d = X.shape
    k = C.shape[1]
    flat = (assign(X, C) + k * torch.arange(B, device=X.device).unsqueeze(-1)).reshape(-1)
    sums = X.new_zeros(B * k, d).index_add_(0, flat, X.reshape(-1, d))
    counts = X.new_zeros(B * k).index_add_(0, flat, X.new_ones(B * n))
    means = sums / counts.clamp(min=1).unsqueeze(-1)
    return torch.where(counts.unsqueeze(-1) > 0, means, C.reshape(-1, d)).reshape(B, k, d)


def lloyd(X: torch.Tensor, C: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` Lloyd iterations."""
    for _ in range(steps):
        C = lloyd_step(X, C)
    return C
