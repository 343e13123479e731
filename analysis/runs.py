"""Runs and metric histories from the MLflow store, as pandas DataFrames.

`load_runs` returns one row per run of a search (tracking.store.search): its
id, status, times, the tags the analysis needs and every config value under
its dotted key, typed (numbers as numbers). `histories` returns the metric
points of many runs at once (tracking.metric_points: a fast path where the
store has one, else MLflow's public API), one point per run, key and step.
"""

from __future__ import annotations

import warnings
from typing import Iterable

import pandas as pd

from cli import exit_codes
from config.schema import ADDED_TRAIN_KEYS
from tracking import metric_points, store
from tracking.names import (
    CONFIG_HASH,
    DIVERGED_AT,
    ENDED,
    FINISHED,
    METRICS,
    OUTCOME,
    SEED,
    SUBGRIDS,
    SWEEP,
    outcome,
)

TAGS = (CONFIG_HASH, SEED, OUTCOME, DIVERGED_AT, SUBGRIDS, SWEEP)
RUN_COLUMNS = ["run_id", "run_name", "status", "start_time", "end_time", "experiment_id", *TAGS, *METRICS]


class NoRuns(LookupError, exit_codes.CommandError):
    """Nothing to analyse; the message says what is missing and where it was looked for. `choices`: the
    message lists what the store holds instead (a selection that matched nothing), so the advice is to
    choose among them, not to fill the store."""

    exit_code = exit_codes.NO_RUNS

    def __init__(self, message: str, choices: bool = False) -> None:
        super().__init__(message)
        self.choices = choices


