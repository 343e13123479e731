"""Token embeddings (docs/science.md section 2) and distance attention (docs/science.md section 3)."""

from __future__ import annotations

import math

import pytest
import torch

from models.attention import DistanceAttention, distance_attention
from models.embedding import EMBEDDINGS, center_codes, embed, embedding_dim
from models.transformer import ClusteringLayer


def bits_oracle(j: int, m: int) -> list[float]:
    """0/1 digits of j, least significant first, from Python's own formatting."""
    return [float(c) for c in reversed(format(j, f"0{m}b"))]


@pytest.mark.parametrize("k", [2, 3, 4, 5, 16, 25, 100])
def test_embedding_widths_and_tokens(k: int) -> None:
    d, B, n = 3, 2, 7
    m = (k - 1).bit_length()  # ceil(log2 k) for k >= 2, by integer arithmetic
    assert embedding_dim(d, k, "onehot") == d + k
    assert embedding_dim(d, k, "binary") == d + m
    assert embedding_dim(d, k, "none") == d
    X, C = torch.rand(B, n, d), torch.rand(B, k, d)
    expected_codes = {
        "onehot": torch.eye(k),
        "binary": torch.tensor([bits_oracle(j, m) for j in range(k)]),
        "none": torch.zeros(k, 0),
    }
    for embedding in EMBEDDINGS:
        Xt, Ct = embed(X, C, embedding)
        d_emb = embedding_dim(d, k, embedding)
        assert Xt.shape == (B, n, d_emb) and Ct.shape == (B, k, d_emb)
        assert torch.equal(Xt[..., :d], X) and torch.equal(Ct[..., :d], C)
        assert torch.all(Xt[..., d:] == 0)
        for b in range(B):
            assert torch.equal(Ct[b, :, d:], expected_codes[embedding])
    # Binary codes are distinct, so centers stay distinguishable.
    assert len({tuple(r.tolist()) for r in center_codes(k, "binary")}) == k


def test_embedding_follows_dtype_and_rejects_unknown_names() -> None:
    Xt, Ct = embed(
        torch.rand(1, 4, 2, dtype=torch.float64), torch.rand(1, 3, 2, dtype=torch.float64), "binary"
    )
    assert Xt.dtype == Ct.dtype == torch.float64
    with pytest.raises(
        ValueError, match=r"model.embedding='ternary' is not allowed: choose one of onehot, binary, none"
    ):
        embedding_dim(2, 3, "ternary")


@pytest.mark.parametrize("embedding", ["onehot", "binary"])
def test_re_embedding_resets_the_scratch_dimensions(embedding: str) -> None:
    torch.manual_seed(0)
    d, k = 3, 5
    X, C = torch.rand(2, 20, d), torch.rand(2, k, d)
    layer = ClusteringLayer(embedding_dim(d, k, embedding))
    with torch.no_grad():
        X1, C1 = layer(*embed(X, C, embedding))
    # After a layer the scratch holds arbitrary values ...
    assert not torch.all(X1[..., d:] == 0)
    assert not torch.equal(C1[..., d:], embed(X, C, embedding)[1][..., d:])
    # ... and re-embedding the current points and centers resets it.
    X2, C2 = embed(X1[..., :d], C1[..., :d], embedding)
    assert torch.equal(X2[..., :d], X1[..., :d]) and torch.equal(C2[..., :d], C1[..., :d])
    assert torch.all(X2[..., d:] == 0)
    assert torch.equal(C2[0, :, d:], center_codes(k, embedding))


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: float, d_emb: int
) -> torch.Tensor:
    """The formula of docs/science.md written out: softmax(-gamma * ||q_i - k_j||^2 / sqrt(d_emb)) V."""
    sq = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1)
    return torch.softmax(-gamma * sq / math.sqrt(d_emb), dim=-1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gamma", [0.1, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("width", [6, 15, 16, 42])  # padded (models.attention.PAD_TO) by 9, 0, 15 and 5
def test_sdpa_distance_attention_equals_the_formula_in_values_and_gradients(
    dtype: torch.dtype, gamma: float, width: int
) -> None:
    g = torch.Generator().manual_seed(7)
    d_emb = width
    q, k, v = (torch.rand(3, n, width, generator=g, dtype=dtype) for n in (9, 11, 11))
    w = torch.randn(3, 9, width, generator=g, dtype=dtype)  # a random linear read-out for the gradients
    outs, grads = [], []
    for fn in (distance_attention, reference_attention):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves, gamma, d_emb)
        (out * w).sum().backward()
        outs.append(out.detach())
        grads.append([t.grad for t in leaves])
    # The fused path rounds each augmented logit scale * (q.k - ||k||^2 / 2), whose size is up to `logits`,
    # to the dtype's precision: outputs and gradients inherit an error of about eps x logits (measured against
    # float64: 0.4-1.2 eps x logits where logits > 1, ~1e-7 where the rounding of the outputs themselves
    # dominates). A fixed 1e-5 held on one CPU and failed on another (AVX-512 FP16: 1.25e-5 at width 42,
    # gamma 10, where eps x logits is 1.0e-5). A gamma off by 0.1% still misses this bound by 3x or more.
    logits = 2 * gamma / math.sqrt(d_emb) * (q.pow(2).sum(-1).max() + k.pow(2).sum(-1).max() / 2).item()
    atol = 1e-6 + 8 * torch.finfo(dtype).eps * logits
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=atol)
    for mine, ref in zip(grads[0], grads[1]):
        torch.testing.assert_close(mine, ref, rtol=0, atol=atol)


def test_hardmax_attention_averages_all_nearest_keys() -> None:
    q = torch.tensor([[[0.0, 0.0], [1.0, 1.0]]], dtype=torch.float64)
    k = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [0.0, 3.0], [1.0, 1.0]]], dtype=torch.float64)
    v = torch.tensor([[[1.0], [3.0], [10.0], [100.0]]], dtype=torch.float64)
    out = distance_attention(q, k, v, math.inf, 2)
    # Query 0 ties between keys 0 and 1 (distance 1): mean of 1 and 3. Query 1 matches key 3.
    torch.testing.assert_close(out, torch.tensor([[[2.0], [100.0]]], dtype=torch.float64), rtol=0, atol=0)
    # Large finite gamma approaches the same limit.
    torch.testing.assert_close(distance_attention(q, k, v, 1e4, 2), out, rtol=0, atol=1e-6)


def test_attention_dropout_only_in_training() -> None:
    torch.manual_seed(1)
    att = DistanceAttention(4, gamma=1.0, dropout=0.5)
    q, k = torch.rand(2, 8, 4), torch.rand(2, 16, 4)
    att.eval()
    assert torch.equal(att(q, k), att(q, k))
    reference = reference_attention(att.q(q), att.k(k), att.v(k), 1.0, 4)
    torch.testing.assert_close(att(q, k), reference, rtol=0, atol=1e-5)
    att.train()
    assert not torch.equal(att(q, k), att(q, k))
