"""Token embeddings (docs/science.md section 2): points and centers plus scratch dimensions.

onehot: center j carries e_j (k scratch dims); binary: center j carries the
0/1 digits of j (ceil(log2 k) scratch dims); none: no scratch. Points carry
zeros in the scratch dimensions.
"""

from __future__ import annotations

import math

import torch

from models.options import EMBEDDINGS


def scratch_dims(k: int, embedding: str) -> int:
    """How many scratch dimensions an embedding appends for k centers."""
    if embedding == "onehot":
        return k
    if embedding == "binary":
        return max(1, math.ceil(math.log2(k)))
    if embedding == "none":
        return 0
    raise ValueError(f"model.embedding={embedding!r} is not allowed: choose one of {', '.join(EMBEDDINGS)}")


def embedding_dim(d: int, k: int, embedding: str) -> int:
    """d_emb: the token width."""
    return d + scratch_dims(k, embedding)


def center_codes(k: int, embedding: str, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The scratch part of each center token, (k, m)."""
    m = scratch_dims(k, embedding)
    if embedding == "onehot":
        return torch.eye(k, dtype=dtype, device=device)
    if embedding == "binary":
        j = torch.arange(k, device=device).unsqueeze(-1)
        bits = torch.arange(m, device=device)
        return ((j >> bits) & 1).to(dtype)  # least significant digit first
    return torch.zeros(k, m, dtype=dtype, device=device)


def embed(X: torch.Tensor, C: torch.Tensor, embedding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Point tokens [x, 0] (B, n, d_emb) and center tokens [c_j, code_j] (B, k, d_emb).

    Re-embedding is this same call on the current centers: it resets the
    scratch dimensions whatever a previous layer left in them.
    """
    B, n, _ = X.shape
    k = C.shape[1]
    codes = center_codes(k, embedding, X.dtype, X.device)
    point_scratch = X.new_zeros(B, n, codes.shape[1])
    return torch.cat([X, point_scratch], -1), torch.cat([C, codes.expand(B, -1, -1)], -1)
