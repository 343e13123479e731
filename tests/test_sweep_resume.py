"""Exactly-once under a killed driver: SIGKILL the sweep's whole process group mid-sweep, start again.

Solo through the MLflow server on PostgreSQL (the compose stack's), packed on a SQLite file. The restart
also shows that the lock the killed driver left on the sweep (sweeper.lock) does not block it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support import ray_local
from support.configs import FOUR_TRIALS, ONE_TRIAL, PACKED
from support.histories import check_histories
from support.repo import REPO
from support.sweeps import children, interrupted_runs, kill_group, kill_when, start_sweep, sweep_jobs

from sweeper.sweep import main as sweep_main
from tracking import store
from tracking.names import CONFIG_HASH, FINISHED, OUTCOME, TUNE_CHECKPOINT, VAL_REL_LLOYD
from training.checkpoint import last_path, load
from training.faults import CRASH_AT_STEP

pytestmark = pytest.mark.slow

# 2 x 2 trials, two at a time: when the first pair finishes the next starts. 200 steps: a trial runs
# seconds, far longer than the moment between seeing it checkpointed in the store and the kill.
TRAIN = ["train.steps=200", "train.eval_every=10"]  # also the local runs check_histories compares with
SWEEP = [*FOUR_TRIALS, *TRAIN]


def mid_sweep(uri: str, experiment: str) -> bool:
    """A run of the sweep has its outcome and another's Tune checkpoint is recorded, outcome still to come."""
    return bool(interrupted_runs(uri, "smoke", experiment)) and any(
        OUTCOME in r.data.tags for r in children(uri, "smoke", experiment)
    )


@pytest.mark.parametrize(
    "pack, store", [([], "postgres"), (PACKED, "sqlite")], ids=["solo-postgres-server", "packed-sqlite"]
)
def test_sigkill_driver_then_restart_runs_every_trial_exactly_once(tmp_path, pack, store, request):
    if store == "postgres":  # its own experiment: the session's server holds other tests' sweeps
        uri, experiment = request.getfixturevalue("pg_server").uri, "sigkill"
    else:
        uri, experiment = request.getfixturevalue("sqlite_uri"), "leaner-clustering"
    overrides = [
        *SWEEP,
        *pack,
        f"tracking.uri={uri}",
        f"tracking.experiment={experiment}",
        f"cluster.storage={tmp_path}/ray",
        "cluster.cpus_per_trial=1",
    ]
    log = tmp_path / "sweep.log"
    first = start_sweep(overrides, log)
    try:
        # Mid-sweep, read from the store (the console is quiet): one trial ended (its runs carry an outcome)
        # and another's checkpoint is recorded in MLflow.
        kill_when(
            lambda: mid_sweep(uri, experiment), first, 600, "a trial completed and another checkpointed"
        )
    finally:
        kill_group(first)
    client = MlflowClient(tracking_uri=uri)
    before = {r.data.tags[CONFIG_HASH]: r for r in children(uri, "smoke", experiment)}
    interrupted = interrupted_runs(uri, "smoke", experiment)
    assert interrupted, "no trial was caught mid-run with a checkpoint"
    print(
        f"killed with {len(interrupted)} trial(s) mid-run and "
        f"{sum(r.data.tags.get(OUTCOME) == FINISHED for r in before.values())} finished"
    )

    second = subprocess.run(
        [sys.executable, "-m", "sweeper.sweep", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    finished_before = sum(r.data.tags.get(OUTCOME) == FINISHED for r in before.values())
    assert f"{finished_before} of 4 trials already in MLflow" in second.stdout
    for run in interrupted.values():  # resumed from the checkpoint its run recorded
        assert f"resuming from checkpoint {run.data.tags[TUNE_CHECKPOINT]}" in second.stdout + second.stderr

    runs = children(uri, "smoke", experiment)
    trials = sweep_jobs([*SWEEP, *pack])
    assert sorted(r.data.tags[CONFIG_HASH] for r in runs) == sorted(t.key for t in trials)  # one run each
    by_key = {r.data.tags[CONFIG_HASH]: r for r in runs}
    for key, run in interrupted.items():
        assert by_key[key].info.run_id == run.info.run_id  # continued, not replaced
    for t in trials:
        assert (by_key[t.key].data.tags[OUTCOME], by_key[t.key].info.status) == (FINISHED, "FINISHED")
    check_histories(client, by_key, trials, [*TRAIN, *pack[2:]], packed=bool(pack))
    print(
        f"SIGKILL {store}: trials {len(trials)}, runs {len(runs)}, resumed {len(interrupted)}, "
        "duplicates 0, lost 0"
    )


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
    assert load(last_path(Path(run.data.tags[TUNE_CHECKPOINT]) / trial.key))["step"] == 0

    ray_local.shared()  # no fault this time: the same run continues from step 0, every point stored once
    assert sweep_main(overrides) == 0
    (again,) = children(uri, "smoke")
    assert again.info.run_id == run.info.run_id and again.data.tags[OUTCOME] == FINISHED
    check_histories(client, {trial.key: again}, [trial], [])
