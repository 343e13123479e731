"""`python -m analysis.claims [tracking.*] [select.*] [eval.*]`: the paper's 14 claims (docs/science.md section 7.1) against the store.

A claim is judged only on its scope: the runs tagged with its sub-grid, in its
slice (tau 0.1, d 4, ...), so other runs in the store never change a verdict.
Per configuration, the median across seeds of the final value, where a
diverged seed counts as +inf (it beats nothing: neither Lloyd's nor a lower
loss) and an unfinished one not at all; a configuration with fewer than 2
seeds is left out. A claim is a few parts ("every OH/BN configuration < 1",
"every NA one >= 1") over the cases its scope holds, partial coverage
included: one failing case makes it FAIL, else a part without cases makes it
UNTESTED (never PASS on zero cases), else PASS. Probes compare the models'
median (over seeds) mean log objective with Lloyd's after the same T steps,
from the report's cached evaluations.

Prints every claim beside the paper's words and writes claims.csv into the report folder.
"""
# The judgments are pure functions of frames (judge_runs, judge_probe, judge_cauchy, judge_speed,
# judge_dissimilarity); `check` builds the frames from a Context.

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from analysis.aggregate import divergence_note
from analysis.checkpoint_eval import SHIFTS
from analysis.cli import job_config, open_context, options_help
from analysis.context import Context, count_once, evaluation_rows, series_labels, tagged, varying
from analysis.eval_figures import task_dissimilarity
from analysis.plot import CURVE_COLUMNS, MissingInput
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
SHIFTED = tuple(
    name for name, changes in SHIFTS.items() if changes
)  # unequal weights, anisotropic, scale 0.05, 0.2
SPEED = ("forward_seconds", "backward_seconds", "peak_memory_bytes")
SHOWN = 4  # cases printed per part and outcome

# The paper's words (docs/science.md section 7.1), in the order of docs/science.md: the one place they are written.
PAPER = {
    "tau01_beats_lloyd": "At tau=0.1, both regularizers outperform one Lloyd step except with no token embedding",
    "l2_lower_train_loss": "The L2-regularized min gives tighter bounds",
    "l2_better_val_tau1_d4": "better validation performance than the NE-regularized min, especially at larger tau "
    "and d = 4",
    "reembed_beats_lloyd": "Re-embedding ... OH/BN models outperforming Lloyd's iterations while naive repeated "
    "updates diverge",
    "noembed_reembed_trails_lloyd": "models without token embeddings improve with re-embedding but underperform "
    "Lloyd's",
    "length_generalises": "Models trained on n = 512 points generalize to tasks with 128, 256, 1024, and 2048 points "
    "... outperform Lloyd's iterations at each tested size",
    "shift_generalises": "OH/BN models significantly outperform Lloyd's except at larger scale, where they trail "
    "initially but overtake with more steps",
    "cauchy_fails": "Cauchy training diverges and Cauchy testing remains noncompetitive",
    "families_generalise": "with tau = 0.1, both regularizers and OH or BN embeddings can beat Lloyd across the other "
    "tested distributions",
    "ne_fails_gumbel_laplace_tau1": "At tau = 1, L2 generalizes better than NE, and NE fails to generalize on gumbel "
    "and laplace tasks",
    "clusters_d4_tau1": "For d = 4 and tau = 1, across k in {6, 10, 16, 25}, L2 learns somewhat but never matches one "
    "Lloyd iteration, while NE fails to learn; BN deteriorates as k rises, unlike OH",
    "large_lr_worse": "For d = 32, rates 0.1 and 1.0 converge to worse local minima; for d = 4, this is reported for "
    "rate 1.0",
    "binary_faster_leaner": "With k sufficiently larger than d, the binary model achieves up to 12x/9x "
    "forward/backward speedups and almost 70% lower memory usage",
    "cauchy_dissimilar": "cauchy tasks are similar mainly to other cauchy tasks and are substantially dissimilar from "
    "other families",
}

