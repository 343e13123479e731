"""What a claim is about: the config keys (axes) the claims name, and scopes, the runs a claim is judged on.

A scope is (sub-grid, slice): the runs tagged with that sub-grid of the paper grid whose config keys take the
slice's values (analysis.context.scope). A probe claim's scope is the models its figure draws
(analysis.eval_figures.PROBES), narrowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Number

from analysis.eval_figures import PROBES
from tasks.sampler import FAMILIES

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
# The d whose runs' final values the claims measure at the paper's n (eval.d32_n), however small an n they
# trained at: the paper's d 32 claims, trained smaller as App. F (p. 25) suggests (sweep=lite32).
MEASURED_D = 32
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
