"""Lloyd's algorithm, batched and vectorised: the baseline everywhere."""

from __future__ import annotations

import torch


def assign(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """Index of each point's nearest center, (B, n)."""
    return torch.cdist(X, C, compute_mode="donot_use_mm_for_euclid_dist").argmin(-1)


def lloyd_step(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """One Lloyd iteration: (B, n, d), (B, k, d) -> (B, k, d).

    Sums and counts per cluster come from one product with the one-hot assignment matrix, not a
    scatter-add: CUDA adds a scatter's colliding rows with atomics, in no fixed order, and a product
    sums in a fixed one (training.determinism). An empty cluster keeps its previous center.
    """
    k = C.shape[1]
    onehot = (assign(X, C).unsqueeze(-1) == torch.arange(k, device=X.device)).to(X.dtype)  # (B, n, k)
    sums = onehot.transpose(-1, -2) @ X  # (B, k, d)
    counts = onehot.sum(-2).unsqueeze(-1)  # (B, k, 1): whole numbers, exact in any order
    return torch.where(counts > 0, sums / counts.clamp(min=1), C)


def lloyd(X: torch.Tensor, C: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` Lloyd iterations."""
    for _ in range(steps):
        C = lloyd_step(X, C)
    return C
