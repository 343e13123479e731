"""`python -m analysis.claims [tracking.*] [select.*] [eval.*]`: the paper's 18 claims (docs/science.md 7.1).

Each claim is one Record in CLAIMS: its name, the paper's words and where they
stand, its scope (the sub-grid and slice it is about) and its judge. A claim is
judged only on its scope, so other runs in a store never change a verdict.
Per configuration, the median across seeds of the final value, where a
diverged seed counts as +inf (it beats nothing: neither Lloyd's nor a lower
loss) and an unfinished one not at all; a configuration with fewer than 2
seeds is left out. A judge returns a few parts ("every OH/BN configuration
< 1", "every NA one >= 1") over the cases its scope holds: one failing case
makes the claim FAIL, else a part without cases makes it UNTESTED (never PASS
on zero cases), else PASS. Probes compare the models' median (over seeds) mean
log objective with Lloyd's after the same T steps, on the models the figures
draw (analysis.eval_figures.PROBES).

A case compares a model with its reference seed by seed: its margin is the
median over seeds of the paired difference (model minus reference), the case
holds when that margin has the claimed sign, so a verdict never disagrees with
the margin printed beside it; the seeds' IQR of the difference is printed too,
and a case whose IQR straddles zero is marked *marginal*, which informs and
never changes a verdict. Records with `beyond=True` are the platform's own findings, judged
by the same rules, reported under their own heading and never counted among
the paper's claims: among them the family claims at lite scale (d 4, k 6,
`sweep=lite`), the same statements beyond the paper's setting (d 32, k 10,
where the paper's claims are judged, on `sweep=lite32`'s runs).

Prints every claim beside the paper's words and writes claims.csv and claims.md into the report folder.
"""
# The judges are pure functions of an Evidence (frames and callables), so tests build one from synthetic
# frames; `check` builds it from a Context.

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from analysis.checkpoint_eval import LLOYD_METHOD, SHIFTS
from analysis.cli import job_config, open_context, options_help
from analysis.context import Context, count_once, evaluation_rows, scope, series_labels, varying
from analysis.eval_figures import PROBES, dissimilarity
from analysis.plot import Figure, MissingInput
from analysis.runs import config_keys
from analysis.style import AXIS_NAMES, LLOYD, short
from config.compose import compose
from config.grid import expand
from sweeper.entry import command
from tasks.sampler import FAMILIES
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED, SUBGRIDS, TRAIN_LOSS, VAL_REL_LLOYD

PASS, FAIL, UNTESTED = "PASS", "FAIL", "UNTESTED"
TAU, REG, EMB, D, K, FAMILY, LR = (
    "loss.tau",
    "loss.regularizer",
    "model.embedding",
    "task.d",
    "task.k",
    "task.family",
    "optim.lr",
)
AXES = (TAU, REG, EMB, D, K, FAMILY, LR)
EMBEDDED = ("onehot", "binary")
OTHER_FAMILIES = tuple(f for f in FAMILIES if f != "cauchy")
SHIFTED = tuple(name for name, changes in SHIFTS.items() if changes)  # weights, anisotropy, scale 0.05, 0.2
SPEED = ("forward_seconds", "backward_seconds", "peak_memory_bytes")
SHOWN = 4  # cases printed per part and outcome
# Per probe: the column of its evaluation table that names a panel, and the iterations the claims read.
PANELS = {"multistep": "init", "length": "n", "mixture_shift": "shift", "family_transfer": "test_family"}
METHODS = {"multistep": ("reembed", "naive")}

Scope = tuple[str, dict]  # (sub-grid, slice): a slice maps a config key to a value or a tuple of values


def within(probe: str, **narrower: object) -> Scope:
    """A probe's models (the ones its figure draws), narrowed: the scope of a claim on that probe."""
    subgrid, where = PROBES[probe]
    return subgrid, {**where, **narrower}


# ---- cases, parts, verdicts ----


@dataclass
class Case:
    """One comparison: `measured` in words, whether it holds, the margin (the median over seeds of the paired
    difference model minus reference, whose sign the verdict reads) and the seeds' IQR of that difference."""

    label: str
    measured: str
    holds: bool
    margin: float = math.nan
    iqr: tuple[float, float] = (math.nan, math.nan)

    @property
    def marginal(self) -> bool:
        return bool(self.iqr[0] < 0 < self.iqr[1])

    def describe(self) -> str:
        if math.isnan(self.iqr[0]) and math.isnan(self.iqr[1]):  # one measurement, no seeds to spread over
            return f"{self.label} {self.measured}" + (
                "" if math.isnan(self.margin) else f" (margin {signed(self.margin)})"
            )
        mark = ", marginal" if self.marginal else ""
        return (
            f"{self.label} {self.measured} (margin {signed(self.margin)}, "
            f"IQR [{signed(self.iqr[0])}, {signed(self.iqr[1])}]{mark})"
        )


@dataclass
class Part:
    """One condition of a claim over its cases; `expected`: how many cases the paper grid has."""

    what: str
    cases: list[Case]
    expected: int | None = None

    def describe(self) -> str:
        of = f" of {self.expected} in the paper grid" if self.expected is not None else ""
        if not self.cases:
            return f"{self.what}: untested, no case{of}"
        shown = []
        for word, holds in (("fails", False), ("holds", True)):
            chosen = [c for c in self.cases if c.holds == holds]
            items = [
                c.describe() for c in sorted(chosen, key=lambda c: not c.marginal)
            ]  # marginal ones first
            if items:
                more = f" +{len(items) - SHOWN} more" if len(items) > SHOWN else ""
                shown.append(f"{word}: {', '.join(items[:SHOWN])}{more}")
        held = sum(c.holds for c in self.cases)
        return f"{self.what}: {held}/{len(self.cases)} cases{of} ({'; '.join(shown)})"


def verdict(parts: list[Part]) -> str:
    """FAIL on any failing case (a counterexample decides); else UNTESTED if a part has no case; else PASS."""
    if any(not c.holds for part in parts for c in part.cases):
        return FAIL
    return PASS if parts and all(part.cases for part in parts) else UNTESTED


