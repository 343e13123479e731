"""Figures of trained models evaluated on fresh tasks (analysis.checkpoint_eval), and task dissimilarity."""

from __future__ import annotations

import zlib
from collections import Counter

import numpy as np
import pandas as pd
import torch
from scipy.stats import wasserstein_distance

from analysis.aggregate import divergence_note
from analysis.checkpoint_eval import EvalSettings, length_left_out, lengths_of
from analysis.context import (
    REFERENCE,
    Context,
    Want,
    eval_curves,
    evaluations_of,
    narrow,
    scope,
    series_labels,
    varying,
)
from analysis.plot import Figure, MissingInput, draw_contours, draw_curves, draw_heatmap
from analysis.style import LLOYD, short
from models.losses import sq_distances
from tasks.sampler import TaskSpec, sample_tasks
from tasks.spec import FAMILIES
from tracking.names import DIVERGED, FINISHED

YLABEL = "mean log k-means objective"
TRANSFERRED = ("onehot", "binary")
# The models each probe evaluates, as (sub-grid, slice): the paper iterates, lengthens and shifts the `tau`
# sub-grid's models at tau 0.1 and d 4 (section 4, Figures 4-7), and transfers the `family` sub-grid's OH/BN
# models at tau 0.1 (Figures 8, 18). The figures draw these models and analysis.claims judges them: one set.
PROBES = {
    "multistep": ("tau", {"loss.tau": 0.1, "task.d": 4}),
    "length": ("tau", {"loss.tau": 0.1, "task.d": 4}),
    "mixture_shift": ("tau", {"loss.tau": 0.1, "task.d": 4}),
    "family_transfer": ("family", {"loss.tau": 0.1, "model.embedding": TRANSFERRED}),
}
SERIES_KEYS = ["model.embedding", "loss.regularizer"]  # first in a legend, when they vary


def probed(
    ctx: Context, evaluation: str, fallback: pd.DataFrame, keep: list[str]
) -> tuple[pd.DataFrame, list[str]]:
    """The models `evaluation` draws: its PROBES slice when the store has a finished run there; else (a store
    without the paper's sub-grids) one configuration per `keep` value of `fallback`, which no claim judges."""
    runs = scope(ctx.runs, *PROBES[evaluation])
    if (runs["outcome"] == FINISHED).any():
        return runs, []
    runs, drawn = narrow(fallback, keep=keep)
    if not (runs["outcome"] == FINISHED).any():
        raise MissingInput(f"no finished run with checkpoints among {len(runs)} candidate runs")
    subgrid, where = PROBES[evaluation]
    return runs, [
        f"not the paper's probed models (`{subgrid}` sub-grid, {where}): none finished; no claim reads these",
        *drawn,
    ]


def _series(runs: pd.DataFrame, panel_key: str = "") -> tuple[pd.Series, dict[str, dict]]:
    """A series per configuration (every key that varies but the one naming the panels), OH-L2 style."""
    keys = [k for k in varying(runs) if k != panel_key]
    keys = [k for k in SERIES_KEYS if k in keys] + [k for k in keys if k not in SERIES_KEYS]
    return series_labels(runs, keys or SERIES_KEYS[:1])


def _multistep_models(ctx: Context) -> tuple[pd.DataFrame, list[str]]:
    return probed(ctx, "multistep", ctx.runs, ["model.embedding"])


def multistep(ctx: Context) -> Figure:
    """T re-applications (re-embedded, naive, attention-only) against Lloyd's; a panel per init and method."""
    runs, caveat = _multistep_models(ctx)
    series, styles = _series(runs)
    methods = ("reembed", "naive", "attention")
    data = pd.concat(
        [
            eval_curves(
                ctx, runs, "multistep", lambda t, r, m=m: "init " + t["init"] + " | " + m, series, (m,)
            )
            for m in methods
        ],
        ignore_index=True,
    )
    panels = [f"init {i} | {m}" for i in ctx.settings.inits for m in methods]
    files = draw_curves(
        data,
        styles,
        ctx.out_dir,
        "multistep",
        xlabel="step t",
        ylabel=YLABEL,
        ncols=len(methods),
        panels=panels,
    )
    return Figure("multistep", data, list(runs["run_id"]), files, notes=caveat + _which(ctx, runs))


