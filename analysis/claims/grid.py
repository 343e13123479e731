"""The paper grid (conf/sweep/paper.yaml) as the claims read it: its configurations, the setting of a
sweep's sub-grid, and runs of them that let a judge count the cases each part of a claim has in the paper
grid."""

from __future__ import annotations

from functools import cache

import pandas as pd

from config.compose import compose
from config.grid import expand
from tracking.names import FINISHED, OUTCOME, SEED, SUBGRIDS, TRAIN_LOSS, VAL_REL_LLOYD


@cache
def paper_grid() -> pd.DataFrame:
    """The paper grid's configurations (conf/sweep/paper.yaml): axis values and `subgrids` tag (read only)."""
    plan = expand(compose(["sweep=paper"]).sweep)
    return pd.DataFrame([{**c.overrides, SUBGRIDS: ",".join(c.subgrids)} for c in plan.configurations])


def setting(sweep: str, subgrid: str, keys: tuple[str, ...]) -> dict:
    """The one value each config key of `keys` takes in a sub-grid of conf/sweep/<sweep>.yaml, as conf/ writes
    it (no user config directory), e.g. the d and k of the paper's family sub-grid."""
    plan = expand(compose([f"sweep={sweep}"], user_dirs=False).sweep)
    values = {key: {c.overrides[key] for c in plan.configurations if subgrid in c.subgrids} for key in keys}
    several = {key: sorted(found) for key, found in values.items() if len(found) != 1}
    if several:
        raise ValueError(f"sweep {sweep!r}, sub-grid {subgrid!r}: not one value each: {several}")
    return {key: found.pop() for key, found in values.items()}


def grid_runs(grid: pd.DataFrame) -> pd.DataFrame:
    """Two finished seeds of every grid configuration, every metric 0: a judge counts the grid's cases."""
    seeds = [
        grid.assign(**{SEED: s, OUTCOME: FINISHED, "run_id": [f"g{s}-{i}" for i in range(len(grid))]})
        for s in (1, 2)
    ]
    return pd.concat(seeds, ignore_index=True).assign(**{TRAIN_LOSS: 0.0, VAL_REL_LLOYD: 0.0})


def flat_history(runs: pd.DataFrame) -> pd.DataFrame:
    """One val_rel_lloyd point per run (step 0, value 0): the history grid_runs' runs have."""
    return pd.DataFrame({"run_id": runs["run_id"], "step": 0, "value": 0.0})
