"""The learned one-layer clustering transformer (docs/science.md section 3).

    X1 = X + CAX(X, C) + SAX(X, X)    # points attend to centers and points
    C1 = C + CAC(C, X1) + SAC(C, C)   # centers attend to updated points and centers

The model's output is the first d coordinates of C1: new centers.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from models.attention import DistanceAttention
from models.embedding import embed, embedding_dim

Attend = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]  # (module name, queries, keys) -> output


def layer_equation(attend: Attend, X: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer above, the only place it is written; `attend` applies the module named cax, sax, cac or sac
    (one model's module here, a batch of models' in training.packed, the plain reference in
    models.reference)."""
    X1 = X + attend("cax", X, C) + attend("sax", X, X)
    C1 = C + attend("cac", C, X1) + attend("sac", C, C)
    return X1, C1


class ClusteringLayer(nn.Module):
    """The four attention modules of one layer, acting on tokens (`attention`: the module class)."""

    def __init__(
        self,
        d_emb: int,
        gamma: float = 1.0,
        dropout: float = 0.0,
        qkv_mult: int = 1,
        attention: type[nn.Module] = DistanceAttention,
    ) -> None:
        super().__init__()
        self.cax, self.sax, self.cac, self.sac = (
            attention(d_emb, gamma, dropout, qkv_mult) for _ in range(4)
        )

    def forward(self, X: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return layer_equation(lambda name, queries, keys: getattr(self, name)(queries, keys), X, C)


class ClusteringTransformer(nn.Module):
    """Embed points and centers, apply one layer, read the new centers."""

    def __init__(
        self,
        d: int,
        k: int,
        embedding: str = "onehot",
        gamma: float = 1.0,
        dropout: float = 0.01,
        qkv_mult: int = 1,
    ) -> None:
        super().__init__()
        _check_hyperparameters(gamma, dropout, qkv_mult)
        self.d, self.k, self.embedding = d, k, embedding
        self.d_emb = embedding_dim(d, k, embedding)
        self.layer = ClusteringLayer(self.d_emb, gamma, dropout, qkv_mult)

    def forward(self, X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
        """X (B, n, d), C (B, k, d) -> new centers (B, k, d)."""
        _, C1 = self.layer(*embed(X, C, self.embedding))
        return C1[..., : self.d]


def _check_hyperparameters(gamma: float, dropout: float, qkv_mult: int) -> None:
    """ValueError naming the field, its value and what is allowed."""
    if not gamma > 0:  # inf (hard-max) is allowed; nan is not
        raise ValueError(f"model.gamma={gamma!r} is not allowed: a number > 0 (inf for hard-max)")
    if not 0 <= dropout < 1:
        raise ValueError(f"model.dropout={dropout!r} is not allowed: a number in [0, 1)")
    if isinstance(qkv_mult, bool) or not isinstance(qkv_mult, int) or qkv_mult < 1:
        raise ValueError(f"model.qkv_mult={qkv_mult!r} is not allowed: an integer >= 1")


def count_parameters(module: nn.Module) -> int:
    """Number of scalar parameters (learned or fixed) of a model."""
    return sum(p.numel() for p in module.parameters())


def parameter_count(d: int, k: int, embedding: str, qkv_mult: int = 1) -> int:
    """Closed form of count_parameters for the one-layer model (learned or exact).

    Four modules, each three d_emb -> w linear maps with biases (w = qkv_mult * d_emb)
    and, when widened, a w -> d_emb output map: 12 (d_emb^2 + d_emb) at qkv_mult 1,
    so O((d + k)^2) for onehot and O((d + log2 k)^2) for binary.
    """
    d_emb = embedding_dim(d, k, embedding)
    width = qkv_mult * d_emb
    per_module = 3 * (d_emb * width + width) + (width * d_emb + d_emb if qkv_mult > 1 else 0)
    return 4 * per_module
