"""Several experiments judged as one, each configuration at one setting (docs/science.md section 7.3).

sweep=lite trains the paper's d 4 configurations at n 128 and its tau 1 ones for 4,000 steps; the declared
extension (sweep=lite-plus) trains some of the same configurations again at the paper's n 512 or for its
10,000 steps. Pooled, a configuration would be judged on a mixture of the two. Instead each configuration
of the paper grid (scopes.config_of: its tau, regularizer, embedding, d, k, family and lr) is judged on the
runs of one setting (the training n and steps they share): the one closest to the paper's that
has runs, the paper's n first (512 over 128), then its steps (10,000 over 4,000). The d needs no rule of its
own: it is part of the configuration, so a claim's d 32 configurations are judged at d 32 wherever trained.

The same choice made the other way (`nearest=False`, the setting farthest from the paper's) gives the
verdicts at lite scale, printed beside those that differ (table.beside).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from analysis.claims.cases import PAPER_STEPS
from analysis.claims.evidence import Evidence
from analysis.claims.scopes import EXPERIMENT, STEPS, config_of
from config.defaults import default
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED

PAPER_N: int = default("task.n")  # the paper's 512 points per task (conf/task/paper.yaml)
N = "task.n"


def distance(n: float, steps: float) -> tuple[float, float]:
    """How far a setting is from the paper's, compared n first, then steps: (|log2(n / 512)|, |steps -
    10,000|), so n 256 is nearer than n 128 and 10,000 steps nearer than 4,000."""
    return abs(math.log2(n / PAPER_N)), abs(steps - PAPER_STEPS)


def at_setting(evidence: Evidence, nearest: bool = True) -> Evidence:
    """The evidence of several experiments with each configuration's runs at one setting (`chosen`); one
    experiment's as it is."""
    if evidence.runs.empty or evidence.runs[EXPERIMENT].nunique() < 2:
        return evidence
    return replace(evidence, runs=chosen(evidence.runs, nearest))


def chosen(runs: pd.DataFrame, nearest: bool = True) -> pd.DataFrame:
    """Per configuration, the runs of the setting nearest to the paper's (`nearest=False`: farthest) among
    those with runs to judge (at least 2 seeds that finished or diverged, the judges' rule); settings as far
    as the chosen one are all kept (the same setting in two experiments). A configuration with no setting to
    judge keeps all its runs, so its summary still counts them."""
    n = runs[N] if N in runs else pd.Series(PAPER_N, index=runs.index)  # a store that fixes n or steps
    steps = runs[STEPS] if STEPS in runs else pd.Series(PAPER_STEPS, index=runs.index)
    table = pd.DataFrame(
        {
            "config": [config_of(row) for _, row in runs.iterrows()],
            "far": [distance(a, b) for a, b in zip(n, steps)],
            "judgeable": runs[SEED].where(runs[OUTCOME].isin((FINISHED, DIVERGED))),
        },
        index=runs.index,
    )
    keep = pd.Series(True, index=runs.index)
    for _, mine in table.groupby("config", sort=False):
        seeds = mine.groupby("far")["judgeable"].nunique()
        judgeable = seeds[seeds >= 2].index
        if len(judgeable):
            pick = min(judgeable) if nearest else max(judgeable)
            keep[mine.index] = [far == pick for far in mine["far"]]
    return runs[keep]
