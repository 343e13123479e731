"""Real MLflow servers on 127.0.0.1 at free ports, stopped with their whole process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# MLflow 3's server also starts a job runner (huey consumers, outside its process group) that these tests
# never use: off, so stopping a server stops all of it.
SERVER_ENV = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM a process started with start_new_session=True and its children; SIGKILL after `timeout` s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 at a fixed free port over `backend` (any store URI), artifacts in
    `root`.

    stop() and start() again on the same port: a tracking-server outage, as clients see one. options: more of
    `mlflow server`'s (`--app-name basic-auth`), env: more of its environment; it runs in `root`.
    """

    START_TIMEOUT_S = 180  # a cold `mlflow server` on two busy cores takes a while

    def __init__(
        self, backend: str, root: Path, options: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> None:
        self.backend, self.root, self.port = backend, root, free_port()
        self.options, self.env = options, env or {}
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--backend-store-uri",
            self.backend,
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--workers",
            "1",
            *self.options,
        ]
        with open(self.log, "ab") as out:  # its own process group: the server forks workers, stopped together
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={**SERVER_ENV, **self.env},
                start_new_session=True,
            )
        wait_until_up(self.uri, self.proc, self.log, self.START_TIMEOUT_S)

    def stop(self) -> None:
        try:
            stop_group(self.proc, timeout=20)
        except ProcessLookupError:  # already stopped
            pass


def wait_until_up(uri: str, proc: subprocess.Popen, log: Path, seconds: float) -> None:
    """Wait until the MLflow server `proc` at `uri` answers /health; its `log` is in the error if it does
    not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(
        f"mlflow server at {uri} did not answer within {seconds} s:\n{log.read_text()[-3000:]}"
    )
