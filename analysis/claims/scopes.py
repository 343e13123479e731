"""What a claim is about, in the paper grid's own words (conf/sweep/paper.yaml, read through config/): the
axes a claim names, its scope (the runs it is judged on) and the grids a sweep expands to.

A scope is (sub-grid, slice): the runs tagged with that sub-grid of the paper grid whose config keys take the
slice's values (analysis.context.scope). A probe claim's scope is the models its figure draws
(analysis.eval_figures.PROBES), narrowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from numbers import Number

import pandas as pd
from omegaconf import DictConfig

from analysis.eval_figures import PROBES
from config.compose import compose
from config.grid import Plan, expand
from tasks.spec import FAMILIES
from tracking.names import SUBGRIDS


@cache
def sweep(name: str) -> DictConfig:
    """conf/sweep/<name>.yaml as conf/ writes it (no user config directory): read once."""
    return compose([f"sweep={name}"], user_dirs=False).sweep


# The config keys a claim names: the paper grid's axes (short name -> key), in its file's order.
AXES = tuple(sweep("paper").axes.values())
TAU, REG, EMB, D, K, FAMILY, LR = (
    sweep("paper").axes[name] for name in ("tau", "regularizer", "embedding", "d", "k", "family", "lr")
)
STEPS = "train.steps"  # not an axis: a case says where its runs trained fewer steps than the paper
EMBEDDED = ("onehot", "binary")
EXPERIMENT = "experiment"  # a run's experiment, beside its config keys: claims judged on several name theirs
# The paper's d 32 claims, trained at a smaller n as App. F (p. 25) suggests (sweep=lite32) and on 3 of its
# 10 seeds: their runs' final values are measured at the paper's n (eval.d32_n), and their verdicts say how
# many seeds they rest on.
D32 = 32
OTHER_FAMILIES = tuple(f for f in FAMILIES if f != "cauchy")

Scope = tuple[str, dict]  # (sub-grid, slice): a slice maps a config key to a value or a tuple of values
# A configuration as the claims compare them: its values of AXES, (key, value) pairs in AXES' order, numbers
# as floats, so a store's typed params and the paper grid's values meet.
Config = tuple[tuple[str, object], ...]


def config_of(row: Mapping[str, object]) -> Config:
    """The configuration of a run, per-seed row or paper-grid row: its AXES values."""
    return tuple(
        (key, float(row[key]) if isinstance(row[key], Number) else str(row[key]))
        for key in AXES
        if key in row
    )


def within(probe: str, **narrower: object) -> Scope:
    """A probe's models (the ones its figure draws), narrowed: the scope of a claim on that probe."""
    subgrid, where = PROBES[probe]
    return subgrid, {**where, **narrower}


def transfer_from(family_setting: dict) -> Scope:
    """The non-cauchy-trained OH/BN models the family-transfer probe draws, at that d and k."""
    return within("family_transfer", **{EMB: EMBEDDED, FAMILY: OTHER_FAMILIES}, **family_setting)


def setting(name: str, subgrid: str, keys: tuple[str, ...]) -> dict:
    """The one value each config key of `keys` takes in a sub-grid of conf/sweep/<name>.yaml, as conf/ writes
    it, e.g. the d and k of the paper's family sub-grid."""
    configurations = expand(sweep(name)).configurations
    values = {key: {c.overrides[key] for c in configurations if subgrid in c.subgrids} for key in keys}
    several = {key: sorted(found) for key, found in values.items() if len(found) != 1}
    if several:
        raise ValueError(f"sweep {name!r}, sub-grid {subgrid!r}: not one value each: {several}")
    return {key: found.pop() for key, found in values.items()}


def configurations(plan: Plan) -> pd.DataFrame:
    """A sweep's configurations (config.grid.expand), one row each: its config values and `subgrids` tag, as a
    sweep tags its runs."""
    return pd.DataFrame([{**c.overrides, SUBGRIDS: ",".join(c.subgrids)} for c in plan.configurations])


@cache
def paper_grid() -> pd.DataFrame:
    """The paper grid's configurations (conf/sweep/paper.yaml, or the user's where a config directory holds
    one), read only: a claim's cases there are counted on them."""
    return configurations(expand(compose(["sweep=paper"]).sweep))
