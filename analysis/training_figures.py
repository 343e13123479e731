"""Figures from what training logged: convergence, the ablations (one per sub-grid), time to quality; and
speed/memory from the benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.aggregate import divergence_counts, divergence_note, seed_band
from analysis.context import Context, lloyd_reference, metric_curves, narrow, series_labels, varying
from analysis.plot import CURVE_COLUMNS, Figure, MissingInput, draw_curves, draw_points
from analysis.style import AXIS_NAMES, EMBEDDING_COLORS, LLOYD, short
from tracking.names import DIVERGED, FINISHED, SEED, SUBGRIDS, TRAIN_LOSS, VAL_REL_LLOYD

MEASURES = ("forward_seconds", "backward_seconds", "peak_memory_bytes")
# Sub-grid (docs/science.md section 6) -> the config key it varies: one ablation figure each,
# `ablation_<sub-grid>`.
ABLATIONS = {
    "lr": "optim.lr",
    "points": "task.n",
    "dim": "task.d",
    "clusters": "task.k",
    "family": "task.family",
}
FACETS = ["task.d", "loss.tau"]  # an ablation's panels: one per (d, tau) its runs have
SERIES = [
    "model.embedding",
    "loss.regularizer",
]  # convergence's and the ablations' series: colour, line style


def _panel(runs: pd.DataFrame, keys: list[str], prefix: str = "") -> pd.Series:
    return pd.Series(
        [prefix + ", ".join(short(k, r[k]) for k in keys) for _, r in runs.iterrows()], index=runs.index
    )


def convergence(ctx: Context) -> Figure:
    """train_loss and val_rel_lloyd against step, by tau, regularizer, embedding and d, each run at its own
    length (a sweep may train tau 1 shorter than tau 0.1: the panels then name their steps)."""
    keep = ["loss.tau", "loss.regularizer", "model.embedding", "task.d", "train.steps"]
    runs, drawn = narrow(ctx.subgrid("tau"), keep=keep)
    runs = runs.sort_values(["task.d", "loss.tau", "train.steps"], kind="stable")  # panel order
    series, styles = series_labels(runs, SERIES)
    facets = ["task.d", "loss.tau"] + (["train.steps"] if runs["train.steps"].nunique() > 1 else [])
    parts = []
    for metric in (TRAIN_LOSS, VAL_REL_LLOYD):
        panel = _panel(runs, facets, f"{metric} | ")
        curves = metric_curves(ctx, runs, metric, panel, series)
        parts.append(lloyd_reference(curves) if metric == VAL_REL_LLOYD else curves)
    data = pd.concat(parts, ignore_index=True)
    panels = [
        p
        for p in dict.fromkeys(_panel(runs, facets))
        for p in (f"{TRAIN_LOSS} | {p}", f"{VAL_REL_LLOYD} | {p}")
    ]
    panels = [p for p in panels if p in set(data["panel"])]
    ylims = without_first_points(data)
    files = draw_curves(
        data,
        styles,
        ctx.out_dir,
        "convergence",
        xlabel="step",
        ylabel="value (log)",
        logy=True,
        ncols=2,
        panels=panels,
        ylims=ylims,
    )
    notes = [
        f"tau sub-grid: {ctx.coverage('tau')}",
        *drawn,
        "each panel's y-range leaves out every curve's first point (the untrained model: up to "
        f"{_first_points(data).max():.3g}), so that the trained models and Lloyd's line stay apart; "
        "convergence.csv holds every point",
    ]
    return Figure("convergence", data, list(runs["run_id"]), files, notes=notes, ylims=ylims)


def _first_points(data: pd.DataFrame) -> pd.Series:
    """Each model curve's first median (its earliest logged step)."""
    models = data[data["series"] != LLOYD]
    return models.loc[models.groupby(["panel", "series"])["x"].idxmin(), "median"]


def without_first_points(data: pd.DataFrame, margin: float = 0.05) -> dict[str, tuple[float, float]]:
    """Per panel, a log y-range over every curve's IQR band but its first point, and Lloyd's line: the
    untrained model's point (val_rel_lloyd up to ~60) would squash everything else together near 1. The
    range is widened by `margin` of its (log) width on each side."""
    ranges = {}
    for panel, part in data.groupby("panel", sort=False):
        first = part.groupby("series")["x"].transform("min")
        shown = part[(part["x"] > first) | (part["series"] == LLOYD)]
        shown = shown if not shown.empty else part  # curves of a single point: nothing to leave out
        values = np.log10(
            pd.concat([shown["q25"], shown["q75"], shown["median"]]).where(lambda v: v > 0).dropna()
        )
        if values.empty:
            continue
        low, high = values.min(), values.max()
        pad = margin * max(high - low, 0.1)
        ranges[panel] = (float(10 ** (low - pad)), float(10 ** (high + pad)))
    return ranges