def fmt(value: float) -> str:
    return "diverged" if value == math.inf else f"{value:.3f}"


def signed(value: float) -> str:
    return "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:+.3f}"


def _iqr(diffs: np.ndarray) -> tuple[float, float]:
    diffs = np.asarray(diffs, dtype=float)
    if not len(diffs):
        return math.nan, math.nan
    with np.errstate(invalid="ignore"):  # a quartile between two infinities is NaN: no band, never marginal
        q25, q75 = np.percentile(diffs, [25, 75])
    return float(q25), float(q75)


def _median(values: pd.Series) -> float:
    return float(np.median(values.to_numpy(dtype=float)))


def _margin(a: float, b: float) -> float:
    """a - b, where two diverged values (+inf) are equal: neither beats the other."""
    return 0.0 if a == b == math.inf else a - b


def compare(
    label: str,
    model: pd.Series,
    reference: pd.Series | float,
    holds: Callable[[float, float], bool],
    words: str,
) -> Case:
    """A case from per-seed values (indexed by seed), judged on the paired differences: holds(m, 0) for m the
    median over seeds of model - reference (seeds both sides have; every seed for a fixed reference), the
    margin printed. `words` shows the two medians ({a}, {b}); they inform, the margin decides."""
    a = _median(model)
    if isinstance(reference, pd.Series):
        b, common = _median(reference), model.index.intersection(reference.index)
        diffs = np.array([_margin(model[s], reference[s]) for s in common], dtype=float)
    else:
        b = float(reference)
        diffs = np.array([_margin(v, b) for v in model], dtype=float)
    margin = float(np.median(diffs)) if len(diffs) else math.nan
    measured = words.format(a=fmt(a), b=fmt(b))
    if not len(diffs):
        measured += " (no seed on both sides: not judged)"
    return Case(label, measured, bool(holds(margin, 0.0)), margin, _iqr(diffs))


def _lt(a: float, b: float) -> bool:
    return a < b


def _gt(a: float, b: float) -> bool:
    return a > b


def _ge(a: float, b: float) -> bool:
    return a >= b


# ---- per seed and per configuration (pure) ----


