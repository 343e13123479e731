"""k-means objective and its smoothed upper bounds (docs/science.md section 4)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from models.losses import REGULARIZERS, kmeans_objective, smoothed_objective, sparsemax


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def brute_force_simplex_projection(z: np.ndarray) -> np.ndarray:
    """argmin_{w in simplex} ||w - z||^2 by enumerating supports.

    On a support S the KKT conditions give w_S = z_S - t with t = (sum z_S - 1) / |S|;
    among the feasible candidates (w_S >= 0) the projection is the closest to z.
    """
    best, best_dist = None, math.inf
    for size in range(1, len(z) + 1):
        for support in itertools.combinations(range(len(z)), size):
            s = list(support)
            w = np.zeros_like(z)
            w[s] = z[s] - (z[s].sum() - 1) / size
            if np.all(w[s] >= 0):
                dist = ((w - z) ** 2).sum()
                if dist < best_dist:
                    best, best_dist = w, dist
    return best


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_sparsemax_is_the_euclidean_projection_onto_the_simplex(k: int) -> None:
    scales = torch.tensor([0.1, 1.0, 5.0], dtype=torch.float64)[
        torch.arange(200) % 3, None
    ]  # few and many in the support
    z = torch.randn(200, k, generator=gen(k), dtype=torch.float64) * scales
    w = sparsemax(z)
    for zi, wi in zip(z.numpy(), w.numpy()):
        np.testing.assert_allclose(wi, brute_force_simplex_projection(zi), rtol=0, atol=1e-12)
    assert torch.all(w >= 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(200, dtype=torch.float64), rtol=0, atol=1e-12)


def test_sparsemax_works_along_any_dimension_and_handles_ties() -> None:
    z = torch.randn(3, 5, 4, generator=gen(0), dtype=torch.float64)
    torch.testing.assert_close(sparsemax(z, dim=1), sparsemax(z.transpose(1, -1)).transpose(1, -1))
    # Equal entries share the mass equally.
    torch.testing.assert_close(sparsemax(torch.tensor([[2.0, 2.0, -5.0]])), torch.tensor([[0.5, 0.5, 0.0]]))


def tasks(
    B: int = 4, n: int = 30, d: int = 3, k: int = 5, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    return torch.rand(B, n, d, generator=g, dtype=torch.float64), torch.rand(
        B, k, d, generator=g, dtype=torch.float64
    )


def test_sparsemax_of_a_non_finite_row_is_nan_and_other_rows_are_untouched() -> None:
    """Overflowed centers (r = inf, so z = -inf) or NaN give NaN weights, not an indexing error; the loss
    then turns non-finite and training records a divergence (a lr 1.0 run of sweep=lite crashed here)."""
    z = torch.tensor([[0.3, -0.2, 0.1], [-math.inf, -math.inf, -math.inf], [0.5, math.nan, 0.0]])
    w = sparsemax(z)
    assert torch.isnan(w[1]).all() and torch.isnan(w[2]).any()
    torch.testing.assert_close(w[0], sparsemax(z[:1])[0])
    np.testing.assert_allclose(w[0].numpy(), brute_force_simplex_projection(z[0].double().numpy()), atol=1e-6)
    X = torch.rand(2, 8, 3, generator=gen(0))
    C = torch.full((2, 4, 3), 1e30)  # squared distances overflow float32 to inf
    assert not torch.isfinite(smoothed_objective(X, C, 0.1, "l2")).any()


def test_kmeans_objective_equals_numpy() -> None:
    X, C = tasks(B=3, n=40, d=5, k=7)
    for b in range(3):
        x, c = X[b].numpy(), C[b].numpy()
        expected = sum(min(((xi - cj) ** 2).sum() for cj in c) for xi in x)
        assert kmeans_objective(X, C)[b].item() == pytest.approx(expected, rel=1e-12)
    # float32 (the training dtype) stays close to the float64 value.
    torch.testing.assert_close(
        kmeans_objective(X.float(), C.float()).double(), kmeans_objective(X, C), rtol=1e-5, atol=0
    )


def test_surrogates_in_numpy() -> None:
    X, C = tasks(B=2, n=20, d=2, k=4)
    tau = 0.05
    for b in range(2):
        r = ((X[b].numpy()[:, None] - C[b].numpy()[None]) ** 2).sum(-1)
        soft = np.exp(-r / tau - (-r / tau).max(1, keepdims=True))
        soft /= soft.sum(1, keepdims=True)
        sparse = np.array([brute_force_simplex_projection(-ri / tau) for ri in r])
        assert smoothed_objective(X, C, tau, "ne")[b].item() == pytest.approx((soft * r).sum(), rel=1e-10)
        assert smoothed_objective(X, C, tau, "l2")[b].item() == pytest.approx((sparse * r).sum(), rel=1e-10)


@pytest.mark.parametrize("tau", [10.0, 1.0, 0.25, 0.1, 0.01])
def test_surrogates_bound_the_objective_and_l2_is_tighter(tau: float) -> None:
    X, C = tasks(B=8, n=50, d=4, k=6, seed=1)
    objective = kmeans_objective(X, C)
    ne, l2 = smoothed_objective(X, C, tau, "ne"), smoothed_objective(X, C, tau, "l2")
    eps = 1e-12 * objective  # rounding only
    assert torch.all(ne >= objective - eps) and torch.all(l2 >= objective - eps)
    assert torch.all(l2 <= ne + eps)


def test_both_surrogates_tend_to_the_objective_as_tau_shrinks() -> None:
    X, C = tasks(B=4, n=50, d=3, k=6, seed=2)
    n, k = 50, 6
    objective = kmeans_objective(X, C)
    gaps = {reg: [] for reg in REGULARIZERS}
    for tau in (1.0, 0.1, 0.01, 1e-3, 1e-5):
        for reg in REGULARIZERS:
            gap = smoothed_objective(X, C, tau, reg) - objective
            # From <w*, r> + tau * Omega(w*) <= min r + tau * Omega(one-hot):
            # ne: Omega in [-log k, 0] -> gap <= n tau log k;
            # l2: Omega in [1/(2k), 1/2] -> gap <= n tau (1/2 - 1/(2k)).
            bound = n * tau * (math.log(k) if reg == "ne" else 0.5 - 0.5 / k)
            assert torch.all(gap <= bound + 1e-12)
            gaps[reg].append(gap)
    for reg in REGULARIZERS:
        assert torch.all(gaps[reg][-1] <= 1e-9 * objective)
        assert all(torch.all(b <= a + 1e-12) for a, b in zip(gaps[reg], gaps[reg][1:]))  # monotone in tau


def test_l2_equals_the_objective_when_the_two_nearest_centers_are_far_apart() -> None:
    # Points sit within 0.05 of one of three centers that are >= 1 apart, so for every point
    # the second-nearest squared distance exceeds the nearest by more than tau = 0.5:
    # sparsemax(-r / tau) is one-hot. Softmax never is.
    g = gen(4)
    C = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    labels = torch.randint(3, (1, 60), generator=g)
    X = C[0, labels] + 0.05 * (2 * torch.rand(1, 60, 2, generator=g, dtype=torch.float64) - 1)
    r = torch.cdist(X, C).pow(2).sort(-1).values
    assert torch.all(r[..., 1] - r[..., 0] > 0.5)
    objective = kmeans_objective(X, C)
    torch.testing.assert_close(smoothed_objective(X, C, 0.5, "l2"), objective, rtol=1e-12, atol=0)
    assert torch.all(smoothed_objective(X, C, 0.5, "ne") > objective * (1 + 1e-6))


@pytest.mark.parametrize("regularizer", REGULARIZERS)
def test_gradcheck_float64(regularizer: str) -> None:
    X, C = tasks(B=2, n=7, d=2, k=3, seed=5)
    X.requires_grad_(True)
    C.requires_grad_(True)
    # tau large enough that several centers share each point's weight (the smooth regime).
    assert torch.autograd.gradcheck(lambda X, C: smoothed_objective(X, C, 0.3, regularizer), (X, C))


def test_gradcheck_sparsemax() -> None:
    z = torch.randn(5, 4, generator=gen(6), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sparsemax, (z,))


@pytest.mark.parametrize(
    ("tau", "regularizer", "field"),
    [
        (0.0, "l2", "loss.tau=0.0"),
        (-1.0, "ne", "loss.tau=-1.0"),
        (math.nan, "l2", "loss.tau=nan"),
        (1.0, "l1", "loss.regularizer='l1'"),
    ],
)
def test_bad_loss_arguments_name_field_value_and_allowed(tau: float, regularizer: str, field: str) -> None:
    X, C = tasks(B=1, n=4, d=2, k=2)
    with pytest.raises(ValueError, match=field) as err:
        smoothed_objective(X, C, tau, regularizer)
    assert "l2, ne" in str(err.value) or "> 0" in str(err.value)
