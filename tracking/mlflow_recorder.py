"""MlflowRecorder: a Recorder (tracking.recorder) that writes a run to an MLflow tracking store."""

from __future__ import annotations

import time
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from tracking import store
from tracking.errors import TrackingError


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
            experiment = store.ensure_experiment(self.client, self.experiment)
            run = self.client.create_run(experiment, run_name=name, tags=tags)
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