def seed_values(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Config keys, seed and `value`, the final `metric` of every run that finished or diverged (+inf); a
    repeated (configuration, seed), e.g. a rerun, counts once (its mean)."""
    keys = config_keys(runs.columns)
    ended = runs[runs[OUTCOME].isin((FINISHED, DIVERGED))]
    value = ended[metric].astype(float).where(ended[OUTCOME] == FINISHED, math.inf)
    return ended.assign(value=value).groupby(keys + [SEED], dropna=False)["value"].mean().reset_index()


def per_configuration(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per configuration: `value`, the median across seeds of the final `metric`, and `seeds`, how many."""
    per_seed = seed_values(runs, metric)
    keys = config_keys(runs.columns)
    return per_seed.groupby(keys, dropna=False)["value"].agg(value="median", seeds="size").reset_index()


def _enough_seeds(per_seed: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in config_keys(per_seed.columns)]
    seeds = (
        per_seed.groupby(keys, dropna=False)[SEED].transform("nunique") if len(per_seed) else per_seed[SEED]
    )
    return per_seed[seeds >= 2]


def summary(runs: pd.DataFrame, subgrid: str, where: dict, grid: pd.DataFrame | None) -> str:
    """What the scope holds: configurations with >= 2 seeds (of the paper grid's), those left out, diverged
    and unfinished runs."""
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
        return f"{name}: none, 0{expected} configurations (the `{subgrid}` sub-grid of sweep=paper)" + (
            f"; {D32_RUNS}" if where.get(D) == 32 else ""
        )
    ended = runs[runs[OUTCOME].isin((FINISHED, DIVERGED))]
    name += f" (judged at {setting(ended if len(ended) else runs)})"
    seeds = ended.groupby(config_keys(runs.columns), dropna=False)[SEED].nunique()
    few = f" ({int((seeds < 2).sum())} with fewer left out)" if (seeds < 2).any() else ""
    diverged, unfinished = int((runs[OUTCOME] == DIVERGED).sum()), len(runs) - len(ended)
    return (
        f"{name}: {int((seeds >= 2).sum())}{expected} configurations with >= 2 seeds{few}; "
        f"diverged {diverged}, unfinished {unfinished} of {len(runs)} runs"
    )


D32_RUNS = "the d 32 runs are sweep=lite32's (`make reproduce-d32`), none in this store and experiment"


def setting(runs: pd.DataFrame) -> str:
    """The d, k and n the runs trained at, e.g. 'd 32, k 10/25, n 128/256'."""
    parts = []
    for key, word in ((D, "d"), (K, "k"), ("task.n", "n")):
        if key in runs:
            values = sorted(runs[key].dropna().unique())
            parts.append(f"{word} {'/'.join(f'{v:g}' for v in values)}")
    return ", ".join(parts)


def _keys(frame: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[str]:
    """The config keys that tell the configurations apart (every axis for a single one), but `drop`."""
    configs = frame[config_keys(frame.columns)].drop_duplicates()
    keys = varying(configs) if len(configs) > 1 else [k for k in AXES if k in frame]
    return [k for k in keys if k not in drop]


def _label(row: pd.Series, keys: list[str]) -> str:
    return "-".join(short(k, row[k]) for k in keys) or "all"


def _groups(per_seed: pd.DataFrame, keys: list[str]):
    """(configuration row, per-seed values indexed by seed) per configuration."""
    for _, part in per_seed.groupby(config_keys(per_seed.columns), dropna=False, sort=False):
        yield part.iloc[0], part.set_index(SEED)[keys]


def threshold_cases(
    per_seed: pd.DataFrame, holds: Callable[[float, float], bool], level: float = 1.0
) -> list[Case]:
    """Per configuration: holds(its median - level, 0); the margin is that median - level."""
    keys = _keys(per_seed)
    return [
        compare(_label(row, keys), values["value"], level, holds, "{a}")
        for row, values in _groups(per_seed, ["value"])
    ]


def pair_cases(
    per_seed: pd.DataFrame, key: str, a: object, b: object, holds: Callable[[float, float], bool]
) -> list[Case]:
    """Configurations with key == a beside those with key == b that agree on every other config key."""
    others = [k for k in config_keys(per_seed.columns) if k != key]
    right = {
        match: part.set_index(SEED)["value"]
        for match, part in per_seed[per_seed[key] == b].groupby(others, dropna=False, sort=False)
    }
    keys = _keys(per_seed[per_seed[key].isin((a, b))], drop=(key,))
    words = f"{short(key, a)} {{a}} vs {short(key, b)} {{b}}"
    return [
        compare(_label(row, keys), values["value"], right[match], holds, words)
        for row, values in _groups(per_seed[per_seed[key] == a], ["value"])
        if (match := tuple(row[k] for k in others)) in right
    ]


def rise_cases(per_seed: pd.DataFrame, rising: str = "binary", steady: str = "onehot") -> list[Case]:
    """`rising`'s value rises from the smallest to the largest k (both embeddings have) by more than
    `steady`'s (and at all): margin = the median over seeds of rise - max(steady's rise, 0), as compare."""
    others = [k for k in config_keys(per_seed.columns) if k not in (EMB, K)]
    keys = [k for k in _keys(per_seed) if k in others]
    cases = []
    for _, part in per_seed.groupby(others, dropna=False):
        by = {
            e: part[part[EMB] == e].pivot_table(index=SEED, columns=K, values="value")
            for e in (rising, steady)
        }
        ks = sorted(set(by[rising].columns) & set(by[steady].columns))
        if len(ks) < 2:
            continue
        medians = {e: by[e].median() for e in by}
        rise = {e: medians[e][ks[-1]] - medians[e][ks[0]] for e in by}
        seeds = by[rising].index.intersection(by[steady].index)
        per_seed_rise = {e: by[e].loc[seeds, ks[-1]] - by[e].loc[seeds, ks[0]] for e in by}
        diffs = per_seed_rise[rising] - per_seed_rise[steady].clip(lower=0.0)
        margin = float(np.median(diffs)) if len(diffs) else math.nan  # paired, as compare
        words = (
            f"k {ks[0]}->{ks[-1]}: {short(EMB, rising)} {rise[rising]:+.3f} "
            f"vs {short(EMB, steady)} {rise[steady]:+.3f}"
        )
        cases.append(Case(_label(part.iloc[0], keys), words, bool(margin > 0), float(margin), _iqr(diffs)))
    return cases


# ---- probes: per-seed rows (panel, series, method, seed, step, value; Lloyd's series is LLOYD) ----


def _at(rows: pd.DataFrame, step: int, method: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(Model values at `step` per panel, series and seed, of series with >= 2 seeds; Lloyd's per panel
    and seed)."""
    here = rows[rows["step"] == step]
    lloyd = here[here["series"] == LLOYD].groupby(["panel", SEED])["value"].mean()
    models = here[(here["series"] != LLOYD) & (here["method"] == method)]
    models = models.groupby(["panel", "series", SEED])["value"].mean().reset_index()
    seeds = models.groupby(["panel", "series"])[SEED].transform("nunique")
    return models[seeds >= 2], lloyd


def vs_lloyd(
    rows: pd.DataFrame, T: int, holds: Callable[[float, float], bool], panels=None, method: str = "reembed"
) -> list[Case]:
    """Per panel and model series: holds(the model's median at T, Lloyd's median at T on the same tasks)."""
    models, lloyd = _at(rows, T, method)
    cases = []
    for (panel, series), part in models.groupby(["panel", "series"], sort=False):
        if (panels is not None and panel not in panels) or panel not in lloyd.index.get_level_values(0):
            continue
        words = "{a} vs Lloyd {b}"
        cases.append(compare(f"{panel} {series}", part.set_index(SEED)["value"], lloyd[panel], holds, words))
    return cases


def vs_step1(
    rows: pd.DataFrame, T: int, holds: Callable[[float, float], bool], panels=None, method: str = "reembed"
) -> list[Case]:
    """Per panel and model series: holds(its median at T, its median at t=1)."""
    last, _ = _at(rows, T, method)
    first = _at(rows, 1, method)[0].set_index(["panel", "series", SEED])["value"]
    cases = []
    for (panel, series), part in last.groupby(["panel", "series"], sort=False):
        if (panels is not None and panel not in panels) or (panel, series) not in first.index.droplevel(SEED):
            continue
        words = "{b} at t=1 -> {a}"
        cases.append(
            compare(f"{panel} {series}", part.set_index(SEED)["value"], first[(panel, series)], holds, words)
        )
    return cases


# ---- the evidence a claim is judged on, and one claim's view of it ----


@dataclass
class Evidence:
    """What the judges read. runs: training runs (an `outcome` column); grid: paper_grid() to count the cases
    the paper grid has; probe(runs, evaluation) -> (per-seed rows, why missing); history(runs) ->
    val_rel_lloyd points (run_id, step, value); speed: speed_memory rows; blocks: task_dissimilarity's
    family_blocks."""

    runs: pd.DataFrame
    grid: pd.DataFrame | None = None
    T: int = 20
    probe: Callable[[pd.DataFrame, str], tuple[pd.DataFrame, str]] | None = None
    history: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    speed: list[dict] | None = None
    speed_source: str = ""
    blocks: pd.DataFrame | None = None


@dataclass
class View:
    """One claim's access to the evidence: every read is limited to a scope (the claim's own by default), and
    every scope read is summarised once in `notes`."""

    evidence: Evidence
    scope: Scope | None
    notes: list[str] = field(default_factory=list)
    probed: bool = False  # it read a probe (whose cases the paper grid cannot count)

    @property
    def T(self) -> int:
        return self.evidence.T

    def runs(self, where: Scope | None = None) -> pd.DataFrame:
        subgrid, slice_ = where or self.scope
        runs = scope(self.evidence.runs, subgrid, slice_)
        note = summary(runs, subgrid, slice_, self.evidence.grid)
        if note not in self.notes:
            self.notes.append(note)
        return runs

    def finals(self, metric: str, where: Scope | None = None) -> pd.DataFrame:
        """Per seed, the final `metric` of the scope's configurations with >= 2 seeds."""
        return _enough_seeds(seed_values(self.runs(where), metric))

    def histories(self, where: Scope | None = None) -> pd.DataFrame:
        """Per seed: val_rel_lloyd's `first` evaluation after training began (not the untrained step 0), its
        `lowest` over training, its final `value` (diverged: +inf)."""
        runs = self.runs(where)
        per_seed = self.finals(VAL_REL_LLOYD, where)
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
        self.probed = True
        runs = self.runs(where)
        if self.evidence.probe is None or runs.empty:  # no model in the scope: nothing to evaluate
            return pd.DataFrame(columns=["panel", "series", "method", SEED, "step", "value"])
        rows, missing = self.evidence.probe(runs, evaluation)
        if missing:
            self.notes.append(f"{evaluation} not evaluated: {missing}")
        return rows


@dataclass
class Claim:
    name: str
    status: str  # PASS, FAIL or UNTESTED
    numbers: str  # what was measured, and what is missing
    paper: str  # the paper's words (docs/science.md section 7.1)
    source: str = ""  # where the words stand in the paper
    marginal: int = 0  # cases whose seeds' IQR of the margin straddles zero
    beyond: bool = False  # a finding beyond the paper: its own heading, not among the paper's claims


@dataclass(frozen=True)
class Record:
    """One claim: what the paper says, where, the runs it is about, and its judge (a View -> its parts)."""

    name: str
    paper: str
    source: str
    scope: Scope | None  # None: judged on a benchmark or on sampled tasks, not on runs
    judge: Callable[[View], list[Part]]
    beyond: bool = False


def judge(record: Record, evidence: Evidence) -> Claim:
    """A claim's verdict on the evidence; with evidence.grid, each part also says how many cases the paper
    grid has (not for probe parts: the grid has no curves; not beyond the paper: the grid has none)."""
    view = View(evidence, record.scope)
    parts = record.judge(view)
    if evidence.grid is not None and record.scope is not None and not record.beyond:
        full = View(Evidence(grid_runs(evidence.grid), history=_flat_history), record.scope)
        for part, counted in zip(parts, record.judge(full)):
            part.expected = None if full.probed else len(counted.cases)
    numbers = "; ".join([*view.notes, *(part.describe() for part in parts)])
    marginal = sum(c.marginal for part in parts for c in part.cases)
    return Claim(record.name, verdict(parts), numbers, record.paper, record.source, marginal, record.beyond)


# ---- the judges ----


def _tau01(v: View) -> list[Part]:
    t = v.finals(VAL_REL_LLOYD)
    return [
        Part("OH/BN val_rel_lloyd < 1", threshold_cases(t[t[EMB].isin(EMBEDDED)], _lt)),
        Part("NA val_rel_lloyd >= 1", threshold_cases(t[t[EMB] == "none"], _ge)),
    ]


def _l2_lower_train_loss(v: View) -> list[Part]:
    return [Part("l2 final train_loss < ne's", pair_cases(v.finals(TRAIN_LOSS), REG, "l2", "ne", _lt))]


def _l2_better_val(v: View) -> list[Part]:
    return [Part("l2 val_rel_lloyd < ne's", pair_cases(v.finals(VAL_REL_LLOYD), REG, "l2", "ne", _lt))]


def _reembed(inits: tuple[str, ...]) -> Callable[[View], list[Part]]:
    def parts(v: View) -> list[Part]:
        rows, panels = v.probe("multistep"), tuple(f"init={i}" for i in inits)
        return [
            Part(f"re-embedded < Lloyd at T={v.T}", vs_lloyd(rows, v.T, _lt, panels)),
            Part(f"naive at T={v.T} > at t=1", vs_step1(rows, v.T, _gt, panels, "naive")),
        ]

    return parts


def _noembed(v: View) -> list[Part]:
    rows = v.probe("multistep")
    return [
        Part(f"re-embedded at T={v.T} < at t=1", vs_step1(rows, v.T, _lt, ("init=random",))),
        Part(f"re-embedded > Lloyd at T={v.T}", vs_lloyd(rows, v.T, _gt, ("init=random",))),
    ]


def _length(v: View) -> list[Part]:
    return [Part(f"< Lloyd at T={v.T} at every n", vs_lloyd(v.probe("length"), v.T, _lt))]


def course(rows: pd.DataFrame, panel: str, series: str, T: int) -> str:
    """Where a model's median leads or trails Lloyd's over t = 1..T, e.g. 'leads Lloyd at t=1-2, trails from
    t=3 on': the paper says the models trail at scale 0.2 initially and overtake with more steps."""
    here = rows[(rows["panel"] == panel) & rows["step"].between(1, T)]
    model = here[(here["series"] == series) & (here["method"] == "reembed")].groupby("step")["value"].median()
    lloyd = here[here["series"] == LLOYD].groupby("step")["value"].median()
    lead = (model < lloyd.reindex(model.index)).to_dict()
    spans: list[list] = []  # [leads?, first step, last step]
    for step in sorted(lead):
        if spans and spans[-1][0] == lead[step]:
            spans[-1][2] = step
        else:
            spans.append([lead[step], step, step])
    words = []
    for i, (leads, first, last) in enumerate(spans):
        verb = "leads" if leads else "trails"
        at = (
            f"from t={first} on"
            if i == len(spans) - 1 and i
            else f"at t={first}" + (f"-{last}" if last > first else "")
        )
        words.append(f"{verb} {at}")
    return (
        (", ".join(words).replace("leads", "leads Lloyd", 1).replace("trails", "trails Lloyd", 1))
        if words
        else ""
    )


def _shift(v: View) -> list[Part]:
    rows = v.probe("mixture_shift")
    parts = []
    for s in SHIFTED:
        cases = vs_lloyd(rows, v.T, _lt, (f"shift={s}",))
        for case in cases:
            if not case.holds:  # how it got there: the paper's "trail initially but overtake", or not
                panel, _, series = case.label.partition(" ")
                if walk := course(rows, panel, series, v.T):
                    case.measured += f"; {walk}"
        parts.append(Part(f"< Lloyd at T={v.T} under {s}", cases))
    return parts


# The family claims' setting: the paper's family sub-grid is d 32, k 10 (sweep=lite32 trains it); sweep=lite
# trains it at d 4, k 6, where the same statements are judged beyond the paper's setting (at_lite_scale).
PAPER_FAMILY = {D: 32, K: 10}
LITE_FAMILY = {D: 4, K: 6}


def transfer_from(family_setting: dict) -> Scope:
    """The non-cauchy-trained OH/BN models the family-transfer probe draws, at that d and k."""
    return within("family_transfer", **{EMB: EMBEDDED, FAMILY: OTHER_FAMILIES}, **family_setting)


TRANSFER_FROM = transfer_from(PAPER_FAMILY)


def _cauchy_fails(v: View) -> list[Part]:
    rows = v.probe("family_transfer", transfer_from({k: v.scope[1][k] for k in (D, K)}))
    return [
        Part(
            "cauchy configurations diverged or val_rel_lloyd >= 1",
            threshold_cases(v.finals(VAL_REL_LLOYD), _ge),
        ),
        Part(
            f"models trained on other families >= Lloyd on cauchy tasks at T={v.T}",
            vs_lloyd(rows, v.T, _ge, ("test_family=cauchy",)),
        ),
    ]


def _families(v: View) -> list[Part]:
    return [Part("val_rel_lloyd < 1", threshold_cases(v.finals(VAL_REL_LLOYD), _lt))]


def _ne_fails(v: View) -> list[Part]:
    t = v.finals(VAL_REL_LLOYD)
    ne_fails = t[(t[REG] == "ne") & t[FAMILY].isin(("gumbel", "laplace"))]
    return [
        Part(
            "l2 val_rel_lloyd < ne's on every non-cauchy family",
            pair_cases(t[t[FAMILY] != "cauchy"], REG, "l2", "ne", _lt),
        ),
        Part("ne val_rel_lloyd >= 1 on gumbel and laplace", threshold_cases(ne_fails, _ge)),
    ]


def _clusters_d4_tau1(v: View) -> list[Part]:
    t = v.finals(VAL_REL_LLOYD)
    l2 = t[t[REG] == "l2"]
    return [
        Part("l2 val_rel_lloyd >= 1", threshold_cases(l2, _ge)),
        Part("ne val_rel_lloyd > l2's", pair_cases(t, REG, "ne", "l2", _gt)),
        Part("among l2 models, BN's val_rel_lloyd rises with k by more than OH's", rise_cases(l2)),
    ]


def _large_lr(v: View) -> list[Part]:
    t = v.finals(TRAIN_LOSS)
    d32, d4 = t[t[D] == 32], t[t[D] == 4]
    return [
        Part(
            "d 32 (sweep=lite32): final train_loss at lr 0.1 and 1.0 > at 0.01",
            pair_cases(d32, LR, 0.1, 0.01, _gt) + pair_cases(d32, LR, 1.0, 0.01, _gt),
        ),
        Part("d 4: final train_loss at lr 1.0 > at 0.01", pair_cases(d4, LR, 1.0, 0.01, _gt)),
    ]


def _speed(v: View) -> list[Part]:
    rows = sorted(
        (
            r
            for r in v.evidence.speed or []
            if isinstance(r.get("onehot"), dict) and isinstance(r.get("binary"), dict)
        ),
        key=lambda r: (r["d"], r["k"]),
    )
    by_d: dict[int, list[dict]] = {}
    for row in rows:
        by_d.setdefault(row["d"], []).append(row)

    def ratio(row: dict, measure: str) -> float:
        return row["onehot"][measure] / max(row["binary"][measure], 1e-12)

    largest = Part(
        "binary faster forward and backward and leaner at the largest k",
        [
            Case(
                f"d={d} k={rs[-1]['k']} {m}",
                f"onehot/binary {ratio(rs[-1], m):.2f}",
                rs[-1]["binary"][m] < rs[-1]["onehot"][m],
                rs[-1]["binary"][m] / max(rs[-1]["onehot"][m], 1e-12) - 1,  # binary relative to onehot
            )
            for d, rs in by_d.items()
            for m in SPEED
        ],
    )
    grows = Part(
        "onehot/binary grows from the smallest to the largest k",
        [
            Case(
                f"d={d} {m}",
                f"k {rs[0]['k']}->{rs[-1]['k']}: {ratio(rs[0], m):.2f}->{ratio(rs[-1], m):.2f}",
                ratio(rs[-1], m) > ratio(rs[0], m),
                ratio(rs[-1], m) - ratio(rs[0], m),
            )
            for d, rs in by_d.items()
            if len(rs) > 1
            for m in SPEED
        ],
    )
    if not rows:
        v.notes.append(f"needs the speed_memory benchmark's rows: {v.evidence.speed_source}")
    else:
        v.notes.append(
            f"measured maxima: forward {max(ratio(r, SPEED[0]) for r in rows):.1f}x (paper up to 12x), "
            f"backward {max(ratio(r, SPEED[1]) for r in rows):.1f}x (paper up to 9x), memory "
            f"{max(1 - r['binary'][SPEED[2]] / max(r['onehot'][SPEED[2]], 1) for r in rows):.0%} lower "
            f"(paper almost 70%)"
        )
    return [largest, grows]


def _dissimilar(v: View) -> list[Part]:
    blocks = v.evidence.blocks if v.evidence.blocks is not None else pd.DataFrame()
    matrix = blocks.set_index("family_i") if "family_i" in blocks else blocks
    others = [f for f in matrix.index if f != "cauchy" and f in matrix.columns]
    if "cauchy" not in matrix.index or len(others) < 2:
        v.notes.append(
            f"needs the distances of cauchy and >= 2 other families; the table has {list(matrix.index)}"
        )
        return [Part("cauchy-to-others > between non-cauchy families", [])]
    to_others = float(matrix.loc["cauchy", others].mean())
    pairs = [(f, g) for i, f in enumerate(others) for g in others[i + 1 :]]
    v.notes.append(f"cauchy-to-cauchy {float(matrix.loc['cauchy', 'cauchy']):.4g}")
    return [
        Part(
            f"mean distance cauchy-to-others {to_others:.4g} > mean distance between two non-cauchy families",
            [
                Case(
                    f"{f}-{g}",
                    f"{matrix.loc[f, g]:.4g}",
                    bool(to_others > matrix.loc[f, g]),
                    float(matrix.loc[f, g] - to_others),  # the pair's distance minus cauchy-to-others
                )
                for f, g in pairs
            ],
        )
    ]


RISE = 0.1  # ne_val_rises_tau1: NE must end above its minimum by at least this fraction of the minimum


def _rise_case(label: str, values: pd.DataFrame) -> Case:
    """NE's validation loss "increases during training": per seed, the final value against (1 + RISE) x its
    lowest; holds when the median of that difference is > 0 and the seeds' IQR of the rise (final - lowest)
    lies above zero, so a rise within the noise of the seeds does not count."""
    case = compare(label, values["value"], values["lowest"] * (1 + RISE), _gt, "final {a} vs lowest x1.1 {b}")
    rise_iqr = _iqr((values["value"] - values["lowest"]).to_numpy(dtype=float))
    case.measured += f", rise IQR [{signed(rise_iqr[0])}, {signed(rise_iqr[1])}]"
    case.holds = case.holds and bool(rise_iqr[0] > 0)
    return case


def _ne_val_rises(v: View) -> list[Part]:
    t = v.histories()
    ne, l2 = t[t[REG] == "ne"], t[t[REG] == "l2"]
    words = "final {a} vs first {b}"
    return [
        Part(
            f"ne ends above its lowest val_rel_lloyd by >= {RISE:.0%} of it, the seeds' IQR of the rise > 0",
            [_rise_case(_label(row, _keys(ne)), values) for row, values in _groups(ne, ["value", "lowest"])],
        ),
        Part(
            "l2 ends below its first val_rel_lloyd after training began (not step 0)",
            [
                compare(_label(row, _keys(l2)), values["value"], values["first"], _lt, words)
                for row, values in _groups(l2, ["value", "first"])
            ],
        ),
    ]


def _family_transfer(v: View) -> list[Part]:
    rows = v.probe("family_transfer")
    return [
        Part(f"< Lloyd at T={v.T} on {f} tasks", vs_lloyd(rows, v.T, _lt, (f"test_family={f}",)))
        for f in OTHER_FAMILIES
    ]


def _clusters_d4_tau01(v: View) -> list[Part]:
    t = v.finals(VAL_REL_LLOYD)
    l2 = t[t[REG] == "l2"]
    return [
        Part("OH/L2 val_rel_lloyd < 1 at every k", threshold_cases(l2[l2[EMB] == "onehot"], _lt)),
        Part("BN/L2's val_rel_lloyd rises with k by more than OH/L2's", rise_cases(l2)),
    ]


def _clusters_d32(v: View) -> list[Part]:
    t = v.finals(VAL_REL_LLOYD)
    return [
        Part("tau 1, l2: val_rel_lloyd < 1", threshold_cases(t[(t[TAU] == 1.0) & (t[REG] == "l2")], _lt)),
        Part("tau 0.1, l2 and ne: val_rel_lloyd < 1", threshold_cases(t[t[TAU] == 0.1], _lt)),
    ]


PROBED_OH_BN = within("multistep", **{EMB: EMBEDDED})

# The claims of docs/science.md section 7.1, in its order; `beyond` ones last. A new claim is a new Record.
_RECORDS = (
    Record(
        "tau01_beats_lloyd",
        "At tau=0.1, both regularizers outperform one Lloyd step except with no token embedding",
        "section 3, p. 9",
        ("tau", {TAU: 0.1}),
        _tau01,
    ),
    Record(
        "l2_lower_train_loss",
        "The L2-regularized min gives tighter bounds",
        "section 3, p. 8; App. F, p. 23",
        ("tau", {}),
        _l2_lower_train_loss,
    ),
    Record(
        "l2_better_val_tau1_d4",
        "better validation performance than the NE-regularized min, especially at larger tau and d = 4",
        "App. F, p. 23, Figure 10",
        ("tau", {TAU: 1.0, D: 4, EMB: EMBEDDED}),
        _l2_better_val,
    ),
    Record(
        "reembed_beats_lloyd",
        "Re-embedding ... OH/BN models outperforming Lloyd's iterations while naive repeated updates diverge",
        "section 4, p. 10, Figure 6; init as in App. D (k sampled data points)",
        PROBED_OH_BN,
        _reembed(("random",)),
    ),
    Record(
        "noembed_reembed_trails_lloyd",
        "models without token embeddings improve with re-embedding but underperform Lloyd's",
        "section 4, p. 10, Figure 6",
        within("multistep", **{EMB: "none"}),
        _noembed,
    ),
    Record(
        "length_generalises",
        "Models trained on n = 512 points generalize to tasks with 128, 256, 1024, and 2048 points ... "
        "outperform Lloyd's iterations at each tested size",
        "App. F, pp. 24-25, Figure 12",
        within("length", **{EMB: EMBEDDED}),
        _length,
    ),
    Record(
        "shift_generalises",
        "OH/BN models significantly outperform Lloyd's except at larger scale, where they trail initially "
        "but overtake with more steps",
        "section 4, p. 11, Figure 7",
        within("mixture_shift", **{EMB: EMBEDDED}),
        _shift,
    ),
    Record(
        "cauchy_fails",
        "Cauchy training diverges and Cauchy testing remains noncompetitive",
        "section 4, p. 11, Figure 8; App. F, pp. 28-29",
        ("family", {FAMILY: "cauchy", **PAPER_FAMILY}),
        _cauchy_fails,
    ),
    Record(
        "families_generalise",
        "with tau = 0.1, both regularizers and OH or BN embeddings can beat Lloyd across the other tested "
        "distributions",
        "App. F, pp. 28-29, Figure 16",
        ("family", {TAU: 0.1, EMB: EMBEDDED, FAMILY: OTHER_FAMILIES, **PAPER_FAMILY}),
        _families,
    ),
    Record(
        "ne_fails_gumbel_laplace_tau1",
        "At tau = 1, L2 generalizes better than NE, and NE fails to generalize on gumbel and laplace tasks",
        "App. F, pp. 28-29, Figure 16",
        ("family", {TAU: 1.0, EMB: EMBEDDED, **PAPER_FAMILY}),
        _ne_fails,
    ),
    Record(
        "clusters_d4_tau1",
        "For d = 4 and tau = 1, across k in {6, 10, 16, 25}, L2 learns somewhat but never matches one Lloyd "
        "iteration, while NE fails to learn; BN deteriorates as k rises, unlike OH",
        "App. F, p. 26",
        ("clusters", {D: 4, TAU: 1.0}),
        _clusters_d4_tau1,
    ),
    Record(
        "large_lr_worse",
        "For d = 32, rates 0.1 and 1.0 converge to worse local minima; for d = 4, this is reported for "
        "rate 1.0",
        "App. F, pp. 23-24, Figure 11",
        ("lr", {}),
        _large_lr,
    ),
    Record(
        "binary_faster_leaner",
        "With k sufficiently larger than d, the binary model achieves up to 12x/9x forward/backward speedups "
        "and almost 70% lower memory usage",
        "section 2, pp. 4-5, Figure 1",
        None,
        _speed,
    ),
    Record(
        "cauchy_dissimilar",
        "cauchy tasks are similar mainly to other cauchy tasks and are substantially dissimilar from other "
        "families",
        "App. G, Figure 19; section 5, Figure 9",
        None,
        _dissimilar,
    ),
    Record(
        "ne_val_rises_tau1",
        "at tau=1, only L2 reduces unseen-task loss as training progresses. With NE regularization at tau=1, "
        "validation loss increases during training",
        "section 3, p. 8",
        ("tau", {TAU: 1.0, EMB: EMBEDDED}),
        _ne_val_rises,
    ),
    Record(
        "family_transfer_multistep",
        "Across non-Cauchy distribution-family evaluations, OH/BN models generalize well and significantly "
        "outperform Lloyd's",
        "section 4, p. 11, Figure 8; App. G, Figure 18 (T = 20)",
        TRANSFER_FROM,
        _family_transfer,
    ),
    Record(
        "clusters_d4_tau01",
        "With d = 4 and tau = 0.1, OH with L2-regularized min beats Lloyd for all tested k, while BN "
        "performance slows as k grows",
        "App. F, pp. 26-28",
        ("clusters", {D: 4, TAU: 0.1}),
        _clusters_d4_tau01,
    ),
    Record(
        "clusters_d32",
        "at d = 32, tau = 1, OH and BN with L2 beat Lloyd across k ... At d = 32 and tau = 0.1, both "
        "regularizers with OH and BN beat Lloyd",
        "App. F, pp. 26-28",
        ("clusters", {D: 32, EMB: EMBEDDED}),
        _clusters_d32,
    ),
    Record(
        "reembed_from_good_inits",
        "(beyond the paper) the reembed_beats_lloyd test from kmeans++ and gonzalez centers, inits the "
        "models never trained on",
        "not in the paper: its tasks start from k sampled data points (App. D)",
        PROBED_OH_BN,
        _reembed(("kmeans++", "gonzalez")),
        beyond=True,
    ),
)
FAMILY_CLAIMS = (
    "cauchy_fails",
    "families_generalise",
    "ne_fails_gumbel_laplace_tau1",
    "family_transfer_multistep",
)


def at_lite_scale(record: Record) -> Record:
    """A family claim's statement judged on sweep=lite's family runs (d 4, k 6): beyond the paper's setting,
    so `make reproduce` alone still shows it, under its own name and heading."""
    subgrid, where = record.scope
    return Record(
        f"{record.name}_lite",
        f"(the same statement at lite scale, beyond the paper's setting) {record.paper}",
        f"{record.source}; here at d 4, k 6 (sweep=lite), not the paper's d 32, k 10",
        (subgrid, {**where, **LITE_FAMILY}),
        record.judge,
        beyond=True,
    )


CLAIMS = _RECORDS + tuple(at_lite_scale(r) for r in _RECORDS if r.name in FAMILY_CLAIMS)
RECORDS = {record.name: record for record in CLAIMS}
PAPER = {record.name: record.paper for record in CLAIMS if not record.beyond}  # the paper's 18, in order


# ---- building the evidence from a Context ----


@cache
def paper_grid() -> pd.DataFrame:
    """The paper grid's configurations (conf/sweep/paper.yaml): axis values and `subgrids` tag (read only)."""
    plan = expand(compose(["sweep=paper"]).sweep)
    return pd.DataFrame([{**c.overrides, SUBGRIDS: ",".join(c.subgrids)} for c in plan.configurations])


def grid_runs(grid: pd.DataFrame) -> pd.DataFrame:
    """Two finished seeds of every grid configuration, every metric 0: a judge counts the grid's cases."""
    seeds = [
        grid.assign(**{SEED: s, OUTCOME: FINISHED, "run_id": [f"g{s}-{i}" for i in range(len(grid))]})
        for s in (1, 2)
    ]
    return pd.concat(seeds, ignore_index=True).assign(**{TRAIN_LOSS: 0.0, VAL_REL_LLOYD: 0.0})


def _flat_history(runs: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"run_id": runs["run_id"], "step": 0, "value": 0.0})


def probe_rows(ctx: Context, runs: pd.DataFrame, evaluation: str) -> pd.DataFrame:
    """Per-seed rows of `evaluation` for these runs (cached evaluations): one series per configuration, panels
    '<column>=<value>', and a diverged model counted as +inf at every panel and step (it beats nothing)."""
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
    return rows[["panel", "series", "method", SEED, "step", "value"]]


def _probe(ctx: Context) -> Callable[[pd.DataFrame, str], tuple[pd.DataFrame, str]]:
    def rows(runs: pd.DataFrame, evaluation: str) -> tuple[pd.DataFrame, str]:
        try:
            return probe_rows(ctx, runs, evaluation), ""
        except (MissingInput, FileNotFoundError) as err:
            return pd.DataFrame(columns=["panel", "series", "method", SEED, "step", "value"]), str(err)

    return rows


def _history(ctx: Context) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def points(runs: pd.DataFrame) -> pd.DataFrame:
        h = ctx.histories()
        return h[(h["key"] == VAL_REL_LLOYD) & h["run_id"].isin(runs["run_id"])][["run_id", "step", "value"]]

    return points


def _speed_rows(path: Path | None) -> list[dict] | None:
    return json.loads(path.read_text()).get("rows", []) if path is not None and path.exists() else None


def evidence(ctx: Context, drawn: dict[str, Figure] | None = None) -> Evidence:
    """The claims' inputs from ctx; `drawn` (figure name -> Figure) holds what the report already drew, which
    is reused rather than computed again."""
    drawn = drawn or {}
    figure = drawn.get("task_dissimilarity")
    blocks = figure.tables["family_blocks"] if figure is not None else dissimilarity(ctx)[4]
    return Evidence(
        ctx.runs,
        paper_grid(),
        ctx.settings.steps,
        _probe(ctx),
        _history(ctx),
        _speed_rows(ctx.speed_json),
        f"{ctx.speed_json} (`python -m bench speed_memory --out FILE`, then speed_json=FILE)",
        blocks,
    )


def combined(found: list[Evidence]) -> Evidence:
    """One Evidence from several stores' (sweep=lite's d 4 runs and sweep=lite32's d 32 runs, each in its own
    experiment): their runs side by side; a probe or history read goes to the evidences holding the runs
    read; the grid, benchmarks and dissimilarity table are the first's that has them. So every claim is
    judged once, on the runs of its scope wherever they were trained (large_lr_worse: d 4 from one, d 32
    from the other)."""

    def own(scoped: pd.DataFrame, e: Evidence) -> pd.DataFrame:
        return scoped[scoped["run_id"].isin(e.runs["run_id"])]

    def probe(scoped: pd.DataFrame, evaluation: str) -> tuple[pd.DataFrame, str]:
        rows, missing = [], []
        for e in found:
            if e.probe is not None and not own(scoped, e).empty:
                part, why = e.probe(own(scoped, e), evaluation)
                rows.append(part)
                missing += [why] if why else []
        empty = pd.DataFrame(columns=["panel", "series", "method", SEED, "step", "value"])
        return (pd.concat(rows, ignore_index=True) if rows else empty), "; ".join(missing)

    def history(scoped: pd.DataFrame) -> pd.DataFrame:
        parts = [e.history(own(scoped, e)) for e in found if e.history is not None]
        return (
            pd.concat(parts, ignore_index=True)
            if parts
            else pd.DataFrame(columns=["run_id", "step", "value"])
        )

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
    )


