"""The preflight (sweeper.preflight) on a real Ray cluster of `ray start` nodes on this machine, with a real
SQLite store and a real MLflow server with basic auth: it passes where the sweep would run, and names each
planted fault in one FAIL line of its table, exit 10.

The nodes: a head declaring 1 CPU and no GPU, and two workers declaring 1 CPU and 1 GPU each (Ray schedules
by what a node declares: the GPUs need not exist, and CUDA starts on none of them). Worker `blind` runs in a
mount namespace of its own (`unshare`) in which a tmpfs covers the folder `blind`: the same path, another
file system, as on a node where the shared folder is not mounted; and the folder `readonly` is mounted
read-only (a node that reads the shared folder and cannot write it). Every other path is the same file
system on all nodes. A fourth, `wide`, declares one CPU more than this machine's cores, as a SLURM step's Ray
told --num-cpus without --cpus-per-task does (its trials would share the cores).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient
from support.ray_nodes import RayNodes
from test_slurm_locks import no_locks  # noqa: F401 - the fixture, reused
from test_tracking_auth import ADMIN, PASSWORD, auth_server  # noqa: F401 - the fixture, reused

from cli import exit_codes
from sweeper import preflight
from sweeper.sweep import main as sweep_main

pytestmark = pytest.mark.slow

SWEEP = ["sweep=smoke", "cluster.gpus_per_trial=0.5", "train.device=cpu"]  # smoke: 20 steps, eval every 5
CORES = len(os.sched_getaffinity(0))  # what the processes of every node here may run on
NODES = {"head": (1, 0), "shared": (1, 1), "blind": (1, 1), "wide": (CORES + 1, 0)}  # declared CPUs, GPUs


@pytest.fixture(scope="module")
def nodes():
    import ray

    ray.shutdown()
    root = Path(tempfile.mkdtemp(prefix="pf-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    blind, readonly = root / "blind", root / "readonly"  # on node `blind`: a tmpfs, and read-only
    blind.mkdir()
    readonly.mkdir()
    # `sh -c SCRIPT BLIND READONLY ray start ...`: mount over $0, $1 read-only, then become `ray start` (its
    # process group is the one killed)
    mounts = 'mount -t tmpfs preflight-blind "$0" && mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"'
    hide = ("unshare", "--mount", "--map-root-user", "--propagation", "private", "sh", "-c")
    hide += (f'{mounts} && shift && exec "$@"', str(blind), str(readonly))
    cluster = RayNodes(root, dashboard=False)
    try:
        cluster.start("head", *NODES["head"], head=True)
        ray.init(address=cluster.address)  # the preflight's driver joins this connection
        cluster.start("shared", *NODES["shared"])
        cluster.start("blind", *NODES["blind"], wrap=hide)
        cluster.start("wide", *NODES["wide"])
        yield cluster, root
    finally:
        ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def step_times(tmp_path) -> Path:
    """Step times as `python -m bench step_seconds --out FILE` writes them: 100 s a step for every shape, so
    a smoke trial's first checkpoint (train.eval_every=5 steps) needs 500 s."""
    path = tmp_path / "steps.json"
    rows = [{"config": {}, "seconds_per_step": 100.0}]
    path.write_text(json.dumps({"command": "step_seconds", "device": "cpu", "threads": 1, "rows": rows}))
    return path


def run(argv: list[str], capsys) -> tuple[int, list[str]]:
    """The preflight's exit code and its table's rows."""
    code = preflight.main(argv)
    out = capsys.readouterr().out
    return code, [line for line in out.splitlines() if line.startswith("  ")]


def failing(rows: list[str]) -> list[str]:
    return [row for row in rows if row.split()[0] == preflight.FAIL]


def on(nodes, *more: str) -> list[str]:
    cluster, _ = nodes
    return [*SWEEP, f"cluster.address={cluster.address}", *more]


def test_the_preflight_passes_where_the_sweep_would_run(nodes, tmp_path, sqlite_uri, step_times, capsys):
    cluster, _ = nodes
    argv = on(nodes, f"tracking.uri={sqlite_uri}", f"cluster.storage={tmp_path}/ray")
    code, rows = run([*argv, f"cluster.step_seconds={step_times}", "cluster.time_budget_s=3600"], capsys)
    print("\n".join(rows))
    assert (code, failing(rows)) == (0, [])
    for name, node_id in cluster.node_ids().items():
        cpus, gpus = NODES[name]
        (row,) = [r for r in rows if r.split()[1] == "nodes" and node_id[:8] in r]
        assert f"{cpus} CPUs, {gpus} GPUs: {min(cpus, int(gpus / 0.5))} trials at once" in row
        oversold = f"it declares {cpus} CPUs and its processes may run on {CORES} cores" in row
        assert (row.split()[0], oversold) == (("!", True) if name == "wide" else ("ok", False)), row
    assert any(r.split()[1] == "storage" and "shared: each of 4 nodes reads and writes it" in r for r in rows)
    assert any(r.split()[1] == "locks" and "takes SQLite's locks" in r for r in rows)
    assert any(r.split()[1] == "cuda" and "not needed: train.device=cpu" in r for r in rows)
    assert list((tmp_path / "ray").iterdir()) == []  # every node's file and the driver's removed


