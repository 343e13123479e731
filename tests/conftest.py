"""Shared fixtures: tiny training configurations and a real MLflow tracking server.

`mlflow_server` starts one real `mlflow server` for the whole test session on
127.0.0.1 at a free port (SQLite backend and artifact store in a temporary
folder), waits until /health answers, yields its URI (http://127.0.0.1:PORT)
and stops it at the end. Request it from any test that needs HTTP tracking;
experiments and runs accumulate across tests, so filter by experiment name or
run id. `sqlite_uri` is a fresh SQLite store per test, `tiny` the overrides of
a configuration that trains in about a second.

Tests run torch on one thread (here and in the subprocesses they start): on
two shared cores, two spinning OpenMP threads per process cost several times
the CPU, and one thread everywhere keeps in-process and subprocess numbers equal.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"  # inherited by every subprocess a test starts

REPO = Path(__file__).resolve().parent.parent
SERVER_START_TIMEOUT_S = 180  # a cold `mlflow server` on two busy cores takes a while

TINY = ["task.n=64", "task.d=2", "task.k=3", "train.batch=4", "train.steps=40", "train.eval_every=10",
        "train.val_batches=2", "train.log_every=5", "train.device=cpu"]


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


def subprocess_env() -> dict[str, str]:
    """Environment for `python -m sweeper...` subprocesses run outside the repository root."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM a process started with start_new_session=True and its children; SIGKILL after `timeout` s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_until_up(uri: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"mlflow server at {uri} did not answer within {SERVER_START_TIMEOUT_S} s:\n"
                       f"{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, _empty_store: Path) -> str:
    """URI of a real `mlflow server` on 127.0.0.1 for the whole session."""
    root = tmp_path_factory.mktemp("mlflow-server")
    shutil.copyfile(_empty_store, root / "mlflow.db")  # skips the server's schema migrations
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", str(root / "artifacts"), "--workers", "1"]
    with open(log, "wb") as out:
        # Its own process group: the server forks workers, all stopped together below.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    try:
        _wait_until_up(uri, proc, log)
        yield uri
    finally:
        stop_group(proc, timeout=20)