def config_keys(columns: Iterable[str]) -> list[str]:
    """Deprecated: analysis.context.config_keys, beside the other helpers of a frame of runs."""
    warnings.warn(
        "analysis.runs.config_keys is analysis.context.config_keys now; this name goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return _config_keys(columns)


def _config_keys(columns: Iterable[str]) -> list[str]:
    # Imported here: analysis.context brings plotting and torch, which reading runs does not need.
    from analysis.context import config_keys

    return config_keys(columns)


def typed(text: str | None) -> object:
    """A param value back as the number/bool it was; everything else stays text."""
    if text is None or text == "null":
        return None
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def load_runs(
    uri: str,
    experiment: str,
    sweep: str | None = None,
    subgrid: str | None = None,
    where: dict[str, object] | None = None,
) -> pd.DataFrame:
    """One row per run of `experiment`, optionally only those of one sweep, sub-grid or config values.

    `where` maps dotted config keys to a value or a list of allowed values,
    e.g. {"task.d": 32, "model.embedding": ["onehot", "binary"]}.
    """
    client = store.connect(uri, write=False)
    experiment_id = store.find_experiment(client, experiment)
    if (
        experiment_id is None
    ):  # the analysis creates nothing: tracking.store.ensure_experiment is the writers'
        raise NoRuns(
            f"experiment {experiment!r} does not exist in {client.tracking_uri}; "
            f"experiments there: {', '.join(store.experiment_names(client)) or 'none'}"
        )
    filters = (
        [f"tags.{SWEEP} LIKE '%{sweep}%'"] if sweep else []
    )  # a list (runs adopted by sweeps): of_choice
    if subgrid:
        filters.append(f"tags.{SUBGRIDS} LIKE '%{subgrid}%'")  # exact match in of_choice
    found = store.search(client, [experiment_id], " and ".join(filters))
    rows = [_row(run) for run in found if CONFIG_HASH in run.data.tags]  # a sweep's parent has no config
    runs = of_choice(pd.DataFrame(rows, columns=None if rows else RUN_COLUMNS), sweep, subgrid)
    if runs.empty:
        return runs
    for key, wanted in (where or {}).items():
        if key not in runs:
            raise KeyError(
                f"config key {key!r} is not a param of these runs; they have: {', '.join(_config_keys(runs))}"
            )
        allowed = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
        runs = runs[runs[key].isin(allowed)]
    return runs.sort_values(["start_time", "run_id"]).reset_index(drop=True)


def of_choice(runs: pd.DataFrame, sweep: str | None, subgrid: str | None) -> pd.DataFrame:
    """The runs of one sweep and/or sub-grid (their tags are comma-separated lists: a run adopted by several
    sweeps, a configuration in several sub-grids)."""
    if runs.empty:
        return runs
    if sweep:
        runs = runs[runs[SWEEP].fillna("").map(lambda s: sweep in s.split(","))]
    if subgrid:
        runs = runs[runs[SUBGRIDS].fillna("").map(lambda s: subgrid in s.split(","))]
    return runs


def selected_runs(uri: str, experiment: str, sweep: str | None, subgrid: str | None) -> pd.DataFrame:
    """load_runs of one sweep and/or sub-grid, as a reader chose them; NoRuns naming the sweeps and sub-grids
    the experiment holds when the choice matches no run (a typo, another store's sweep). Reads the
    experiment's runs once, for the choice and for what it holds."""
    every = load_runs(uri, experiment)
    runs = of_choice(every, sweep, subgrid).reset_index(drop=True)
    if not runs.empty or not (sweep or subgrid):
        return runs
    held = {key: _names(every, key) for key in (SWEEP, SUBGRIDS)}
    chosen = " ".join(f"{key}={value}" for key, value in (("sweep", sweep), ("subgrid", subgrid)) if value)
    raise NoRuns(
        f"experiment {experiment!r} in {uri} holds no training run of {chosen}: "
        f"{len(every)} runs of the sweeps {', '.join(held[SWEEP]) or '(none)'}, "
        f"sub-grids {', '.join(held[SUBGRIDS]) or '(none)'}; choose one (select.sweep=NAME, "
        "select.subgrid=NAME), or none for every run",
        choices=True,
    )


def runs_to_analyse(uri: str, experiment: str, select: dict) -> pd.DataFrame:
    """The experiment's training runs that report and claims analyse (select.sweep, select.subgrid); NoRuns,
    saying how to fill it, when it has none."""
    try:
        runs = selected_runs(uri, experiment, select["sweep"], select["subgrid"])
    except NoRuns as err:
        advice = "" if err.choices else f". {_how_to_fill(uri, experiment)}"
        raise NoRuns(f"nothing to analyse: {err}{advice}") from None
    if runs.empty:  # a selection that matched nothing was answered above, naming what the store holds
        raise NoRuns(
            f"nothing to analyse: experiment {experiment!r} in {uri} has no training runs. "
            f"Every figure needs training runs with checkpoints and metrics (train_loss, "
            f"val_rel_lloyd ...). {_how_to_fill(uri, experiment)}"
        )
    return runs


def _how_to_fill(uri: str, experiment: str) -> str:
    where = f"tracking.uri={uri} tracking.experiment={experiment}"
    return (
        f"Fill it with `python -m sweeper.sweep sweep=demo {where}` (or sweep=paper for the full grid), "
        f"or point the report at another store with tracking.uri=... tracking.experiment=..."
    )


def _names(runs: pd.DataFrame, tag: str) -> list[str]:
    """The names a comma-separated tag (sweep, subgrids) takes over `runs`, sorted."""
    values = runs[tag].dropna() if tag in runs else []
    return sorted({name for value in values for name in value.split(",") if name})


def _row(run) -> dict:
    info, data = run.info, run.data
    row = {
        "run_id": info.run_id,
        "run_name": info.run_name,
        "status": info.status,
        "start_time": info.start_time,
        "end_time": info.end_time,
        "experiment_id": info.experiment_id,
    }
    row.update({tag: data.tags.get(tag) for tag in TAGS})
    row[OUTCOME] = outcome(data.tags)  # an older store's name read as today's
    row.update({key: typed(value) for key, value in data.params.items()})
    # A run recorded before a key was added had that key's earlier value: one configuration, one group.
    row.update({f"train.{k}": v for k, v in ADDED_TRAIN_KEYS.items() if f"train.{k}" not in data.params})
    row.update({key: data.metrics.get(key) for key in METRICS})  # the latest value of each metric
    row[SEED] = typed(data.tags.get(SEED, data.params.get(SEED)))
    return row


def outcome_of(runs: pd.DataFrame) -> pd.Series:
    """finished / diverged / pruned (stopped early by ASHA) / other (running, killed, crashed) per run; an
    untagged run MLflow closed FINISHED is finished (a pruned one is FINISHED too: its tag comes first)."""
    tagged = runs[OUTCOME].where(runs[OUTCOME].isin(ENDED), "other")
    return tagged.where(~((tagged == "other") & (runs["status"] == "FINISHED")), FINISHED)


def histories(uri: str, runs: pd.DataFrame, keys: Iterable[str], fast: bool = True) -> pd.DataFrame:
    """Metric points of all `runs` for `keys`: columns run_id, key, step, timestamp (ms), value.

    A point logged twice at one step (a resumed run re-logging) keeps its latest value.
    fast=False reads through MLflow's public API only (tracking.metric_points).
    """
    client = store.connect(uri, write=False)
    points = metric_points.read(client, list(runs.get("run_id", [])), list(keys), fast)
    points = points.sort_values(
        ["run_id", "key", "step", "timestamp", "value"]
    )  # ties: whatever the read path
    return points.drop_duplicates(["run_id", "key", "step"], keep="last").reset_index(drop=True)
