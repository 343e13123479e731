"""Probe cases (pure): models evaluated on fresh tasks against Lloyd's iterations, or against their own t=1.

A probe's rows are per seed: panel, series, method, seed, step, value (the mean log objective after `step`
iterations), and where the rows name it, `config`: a model series' configuration (scopes.config_of), the
one more seeds would go to (analysis.seeds); Lloyd's series is analysis.style.LLOYD. A claim compares the
models' median over seeds after the same T steps, on the models the figures draw
(analysis.eval_figures.PROBES).
"""

from __future__ import annotations

from typing import Callable

import pandas as pd

from analysis.claims.cases import Case, compare
from analysis.style import LLOYD
from tracking.names import SEED


def _at(rows: pd.DataFrame, step: int, method: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(Model values at `step` per panel, series and seed, of series with >= 2 seeds; Lloyd's per panel
    and seed)."""
    here = rows[rows["step"] == step]
    lloyd = here[here["series"] == LLOYD].groupby(["panel", SEED])["value"].mean()
    models = here[(here["series"] != LLOYD) & (here["method"] == method)]
    models = models.groupby(["panel", "series", SEED])["value"].mean().reset_index()
    seeds = models.groupby(["panel", "series"])[SEED].transform("nunique")
    return models[seeds >= 2], lloyd


def _configs(rows: pd.DataFrame, series: str) -> tuple:
    """The configuration of a model series, as its rows name it; () where they do not."""
    if "config" not in rows:
        return ()
    named = rows.loc[rows["series"] == series, "config"].dropna()
    return (named.iloc[0],) if len(named) else ()


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
        values, config = part.set_index(SEED)["value"], _configs(rows, series)
        cases.append(compare(f"{panel} {series}", values, lloyd[panel], holds, words, config))
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
        values, config = part.set_index(SEED)["value"], _configs(rows, series)
        cases.append(compare(f"{panel} {series}", values, first[(panel, series)], holds, words, config))
    return cases


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
