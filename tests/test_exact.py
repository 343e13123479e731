"""The exact Lloyd transformer (docs/science.md section 3) against a NumPy Lloyd loop and scikit-learn.

Primary oracle: a plain NumPy Lloyd loop. Second oracle: scikit-learn's
KMeans(algorithm="lloyd", init=C0, n_init=1, max_iter=t, tol=0). Both agree
with the transformer only while no cluster empties (scikit-learn then
relocates the empty center to a far point, Lloyd as defined here keeps it,
the transformer averages the points with the nearest codes: see
test_empty_cluster_*), so each task is compared for the iterations before
its first empty cluster, and the test requires enough such iterations.
Everything runs in float64; tolerance 1e-10 (the issue asks for <= 1e-5,
float64 arithmetic gives ~1e-15).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from models.embedding import center_codes, embed
from models.exact import ExactLloydTransformer
from models.lloyd import lloyd
from tasks.sampler import TaskSpec, sample_tasks

TOL = 1e-10
TASKS = 2


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny problems: thread start-up (OpenMP in torch and scikit-learn) costs more than
    the work, and on a busy machine it costs 10-20x more. Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(threads)


def task(k: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TASKS float64 tasks from the project's sampler (normal mixture, random init).

    n = max(40, 3k) keeps clusters from emptying on all but one of the tasks used below.
    """
    X, C0 = sample_tasks(
        TaskSpec(n=max(40, 3 * k), d=d, k=k), TASKS, torch.Generator().manual_seed(1000 * k + d)
    )
    return X.double(), C0.double()


def numpy_lloyd(x: np.ndarray, c: np.ndarray, steps: int) -> tuple[list[np.ndarray], int]:
    """Centers after each of `steps` iterations, and how many iterations ran before a cluster emptied."""
    history, clean = [], steps
    for t in range(steps):
        labels = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1).argmin(1)
        new = c.copy()
        for j in range(len(c)):
            members = x[labels == j]
            if len(members):
                new[j] = members.mean(axis=0)
            else:  # empty cluster: keep the previous center
                clean = min(clean, t)
        c = new
        history.append(c)
    return history, clean


def sklearn_lloyd(x: np.ndarray, c0: np.ndarray, steps: int) -> np.ndarray:
    km = KMeans(n_clusters=len(c0), init=c0, n_init=1, max_iter=steps, tol=0.0, algorithm="lloyd")
    with warnings.catch_warnings():
        # Raised when the final labels (from the returned centers) leave a cluster empty:
        # that concerns iteration t + 1, not the t iterations compared here.
        warnings.filterwarnings("ignore", "Number of distinct clusters", ConvergenceWarning)
        return km.fit(x).cluster_centers_


def layerwise(
    model: ExactLloydTransformer, X: torch.Tensor, C: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """Centers after each layer application (forward(steps=t) is the first t of these)."""
    Xt, Ct = embed(X, C, model.embedding)
    out = []
    for _ in range(steps):
        Xt, Ct = model.layer(Xt, Ct)
        out.append(Ct[..., : model.d])
    return out


@pytest.mark.parametrize("embedding", ["binary", "onehot"])
@pytest.mark.parametrize("d", [1, 2, 7, 32])
@pytest.mark.parametrize("k", [2, 3, 5, 16, 25, 100])
def test_t_layers_equal_t_lloyd_iterations(k: int, d: int, embedding: str) -> None:
    steps = 10
    X, C0 = task(k, d)
    model = ExactLloydTransformer(d, k, embedding).double()
    mine = layerwise(model, X, C0, steps)
    torch.testing.assert_close(model(X, C0, steps=steps), mine[-1], rtol=0, atol=0)
    torch.testing.assert_close(model(X, C0, steps=1), mine[0], rtol=0, atol=0)
    compared = 0
    for b in range(TASKS):
        x, c0 = X[b].numpy(), C0[b].numpy()
        history, clean = numpy_lloyd(x, c0, steps)
        for t in range(1, clean + 1):
            np.testing.assert_allclose(mine[t - 1][b].numpy(), history[t - 1], rtol=0, atol=TOL)
            if embedding == "binary":  # sklearn does not depend on the embedding: once is enough
                np.testing.assert_allclose(sklearn_lloyd(x, c0, t), history[t - 1], rtol=0, atol=TOL)
            compared += 1
    assert compared >= steps, f"only {compared} clean iterations: choose tasks where clusters do not empty"


@pytest.mark.parametrize(("k", "d"), [(25, 2), (100, 1)])
def test_lloyd_moves_over_the_compared_iterations(k: int, d: int) -> None:
    # Guard against a vacuous comparison: on these tasks Lloyd's centers keep changing
    # for many of the 10 iterations, so agreement at t = 10 is more than agreement at t = 1.
    X, C0 = task(k, d)
    for b in range(TASKS):
        history, clean = numpy_lloyd(X[b].numpy(), C0[b].numpy(), 10)
        assert clean == 10
        assert sum(not np.array_equal(u, v) for u, v in zip(history, history[1:])) >= 3


def empty_task() -> tuple[torch.Tensor, torch.Tensor]:
    """Two tight groups of points and k = 5 centers, three of them far from every point."""
    g = torch.Generator().manual_seed(0)
    X = torch.cat(
        [0.1 * torch.rand(1, 10, 2, generator=g), 1 + 0.1 * torch.rand(1, 10, 2, generator=g)], 1
    ).double()
    C = torch.tensor([[[0.0, 0.0], [7.0, 7.0], [1.0, 1.0], [-6.0, 9.0], [9.0, -5.0]]], dtype=torch.float64)
    return X, C


def test_empty_cluster_lloyd_keeps_the_previous_center() -> None:
    X, C = empty_task()
    C1 = lloyd(X, C, 1)
    torch.testing.assert_close(C1[0, [1, 3, 4]], C[0, [1, 3, 4]], rtol=0, atol=0)
    torch.testing.assert_close(C1[0, 0], X[0, :10].mean(0), rtol=0, atol=TOL)
    torch.testing.assert_close(C1[0, 2], X[0, 10:].mean(0), rtol=0, atol=TOL)


@pytest.mark.parametrize("embedding", ["binary", "onehot"])
def test_empty_cluster_exact_transformer_averages_the_points_with_the_nearest_codes(embedding: str) -> None:
    """As models/exact.py states: nonempty clusters follow Lloyd; an empty cluster's center
    becomes the mean of the points whose codes are nearest its own (onehot: every point)."""
    X, C = empty_task()
    out = ExactLloydTransformer(2, 5, embedding)(X, C, steps=1)[0]
    labels = torch.cdist(X, C)[0].argmin(-1)
    codes = center_codes(5, embedding, torch.float64)
    point_codes = codes[labels]  # (n, m)
    for j in range(5):
        if (labels == j).any():
            expected = X[0, labels == j].mean(0)
        else:
            hamming = (point_codes - codes[j]).abs().sum(-1)
            expected = X[0, hamming == hamming.min()].mean(0)
        torch.testing.assert_close(out[j], expected, rtol=0, atol=TOL)
    if embedding == "onehot":
        torch.testing.assert_close(out[[1, 3, 4]], X[0].mean(0).expand(3, 2), rtol=0, atol=TOL)
    # So the two differ exactly on the empty clusters.
    assert not torch.allclose(out[1], lloyd(X, C, 1)[0, 1])


def test_exact_transformer_rejects_the_none_embedding() -> None:
    with pytest.raises(ValueError, match="embedding='none' is not allowed"):
        ExactLloydTransformer(2, 3, "none")
