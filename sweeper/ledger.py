"""The ledger of a sweep: what the tracking store already holds for it, from one read of the experiment.

Exactly-once rests on it: a job (config_hash, which includes the seed) whose
run carries an outcome tag of tracking.names.ENDED is done, in whatever sweep
or plain `sweeper.train` it ran, and is not scheduled again. This sweep's runs
without an outcome are continued in place, from the Tune checkpoint they
recorded. The parent run is found by one rule (tracking.parent_run.is_parent).

A driver takes hold of the sweep (take_hold): it reads the store once (one search of the experiment) and
adopts the finished runs it skips; when anything is left to run, and once its Ray cluster has accepted the
sweep (a refusal leaves no parent run behind), it locks the sweep's parent run against a second driver
(Hold.locked, sweeper.lock). Between the read and the lock another driver could have run the sweep: the
parent run then has another end time, or is not the one the read found nor the one this driver made, and
the ledger is read again.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

from mlflow.entities import Run, RunTag
from mlflow.tracking import MlflowClient

from config.grid import Job
from sweeper.lock import DriverLock
from tracking import parent_run, store, view
from tracking.names import (
    CHECKPOINT_STEP,
    CONFIG_HASH,
    ENDED,
    OUTCOME,
    STATUS,
    SUBGRIDS,
    SWEEP,
    TUNE_CHECKPOINT,
)


@dataclass
class Ledger:
    """What the tracking store holds for a sweep, as one read of its experiment found it."""

    parent: Run | None = None  # the sweep's parent run
    done: set[str] = field(default_factory=set)  # config_hash of jobs with an outcome
    finished: dict[str, list[Run]] = field(default_factory=dict)  # config_hash -> its runs with an outcome
    unfinished: dict[str, str] = field(default_factory=dict)  # config_hash -> run id to continue
    resume_from: dict[str, str] = field(default_factory=dict)  # config_hash -> Tune checkpoint, as recorded
    resume_step: dict[str, int] = field(default_factory=dict)  # config_hash -> the step it resumes from
    unclosed: dict[str, str] = field(
        default_factory=dict
    )  # run id -> status, of runs with an outcome left RUNNING

    def earlier(self, keys: set[str]) -> Counter:
        """The outcomes jobs `keys` have, each job counted once (a rerun carries its config_hash too)."""
        outcomes = (
            min((r.data.tags[OUTCOME] for r in self.finished[key]), key=ENDED.index)
            for key in keys & self.done
        )
        return Counter(outcomes)


def read(runs: list[Run], sweep: str) -> Ledger:
    """The ledger of `sweep` from every active run of its experiment (one search, tracking.store.search)."""
    ledger = Ledger()
    ordered = sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))
    parents = []
    for run in ordered:
        tags = run.data.tags
        key = tags.get(CONFIG_HASH)
        if parent_run.is_parent(run, sweep):
            parents.append(run)
        elif tags.get(OUTCOME) in ENDED:
            ledger.done.add(key)
            ledger.finished.setdefault(key, []).append(run)
            if run.info.status == "RUNNING":  # the driver died between the outcome tag and closing the run
                ledger.unclosed[run.info.run_id] = STATUS[tags[OUTCOME]]
    for run in ordered:  # a job's latest unfinished run is the one to continue
        tags = run.data.tags
        mine = tags.get(SWEEP) == sweep and CONFIG_HASH in tags
        if mine and OUTCOME not in tags and tags[CONFIG_HASH] not in ledger.done:
            key = tags[CONFIG_HASH]
            ledger.unfinished[key] = run.info.run_id
            # Its own checkpoint, or none: not an older run's, whose points up to it this run lacks.
            ledger.resume_from.pop(key, None)
            ledger.resume_step.pop(key, None)
            if TUNE_CHECKPOINT in tags:
                ledger.resume_from[key] = tags[TUNE_CHECKPOINT]
                ledger.resume_step[key] = int(tags.get(CHECKPOINT_STEP, 0))
    ledger.parent = parents[0] if parents else None  # the oldest: two drivers started at once keep it
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


class Hold:
    """A sweep's ledger as one driver holds it: read once at its start, then locked (the module docstring)."""

    def __init__(
        self, uri: str, experiment: str, sweep: str, jobs: list[Job], client: MlflowClient | None = None
    ) -> None:
        self.uri, self.sweep, self.jobs = uri, sweep, jobs
        self.client = client or store.connect(uri)  # probes the store first: unreachable fails here, fast
        self.experiment = store.ensure_experiment(self.client, experiment)
        view.install(self.client, self.experiment)
        self.ledger = self._read()
        self.parent_id: str | None = None  # the parent run this driver locked
        self.lock: DriverLock | None = None  # its lock, while held

    def _read(self) -> Ledger:
        found = read(store.search(self.client, [self.experiment]), self.sweep)
        for run_id, status in found.unclosed.items():
            self.client.set_terminated(run_id, status)
        return found

    def adopt(self) -> int:
        """Tag the finished runs this sweep skips as its own too (adopt); how many changed."""
        return adopt(
            self.client, self.ledger, self.sweep, {j.key: j.configuration.subgrids for j in self.jobs}
        )

    def pending(self) -> list[Job]:
        return [j for j in self.jobs if j.key not in self.ledger.done]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """This driver alone on the sweep, its parent run found or made; else sweeper.lock.SweepLocked."""
        seen = self.ledger.parent
        parent_id, created = self._parent()
        lock = DriverLock(self.client, parent_id, self.sweep)
        lock.take()
        self.parent_id, self.lock = parent_id, lock
        try:
            if not created and (seen is None or _ended(self.client.get_run(parent_id)) != _ended(seen)):
                self.ledger = self._read()  # another driver made the parent, or ran the sweep, after the read
            yield
        finally:
            lock.release()

    def _parent(self) -> tuple[str, bool]:
        """The parent run's id, and whether this driver created it.

        The one the read found, else a new one; of two made at once, both drivers keep the oldest.
        """
        if self.ledger.parent is not None:
            return self.ledger.parent.info.run_id, False
        name = parent_run.name_of(self.sweep)
        mine = self.client.create_run(self.experiment, run_name=name, tags={SWEEP: self.sweep}).info.run_id
        oldest = parent_run.find_parent(self.client, self.experiment, self.sweep)
        if oldest != mine:
            self.client.delete_run(mine)
        return oldest, oldest == mine


def take_hold(uri: str, experiment: str, sweep: str, jobs: list[Job]) -> Hold:
    """The sweep's ledger read once and the finished runs it skips adopted; not locked yet (Hold.locked)."""
    hold = Hold(uri, experiment, sweep, jobs)
    adopted = hold.adopt()
    if adopted:
        print(f"{adopted} runs finished outside this sweep now carry sweep={sweep} too")
    return hold


def _ended(run: Run) -> tuple:
    """What a driver that ran the sweep changed on its parent run: it finished it, or stopped it."""
    return run.info.status, run.info.end_time
