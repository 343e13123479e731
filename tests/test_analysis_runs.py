"""Loading runs and histories at the paper's scale: 3,000 runs in a real SQLite MLflow store.

Logging 3,000 runs through MlflowClient takes minutes (several committed
transactions per run), so 30 runs are logged through MlflowClient.log_batch
and the rest are copies of them made with SQL in MLflow's own schema, each
with its own id, seed, config hash and metric values. The test first checks
that MlflowClient reads a copy exactly as it reads a logged run.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from analysis.runs import NoRuns, histories, load_runs
from tracking.names import CONFIG_HASH, FINISHED, OUTCOME, SEED, SUBGRIDS, SWEEP, TRAIN_LOSS, VAL_REL_LLOYD

pytestmark = pytest.mark.slow  # the 3,000-run store takes minutes to build; the last test needs a server

N_RUNS, N_LOGGED, N_POINTS = 3000, 30, 10
EMBEDDINGS, SUBGRID_TAGS = ("onehot", "binary", "none"), ("tau,lr", "dim", "clusters", "family")


def _template(client: MlflowClient, experiment: str, j: int) -> str:
    tags = {
        CONFIG_HASH: f"h{j}",
        SEED: str(j),
        OUTCOME: FINISHED,
        SWEEP: "paper",
        SUBGRIDS: SUBGRID_TAGS[j % 4],
    }
    run = client.create_run(experiment, tags=tags)
    params = {
        "task.d": str(4 * (1 + j % 2)),
        "model.embedding": EMBEDDINGS[j % 3],
        "loss.tau": "0.1",
        "seed": str(j),
        "tracking.uri": "sqlite:///x.db",
    }
    metrics = [
        Metric(key, float(j + step / 100 + (key == TRAIN_LOSS)), 1000 * step, step)
        for key in (TRAIN_LOSS, VAL_REL_LLOYD)
        for step in range(N_POINTS)
    ]
    client.log_batch(
        run.info.run_id,
        params=[Param(k, v) for k, v in params.items()],
        metrics=metrics,
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def _copy(db: sqlite3.Connection, source: str, i: int) -> None:
    """Run `source` again as run number i: new id, seed i, hash h<i>, metric values shifted by i."""
    new = uuid.uuid4().hex
    columns = [c[1] for c in db.execute("PRAGMA table_info(runs)")]
    fresh = {"run_uuid": new, "name": f"copy-{i}"}
    select = ",".join("?" if c in fresh else c for c in columns)
    db.execute(
        f"INSERT INTO runs ({','.join(columns)}) SELECT {select} FROM runs WHERE run_uuid = ?",
        [fresh[c] for c in columns if c in fresh] + [source],
    )
    replaced = {SEED: str(i), CONFIG_HASH: f"h{i}"}
    for table in ("params", "tags"):
        rows = db.execute(f"SELECT key, value FROM {table} WHERE run_uuid = ?", (source,)).fetchall()
        db.executemany(
            f"INSERT INTO {table} (key, value, run_uuid) VALUES (?, ?, ?)",
            [(k, replaced.get(k, v), new) for k, v in rows],
        )
    for table in ("metrics", "latest_metrics"):
        db.execute(
            f"INSERT INTO {table} (key, value, timestamp, step, is_nan, run_uuid) "
            f"SELECT key, value + ?, timestamp, step, is_nan, ? FROM {table} WHERE run_uuid = ?",
            (i, new, source),
        )


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> tuple[str, list[str]]:
    root: Path = tmp_path_factory.mktemp("big_store")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("paper", artifact_location=(root / "artifacts").as_uri())
    logged = [_template(client, experiment, j) for j in range(N_LOGGED)]
    with sqlite3.connect(root / "mlflow.db") as db:
        for i in range(N_LOGGED, N_RUNS):
            _copy(db, logged[i % N_LOGGED], i)
    return uri, logged


def _metric_shift(seed: int) -> float:
    """What _copy added to the template's values (0 for a logged run)."""
    return seed if seed >= N_LOGGED else 0


def test_three_thousand_runs_load_filter_and_histories(big_store) -> None:
    uri, logged = big_store
    client = MlflowClient(uri)
    copy = client.search_runs(
        [client.get_experiment_by_name("paper").experiment_id], f"tags.{SEED} = '{N_LOGGED + 7}'"
    )
    assert (
        len(copy) == 1 and copy[0].data.params["model.embedding"] == EMBEDDINGS[7 % 3]
    )  # a copy reads as a run

    runs = load_runs(uri, "paper")
    assert len(runs) == N_RUNS and runs["run_id"].is_unique
    assert sorted(runs[SEED]) == list(range(N_RUNS))
    assert runs["task.d"].dtype.kind == "i" and runs["loss.tau"].dtype.kind == "f"
    template = runs[SEED] % N_LOGGED
    assert (runs["model.embedding"] == [EMBEDDINGS[j % 3] for j in template]).all()

    onehot_d8 = load_runs(uri, "paper", where={"model.embedding": "onehot", "task.d": 8})
    assert len(onehot_d8) == sum(
        1 for s in range(N_RUNS) if (s % N_LOGGED) % 3 == 0 and (s % N_LOGGED) % 2 == 1
    )
    lr = load_runs(uri, "paper", subgrid="lr")
    assert len(lr) == sum(1 for s in range(N_RUNS) if (s % N_LOGGED) % 4 == 0)
    assert (
        len(load_runs(uri, "paper", sweep="paper")) == N_RUNS and load_runs(uri, "paper", sweep="demo").empty
    )

    points = histories(uri, runs, [VAL_REL_LLOYD, TRAIN_LOSS])
    assert len(points) == N_RUNS * N_POINTS * 2
    # Oracle: MlflowClient's own per-run history, for a sample of logged runs and copies.
    sample = runs.sample(25, random_state=0)
    for run in sample.itertuples():
        for key in (VAL_REL_LLOYD, TRAIN_LOSS):
            expected = sorted((m.step, m.value) for m in client.get_metric_history(run.run_id, key))
            got = points[(points["run_id"] == run.run_id) & (points["key"] == key)].sort_values("step")
            assert list(got["step"]) == [s for s, _ in expected]
            np.testing.assert_allclose(got["value"], [v for _, v in expected], rtol=1e-12)
            j = getattr(run, SEED) % N_LOGGED
            np.testing.assert_allclose(
                got["value"],
                j + np.arange(N_POINTS) / 100 + (key == TRAIN_LOSS) + _metric_shift(getattr(run, SEED)),
                rtol=1e-12,
            )


def test_missing_experiment_names_what_exists(big_store) -> None:
    uri, _ = big_store
    with pytest.raises(NoRuns, match="'nope' does not exist.*paper"):
        load_runs(uri, "nope")


def test_histories_over_a_tracking_server(mlflow_server: str) -> None:
    """Over HTTP the histories come from the server's bulk endpoint; MlflowClient per run is the oracle."""
    client = MlflowClient(mlflow_server)
    name = f"analysis-bulk-{uuid.uuid4().hex[:8]}"
    experiment = client.create_experiment(name)
    for j in range(4):
        _template(client, experiment, j)
    runs = load_runs(mlflow_server, name)
    points = histories(mlflow_server, runs, [VAL_REL_LLOYD, TRAIN_LOSS])
    assert len(points) == 4 * N_POINTS * 2
    for run_id in runs["run_id"]:
        for key in (VAL_REL_LLOYD, TRAIN_LOSS):
            expected = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            got = points[(points["run_id"] == run_id) & (points["key"] == key)].sort_values("step")
            assert list(zip(got["step"], got["value"])) == expected