def _shift_models(ctx: Context) -> tuple[pd.DataFrame, list[str]]:
    """The probe's models, among those trained on equal isotropic normal mixtures."""
    pool = ctx.runs[
        (ctx.runs["task.family"] == "normal")
        & ctx.runs["task.equal_weights"].astype(bool)
        & ctx.runs["task.equal_scales"].astype(bool)
    ]
    if pool.empty:
        raise MissingInput(
            "mixture_shift: needs models trained on equal, isotropic normal mixtures; none found"
        )
    return probed(ctx, "mixture_shift", pool, ["model.embedding"])


def mixture_shift(ctx: Context) -> Figure:
    """Trained on equal isotropic normal mixtures; tested on shifted mixtures, T steps, against Lloyd's."""
    runs, caveat = _shift_models(ctx)
    series, styles = _series(runs)
    data = eval_curves(ctx, runs, "mixture_shift", lambda t, r: "test: " + t["shift"], series, ("reembed",))
    files = draw_curves(data, styles, ctx.out_dir, "mixture_shift", xlabel="step t", ylabel=YLABEL)
    return Figure("mixture_shift", data, list(runs["run_id"]), files, notes=caveat + _which(ctx, runs))


def _length_models(ctx: Context) -> tuple[pd.DataFrame, list[str]]:
    """The probe's models, with a note per test length some cannot have; MissingInput when none fits."""
    runs, caveat = probed(ctx, "length", ctx.runs, ["model.embedding"])
    finished = [run for _, run in runs[runs["outcome"] == FINISHED].iterrows()]
    left_out = _lengths_left_out(finished, ctx.settings)
    if not any(lengths_of(run, ctx.settings) for run in finished):
        raise MissingInput(f"length: no test length fits the models' tasks ({'; '.join(left_out)})")
    return runs, caveat + left_out


def length(ctx: Context) -> Figure:
    """Trained at one n; tested at n_train x {1/4, 1/2, 2, 4} (or eval.lengths), T steps, against Lloyd's."""
    runs, notes = _length_models(ctx)
    series, styles = _series(runs)
    data = eval_curves(ctx, runs, "length", lambda t, r: "test n=" + t["n"].astype(str), series, ("reembed",))
    panels = sorted(set(data["panel"]), key=lambda p: int(p.removeprefix("test n=")))  # n ascending
    files = draw_curves(data, styles, ctx.out_dir, "length", xlabel="step t", ylabel=YLABEL, panels=panels)
    return Figure("length", data, list(runs["run_id"]), files, notes=notes + _which(ctx, runs))


def _lengths_left_out(runs: list[pd.Series], settings: EvalSettings) -> list[str]:
    """A note per test length that some runs' tasks cannot have, with the number of runs and why."""
    counts = Counter(item for run in runs for item in length_left_out(run, settings).items())
    return [
        f"test n={n} left out for {count} of {len(runs)} runs: {why}"
        for (n, why), count in sorted(counts.items())
    ]


def _transfer_models(ctx: Context) -> tuple[pd.DataFrame, list[str]]:
    return probed(ctx, "family_transfer", ctx.subgrid("family"), ["task.family", "model.embedding"])


