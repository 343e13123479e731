"""A sweep whose new local Ray instance does not start ends in one error line, with nothing recorded.

Ray raises a bare Exception or RuntimeError when its processes do not come up in its own time (its node
waits 30 s to register, which a machine whose cores another process group holds can miss); the driver
printed Ray's traceback and exit code 1. Here Ray's GCS cannot start for real: the port it is told to use
(RAY_GCS_SERVER_PORT, which Ray reads) is already taken.
"""

from __future__ import annotations

import socket
import sqlite3

import pytest
from support.repo import subprocess_env
from support.sweeps import run_sweep

from cli import exit_codes

pytestmark = pytest.mark.slow  # Ray waits for a GCS that never answers: about 40 s, little CPU


def test_a_local_ray_instance_that_does_not_start_ends_the_sweep_in_one_error(tmp_path):
    store = tmp_path / "mlflow.db"
    with socket.create_server(("", 0)) as taken:
        env = {**subprocess_env(), "RAY_GCS_SERVER_PORT": str(taken.getsockname()[1])}
        done = run_sweep(["sweep=smoke", f"tracking.uri=sqlite:///{store}"], env=env, timeout=300)
    assert done.returncode == exit_codes.CLUSTER, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: a new local Ray instance did not start (Failed to start GCS"), last
    assert "no trial was started and nothing recorded" in last
    assert "Traceback" not in done.stdout + done.stderr
    if store.exists():  # the driver may have opened the store before Ray: then it holds no run
        with sqlite3.connect(store) as db:
            assert db.execute("select count(*) from runs").fetchone() == (0,)
