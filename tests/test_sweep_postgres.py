"""MLflow on a real PostgreSQL, the compose stack's backend (docker/mlflow/compose.yaml): a concurrent sweep
on a running Ray cluster (the session's) through the tracking server on it (every point once, equal to local
training), and analysis.report reading that store through the server and straight from its postgresql://
URI."""

from __future__ import annotations

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from support.histories import check_histories
from support.once import assert_every_job_once_every_point_once
from support.sweeps import most_at_once, sweep_jobs

from analysis import report
from sweeper.sweep import main
from tracking.names import FINISHED, OUTCOME

pytestmark = pytest.mark.slow

EXPERIMENT = "postgres-sweep"
# 3 configurations of the `tau` sub-grid (so the report's convergence figure draws them) x 3 seeds = 9 trials,
# half a CPU each: 4 run at once, on 2 CPUs' worth of the session's Ray cluster (a quarter would start twice
# the worker processes).
SWEEP = [
    "sweep=smoke",
    "sweep.seeds=[1, 2, 3]",
    "sweep.subgrids=[{name: tau, embedding: [onehot, binary, none]}]",
    "train.steps=60",
]


def test_sweep_through_a_server_on_postgres_then_report_both_ways(
    pg_server, postgres, ray_cluster, tmp_path, capfd
):
    overrides = [
        *SWEEP,
        "cluster.cpus_per_trial=0.5",
        "cluster.max_concurrent=4",
        ray_cluster,
        f"tracking.uri={pg_server.uri}",
        f"tracking.experiment={EXPERIMENT}",
        f"cluster.storage={tmp_path}/ray",
    ]
    assert main(overrides) == 0
    trials = sweep_jobs(SWEEP)
    stored = assert_every_job_once_every_point_once(pg_server.uri, EXPERIMENT, trials)
    runs = list(stored.runs.values())
    assert all((r.data.tags[OUTCOME], r.info.status) == (FINISHED, "FINISHED") for r in runs)
    client = MlflowClient(tracking_uri=pg_server.uri)
    at_once = most_at_once(runs)
    print(
        f"postgres: trials {len(trials)}, runs {len(runs)}, points {stored.points}, duplicates 0, lost 0; "
        f"most trials training at once: {at_once} (4 slots)"
    )
    assert at_once >= 2, "the concurrent sweep ran its trials one at a time"
    check_histories(client, stored.runs, trials, ["train.steps=60"])

    tables = {}
    for name, uri in (("server", pg_server.uri), ("direct", postgres)):
        capfd.readouterr()
        assert (
            report.main(
                [
                    f"tracking.uri='{uri}'",
                    f"tracking.experiment={EXPERIMENT}",
                    "select.sweep=smoke",
                    f"out={tmp_path}/{name}",
                    "figures=[convergence]",
                    f"speed_json={tmp_path}/none.json",
                    "eval.device=cpu",
                ]
            )
            == 0
        )
        index = tmp_path / name / EXPERIMENT / "index.md"
        assert capfd.readouterr().out.strip().endswith(str(index.resolve()))
        assert "Runs used: 9" in index.read_text()
        tables[name] = pd.read_csv(index.parent / "convergence.csv")
    pd.testing.assert_frame_equal(tables["server"], tables["direct"])  # one store, read two ways
