"""Shared fixtures (plain helpers: tests/support/): tiny configurations, stores, servers, a local Ray.

`postgres` is a real PostgreSQL database for the session, and `pg_server` a real `mlflow server` on it (as
docker/mlflow/compose.yaml runs one), which a test may restart (an outage). `mlflow_server` is one real
`mlflow server` for the whole session on 127.0.0.1 at a free port (SQLite backend and artifact store in a
temporary folder); request it from any test that needs HTTP tracking; experiments and runs accumulate across
tests, so filter by experiment name or run id. `sqlite_uri` is a fresh SQLite store per test, `tiny` the
overrides of a configuration that trains in about a second, `local_ray` the worker's shared local Ray.
`ray_cluster` is the override `cluster.address=127.0.0.1:PORT` of one Ray cluster for the whole session (a
`ray start --head` node, as a sweep on a real cluster joins one): a test whose sweep drivers are not about a
local instance's own lifecycle attaches them to it instead of each starting a local Ray (measured: a small
sweep's driver costs about 6 CPU-seconds and 6 s less; the head costs 7 to start, then 2 a minute idle).
`smoke_store` is a real store written once per session by `python -m sweeper.sweep sweep=smoke` on that
cluster (with one extra sub-grid: onehot models trained on cauchy tasks, so that family transfer and the
ablation by family have two training families).

Tests run torch on one thread (here and in the subprocesses they start): on two shared cores, two spinning
OpenMP threads per process cost several times the CPU, and one thread everywhere keeps in-process and
subprocess numbers equal. `make test` runs two pytest workers (pytest-xdist, a file on one worker): every
test has its own ports, stores, temporary folders and Ray instance or job, or a session fixture of its own
worker (each worker makes the session fixtures its files ask for), or one of the whole session
(`smoke_store`, `ray_cluster`: the first worker to ask makes it in the session's shared folder).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from filelock import FileLock

# Every Ray process of the tests (local instances, `ray start` nodes, sweep subprocesses) without token
# authentication, alike: a token in ~/.ray would otherwise switch it on for some and not others, and Ray
# keeps the mode it first read for the rest of this process.
os.environ["RAY_AUTH_MODE"] = "disabled"
# No idle workers started with each local Ray instance: a sweep's trials start their own worker processes,
# so the two a local instance prestarts (one per CPU) only idle, at a third of a CPU-second each to start.
os.environ["RAY_prestart_worker_first_driver"] = "0"

from support import ray_local, ray_nodes
from support.configs import TINY
from support.repo import REPO
from support.servers import MlflowServer

torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"  # inherited by every subprocess a test starts


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with the most slow tests first, each file's own order kept: make test's two workers
    (--dist loadfile --no-loadscope-reorder: a file on one worker, taken in this order) then finish
    together instead of one starting a long file last while the other idles."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])


@pytest.hookimpl(trylast=True)  # after the fixtures' own teardown (a cluster test's nodes)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a file's last test, the Ray instance it left in this worker (local_ray's, or one an in-process
    sweep started) goes: an idle local Ray costs about 5% of a core (its agents and monitors), for the rest
    of the session otherwise."""
    if nextitem is not None and nextitem.path == item.path:
        return
    ray = sys.modules.get("ray")  # never imported by this worker: nothing to stop, and no import to pay
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def local_ray() -> None:
    """This worker's shared local Ray instance (2 CPUs), started on first use and kept for the file's tests:
    for tests that need no Ray environment of their own (those use support.ray_local.own)."""
    ray_local.shared()


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> str:
    """The override that attaches a sweep to the session's Ray cluster: one head node of
    support.ray_nodes.SESSION_CPUS CPUs, which both workers' sweeps share; a sweep there takes at most two
    CPUs (cluster.max_concurrent), as on a local instance of two. Started by the first worker to ask,
    stopped by pytest_sessionfinish."""
    return f"cluster.address={ray_nodes.session_head(_shared_folder(tmp_path_factory, worker_id))}"