def final_values(runs: pd.DataFrame, axis: str, panel: pd.Series, series: pd.Series) -> pd.DataFrame:
    """Median/IQR across seeds of the runs' final val_rel_lloyd at each value of `axis`, per panel and series.

    A run's final value is its last evaluation; finished runs only, and a (configuration, seed) run twice
    counts once (its mean). Each point's `diverged` counts its diverged runs, and a point whose runs all
    diverged keeps its row (no median) so the count is not lost.
    """
    frame = pd.DataFrame(
        {"panel": panel, "series": series, "x": runs[axis], SEED: runs[SEED], "value": runs[VAL_REL_LLOYD]}
    )
    finished = frame[runs["outcome"] == FINISHED]
    per_seed = finished.groupby(["panel", "series", "x", SEED], as_index=False)["value"].mean()
    band = seed_band(per_seed, ["panel", "series"], "x", "value")
    counts = divergence_counts(frame, ["panel", "series", "x"], runs["outcome"] == DIVERGED)
    counts["diverged"] = [divergence_note(d, n) for d, n in zip(counts["n_diverged"], counts["n_runs"])]
    points = band.merge(counts, on=["panel", "series", "x"], how="right")
    points["n_seeds"] = points["n_seeds"].fillna(0).astype(int)
    return points.loc[(points["n_seeds"] > 0) | (points["diverged"] != ""), CURVE_COLUMNS].reset_index(
        drop=True
    )


def _facets(runs: pd.DataFrame, axis: str) -> list[str]:
    """Panel keys: d and tau (bar the axis), then any other key varying among the runs, so none is pooled."""
    keys = [k for k in FACETS if k != axis]
    return keys + [k for k in varying(runs) if k not in keys + SERIES + [axis]]


def _ablation_runs(ctx: Context, subgrid: str) -> pd.DataFrame:
    runs = ctx.tagged(subgrid)
    if runs.empty:
        raise MissingInput(
            f"needs the `{subgrid}` sub-grid (runs tagged {SUBGRIDS}={subgrid}); {ctx.coverage(subgrid)}"
        )
    return runs.sort_values(
        _facets(runs, ABLATIONS[subgrid]) + [ABLATIONS[subgrid]], kind="stable"
    )  # panel order


def ablation(ctx: Context, subgrid: str) -> Figure:
    """Final val_rel_lloyd against the sub-grid's axis: one panel per (d, tau), one series per embedding x
    regularizer.

    The paper's ablation findings are differences between these series and panels (binary against onehot
    as k rises at d 4, tau 1; l2 against ne at tau 1 on gumbel and laplace; the lr minima at d 32), so
    nothing is narrowed to one slice.
    """
    runs, axis = _ablation_runs(ctx, subgrid), ABLATIONS[subgrid]
    series, styles = series_labels(runs, SERIES)
    panel = _panel(runs, _facets(runs, axis))
    data = lloyd_reference(final_values(runs, axis, panel, series))
    name = f"ablation_{subgrid}"
    files = draw_points(
        data,
        styles,
        ctx.out_dir,
        name,
        xlabel=AXIS_NAMES[axis],
        ylabel=f"final {VAL_REL_LLOYD}",
        logy=True,
        ncols=runs["loss.tau"].nunique(),
        panels=list(dict.fromkeys(panel)),
    )
    notes = [
        f"`{subgrid}` sub-grid: {ctx.coverage(subgrid)}",
        f"each point: the median across seeds of the runs' final {VAL_REL_LLOYD}, bars the inter-quartile "
        "range; below Lloyd's line (1) beats one Lloyd step; an x at a panel's top: some runs of that series "
        f"diverged there (left out; counted in the `diverged` column of {name}.csv)",
    ]
    return Figure(name, data, list(runs["run_id"]), files, notes=notes)


def lr_curves(ctx: Context) -> Figure:
    """val_rel_lloyd against step for each lr: how fast, and whether, each rate gets to its final value."""
    runs = _ablation_runs(ctx, "lr")
    series, styles = series_labels(runs, SERIES)
    panel = _panel(runs, _facets(runs, "optim.lr") + ["optim.lr"])
    data = lloyd_reference(metric_curves(ctx, runs, VAL_REL_LLOYD, panel, series))
    files = draw_curves(
        data,
        styles,
        ctx.out_dir,
        "ablation_lr_curves",
        xlabel="step",
        ylabel=VAL_REL_LLOYD,
        logy=True,
        ncols=runs["optim.lr"].nunique(),
        panels=list(dict.fromkeys(panel)),
    )
    return Figure(
        "ablation_lr_curves",
        data,
        list(runs["run_id"]),
        files,
        notes=[f"`lr` sub-grid: {ctx.coverage('lr')}"],
    )


