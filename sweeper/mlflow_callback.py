"""The sweep driver as the single MLflow writer, and its ledger of finished trials.

Trials report what they record through Ray Tune (sweeper.trial); MlflowWriter,
a Tune callback in the driver, writes it: one child run per model under one
parent run per sweep (a trial trains one model, or a pack of them), one
log_batch per model and report. So a SQLite store sees one writer and an HTTP
server one client, whatever the concurrency.

Exactly-once rests on two facts. The ledger: a (config_hash, seed) — the
config_hash includes the seed — whose run carries an outcome tag is done and
is not scheduled again. And deterministic training: a resumed trial replays
the steps after its checkpoint exactly, so the writer drops every point at or
below the run's last stored step for that metric, and nothing is duplicated.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from pyarrow.fs import LocalFileSystem
from ray import tune

from sweeper import parent_run
from sweeper.trial import PAYLOAD
from tracking import store
from tracking.names import (
    CONFIG_HASH,
    DIVERGED,
    FINISHED,
    OUTCOME,
    PACK,
    SEED,
    STOPPED,
    SUBGRIDS,
    SWEEP,
    TUNE_CHECKPOINT,
)
from tracking.run_tags import source_tags  # the driver's: it launched the sweep

DONE = (FINISHED, DIVERGED, STOPPED)  # outcomes that end a trial for good (a diverged one is not retried)
STATUS = {FINISHED: "FINISHED", DIVERGED: "FAILED", STOPPED: "KILLED"}  # MLflow run status per outcome
BATCH = 1000  # MLflow's limit of metrics per log_batch


@dataclass
class Ledger:
    """What the tracking store already holds for a sweep."""

    parent_id: str | None = None
    done: set[str] = field(default_factory=set)  # config_hash of trials with an outcome
    unfinished: dict[str, str] = field(default_factory=dict)  # config_hash -> run id to continue
    resume_from: dict[str, str] = field(default_factory=dict)  # config_hash -> Tune checkpoint path
    finished: dict[str, list] = field(default_factory=dict)  # config_hash -> its runs with an outcome


def read_ledger(client: MlflowClient, experiment: str, sweep: str) -> Ledger:
    """Finished trials anywhere in the experiment; this sweep's parent and unfinished children."""
    ledger = Ledger()
    for outcome in DONE:
        for run in store.search(client, [experiment], f"tags.{OUTCOME} = '{outcome}'"):
            ledger.done.add(run.data.tags.get(CONFIG_HASH))
            ledger.finished.setdefault(run.data.tags.get(CONFIG_HASH), []).append(run)
            if run.info.status == "RUNNING":  # the driver died between the outcome tag and closing the run
                client.set_terminated(run.info.run_id, STATUS[outcome])
    this_sweep = store.search(client, [experiment], f"tags.{SWEEP} = '{sweep}'")
    ledger.parent_id = parent_run.oldest(this_sweep)
    for run in sorted(this_sweep, key=lambda r: (r.info.start_time, r.info.run_id)):
        tags = run.data.tags
        if CONFIG_HASH in tags and OUTCOME not in tags and tags[CONFIG_HASH] not in ledger.done:
            ledger.unfinished[tags[CONFIG_HASH]] = run.info.run_id
            if TUNE_CHECKPOINT in tags:
                ledger.resume_from[tags[CONFIG_HASH]] = tags[TUNE_CHECKPOINT]
    return ledger


def adopt(client: MlflowClient, ledger: Ledger, sweep: str, subgrids: dict[str, tuple[str, ...]]) -> int:
    """Add `sweep` and its sub-grids to the tags of the finished runs it skips; returns how many runs changed.

    subgrids: config_hash -> the sweep's sub-grids naming it. A run finished by a plain `sweeper.train` or by
    another sweep then belongs to this sweep too (the tags are comma-separated lists, extended, never
    overwritten), so `select.sweep=NAME` finds every configuration of the sweep.
    """
    changed = 0
    for key, names in subgrids.items():
        for run in ledger.finished.get(key, []):
            tags = {
                SWEEP: _extended(run.data.tags.get(SWEEP), [sweep]),
                SUBGRIDS: _extended(run.data.tags.get(SUBGRIDS), names),
            }
            tags = {k: v for k, v in tags.items() if v != run.data.tags.get(k)}
            if tags:
                client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
                changed += 1
    return changed


def _extended(listed: str | None, names) -> str:
    have = [n for n in (listed or "").split(",") if n]
    return ",".join(have + [n for n in names if n not in have])


def checkpoint_uri(checkpoint: tune.Checkpoint) -> str:
    """A location Checkpoint(...) opens again: a plain path on a (shared) file system, else a URI."""
    if isinstance(checkpoint.filesystem, LocalFileSystem):
        return checkpoint.path
    return f"{checkpoint.filesystem.type_name}://{checkpoint.path}"


def _delete(checkpoint: tune.Checkpoint) -> None:
    try:
        checkpoint.filesystem.delete_dir(checkpoint.path)
    except (OSError, FileNotFoundError):
        pass  # already gone


