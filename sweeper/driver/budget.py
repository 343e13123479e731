"""A sweep's time budget (cluster.time_budget_s) and the account of what is done and what is left.

A sweep that needs longer than one allocation (a SLURM wall time, a spot node, a night) runs as the same
command once per allocation, its budget a few minutes under the allocation's: when the budget is spent the
driver stops the sweep as on Ctrl-C (sweeper.driver.stop.Halt: each running trial keeps its last checkpoint)
and exits with code 75; the next allocation's driver goes on from there. The budget counts from the driver
process's start, so Python's imports and Ray's start are inside it.

With a drain (cluster.drain_s) no trial starts in the budget's last seconds and the driver stops as at the
budget once none runs: an allocation that ends where its trials end leaves no checkpoint to carry (what a
run whose archives are committed wants), at the price of cores idle while the last trials finish.

The account counts model-steps: a model with an outcome counts all its train.steps (it will not train
again), an interrupted one the step its recorded checkpoint resumes from (the steps after it are replayed).
The session prints it as it goes and records its allocation's rate at its end (sweeper.driver.session), by
which the next allocation's outlook says whether the sweep should end within its budget (outlook).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import psutil

from config.grid import Job


@dataclass(frozen=True)
class Budget:
    """cluster.time_budget_s (None: no budget), counted from the driver process's start (wall clock), and
    its drain, cluster.drain_s (None: none): its last seconds, when no trial starts (sweeper.driver.drain)."""

    seconds: float | None
    started: float  # time.time() when this process started
    drain: float | None = None

    @classmethod
    def since_start(cls, seconds: float | None, drain: float | None = None) -> Budget:
        """The budget counted from this process's start: imports and Ray's start are inside it."""
        return cls(seconds, psutil.Process().create_time(), drain)

    def left(self) -> float:
        return math.inf if self.seconds is None else self.started + self.seconds - time.time()

    def spent(self) -> bool:
        return self.left() <= 0

    def draining(self) -> bool:
        """In the drain: no trial may start."""
        return self.drain is not None and self.left() <= self.drain


@dataclass(frozen=True)
class Account:
    """What a sweep has done: its models by state and its model-steps (the module docstring)."""

    steps: dict[str, int]  # job (config_hash) -> its train.steps
    ended: frozenset[str]  # jobs with an outcome
    resumable: dict[str, int]  # job without an outcome -> the step its recorded checkpoint resumes from

    @classmethod
    def of(cls, jobs: list[Job], default_steps: int, ended, resumable: dict[str, int]) -> Account:
        steps = {j.key: int(j.configuration.overrides.get("train.steps", default_steps)) for j in jobs}
        return cls(steps, frozenset(ended) & steps.keys(), {k: s for k, s in resumable.items() if k in steps})

    @property
    def total(self) -> int:
        return sum(self.steps.values())

    @property
    def done(self) -> int:
        return sum(
            self.steps[k] if k in self.ended else min(self.resumable.get(k, 0), self.steps[k])
            for k in self.steps
        )

    def models(self) -> str:
        started = sum(1 for k in self.resumable if k not in self.ended and self.resumable[k] > 0)
        waiting = len(self.steps) - len(self.ended) - started
        return f"models: {len(self.ended)} finished, {started} stopped at a checkpoint, {waiting} not started"

    def steps_line(self) -> str:
        share = self.done / self.total if self.total else 1.0
        return f"{self.done:,} of {self.total:,} model-steps done ({share:.0%})"


def outlook(account: Account, budget: Budget, rate: float | None) -> str:
    """At the start, with a budget: whether the sweep should end within it, at the rate of its last
    allocation (the parent run's metric tracking.names.STEP_RATE)."""
    left, window = account.total - account.done, budget.left()
    head = f"time budget {duration(budget.seconds)} (cluster.time_budget_s), {duration(max(window, 0))} left"
    if rate is None:
        return f"{head}; {left:,} model-steps to train, no rate measured for this sweep yet (its stop says)"
    need = left / rate
    verdict = "should end within it" if need < window else f"should not end within it ({duration(need)} more)"
    return f"{head}: {left:,} model-steps to train need about {duration(need)} at {rate:,.1f}/s: {verdict}"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