@pytest.mark.parametrize(
    "folder, fault",
    [
        ("blind", ("do not see it", "not found")),
        ("readonly", ("cannot write there", "Read-only file system")),
    ],
)
def test_a_node_without_the_shared_folder_is_named(nodes, folder, fault, sqlite_uri, capsys):
    """A node on which the folder is another file system (it does not find the driver's file there), and
    one on which it is read-only (it finds the driver's file, and cannot leave its own)."""
    cluster, root = nodes
    code, rows = run(on(nodes, f"tracking.uri={sqlite_uri}", f"cluster.storage={root / folder}"), capsys)
    (found,) = failing(rows)
    ids = cluster.node_ids()
    assert code == exit_codes.PREFLIGHT and found.split()[1] == "storage", rows
    assert ids["blind"][:8] in found and all(words in found for words in fault), found
    assert ids["shared"][:8] not in found and ids["head"][:8] not in found


def test_a_wrong_tracking_password_is_named(nodes, auth_server, tmp_path, monkeypatch, capsys):  # noqa: F811
    argv = on(nodes, f"tracking.uri={auth_server.uri}", f"cluster.storage={tmp_path}/ray")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-password-1")
    code, rows = run(argv, capsys)
    (fault,) = failing(rows)
    assert code == exit_codes.PREFLIGHT and fault.split()[1] == "tracking", rows
    assert "refused access (401)" in fault
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    code, rows = run(argv, capsys)
    assert (code, failing(rows)) == (0, [])
    assert any(r.split()[1] == "locks" and "not needed: a tracking server's store" in r for r in rows)


def test_a_store_on_a_file_system_without_locks_is_named(nodes, no_locks, tmp_path, capsys):  # noqa: F811
    """The SQLite store on a FUSE mount that refuses every lock, as Lustre mounted with noflock does."""
    argv = on(nodes, f"tracking.uri=sqlite:///{no_locks}/mlflow.db", f"cluster.storage={tmp_path}/ray")
    code, rows = run(argv, capsys)
    (fault,) = failing(rows)
    assert code == exit_codes.PREFLIGHT and fault.split()[1] == "tracking", rows
    assert f"the file system of {no_locks} refuses file locks (lockf: Function not implemented)" in fault
    assert list(no_locks.iterdir()) == []  # no store made there


def test_a_budget_too_short_for_a_first_checkpoint_is_named(nodes, tmp_path, sqlite_uri, step_times, capsys):
    argv = on(nodes, f"tracking.uri={sqlite_uri}", f"cluster.storage={tmp_path}/ray")
    code, rows = run([*argv, f"cluster.step_seconds={step_times}", "cluster.time_budget_s=400"], capsys)
    (fault,) = failing(rows)
    assert code == exit_codes.PREFLIGHT and fault.split()[1] == "budget", rows
    assert (
        "cluster.time_budget_s=400 leaves" in fault
        and "first checkpoint needs (500 s: 5 steps at 100 s" in fault
    )


def test_gpus_without_cuda_and_trials_no_node_fits_are_named(nodes, tmp_path, sqlite_uri, capsys):
    """train.device=cuda on nodes whose GPUs are declared but absent: CUDA starts on neither (each named);
    a trial of 2 CPUs fits no node of 1."""
    cluster, _ = nodes
    argv = on(nodes, f"tracking.uri={sqlite_uri}", f"cluster.storage={tmp_path}/ray", "train.device=cuda")
    code, rows = run(argv, capsys)
    ids = cluster.node_ids()
    faults = failing(rows)
    assert code == exit_codes.PREFLIGHT and [f.split()[1] for f in faults] == ["cuda", "cuda"], rows
    for name in ("shared", "blind"):
        assert any(ids[name][:8] in f and "CUDA does not start" in f for f in faults), name
    code, rows = run([*argv[:-1], "cluster.cpus_per_trial=2"], capsys)
    (fault,) = failing(rows)
    assert code == exit_codes.PREFLIGHT and "no node fits a trial (2 CPU, 0.5 GPU each)" in fault


def test_the_sweep_on_a_cluster_runs_the_preflight_before_any_trial(
    nodes, tmp_path, sqlite_uri, step_times, capfd
):
    """A fault the preflight finds (here the budget) ends the sweep with exit 10: no trial, no parent run.
    On a cluster the budget is said once, in the preflight's table."""
    argv = on(nodes, f"tracking.uri={sqlite_uri}", f"cluster.storage={tmp_path}/ray")
    # The budget counts from the process's start, here this test worker's, which may have run for many
    # minutes: 400 s more than its age, far under the 3.3 h the sweep needs, not spent before the preflight.
    budget_s = round(time.time() - psutil.Process().create_time()) + 400
    code = sweep_main([*argv, f"cluster.step_seconds={step_times}", f"cluster.time_budget_s={budget_s}"])
    out, err = capfd.readouterr()
    assert code == exit_codes.PREFLIGHT, out[-3000:] + err[-3000:]
    assert "preflight: 1 faults: budget" in out and "the preflight found 1 faults (budget)" in err
    budget = [line.split()[:2] for line in out.splitlines() if "cluster.time_budget_s" in line]
    assert budget == [["FAIL", "budget"]], out[-3000:]
    client = MlflowClient(tracking_uri=sqlite_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert client.search_runs(experiments) == []
