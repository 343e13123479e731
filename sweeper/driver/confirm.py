"""The guard before a large sweep: above sweep.confirm_trials trials or sweep.confirm_hours device-hours, the
sweep asks before it launches.

The command line (sweeper.sweep) has printed the plan, the cost preview and the ETA (eta) by then, and hands
the guard what it reckoned once: the thresholds (thresholds, checked before the plan is printed) and the
plan's estimate (sweeper.driver.cost). On a terminal it asks y/N; without one (a script, sbatch, a KubeRay
job) it refuses in one line naming `--yes` and `sweep.confirm=false`. Either way a sweep not confirmed ends
with NotConfirmed (exit 11) before Ray starts or the store is written. The recipes that run unattended pass
`--yes`.

A sweep its store already holds at this size (its parent run's plan.trials, recorded when a driver first
launched it) was confirmed then: resuming it does not ask again. That one look at the store reads it only,
and only for a sweep above a threshold.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from omegaconf import DictConfig

from config.grid import Plan, Sweep
from config.schema import ConfigError
from sweeper.driver.budget import duration
from sweeper.driver.cost import Estimate
from sweeper.errors import NotConfirmed

YES = "--yes"  # the sweep command's flag: as sweep.confirm=false
OPT_OUT = f"{YES} or sweep.confirm=false"
Limits = tuple[int | None, float | None]  # sweep.confirm_trials and sweep.confirm_hours, checked (thresholds)


@dataclass(frozen=True)
class Size:
    """What the guard weighs: the plan's trials and, with step times (cluster.step_seconds), its
    device-hours."""

    trials: int
    hours: float | None  # the cost preview's GPU- or core-hours; None without step times
    unit: str = "device-hours"

    @classmethod
    def of(cls, plan: Plan, priced: Estimate | None) -> Size:
        """The plan's trials and the hours of its estimate (sweeper.driver.cost), if it has one."""
        if priced is None:
            return cls(plan.job_count, None)
        return cls(plan.job_count, priced.hours, priced.unit)

    def over(self, limits: Limits) -> list[str]:
        """The thresholds (thresholds) this size is above, as the line that names them says it."""
        trials, hours = limits
        above = []
        if trials is not None and self.trials > trials:
            above.append(f"{self.trials:,} trials > sweep.confirm_trials={trials}")
        if hours is not None and self.hours is not None and self.hours > hours:
            above.append(f"{self.hours:,.1f} {self.unit} > sweep.confirm_hours={hours:g}")
        return above


def thresholds(sweep: DictConfig) -> Limits:
    """sweep.confirm_trials and sweep.confirm_hours, checked: a ConfigError names a bad one."""
    trials, hours = sweep.confirm_trials, sweep.confirm_hours
    if trials is not None and trials < 0:
        raise ConfigError(
            f"sweep.confirm_trials={trials} is not allowed: an integer >= 0 (ask above this many trials) "
            "or null"
        )
    if hours is not None and not (hours >= 0 and math.isfinite(hours)):
        raise ConfigError(
            f"sweep.confirm_hours={hours} is not allowed: a finite number >= 0 (ask above this many "
            "device-hours) or null"
        )
    return trials, hours


def eta(cfg: DictConfig, priced: Estimate | None) -> str:
    """The sweep's estimated time before it launches, from the plan's estimate at the measured step times
    (sweeper.driver.cost), or that there is none yet."""
    if priced is None:
        return (
            "eta: no estimate before launch: no step times (cluster.step_seconds=FILE); the progress line "
            "gives one once trials report"
        )
    one = priced.hours * 3600  # one model at a time on one device
    if cfg.cluster.address is None and not priced.gpu:
        from sweeper.preflight import cores

        here = cores()
        return (
            f"eta: at most about {duration(one / here)} on this machine's {here} cores at the measured step "
            "times (one model at a time per core: packs train faster)"
        )
    kind = "GPU" if priced.gpu else "core"
    return (
        f"eta: at most about {duration(one)} on one {kind} at the measured step times, that divided by the "
        f"{kind}s the sweep gets (`leaner-preflight` counts a cluster's)"
    )


def check(sweep: Sweep, limits: Limits, priced: Estimate | None, yes: bool) -> None:
    """Return when the sweep may launch: confirmed, not asked for, or a resume of one confirmed before;
    else NotConfirmed (nothing started, nothing recorded). limits: the thresholds (thresholds); priced: the
    plan's estimate (sweeper.driver.cost)."""
    cfg, plan = sweep.cfg, sweep.plan
    above = Size.of(plan, priced).over(limits)
    if yes or not cfg.sweep.confirm or not above:
        return
    if _launched_before(cfg, plan):
        print(f"sweep {plan.name}: launched before at this size: not asked again", flush=True)
        return
    why = f"sweep {plan.name} is above what launches unasked ({'; '.join(above)})"
    if not sys.stdin.isatty():
        raise NotConfirmed(f"{why} and there is no terminal to ask: launch it with {OPT_OUT}")
    print(f"{why}: the plan, its ETA and cost are above.", file=sys.stderr)
    print(f"Launch {plan.job_count:,} trials? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise NotConfirmed(
            f"sweep {plan.name} not confirmed: nothing started ({OPT_OUT} launches it unasked)"
        )


def _launched_before(cfg: DictConfig, plan: Plan) -> bool:
    """Whether the store holds the sweep's parent run with a plan at least this large (read only: a missing
    or unreachable store holds none, and is left as it is)."""
    from tracking import parent_run, store
    from tracking.errors import TrackingError
    from tracking.names import PLAN_TAGS

    try:
        client = store.connect(cfg.tracking.uri, write=False, create=False)
        experiment = store.find_experiment(client, cfg.tracking.experiment)
        parent = experiment and parent_run.find_parent(client, experiment, plan.name)
        recorded = client.get_run(parent).data.tags.get(PLAN_TAGS[2]) if parent else None
    except TrackingError:
        return False
    return recorded is not None and recorded.isdigit() and int(recorded) >= plan.job_count
