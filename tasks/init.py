"""Initial centers: k distinct data points per task, chosen three ways.

`random` picks k distinct points uniformly; `kmeans++` (D^2 sampling) and
`gonzalez` (farthest-first) start from one uniformly chosen point. The loop
runs over the k centers only, never over tasks, points or models: the tasks
of several models are chosen for at once, each model's draws from its own
generator (tasks.streams).
"""

from __future__ import annotations

from typing import Sequence

import torch

from tasks.spec import INITS
from tasks.streams import fill_each


def _gather_points(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """X (B, n, d), idx (B, m) -> (B, m, d)."""
    return X.gather(1, idx.unsqueeze(-1).expand(-1, -1, X.shape[-1]))


def _sq_dist_to(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Squared distances (B, n) of every point to the point idx (B, 1) of its task.

    From differences, not the dot-product expansion: a chosen point is at
    distance exactly 0 from itself, and gonzalez compares distances exactly.
    """
    return (X - _gather_points(X, idx)).square_().sum(-1)


def _draw_one(weights: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One index (B, 1) per row with probability proportional to its weight: torch.multinomial(weights, 1)'s
    own method (the largest weight / Exp(1) draw), so the same draws from the same stream, without its
    checks of the weights, which read them back to the host (a wait per center on a GPU). Non-finite
    weights (of a non-finite task, which tasks.sampler reports with the step's read-backs) still give
    an index in range."""
    race = fill_each(torch.empty_like(weights), generators, lambda rows, g: rows.exponential_(generator=g))
    return torch.div(weights, race, out=race).argmax(dim=-1, keepdim=True)


def center_indices_each(
    X: torch.Tensor, k: int, init: str, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """Indices (P * B, k) of the initial centers among the n points of each task of X (P * B, n, d): the
    B tasks of model i, rows i * B on, from generators[i] (on the device of every generator)."""
    R, n, _ = X.shape
    device = generators[0].device
    if init == "random":
        keys = fill_each(
            torch.empty((R, n), device=device), generators, lambda rows, g: rows.uniform_(generator=g)
        )
        return keys.argsort(dim=-1)[:, :k].to(X.device)
    if init not in INITS:
        raise ValueError(f"task.init={init!r} is not allowed: choose one of {', '.join(INITS)}")
    first = torch.empty((R, 1), dtype=torch.int64, device=device)
    first = fill_each(first, generators, lambda rows, g: rows.random_(0, n, generator=g)).to(X.device)
    chosen = [first]
    taken = torch.zeros((R, n), dtype=torch.bool, device=X.device).scatter_(1, first, True)
    nearest = _sq_dist_to(X, first)  # to the nearest chosen center so far
    for _ in range(1, k):
        if init == "gonzalez":
            nxt = nearest.masked_fill(taken, -1.0).argmax(dim=-1, keepdim=True)
        else:  # kmeans++: D^2 weights; uniform over untaken points if all are zero (duplicates)
            weights = nearest.masked_fill(taken, 0.0)
            degenerate = weights.sum(-1, keepdim=True) <= 0
            weights = torch.where(degenerate, (~taken).to(weights.dtype), weights)
            # On the generators' device (the task streams'); double keeps tiny weights.
            nxt = _draw_one(weights.to(device, torch.float64), generators).to(X.device)
        chosen.append(nxt)
        taken.scatter_(1, nxt, True)
        nearest = torch.minimum(nearest, _sq_dist_to(X, nxt))
    return torch.cat(chosen, dim=1)


def choose_center_indices(X: torch.Tensor, k: int, init: str, generator: torch.Generator) -> torch.Tensor:
    """Indices (B, k) of the initial centers among the n points of each task."""
    return center_indices_each(X, k, init, [generator])


def choose_centers_each(
    X: torch.Tensor, k: int, init: str, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """Initial centers (P * B, k, d): k distinct data points of each task, as center_indices_each."""
    return _gather_points(X, center_indices_each(X, k, init, generators))


def choose_centers(X: torch.Tensor, k: int, init: str, generator: torch.Generator) -> torch.Tensor:
    """Initial centers (B, k, d): k distinct data points of each task."""
    return choose_centers_each(X, k, init, [generator])
