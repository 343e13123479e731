"""The sweep's timeline (drive): each step one call, in the order the driver takes them.

The command line (sweeper.sweep) loads the sweep, reckons its cost once (sweeper.driver.cost) and hands both
here; the scale probe (sweeper.scale.probe) drives the same timeline with trials that train nothing. Each
step hands the next what it made, and none goes back to an earlier one: the sweep as config/ made it
(config.grid.Sweep), the hold on its store (sweeper.driver.hold), the stopper that keeps its time budget
(sweeper.driver.stop.Halt), the storage of the Ray cluster it joined (sweeper.driver.cluster), the work
(sweeper.driver.work) and the session that records it (sweeper.driver.session).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from cli.credentials import mask
from config.grid import Sweep
from tracking import ui

if TYPE_CHECKING:
    from sweeper.driver.cost import Cost
    from sweeper.driver.session import Summary


def drive(sweep: Sweep, argv: list[str], plan_cost: Cost, trainable: Callable | None = None) -> Summary:
    """The sweep's timeline: read the ledger, plan what is left, and fit it with Ray Tune in a session that
    records it in MLflow, this driver alone on the sweep, until it ends or its time budget is spent. argv:
    the command as typed, program included (cli.entry.as_typed), which the parent run and a stop record.
    plan_cost: the plan's cost as the command reckoned it (sweeper.driver.cost), which the preflight weighs.
    trainable: a stand-in for sweeper.driver.trial.run_trial (the scale probe's noop_trial, which measures
    the driver)."""
    from sweeper import preflight
    from sweeper.driver import cluster, tune
    from sweeper.driver.budget import Budget, outlook
    from sweeper.driver.hold import take_hold
    from sweeper.driver.session import Summary, recording
    from sweeper.driver.stop import Halt
    from sweeper.driver.work import plan_work

    cfg, name = sweep.cfg, sweep.plan.name
    argv = [mask(word) for word in argv]  # recorded (the command tag, its note, the resume hint) and printed
    cluster.check(cfg)  # before the store is touched: nothing to undo
    hold = take_hold(sweep)  # read once
    if not hold.pending:
        return Summary(name, hold.experiment_id)
    budget = Budget.since_start(cfg.cluster.time_budget_s, cfg.cluster.drain_s)
    on_cluster = cfg.cluster.address is not None  # its preflight's table states the budget: said once
    if budget.seconds is not None and not on_cluster:  # at the rate of the sweep's last allocation, if any
        print(outlook(hold.account, budget, hold.rate), flush=True)
    halt = Halt(budget)  # the session's stopper: a signal, the budget spent, a failed write
    if halt.spent_before_start(name, argv, hold.account):  # nothing was begun, nothing to stop
        return Summary(name, hold.experiment_id, len(hold.pending), out_of_time=True)
    storage = cluster.join(cfg.cluster, hold.storage)  # before the lock: a refusal opens no parent run
    if on_cluster:  # its nodes, storage and budget checked before trial one
        preflight.before_trials(sweep, hold, storage, budget, plan_cost)
    with hold.locked():  # the ledger read again if another driver ran the sweep meanwhile
        if not hold.pending:  # another driver ran the sweep between the read and the lock
            return Summary(name, hold.experiment_id)
        work = plan_work(sweep, hold)
        hold.lock.joined(*cluster.identity())  # a retry on another cluster can tell when this one is gone
        with recording(hold, sweep, argv, work, halt) as session:  # the parent run, the writer
            tune.fit(sweep, work, storage, session, trainable)
    summary = session.summary
    if not summary.stopped:  # a stopped sweep printed its account and the command that resumes it
        print(summary)
        print(ui.where_to_look(cfg.tracking.uri, cfg.tracking.experiment, summary.experiment))
    return summary
