"""The k-means objective and its smoothed upper bounds (docs/science.md section 4).

r_ij = ||x_i - c_j||^2. The regularised min replaces min_j r_ij by <w_i, r_i>
with w_i = argmin_{w in simplex} <w, r_i> + tau * Omega(w):
negative entropy gives softmax(-r_i / tau), l2 gives sparsemax(-r_i / tau).
Both surrogates upper-bound the objective; l2 is the tighter of the two.
"""

from __future__ import annotations

import torch

from models.options import REGULARIZERS


def sq_distances(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """r (B, n, k): squared distances of points to centers."""
    return (
        X.pow(2).sum(-1, keepdim=True) - 2 * X @ C.transpose(-1, -2) + C.pow(2).sum(-1).unsqueeze(-2)
    ).clamp(min=0)


def kmeans_objective(X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """sum_i min_j ||x_i - c_j||^2, per task: (B,)."""
    return sq_distances(X, C).amin(-1).sum(-1)


def sparsemax(z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Euclidean projection of z onto the probability simplex (sort-based).

    With z sorted decreasingly, the support is the largest s with
    1 + s * z_(s) > sum_{j<=s} z_(j); then w = max(z - t, 0) with
    t = (sum_{j<=s} z_(j) - 1) / s.
    """
    z = z.transpose(dim, -1)
    z_sorted, _ = z.sort(dim=-1, descending=True)
    ranks = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    cumsum = z_sorted.cumsum(-1)
    # s >= 1 for any finite row (the largest entry is always in the support); a row with a NaN or only
    # -inf entries (centers that overflowed) has no such s: s = 1 there makes its weights NaN, so the
    # loss turns non-finite and training records a divergence, instead of an out-of-range index.
    support = (1 + ranks * z_sorted > cumsum).sum(-1, keepdim=True).clamp(min=1)
    threshold = (cumsum.gather(-1, support - 1) - 1) / support.to(z.dtype)
    return (z - threshold).clamp(min=0).transpose(dim, -1)


def regularized_weights(r: torch.Tensor, tau: float, regularizer: str) -> torch.Tensor:
    """w_i on the simplex for each point, (B, n, k)."""
    if regularizer == "ne":
        return torch.softmax(-r / tau, dim=-1)
    if regularizer == "l2":
        return sparsemax(-r / tau, dim=-1)
    raise ValueError(
        f"loss.regularizer={regularizer!r} is not allowed: choose one of {', '.join(REGULARIZERS)}"
    )


def smoothed_objective(X: torch.Tensor, C: torch.Tensor, tau: float, regularizer: str) -> torch.Tensor:
    """sum_i <w_i, r_i>, an upper bound of the k-means objective, per task: (B,)."""
    if not tau > 0:
        raise ValueError(f"loss.tau={tau!r} is not allowed: a number > 0")
    r = sq_distances(X, C)
    return (regularized_weights(r, tau, regularizer) * r).sum((-2, -1))
