"""What a claim is about: the config keys (axes) the claims name, and scopes, the runs a claim is judged on.

A scope is (sub-grid, slice): the runs tagged with that sub-grid of the paper grid whose config keys take the
slice's values (analysis.context.scope). A probe claim's scope is the models its figure draws
(analysis.eval_figures.PROBES), narrowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Number

from analysis.eval_figures import PROBES
from tasks.spec import FAMILIES

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
