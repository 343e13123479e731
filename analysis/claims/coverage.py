"""Whether a claim was judged on all of its scope, and if not, what is missing.

A claim's scope is a slice of a sub-grid of the paper grid; a store may train part of it (sweep=lite32 trains
the family claims on OH-L2 only, where the paper says "both regularizers and OH or BN"). A PASS there says
nothing of the rest, so the claim reads PARTIAL (cases.partial), naming the configurations not judged.

What a claim was judged on is compared, part by part, with what the same judge reads in the paper grid
(grid.grid_runs): a run part by the configurations behind its cases (Case.configs), so a configuration
its judge never reads (clusters_d32's tau 1 ne) is never missing; a probe, whose cases are curves, by the
models of the scope it probed (configurations with >= 2 seeds that finished or diverged, as the probes count
them). Configurations judged that the paper grid's judgement does not rest on (sweep=lite32 trains its lr
models at k 10, the paper's lr sub-grid has k 6) are named beside the missing ones.
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from analysis.claims.cases import Part
from analysis.claims.scopes import Config, config_of
from analysis.context import scope
from analysis.style import short
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED

SHOWN = 4  # missing configurations listed by name


def judged_on(runs: pd.DataFrame, parts: list[Part], probed: list[tuple]) -> list[set[Config]]:
    """What a judgement rests on: per part, the configurations of its cases (a case not judged leaves its
    claim UNTESTED, never PARTIAL, so it counts here; the paper grid's runs have no history to judge
    ne_val_rises_tau1's cases on, and are counted all the same); then per probed scope (sub-grid, slice),
    the models of `runs` in it."""
    cases = [{c for case in part.cases for c in case.configs} for part in parts]
    return cases + [_models(scope(runs, *where)) for where in probed]


def _models(runs: pd.DataFrame) -> set[Config]:
    seeds: dict[Config, set] = defaultdict(set)
    for _, run in runs[runs[OUTCOME].isin((FINISHED, DIVERGED))].iterrows():
        seeds[config_of(run)].add(run[SEED])
    return {config for config, found in seeds.items() if len(found) >= 2}


def missing(judged: list[set[Config]], in_grid: list[set[Config]], ignored: frozenset = frozenset()) -> str:
    """'' when every configuration the paper grid's judgement rests on was judged (part by part), else what
    was left out, in words. `ignored`: keys not compared (a `_lite` twin is counted at the paper's d, k)."""

    def kept(configs: set[Config]) -> set[Config]:
        return {tuple((k, v) for k, v in c if k not in ignored) for c in configs}

    left_out: set[Config] = set()
    outside: set[Config] = (
        set()
    )  # judged, but not where the paper grid's judgement is (sweep=lite32's lr at k 10)
    for mine, grid in zip(judged, in_grid):
        left_out |= kept(grid) - kept(mine)
        if grid:  # a probe's part: the paper grid's runs have no probe rows, its models are compared instead
            outside |= kept(mine) - kept(grid)
    if not left_out:
        return ""
    every = set().union(*map(kept, in_grid))
    return (
        f"judged on part of its scope: {len(every - left_out)} of the {len(every)} configurations it holds "
        f"in the paper grid, {_named(left_out, every)}{_outside(outside, every)}"
    )


def _outside(outside: set[Config], every: set[Config]) -> str:
    """', and on 3 configurations outside it (with k=10)': the configurations judged that the paper grid's
    judgement does not rest on, by the values none of its configurations has; '' for none."""
    if not outside:
        return ""
    absent = _absent(outside, every)
    return f", and on {len(outside)} configurations outside it" + (
        f" (with {' or '.join(absent)})" if absent else ""
    )


def _absent(these: set[Config], others: set[Config]) -> list[str]:
    """The values ('k=10', 'BN') that configurations in `these` take and none in `others` has, key by key."""
    keys = [key for key, _ in next(iter(these))]
    return [
        short(key, value)
        for key in keys
        for value in sorted({dict(c)[key] for c in these})
        if value not in {dict(c)[key] for c in others}
    ]


def _named(left_out: set[Config], every: set[Config]) -> str:
    """'none with BN or NE': the values no judged configuration has; else the missing configurations by
    name."""
    absent = _absent(left_out, every - left_out)
    if absent:
        more = f" +{len(absent) - 2 * SHOWN} more" if len(absent) > 2 * SHOWN else ""
        return f"none with {' or '.join(absent[: 2 * SHOWN])}{more}"
    varying = [key for key, _ in next(iter(every)) if len({dict(c)[key] for c in every}) > 1]
    names = sorted("-".join(short(k, dict(c)[k]) for k in varying) for c in left_out)
    more = f" +{len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f"not {', '.join(names[:SHOWN])}{more}"
