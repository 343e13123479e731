"""A tracking-server outage mid-sweep: the MLflow server (on PostgreSQL) paused, stopped and started again;
the PostgreSQL server of a sweep that writes to the database itself, stopped and started again.

The sweep driver runs as a subprocess attached to a running Ray cluster (the session's), whose MLflow
client gives up after one retry (MLflow's own environment variables): its window is a few seconds, so a
server restart outlasts it and only the driver's own buffering (sweeper.driver.session, sweeper.driver.outage)
carries the sweep through; tracking.outage_s bounds that.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient
from support.configs import FOUR_TRIALS, PACED
from support.once import assert_every_job_once_every_point_once
from support.repo import subprocess_env
from support.sweeps import (
    children,
    interrupted_runs,
    kill_group,
    run_sweep,
    start_sweep,
    sweep_jobs,
    wait_for,
)

from tracking.names import (
    BEST_CHECKPOINT,
    CHECKPOINT_DIR,
    CONFIG_HASH,
    FINISHED,
    LAST_CHECKPOINT,
    OUTCOME,
    TUNE_CHECKPOINT,
)

pytestmark = pytest.mark.slow

CLIENT = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
}
PAUSE_S = 2  # shorter than the client's request timeout: the client itself rides it out
# 2 x 2 trials, two at a time (as on a local instance of 2 CPUs).
SWEEP = [*FOUR_TRIALS, "cluster.cpus_per_trial=1", "cluster.max_concurrent=2"]
# 240 paced steps (tests/support/configs.py), 12 s a trial: the pause, the stop and the driver noticing it all
# fall while trials still train and checkpoint (one every half second).
LONG = [*SWEEP, "train.steps=240"]
# 100 paced steps, 5 s, when the server stops at once on the first recorded checkpoint: that trial is still
# training when the driver gives up, tracking.outage_s=3 later.
SHORT = [*SWEEP, "train.steps=100"]


def checkpoints(storage: Path) -> set[Path]:
    return set(storage.glob("smoke-*/*/checkpoint_*"))


def check_store(uri: str, experiment: str, sweep: list[str], label: str) -> None:
    """Every trial's run once, finished, with its checkpoints; every metric point once."""
    client = MlflowClient(tracking_uri=uri)
    trials = sweep_jobs(sweep)
    once = assert_every_job_once_every_point_once(uri, experiment, trials)
    runs = list(once.runs.values())
    assert all((r.data.tags[OUTCOME], r.info.status) == (FINISHED, "FINISHED") for r in runs)
    for run in runs:  # no checkpoint lost
        stored = {f.path for f in client.list_artifacts(run.info.run_id, CHECKPOINT_DIR)}
        assert stored == {f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}", f"{CHECKPOINT_DIR}/{LAST_CHECKPOINT}"}, (
            stored
        )
    print(f"{label}: trials {len(trials)}, runs {len(runs)}, points {once.points}, duplicates 0, lost 0")


def test_server_outages_shorter_and_longer_than_the_clients_retries(pg_server, ray_cluster, tmp_path):
    experiment, storage, log = "outage", tmp_path / "ray", tmp_path / "sweep.log"
    overrides = [
        *LONG,
        ray_cluster,
        f"tracking.uri={pg_server.uri}",
        f"tracking.experiment={experiment}",
        f"cluster.storage={storage}",
    ]
    driver = start_sweep(overrides, log, env={**subprocess_env(), **CLIENT, **PACED})
    try:
        wait_for(
            lambda: interrupted_runs(pg_server.uri, "smoke", experiment), driver, 300, "a trial checkpointed"
        )
        os.killpg(pg_server.proc.pid, signal.SIGSTOP)  # a hang shorter than the client's timeout
        time.sleep(PAUSE_S)
        os.killpg(pg_server.proc.pid, signal.SIGCONT)
        pg_server.stop()  # an outage longer than the client's retries
        before = checkpoints(storage)
        wait_for(
            lambda: "unreachable" in log.read_text() and checkpoints(storage) - before,
            driver,
            300,
            "the driver noticed the outage while trials kept checkpointing",
        )
        pg_server.start()
        assert driver.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        kill_group(driver)
        if pg_server.proc.poll() is not None:
            pg_server.start()
    text = log.read_text()
    assert text.count("tracking: MLflow server") == 2, text[-3000:]  # said once when it went, once when back
    assert "back after" in text
    check_store(pg_server.uri, experiment, LONG, "outage outlasted")


