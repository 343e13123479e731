"""A sweep's stored metric points against the points its configuration logs and against local training."""

from __future__ import annotations

import json
import tempfile

import pytest
from mlflow.tracking import MlflowClient

from config import grid
from config.compose import compose
from tracking.names import METRICS, TRAIN_LOSS
from tracking.recorder import MemoryRecorder
from training.loop import train


def histories(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in METRICS}


def expected_counts(cfg) -> dict[str, int]:
    """Points a run of cfg logs: train_loss every log_every steps; the rest at step 0, every eval_every, the
    end."""
    t = cfg.train
    evals = len({0, t.steps} | set(range(t.eval_every, t.steps + 1, t.eval_every)))
    return {key: (t.steps // t.log_every if key == TRAIN_LOSS else evals) for key in METRICS}


_TRAINED: dict[str, dict[str, list[tuple[int, float]]]] = {}  # overrides (JSON) -> histories, this session


def local_histories(runs: list[list[str]]) -> list[dict[str, list[tuple[int, float]]]]:
    """Each configuration trained here, on the one thread tests/conftest.py gives torch, as a trial with
    cluster.cpus_per_trial <= 1 runs (torch's CPU results depend on the thread count).

    Training is deterministic, so a configuration another test of the session trained is not trained
    again (the smoke grid's models, checked in a SQLite file by tests/test_sweep.py and through a server on
    PostgreSQL by tests/test_sweep_postgres.py)."""
    for overrides in runs:
        key = json.dumps(overrides)
        if key not in _TRAINED:
            recorder = MemoryRecorder()
            with tempfile.TemporaryDirectory() as root:
                train(compose(overrides), recorder, root)
            _TRAINED[key] = {name: sorted(points) for name, points in recorder.metrics.items()}
    return [_TRAINED[json.dumps(r)] for r in runs]


def check_histories(
    client: MlflowClient, by_key: dict, jobs: list[grid.Job], base: list[str], packed: bool = False
) -> None:
    """Every metric point once (counted from the config) and equal to a local run of the same config and seed:
    exactly, or to 1e-5 for models trained in a pack (batched matmuls sum in another order)."""
    runs = [[*base, *t.configuration.override_strings(), f"seed={t.seed}"] for t in jobs]
    for t, overrides, want in zip(jobs, runs, local_histories(runs)):
        got = histories(client, by_key[t.key].info.run_id)
        assert {k: len(v) for k, v in got.items()} == expected_counts(compose(overrides)), t.name  # none lost
        if not packed:
            assert got == want, t.name  # none duplicated, the same numbers
            continue
        for key in METRICS:
            assert [s for s, _ in got[key]] == [s for s, _ in want[key]], (t.name, key)
            assert [v for _, v in got[key]] == pytest.approx([v for _, v in want[key]], rel=1e-5, abs=1e-6), (
                key
            )
