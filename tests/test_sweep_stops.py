"""A sweep stopped three times mid-sweep, each time resumed by the same command: SIGINT (Ctrl-C: the driver's
whole process group) and SIGTERM (a pod eviction: the driver alone) mid-trial, then SIGKILL of the whole group
(a lost head node) mid-sweep.

After a signal the driver stops within a bound, says how to resume and leaves the interrupted runs KILLED
with their checkpoint and no outcome. After the SIGKILL the same command skips the trials with an outcome and
resumes the others from the checkpoint their run recorded: the lock the killed driver left does not block it.
In the end every trial's run once (continued, not replaced), every metric point once, equal to local training.
Solo through the MLflow server on PostgreSQL (the compose stack's) with drivers attached to a running Ray
cluster (the session's: a killed driver's trials are the cluster's to end, as on a real one), packed on a
SQLite file with drivers on a local Ray instance of their own (Ctrl-C reaches its daemons too, and a stopped
driver leaves none of them); the two signals in both orders."""

from __future__ import annotations

import os
import shlex
import signal
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support.configs import FOUR_TRIALS, PACED, PACKED
from support.histories import check_histories
from support.once import assert_every_job_once_every_point_once
from support.repo import subprocess_env
from support.sweeps import (
    children,
    interrupted_runs,
    kill_group,
    kill_when,
    left_behind,
    recorded_checkpoint,
    run_sweep,
    start_sweep,
    sweep_jobs,
    wait_for,
)

from tracking.names import CONFIG_HASH, FINISHED, OUTCOME, TUNE_CHECKPOINT

pytestmark = pytest.mark.slow

STOP_BOUND_S = 120  # the driver must be gone this soon after the signal (it takes seconds)
# 2 x 2 trials, two at a time: when the first pair finishes the next starts. 60 paced steps: a trial runs 3 s,
# far longer than the moment between seeing it checkpointed in the store and the signal or the kill.
TRAIN = ["train.steps=60", "train.eval_every=10"]  # also the local runs check_histories compares with
SWEEP = [*FOUR_TRIALS, *TRAIN, "cluster.cpus_per_trial=1"]
ENV = {**subprocess_env(), **PACED}
# What a driver prints on attaching to Ray, by where it runs; without a dashboard either way (FOUR_TRIALS'
# cluster.dashboard_host=null for a local instance; the session's cluster has none).
ATTACHED = {"cluster": "Connected to Ray cluster", "local": "Started a local Ray instance"}


def checkpointed(uri: str, experiment: str, seen: set[str]) -> dict:
    """Runs without an outcome whose recorded checkpoint is new (not one of `seen`)."""
    return {
        k: r
        for k, r in interrupted_runs(uri, "smoke", experiment).items()
        if r.data.tags[TUNE_CHECKPOINT] not in seen
    }


def stop_mid_trial(
    overrides: list[str], log: Path, uri: str, experiment: str, signum: int, seen: set[str], ray: str
) -> dict:
    """Start the sweep, signal it once a trial checkpointed; returns the runs it left to resume."""
    driver = start_sweep(overrides, log, env=ENV)
    try:
        wait_for(lambda: checkpointed(uri, experiment, seen), driver, 300, "a trial checkpointed")
        sent = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(driver.pid, signum)  # Ctrl-C in a terminal: the foreground process group
        else:
            driver.send_signal(signum)  # Kubernetes: the container's main process
        code = driver.wait(timeout=STOP_BOUND_S)
        print(f"{signal.Signals(signum).name}: driver gone after {time.monotonic() - sent:.1f} s")
        left_running = left_behind(driver)  # a local instance's daemons and workers went with their driver
    finally:
        kill_group(driver)
    text = log.read_text()
    assert code == 128 + signum, text[-3000:]
    assert left_running == [], left_running
    assert ATTACHED[ray] in text and "View the dashboard" not in text, text[-3000:]
    command = " ".join(shlex.quote(w) for w in ["python", "-m", "sweeper.sweep", *overrides])
    assert f"Resume with the same command:\n  {command}\n" in text
    left = interrupted_runs(uri, "smoke", experiment)
    assert left and all(r.info.status == "KILLED" for r in left.values()), {
        k: r.info.status for k, r in left.items()
    }
    return left


