"""The sweep driver as the single MLflow writer of its jobs' runs.

Trials report what they record through Ray Tune (sweeper.driver.trial.Recorded);
MlflowWriter, called by the sweep's session (sweeper.driver.session) on its writing
thread, writes it: one child run per job under one parent run per sweep (a
Tune trial trains one job, or a pack of them), one log_batch per job and
report: a report's points wait for the checkpoint they lead up to and go with its location in one request
(params and first tags too, in a run's first), as a tracking server with basic auth checks a password
hash on every request. So a SQLite store sees one writer and an HTTP server one client, whatever the
concurrency.

Exactly-once rests on two facts. The ledger (sweeper.driver.ledger): a job whose run
carries an outcome is not scheduled again. And deterministic training: a
resumed trial replays the steps after its checkpoint exactly, so the writer
drops every point at or below the run's last stored step for that metric,
and nothing is duplicated.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_ENTITIES_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH
from pyarrow.fs import LocalFileSystem
from ray import tune

from sweeper.driver import home
from sweeper.driver.trial import Artifact, Recorded, RunStart
from sweeper.driver.work import Member, Work
from tracking import store
from tracking.names import (
    CHECKPOINT_STEP,
    CONFIG_HASH,
    CONFIGURATION,
    MLFLOW_PARENT_RUN_ID,
    OUTCOME,
    PACK,
    PRUNED,
    SEED,
    STATUS,
    SUBGRIDS,
    SWEEP,
    TUNE_CHECKPOINT,
)
from tracking.run_tags import source_tags


def checkpoint_uri(checkpoint: tune.Checkpoint, storage: str | None) -> str:
    """A location Checkpoint(...) opens again: a plain path on a (shared) file system, else a URI with the
    query of the storage's (cluster.storage: s3://bucket/path?endpoint_override=..., a custom endpoint)."""
    if isinstance(checkpoint.filesystem, LocalFileSystem):
        return checkpoint.path
    query = urlsplit(storage).query if storage else ""
    return f"{checkpoint.filesystem.type_name}://{checkpoint.path}" + (f"?{query}" if query else "")


class Batch:
    """What waits to be written into one run: its params, points and tags, in one request when they fit."""

    def __init__(self) -> None:
        self.params: list[Param] = []
        self.metrics: list[Metric] = []
        self.tags: list[RunTag] = []

    def write(self, client: MlflowClient, run_id: str) -> None:
        """One log_batch; tags (a checkpoint's location) in a second when the points take several, so that a
        checkpoint is never recorded before every point leading up to it (MLflow splits a large batch)."""
        params_tags = len(self.params) + len(self.tags)
        if (
            len(self.metrics) + params_tags <= MAX_ENTITIES_PER_BATCH
            and params_tags <= MAX_PARAMS_TAGS_PER_BATCH
        ):
            client.log_batch(run_id, metrics=self.metrics, params=self.params, tags=self.tags)
            return
        client.log_batch(run_id, metrics=self.metrics, params=self.params)
        client.log_batch(run_id, tags=self.tags)


def _delete(checkpoint: tune.Checkpoint) -> None:
    try:
        checkpoint.filesystem.delete_dir(checkpoint.path)
    except (OSError, FileNotFoundError):
        pass  # already gone


