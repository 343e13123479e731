"""A transformer that executes Lloyd's algorithm exactly (docs/science.md section 3).

The same four-module layer as the learned model, with fixed weights and
hard-max (gamma = inf) attention. With P the projection onto the d data
coordinates and S the projection onto the scratch (code) coordinates:

    CAX: q = P h, k = P h, v = S h   -> each point receives its nearest center's code
    SAX: q = h,   k = h,   v = -S h  -> each point clears its own old code
    CAC: q = S h, k = S h, v = P h   -> each center averages the points carrying its code
    SAC: q = h,   k = h,   v = -P h  -> each center subtracts itself

so one layer is one Lloyd iteration and t layers are t iterations, with
d + ceil(log2 k) dimensions (binary) or d + k (onehot).

When a cluster empties, no point carries its code and hard-max picks the
points whose codes are nearest: with onehot every point ties (the center
moves to the mean of all points); with binary, the points whose codes are
at the smallest Hamming distance. Lloyd's keeps the old center instead
(`models.lloyd.lloyd_step`), so the two agree exactly while no cluster empties.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.embedding import embed, embedding_dim
from models.transformer import ClusteringLayer


def _set(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for linear, weight in ((module.q, q), (module.k, k), (module.v, v)):
        linear.weight.copy_(weight)
        linear.bias.zero_()


class ExactLloydTransformer(nn.Module):
    """t applications of the fixed layer equal t Lloyd iterations."""

    def __init__(self, d: int, k: int, embedding: str = "binary") -> None:
        super().__init__()
        if embedding not in ("binary", "onehot"):
            raise ValueError(
                f"embedding={embedding!r} is not allowed: the exact construction needs 'binary' or 'onehot'"
            )
        self.d, self.k, self.embedding = d, k, embedding
        d_emb = embedding_dim(d, k, embedding)
        self.layer = ClusteringLayer(d_emb, gamma=math.inf, dropout=0.0)
        I = torch.eye(d_emb)
        P = torch.diag((torch.arange(d_emb) < d).float())
        S = I - P
        with torch.no_grad():
            _set(self.layer.cax, P, P, S)
            _set(self.layer.sax, I, I, -S)
            _set(self.layer.cac, S, S, P)
            _set(self.layer.sac, I, I, -P)
        self.requires_grad_(False)

    def forward(self, X: torch.Tensor, C: torch.Tensor, steps: int = 1) -> torch.Tensor:
        """X (B, n, d), C (B, k, d) -> centers after `steps` layers (B, k, d)."""
        self.to(device=X.device, dtype=X.dtype)  # fixed weights follow the data (float64 for exactness)
        Xt, Ct = embed(X, C, self.embedding)
        for _ in range(steps):
            Xt, Ct = self.layer(Xt, Ct)
        return Ct[..., : self.d]
