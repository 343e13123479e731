"""Ray Tune's wiring for a sweep: one Tuner over the work's trials, fitted once.

The trainable (sweeper.driver.trial.run_trial, or a stand-in) gets the whole work once (tune.with_parameters)
and each trial's resources; the param space holds each trial's identity only (sweeper.driver.work.TrialId);
the scheduler is first in, first out (sweeper.driver.fifo) unless sweep.scheduler=asha, either with the time
budget's drain where cluster.drain_s asks for it (sweeper.driver.drain); the sweep's session is
the Tune callback that records every trial, and its Halt the stopper (sweeper.driver.session). Tune's name
creators are the module functions below, pickled by reference (sweeper.driver.driver_only). Quiet, Tune's
console prints its status table and not a box per trial event (verbosity: the one place that patches Ray's
internals).
"""

from __future__ import annotations

import time
from typing import Callable

from omegaconf import DictConfig
from ray import tune

from cli import console
from config.grid import Plan, Sweep
from sweeper.driver.drain import DrainingAsha, DrainingFifo
from sweeper.driver.fifo import LiveFifo
from sweeper.driver.session import Session
from sweeper.driver.stop import Halt
from sweeper.driver.trial import STEP, run_trial
from sweeper.driver.work import TRIAL, TrialId, Work
from tracking.names import VAL_REL_LLOYD

QUIET_TABLE_S = 60  # Tune's status table at most once a minute (13 lines for the demo's 6 trials)


def fit(
    sweep: Sweep, work: Work, storage: str | None, session: Session, trainable: Callable | None = None
) -> None:
    """Run the work's trials with `trainable` (default sweeper.driver.trial.run_trial) until each ended or the
    session's stopper stops them; Tune tells the session how each one ended."""
    cfg, plan = sweep.cfg, sweep.plan
    c, asha = cfg.cluster, cfg.sweep.scheduler == "asha"
    trainable = tune.with_parameters(trainable or run_trial, work=work)
    trainable = tune.with_resources(trainable, {"cpu": c.cpus_per_trial, "gpu": c.gpus_per_trial})
    tuner = tune.Tuner(
        trainable,
        param_space=param_space(work),
        tune_config=tune.TuneConfig(
            max_concurrent_trials=c.max_concurrent,
            scheduler=scheduler_of(cfg, plan, session.halt),
            reuse_actors=True,  # imports once per worker
            metric=VAL_REL_LLOYD if asha else None,
            mode="min" if asha else None,
            trial_name_creator=trial_name,
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=f"{plan.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=storage,
            callbacks=[session],
            stop=session.halt,
            failure_config=tune.FailureConfig(max_failures=c.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=None),  # the session's writer prunes them
            verbose=verbosity(),  # quiet: the status table, not a box per trial event
        ),
    )
    tuner.fit()


def verbosity() -> int:
    """Set Tune's console for this driver; returns RunConfig.verbose (2 with --verbose, else 1: the status
    table).

    Quiet (cli.console) also drops the boxes Tune prints at every trial's start and end and redraws the table
    every QUIET_TABLE_S instead of 30 s: class attributes of Tune's reporter, not public settings, so each is
    set only while it exists (else Tune prints as it does); tests/test_cli.py fails when Ray moves them.
    """
    if console.verbose():
        return 2
    from ray.tune.experimental import output

    reporter = output.TuneTerminalReporter
    if isinstance(getattr(reporter, "_heartbeat_freq", None), (int, float)):
        reporter._heartbeat_freq = QUIET_TABLE_S
    if hasattr(reporter, "_start_end_verbosity"):
        reporter._start_end_verbosity = output.AirVerbosity.VERBOSE
    return 1


def param_space(work: Work) -> dict:
    """Tune's trials, one per trial of the work: each trial's config holds its identity (its key and name).

    Its name travels in its config, so Tune's trial_name_creator keeps nothing of the sweep
    (sweeper.driver.driver_only); the keys are the packs' (so a restart continues the same jobs).
    """
    return {TRIAL: tune.grid_search([trial.id.encode() for trial in work.trials.values()])}


def scheduler_of(cfg: DictConfig, plan: Plan, halt: Halt):
    """Tune's scheduler for the sweep: first in, first out, or ASHA; with cluster.drain_s, the same with the
    drain (sweeper.driver.drain), which tells `halt` when it is done."""
    drain = cfg.cluster.drain_s is not None
    if cfg.sweep.scheduler != "asha":  # Tune's FIFO order, without its scan of every trial per step
        return DrainingFifo(halt) if drain else LiveFifo()
    from ray.tune.schedulers import ASHAScheduler

    # The trials' own values: a sweep's `fixed` keys and axes override the base configuration's.
    steps = max(c.overrides.get("train.steps", cfg.train.steps) for c in plan.configurations)
    every = max(c.overrides.get("train.eval_every", cfg.train.eval_every) for c in plan.configurations)
    # By default decisions from ten evaluations on: early validation ratios say little. max_t lies past the
    # last evaluation: a trial ends when its training does (its last report carries the outcomes), never by
    # ASHA at its last step, which would race that report.
    a = cfg.sweep.asha
    settings = dict(
        time_attr=STEP,
        max_t=steps + every,
        grace_period=min(10 * every, steps) if a.grace_period is None else a.grace_period,
        reduction_factor=a.reduction_factor,
        brackets=a.brackets,
    )
    return DrainingAsha(halt, **settings) if drain else ASHAScheduler(**settings)


def trial_name(trial) -> str:
    """Tune's trial_name_creator: the name the param space gave the trial (pickled by reference: nothing)."""
    return TrialId.decode(trial.config).name


def trial_dirname(trial) -> str:
    """Tune's trial_dirname_creator: the trial's key and Tune's trial id."""
    return f"{TrialId.decode(trial.config).key}-{trial.trial_id}"
