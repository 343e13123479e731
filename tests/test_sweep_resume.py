"""A trial that crashed between reports resumes from the last evaluation it reported, not from what its work
folder holds: every point stored once. (A driver stopped by a signal or killed: tests/test_sweep_stops.py.)"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from support import ray_local
from support.configs import ONE_TRIAL
from support.histories import check_histories
from support.sweeps import children, recorded_checkpoint, sweep_jobs

from sweeper.sweep import main as sweep_main
from tracking import store
from tracking.names import FINISHED, OUTCOME, VAL_REL_LLOYD
from training.checkpoint import last_path, load
from training.faults import CRASH_AT_STEP

pytestmark = pytest.mark.slow

# One trial of the smoke grid: 20 steps, evaluations at 0, 5, 10, 15 and 20, of which cluster.report_every=3
# sends the ones at 0 and 15 (and the end). It crashes before step 13, with no retry: what it evaluated at 5
# and 10 (and checkpointed in its work folder) never reached the driver.
REPORT_EVERY_THIRD = [*ONE_TRIAL, "cluster.report_every=3"]


def test_a_trial_reporting_every_third_evaluation_resumes_from_its_last_report(tmp_path, sqlite_uri):
    uri = sqlite_uri
    overrides = [*REPORT_EVERY_THIRD, f"tracking.uri={uri}", f"cluster.storage={tmp_path}/ray"]
    (trial,) = sweep_jobs(REPORT_EVERY_THIRD)
    with ray_local.own(num_cpus=1, env={CRASH_AT_STEP: f"13@{trial.key}"}):
        assert sweep_main([*overrides, "cluster.max_failures=0"]) == 1
    client = MlflowClient(tracking_uri=uri)
    (run,) = children(uri, "smoke")
    assert OUTCOME not in run.data.tags
    assert store.last_steps(client, run)[VAL_REL_LLOYD] == 0  # the rounds at 5 and 10 were not sent
    assert load(last_path(recorded_checkpoint(uri, run) / trial.key))["step"] == 0

    ray_local.shared()  # no fault this time: the same run continues from step 0, every point stored once
    assert sweep_main(overrides) == 0
    (again,) = children(uri, "smoke")
    assert again.info.run_id == run.info.run_id and again.data.tags[OUTCOME] == FINISHED
    check_histories(client, {trial.key: again}, [trial], [])
