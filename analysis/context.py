"""What every figure and claim works from: the runs, their histories and evaluations as read from a store in
one pass (analysis.read), and the two curve builders.

A Context is plain data: nothing here opens a store. Training curves come from logged metrics (one run = one
seed); evaluation curves from the evaluation tables read beforehand. Both end in aggregate.seed_band, so every
curve is "per seed, then median and IQR across seeds". Diverged runs never
enter a curve; they are counted into its `diverged` column ("3/10 diverged").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import pandas as pd

from analysis.aggregate import divergence_counts, divergence_note, seed_band
from analysis.checkpoint_eval import LLOYD_METHOD, EvalSettings
from analysis.plot import CURVE_COLUMNS, MissingInput
from analysis.style import LLOYD, color, label, linestyle, order
from config.defaults import default
from config.schema import OPERATIONAL_TRAIN_KEYS, RETIRED_TRAIN_KEYS, RUN_GROUPS
from tracking.names import DIVERGED, FINISHED, SEED, SUBGRIDS

# The trained models a probe uses when the store holds several: for each key that varies among the runs, in
# this order, the value here if present, else the nearest one. conf/'s defaults but tau 0.1: the paper probes
# tau 0.1 models with l2 (they beat one Lloyd step).
REFERENCE = {
    key: default(key)
    for key in (
        "task.family",
        "task.equal_weights",
        "task.equal_scales",
        "task.init",
        "loss.regularizer",
        "loss.tau",
        "task.d",
        "task.k",
        "task.n",
        "task.scale",
        "optim.lr",
        "model.embedding",
    )
} | {"loss.tau": 0.1}


# One evaluation of one run: (evaluation name, run id, the n of its tasks or None for the run's own).
Want = tuple[str, str, int | None]


def evaluations_of(name: str, runs: pd.DataFrame) -> list[Want]:
    """Evaluation `name` of each finished run of `runs`: what a curve of them reads (evaluation_rows)."""
    return [(name, run_id, None) for run_id in runs.loc[runs["outcome"] == FINISHED, "run_id"]]


class NotRead(LookupError):
    """A figure or claim asked for an evaluation its command did not read first: a fault of the code (the
    reads of analysis.figures.READS or analysis.claims' reads miss it), never of the store."""


@dataclass
class Context:
    """One experiment's runs and what was read of them, as plain frames."""

    uri: str  # where they were read: only named (masked) in the report
    experiment: str
    runs: pd.DataFrame  # training runs, one row each, with an `outcome` column
    histories: pd.DataFrame  # every metric point of every run: run_id, key, step, timestamp, value
    evaluations: dict[
        Want, pd.DataFrame | Exception
    ]  # read, or why not (no checkpoint, tasks it cannot have)
    settings: EvalSettings
    out_dir: Path
    speed_json: Path | None = None  # `python -m bench speed_memory --out FILE`
    step_json: Path | None = None  # `python -m bench step_seconds --out FILE`
    expected: dict[str, int] = field(default_factory=dict)  # sub-grid -> configurations the paper grid has

    def evaluation(self, name: str, run: pd.Series, n: int | None = None) -> pd.DataFrame:
        """Evaluation `name` of a run, as read; the error that stopped it raised again."""
        try:
            found = self.evaluations[(name, run["run_id"], n)]
        except KeyError:
            raise NotRead(f"evaluation {name} of run {run['run_id']} (n {n}) was not read") from None
        if isinstance(found, Exception):
            raise found
        return found.copy()  # callers add columns to theirs

    def tagged(self, name: str) -> pd.DataFrame:
        """Runs tagged with sub-grid `name`."""
        return tagged(self.runs, name)

    def subgrid(self, name: str) -> pd.DataFrame:
        """Runs of sub-grid `name`; all runs when none is tagged with it (a hand-made experiment)."""
        tagged = self.tagged(name)
        return tagged if not tagged.empty else self.runs

    def coverage(self, name: str) -> str:
        """'4/60 configurations found' for a sub-grid of the paper grid."""
        runs = self.tagged(name)
        found = runs[config_keys(runs.columns)].drop_duplicates().shape[0] if not runs.empty else 0
        return f"{found}/{self.expected.get(name, '?')} configurations found"


def tagged(runs: pd.DataFrame, name: str) -> pd.DataFrame:
    """The runs whose `subgrids` tag (a comma-separated list) names sub-grid `name`."""
    return runs[runs[SUBGRIDS].fillna("").map(lambda s: name in s.split(","))]


def scope(runs: pd.DataFrame, subgrid: str, where: dict) -> pd.DataFrame:
    """The runs tagged with `subgrid` whose config values lie in `where` (a value or a tuple of values per
    key): never a fallback to other runs."""
    runs = tagged(runs, subgrid)
    for key, allowed in where.items():
        runs = (
            runs[runs[key].isin(allowed if isinstance(allowed, tuple) else (allowed,))]
            if key in runs
            else runs[:0]
        )
    return runs


def config_keys(columns: Iterable[str]) -> list[str]:
    """The dotted keys that determine a run's numbers (the seed excluded): task.*, model.*, ..."""
    operational = {f"train.{key}" for key in (*OPERATIONAL_TRAIN_KEYS, *RETIRED_TRAIN_KEYS)}
    return sorted(c for c in columns if c.split(".")[0] in RUN_GROUPS and "." in c and c not in operational)


def varying(runs: pd.DataFrame) -> list[str]:
    return [key for key in config_keys(runs.columns) if runs[key].astype(str).nunique() > 1]


def narrow(
    runs: pd.DataFrame, keep: list[str], reference: dict = REFERENCE
) -> tuple[pd.DataFrame, list[str]]:
    """Fix every varying config key except `keep` at one value: the reference value, else the nearest, else
    the commonest. Returns the runs left and the note of the figure that draws them: which of its runs'
    configurations it draws and why (none when no key was fixed)."""
    pool, held = runs, []
    for key in [k for k in reference if k in runs] + [k for k in varying(runs) if k not in reference]:
        if key in keep or runs[key].astype(str).nunique() <= 1:
            continue
        chosen, why = _pick(runs[key], reference.get(key))
        held.append(f"{key}={chosen} ({why})")
        runs = runs[runs[key] == chosen]
    return runs, _drawn(pool, runs, keep, held)


def _pick(values: pd.Series, target: object) -> tuple[object, str]:
    """The value narrow fixes a key at, and why, in words."""
    if target is not None and (values == target).any():
        return target, "the reference"
    if target is not None and isinstance(target, (int, float)) and pd.api.types.is_numeric_dtype(values):
        nearest = values.iloc[(values - target).abs().argsort().iloc[0]]
        return nearest, f"the nearest to the reference {target}"
    return values.value_counts().sort_index(
        kind="stable"
    ).idxmax(), "the value most runs have, the first on a tie"


def _drawn(pool: pd.DataFrame, runs: pd.DataFrame, keep: list[str], held: list[str]) -> list[str]:
    """A figure drawing only some of its runs' configurations says so: a silent choice reads as the sweep's
    result (a user's sweep of extra axes would see one of its configurations as if it were all of them)."""
    if not held:
        return []
    keys = config_keys(pool.columns)
    drawn, among = (len(frame[keys].drop_duplicates()) for frame in (runs, pool))
    return [
        f"draws {drawn} of the {among} configurations of its runs: it compares {', '.join(keep) or 'none'} "
        f"and holds each other key that varies at one value: {'; '.join(held)}. The reference values are "
        "conf/'s defaults but loss.tau 0.1; the headline's axes table (axes.csv) compares every value"
    ]


def series_labels(runs: pd.DataFrame, keys: list[str]) -> tuple[pd.Series, dict[str, dict]]:
    """A label per run from its values of `keys` ('OH-L2'), and a style per label."""
    configs = runs[keys].to_dict("records")
    labels = pd.Series([label(c) for c in configs], index=runs.index)
    styles: dict[str, dict] = {}
    for c in sorted(configs, key=lambda c: [order(k, c[k]) for k in keys]):
        styles.setdefault(label(c), {"color": color(c, len(styles)), "linestyle": linestyle(c)})
    return labels, styles


def _notes(runs: pd.DataFrame, panel: pd.Series, series: pd.Series) -> pd.DataFrame:
    frame = pd.DataFrame({"panel": panel, "series": series})
    counts = divergence_counts(frame, ["panel", "series"], runs["outcome"] == DIVERGED)
    counts["diverged"] = [divergence_note(d, n) for d, n in zip(counts["n_diverged"], counts["n_runs"])]
    return counts[["panel", "series", "diverged"]]


def metric_curves(
    ctx: Context, runs: pd.DataFrame, metric: str, panel: pd.Series, series: pd.Series, x: str = "step"
) -> pd.DataFrame:
    """Median/IQR across seeds of a logged metric against step (or elapsed seconds), per panel and series.

    x="seconds": the curve is still aggregated per step; its x is the median
    across seeds of the seconds from the run's first logged point to that step.
    """
    points = ctx.histories
    points = points[
        (points["key"] == metric) & points["run_id"].isin(runs.loc[runs["outcome"] == FINISHED, "run_id"])
    ]
    meta = pd.DataFrame({"run_id": runs["run_id"], "panel": panel, "series": series, SEED: runs[SEED]})
    # Time zero of a run is its first logged point (the evaluation at step 0), not the MLflow run's
    # start_time: a sweep's driver may open the run after the trial has started logging.
    first = ctx.histories.groupby("run_id")["timestamp"].min().rename("start")
    points = points.merge(meta, on="run_id").merge(first, on="run_id")
    if points.empty:
        raise MissingInput(f"no finished run has `{metric}` points")
    # Per seed: a repeated (config, seed), e.g. a rerun, counts once (its mean).
    per_seed = points.groupby(["panel", "series", SEED, "step"], as_index=False).agg(
        value=("value", "mean"), seconds=("timestamp", "mean"), start=("start", "mean")
    )
    curves = seed_band(per_seed, ["panel", "series"], "step", "value")
    if x == "seconds":
        per_seed["elapsed"] = (per_seed["seconds"] - per_seed["start"]) / 1000.0
        elapsed = per_seed.groupby(["panel", "series", "step"], as_index=False)["elapsed"].median()
        curves = curves.merge(elapsed, on=["panel", "series", "step"]).drop(columns="step")
    curves = curves.rename(columns={"step": "x", "elapsed": "x"})
    curves = curves.merge(_notes(runs, panel, series), on=["panel", "series"], how="left")
    return curves[CURVE_COLUMNS]


def lloyd_reference(curves: pd.DataFrame, level: float = 1.0) -> pd.DataFrame:
    """Lloyd's as a flat black line at `level` (val_rel_lloyd is relative to one Lloyd step) in every
    panel."""
    rows = []
    for panel, part in curves.groupby("panel", sort=False):
        for x in (part["x"].min(), part["x"].max()):
            rows.append(
                {
                    "panel": panel,
                    "series": LLOYD,
                    "x": x,
                    "median": level,
                    "q25": level,
                    "q75": level,
                    "n_seeds": 0,
                    "diverged": "",
                }
            )
    return pd.concat([curves, pd.DataFrame(rows)], ignore_index=True)


# The task key each evaluation replaces when it draws its tasks (analysis.checkpoint_eval): runs that differ
# only there were evaluated on the same tasks, e.g. family transfer tests models trained on every family on
# one set of tasks.
REPLACED = {"multistep": "task.init", "length": "task.n", "family_transfer": "task.family"}


def evaluation_rows(
    ctx: Context, runs: pd.DataFrame, name: str, panel_of, series: pd.Series, methods: tuple[str, ...]
) -> pd.DataFrame:
    """Every finished run's evaluation `name` (read beforehand): its rows labelled panel, series, seed, step,
    value and `unit`.

    panel_of(table, run) -> Series of panel names for the rows of one run's evaluation table.
    A model's series is '<series> <method>' when several methods are shown; Lloyd's is one black series per
    panel.
    unit is what a row measures: a model row, the trained model (its configuration and seed); a Lloyd row,
    the tasks it ran on (the run's task keys but the one the evaluation replaces, the condition, the seed).
    """
    finished = runs[runs["outcome"] == FINISHED]
    if finished.empty:
        raise MissingInput(
            f"{name}: no finished run to evaluate ({len(runs)} runs, all diverged or unfinished)"
        )
    keys = config_keys(runs.columns)
    task_keys = [k for k in keys if k.startswith("task.") and k != REPLACED.get(name)]
    tables = []
    for index, run in finished.iterrows():
        table = ctx.evaluation(name, run)
        conditions = [c for c in table.columns if c not in ("method", "step", "value")]
        table["panel"] = panel_of(table, run).to_numpy()
        table = table[table["method"].isin(methods) | (table["method"] == LLOYD_METHOD)].assign(
            **{SEED: run[SEED]}
        )
        labels = pd.Series(series[index], index=table.index)
        if len(methods) > 1:
            labels = labels + " " + table["method"]
        lloyd = table["method"] == LLOYD_METHOD
        table["series"] = labels.where(~lloyd, LLOYD)
        model = "/".join(f"{k}={run[k]}" for k in keys)
        tasks = (
            "/".join(f"{k}={run[k]}" for k in task_keys)
            + "/"
            + table[conditions].astype(str).agg("/".join, axis=1)
        )
        table["unit"] = tasks.where(lloyd, model)
        tables.append(table[["panel", "series", SEED, "step", "value", "unit"]])
    return pd.concat(tables, ignore_index=True)


def count_once(rows: pd.DataFrame) -> pd.DataFrame:
    """One value per (panel, series, seed, step, unit): Lloyd's once per seed and set of tasks, every model
    kept.

    Models of one seed share Lloyd's tasks, so Lloyd's counts once, while models trained on different
    configurations (e.g. on four families, tested in one panel) all count; a repeated (configuration, seed),
    e.g. a rerun, counts once (its mean).
    """
    return rows.groupby(["panel", "series", SEED, "step", "unit"], as_index=False, sort=False)["value"].mean()


def eval_curves(
    ctx: Context, runs: pd.DataFrame, name: str, panel_of, series: pd.Series, methods: tuple[str, ...]
) -> pd.DataFrame:
    """Every finished run's evaluation (read beforehand), then median/IQR across seeds per panel and series
    (evaluation_rows)."""
    per_seed = count_once(evaluation_rows(ctx, runs, name, panel_of, series, methods))
    curves = seed_band(per_seed, ["panel", "series"], "step", "value").rename(columns={"step": "x"})
    notes = _notes(runs, pd.Series("", index=runs.index), series).drop(columns="panel")
    curves = (
        curves.assign(base=curves["series"].str.split(" ").str[0])
        .merge(notes.rename(columns={"series": "base"}), on="base", how="left")
        .drop(columns="base")
    )
    curves["diverged"] = curves["diverged"].fillna("")
    return curves[CURVE_COLUMNS]