PROBED = {TAU: 0.1, D: 4, EMB: EMBEDDED}  # the models the paper iterates, shifts and lengthens
# Claim -> (sub-grid, slice): the runs it is judged on. A slice maps a config key to a value or a tuple of
# values.
SCOPES = {
    "tau01_beats_lloyd": ("tau", {TAU: 0.1}),
    "l2_lower_train_loss": ("tau", {}),
    "l2_better_val_tau1_d4": ("tau", {TAU: 1.0, D: 4, EMB: EMBEDDED}),
    "reembed_beats_lloyd": ("tau", PROBED),
    "noembed_reembed_trails_lloyd": ("tau", {**PROBED, EMB: "none"}),
    "length_generalises": ("tau", PROBED),
    "shift_generalises": ("tau", PROBED),
    "cauchy_fails": ("family", {FAMILY: "cauchy"}),
    "families_generalise": ("family", {TAU: 0.1, EMB: EMBEDDED, FAMILY: OTHER_FAMILIES}),
    "ne_fails_gumbel_laplace_tau1": ("family", {TAU: 1.0, EMB: EMBEDDED}),
    "clusters_d4_tau1": ("clusters", {D: 4, TAU: 1.0}),
    "large_lr_worse": ("lr", {}),
}
# cauchy_fails' second half: models trained at tau 0.1 on every other family, tested on cauchy tasks.
CAUCHY_TRANSFER = SCOPES["families_generalise"]


@dataclass
class Claim:
    name: str
    status: str  # PASS, FAIL or UNTESTED
    numbers: str  # what was measured, and what is missing
    paper: str  # the paper's words (docs/science.md section 7.1)


@dataclass
class Part:
    """One condition of a claim over its cases (label, measured, holds); `expected`: cases the paper grid has."""

    what: str
    cases: list[tuple[str, str, bool]]
    expected: int | None = None

    def describe(self) -> str:
        of = f" of {self.expected} in the paper grid" if self.expected is not None else ""
        if not self.cases:
            return f"{self.what}: untested, no case{of}"
        shown = []
        for word, holds in (("fails", False), ("holds", True)):
            items = [f"{label} {measured}" for label, measured, ok in self.cases if ok == holds]
            if items:
                more = f" +{len(items) - SHOWN} more" if len(items) > SHOWN else ""
                shown.append(f"{word}: {', '.join(items[:SHOWN])}{more}")
        held = sum(ok for *_, ok in self.cases)
        return f"{self.what}: {held}/{len(self.cases)} cases{of} ({'; '.join(shown)})"


def verdict(parts: list[Part]) -> str:
    """FAIL on any failing case (a counterexample decides); else UNTESTED if a part has no case; else PASS."""
    if any(not ok for part in parts for *_, ok in part.cases):
        return FAIL
    return PASS if parts and all(part.cases for part in parts) else UNTESTED


def fmt(value: float) -> str:
    return "diverged" if value == math.inf else f"{value:.3f}"


# ---- scopes and per-configuration values (pure) ----


def scope(runs: pd.DataFrame, subgrid: str, where: dict) -> pd.DataFrame:
    """The runs tagged with `subgrid` whose config values lie in `where`: never a fallback to other runs."""
    runs = tagged(runs, subgrid)
    for key, allowed in where.items():
        runs = (
            runs[runs[key].isin(allowed if isinstance(allowed, tuple) else (allowed,))]
            if key in runs
            else runs[:0]
        )
    return runs


