"""Distance attention: softmax(-gamma * ||q_i - k_j||^2 / sqrt(d_emb)) V.

Since -||q - k||^2 = 2 q.k - ||k||^2 - ||q||^2 and the ||q||^2 term is the
same for every key of a query, the softmax equals ordinary dot-product
attention on augmented vectors q' = [q, 1], k' = [k, -||k||^2 / 2] with
scale 2 * gamma / sqrt(d_emb). That lets fused kernels
(`scaled_dot_product_attention`) do the work. gamma = inf is hard-max
attention, which averages the values of all maximisers (exact Lloyd).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models import flash_dropout  # flash_dropout.flash_dropout_usable: the version train.compile marks
from models.flash_dropout import flash_dropout_attention

PAD_TO = 16  # fp32 lanes of an AVX-512 register


def distance_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: float, d_emb: int, dropout: float = 0.0
) -> torch.Tensor:
    """Softmax distance attention through a fused dot-product kernel."""
    if math.isinf(gamma):
        return hardmax_attention(q, k, v)
    # Zero columns add exact zeros to every dot product. Fused kernels (CPU flash; CUDA flash and
    # memory-efficient) need values as wide as queries (else SDPA silently takes its slow math path), and the
    # CPU flash kernel runs faster at widths that fill whole vector registers (torch 2.13, AVX-512; at the
    # laptop size far more than at the paper's; `python -m bench step` times the step it is part of): so q, k
    # and v are padded to a multiple of PAD_TO, the output cut back to v's width.
    pad = -(q.shape[-1] + 1) % PAD_TO
    q_aug = torch.cat([q, torch.ones_like(q[..., :1]), q.new_zeros(*q.shape[:-1], pad)], -1)
    k_aug = torch.cat([k, -0.5 * k.pow(2).sum(-1, keepdim=True), k.new_zeros(*k.shape[:-1], pad)], -1)
    width = v.shape[-1]
    v_pad = F.pad(v, (0, max(0, q_aug.shape[-1] - width)))
    scale = 2.0 * gamma / math.sqrt(d_emb)
    # CPU flash has no dropout of its own: the fused path adds it, where its private ops pass a self-check;
    # else SDPA's dropout_p, on CPU its unfused math path (same distribution, slower).
    if dropout > 0 and q.device.type == "cpu" and flash_dropout.flash_dropout_usable():
        return flash_dropout_attention(q_aug, k_aug, v_pad, scale, dropout)[..., :width]
    heads = (q_aug.unsqueeze(-3), k_aug.unsqueeze(-3), v_pad.unsqueeze(-3))  # SDPA wants a head axis
    return F.scaled_dot_product_attention(*heads, dropout_p=dropout, scale=scale).squeeze(-3)[..., :width]


def hardmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """gamma = inf: each query averages the values of all its nearest keys.

    Distances are computed from differences, not the dot-product expansion,
    so that ties (equal codes, a token and itself) are exact.
    """
    dist = torch.cdist(q, k, compute_mode="donot_use_mm_for_euclid_dist")
    winners = (dist == dist.amin(-1, keepdim=True)).to(v.dtype)
    return (winners / winners.sum(-1, keepdim=True)) @ v


class DistanceAttention(nn.Module):
    """One attention module: q, k, v projections (with biases) and distance attention.

    `qkv_mult` widens the query/key/value width to qkv_mult * d_emb; an output
    projection then maps values back to d_emb (only when widened, so the
    exact construction keeps exactly three d_emb x d_emb maps).
    """

    def __init__(self, d_emb: int, gamma: float = 1.0, dropout: float = 0.0, qkv_mult: int = 1) -> None:
        super().__init__()
        width = d_emb * qkv_mult
        self.d_emb, self.gamma, self.dropout = d_emb, gamma, dropout
        self.q = nn.Linear(d_emb, width)
        self.k = nn.Linear(d_emb, width)
        self.v = nn.Linear(d_emb, width)
        self.out = nn.Linear(width, d_emb) if qkv_mult > 1 else None

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        h = distance_attention(self.q(queries), self.k(keys), self.v(keys), self.gamma, self.d_emb, p)
        return self.out(h) if self.out is not None else h
