"""The evidence the claims are judged on, as read from a store, and one claim's view of it.

The command reads what the claims need in one pass (analysis.read: the runs, their histories and the
evaluations records.reads names) into a Context of plain frames per experiment; `evidence_of` gathers from
those Contexts what the judges read: the runs, their probes' rows, the d 32 runs' final values measured at
the paper's n, val_rel_lloyd's histories, the speed_memory benchmark and the sampled tasks' dissimilarity.
Nothing here opens the store. An Evidence is frames and functions of them, so tests build one from synthetic
frames.

A judge reads the evidence only through a View limited to the claim's scope, so other runs in a store never
change a verdict. Per configuration it reads the median across seeds of the final value, where a diverged
seed counts as +inf (it beats nothing: neither Lloyd's nor a lower loss) and an unfinished one not at all; a
configuration with fewer than 2 seeds is left out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import pandas as pd

from analysis.checkpoint_eval import FINAL_METRICS, LLOYD_METHOD
from analysis.claims.scopes import D32, EMB, EXPERIMENT, D, K, Scope, config_of, paper_grid
from analysis.context import (
    Context,
    config_keys,
    count_once,
    evaluation_rows,
    scope,
    series_labels,
    varying,
)
from analysis.eval_figures import dissimilarity
from analysis.plot import Figure, MissingInput
from analysis.style import AXIS_NAMES, LLOYD
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED, VAL_REL_LLOYD

# Per probe: the column of its evaluation table that names a panel, and the iterations the claims read.
PANELS = {"multistep": "init", "length": "n", "mixture_shift": "shift", "family_transfer": "test_family"}
METHODS = {"multistep": ("reembed", "naive")}
PROBE_COLUMNS = ["panel", "series", "method", SEED, "step", "value"]  # a probe's per-seed rows


@dataclass
class Evidence:
    """What the judges read. runs: training runs (an `outcome` column); grid: paper_grid() to count the cases
    the paper grid has (None: no counts); T: the probes' re-applications (the report's eval.steps);
    probe(runs, evaluation) -> (per-seed rows, why missing); history(runs) -> val_rel_lloyd points (run_id,
    step, value); speed: speed_memory rows; blocks: task_dissimilarity's family_blocks; final(runs) -> (the
    same runs with the final metrics of their d 32 ones measured at n final_n, why some are missing)."""

    runs: pd.DataFrame
    grid: pd.DataFrame | None
    T: int
    probe: Callable[[pd.DataFrame, str], tuple[pd.DataFrame, str]] | None = None
    history: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    speed: list[dict] | None = None
    speed_source: str = ""
    blocks: pd.DataFrame | None = None
    final: Callable[[pd.DataFrame], tuple[pd.DataFrame, str]] | None = None
    final_n: int | None = None

    @property
    def has_d32(self) -> bool:
        """Whether any run is at d 32 (sweep=lite32's, or the paper grid's)."""
        return bool(D in self.runs and (self.runs[D] == D32).any())


# ---- read from the Contexts (analysis.read) ----


def evidence_of(contexts: list[Context], drawn: dict[str, Figure] | None = None) -> Evidence:
    """The claims' inputs from what was read of one experiment, or of several judged as one (`combined`), and
    the sampled tasks' dissimilarity at the first's setting; `drawn` (figure name -> Figure) holds what the
    report already drew, which is reused rather than computed again."""
    found = combined([_one_experiment(ctx) for ctx in contexts])
    figure = (drawn or {}).get("task_dissimilarity")
    blocks = figure.tables["family_blocks"] if figure is not None else dissimilarity(contexts[0])[4]
    return replace(found, blocks=blocks)


def _one_experiment(ctx: Context) -> Evidence:
    """One experiment's evidence but the dissimilarity: its runs (named by experiment), probes, histories,
    benchmark rows and measured final values."""
    return Evidence(
        ctx.runs.assign(**{EXPERIMENT: ctx.experiment}),
        paper_grid(),
        ctx.settings.steps,
        probe=_probe(ctx),
        history=_history(ctx),
        speed=_speed_rows(ctx.speed_json),
        speed_source=f"{ctx.speed_json} (`python -m bench speed_memory --out FILE`, then speed_json=FILE)",
        final=_final(ctx),
        final_n=ctx.settings.d32_n,
    )


def combined(found: list[Evidence]) -> Evidence:
    """One Evidence from several stores' (sweep=lite's d 4 runs and sweep=lite32's d 32 runs, each in its own
    experiment): their runs side by side; a probe or history read goes to the evidences holding the runs
    read; the grid, benchmarks and dissimilarity table are the first's that has them. So every claim is
    judged once, on the runs of its scope wherever they were trained (large_lr_worse: d 4 from one, d 32
    from the other). One store's is its own."""
    if len(found) == 1:
        return found[0]

    def own(scoped: pd.DataFrame, e: Evidence) -> pd.DataFrame:
        return scoped[scoped["run_id"].isin(e.runs["run_id"])]

    def probe(scoped: pd.DataFrame, evaluation: str) -> tuple[pd.DataFrame, str]:
        rows, missing = [], []
        for e in found:
            if e.probe is not None and not own(scoped, e).empty:
                part, why = e.probe(own(scoped, e), evaluation)
                rows.append(part)
                missing += [why] if why else []
        empty = pd.DataFrame(columns=PROBE_COLUMNS)
        return (pd.concat(rows, ignore_index=True) if rows else empty), "; ".join(missing)

    def history(scoped: pd.DataFrame) -> pd.DataFrame:
        parts = [e.history(own(scoped, e)) for e in found if e.history is not None]
        return (
            pd.concat(parts, ignore_index=True)
            if parts
            else pd.DataFrame(columns=["run_id", "step", "value"])
        )

    def final(scoped: pd.DataFrame) -> tuple[pd.DataFrame, str]:
        frames, missing = [scoped.iloc[:0]], []
        for e in found:
            mine = own(scoped, e)
            measured, why = e.final(mine) if e.final is not None and not mine.empty else (mine, "")
            frames.append(measured)
            missing += [why] if why else []
        return pd.concat(frames), "; ".join(missing)

    def first(attr: str):
        return next((getattr(e, attr) for e in found if getattr(e, attr) is not None), None)

    with_speed = next((e for e in found if e.speed is not None), found[0])
    return Evidence(
        pd.concat([e.runs for e in found], ignore_index=True),
        first("grid"),
        found[0].T,
        probe,
        history,
        with_speed.speed,
        with_speed.speed_source,
        first("blocks"),
        final if any(e.final is not None for e in found) else None,
        first("final_n"),
    )