def check(ctx: Context, drawn: dict[str, Figure] | None = None) -> list[Claim]:
    """Every claim of docs/science.md section 7.1 against ctx's store, in order, then the ones beyond it;
    `drawn`: the figures the report drew, whose data the claims reuse (see `evidence`)."""
    found = evidence(ctx, drawn)
    return [judge(record, found) for record in CLAIMS]


COLUMNS = ["name", "status", "numbers", "paper", "source", "marginal", "beyond"]


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in claims], columns=COLUMNS)


def write_csv(claims: list[Claim], out_dir: Path) -> Path:
    """claims.csv (name, status, numbers, paper, source, marginal, beyond) in the report folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "claims.csv"
    claims_table(claims).to_csv(path, index=False)
    return path


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(claims: list[Claim], level: int = 2) -> str:
    """claims.md: the paper's claims, then those beyond the paper under their own heading; a claim with
    marginal cases says how many (its verdict unchanged)."""

    def table(chosen: list[Claim]) -> str:
        lines = ["| status | name | numbers | paper |", "|---|---|---|---|"]
        for c in chosen:
            mark = f" ({c.marginal} marginal)" if c.marginal else ""
            words = f'"{c.paper}" ({c.source})' if c.source else f'"{c.paper}"'
            lines.append(f"| {c.status}{mark} | `{c.name}` | {_cell(c.numbers)} | {_cell(words)} |")
        return "\n".join(lines)

    paper = [c for c in claims if not c.beyond]
    counts = ", ".join(f"{sum(c.status == s for c in paper)} {s}" for s in (PASS, FAIL, UNTESTED))
    heading = "#" * level
    text = (
        f"{heading} The paper's claims\n\n{len(paper)} claims: {counts}. A case is *marginal* when the "
        f"seeds' IQR of its margin straddles zero; it still counts as it falls.\n\n{table(paper)}\n"
    )
    beyond = [c for c in claims if c.beyond]
    if beyond:
        text += (
            f"\n{heading} Beyond the paper\n\nJudged by the same rules, not counted among the paper's claims."
            f"\n\n{table(beyond)}\n"
        )
    return text


def write_markdown(claims: list[Claim], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "claims.md"
    path.write_text(markdown(claims))
    return path


@command("leaner-claims", show_config=job_config, options=options_help)
def main(argv: list[str]) -> int:
    ctx, _ = open_context(argv)
    claims = check(ctx)
    for claim in claims:
        mark = f" ({claim.marginal} marginal)" if claim.marginal else ""
        beyond = " [beyond the paper]" if claim.beyond else ""
        print(
            f"{claim.status:<8} {claim.name}{beyond}{mark}\n"
            f'{"":9}paper:    "{claim.paper}" ({claim.source})\n'
            f"{'':9}measured: {claim.numbers}"
        )
    write_markdown(claims, ctx.out_dir)
    print(write_csv(claims, ctx.out_dir).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
