"""A report on one sweep's runs, attached to that sweep's parent MLflow run: its files as artifacts (report/)
and the sweep's summary as metrics, so that sweeps compare in the runs table."""

from __future__ import annotations

import time
from pathlib import Path

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from analysis.context import Context
from cli import exit_codes
from tracking import sqlite_guard, store, ui
from tracking.names import REPORT_DIR, REPORT_HTML, SWEEP
from tracking.parent_run import attach_report, find_parent


def attach_to_sweep(ctx: Context, before: dict[Path, int], metrics: dict[str, float]) -> str | None:
    """A report on one sweep's runs goes to that sweep's parent run (artifacts report/: the files of its
    folder new or changed since `before`, path -> mtime in ns; and the summary `metrics`); returns where to
    see it."""
    files = written_since(ctx.out_dir, before)
    # A run's sweep tag is a list (a run one sweep finished, another adopted): the sweeps every run carries.
    sweeps = set.intersection(*(set(str(s).split(",")) for s in ctx.runs[SWEEP].fillna("")))
    if len(sweeps) != 1:
        return None
    sweeps = sorted(sweeps)
    client = store.connect(ctx.uri, write=False)
    experiment_id = store.find_experiment(client, ctx.experiment)
    read_only = not sqlite_guard.writable(ctx.uri)  # said only where a parent run would take the report
    parent = find_parent(client, experiment_id, sweeps[0])
    if parent is None:
        return None
    if read_only:
        return f"tracking store {ctx.uri} is read-only: the report stays here, not on sweep {sweeps[0]}'s run"
    try:
        attach_report(client, parent, files)
        client.log_batch(
            parent, metrics=[Metric(k, v, int(time.time() * 1000), 0) for k, v in metrics.items()]
        )
    except MlflowException as err:  # a lock another process holds past the timeout, a server away
        why = exit_codes.explained(err) or str(err).splitlines()[0]
        return f"the report stays here, not on sweep {sweeps[0]}'s run (the same command attaches it): {why}"
    address = ui.run_page(ctx.uri, experiment_id, parent, f"artifactPath/{REPORT_DIR}/{REPORT_HTML}")
    return (
        f"report attached to the parent run of sweep {sweeps[0]} (artifacts {REPORT_DIR}/, "
        f"{REPORT_DIR}/{REPORT_HTML} in one page); "
        f"{ui.how_to_open(ctx.uri, address)}"
    )


def written_since(folder: Path, before: dict[Path, int]) -> list[Path]:
    """The files of `folder` that are new or changed since the snapshot `before` (path -> mtime in ns)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and before.get(p) != p.stat().st_mtime_ns)
