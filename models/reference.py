"""A straightforward implementation of the model and its training step.

The reference the fast path (models.transformer + tasks.sampler, as used by
sweeper.train) is measured against: attention scores from torch.cdist, a
plain softmax, and each task drawn in a Python loop with
torch.distributions.MixtureSameFamily (its component from the family's record,
tasks.families). Its parameters have the same names and shapes as
ClusteringTransformer's, so one state_dict loads into both and they
compute the same function (tests/test_bench.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import distributions as D
from torch import nn

from models.embedding import center_codes
from models.losses import regularized_weights
from models.transformer import ClusteringLayer, ClusteringTransformer
from tasks.families import family
from tasks.sampler import TaskSpec, choose_centers, to_unit_cube


class BaselineAttention(nn.Module):
    """softmax(-gamma * cdist(q, k)^2 / sqrt(d_emb)) v, with dropout on the weights."""

    def __init__(self, d_emb: int, gamma: float = 1.0, dropout: float = 0.0, qkv_mult: int = 1) -> None:
        super().__init__()
        width = d_emb * qkv_mult
        self.d_emb, self.gamma, self.dropout = d_emb, gamma, dropout
        self.q, self.k, self.v = nn.Linear(d_emb, width), nn.Linear(d_emb, width), nn.Linear(d_emb, width)
        self.out = nn.Linear(width, d_emb) if qkv_mult > 1 else None

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        scores = -self.gamma * torch.cdist(self.q(queries), self.k(keys)).pow(2) / math.sqrt(self.d_emb)
        weights = F.dropout(torch.softmax(scores, dim=-1), self.dropout, self.training)
        h = weights @ self.v(keys)
        return self.out(h) if self.out is not None else h


class ReferenceTransformer(nn.Module):
    """Same parameters (names, shapes) and function as ClusteringTransformer."""

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
        self.d, self.k, self.embedding = d, k, embedding
        codes = center_codes(k, embedding)
        self.register_buffer("codes", codes, persistent=False)
        self.layer = ClusteringLayer(
            d + codes.shape[1], gamma, dropout, qkv_mult, attention=BaselineAttention
        )

    def forward(self, X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
        B, n, _ = X.shape
        m = self.codes.shape[1]
        Xt = torch.cat([X, torch.zeros(B, n, m, dtype=X.dtype, device=X.device)], -1)
        Ct = torch.cat([C, self.codes.to(X.dtype).expand(B, -1, -1)], -1)
        _, C1 = self.layer(Xt, Ct)
        return C1[..., : self.d]

    @classmethod
    def like(cls, model: ClusteringTransformer) -> "ReferenceTransformer":
        """A reference model holding a copy of `model`'s weights."""
        att = model.layer.cax
        base = cls(model.d, model.k, model.embedding, att.gamma, att.dropout, att.q.out_features // att.d_emb)
        base.load_state_dict(model.state_dict())
        return base.to(next(model.parameters()).device)


def sample_task(spec: TaskSpec, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One task (points in [0, 1], initial centers) from a MixtureSameFamily.

    torch.distributions takes no generator: points come from the global RNG.
    """
    means = torch.rand(spec.k, spec.d)
    scales = torch.full((spec.k, spec.d), float(spec.scale))
    if not spec.equal_scales:
        scales = scales * torch.rand(spec.k, spec.d)
    weights = torch.ones(spec.k) if spec.equal_weights else torch.rand(spec.k)
    component = D.Independent(family(spec.family).component(D, means, scales), 1)
    mixture = D.MixtureSameFamily(D.Categorical(probs=weights / weights.sum()), component)
    X = to_unit_cube(mixture.sample((spec.n,)))
    return X, choose_centers(X.unsqueeze(0), spec.k, spec.init, generator)[0]


def sample_tasks_loop(
    spec: TaskSpec, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of tasks drawn one at a time; same distribution as tasks.sampler.sample_tasks."""
    X, C0 = zip(*(sample_task(spec, generator) for _ in range(batch)))
    return torch.stack(X), torch.stack(C0)


def smoothed_objective_plain(X: torch.Tensor, C: torch.Tensor, tau: float, regularizer: str) -> torch.Tensor:
    """The same surrogate as models.losses.smoothed_objective, distances from cdist."""
    r = torch.cdist(X, C).pow(2)
    return (regularized_weights(r, tau, regularizer) * r).sum((-2, -1))


def reference_step(
    model: ReferenceTransformer,
    optimizer: torch.optim.Optimizer,
    spec: TaskSpec,
    batch: int,
    generator: torch.Generator,
    tau: float,
    regularizer: str,
    device: torch.device,
) -> float:
    """One optimisation step, the straightforward way; returns the loss."""
    X, C0 = sample_tasks_loop(spec, batch, generator)
    X, C0 = X.to(device), C0.to(device)
    loss = smoothed_objective_plain(X, model(X, C0), tau, regularizer).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