def family_transfer(ctx: Context) -> Figure:
    """Train family x test family, T steps, against Lloyd's; and their values at steps 0, 1 and T as a table
    (family_transfer_table; not the paper's Table 1, which times GPU runs)."""
    runs, caveat = _transfer_models(ctx)
    series, styles = _series(runs, "task.family")
    trained = [f for f in FAMILIES if f in set(runs["task.family"])]
    of = {f: runs["task.family"] == f for f in trained}
    status = {f: divergence_note((of[f] & (runs["outcome"] == DIVERGED)).sum(), of[f].sum()) for f in trained}
    title = lambda f: f"train {f}" + (f" ({status[f]})" if status[f] else "")  # noqa: E731
    data = eval_curves(
        ctx,
        runs,
        "family_transfer",
        lambda t, r: title(r["task.family"]) + " | test " + t["test_family"],
        series,
        ("reembed",),
    )
    panels = [f"{title(f)} | test {g}" for f in trained for g in FAMILIES]
    panels = [p for p in panels if p in set(data["panel"])]
    files = draw_curves(
        data,
        styles,
        ctx.out_dir,
        "family_transfer",
        xlabel="step t",
        ylabel=YLABEL,
        ncols=len(FAMILIES),
        panels=panels,
    )
    notes = caveat + _which(ctx, runs)
    if len(trained) < len(FAMILIES):
        notes.append(
            f"trained on {', '.join(trained)} only: the full 5 x 5 grid needs the `family` sub-grid; "
            f"{ctx.coverage('family')}"
        )
    return Figure(
        "family_transfer",
        data,
        list(runs["run_id"]),
        files,
        tables={"family_transfer_table": transfer_table(data, ctx.settings.steps)},
        notes=notes,
    )


def transfer_table(data: pd.DataFrame, steps: int) -> pd.DataFrame:
    """Lloyd's and each model at steps 0, 1 and T per train/test family: median [q25, q75] across seeds."""
    rows = []
    for (panel, series), part in data.groupby(["panel", "series"], sort=False):
        train, test = panel.split(" | ")
        row = {"train": train.removeprefix("train "), "test": test.removeprefix("test "), "method": series}
        for t in (0, 1, steps):
            hit = part[part["x"] == t]
            if not hit.empty:
                h = hit.iloc[0]
                row[f"step {t}"] = f"{h['median']:.3f} [{h['q25']:.3f}, {h['q75']:.3f}]"
        rows.append(row)
    table = pd.DataFrame(rows)
    table["_lloyd_last"] = table["method"] == LLOYD  # Lloyd's row first within each train/test pair
    return (
        table.sort_values(["train", "test", "_lloyd_last"], ascending=[True, True, False], kind="stable")
        .drop(columns="_lloyd_last")
        .reset_index(drop=True)
    )


def dissimilarity(ctx: Context) -> tuple[TaskSpec, list[str], np.ndarray, pd.DataFrame, pd.DataFrame]:
    """Pairwise earth-mover distances between tasks' distributions of squared point-to-initial-center
    distances: (task spec, task names, distance matrix, long table, family-block means). No drawing, so
    the claims compute it alone (`python -m analysis.claims`) without touching the report's figure."""
    spec = _dissimilarity_spec(ctx)
    per_family = ctx.settings.dissimilarity_tasks
    names, samples = [], []
    for family in FAMILIES:
        generator = torch.Generator().manual_seed(
            zlib.crc32(f"{ctx.settings.seed}/dissimilarity/{family}".encode())
        )
        X, C0 = sample_tasks(TaskSpec(**{**spec.__dict__, "family": family}), per_family, generator)
        for i in range(per_family):
            names.append(f"{family} {i}")
            samples.append(sq_distances(X[i : i + 1], C0[i : i + 1]).flatten().double().numpy())
    m = len(samples)
    matrix = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            matrix[i, j] = matrix[j, i] = wasserstein_distance(samples[i], samples[j])
    families = [n.split(" ")[0] for n in names]
    data = pd.DataFrame(
        [
            {
                "task_i": names[i],
                "family_i": families[i],
                "task_j": names[j],
                "family_j": families[j],
                "distance": matrix[i, j],
            }
            for i in range(m)
            for j in range(m)
        ]
    )
    blocks = (
        data.groupby(["family_i", "family_j"])["distance"]
        .mean()
        .unstack()
        .loc[list(FAMILIES), list(FAMILIES)]
    )
    return spec, names, matrix, data, blocks.reset_index()


