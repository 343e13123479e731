"""Exactly-once under a killed driver: SIGKILL the sweep's whole process group mid-sweep, start again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from sweeper.metrics import CONFIG_HASH, FINISHED, OUTCOME, TUNE_CHECKPOINT
from helpers import check_histories, children, sweep_trials

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

# 2 x 2 trials, two at a time: when the first pair finishes the next starts. 300 steps: a trial runs
# seconds, far longer than the moment between seeing it checkpointed in the store and the kill.
TRAIN = ["train.steps=300", "train.eval_every=10"]
SWEEP = ["sweep=smoke", "sweep.seeds=[1, 2]", "sweep.subgrids=[{name: smoke, embedding: [onehot, binary]}]", *TRAIN]


def start(overrides: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:  # its own session: the driver, its local Ray and the trials form one group
        return subprocess.Popen([sys.executable, "-m", "sweeper.sweep", *overrides], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(predicate, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, "the sweep ended before it could be killed mid-way"
        assert time.monotonic() < deadline, "the sweep made no progress"
        time.sleep(0.5)


def interrupted_runs(uri: str) -> dict:
    """Config hash -> run, for the runs whose Tune checkpoint the driver recorded and that have no outcome yet."""
    try:
        runs = children(uri, "smoke")
    except Exception:  # the store or its experiment does not exist yet
        return {}
    return {r.data.tags[CONFIG_HASH]: r for r in runs if OUTCOME not in r.data.tags and TUNE_CHECKPOINT in r.data.tags}


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # Ray's own daemons may have left the group; they belong to this sweep's session all the same.
    left = [p for p in psutil.process_iter() if _session(p) == proc.pid]
    for p in left:
        p.kill()
    psutil.wait_procs(left, timeout=30)


def _session(p: psutil.Process) -> int | None:
    try:
        return os.getsid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


# Packed: the two seeds of a configuration in one trial, one trial at a time (dropout 0: packed equals solo).
PACKED = ["cluster.pack=seeds", "cluster.max_concurrent=1", "model.dropout=0.0"]


@pytest.mark.parametrize("pack", [[], PACKED], ids=["solo", "packed"])
def test_sigkill_driver_then_restart_runs_every_trial_exactly_once(tmp_path, pack):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = [*SWEEP, *pack, f"tracking.uri={uri}", f"cluster.storage={tmp_path}/ray", "cluster.cpus_per_trial=1"]
    log = tmp_path / "sweep.log"
    first = start(overrides, log)
    try:
        # Mid-sweep: one trial completed (Tune prints it) and another's checkpoint is recorded in MLflow.
        wait_for(lambda: "completed after" in log.read_text(errors="replace") and interrupted_runs(uri), first,
                 timeout=600)
    finally:
        kill_group(first)
    client = MlflowClient(tracking_uri=uri)
    before = {r.data.tags[CONFIG_HASH]: r for r in children(uri, "smoke")}
    interrupted = interrupted_runs(uri)
    assert interrupted, "no trial was caught mid-run with a checkpoint"
    print(f"killed with {len(interrupted)} trial(s) mid-run and "
          f"{sum(r.data.tags.get(OUTCOME) == FINISHED for r in before.values())} finished")

    second = subprocess.run([sys.executable, "-m", "sweeper.sweep", *overrides], cwd=REPO, capture_output=True,
                            text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    finished_before = sum(r.data.tags.get(OUTCOME) == FINISHED for r in before.values())
    assert f"{finished_before} of 4 trials already in MLflow" in second.stdout
    for key, run in interrupted.items():  # resumed from the checkpoint its run recorded
        assert f"resuming from checkpoint {run.data.tags[TUNE_CHECKPOINT]}" in second.stdout + second.stderr

    runs = children(uri, "smoke")
    trials = sweep_trials([*SWEEP, *pack])
    assert sorted(r.data.tags[CONFIG_HASH] for r in runs) == sorted(t.key for t in trials)  # one run each
    by_key = {r.data.tags[CONFIG_HASH]: r for r in runs}
    for key, run in interrupted.items():
        assert by_key[key].info.run_id == run.info.run_id  # continued, not replaced
    for t in trials:
        assert (by_key[t.key].data.tags[OUTCOME], by_key[t.key].info.status) == (FINISHED, "FINISHED")
    check_histories(client, by_key, trials, [*TRAIN, *pack[2:]], packed=bool(pack))
