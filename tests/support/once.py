"""The one check that a sweep did its work exactly once, whatever stopped, moved or doubled its driver:
every job has one MLflow run (none without, none with two, no run of a job the sweep does not have), and
every metric point of each run is stored once and none is lost, against what the run's configuration logs.
A failure names each run and point at fault, one line each (tests/test_once.py plants each fault)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from config.compose import compose
from config.grid import Job
from config.identity import run_overrides
from support.histories import expected_counts, histories
from support.sweeps import children
from tracking.names import CONFIG_HASH

SHOWN = 20  # faults listed in a failure; the first line counts them all


@dataclass(frozen=True)
class Stored:
    """What a passing check found: each job's one run, by its config_hash, and the metric points they hold."""

    runs: dict[str, Run]
    points: int


def assert_every_job_once_every_point_once(
    uri: str, experiment: str, jobs: Iterable[Job], overrides: Sequence[str] = (), sweep: str = "smoke"
) -> Stored:
    """Every job of `jobs` has exactly one run among sweep `sweep`'s runs of `experiment` in the store at
    `uri`, and each run every metric point once. overrides: the sweep's own, on which a run's params
    compose to the configuration that says which points it logs."""
    runs = assert_every_job_once(uri, experiment, jobs, sweep)
    points = assert_every_point_once(MlflowClient(tracking_uri=uri), list(runs.values()), overrides)
    return Stored(runs, points)


def assert_every_job_once(
    uri: str, experiment: str, jobs: Iterable[Job], sweep: str = "smoke"
) -> dict[str, Run]:
    """Every job of `jobs` has exactly one run among sweep `sweep`'s runs of `experiment`, and no run is of
    another job; the runs by config_hash."""
    runs = children(uri, sweep, experiment)
    _assert_none(
        job_faults(runs, jobs), f"sweep {sweep!r} of experiment {experiment!r}: not every job ran once"
    )
    return {r.data.tags[CONFIG_HASH]: r for r in runs}


def assert_every_point_once(client: MlflowClient, runs: Sequence[Run], overrides: Sequence[str] = ()) -> int:
    """Every metric point of each of `runs` stored once, none lost; the points stored."""
    faults: list[str] = []
    stored = 0
    for run in runs:
        want = expected_counts(compose([*overrides, *run_overrides(run.data.params)]))
        for key, points in histories(client, run.info.run_id).items():
            steps = Counter(step for step, _ in points)
            stored += len(points)
            faults += [
                f"run {named(run)}: {key} at step {s} stored {n} times" for s, n in steps.items() if n > 1
            ]
            if len(steps) < want[key]:
                faults.append(f"run {named(run)}: {key} has {len(steps)} of the {want[key]} steps it logs")
    _assert_none(faults, f"not every metric point of {len(runs)} runs stored once")
    return stored


def job_faults(runs: Sequence[Run], jobs: Iterable[Job]) -> list[str]:
    """One line per job without a run or with more than one, and per run of no job of `jobs`."""
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(run.data.tags[CONFIG_HASH], []).append(run)
    faults = []
    for job in jobs:
        found = by_key.pop(job.key, [])
        if len(found) != 1:
            listed = f": {', '.join(named(r) for r in found)}" if found else ""
            faults.append(f"job {job.name!r} (config_hash {job.key}) has {len(found)} runs{listed}")
    faults += [
        f"run {named(r)}: config_hash {key} is no job of the sweep" for key, rs in by_key.items() for r in rs
    ]
    return faults


def named(run: Run) -> str:
    return f"{run.info.run_name!r} ({run.info.run_id})"


def _assert_none(faults: list[str], what: str) -> None:
    more = f"\n... and {len(faults) - SHOWN} more" if len(faults) > SHOWN else ""
    assert not faults, f"{what}: {len(faults)} faults\n" + "\n".join(faults[:SHOWN]) + more