def task_dissimilarity(ctx: Context) -> Figure:
    """The dissimilarity map (`dissimilarity`) drawn as a heatmap, its family blocks as a table."""
    spec, names, matrix, data, blocks = dissimilarity(ctx)
    per_family = ctx.settings.dissimilarity_tasks
    files = draw_heatmap(
        matrix,
        names,
        ctx.out_dir,
        "task_dissimilarity",
        f"tasks n={spec.n}, d={spec.d}, k={spec.k}, scale={spec.scale:g}; grouped by family",
    )
    return Figure(
        "task_dissimilarity",
        data,
        [],
        files,
        tables={"family_blocks": blocks},
        notes=[f"{per_family} tasks per family, n={spec.n}, d={spec.d}, k={spec.k}"],
    )


def _dissimilarity_spec(ctx: Context) -> TaskSpec:
    """The family sub-grid's task shape when there is one, else the reference models', else the paper's
    default."""
    runs = ctx.tagged("family")
    runs = runs if not runs.empty else ctx.runs
    if runs.empty:
        return TaskSpec()
    run = narrow(runs, keep=[])[0].iloc[0]
    return TaskSpec(
        n=int(run["task.n"]), d=int(run["task.d"]), k=int(run["task.k"]), scale=float(run["task.scale"])
    )


SURFACE_KEYS = ["loss.regularizer", "model.embedding", "task.d"]


def _surface_models(ctx: Context) -> tuple[pd.DataFrame, list[str]]:
    """One trained OH or BN model per SURFACE_KEYS configuration (its first seed), as in the paper."""
    pool = ctx.runs[ctx.runs["model.embedding"].isin(["onehot", "binary"])]
    if pool.empty:
        raise MissingInput("loss_surface: needs onehot or binary runs; none found")
    runs, drawn = narrow(pool, keep=SURFACE_KEYS)
    runs = runs[runs["outcome"] == FINISHED]
    if runs.empty:
        raise MissingInput("loss_surface: no finished onehot or binary run with checkpoints")
    return runs.sort_values("seed").groupby(SURFACE_KEYS, as_index=False).head(1), drawn


def loss_surface(ctx: Context) -> Figure:
    """The training loss around trained weights along two filter-normalised random directions: l2/ne x
    OH/BN x d."""
    first, drawn = _surface_models(ctx)
    frames = []
    for _, run in first.iterrows():
        table = ctx.evaluation("loss_surface", run)
        panel = ", ".join(short(k, run[k]) for k in SURFACE_KEYS)
        frames.append(table.assign(panel=panel, run_id=run["run_id"]))
    data = pd.concat(frames, ignore_index=True)
    files = draw_contours(data, ctx.out_dir, "loss_surface", ncols=min(4, len(frames)))
    return Figure("loss_surface", data, list(first["run_id"]), files, notes=drawn + _which(ctx, first))


def _which(ctx: Context, runs: pd.DataFrame) -> list[str]:
    """Which trained configuration(s) and which of their checkpoints a probe used, in words."""
    fixed = [k for k in REFERENCE if k in runs and runs[k].astype(str).nunique() == 1]
    models = "models: " + ", ".join(f"{k}={runs[k].iloc[0]}" for k in fixed) + f"; {len(runs)} runs"
    return [models, ctx.settings.checkpoint_note()]


# Per figure that evaluates checkpoints: the models it evaluates, chosen from the runs alone.
MODELS = {
    "multistep": _multistep_models,
    "mixture_shift": _shift_models,
    "length": _length_models,
    "family_transfer": _transfer_models,
    "loss_surface": _surface_models,
}


def reads(name: str, ctx: Context) -> list[Want]:
    """The evaluations figure `name` draws (none for a figure of logged metrics, or one its store cannot
    support), which its command reads before drawing (analysis.read)."""
    if name not in MODELS:
        return []
    try:
        runs, _ = MODELS[name](ctx)
    except MissingInput:
        return []
    return evaluations_of(name, runs)
