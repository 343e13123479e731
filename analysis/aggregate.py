"""The one place where numbers are reduced: over tasks, then across seeds.

Every curve in every figure is made the same way (docs/science.md section 7): for each seed,
the mean over tasks of the log k-means objective (or a logged per-seed
metric); then, at each x, the median across seeds with the inter-quartile
band (25th-75th percentile, linear interpolation as numpy.percentile).
Diverged runs are left out of the curves and counted, so a legend can say
"3/10 diverged".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

QUANTILES = {"q25": 0.25, "median": 0.5, "q75": 0.75}


def task_mean_log(objective: torch.Tensor) -> float:
    """Mean over tasks of the log k-means objective (a floor keeps a perfect 0 finite)."""
    return float(torch.log(objective.double().clamp(min=1e-12)).mean())


def seed_band(per_seed: pd.DataFrame, by: list[str], x: str, y: str) -> pd.DataFrame:
    """Median and IQR across seeds of `y` at each `x` within each `by` group.

    per_seed holds one row per (group, seed, x). Returns the columns
    by + [x, median, q25, q75, n_seeds]; rows with a non-finite y are
    not counted (a seed missing a point there simply does not vote).
    """
    finite = per_seed[np.isfinite(per_seed[y].astype(float))]
    grouped = finite.groupby(by + [x], sort=True, dropna=False)[y]
    out = grouped.quantile(list(QUANTILES.values())).unstack()
    out.columns = list(QUANTILES)
    out["n_seeds"] = grouped.size()
    return out.reset_index()[by + [x, "median", "q25", "q75", "n_seeds"]]


def divergence_counts(runs: pd.DataFrame, by: list[str], diverged: pd.Series) -> pd.DataFrame:
    """Per group: n_runs and n_diverged (diverged is a boolean Series aligned with runs)."""
    frame = runs[by].assign(_diverged=diverged.astype(bool).to_numpy())
    counts = frame.groupby(by, dropna=False)["_diverged"].agg(n_runs="size", n_diverged="sum")
    return counts.reset_index()


def divergence_note(n_diverged: int, n_runs: int) -> str:
    """'3/10 diverged', or '' when none did."""
    return f"{int(n_diverged)}/{int(n_runs)} diverged" if n_diverged else ""
