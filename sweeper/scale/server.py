"""The MLflow tracking server `python -m sweeper.scale_probe` measures the driver against, and its requests.

One `mlflow server` on 127.0.0.1 per auth mode, over one database (PostgreSQL of the `pgserver` wheel when
importable, else SQLite), each counting the requests it answered in its access log:

- off: no login, as the probe always ran;
- basic: `--app-name basic-auth` with MLflow's own settings: the password's hash checked on every request;
- cached: `--app-name basic-auth` with the recipes' settings (docker/mlflow/basic_auth.ini: its credential
  cache).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

AUTH_MODES = ("off", "basic", "cached")
RECIPE_AUTH = Path(__file__).resolve().parents[2] / "docker" / "mlflow" / "basic_auth.ini"
ADMIN = "admin"
# One line of uvicorn's access log: "POST /api/2.0/mlflow/runs/log-batch HTTP/1.1" 200
REQUEST = re.compile(r'"(?:GET|POST|PATCH|PUT|DELETE) (\S+?)(?:\?\S*)? HTTP/1\.1" \d{3}')
LOG_BATCH = "/api/2.0/mlflow/runs/log-batch"


def database(root: Path, store: str) -> str:
    """The servers' backend store: PostgreSQL (store auto or postgres, when possible) or SQLite under root."""
    try:
        import pgserver
    except ImportError:
        pgserver = None
    if store == "postgres" and pgserver is None:
        raise SystemExit(
            "error: --store=postgres needs the pgserver wheel (pip install pgserver 'psycopg[binary]')"
        )
    if store == "sqlite" or pgserver is None:
        return f"sqlite:///{root}/mlflow.db"
    server = pgserver.get_server(str(root / "pgdata"), cleanup_mode="stop")  # stopped when this process exits
    server.psql("CREATE DATABASE mlflow;")
    return server.get_uri("mlflow")


@dataclass(frozen=True)
class Server:
    uri: str
    auth: str  # one of AUTH_MODES
    log: Path
    credentials: dict[str, str]  # the client's environment: MLFLOW_TRACKING_USERNAME/PASSWORD, or none

    def requests(self) -> tuple[int, int]:
        """Requests answered so far: all of them, and the log-batch ones."""
        paths = REQUEST.findall(self.log.read_text())
        return len(paths), paths.count(LOG_BATCH)


@contextmanager
def tracking_server(root: Path, backend: str, auth: str, workers: int) -> Iterator[Server]:
    """An `mlflow server` over `backend` in the folder root/auth (its log, artifacts, basic_auth.db), with
    `workers` worker processes (MLflow's default: 4)."""
    folder = root / auth
    folder.mkdir()
    port, password = free_port(), secrets.token_urlsafe(16)
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend]
    command += ["--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", str(workers)]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner
    credentials = {}
    if auth != "off":
        command += ["--app-name", "basic-auth"]
        env.update(MLFLOW_AUTH_ADMIN_USERNAME=ADMIN, MLFLOW_AUTH_ADMIN_PASSWORD=password)
        env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = secrets.token_hex(16)
        if auth == "cached":
            env["MLFLOW_AUTH_CONFIG_PATH"] = str(RECIPE_AUTH)
        credentials = {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": password}
    server = Server(f"http://127.0.0.1:{port}", auth, folder / "mlflow-server.log", credentials)
    with server.log.open("w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=folder, env=env, start_new_session=True
        )
        try:
            wait_healthy(server, proc)
            yield server
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(server: Server, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"mlflow server exited with {proc.returncode}:\n{server.log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"{server.uri}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(
        f"mlflow server at {server.uri} did not answer within {seconds} s:\n{server.log.read_text()[-3000:]}"
    )