def probe_rows(ctx: Context, runs: pd.DataFrame, evaluation: str) -> pd.DataFrame:
    """Per-seed rows of `evaluation` for these runs (their evaluations as read): one series per configuration,
    panels '<column>=<value>', and a diverged model counted as +inf at every panel and step (it beats
    nothing); a model row's `config` names its configuration (scopes.config_of), Lloyd's is None."""
    labels, _ = series_labels(runs, varying(runs) or [EMB])
    column = PANELS[evaluation]
    frames = []
    for method in METHODS.get(evaluation, ("reembed",)):
        panel = lambda t, r: column + "=" + t[column].astype(str)  # noqa: E731
        rows = count_once(evaluation_rows(ctx, runs, evaluation, panel, labels, (method,)))
        points = rows.loc[rows["series"] != LLOYD, ["panel", "step"]].drop_duplicates()
        lost = [
            points.assign(series=labels[i], unit=run["run_id"], value=math.inf, **{SEED: run[SEED]})
            for i, run in runs[runs[OUTCOME] == DIVERGED].iterrows()
        ]
        frames.append(pd.concat([rows, *lost], ignore_index=True).assign(method=method))
    rows = pd.concat(frames, ignore_index=True)
    rows.loc[rows["series"] == LLOYD, "method"] = LLOYD_METHOD
    configs = {labels[i]: config_of(run) for i, run in runs.iterrows()}
    rows["config"] = [configs.get(series) for series in rows["series"]]
    return rows[[*PROBE_COLUMNS, "config"]]


def _probe(ctx: Context) -> Callable[[pd.DataFrame, str], tuple[pd.DataFrame, str]]:
    def rows(runs: pd.DataFrame, evaluation: str) -> tuple[pd.DataFrame, str]:
        try:
            return probe_rows(ctx, runs, evaluation), ""
        except (MissingInput, FileNotFoundError) as err:
            return pd.DataFrame(columns=PROBE_COLUMNS), str(err)

    return rows


def _history(ctx: Context) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def points(runs: pd.DataFrame) -> pd.DataFrame:
        h = ctx.histories
        return h[(h["key"] == VAL_REL_LLOYD) & h["run_id"].isin(runs["run_id"])][["run_id", "step", "value"]]

    return points