@pytest.fixture
def own_postgres():
    """A PostgreSQL server (pgserver) of the test's own, to stop and start: the session's may be the
    machine's ($LEANER_TEST_POSTGRES_URI), and other tests of this worker share it."""
    import pgserver

    root = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))  # not under pytest's folder: see conftest
    try:
        with pgserver.get_server(root, cleanup_mode="stop") as server:
            server.psql("CREATE DATABASE mlflow;")
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_database_restart_mid_sweep_is_waited_out(own_postgres, ray_cluster, tmp_path):
    """tracking.uri=postgresql://...: no MLflow server between the driver and the database, whose restart
    the driver waits out as it does a server's (within tracking.outage_s)."""
    uri, experiment, log = own_postgres.get_uri("mlflow"), "db-outage", tmp_path / "sweep.log"
    overrides = on_server(LONG, ray_cluster, f"'{uri}'", experiment, tmp_path)  # quoted: ?host=/tmp/...
    # In its own folder: a database store keeps artifacts in ./mlruns of the driver's working directory.
    driver = start_sweep(overrides, log, env={**subprocess_env(), **PACED}, cwd=tmp_path)
    try:
        # The driver creates MLflow's tables first: two clients creating them at once collide in PostgreSQL.
        wait_for(lambda: "to run" in log.read_text(), driver, 300, "the driver opened the store")
        wait_for(lambda: interrupted_runs(uri, "smoke", experiment), driver, 300, "a trial checkpointed")
        postmaster = psutil.Process(own_postgres.get_pid())
        postmaster.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown: clients are cut off
        postmaster.wait(60)
        before = checkpoints(tmp_path / "ray")
        wait_for(
            lambda: "unreachable" in log.read_text() and checkpoints(tmp_path / "ray") - before,
            driver,
            300,
            "the driver noticed the database gone while trials kept checkpointing",
        )
        own_postgres.ensure_postgres_running()
        assert driver.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        kill_group(driver)
    text = log.read_text()
    assert text.count("tracking: database") == 2, text[-3000:]  # said once when it went, once when back
    assert "back after" in text
    check_store(uri, experiment, LONG, "database restart outlasted")


def on_server(sweep: list[str], ray_cluster: str, uri: str, experiment: str, tmp_path: Path) -> list[str]:
    """A sweep's overrides on the session's Ray cluster, writing to the server at `uri`."""
    return [
        *sweep,
        ray_cluster,
        f"tracking.uri={uri}",
        f"tracking.experiment={experiment}",
        f"cluster.storage={tmp_path}/ray",
    ]


def test_an_outage_beyond_tracking_outage_s_stops_the_driver_and_the_same_command_resumes(
    pg_server, ray_cluster, tmp_path
):
    experiment, log = "outage-limit", tmp_path / "sweep.log"
    overrides = [*on_server(SHORT, ray_cluster, pg_server.uri, experiment, tmp_path), "tracking.outage_s=3"]
    env = {**subprocess_env(), **CLIENT, **PACED}
    driver = start_sweep(overrides, log, env=env)
    try:
        wait_for(
            lambda: interrupted_runs(pg_server.uri, "smoke", experiment), driver, 300, "a trial checkpointed"
        )
        pg_server.stop()
        assert driver.wait(timeout=300) == 4, log.read_text()[-3000:]
    finally:
        kill_group(driver)
        pg_server.start()
    text = log.read_text()
    assert (
        "unreachable for" in text
        and "(tracking.outage_s=3)" in text
        and "start the same command again" in text
    )
    interrupted = interrupted_runs(pg_server.uri, "smoke", experiment)
    assert interrupted, "no run was left to resume"
    again = run_sweep(overrides, env=env, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for run in interrupted.values():  # resumed in its own run, from the checkpoint it recorded
        assert f"resuming from checkpoint {run.data.tags[TUNE_CHECKPOINT]}" in again.stdout + again.stderr
    by_key = {r.data.tags[CONFIG_HASH]: r.info.run_id for r in children(pg_server.uri, "smoke", experiment)}
    assert all(by_key[key] == run.info.run_id for key, run in interrupted.items())
    check_store(pg_server.uri, experiment, SHORT, "outage beyond tracking.outage_s, resumed")


# 600 paced steps, 30 s a trial: still training when the budget ends, the server stopped since the first
# checkpoint.
BUDGETED = [*SWEEP, "train.steps=600"]
BUDGET_S = 45


def test_a_budget_that_ends_while_the_server_is_away_stops_the_driver_and_the_same_command_resumes(
    pg_server, ray_cluster, tmp_path
):
    experiment, log = "outage-budget", tmp_path / "sweep.log"
    overrides = on_server(BUDGETED, ray_cluster, pg_server.uri, experiment, tmp_path)
    env = {**subprocess_env(), **CLIENT, **PACED}
    driver = start_sweep([*overrides, f"cluster.time_budget_s={BUDGET_S}"], log, env=env)
    try:
        wait_for(
            lambda: interrupted_runs(pg_server.uri, "smoke", experiment), driver, 300, "a trial checkpointed"
        )
        pg_server.stop()
        # the budget ends while the server is away: what the trials reported waits STOP_DRAIN_S at most
        assert driver.wait(timeout=BUDGET_S + 180) == 75, log.read_text()[-3000:]
    finally:
        kill_group(driver)
        pg_server.start()
    text = log.read_text()
    assert "time budget of 45 s (cluster.time_budget_s) is spent" in text, text[-3000:]
    assert "writes the store did not take within 60 s are replayed" in text and "Resume with the same" in text
    interrupted = interrupted_runs(pg_server.uri, "smoke", experiment)
    assert interrupted, "no run was left to resume"
    again = run_sweep(overrides, env={**subprocess_env(), **CLIENT}, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    by_key = {r.data.tags[CONFIG_HASH]: r.info.run_id for r in children(pg_server.uri, "smoke", experiment)}
    assert all(by_key[key] == run.info.run_id for key, run in interrupted.items())
    check_store(pg_server.uri, experiment, BUDGETED, "budget spent while the server was away, resumed")