class MlflowWriter(tune.Callback):
    """Writes every model's report into its child run; runs in the driver only.

    Keys: a trial's key (trial.config["key"]) names its models in `packs`;
    everything else is keyed by model (config_hash), as the ledger is.
    """

    def __init__(
        self,
        uri: str,
        experiment: str,
        sweep: str,
        parent_id: str,
        jobs: dict[str, dict],
        packs: dict[str, list[str]],
        ledger: Ledger,
    ) -> None:
        self.client = store.connect(uri)
        self.experiment, self.sweep, self.parent_id = experiment, sweep, parent_id
        self.jobs, self.packs, self.unfinished = jobs, packs, dict(ledger.unfinished)
        # model -> the checkpoint it would resume from; a checkpoint is deleted once no model holds it
        self.held = {k: tune.Checkpoint(p) for k, p in ledger.resume_from.items() if k in jobs}
        self.runs: dict[str, str] = {}  # model -> run id, opened in this session
        self.logged: dict[str, dict[str, int]] = {}  # run id -> metric -> last stored step
        self.outcomes: dict[str, str] = {}  # model -> outcome, once it ended
        self.points_written = 0
        self.retries = 0  # trials Tune restarted after a failure

    def _run(self, key: str, start: dict | None) -> str:
        """The model's run: opened once per session, continuing an unfinished one when there is one."""
        if key in self.runs:
            return self.runs[key]
        job = self.jobs[key]
        tags = {
            SWEEP: self.sweep,
            SUBGRIDS: ",".join(job["subgrids"]),
            CONFIG_HASH: key,
            SEED: str(job["seed"]),
            MLFLOW_PARENT_RUN_ID: self.parent_id,
            **(start or {}).get("tags", {}),
            **source_tags(),
        }
        if job.get("pack"):
            tags[PACK] = job["pack"]
        tags = {k: str(v) for k, v in tags.items()}
        params = dict((start or {}).get("params", {}))
        run_id = self.unfinished.get(key)
        if run_id is None:  # created with its tags in one call: the ledger finds every run it left
            run_id = self.client.create_run(self.experiment, run_name=job["name"], tags=tags).info.run_id
            self.logged[run_id] = {}
        else:  # continued: its stored points are skipped, its params kept (MLflow forbids changing one)
            self.client.update_run(run_id, status="RUNNING")
            run = self.client.get_run(run_id)
            self.logged[run_id] = store.last_steps(self.client, run)
            params = {k: v for k, v in params.items() if k not in run.data.params}
        self.client.log_batch(
            run_id,
            params=[Param(k, v) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        self.runs[key] = run_id
        return run_id

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        payloads = result.pop(PAYLOAD, None)  # popped: Tune need not keep points and bytes in its state
        for key, payload in (payloads or {}).items():
            if payload:
                self._write(key, payload)

    def _write(self, key: str, payload: dict) -> None:
        """One model's part of a report: its points, tags and artifacts; its end when training ended it."""
        run_id = self._run(key, payload.get("start"))
        logged = self.logged[run_id]
        points = []
        for name, value, step, timestamp in payload.get("points", []):
            if step > logged.get(name, -1):
                points.append(Metric(name, value, timestamp, step))
                logged[name] = step
        tags = [RunTag(k, str(v)) for k, v in payload.get("tags", {}).items()]
        for i in range(0, max(len(points), 1), BATCH):
            self.client.log_batch(run_id, metrics=points[i : i + BATCH], tags=tags if i == 0 else [])
        self.points_written += len(points)
        self._artifacts(run_id, payload.get("artifacts", []))
        if "status" in payload:  # training ended: the outcome tag came with this payload's tags
            self.client.set_terminated(run_id, payload["status"])
            self.outcomes[key] = payload.get("tags", {}).get(OUTCOME, "")
            self._release(key)

    def _release(self, key: str) -> None:
        """A model that ended needs no checkpoint to resume from (its last and best are artifacts of its run)."""
        checkpoint = self.held.pop(key, None)
        if checkpoint is not None and key in self.runs:
            self.client.delete_tag(self.runs[key], TUNE_CHECKPOINT)
        self._collect(checkpoint)

    def _collect(self, checkpoint: tune.Checkpoint | None) -> None:
        """Delete a checkpoint no model holds any more (a pack's is shared by its models)."""
        if checkpoint is not None and all(c.path != checkpoint.path for c in self.held.values()):
            _delete(checkpoint)

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
        previous = []
        for key in self.packs[trial.config["key"]]:
            if key in self.runs and key not in self.outcomes:
                self.client.set_tag(self.runs[key], TUNE_CHECKPOINT, checkpoint_uri(checkpoint))
                previous.append(self.held.get(key))
                self.held[key] = checkpoint
        for old in [*previous, checkpoint]:  # the new one too: it may come after the trial's models ended
            self._collect(old)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        for key in self.packs[trial.config["key"]]:
            if (
                key in self.runs and key not in self.outcomes
            ):  # ended without training ending: a scheduler stop
                self.client.log_batch(self.runs[key], tags=[RunTag(OUTCOME, STOPPED)])
                self.client.set_terminated(self.runs[key], STATUS[STOPPED])
                self.outcomes[key] = STOPPED
                self._release(key)

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self.retries += 1  # Tune restarts it from its last checkpoint; the writer drops replayed points

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        # Out of retries: the runs stay without an outcome, so the next start of the sweep tries again.
        for key in self.packs[trial.config["key"]]:
            if key in self.runs and key not in self.outcomes:
                self.client.set_terminated(self.runs[key], "FAILED")

    def finish_parent(self, complete: bool) -> None:
        self.client.set_terminated(self.parent_id, "FINISHED" if complete else "FAILED")


class ParentProgress(tune.Callback):
    """Keeps the sweep's parent run's trial counts current (sweeper.parent_run.log_counts).

    Listed after the MlflowWriter, so it sees each trial's outcome once the writer has recorded it.
    """

    def __init__(self, writer: MlflowWriter, planned: int, earlier: Counter) -> None:
        self.writer, self.planned, self.earlier = writer, planned, earlier
        self.shown: Counter | None = None
        self.update()

    def update(self) -> None:
        ended = self.earlier + Counter(self.writer.outcomes.values())
        if ended != self.shown:
            parent_run.log_counts(self.writer.client, self.writer.parent_id, ended, self.planned)
            self.shown = ended

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.update()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.update()

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.update()
