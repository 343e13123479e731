"""Two drivers on one sweep: started together, mid-trial and near the end, the second refuses (naming the
running driver: host, pid, start) or, once the first is done, finds nothing to run. No run twice, no point
twice. The drivers attach to a running Ray cluster (the session's), as a retried job's would."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support.configs import FOUR_TRIALS, PACED
from support.once import assert_every_job_once_every_point_once
from support.ray_nodes import RayNodes
from support.repo import subprocess_env
from support.sweeps import (
    ended_runs,
    interrupted_runs,
    kill_group,
    run_sweep,
    start_sweep,
    sweep_jobs,
    wait_for,
)

from cli import exit_codes
from tracking.names import CONFIG_HASH, DRIVER, FINISHED, OUTCOME, SWEEP

pytestmark = pytest.mark.slow

# 100 paced steps (tests/support/configs.py): 5 s a trial, so a second driver starts mid-trial. Two trials at
# a time, as on a local instance of 2 CPUs: the last two start when the first two end.
SMOKE = [*FOUR_TRIALS, "train.steps=100", "cluster.cpus_per_trial=1", "cluster.max_concurrent=2"]


def second_driver(overrides: list[str]) -> subprocess.CompletedProcess:
    return run_sweep(overrides, timeout=300)


def refused_or_done(second: subprocess.CompletedProcess, first: subprocess.Popen) -> str:
    """The second driver refused, naming the first; or the first had finished and nothing was left to run."""
    if second.returncode == exit_codes.LOCKED:
        assert f"pid {first.pid}, started " in second.stderr, second.stderr
        return "refused"
    assert second.returncode == 0 and "4 of 4 trials already in MLflow; 0 to run" in second.stdout, (
        second.stdout
    )
    return "nothing left"


def test_a_second_driver_never_duplicates_work(tmp_path, sqlite_uri, ray_cluster):
    uri = sqlite_uri  # an existing store: two drivers creating one SQLite file at once race on its schema
    overrides = [*SMOKE, ray_cluster, f"tracking.uri={uri}", f"cluster.storage={tmp_path}/ray"]
    # Two started at once: both may create a parent run and lock it; one drives, the other refuses.
    a, b = (
        start_sweep(overrides, tmp_path / f"{name}.log", env={**subprocess_env(), **PACED}) for name in "ab"
    )
    try:
        wait_for(
            lambda: a.poll() is not None or b.poll() is not None, None, 300, "one of two drivers refusing"
        )
        loser, first = (a, b) if a.poll() is not None else (b, a)
        log = tmp_path / ("a.log" if loser is a else "b.log")
        assert loser.returncode == exit_codes.LOCKED, log.read_text()[-3000:]
        assert f"pid {first.pid}, started " in log.read_text()
        seen = ["together: refused"]
        wait_for(lambda: interrupted_runs(uri), first, 300, "a trial checkpointed")
        seen.append(f"mid-trial: {refused_or_done(second_driver(overrides), first)}")
        wait_for(
            lambda: len(ended_runs(uri)) >= 2 or first.poll() is not None,
            None,
            600,
            "the last two trials started",
        )
        seen.append(f"near the end: {refused_or_done(second_driver(overrides), first)}")
        assert first.wait(timeout=600) == 0
    finally:
        kill_group(a)
        kill_group(b)
    driven = (tmp_path / ("b.log" if loser is a else "a.log")).read_text()
    # On the session's cluster, which has no dashboard (a local instance's driver: tests/test_sweep_stops.py).
    assert "Connected to Ray cluster" in driven and "View the dashboard" not in driven
    client = MlflowClient(tracking_uri=uri)
    trials = sweep_jobs(SMOKE)
    stored = assert_every_job_once_every_point_once(uri, "leaner-clustering", trials)
    runs = list(stored.runs.values())
    assert all((r.data.tags[OUTCOME], r.info.status) == (FINISHED, "FINISHED") for r in runs)
    experiment = client.get_experiment_by_name("leaner-clustering").experiment_id
    parents = [
        r
        for r in client.search_runs([experiment], f"tags.{SWEEP} = 'smoke'")
        if CONFIG_HASH not in r.data.tags
    ]
    assert len(parents) == 1 and DRIVER not in parents[0].data.tags  # one parent; its lock released
    print(
        f"two drivers ({'; '.join(seen)}): trials {len(trials)}, runs {len(runs)}, points {stored.points}, "
        "duplicates 0, lost 0"
    )


# The first driver's own host name (a UTS namespace): on this machine, it is a driver on another host, whose
# process the second cannot see, as a lost head pod's is to a retried RayJob's driver.
LOST_HOST = "lost-head"
ELSEWHERE = ("unshare", "--uts", "sh", "-c", f'hostname {LOST_HOST} && exec "$0" "$@"')


@contextlib.contextmanager
def head_node(root: Path):
    """A fresh one-node Ray cluster (a head of 2 CPUs, paced trials), killed at the end."""
    root.mkdir()
    nodes = RayNodes(root, env=PACED, dashboard=False)
    try:
        nodes.start("head", cpus=2, gpus=0, head=True)
        yield nodes
    finally:
        nodes.stop()


def elsewhere_works() -> bool:
    try:
        return subprocess.run([*ELSEWHERE, "true"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(not elsewhere_works(), reason="no UTS namespace here (unshare --uts) to stand for a host")
def test_a_retried_driver_on_a_new_cluster_takes_over_the_lock_of_one_lost_with_its_cluster(sqlite_uri):
    uri = sqlite_uri
    root = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    # 20 s a trial: the refused retry joins its cluster and runs the preflight before it meets the lock, which
    # the lost driver must still hold then (at 5 s a trial it had ended the sweep, and the retry found nothing
    # to run).
    sweep = [*SMOKE, "train.steps=400"]
    common = [*sweep, f"tracking.uri={uri}", f"cluster.storage={root}/ray"]
    env = {**subprocess_env(), **PACED}
    try:
        with head_node(root / "old") as old, head_node(root / "new") as new:
            lost = start_sweep(
                [*common, f"cluster.address={old.address}"], root / "lost.log", env=env, prefix=ELSEWHERE
            )
            try:
                wait_for(lambda: interrupted_runs(uri) and "gcs" in held(uri), lost, 300, "a checkpoint")
                assert held(uri)["host"] == LOST_HOST
                # Its cluster answers: the lock holds, however the retry came.
                retry = [*common, f"cluster.address={new.address}"]
                refused = second_driver(retry)
                assert refused.returncode == exit_codes.LOCKED, refused.stdout[-3000:] + refused.stderr
                assert f"host {LOST_HOST}, pid " in refused.stderr
            finally:
                kill_group(lost)  # the head pod lost: its driver and its cluster at once
                old.stop()
            retried = second_driver(retry)
        out = retried.stdout
        assert retried.returncode == 0, out[-3000:] + retried.stderr[-3000:]
        assert "taking over the lock of a driver whose Ray cluster is gone" in out, out[-3000:]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    stored = assert_every_job_once_every_point_once(uri, "leaner-clustering", sweep_jobs(sweep))
    runs = list(stored.runs.values())
    assert all((r.data.tags[OUTCOME], r.info.status) == (FINISHED, "FINISHED") for r in runs)
    print(
        f"driver lost with its cluster, retried on a new one: runs {len(runs)}, points {stored.points}, "
        "duplicates 0, lost 0"
    )
    assert held(uri) == {}  # released at the end


def held(uri: str) -> dict:
    """The lock on the smoke sweep's parent run: its holder, or {}."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("leaner-clustering")
    if experiment is None:
        return {}
    parents = [
        r
        for r in client.search_runs([experiment.experiment_id], f"tags.{SWEEP} = 'smoke'")
        if CONFIG_HASH not in r.data.tags
    ]
    return json.loads(parents[0].data.tags.get(DRIVER, "{}")) if parents else {}
