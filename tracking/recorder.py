"""Where a run's params, tags, metrics and artifacts go: the Recorder interface.

train() talks only to a Recorder. tracking.mlflow_recorder.MlflowRecorder writes to
an MLflow tracking store (a SQLite file or an HTTP server) in batches; MemoryRecorder
keeps everything in memory (tests, benchmarks). A sweep supplies its own Recorder
that forwards to Ray Tune, so the sweep driver stays the single MLflow writer.
This module imports no MLflow: a sweep's trials (training/) never load it, which
saves each Ray worker most of a second of CPU.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Protocol

REPO_DIR = Path(__file__).resolve().parent.parent


class Recorder(Protocol):
    """What train() records. Metric points may be buffered until flush()."""

    def start(
        self, name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None = None
    ) -> str:
        """Open a new run (run_id None) or reopen run_id to continue it; return the run id."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def flush(self) -> None:
        """Make every metric point logged so far durable (called before each checkpoint)."""

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Store the file `path` under the run's artifact folder `artifact_path` (None: the root)."""

    def finish(self, status: str) -> None:
        """Close the run with an MLflow status: FINISHED, FAILED or KILLED."""


def git_commit() -> str:
    """The code version of a run: HEAD's hash, '-dirty' when tracked files differ from it.

    Without a git checkout (docker/Dockerfile's image holds no .git), the GIT_COMMIT
    environment variable, which the image sets from its build argument.
    """

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=REPO_DIR, capture_output=True, text=True, timeout=10)

    fallback = os.environ.get("GIT_COMMIT") or "unknown"
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return fallback
        dirty = git("diff", "--quiet", "HEAD").returncode != 0
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return fallback


class MemoryRecorder:
    """Keeps a run in memory: params, tags, metric histories {key: [(step, value)]}, artifacts."""

    def __init__(self) -> None:
        self.params: dict[str, str] = {}
        self.tags: dict[str, str] = {}
        self.metrics: dict[str, list[tuple[int, float]]] = {}
        self.artifacts: list[str] = []
        self.status = "RUNNING"

    def start(
        self, name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None = None
    ) -> str:
        self.params.update(params)
        self.tags.update(tags, name=name)
        return run_id or "memory"

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.metrics.setdefault(key, []).append((step, float(value)))

    def flush(self) -> None:
        pass

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.artifacts.append(f"{artifact_path}/{path.name}" if artifact_path else path.name)

    def finish(self, status: str) -> None:
        self.status = status
