"""The sweep driver as the single MLflow writer, and its ledger of finished trials.

Trials report what they record through Ray Tune (sweeper.trial); MlflowWriter,
a Tune callback in the driver, writes it: one child run per trial under one
parent run per sweep, one log_batch per report. So a SQLite store sees one
writer and an HTTP server one client, whatever the concurrency.

Exactly-once rests on two facts. The ledger: a (config_hash, seed) — the
config_hash includes the seed — whose run carries an outcome tag is done and
is not scheduled again. And deterministic training: a resumed trial replays
the steps after its checkpoint exactly, so the writer drops every point at or
below the run's last stored step for that metric, and nothing is duplicated.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from pyarrow.fs import LocalFileSystem
from ray import tune

from sweeper.metrics import CONFIG_HASH, DIVERGED, FINISHED, OUTCOME, SEED, STOPPED, SUBGRIDS, SWEEP, TUNE_CHECKPOINT
from sweeper.trial import PAYLOAD

DONE = (FINISHED, DIVERGED, STOPPED)  # outcomes that end a trial for good (a diverged one is not retried)
STATUS = {FINISHED: "FINISHED", DIVERGED: "FAILED", STOPPED: "KILLED"}  # MLflow run status per outcome
BATCH = 1000                 # MLflow's limit of metrics per log_batch


@dataclass
class Ledger:
    """What the tracking store already holds for a sweep."""

    parent_id: str | None = None
    done: set[str] = field(default_factory=set)                 # config_hash of trials with an outcome
    unfinished: dict[str, str] = field(default_factory=dict)    # config_hash -> run id to continue
    resume_from: dict[str, str] = field(default_factory=dict)   # config_hash -> Tune checkpoint path


def experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found else client.create_experiment(name, artifact_location=artifact_location)


def _search(client: MlflowClient, experiment: str, query: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment], query, max_results=5000, page_token=token)
        runs += page
        token = page.token
        if not token:
            return runs


def read_ledger(client: MlflowClient, experiment: str, sweep: str) -> Ledger:
    """Finished trials anywhere in the experiment; this sweep's parent and unfinished children."""
    ledger = Ledger()
    for outcome in DONE:
        for run in _search(client, experiment, f"tags.{OUTCOME} = '{outcome}'"):
            ledger.done.add(run.data.tags.get(CONFIG_HASH))
            if run.info.status == "RUNNING":  # the driver died between the outcome tag and closing the run
                client.set_terminated(run.info.run_id, STATUS[outcome])
    for run in sorted(_search(client, experiment, f"tags.{SWEEP} = '{sweep}'"), key=lambda r: r.info.start_time):
        tags = run.data.tags
        if CONFIG_HASH not in tags:
            ledger.parent_id = ledger.parent_id or run.info.run_id
        elif OUTCOME not in tags and tags[CONFIG_HASH] not in ledger.done:
            ledger.unfinished[tags[CONFIG_HASH]] = run.info.run_id
            if TUNE_CHECKPOINT in tags:
                ledger.resume_from[tags[CONFIG_HASH]] = tags[TUNE_CHECKPOINT]
    return ledger


def checkpoint_uri(checkpoint: tune.Checkpoint) -> str:
    """A location Checkpoint(...) opens again: a plain path on a (shared) file system, else a URI."""
    if isinstance(checkpoint.filesystem, LocalFileSystem):
        return checkpoint.path
    return f"{checkpoint.filesystem.type_name}://{checkpoint.path}"


def _delete(checkpoint: tune.Checkpoint | None) -> None:
    if checkpoint is not None:
        try:
            checkpoint.filesystem.delete_dir(checkpoint.path)
        except (OSError, FileNotFoundError):
            pass  # already gone


