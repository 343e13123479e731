"""The ledger of a sweep: what the tracking store already holds for it, from one read of the experiment.

Exactly-once rests on it: a job (config_hash, which includes the seed) whose
run carries an outcome tag of tracking.names.ENDED is done, in whatever sweep
or plain `sweeper.train` it ran, and is not scheduled again. This sweep's runs
without an outcome are continued in place, from the Tune checkpoint they
recorded. The parent run is found by one rule (tracking.parent_run.is_parent).

The driver reads the ledger, and adopts the finished runs it skips, through its hold on the sweep
(sweeper.driver.hold), which reads it again only when another driver ran the sweep since.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mlflow.entities import Run, RunTag
from mlflow.tracking import MlflowClient

from tracking import parent_run
from tracking.names import (
    CHECKPOINT_STEP,
    CONFIG_HASH,
    ENDED,
    OUTCOME,
    STATUS,
    SUBGRIDS,
    SWEEP,
    TUNE_CHECKPOINT,
    outcome,
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
            min((outcome(r.data.tags) for r in self.finished[key]), key=ENDED.index)
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
        elif outcome(tags) in ENDED:
            ledger.done.add(key)
            ledger.finished.setdefault(key, []).append(run)
            if run.info.status == "RUNNING":  # the driver died between the outcome tag and closing the run
                ledger.unclosed[run.info.run_id] = STATUS[outcome(tags)]
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