def _final(ctx: Context) -> Callable[[pd.DataFrame], tuple[pd.DataFrame, str]] | None:
    """Runs -> (the same runs, their finished d 32 ones' final metrics measured at n eval.d32_n on fresh tasks
    from each last checkpoint (checkpoint_eval.final, as read), why some are missing); None when eval.d32_n is
    null. Other runs keep the values they logged at their training n."""
    n = ctx.settings.d32_n
    if n is None:
        return None

    def measured(runs: pd.DataFrame) -> tuple[pd.DataFrame, str]:
        runs, failed = runs.copy(), []
        for i, run in runs[(runs[D] == D32) & (runs[OUTCOME] == FINISHED)].iterrows():
            try:
                values = ctx.evaluation("final", run, n=n).set_index("metric")["value"]
            except (FileNotFoundError, ValueError) as err:  # no checkpoint; tasks of n it cannot have (n < k)
                runs.loc[i, list(FINAL_METRICS)] = math.nan  # not judged, never read as logged at another n
                failed.append(f"{run['run_id']}: {err}")
            else:
                runs.loc[i, list(values.index)] = values.to_numpy()
        why = f"final values at n {n} not measured for {len(failed)} runs ({'; '.join(failed[:2])})"
        return runs, why if failed else ""

    return measured


def _speed_rows(path: Path | None) -> list[dict] | None:
    return json.loads(path.read_text()).get("rows", []) if path is not None and path.exists() else None


# ---- a claim's view: its scope's runs, finals, histories and probes ----


@dataclass
class View:
    """One claim's access to the evidence: every read is limited to a scope (the claim's own by default), and
    every scope read is summarised once in `notes`."""

    evidence: Evidence
    scope: Scope | None
    notes: list[str] = field(default_factory=list)
    probed: list[Scope] = field(default_factory=list)  # the scopes whose probes it read, in order
    read_diverged: bool = False  # a scope it read holds a diverged run

    @property
    def T(self) -> int:
        return self.evidence.T

    def runs(self, where: Scope | None = None, measured: bool = False) -> pd.DataFrame:
        """The scope's runs, summarised in the notes; `measured`: their final values are read where the
        evidence measures them (Evidence.final), which the summary names."""
        subgrid, slice_ = where or self.scope
        runs = scope(self.evidence.runs, subgrid, slice_)
        at = self.evidence.final_n if measured else None
        note = summary(runs, subgrid, slice_, self.evidence.grid, self.evidence.has_d32, at)
        if note not in self.notes:
            self.notes.append(note)
        self.read_diverged |= bool(OUTCOME in runs and (runs[OUTCOME] == DIVERGED).any())
        return runs

    def finals(self, metric: str, where: Scope | None = None, logged: bool = False) -> pd.DataFrame:
        """Per seed, the final `metric` of the scope's configurations with >= 2 seeds: the d 32 runs' measured
        at n final_n where the evidence measures them (Evidence.final) and not `logged`, else as logged."""
        measured = self.evidence.final is not None and not logged
        runs = self.runs(where, measured)
        if measured:
            runs, missing = self.evidence.final(runs)
            if missing and missing not in self.notes:
                self.notes.append(missing)
        return with_enough_seeds(seed_values(runs, metric))

    def histories(self, where: Scope | None = None) -> pd.DataFrame:
        """Per seed: val_rel_lloyd's `first` evaluation after training began (not the untrained step 0), its
        `lowest` over training, its final `value` (diverged: +inf), all as logged: one curve, at one n."""
        runs = self.runs(where)
        per_seed = self.finals(VAL_REL_LLOYD, where, logged=True)
        if self.evidence.history is None or per_seed.empty:
            return per_seed.assign(first=math.nan, lowest=math.nan)
        points = self.evidence.history(runs).sort_values("step")
        points = points[points["step"] > 0]
        stats = points.groupby("run_id")["value"].agg(first="first", lowest="min")
        keys = config_keys(runs.columns)
        by_seed = runs[keys + [SEED, "run_id"]].merge(stats, left_on="run_id", right_index=True)
        by_seed = by_seed.groupby(keys + [SEED], dropna=False)[["first", "lowest"]].mean().reset_index()
        return per_seed.merge(by_seed, on=keys + [SEED], how="left")

    def probe(self, evaluation: str, where: Scope | None = None) -> pd.DataFrame:
        """Per-seed rows of `evaluation` on the scope's runs; why they are missing goes into the notes."""
        self.probed.append(where or self.scope)
        runs = self.runs(where)
        if self.evidence.probe is None or runs.empty:  # no model in the scope: nothing to evaluate
            return pd.DataFrame(columns=PROBE_COLUMNS)
        rows, missing = self.evidence.probe(runs, evaluation)
        if missing:
            self.notes.append(f"{evaluation} not evaluated: {missing}")
        return rows


# ---- per seed, per scope ----


