"""The learned one-layer clustering transformer (docs/science.md section 3) and parameter counts."""

from __future__ import annotations

import math

import pytest
import torch

from models.embedding import EMBEDDINGS, embed, embedding_dim
from models.exact import ExactLloydTransformer
from models.transformer import ClusteringTransformer, count_parameters, parameter_count

MODULES = ("cax", "sax", "cac", "sac")


def data(B: int = 3, n: int = 17, d: int = 4, k: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, n, d, generator=g), torch.rand(B, k, d, generator=g)


def reference_layer(
    model: ClusteringTransformer, Xt: torch.Tensor, Ct: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The equations of docs/science.md, with each module's attention written out (no SDPA)."""

    def attend(name: str, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        m = getattr(model.layer, name)
        q, k, v = m.q(queries), m.k(keys), m.v(keys)
        sq = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1)
        h = torch.softmax(-m.gamma * sq / math.sqrt(model.d_emb), -1) @ v
        return m.out(h) if m.out is not None else h

    X1 = Xt + attend("cax", Xt, Ct) + attend("sax", Xt, Xt)
    C1 = Ct + attend("cac", Ct, X1) + attend("sac", Ct, Ct)
    return X1, C1


@pytest.mark.parametrize("embedding", EMBEDDINGS)
@pytest.mark.parametrize("qkv_mult", [1, 2])
def test_forward_is_the_spec_layer_and_outputs_the_first_d_coordinates(embedding: str, qkv_mult: int) -> None:
    torch.manual_seed(0)
    X, C = data()
    model = ClusteringTransformer(4, 6, embedding, gamma=0.7, dropout=0.1, qkv_mult=qkv_mult).eval()
    out = model(X, C)
    assert out.shape == C.shape
    Xt, Ct = embed(X, C, embedding)
    X1, C1 = model.layer(Xt, Ct)
    assert X1.shape == Xt.shape and C1.shape == Ct.shape
    assert torch.equal(out, C1[..., :4])
    _, C1_ref = reference_layer(model, Xt, Ct)
    torch.testing.assert_close(out, C1_ref[..., :4], rtol=0, atol=1e-5)


def test_qkv_mult_widens_queries_keys_and_values() -> None:
    d, k = 4, 6
    d_emb = embedding_dim(d, k, "binary")
    for mult in (1, 2, 3):
        model = ClusteringTransformer(d, k, "binary", qkv_mult=mult)
        for name in MODULES:
            m = getattr(model.layer, name)
            assert m.q.weight.shape == m.k.weight.shape == m.v.weight.shape == (mult * d_emb, d_emb)
            assert (m.out is None) == (mult == 1)
            if m.out is not None:
                assert m.out.weight.shape == (d_emb, mult * d_emb)


def test_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    X, C = data()
    model = ClusteringTransformer(4, 6, "onehot", dropout=0.3)
    model.eval()
    assert torch.equal(model(X, C), model(X, C))
    model.train()
    assert not torch.equal(model(X, C), model(X, C))
    # Without dropout, training mode is deterministic too.
    model = ClusteringTransformer(4, 6, "onehot", dropout=0.0).train()
    assert torch.equal(model(X, C), model(X, C))


@pytest.mark.parametrize("embedding", EMBEDDINGS)
def test_gradients_reach_all_four_modules(embedding: str) -> None:
    torch.manual_seed(0)
    X, C = data()
    model = ClusteringTransformer(4, 6, embedding, dropout=0.0)
    model(X, C).pow(2).sum().backward()
    for name in MODULES:
        for pname, p in getattr(model.layer, name).named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}.{pname} got no gradient"


def test_default_hyperparameters_are_the_papers() -> None:
    model = ClusteringTransformer(4, 6)
    assert model.embedding == "onehot"
    m = model.layer.cax
    assert m.gamma == 1.0 and m.dropout == 0.01 and m.out is None


@pytest.mark.parametrize("embedding", EMBEDDINGS)
@pytest.mark.parametrize(("d", "k"), [(1, 2), (4, 6), (32, 10), (16, 25), (7, 100)])
@pytest.mark.parametrize("qkv_mult", [1, 2])
def test_parameter_count_closed_form_matches_the_models(
    embedding: str, d: int, k: int, qkv_mult: int
) -> None:
    learned = count_parameters(ClusteringTransformer(d, k, embedding, qkv_mult=qkv_mult))
    assert parameter_count(d, k, embedding, qkv_mult) == learned
    if embedding != "none" and qkv_mult == 1:
        assert count_parameters(ExactLloydTransformer(d, k, embedding)) == learned


def test_parameter_growth_onehot_d_plus_k_squared_vs_binary_d_plus_log2k_squared() -> None:
    d = 4
    for k in (2, 3, 6, 10, 16, 25, 100, 1000):
        m = math.ceil(math.log2(k))
        # Four modules x three (d_emb x d_emb) maps with biases = 12 (d_emb^2 + d_emb).
        assert parameter_count(d, k, "onehot") == 12 * ((d + k) ** 2 + (d + k))
        assert parameter_count(d, k, "binary") == 12 * ((d + m) ** 2 + (d + m))
        assert parameter_count(d, k, "none") == 12 * (d * d + d)
    # Onehot grows quadratically in k, binary only in log k: the ratio grows without bound.
    ratios = [
        parameter_count(d, k, "onehot") / parameter_count(d, k, "binary") for k in (4, 16, 64, 256, 1024)
    ]
    assert all(b > 2 * a for a, b in zip(ratios, ratios[1:]))
    assert parameter_count(d, 1024, "onehot") / ((d + 1024) ** 2) == pytest.approx(12, rel=1e-2)
    assert parameter_count(d, 1024, "binary") / ((d + 10) ** 2) == pytest.approx(12, rel=0.1)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("gamma", 0.0, "> 0"),
        ("gamma", math.nan, "> 0"),
        ("dropout", 1.0, "in [0, 1)"),
        ("dropout", -0.1, "in [0, 1)"),
        ("qkv_mult", 0, "integer >= 1"),
        ("qkv_mult", 1.5, "integer >= 1"),
        ("embedding", "ternary", "onehot, binary, none"),
    ],
)
def test_bad_model_arguments_name_field_value_and_allowed(field: str, value: object, allowed: str) -> None:
    with pytest.raises(ValueError) as err:
        ClusteringTransformer(4, 6, **{field: value})
    assert f"model.{field}={value!r}" in str(err.value) and allowed in str(err.value)
