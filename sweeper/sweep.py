"""Run a sweep on Ray Tune: `python -m sweeper.sweep sweep=NAME [overrides]`.

    python -m sweeper.sweep sweep=paper sweep.dry_run=true   # the plan; Ray is not started
    python -m sweeper.sweep sweep=paper                      # 3,000 trials on a local Ray instance
    python -m sweeper.sweep sweep=paper cluster.address=auto tracking.uri=http://HOST:5000 \\
        cluster.storage=/shared/ray_results                  # on a running Ray cluster

Other overrides (train.steps=..., cluster.cpus_per_trial=0.5, ...) apply to
every trial. The same command started again continues the sweep: trials with
a finished (or diverged) MLflow run are skipped, interrupted ones resume from
their last checkpoint in their own run. On a multi-node cluster
`cluster.storage` must be shared storage (an NFS path mounted alike on every
node, or s3://, gs://): trials resume from checkpoints written elsewhere.

Exit codes: the table of cli/exit_codes.py (0 every trial ended, 1 some trials failed after their
retries: start again to retry them, 2 rejected configuration, 4 tracking store unreachable at the start or
for longer than tracking.outage_s mid-sweep, 8 another driver runs this sweep, 75 stopped at its time budget
(cluster.time_budget_s), 130/143 stopped by SIGINT/SIGTERM: running trials keep their last checkpoint and the
same command resumes them, ...).

With a SQLite store, the store's folder is the sweep's home: it holds the store, the artifacts,
and Ray's storage with the trials' checkpoints; move it, copy it or archive it (python -m sweeper.archive),
and the same command pointed at the store there goes on.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

from omegaconf import DictConfig

from cli import console
from cli.entry import command
from config import grid
from config.compose import compose_sweep
from config.help import composed_config, config_groups
from config.schema import ConfigError
from sweeper import cost
from tracking import ui
from tracking.names import STEP_RATE

if TYPE_CHECKING:
    from sweeper.ledger import Hold
    from sweeper.session import Summary


def load(overrides: list[str]) -> tuple[DictConfig, grid.Plan]:
    """Compose, expand and validate: every error here comes before Ray starts."""
    cfg = compose_sweep(overrides)
    plan = grid.expand(cfg.sweep, grid.command_line_keys(overrides))
    grid.check(cfg, plan)
    return cfg, plan


def drive(cfg: DictConfig, plan: grid.Plan, argv: list[str], trainable: Callable | None = None) -> Summary:
    """The sweep's timeline: read the ledger, plan what is left, and fit it with Ray Tune in a session that
    records it in MLflow, this driver alone on the sweep, until it ends or its time budget is spent.
    trainable: a stand-in for sweeper.trial.run_trial (sweeper.scale_probe's, which measures the driver)."""
    from sweeper import cluster, tune
    from sweeper.budget import Account, Budget, outlook
    from sweeper.ledger import take_hold
    from sweeper.session import Summary, recording
    from sweeper.stop import stopped
    from sweeper.work import plan_work

    budget = Budget.since_start(cfg.cluster.time_budget_s)
    check_store_reachable(cfg)
    cluster.check_this_machine(cfg.cluster)  # before the store is touched: nothing to undo
    jobs = grid.jobs(cfg, plan)
    hold = take_hold(cfg.tracking.uri, cfg.tracking.experiment, plan.name, jobs)  # read once
    pending = announce(hold)
    if not pending:
        return Summary(plan.name, hold.experiment)

    def account_now() -> Account:  # of the ledger as last read
        return Account.of(jobs, cfg.train.steps, hold.ledger.done, hold.ledger.resume_step)

    account = account_now()
    if budget.seconds is not None:  # at the rate of the sweep's last allocation, if it had one
        rate = hold.ledger.parent.data.metrics.get(STEP_RATE) if hold.ledger.parent else None
        print(outlook(account, budget, rate), flush=True)
    if budget.spent():  # spent before Ray started: nothing was begun, nothing to stop
        reason = f"at its time budget ({budget.seconds:g} s) before any trial started"
        stopped(plan.name, argv, 0, 0, True, reason, f"{account.models()}; {account.steps_line()}")
        return Summary(plan.name, hold.experiment, len(pending), out_of_time=True)
    storage = cluster.join(cfg.cluster, cfg.tracking.uri)  # before the lock: a refusal opens no parent run
    with hold.locked():  # the ledger read again if another driver ran the sweep meanwhile
        if not hold.pending():  # another driver ran the sweep between the read and the lock
            announce(hold)
            return Summary(plan.name, hold.experiment)
        work = plan_work(cfg, plan, argv, hold)
        hold.lock.joined(cluster.gcs_address())  # a retry on another cluster can tell when this one is gone
        with recording(
            hold, cfg, plan, argv, work, budget, account_now()
        ) as session:  # the parent run, the writer
            tune.fit(cfg, plan, work, storage, session, trainable)
    summary = session.summary
    if not summary.stopped:  # a stopped sweep printed its account and the command that resumes it
        print(summary)
        print(ui.where_to_look(cfg.tracking.uri, cfg.tracking.experiment, summary.experiment))
    return summary


def announce(hold: Hold) -> list[grid.Job]:
    """Print how much of the sweep the store holds; the jobs left to run."""
    jobs, pending = hold.jobs, hold.pending()
    print(f"{len(jobs) - len(pending)} of {len(jobs)} trials already in MLflow; {len(pending)} to run")
    return pending


def check_store_reachable(cfg: DictConfig) -> None:
    """A driver on a cluster's head node (cluster.address=ray://) writes to a store it reaches over HTTP."""
    uri, address = cfg.tracking.uri, cfg.cluster.address or ""
    if address.startswith("ray://") and not uri.startswith(("http://", "https://")):
        raise ConfigError(
            f"cluster.address={address} runs the sweep driver, the MLflow writer, on the "
            f"cluster's head node: tracking.uri={uri} must be a server it reaches (http://HOST:PORT)"
        )


@command("leaner-sweep", show_config=composed_config, options=config_groups)
def main(argv: list[str]) -> int:
    console.outlive_readers()  # a stop in progress outlives a reader that left (`| tee`, Ctrl-C to both)
    cfg, plan = load(argv)
    print(plan.table())
    print("\n".join(cost.preview(cfg, plan)))
    if cfg.cluster.pack == "seeds":
        print(
            f"cluster.pack=seeds: {len(plan.configurations)} Ray Tune trials, each training the "
            f"{len(plan.seeds)} seeds of one configuration together"
        )
    print(plan.summary(), flush=True)  # the plan's last line (docs/science.md section 8)
    if cfg.sweep.dry_run:
        return 0
    return drive(cfg, plan, argv).exit_code


if __name__ == "__main__":
    sys.exit(main())
