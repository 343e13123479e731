"""Figures from what training logged: convergence, ablations, time to quality; and speed/memory from the benchmark."""

from __future__ import annotations

import json

import pandas as pd

from analysis.context import Context, lloyd_reference, metric_curves, narrow, series_labels, varying
from analysis.plot import CURVE_COLUMNS, Figure, MissingInput, draw_curves
from analysis.style import EMBEDDING_COLORS, short
from sweeper.metrics import TRAIN_LOSS, VAL_REL_LLOYD

MEASURES = ("forward_seconds", "backward_seconds", "peak_memory_bytes")
ABLATIONS = {"optim.lr": "lr", "task.n": "points", "task.d": "dim", "task.k": "clusters", "task.family": "family"}


def _panel(runs: pd.DataFrame, keys: list[str], prefix: str = "") -> pd.Series:
    return pd.Series([prefix + ", ".join(short(k, r[k]) for k in keys) for _, r in runs.iterrows()], index=runs.index)


def convergence(ctx: Context) -> Figure:
    """train_loss and val_rel_lloyd against step, by tau, regularizer, embedding and d."""
    runs = narrow(ctx.subgrid("tau"), keep=["loss.tau", "loss.regularizer", "model.embedding", "task.d"])
    series, styles = series_labels(runs, ["model.embedding", "loss.regularizer"])
    parts = []
    for metric in (TRAIN_LOSS, VAL_REL_LLOYD):
        panel = _panel(runs, ["task.d", "loss.tau"], f"{metric} | ")
        curves = metric_curves(ctx, runs, metric, panel, series)
        parts.append(lloyd_reference(curves) if metric == VAL_REL_LLOYD else curves)
    data = pd.concat(parts, ignore_index=True)
    n_cols = data.loc[data["panel"].str.startswith(TRAIN_LOSS), "panel"].nunique()
    files = draw_curves(data, styles, ctx.out_dir, "convergence", xlabel="step", ylabel="value (log)", logy=True,
                        ncols=n_cols)
    notes = [f"tau sub-grid: {ctx.coverage('tau')}"]
    return Figure("convergence", data, list(runs["run_id"]), files, notes=notes)


def ablations(ctx: Context) -> Figure:
    """val_rel_lloyd against step, one panel per axis (lr, n, d, k, family), one series per axis value."""
    parts, used, notes, styles = [], [], [], {}
    for key, subgrid in ABLATIONS.items():
        pool = ctx.subgrid(subgrid)
        if key not in pool or key not in varying(pool):
            notes.append(f"{key}: needs the `{subgrid}` sub-grid (runs that differ in {key}); {ctx.coverage(subgrid)}")
            continue
        runs = narrow(pool, keep=[key])
        if runs[key].nunique() < 2:
            notes.append(f"{key}: only one value left once the other keys are fixed")
            continue
        series, part_styles = series_labels(runs, [key])
        styles.update(part_styles)
        curves = metric_curves(ctx, runs, VAL_REL_LLOYD, pd.Series(f"{VAL_REL_LLOYD} by {key}", index=runs.index), series)
        parts.append(lloyd_reference(curves))
        used += list(runs["run_id"])
    if not parts:
        raise MissingInput("ablations: no axis varies; " + "; ".join(notes))
    data = pd.concat(parts, ignore_index=True)
    files = draw_curves(data, styles, ctx.out_dir, "ablations", xlabel="step", ylabel=VAL_REL_LLOYD, logy=True)
    return Figure("ablations", data, used, files, notes=notes)


def time_to_quality(ctx: Context) -> Figure:
    """val_rel_lloyd against elapsed seconds, onehot vs binary, per (d, k)."""
    pool = ctx.subgrid("compute")
    runs = narrow(pool[pool["model.embedding"].isin(["onehot", "binary"])],
                  keep=["model.embedding", "task.d", "task.k"])
    if runs.empty:
        raise MissingInput("time_to_quality: needs onehot and binary runs (the `compute` sub-grid); none found")
    series, styles = series_labels(runs, ["model.embedding"])
    curves = metric_curves(ctx, runs, VAL_REL_LLOYD, _panel(runs, ["task.d", "task.k"]), series, x="seconds")
    data = lloyd_reference(curves)
    files = draw_curves(data, styles, ctx.out_dir, "time_to_quality", xlabel="elapsed seconds", ylabel=VAL_REL_LLOYD,
                        logy=True)
    return Figure("time_to_quality", data, list(runs["run_id"]), files,
                  notes=[f"compute sub-grid: {ctx.coverage('compute')}"])


def speed_memory(ctx: Context) -> Figure:
    """Forward/backward time and peak memory, binary vs onehot, from `python -m analysis.bench speed_memory` JSON."""
    path = ctx.speed_json
    if path is None or not path.exists():
        raise MissingInput(f"speed_memory: needs the benchmark's JSON ({path}); write it with "
                           f"`python -m analysis.bench speed_memory --out {path}`")
    rows = json.loads(path.read_text()).get("rows", [])
    records = [{"embedding": e, "d": r["d"], "k": r["k"], **r[e]} for r in rows for e in EMBEDDING_COLORS
               if isinstance(r.get(e), dict)]
    if not records:
        raise MissingInput(f"speed_memory: {path} holds no benchmark rows (expected rows of d, k, onehot, binary)")
    frame = pd.DataFrame(records)
    data = pd.DataFrame([{"panel": f"{measure} | d={r.d}", "series": short("model.embedding", r.embedding), "x": r.k,
                          "median": getattr(r, measure), "q25": getattr(r, measure), "q75": getattr(r, measure),
                          "n_seeds": 1, "diverged": ""}
                         for measure in MEASURES for r in frame.itertuples()], columns=CURVE_COLUMNS)
    styles = {short("model.embedding", e): {"color": c} for e, c in EMBEDDING_COLORS.items()}
    files = draw_curves(data, styles, ctx.out_dir, "speed_memory", xlabel="k", ylabel="seconds or bytes", logy=True,
                        ncols=frame["d"].nunique())
    ratios = pd.DataFrame(rows).drop(columns=[e for e in EMBEDDING_COLORS if e in rows[0]])
    return Figure("speed_memory", data, [], files, tables={"speed_memory_ratios": ratios}, notes=[f"from {path}"])