def time_to_quality(ctx: Context) -> Figure:
    """val_rel_lloyd against training seconds, onehot vs binary, per (d, k).

    The x axis is step x the model's own seconds per training step, read from `python -m bench
    step_seconds` JSON (step_json=), not the trial's wall-clock, which also counts validation,
    checkpointing and the other models of a pack; nothing is timed while drawing.
    """
    pool = ctx.subgrid("compute")
    runs, drawn = narrow(
        pool[pool["model.embedding"].isin(["onehot", "binary"])], keep=["model.embedding", "task.d", "task.k"]
    )
    if runs.empty:
        raise MissingInput(
            "time_to_quality: needs onehot and binary runs (the `compute` sub-grid); none found"
        )
    runs = runs.sort_values(["task.d", "task.k"], kind="stable")  # panel order
    series, styles = series_labels(runs, ["model.embedding"])
    panel = _panel(runs, ["task.d", "task.k"])
    measured = _step_benchmark(ctx.step_json)
    seconds = step_seconds(measured, runs, panel, series, ctx.step_json)
    curves = metric_curves(ctx, runs, VAL_REL_LLOYD, panel, series).merge(seconds, on=["panel", "series"])
    curves["x"] = curves["x"] * curves.pop("seconds_per_step")
    data = lloyd_reference(curves[CURVE_COLUMNS])
    files = draw_curves(
        data,
        styles,
        ctx.out_dir,
        "time_to_quality",
        xlabel="step x seconds per step",
        ylabel=VAL_REL_LLOYD,
        logy=True,
        panels=list(dict.fromkeys(panel)),
    )
    notes = [
        f"compute sub-grid: {ctx.coverage('compute')}",
        *drawn,
        f"seconds per step (table step_seconds): from {ctx.step_json} (`python -m bench step_seconds`, "
        f"sweep {measured.get('sweep')}), measured on {measured.get('device')} with "
        f"{measured.get('threads')} threads, the median of {measured.get('rounds')} training steps "
        "(after one warm-up step) of a fresh model at each series' shape, the shapes timed alternately",
    ]
    return Figure(
        "time_to_quality", data, list(runs["run_id"]), files, tables={"step_seconds": seconds}, notes=notes
    )


def _how_to_write(path: Path | None) -> str:
    return f"write it with `python -m bench step_seconds sweep=NAME --out {path}` (NAME: the runs' sweep)"


def _step_benchmark(path: Path | None) -> dict:
    if path is None or not path.exists():
        raise MissingInput(
            f"time_to_quality: needs the step-time benchmark's JSON ({path}); {_how_to_write(path)}"
        )
    return json.loads(path.read_text())


def step_seconds(
    measured: dict, runs: pd.DataFrame, panel: pd.Series, series: pd.Series, path: Path | None
) -> pd.DataFrame:
    """Seconds per training step of each panel's series: the benchmark row whose shape is that of the
    series' first run (every key the row names, equal)."""
    firsts = runs.assign(panel=panel, series=series).drop_duplicates(["panel", "series"])
    measured_rows, rows = measured.get("rows", []), []
    for _, run in firsts.iterrows():
        hits = [r for r in measured_rows if all(_same(run.get(k), v) for k, v in r["config"].items())]
        if not hits:
            keys = measured_rows[0]["config"] if measured_rows else ["task.d", "task.k", "model.embedding"]
            raise MissingInput(
                f"time_to_quality: {path} has no step time for {run['series']} "
                f"({', '.join(f'{k}={run.get(k)}' for k in keys)}); {_how_to_write(path)}"
            )
        seconds = hits[0]["seconds_per_step"]
        rows.append({"panel": run["panel"], "series": run["series"], "seconds_per_step": seconds})
    return pd.DataFrame(rows)


def _same(a: object, b: object) -> bool:
    """A run's value (from MLflow params) against the benchmark's (from the config): numbers by value."""
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return False
    return str(a) == str(b)


def speed_memory(ctx: Context) -> Figure:
    """Forward/backward time and peak memory, binary vs onehot, from `python -m bench speed_memory` JSON."""
    path = ctx.speed_json
    if path is None or not path.exists():
        raise MissingInput(
            f"speed_memory: needs the benchmark's JSON ({path}); write it with "
            f"`python -m bench speed_memory --out {path}`"
        )
    rows = json.loads(path.read_text()).get("rows", [])
    records = [
        {"embedding": e, "d": r["d"], "k": r["k"], **r[e]}
        for r in rows
        for e in EMBEDDING_COLORS
        if isinstance(r.get(e), dict)
    ]
    if not records:
        raise MissingInput(
            f"speed_memory: {path} holds no benchmark rows (expected rows of d, k, onehot, binary)"
        )
    frame = pd.DataFrame(records)
    data = pd.DataFrame(
        [
            {
                "panel": f"{measure} | d={r.d}",
                "series": short("model.embedding", r.embedding),
                "x": r.k,
                "median": getattr(r, measure),
                "q25": getattr(r, measure),
                "q75": getattr(r, measure),
                "n_seeds": 1,
                "diverged": "",
            }
            for measure in MEASURES
            for r in frame.itertuples()
        ],
        columns=CURVE_COLUMNS,
    )
    styles = {short("model.embedding", e): {"color": c} for e, c in EMBEDDING_COLORS.items()}
    files = draw_curves(
        data,
        styles,
        ctx.out_dir,
        "speed_memory",
        xlabel="k",
        ylabel="seconds or bytes",
        logy=True,
        ncols=frame["d"].nunique(),
    )
    ratios = pd.DataFrame(rows).drop(columns=[e for e in EMBEDDING_COLORS if e in rows[0]])
    return Figure(
        "speed_memory", data, [], files, tables={"speed_memory_ratios": ratios}, notes=[f"from {path}"]
    )