def _shared_folder(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The session's folder: its workers' base temporary folders are in the controller's."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The session's Ray cluster stops with the process that owns the session: the xdist controller, once
    every worker ended its tests, or the one pytest process; never a worker, whose last file may end while
    the other worker still sweeps on it."""
    if hasattr(session.config, "workerinput"):  # an xdist worker
        return
    ray_nodes.stop_session_head(session.config._tmp_path_factory.getbasetemp())


@pytest.fixture
def tiny() -> list[str]:
    """Overrides of a tiny configuration: 40 steps, evaluations at 0, 10, 20, 30, 40."""
    return list(TINY)


@pytest.fixture(scope="session")
def _empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite tracking store, created once: MLflow's schema migrations take seconds."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def sqlite_uri(tmp_path: Path, _empty_store: Path) -> str:
    """A fresh SQLite tracking store in tmp_path (its artifacts go beside it)."""
    shutil.copyfile(_empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, _empty_store: Path) -> str:
    """URI of a real `mlflow server` on 127.0.0.1 for the whole session (SQLite)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    shutil.copyfile(_empty_store, root / "mlflow.db")  # skips the server's schema migrations
    server = MlflowServer(f"sqlite:///{root / 'mlflow.db'}", root)
    server.start()
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.fixture(scope="session")
def smoke_store(tmp_path_factory: pytest.TempPathFactory, worker_id: str, ray_cluster: str) -> str:
    """sweep=smoke (3 embeddings x 2 seeds) plus cauchy-trained onehot models, through the sweep CLI, on the
    session's Ray cluster.

    Swept once per `make test`: the first pytest worker to ask builds it in the session's shared folder (a
    file lock makes the other wait), and every worker reads and writes its own copy of it (the report caches
    its evaluations in the store)."""
    if worker_id == "master":  # no xdist: nothing to share
        return _smoke_sweep(tmp_path_factory.mktemp("smoke_store"), ray_cluster)
    shared = _shared_folder(tmp_path_factory, worker_id)
    built = shared / "smoke_store"
    with FileLock(str(shared / "smoke_store.lock")):
        if not (built / "swept").exists():
            _smoke_sweep(built, ray_cluster)
            (built / "swept").touch()
    return _copy_store(built, tmp_path_factory.mktemp("smoke_store"))


def _smoke_sweep(root: Path, ray_cluster: str) -> str:
    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root}/mlflow.db"
    subgrids = (
        "sweep.subgrids=[{name: smoke, embedding: [onehot, binary, none]}, "
        "{name: family, family: [normal, cauchy]}]"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweeper.sweep",
            "sweep=smoke",
            subgrids,
            f"tracking.uri={uri}",
            f"cluster.storage={root}/ray",
            ray_cluster,
            "cluster.max_concurrent=2",  # a CPU a trial, two at once (tests/test_docs.py: DEMO_STEPS)
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return uri


def _copy_store(source: Path, target: Path) -> str:
    """A copy of the SQLite store in `source` (its database and artifacts) whose runs point at their copied
    artifacts."""
    shutil.copyfile(source / "mlflow.db", target / "mlflow.db")
    shutil.copytree(source / "mlartifacts", target / "mlartifacts")
    with sqlite3.connect(target / "mlflow.db") as db:
        db.execute(
            "UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)",
            (str(source), str(target)),
        )
        db.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (str(source), str(target)))
    return f"sqlite:///{target}/mlflow.db"


@pytest.fixture(scope="session")
def postgres() -> str:
    """A PostgreSQL database URI: $LEANER_TEST_POSTGRES_URI when set (say the machine's own server at
    127.0.0.1:5432), else database `mlflow` of a server the pgserver wheel (a dev dependency) starts in a
    temporary folder, so no test is skipped for want of PostgreSQL."""
    given = os.environ.get("LEANER_TEST_POSTGRES_URI")
    if given:
        yield given
        return
    import pgserver

    # Not under pytest's temporary folder: another pytest session of this user that starts meanwhile makes
    # /tmp/pytest-of-USER private again, and the server (its own system user) loses its data directory.
    root = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
    try:
        with pgserver.get_server(root, cleanup_mode="stop") as server:
            server.psql("CREATE DATABASE mlflow;")
            yield server.get_uri("mlflow")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory, postgres: str) -> MlflowServer:
    """A real `mlflow server` on the session's PostgreSQL; a test may stop() and start() it (same port)."""
    server = MlflowServer(postgres, tmp_path_factory.mktemp("mlflow-pg"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
