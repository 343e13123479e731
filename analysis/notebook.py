"""A sweep's runs and metric histories as pandas DataFrames, for a notebook (docs/notebook.md).

    from analysis import notebook
    runs = notebook.runs(sweep="demo")         # one row per training run
    points = notebook.histories(runs)          # one row per (run, metric, step)

The loaders the report and the claims use (analysis.runs), behind defaults a notebook needs: the store
and experiment of the tracking config (conf/tracking: $MLFLOW_TRACKING_URI and $MLFLOW_EXPERIMENT_NAME when
set, else sqlite:///mlflow.db and leaner-clustering), and a run's outcome as the analysis counts it. Only
reads: a store is opened read-only, and a missing one is an error, not a new database.
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from analysis import runs as loaders
from config.compose import compose
from tracking.names import METRICS, OUTCOME


def default_store(uri: str | None = None, experiment: str | None = None) -> tuple[str, str]:
    """(uri, experiment): those given, else the tracking config's defaults, environment included."""
    tracking = compose([], config_name="analysis").tracking
    return uri or str(tracking.uri), experiment or str(tracking.experiment)


def runs(
    uri: str | None = None,
    experiment: str | None = None,
    sweep: str | None = None,
    subgrid: str | None = None,
) -> pd.DataFrame:
    """One row per training run of `experiment`, optionally only those of one sweep or sub-grid.

    Columns: run_id, run_name, status, start_time and end_time (ms since the epoch), config_hash, seed,
    outcome (finished, diverged, pruned, or other: running, killed, crashed), diverged_at_step, sweep and
    subgrids (comma-separated), every configuration value under its dotted key, typed (task.d,
    model.embedding, loss.tau, ...), and the last value of each metric (val_rel_lloyd, best_val_rel_lloyd,
    train_loss, ...). A sweep's parent run and the report's evaluation runs are not training runs. Raises
    analysis.runs.NoRuns when the experiment does not exist or holds no run of the sweep or sub-grid asked
    for (naming those it holds), tracking.store.TrackingError when the store
    cannot be read or `uri` is no store's address (config.schema.ConfigError for a bad
    $MLFLOW_TRACKING_URI, read as the commands read it).
    """
    uri, experiment = default_store(uri, experiment)
    found = loaders.selected_runs(uri, experiment, sweep, subgrid)
    if not found.empty:
        found[OUTCOME] = loaders.outcome_of(found)
    found.attrs["uri"] = uri  # where histories() reads their points; pandas keeps it through a selection
    return found


def histories(runs: pd.DataFrame, metrics: Iterable[str] = METRICS, uri: str | None = None) -> pd.DataFrame:
    """The metric points of `runs` (a frame of runs(), or a selection of its rows), long format:
    columns run_id, key (the metric), step, timestamp (ms) and value; one row per run, metric and step
    (a point a resumed run logged again keeps its last value). Read from the store runs() read, unless
    `uri` says another. Join a run's columns with `points.merge(runs[["run_id", "model.embedding"]])`."""
    return loaders.histories(uri or runs.attrs.get("uri") or default_store()[0], runs, metrics)