class MlflowWriter(tune.Callback):
    """Writes every trial's report into its child run; runs in the driver only."""

    def __init__(self, uri: str, experiment: str, sweep: str, parent_id: str, jobs: dict[str, dict],
                 ledger: Ledger) -> None:
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment, self.sweep, self.parent_id = experiment, sweep, parent_id
        self.jobs, self.unfinished = jobs, dict(ledger.unfinished)
        self.checkpoints = {k: tune.Checkpoint(p) for k, p in ledger.resume_from.items()}  # the one each run names
        self.runs: dict[str, str] = {}                  # config_hash -> run id, opened in this session
        self.logged: dict[str, dict[str, int]] = {}     # run id -> metric -> last stored step
        self.outcomes: dict[str, str] = {}              # config_hash -> outcome, once the trial ended
        self.points_written = 0
        self.retries = 0                                # trials Tune restarted after a failure

    def _run(self, key: str, start: dict | None) -> str:
        """The trial's run: opened once per session, continuing an unfinished one when there is one."""
        if key in self.runs:
            return self.runs[key]
        job = self.jobs[key]
        tags = {SWEEP: self.sweep, SUBGRIDS: ",".join(job["subgrids"]), CONFIG_HASH: key, SEED: str(job["seed"]),
                MLFLOW_PARENT_RUN_ID: self.parent_id, **(start or {}).get("tags", {})}
        tags = {k: str(v) for k, v in tags.items()}
        params = dict((start or {}).get("params", {}))
        run_id = self.unfinished.get(key)
        if run_id is None:  # created with its tags in one call: the ledger finds every run it left
            run_id = self.client.create_run(self.experiment, run_name=job["name"], tags=tags).info.run_id
            self.logged[run_id] = {}
        else:  # continued: its stored points are skipped, its params kept (MLflow forbids changing one)
            self.client.update_run(run_id, status="RUNNING")
            run = self.client.get_run(run_id)
            self.logged[run_id] = {k: max(m.step for m in self.client.get_metric_history(run_id, k))
                                   for k in run.data.metrics}
            params = {k: v for k, v in params.items() if k not in run.data.params}
        self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                              tags=[RunTag(k, v) for k, v in tags.items()])
        self.runs[key] = run_id
        return run_id

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        payload = result.pop(PAYLOAD, None)  # popped: Tune need not keep points and bytes in its state
        if payload is None:
            return
        key = trial.config["key"]
        run_id = self._run(key, payload.get("start"))
        logged = self.logged[run_id]
        points = []
        for name, value, step, timestamp in payload.get("points", []):
            if step > logged.get(name, -1):
                points.append(Metric(name, value, timestamp, step))
                logged[name] = step
        tags = [RunTag(k, str(v)) for k, v in payload.get("tags", {}).items()]
        for i in range(0, max(len(points), 1), BATCH):
            self.client.log_batch(run_id, metrics=points[i:i + BATCH], tags=tags if i == 0 else [])
        self.points_written += len(points)
        self._artifacts(run_id, payload.get("artifacts", []))
        if "status" in payload:  # train() ended: the outcome tag came with this payload's tags
            self.client.set_terminated(run_id, payload["status"])
            self.outcomes[key] = payload.get("tags", {}).get(OUTCOME, "")
            self._drop_checkpoint(key, run_id)

    def _drop_checkpoint(self, key: str, run_id: str) -> None:
        """A trial that ended needs no checkpoint to resume from (its last and best are artifacts of the run)."""
        checkpoint = self.checkpoints.pop(key, None)
        if checkpoint is not None:
            _delete(checkpoint)
            self.client.delete_tag(run_id, TUNE_CHECKPOINT)

    def _artifacts(self, run_id: str, artifacts: list) -> None:
        if not artifacts:
            return
        with tempfile.TemporaryDirectory() as tmp:
            for artifact_path, name, data in artifacts:
                folder = Path(tmp) / (artifact_path or "")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(data)
            self.client.log_artifacts(run_id, tmp)

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        # Recorded after the points of the same report, so a restart resumes from here and replays no
        # unstored point; only then is the previous checkpoint deleted (Tune's num_to_keep would force an
        # experiment-state snapshot per checkpoint, and that state is not what a restart relies on).
        key = trial.config["key"]
        if key in self.runs:
            self.client.set_tag(self.runs[key], TUNE_CHECKPOINT, checkpoint_uri(checkpoint))
            _delete(self.checkpoints.get(key))
            self.checkpoints[key] = checkpoint

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        key = trial.config["key"]
        if key in self.runs and key not in self.outcomes:  # ended without train() ending: the scheduler stopped it
            self.client.log_batch(self.runs[key], tags=[RunTag(OUTCOME, STOPPED)])
            self.client.set_terminated(self.runs[key], STATUS[STOPPED])
            self.outcomes[key] = STOPPED
            self._drop_checkpoint(key, self.runs[key])

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self.retries += 1  # Tune restarts it from its last checkpoint; the writer drops replayed points

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        # Out of retries: the run stays without an outcome, so the next start of the sweep tries again.
        run_id = self.runs.get(trial.config["key"])
        if run_id is not None:
            self.client.set_terminated(run_id, "FAILED")

    def finish_parent(self, complete: bool) -> None:
        self.client.set_terminated(self.parent_id, "FINISHED" if complete else "FAILED")
