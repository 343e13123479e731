"""Where a run's params, tags, metrics and artifacts go: the Recorder interface.

train() talks only to a Recorder. MlflowRecorder writes to an MLflow tracking
store (a SQLite file or an HTTP server) in batches; MemoryRecorder keeps
everything in memory (tests, benchmarks). A sweep supplies its own Recorder
that forwards to Ray Tune, so the sweep driver stays the single MLflow writer.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Protocol

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from tracking import store
from tracking.store import TrackingError

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


class MlflowRecorder:
    """Records into an MLflow experiment, one log_batch call per flush."""

    def __init__(self, uri: str, experiment: str, tags: dict[str, str] | None = None) -> None:
        self.uri, self.experiment = uri, experiment
        self.extra_tags = dict(tags or {})  # e.g. rerun_of, sweep: added to every run this recorder opens
        self.client = store.connect(uri)
        self.run_id: str | None = None
        self._pending: list[Metric] = []
        self._logged_up_to: dict[str, int] = {}

    def start(
        self, name: str, params: dict[str, str], tags: dict[str, str], run_id: str | None = None
    ) -> str:
        tags = {**tags, **self.extra_tags}
        if run_id is None:
            run = self.client.create_run(
                store.experiment_id(self.client, self.experiment), run_name=name, tags=tags
            )
            self.run_id = run.info.run_id
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in params.items()])
            return self.run_id
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            raise TrackingError(
                f"cannot continue MLflow run {run_id}: it is not in {self.uri}; "
                "start over with train.resume=never"
            ) from None
        self.run_id = run_id
        self.client.update_run(run_id, status="RUNNING")
        # Points logged after the checkpoint we resume from are already stored:
        # the replayed steps reproduce them exactly, so they are skipped, not duplicated.
        self._logged_up_to = store.last_steps(self.client, run)
        self.set_tags(tags)
        return run_id

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self._pending += [
            Metric(key, float(value), now, step)
            for key, value in metrics.items()
            if step > self._logged_up_to.get(key, -1)
        ]

    def flush(self) -> None:
        if self._pending:
            self.client.log_batch(self.run_id, metrics=self._pending)
            self._pending = []

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def finish(self, status: str) -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status)


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
