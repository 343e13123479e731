"""Batched Lloyd's algorithm (models/lloyd.py) against scikit-learn and a NumPy loop."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from models.lloyd import assign, lloyd, lloyd_step
from tasks.sampler import TaskSpec, sample_tasks

TOL = 1e-10  # float64


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny problems: OpenMP start-up in scikit-learn costs more than the work (10-20x on a
    busy machine). Restored after each test."""
    with threadpool_limits(1):
        yield


def sklearn_step(x: np.ndarray, c0: np.ndarray) -> np.ndarray:
    km = KMeans(n_clusters=len(c0), init=c0, n_init=1, max_iter=1, tol=0.0, algorithm="lloyd")
    with warnings.catch_warnings():
        # About the labels of the *returned* centers (iteration 2), not this step.
        warnings.filterwarnings("ignore", "Number of distinct clusters", ConvergenceWarning)
        return km.fit(x).cluster_centers_


@pytest.mark.parametrize(("k", "d"), [(2, 1), (3, 2), (6, 4), (10, 32), (25, 7)])
def test_batched_step_equals_scikit_learn_task_by_task(k: int, d: int) -> None:
    X, C0 = sample_tasks(TaskSpec(n=max(64, 4 * k), d=d, k=k), 5, torch.Generator().manual_seed(k + d))
    X, C0 = X.double(), C0.double()  # C0 are data points: no cluster is empty after one step
    C1 = lloyd_step(X, C0)
    assert C1.shape == C0.shape and C1.dtype == torch.float64
    for b in range(5):
        np.testing.assert_allclose(C1[b].numpy(), sklearn_step(X[b].numpy(), C0[b].numpy()), rtol=0, atol=TOL)


def test_assign_and_several_steps_equal_a_numpy_loop() -> None:
    g = torch.Generator().manual_seed(3)
    X, C = (
        torch.rand(4, 50, 3, generator=g, dtype=torch.float64),
        torch.rand(4, 5, 3, generator=g, dtype=torch.float64),
    )
    for b in range(4):
        x, c = X[b].numpy(), C[b].numpy()
        labels = np.array([np.argmin([((xi - cj) ** 2).sum() for cj in c]) for xi in x])
        assert np.array_equal(assign(X, C)[b].numpy(), labels)
        for _ in range(4):
            labels = np.array([np.argmin([((xi - cj) ** 2).sum() for cj in c]) for xi in x])
            c = np.array([x[labels == j].mean(0) if (labels == j).any() else c[j] for j in range(len(c))])
        np.testing.assert_allclose(lloyd(X, C, 4)[b].numpy(), c, rtol=0, atol=TOL)


def test_empty_cluster_keeps_its_previous_center_per_task() -> None:
    # Task 0: center 2 is far from every point (empty). Task 1: nothing empty.
    X = torch.tensor([[[0.0, 0.0], [0.2, 0.0], [1.0, 1.0], [1.0, 1.2]]] * 2, dtype=torch.float64)
    C = torch.tensor(
        [[[0.0, 0.1], [1.0, 0.9], [5.0, 5.0]], [[0.0, 0.1], [1.0, 0.9], [0.2, 0.05]]], dtype=torch.float64
    )
    C1 = lloyd_step(X, C)
    expected = torch.tensor(
        [[[0.1, 0.0], [1.0, 1.1], [5.0, 5.0]], [[0.0, 0.0], [1.0, 1.1], [0.2, 0.0]]], dtype=torch.float64
    )
    torch.testing.assert_close(C1, expected, rtol=0, atol=TOL)


def test_lloyd_never_increases_the_objective() -> None:
    X, C = sample_tasks(TaskSpec(n=200, d=2, k=8), 6, torch.Generator().manual_seed(9))
    X, C = X.double(), C.double()
    objective = lambda C: torch.cdist(X, C).pow(2).amin(-1).sum(-1)  # noqa: E731
    previous = objective(C)
    for _ in range(6):
        C = lloyd_step(X, C)
        assert torch.all(objective(C) <= previous + 1e-12)
        previous = objective(C)


def test_float32_step_at_the_papers_size_equals_a_numpy_loop_in_float64() -> None:
    """Training's own precision (the validation baseline): the one-hot product sums n = 512 points of
    d = 32 in float32, within 1e-6 of NumPy's float64 means of the same assignment (float32 rounding of
    sums of at most 512 values in [0, 1])."""
    X, C0 = sample_tasks(TaskSpec(n=512, d=32, k=25), 3, torch.Generator().manual_seed(5))
    C1 = lloyd_step(X, C0)
    labels = assign(X, C0).numpy()
    for b in range(3):
        x, c = X[b].numpy().astype(np.float64), C0[b].numpy().astype(np.float64)
        expected = np.array(
            [x[labels[b] == j].mean(0) if (labels[b] == j).any() else c[j] for j in range(25)]
        )
        np.testing.assert_allclose(C1[b].numpy(), expected, rtol=0, atol=1e-6)
