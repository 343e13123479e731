"""Ctrl-C through a pipe: `leaner-sweep ... 2>&1 | tee run.log`, then Ctrl-C, which the shell sends to both.

tee ends first, so the driver's output has no reader left while it stops. The stop must complete all the
same: the interrupted runs and the parent run KILLED, exit code 130, the resume hint on the parent run's
page (its description), and the same command goes on. A real pipe (its reader closed) and a real SIGINT.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from support.configs import FOUR_TRIALS, PACED
from support.repo import REPO, subprocess_env
from support.sweeps import children, interrupted_runs, kill_group, run_sweep, wait_for

from tracking.names import FINISHED, MLFLOW_RUN_NOTE, OUTCOME, SWEEP

pytestmark = pytest.mark.slow

SWEEP_ARGS = [*FOUR_TRIALS, "train.steps=120", "cluster.max_concurrent=2"]


def test_ctrl_c_after_the_output_pipe_closed_still_stops_cleanly_and_resumes(
    sqlite_uri, ray_cluster, tmp_path
):
    overrides = [*SWEEP_ARGS, ray_cluster, f"tracking.uri={sqlite_uri}", f"cluster.storage={tmp_path}/ray"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "sweeper.sweep", *overrides],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # 2>&1 | tee: both streams into the one pipe
        start_new_session=True,
        env={**subprocess_env(), **PACED},
    )
    try:
        wait_for(lambda: interrupted_runs(sqlite_uri), driver, 300, "a trial checkpointed")
        driver.stdout.close()  # tee ended: the driver's next write finds no reader
        driver.send_signal(signal.SIGINT)
        code = driver.wait(timeout=180)
    finally:
        kill_group(driver)
    assert code == 130  # not 141: the closed pipe did not cut the stop short

    left = interrupted_runs(sqlite_uri)
    assert left and all(r.info.status == "KILLED" for r in left.values())
    client = MlflowClient(tracking_uri=sqlite_uri)
    (parent,) = [
        r
        for r in client.search_runs([client.get_experiment_by_name("leaner-clustering").experiment_id])
        if r.data.tags.get(SWEEP) == "smoke" and "config_hash" not in r.data.tags
    ]
    assert parent.info.status == "KILLED"
    note = parent.data.tags[MLFLOW_RUN_NOTE]
    assert "stopped by SIGINT" in note and "Resume with the same command:\n  python -m sweeper.sweep" in note

    again = run_sweep(overrides, env=subprocess_env())
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    runs = children(sqlite_uri, "smoke")
    assert len(runs) == 4 and all(r.data.tags[OUTCOME] == FINISHED for r in runs)
    assert all(by.info.run_id in {r.info.run_id for r in runs} for by in left.values())  # continued