class MlflowWriter:
    """Writes every job's report into its child run; runs in the driver only, on the session's thread.

    Keys: a Tune trial's key (sweeper.driver.work.TrialId) names its members in the work;
    everything else is keyed by job (config_hash), as the ledger is.
    """

    def __init__(
        self,
        client: MlflowClient,
        experiment: str,
        sweep: str,
        parent_id: str,
        work: Work,
        unfinished: dict[str, str],
        uri: str,
        storage: str | None = None,
    ) -> None:
        """unfinished: job -> the run without an outcome it continues (sweeper.driver.ledger); uri: the
        store's, whose home the checkpoints' locations are recorded relative to (sweeper.driver.home);
        storage: cluster.storage, whose URI's query (a custom endpoint) the checkpoints' locations keep."""
        self.client, self.uri, self.storage = client, uri, storage
        self.experiment, self.sweep, self.parent_id = experiment, sweep, parent_id
        self.trials, self.unfinished = work.trials, dict(unfinished)
        self.members: dict[str, Member] = {m.key: m for t in work.trials.values() for m in t.members}
        # job -> the checkpoint it would resume from; a checkpoint is deleted once no job holds it
        self.held = {k: tune.Checkpoint(m.resume_from) for k, m in self.members.items() if m.resume_from}
        self.runs: dict[str, str] = {}  # job -> run id, opened in this session
        self.logged: dict[str, dict[str, int]] = {}  # run id -> metric -> last stored step
        self.outcomes: dict[str, str] = {}  # job -> outcome, once it ended
        self.reported: dict[str, int] = {}  # job -> the last step its trial reported here
        self.resumable: dict[str, int] = {}  # job -> the step its latest recorded checkpoint resumes from
        self.pending: dict[str, Batch] = {}  # job -> what its trial reported, waiting for the checkpoint
        self.points_written = 0
        self.retries = 0  # trials Tune restarted after a failure
        self.source = source_tags()  # the driver's: it launched the sweep

    def _run(self, key: str, start: RunStart | None) -> str:
        """The job's run: opened once per session, continuing an unfinished one when there is one; its params
        and tags wait in the job's batch."""
        if key in self.runs:
            return self.runs[key]
        member = self.members[key]
        tags = {
            SWEEP: self.sweep,
            SUBGRIDS: ",".join(member.subgrids),
            CONFIG_HASH: key,
            SEED: str(member.seed),
            MLFLOW_PARENT_RUN_ID: self.parent_id,
            **(start.tags if start else {}),
            **(
                {CONFIGURATION: member.label} if member.label else {}
            ),  # the sweep's axes, which a trial lacks
            **self.source,
        }
        if member.pack:
            tags[PACK] = member.pack
        tags = {k: str(v) for k, v in tags.items()}
        params = dict(start.params if start else {})
        run_id = self.unfinished.get(key)
        if run_id is None:  # created with its tags in one call: the ledger finds every run it left
            run_id = self.client.create_run(self.experiment, run_name=member.name, tags=tags).info.run_id
            self.logged[run_id] = {}
        else:  # continued: its stored points are skipped, its params kept (MLflow forbids changing one)
            self.client.update_run(run_id, status="RUNNING")
            run = self.client.get_run(run_id)
            self.logged[run_id] = store.last_steps(self.client, run)
            params = {k: v for k, v in params.items() if k not in run.data.params}
        self.runs[key] = run_id
        batch = self.pending.setdefault(key, Batch())
        batch.params += [Param(k, v) for k, v in params.items()]
        batch.tags += [RunTag(k, v) for k, v in tags.items()]
        return run_id

    def result(self, recorded: dict[str, Recorded]) -> None:
        """A trial's report: what each of its jobs recorded since the last one."""
        for key, job_recorded in recorded.items():
            if job_recorded:
                self._write(key, job_recorded)

    def _write(self, key: str, recorded: Recorded) -> None:
        """One job's part of a report: its artifacts; its points and tags wait for the checkpoint
        (self.checkpoint), or are written with its end when training ended it."""
        run_id = self._run(key, recorded.start)
        logged = self.logged[run_id]
        batch = self.pending.setdefault(key, Batch())
        for name, value, step, timestamp in recorded.points:
            self.reported[key] = max(step, self.reported.get(key, 0))
            if step > logged.get(name, -1):
                batch.metrics.append(Metric(name, value, timestamp, step))
                logged[name] = step
        batch.tags += [RunTag(k, str(v)) for k, v in recorded.tags.items()]
        if recorded.status is not None:
            self._flush(key)
        self._artifacts(run_id, recorded.artifacts)
        if recorded.status is not None:  # training ended: the outcome tag came with this report's tags
            self.client.set_terminated(run_id, recorded.status)
            self.outcomes[key] = recorded.tags.get(OUTCOME, "")
            self._release(key)

    def _flush(self, key: str) -> None:
        """Write what waits for the job's run."""
        batch = self.pending.pop(key, None)
        if batch is not None:
            batch.write(self.client, self.runs[key])
            self.points_written += len(batch.metrics)

    def flush(self) -> None:
        """Write everything that waits: at the session's end, points whose checkpoint never came."""
        for key in list(self.pending):
            self._flush(key)

    def _release(self, key: str) -> None:
        """A job that ended needs no checkpoint to resume from (its last and best are its run's artifacts)."""
        checkpoint = self.held.pop(key, None)
        if checkpoint is not None and key in self.runs:
            self.client.delete_tag(self.runs[key], TUNE_CHECKPOINT)  # its CHECKPOINT_STEP means nothing now
        self._collect(checkpoint)

    def _collect(self, checkpoint: tune.Checkpoint | None) -> None:
        """Delete a checkpoint no job holds any more (a pack's is shared by its jobs)."""
        if checkpoint is not None and all(c.path != checkpoint.path for c in self.held.values()):
            _delete(checkpoint)

    def _artifacts(self, run_id: str, artifacts: list[Artifact]) -> None:
        if not artifacts:
            return
        with tempfile.TemporaryDirectory() as tmp:
            for folder, name, data in artifacts:
                where = Path(tmp) / (folder or "")
                where.mkdir(parents=True, exist_ok=True)
                (where / name).write_bytes(data)
            self.client.log_artifacts(run_id, tmp)

    def _keys(self, trial: str) -> list[str]:
        """The jobs Tune trial `trial` (its key) trains."""
        return [m.key for m in self.trials[trial].members]

    def checkpoint(self, trial: str, checkpoint: tune.Checkpoint) -> None:
        """A trial's checkpoint, recorded after the points of the same report.

        A restart then resumes from here and replays no unstored point; only then is the previous checkpoint
        deleted (Tune's num_to_keep would force an experiment-state snapshot per checkpoint, and that state
        is not what a restart relies on).
        """
        previous = []
        location = home.recorded(checkpoint_uri(checkpoint, self.storage), self.uri)
        for key in self._keys(trial):
            if key in self.runs and key not in self.outcomes:
                step = self.reported.get(key, 0)
                tags = [RunTag(TUNE_CHECKPOINT, location), RunTag(CHECKPOINT_STEP, str(step))]
                self.pending.setdefault(key, Batch()).tags += tags  # after the points they lead up to
                self._flush(key)
                self.resumable[key] = step
                previous.append(self.held.get(key))
                self.held[key] = checkpoint
        for old in [*previous, checkpoint]:  # the new one too: it may come after the trial's jobs ended
            self._collect(old)

    def complete(self, trial: str) -> None:
        """A trial ended; its jobs still without an outcome were stopped by the scheduler (ASHA): pruned,
        their runs FINISHED (tracking.names.STATUS), and never run again (the ledger)."""
        for key in self._keys(trial):
            if key in self.runs and key not in self.outcomes:
                self.pending.setdefault(key, Batch()).tags.append(RunTag(OUTCOME, PRUNED))
                self._flush(key)
                self.client.set_terminated(self.runs[key], STATUS[PRUNED])
                self.outcomes[key] = PRUNED
                self._release(key)

    def recovered(self, trial: str) -> None:
        """Tune restarts it from its last checkpoint; the writer drops replayed points."""
        self.retries += 1
        for key in self._keys(trial):
            self._flush(key)

    def failed(self, trial: str) -> None:
        """Out of retries: the runs stay without an outcome, so the next start of the sweep tries again."""
        for key in self._keys(trial):
            if key in self.runs and key not in self.outcomes:
                self._flush(key)
                self.client.set_terminated(self.runs[key], "FAILED")

    def interrupted(self) -> list[str]:
        """The runs of jobs that started here and have not ended."""
        return [run_id for key, run_id in self.runs.items() if key not in self.outcomes]
