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
same command resumes them (a second one ends the driver at once, its open runs KILLED), 11 a sweep above
sweep.confirm_trials or sweep.confirm_hours not confirmed, ...).

Above sweep.confirm_trials trials or sweep.confirm_hours device-hours the sweep asks before it launches (y/N
on a terminal; without one it refuses, exit 11): `--yes` (or sweep.confirm=false) launches it unasked, as
scripts and batch jobs do. A resume of a sweep launched before at its size does not ask again.

With a SQLite store, the store's folder is the sweep's home: it holds the store, the artifacts,
and Ray's storage with the trials' checkpoints; move it, copy it or archive it (python -m sweeper.archive),
and the same command pointed at the store there goes on.
"""

from __future__ import annotations

import sys

from cli import console
from cli.entry import as_typed, command
from config.grid import load  # tests load a sweep as this command does, by this name
from config.help import composed_config, config_groups
from sweeper.driver import confirm, cost
from sweeper.driver.timeline import drive


@command("leaner-sweep", show_config=composed_config, options=config_groups, flags=(confirm.YES,))
def main(argv: list[str]) -> int:
    console.outlive_readers()  # a stop in progress outlives a reader that left (`| tee`, Ctrl-C to both)
    sweep = load([word for word in argv if word != confirm.YES])
    cfg, plan = sweep.cfg, sweep.plan
    limits = confirm.thresholds(cfg.sweep)  # a bad one refused by the dry run too
    print(plan.table())
    plan_cost = cost.reckon(cfg, plan)  # once: the preview, the ETA, the guard, a cluster's preflight
    print(*plan_cost.lines, confirm.eta(cfg, plan_cost.priced), sep="\n")
    if cfg.cluster.pack == "seeds":
        print(
            f"cluster.pack=seeds: {len(plan.configurations)} Ray Tune trials, each training the "
            f"{len(plan.seeds)} seeds of one configuration together"
        )
    print(plan.summary(), flush=True)  # the plan's last line (docs/science.md section 8)
    if cfg.sweep.dry_run:
        return 0
    # Before the store or Ray: refused, nothing is left behind.
    confirm.check(sweep, limits, plan_cost.priced, confirm.YES in argv)
    return drive(sweep, as_typed(argv, "sweeper.sweep"), plan_cost).exit_code


if __name__ == "__main__":
    sys.exit(main())
