"""The parent run of a sweep: the MLflow UI's one row that tells the sweep's story.

Its jobs' runs are its children. It holds the plan (tags with its sizes,
plan.txt, plan.csv, sweep.yaml), the command line that started it, how many
jobs finished, diverged, were stopped or are pending (metrics, kept current
by the driver while the sweep runs), and, once `python -m analysis.report`
has run on the sweep, the report's figures, index.md and claims under report/.
"""

from __future__ import annotations

import csv
import shlex
import tempfile
import time
from collections import Counter
from pathlib import Path

from mlflow.entities import Metric, Run, RunTag, ViewType
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from cli.credentials import masked
from config.grid import Plan, Sweep
from tracking.names import (
    COMMAND,
    CONFIG_HASH,
    ENDED,
    MLFLOW_RUN_NOTE,
    PENDING,
    PLAN_ARTIFACT,
    PLAN_TAGS,
    PLAN_TRIALS_ARTIFACT,
    REPORT_DIR,
    SUBGRIDS,
    SWEEP,
    SWEEP_ARTIFACT,
    TRIAL_COUNTS,
)
from tracking.run_tags import source_tags


def name_of(sweep: str) -> str:
    return f"sweep-{sweep}"


def is_parent(run: Run, sweep: str) -> bool:
    """The one rule for a sweep's parent run: its name and sweep tag, no config_hash (a job's run has one)."""
    tags = run.data.tags
    return run.info.run_name == name_of(sweep) and tags.get(SWEEP) == sweep and CONFIG_HASH not in tags


def find_parent(client: MlflowClient, experiment_id: str, sweep: str) -> str | None:
    """The id of the parent run of `sweep` in the experiment (the oldest, if two drivers made one each)."""
    query = f"tags.{SWEEP} = '{sweep}' and attributes.run_name = '{name_of(sweep)}'"
    # One page (MLflow's 1,000 runs) holds them: a sweep has one parent run, or one per driver that raced.
    parents = [
        r for r in client.search_runs([experiment_id], query, ViewType.ACTIVE_ONLY) if is_parent(r, sweep)
    ]
    return min(parents, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id if parents else None


def open_parent(client: MlflowClient, parent_id: str, sweep: Sweep, argv: list[str], ended: Counter) -> None:
    """Mark the sweep's parent run running and record on it the command line, the trial counts (`ended`:
    outcome -> the jobs that ended with it before, log_counts) and then the plan's files (_log_plan)."""
    plan = sweep.plan
    client.update_run(parent_id, status="RUNNING")
    command = shlex.join(argv)  # the command as typed (cli.entry.as_typed)
    sizes = (len(plan.configurations), len(plan.seeds), plan.job_count)
    tags = {
        COMMAND: command,
        MLFLOW_RUN_NOTE: describe(plan, command),
        **dict(zip(PLAN_TAGS, map(str, sizes))),
        **source_tags(),
    }
    client.log_batch(parent_id, tags=[RunTag(k, v) for k, v in tags.items()])
    log_counts(client, parent_id, ended, len(sweep.jobs))
    _log_plan(client, parent_id, sweep)


def _log_plan(client: MlflowClient, parent_id: str, sweep: Sweep) -> None:
    """The plan's files on the parent run: its table, every trial, and the sweep's own configuration, masked
    (its `fixed` may hold any key)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / SWEEP_ARTIFACT).write_text(OmegaConf.to_yaml(masked(sweep.cfg.sweep)))
        (folder / PLAN_ARTIFACT).write_text(sweep.plan.table() + "\n" + sweep.plan.summary() + "\n")
        with open(folder / PLAN_TRIALS_ARTIFACT, "w", newline="") as out:
            rows = csv.writer(out)
            rows.writerow(["run_name", "seed", SUBGRIDS, CONFIG_HASH])
            rows.writerows([j.name, j.seed, ",".join(j.configuration.subgrids), j.key] for j in sweep.jobs)
        client.log_artifacts(parent_id, tmp)


def describe(plan: Plan, command: str) -> str:
    """The parent run's description (Markdown on its run page)."""
    subgrids = ", ".join(f"`{g.name}` ({g.size})" for g in plan.subgrids)
    return (
        f"Sweep **{plan.name}**: {plan.summary()}; sub-grids {subgrids}. Started with `{command}`.\n\n"
        f"Its trials are the child runs: group them by the `configuration` tag to see each configuration's "
        f"seeds together. Metrics {', '.join(f'`{m}`' for m in TRIAL_COUNTS.values())} count the trials as "
        f"they end. Artifacts: `{PLAN_ARTIFACT}`, `{PLAN_TRIALS_ARTIFACT}`, `{SWEEP_ARTIFACT}`, "
        f"and `{REPORT_DIR}/` "
        f"once `python -m analysis.report select.sweep={plan.name}` has run."
    )


def note_stop(client: MlflowClient, parent_id: str, text: str) -> None:
    """Add how the sweep stopped, and how it goes on, to the parent run's description (its run page): where
    the driver's own output may not reach any more."""
    note = client.get_run(parent_id).data.tags.get(MLFLOW_RUN_NOTE, "")
    client.set_tag(parent_id, MLFLOW_RUN_NOTE, f"{note}\n\n{text}".strip())


def log_counts(client: MlflowClient, parent_id: str, ended: Counter, planned: int) -> None:
    """The parent's trial counts, one point per metric at step = trials ended so far."""
    counts = {outcome: ended[outcome] for outcome in ENDED}
    counts[PENDING] = planned - sum(counts.values())
    step, now = sum(counts[o] for o in ENDED), int(time.time() * 1000)
    client.log_batch(parent_id, metrics=[Metric(TRIAL_COUNTS[o], n, now, step) for o, n in counts.items()])


def attach_report(client: MlflowClient, parent_id: str, files: list[Path]) -> None:
    """Store a report's files (figures, tables, index.md, claims) under report/ of the parent run."""
    for path in files:
        client.log_artifact(parent_id, str(path), REPORT_DIR)
