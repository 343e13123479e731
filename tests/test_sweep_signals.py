"""A graceful stop: SIGINT (Ctrl-C: the driver's whole process group) and SIGTERM (a pod eviction: the driver
alone) mid-trial. The driver stops within a bound, says how to resume, leaves the interrupted runs KILLED with
their checkpoint and no outcome; the same command resumes them; every run and every metric point once."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support.configs import FOUR_TRIALS, PACKED
from support.histories import point_counts
from support.repo import REPO
from support.sweeps import children, interrupted_runs, kill_group, start_sweep, sweep_jobs, wait_for

from tracking.names import CONFIG_HASH, FINISHED, OUTCOME, TUNE_CHECKPOINT

pytestmark = pytest.mark.slow

STOP_BOUND_S = 120  # the driver must be gone this soon after the signal (it takes seconds)
# 2 x 2 trials, two at a time, 200 steps: seconds a trial, so a signal sent at a checkpoint lands mid-trial.
SWEEP = [*FOUR_TRIALS, "train.steps=200", "cluster.cpus_per_trial=1"]


def checkpointed(uri: str, seen: set[str]) -> dict:
    """Runs without an outcome whose recorded checkpoint is new (not one of `seen`)."""
    return {k: r for k, r in interrupted_runs(uri).items() if r.data.tags[TUNE_CHECKPOINT] not in seen}


def stop_mid_trial(overrides: list[str], log: Path, uri: str, signum: int, seen: set[str]) -> dict:
    """Start the sweep, signal it once a trial checkpointed; returns the runs it left to resume."""
    driver = start_sweep(overrides, log)
    try:
        wait_for(lambda: checkpointed(uri, seen), driver, 300, "a trial checkpointed")
        sent = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(driver.pid, signum)  # Ctrl-C in a terminal: the foreground process group
        else:
            driver.send_signal(signum)  # Kubernetes: the container's main process
        code = driver.wait(timeout=STOP_BOUND_S)
        print(f"{signal.Signals(signum).name}: driver gone after {time.monotonic() - sent:.1f} s")
    finally:
        kill_group(driver)
    text = log.read_text()
    assert code == 128 + signum, text[-3000:]
    command = " ".join(shlex.quote(w) for w in ["python", "-m", "sweeper.sweep", *overrides])
    assert f"Resume with the same command:\n  {command}\n" in text
    left = interrupted_runs(uri)
    assert left and all(r.info.status == "KILLED" for r in left.values()), {
        k: r.info.status for k, r in left.items()
    }
    return left


@pytest.mark.parametrize(
    "pack, signals",
    [([], (signal.SIGINT, signal.SIGTERM)), (PACKED, (signal.SIGTERM, signal.SIGINT))],
    ids=["solo", "packed"],
)
def test_sigint_and_sigterm_stop_gracefully_and_the_same_command_resumes(tmp_path, sqlite_uri, pack, signals):
    uri = sqlite_uri
    overrides = [*SWEEP, *pack, f"tracking.uri={uri}", f"cluster.storage={tmp_path}/ray"]
    seen: set[str] = set()
    resumed = {}
    for i, signum in enumerate(signals):
        left = stop_mid_trial(overrides, tmp_path / f"sweep{i}.log", uri, signum, seen)
        seen |= {r.data.tags[TUNE_CHECKPOINT] for r in left.values()}
        resumed.update({k: r.info.run_id for k, r in left.items()})
    last = subprocess.run(
        [sys.executable, "-m", "sweeper.sweep", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    runs = children(uri, "smoke")
    trials = sweep_jobs([*SWEEP, *pack])
    assert sorted(r.data.tags[CONFIG_HASH] for r in runs) == sorted(t.key for t in trials)  # one run each
    by_key = {r.data.tags[CONFIG_HASH]: r for r in runs}
    assert all(
        by_key[key].info.run_id == run_id for key, run_id in resumed.items()
    )  # continued, not replaced
    assert all((r.data.tags[OUTCOME], r.info.status) == (FINISHED, "FINISHED") for r in runs)
    points, duplicated, lost = point_counts(MlflowClient(tracking_uri=uri), runs, pack[2:])
    print(
        f"{'+'.join(signal.Signals(s).name for s in signals)} {'packed' if pack else 'solo'}: "
        f"trials {len(trials)}, "
        f"runs {len(runs)}, resumed {len(resumed)}, points {points}, duplicates {duplicated}, lost {lost}"
    )
    assert (duplicated, lost) == (0, 0)