def per_configuration(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per configuration: `value`, the median across seeds of the final `metric`, a diverged seed as +inf,
    and `seeds`, how many seeds finished or diverged (unfinished runs do not count; a rerun counts once)."""
    keys = config_keys(runs.columns)
    ended = runs[runs[OUTCOME].isin((FINISHED, DIVERGED))]
    value = ended[metric].astype(float).where(ended[OUTCOME] == FINISHED, math.inf)
    per_seed = ended.assign(value=value).groupby(keys + [SEED], dropna=False)["value"].mean().reset_index()
    return per_seed.groupby(keys, dropna=False)["value"].agg(value="median", seeds="size").reset_index()


def summary(runs: pd.DataFrame, subgrid: str, where: dict, grid: pd.DataFrame | None) -> str:
    """What the scope holds: configurations with >= 2 seeds (of the paper grid's), those left out, diverged and
    unfinished runs."""
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
        return f"{name}: none, 0{expected} configurations (the `{subgrid}` sub-grid of sweep=paper)"
    ended = runs[runs[OUTCOME].isin((FINISHED, DIVERGED))]
    seeds = ended.groupby(config_keys(runs.columns), dropna=False)[SEED].nunique()
    few = f" ({int((seeds < 2).sum())} with fewer left out)" if (seeds < 2).any() else ""
    diverged, unfinished = int((runs[OUTCOME] == DIVERGED).sum()), len(runs) - len(ended)
    return (
        f"{name}: {int((seeds >= 2).sum())}{expected} configurations with >= 2 seeds{few}; "
        f"diverged {diverged}, unfinished {unfinished} of {len(runs)} runs"
    )


def _keys(frame: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[str]:
    """The config keys that tell the rows apart (every axis for a single row), but `drop`."""
    keys = varying(frame) if len(frame) > 1 else [k for k in AXES if k in frame]
    return [k for k in keys if k not in drop]


def _label(row: pd.Series, keys: list[str]) -> str:
    return "-".join(short(k, row[k]) for k in keys) or "all"


def _cases(table: pd.DataFrame, holds: Callable[[float], bool]) -> list[tuple[str, str, bool]]:
    keys = _keys(table)
    return [(_label(row, keys), fmt(row["value"]), bool(holds(row["value"]))) for _, row in table.iterrows()]


def _pair_cases(
    table: pd.DataFrame, key: str, a: object, b: object, holds: Callable[[float, float], bool]
) -> list[tuple[str, str, bool]]:
    """Configurations with key == a beside those with key == b that agree on every other config key."""
    others = [k for k in config_keys(table.columns) if k != key]
    left = table.loc[table[key] == a, others + ["value"]]
    pairs = left.merge(table.loc[table[key] == b, others + ["value"]], on=others, suffixes=("_a", "_b"))
    keys = _keys(pairs, drop=(key,))
    return [
        (
            _label(row, keys),
            f"{short(key, a)} {fmt(row['value_a'])} vs {short(key, b)} {fmt(row['value_b'])}",
            bool(holds(row["value_a"], row["value_b"])),
        )
        for _, row in pairs.iterrows()
    ]


def _rise_cases(table: pd.DataFrame) -> list[tuple[str, str, bool]]:
    """BN's val_rel_lloyd rises from the smallest to the largest k (both embeddings have) by more than OH's."""
    others = [k for k in config_keys(table.columns) if k not in (EMB, K)]
    keys = [k for k in _keys(table) if k in others]
    cases = []
    for _, part in table.groupby(others, dropna=False):
        oh, bn = (part[part[EMB] == e].set_index(K)["value"] for e in ("onehot", "binary"))
        ks = sorted(set(oh.index) & set(bn.index))
        if len(ks) < 2:
            continue
        rise_oh, rise_bn = oh[ks[-1]] - oh[ks[0]], bn[ks[-1]] - bn[ks[0]]
        cases.append(
            (
                _label(part.iloc[0], keys),
                f"k {ks[0]}->{ks[-1]}: BN {rise_bn:+.3f} vs OH {rise_oh:+.3f}",
                bool(rise_bn > max(rise_oh, 0.0)),
            )
        )
    return cases


# ---- the claims on final logged values: per-configuration table -> parts (pure) ----


def _tau01(t: pd.DataFrame) -> list[Part]:
    return [
        Part("OH/BN val_rel_lloyd < 1", _cases(t[t[EMB].isin(EMBEDDED)], lambda v: v < 1)),
        Part("NA val_rel_lloyd >= 1", _cases(t[t[EMB] == "none"], lambda v: v >= 1)),
    ]


def _l2_lower_train_loss(t: pd.DataFrame) -> list[Part]:
    return [Part("l2 final train_loss < ne's", _pair_cases(t, REG, "l2", "ne", lambda l2, ne: l2 < ne))]


def _l2_better_val(t: pd.DataFrame) -> list[Part]:
    return [Part("l2 val_rel_lloyd < ne's", _pair_cases(t, REG, "l2", "ne", lambda l2, ne: l2 < ne))]


def _cauchy_trains(t: pd.DataFrame) -> list[Part]:
    return [Part("cauchy configurations diverged or val_rel_lloyd >= 1", _cases(t, lambda v: v >= 1))]


def _families(t: pd.DataFrame) -> list[Part]:
    return [Part("val_rel_lloyd < 1", _cases(t, lambda v: v < 1))]


def _ne_fails(t: pd.DataFrame) -> list[Part]:
    ne_fails = t[(t[REG] == "ne") & t[FAMILY].isin(("gumbel", "laplace"))]
    return [
        Part(
            "l2 val_rel_lloyd < ne's on every non-cauchy family",
            _pair_cases(t[t[FAMILY] != "cauchy"], REG, "l2", "ne", lambda l2, ne: l2 < ne),
        ),
        Part("ne val_rel_lloyd >= 1 on gumbel and laplace", _cases(ne_fails, lambda v: v >= 1)),
    ]


def _clusters(t: pd.DataFrame) -> list[Part]:
    return [
        Part("l2 val_rel_lloyd >= 1", _cases(t[t[REG] == "l2"], lambda v: v >= 1)),
        Part("ne val_rel_lloyd > l2's", _pair_cases(t, REG, "ne", "l2", lambda ne, l2: ne > l2)),
        Part("BN's val_rel_lloyd rises with k by more than OH's", _rise_cases(t)),
    ]


def _large_lr(t: pd.DataFrame) -> list[Part]:
    worse = lambda big, base: big > base  # noqa: E731
    d32, d4 = t[t[D] == 32], t[t[D] == 4]
    return [
        Part(
            "d 32: final train_loss at lr 0.1 and 1.0 > at 0.01",
            _pair_cases(d32, LR, 0.1, 0.01, worse) + _pair_cases(d32, LR, 1.0, 0.01, worse),
        ),
        Part("d 4: final train_loss at lr 1.0 > at 0.01", _pair_cases(d4, LR, 1.0, 0.01, worse)),
    ]


RUN_CLAIMS: dict[str, tuple[str, Callable[[pd.DataFrame], list[Part]]]] = {
    "tau01_beats_lloyd": (VAL_REL_LLOYD, _tau01),
    "l2_lower_train_loss": (TRAIN_LOSS, _l2_lower_train_loss),
    "l2_better_val_tau1_d4": (VAL_REL_LLOYD, _l2_better_val),
    "families_generalise": (VAL_REL_LLOYD, _families),
    "ne_fails_gumbel_laplace_tau1": (VAL_REL_LLOYD, _ne_fails),
    "clusters_d4_tau1": (VAL_REL_LLOYD, _clusters),
    "large_lr_worse": (TRAIN_LOSS, _large_lr),
}


def _run_parts(
    name: str,
    runs: pd.DataFrame,
    grid: pd.DataFrame | None,
    metric: str,
    parts_of: Callable[[pd.DataFrame], list[Part]],
) -> tuple[list[Part], str]:
    """The parts of a claim on its scope's configurations with >= 2 seeds, and the scope's summary."""
    subgrid, where = SCOPES[name]
    runs = scope(runs, subgrid, where)
    table = per_configuration(runs, metric)
    parts = parts_of(table[table["seeds"] >= 2])
    if grid is not None:  # the same parts on the paper grid count the cases it has
        for part, full in zip(parts, parts_of(scope(grid, subgrid, where))):
            part.expected = len(full.cases)
    return parts, summary(runs, subgrid, where, grid)


def _claim(name: str, parts: list[Part], *notes: str) -> Claim:
    numbers = "; ".join([*filter(None, notes), *(part.describe() for part in parts)])
    return Claim(name, verdict(parts), numbers, PAPER[name])


def judge_runs(name: str, runs: pd.DataFrame, grid: pd.DataFrame | None = None) -> Claim:
    """A claim of RUN_CLAIMS from the runs frame; `grid` (paper_grid()) adds how many cases the paper grid has."""
    parts, scope_note = _run_parts(name, runs, grid, *RUN_CLAIMS[name])
    return _claim(name, parts, scope_note)


# ---- the probe claims: curves (as eval_curves returns them) -> parts (pure) ----


def _at(curves: pd.DataFrame, step: int) -> pd.Series:
    """Median at `step`, indexed by (panel, series), of the series with >= 2 seeds."""
    hit = curves[(curves["x"] == step) & (curves["n_seeds"] >= 2)]
    return hit.set_index(["panel", "series"])["median"]


def _models(values: pd.Series, suffix: str, panels: tuple[str, ...] | None) -> list[tuple[str, str]]:
    return [
        (p, s)
        for p, s in values.index
        if s != LLOYD and s.endswith(suffix) and (panels is None or p in panels)
    ]


def _against_lloyd(
    curves: pd.DataFrame,
    T: int,
    holds: Callable[[float, float], bool],
    suffix: str = "",
    panels: tuple[str, ...] | None = None,
) -> list[tuple[str, str, bool]]:
    """Per panel and model series: holds(the model's median at T, Lloyd's at T)."""
    at = _at(curves, T)
    return [
        (
            f"{p} {s}",
            f"{fmt(at[(p, s)])} vs Lloyd {fmt(at[(p, LLOYD)])}",
            bool(holds(at[(p, s)], at[(p, LLOYD)])),
        )
        for p, s in _models(at, suffix, panels)
        if (p, LLOYD) in at.index
    ]


def _against_step1(
    curves: pd.DataFrame, T: int, holds: Callable[[float, float], bool], suffix: str = ""
) -> list[tuple[str, str, bool]]:
    """Per panel and model series: holds(its median at T, its median at t=1)."""
    at, first = _at(curves, T), _at(curves, 1)
    return [
        (
            f"{p} {s}",
            f"{fmt(first[(p, s)])} at t=1 -> {fmt(at[(p, s)])}",
            bool(holds(at[(p, s)], first[(p, s)])),
        )
        for p, s in _models(at, suffix, None)
        if (p, s) in first.index
    ]


def _lt(a: float, b: float) -> bool:
    return a < b


def _gt(a: float, b: float) -> bool:
    return a > b


def _reembed(curves: pd.DataFrame, T: int) -> list[Part]:
    return [
        Part(f"re-embedded < Lloyd at T={T}", _against_lloyd(curves, T, _lt, " reembed")),
        Part(f"naive at T={T} > at t=1", _against_step1(curves, T, _gt, " naive")),
    ]


def _noembed(curves: pd.DataFrame, T: int) -> list[Part]:
    return [
        Part(f"re-embedded at T={T} < at t=1", _against_step1(curves, T, _lt)),
        Part(f"re-embedded > Lloyd at T={T}", _against_lloyd(curves, T, _gt)),
    ]


def _length(curves: pd.DataFrame, T: int) -> list[Part]:
    return [Part(f"< Lloyd at T={T} at every n", _against_lloyd(curves, T, _lt))]


def _shift(curves: pd.DataFrame, T: int) -> list[Part]:
    return [
        Part(f"< Lloyd at T={T} under {shift}", _against_lloyd(curves, T, _lt, panels=(f"shift={shift}",)))
        for shift in SHIFTED
    ]


def _transfer(curves: pd.DataFrame, T: int) -> Part:
    return Part(
        f"models trained on other families >= Lloyd on cauchy tasks at T={T}",
        _against_lloyd(curves, T, lambda model, lloyd: model >= lloyd, panels=("test_family=cauchy",)),
    )


# Claim -> (evaluation, the evaluation table's column that names a panel, methods, parts from (curves, T)).
PROBE_CLAIMS: dict[str, tuple[str, str, tuple[str, ...], Callable[[pd.DataFrame, int], list[Part]]]] = {
    "reembed_beats_lloyd": ("multistep", "init", ("reembed", "naive"), _reembed),
    "noembed_reembed_trails_lloyd": ("multistep", "init", ("reembed",), _noembed),
    "length_generalises": ("length", "n", ("reembed",), _length),
    "shift_generalises": ("mixture_shift", "shift", ("reembed",), _shift),
}


def judge_probe(
    name: str,
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    T: int,
    grid: pd.DataFrame | None = None,
    missing: str = "",
) -> Claim:
    """A claim of PROBE_CLAIMS from its scope's curves (probe_curves); runs only for the scope's summary."""
    subgrid, where = SCOPES[name]
    evaluation, _, _, parts_of = PROBE_CLAIMS[name]
    note = f"{evaluation} not evaluated: {missing}" if missing else ""
    return _claim(name, parts_of(curves, T), summary(scope(runs, subgrid, where), subgrid, where, grid), note)


def judge_cauchy(
    runs: pd.DataFrame, curves: pd.DataFrame, T: int, grid: pd.DataFrame | None = None, missing: str = ""
) -> Claim:
    """cauchy_fails needs both halves: cauchy training (the runs) and transfer to cauchy tasks (family_transfer curves
    of the CAUCHY_TRANSFER models); either half without cases leaves it UNTESTED."""
    (trains,), trained = _run_parts("cauchy_fails", runs, grid, VAL_REL_LLOYD, _cauchy_trains)
    transfer = _transfer(curves, T)
    transferred = summary(scope(runs, *CAUCHY_TRANSFER), *CAUCHY_TRANSFER, grid)
    numbers = [
        trained,
        trains.describe(),
        f"transfer from {transferred}",
        f"family_transfer not evaluated: {missing}" if missing else "",
        transfer.describe(),
    ]
    return Claim(
        "cauchy_fails", verdict([trains, transfer]), "; ".join(filter(None, numbers)), PAPER["cauchy_fails"]
    )


# ---- the benchmark and the task-dissimilarity claims (pure) ----


def judge_speed(rows: list[dict] | None, source: str = "") -> Claim:
    """binary_faster_leaner from `python -m bench speed_memory` rows ({d, k, onehot: {...}, binary: {...}})."""
    rows = sorted(
        (r for r in rows or [] if isinstance(r.get("onehot"), dict) and isinstance(r.get("binary"), dict)),
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
            (
                f"d={d} k={rs[-1]['k']} {m}",
                f"onehot/binary {ratio(rs[-1], m):.2f}",
                rs[-1]["binary"][m] < rs[-1]["onehot"][m],
            )
            for d, rs in by_d.items()
            for m in SPEED
        ],
    )
    grows = Part(
        "onehot/binary grows from the smallest to the largest k",
        [
            (
                f"d={d} {m}",
                f"k {rs[0]['k']}->{rs[-1]['k']}: {ratio(rs[0], m):.2f}->{ratio(rs[-1], m):.2f}",
                ratio(rs[-1], m) > ratio(rs[0], m),
            )
            for d, rs in by_d.items()
            if len(rs) > 1
            for m in SPEED
        ],
    )
    if not rows:
        return _claim(
            "binary_faster_leaner", [largest, grows], f"needs the speed_memory benchmark's rows: {source}"
        )
    maxima = (
        f"measured maxima: forward {max(ratio(r, SPEED[0]) for r in rows):.1f}x (paper up to 12x), "
        f"backward {max(ratio(r, SPEED[1]) for r in rows):.1f}x (paper up to 9x), memory "
        f"{max(1 - r['binary'][SPEED[2]] / max(r['onehot'][SPEED[2]], 1) for r in rows):.0%} lower "
        f"(paper almost 70%)"
    )
    return _claim("binary_faster_leaner", [largest, grows], maxima)


def judge_dissimilarity(blocks: pd.DataFrame) -> Claim:
    """cauchy_dissimilar from the mean earth-mover distance per family pair (task_dissimilarity's family_blocks)."""
    matrix = blocks.set_index("family_i") if "family_i" in blocks else blocks
    others = [f for f in matrix.index if f != "cauchy" and f in matrix.columns]
    if "cauchy" not in matrix.index or len(others) < 2:
        return _claim(
            "cauchy_dissimilar",
            [Part("cauchy-to-others > between non-cauchy families", [])],
            f"needs the distances of cauchy and >= 2 other families; the table has {list(matrix.index)}",
        )
    to_others = float(matrix.loc["cauchy", others].mean())
    pairs = [(f, g) for i, f in enumerate(others) for g in others[i + 1 :]]
    part = Part(
        f"mean distance cauchy-to-others {to_others:.4g} > mean distance between two non-cauchy families",
        [(f"{f}-{g}", f"{matrix.loc[f, g]:.4g}", bool(to_others > matrix.loc[f, g])) for f, g in pairs],
    )
    return _claim(
        "cauchy_dissimilar", [part], f"cauchy-to-cauchy {float(matrix.loc['cauchy', 'cauchy']):.4g}"
    )


# ---- building the frames from a Context ----


@cache
def paper_grid() -> pd.DataFrame:
    """The paper grid's configurations (conf/sweep/paper.yaml): axis values and `subgrids` tag (do not modify)."""
    plan = expand(compose(["sweep=paper"]).sweep)
    grid = pd.DataFrame([{**c.overrides, SUBGRIDS: ",".join(c.subgrids)} for c in plan.configurations])
    return grid.assign(value=0.0)  # the parts count cases on it as on a per-configuration table


def probe_curves(
    ctx: Context, runs: pd.DataFrame, evaluation: str, column: str, methods: tuple[str, ...]
) -> pd.DataFrame:
    """eval_curves' frame for these runs: one series per configuration, panels '<column>=<value>', and a diverged
    model counted as +inf at every panel and step (it beats nothing) where eval_curves leaves it out."""
    labels, _ = series_labels(runs, varying(runs) or [EMB])
    rows = count_once(
        evaluation_rows(
            ctx, runs, evaluation, lambda t, r: column + "=" + t[column].astype(str), labels, methods
        )
    )
    suffixes = [f" {m}" for m in methods] if len(methods) > 1 else [""]
    points = rows.loc[rows["series"] != LLOYD, ["panel", "step"]].drop_duplicates()
    lost = [
        points.assign(series=labels[i] + suffix, unit=run["run_id"], value=math.inf, **{SEED: run[SEED]})
        for i, run in runs[runs[OUTCOME] == DIVERGED].iterrows()
        for suffix in suffixes
    ]
    grouped = pd.concat([rows, *lost], ignore_index=True).groupby(["panel", "series", "step"], sort=False)[
        "value"
    ]
    with np.errstate(invalid="ignore"):  # a quartile between two +inf is NaN; only the median is judged
        curves = pd.DataFrame(
            {
                "median": grouped.median(),
                "q25": grouped.quantile(0.25),
                "q75": grouped.quantile(0.75),
                "n_seeds": grouped.size(),
            }
        )
    curves = curves.reset_index().rename(columns={"step": "x"})
    notes = runs.groupby(labels)[OUTCOME].agg(lambda o: divergence_note((o == DIVERGED).sum(), len(o)))
    curves["diverged"] = curves["series"].str.split(" ").str[0].map(notes).fillna("")
    return curves[CURVE_COLUMNS]


def _curves(
    ctx: Context, runs: pd.DataFrame, evaluation: str, column: str, methods: tuple[str, ...]
) -> tuple[pd.DataFrame, str]:
    """probe_curves, or no curves and why (no finished model, a missing checkpoint)."""
    try:
        return probe_curves(ctx, runs, evaluation, column, methods), ""
    except (MissingInput, FileNotFoundError) as err:
        return pd.DataFrame(columns=CURVE_COLUMNS), str(err)


def _speed_rows(path: Path | None) -> list[dict] | None:
    return json.loads(path.read_text()).get("rows", []) if path is not None and path.exists() else None


def check(ctx: Context) -> list[Claim]:
    """Every claim of docs/science.md section 7.1 against ctx's store, in the order of docs/science.md."""
    grid, T = paper_grid(), ctx.settings.steps
    judged = {name: judge_runs(name, ctx.runs, grid) for name in RUN_CLAIMS}
    for name, (evaluation, column, methods, _) in PROBE_CLAIMS.items():
        curves, missing = _curves(ctx, scope(ctx.runs, *SCOPES[name]), evaluation, column, methods)
        judged[name] = judge_probe(name, ctx.runs, curves, T, grid, missing)
    curves, missing = _curves(
        ctx, scope(ctx.runs, *CAUCHY_TRANSFER), "family_transfer", "test_family", ("reembed",)
    )
    judged["cauchy_fails"] = judge_cauchy(ctx.runs, curves, T, grid, missing)
    judged["binary_faster_leaner"] = judge_speed(
        _speed_rows(ctx.speed_json),
        f"{ctx.speed_json} (`python -m bench speed_memory --out FILE`, then speed_json=FILE)",
    )
    judged["cauchy_dissimilar"] = judge_dissimilarity(task_dissimilarity(ctx).tables["family_blocks"])
    return [judged[name] for name in PAPER]


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in claims], columns=["name", "status", "numbers", "paper"])


def write_csv(claims: list[Claim], out_dir: Path) -> Path:
    """claims.csv (name, status, numbers, paper) in the report folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "claims.csv"
    claims_table(claims).to_csv(path, index=False)
    return path


@command("leaner-claims", show_config=job_config, options=options_help)
def main(argv: list[str]) -> int:
    ctx, _ = open_context(argv)
    claims = check(ctx)
    for claim in claims:
        print(
            f'{claim.status:<8} {claim.name}\n{"":9}paper:    "{claim.paper}"\n{"":9}measured: {claim.numbers}'
        )
    print(write_csv(claims, ctx.out_dir).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