def mid_sweep(uri: str, experiment: str) -> bool:
    """A run of the sweep has its outcome and another's Tune checkpoint is recorded, outcome still to come."""
    return bool(interrupted_runs(uri, "smoke", experiment)) and any(
        OUTCOME in r.data.tags for r in children(uri, "smoke", experiment)
    )


@pytest.mark.parametrize(
    "pack, store, signals, ray",
    [
        ([], "postgres", (signal.SIGINT, signal.SIGTERM), "cluster"),
        (PACKED, "sqlite", (signal.SIGTERM, signal.SIGINT), "local"),
    ],
    ids=["solo-postgres-server-cluster", "packed-sqlite-local"],
)
def test_signals_then_sigkill_and_the_same_command_resumes_every_trial_exactly_once(
    tmp_path, pack, store, signals, ray, request
):
    if store == "postgres":  # its own experiment: the session's server holds other tests' sweeps
        uri, experiment = request.getfixturevalue("pg_server").uri, "stops"
    else:
        uri, experiment = request.getfixturevalue("sqlite_uri"), "leaner-clustering"
    # On the cluster two trials at a time, as on a local instance of 2 CPUs.
    where = [request.getfixturevalue("ray_cluster"), "cluster.max_concurrent=2"] if ray == "cluster" else []
    overrides = [
        *SWEEP,
        *pack,
        *where,
        f"tracking.uri={uri}",
        f"tracking.experiment={experiment}",
        f"cluster.storage={tmp_path}/ray",
    ]
    seen: set[str] = set()
    resumed = {}  # config hash -> the run every later driver must continue
    for i, signum in enumerate(signals):
        left = stop_mid_trial(overrides, tmp_path / f"signal{i}.log", uri, experiment, signum, seen, ray)
        seen |= {r.data.tags[TUNE_CHECKPOINT] for r in left.values()}
        resumed.update({k: r.info.run_id for k, r in left.items()})

    killed = start_sweep(overrides, tmp_path / "killed.log", env=ENV)
    try:
        # Mid-sweep, read from the store (the console is quiet): one trial ended (its runs carry an outcome)
        # and another's checkpoint is recorded in MLflow.
        kill_when(
            lambda: mid_sweep(uri, experiment), killed, 600, "a trial completed and another checkpointed"
        )
    finally:
        kill_group(killed)
    before = {r.data.tags[CONFIG_HASH]: r for r in children(uri, "smoke", experiment)}
    interrupted = interrupted_runs(uri, "smoke", experiment)
    assert interrupted, "no trial was caught mid-run with a checkpoint"
    finished_before = sum(r.data.tags.get(OUTCOME) == FINISHED for r in before.values())
    print(f"killed with {len(interrupted)} trial(s) mid-run and {finished_before} finished")
    resumed.update({k: r.info.run_id for k, r in interrupted.items()})

    last = run_sweep(overrides, env=ENV)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    assert f"{finished_before} of 4 trials already in MLflow" in last.stdout
    for run in interrupted.values():  # resumed from the checkpoint its run recorded
        assert f"resuming from checkpoint {recorded_checkpoint(uri, run)}" in last.stdout + last.stderr

    client = MlflowClient(tracking_uri=uri)
    trials = sweep_jobs([*SWEEP, *pack])
    stored = assert_every_job_once_every_point_once(uri, experiment, trials, pack[2:])
    by_key = stored.runs
    for key, run_id in resumed.items():
        assert by_key[key].info.run_id == run_id  # continued, not replaced
    for t in trials:
        assert (by_key[t.key].data.tags[OUTCOME], by_key[t.key].info.status) == (FINISHED, "FINISHED")
    check_histories(client, by_key, trials, [*TRAIN, *pack[2:]], packed=bool(pack))
    stops = "+".join(signal.Signals(s).name for s in [*signals, signal.SIGKILL])
    print(
        f"{stops} {'packed' if pack else 'solo'} {store}, {ray} Ray: "
        f"trials {len(trials)}, runs {len(by_key)}, resumed {len(resumed)}, points {stored.points}, "
        "duplicates 0, lost 0"
    )