def seed_values(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Config keys, seed and `value`, the final `metric` of every run that finished or diverged (+inf); a
    repeated (configuration, seed), e.g. a rerun, counts once (its mean)."""
    keys = config_keys(runs.columns)
    ended = runs[runs[OUTCOME].isin((FINISHED, DIVERGED))]
    value = ended[metric].astype(float).where(ended[OUTCOME] == FINISHED, math.inf)
    return ended.assign(value=value).groupby(keys + [SEED], dropna=False)["value"].mean().reset_index()


def with_enough_seeds(per_seed: pd.DataFrame) -> pd.DataFrame:
    """The per-seed rows of the configurations with >= 2 seeds."""
    keys = [k for k in config_keys(per_seed.columns)]
    seeds = (
        per_seed.groupby(keys, dropna=False)[SEED].transform("nunique") if len(per_seed) else per_seed[SEED]
    )
    return per_seed[seeds >= 2]


def summary(
    runs: pd.DataFrame,
    subgrid: str,
    where: dict,
    grid: pd.DataFrame | None,
    has_d32: bool,
    final_n: int | None = None,
) -> str:
    """What the scope holds: configurations with >= 2 seeds (of the paper grid's), those left out, diverged
    and unfinished runs, and the setting they were judged at (`final_n`: the d 32 runs' final values were
    measured at that n); an empty d 32 scope says where d 32 runs come from, or, where the evidence has
    some (`has_d32`), that they leave this scope out."""
    slice_ = ", ".join(
        f"{AXIS_NAMES.get(k, k)} in {'/'.join(map(str, v))}"
        if isinstance(v, tuple)
        else f"{AXIS_NAMES.get(k, k)}={v:g}"
        if isinstance(v, float)
        else f"{AXIS_NAMES.get(k, k)}={v}"
        for k, v in where.items()
    )
    name = f"runs tagged `{subgrid}`" + (f" with {slice_}" if slice_ else "")
    expected = f"/{len(scope(grid, subgrid, where))}" if grid is not None else ""
    if runs.empty:
        elsewhere = D32_CUT if has_d32 else D32_RUNS
        return f"{name}: none, 0{expected} configurations (the `{subgrid}` sub-grid of sweep=paper)" + (
            f"; {elsewhere}" if where.get(D) == 32 else ""
        )
    ended = runs[runs[OUTCOME].isin((FINISHED, DIVERGED))]
    name += f" (judged at {judged_at(ended if len(ended) else runs, final_n)})"
    seeds = ended.groupby(config_keys(runs.columns), dropna=False)[SEED].nunique()
    few = f" ({int((seeds < 2).sum())} with fewer left out)" if (seeds < 2).any() else ""
    diverged, unfinished = int((runs[OUTCOME] == DIVERGED).sum()), len(runs) - len(ended)
    return (
        f"{name}: {int((seeds >= 2).sum())}{expected} configurations with >= 2 seeds{few}; "
        f"diverged {diverged}, unfinished {unfinished} of {len(runs)} runs"
    )


D32_RUNS = (
    "the d 32 runs are sweep=lite32's (`leaner-sweep sweep=lite32`, or `make reproduce-d32` in a clone), "
    "none in this store and experiment"
)
D32_CUT = (
    "the d 32 runs judged here hold none of them (sweep=lite32 cuts some to fit its budget: "
    "conf/sweep/lite32.yaml names them)"
)


def judged_at(runs: pd.DataFrame, final_n: int | None = None) -> str:
    """The setting the runs trained at (`_trained_at`), experiment by experiment where they come from several
    judged as one: 'leaner-clustering-lite: d 4, k 6, n 128; leaner-clustering-lite32: d 32, ...'."""
    if EXPERIMENT not in runs or runs[EXPERIMENT].nunique() < 2:
        return _trained_at(runs, final_n)
    return "; ".join(f"{name}: {_trained_at(part, final_n)}" for name, part in runs.groupby(EXPERIMENT))


def _trained_at(runs: pd.DataFrame, final_n: int | None = None) -> str:
    """The d, k and n the runs trained at, e.g. 'd 32, k 10/25, n 128/256'; with `final_n`, and d 32 runs
    among them, where their final values were measured: 'd 32, k 10/25, n 128/256 in training, the d 32
    runs' final values measured at n 512 (eval.d32_n) on fresh tasks from each last checkpoint'."""
    parts = []
    for key, word in ((D, "d"), (K, "k"), ("task.n", "n")):
        if key in runs:
            values = sorted(runs[key].dropna().unique())
            parts.append(f"{word} {'/'.join(f'{v:g}' for v in values)}")
    if final_n is None or not (runs[D] == D32).any():
        return ", ".join(parts)
    return (
        f"{', '.join(parts)} in training, the d {D32} runs' final values measured at n {final_n} "
        "(eval.d32_n) on fresh tasks from each last checkpoint"
    )
