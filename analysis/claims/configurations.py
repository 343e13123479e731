"""Per seed and per configuration (pure): the final values a claim reads, and the cases they give.

The value of a seed is its run's final metric, where a diverged run counts as +inf (it beats nothing:
neither Lloyd's nor a lower loss) and an unfinished one not at all; a configuration with fewer than 2 seeds
is left out. A case compares a configuration's seeds with a fixed level (threshold_cases), with the
configuration that differs from it in one key (pair_cases), or the rise of two embeddings' values with k
(rise_cases).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from analysis.claims.cases import Case, compare, gt, iqr, signs
from analysis.claims.scopes import AXES, D32, EMB, EXPERIMENT, Config, D, K, config_of
from analysis.context import scope, varying
from analysis.runs import config_keys
from analysis.style import AXIS_NAMES, short
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED


def seed_values(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Config keys, seed and `value`, the final `metric` of every run that finished or diverged (+inf); a
    repeated (configuration, seed), e.g. a rerun, counts once (its mean)."""
    keys = config_keys(runs.columns)
    ended = runs[runs[OUTCOME].isin((FINISHED, DIVERGED))]
    value = ended[metric].astype(float).where(ended[OUTCOME] == FINISHED, math.inf)
    return ended.assign(value=value).groupby(keys + [SEED], dropna=False)["value"].mean().reset_index()


def with_enough_seeds(per_seed: pd.DataFrame) -> pd.DataFrame:
    """The per-seed rows of the configurations with >= 2 seeds."""
    keys = [k for k in config_keys(per_seed.columns)]
    seeds = (
        per_seed.groupby(keys, dropna=False)[SEED].transform("nunique") if len(per_seed) else per_seed[SEED]
    )
    return per_seed[seeds >= 2]


def summary(
    runs: pd.DataFrame,
    subgrid: str,
    where: dict,
    grid: pd.DataFrame | None,
    has_d32: bool,
    final_n: int | None = None,
) -> str:
    """What the scope holds: configurations with >= 2 seeds (of the paper grid's), those left out, diverged
    and unfinished runs, and the setting they were judged at (`final_n`: the d 32 runs' final values were
    measured at that n); an empty d 32 scope says where d 32 runs come from, or, where the evidence has
    some (`has_d32`), that they leave this scope out."""
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
        elsewhere = D32_CUT if has_d32 else D32_RUNS
        return f"{name}: none, 0{expected} configurations (the `{subgrid}` sub-grid of sweep=paper)" + (
            f"; {elsewhere}" if where.get(D) == 32 else ""
        )
    ended = runs[runs[OUTCOME].isin((FINISHED, DIVERGED))]
    name += f" (judged at {judged_at(ended if len(ended) else runs, final_n)})"
    seeds = ended.groupby(config_keys(runs.columns), dropna=False)[SEED].nunique()
    few = f" ({int((seeds < 2).sum())} with fewer left out)" if (seeds < 2).any() else ""
    diverged, unfinished = int((runs[OUTCOME] == DIVERGED).sum()), len(runs) - len(ended)
    return (
        f"{name}: {int((seeds >= 2).sum())}{expected} configurations with >= 2 seeds{few}; "
        f"diverged {diverged}, unfinished {unfinished} of {len(runs)} runs"
    )


D32_RUNS = (
    "the d 32 runs are sweep=lite32's (`leaner-sweep sweep=lite32`, or `make reproduce-d32` in a clone), "
    "none in this store and experiment"
)
D32_CUT = (
    "the d 32 runs judged here hold none of them (sweep=lite32 cuts some to fit its budget: "
    "conf/sweep/lite32.yaml names them)"
)


def judged_at(runs: pd.DataFrame, final_n: int | None = None) -> str:
    """The runs' setting (`setting`), experiment by experiment where they come from several judged as one:
    'leaner-clustering-lite: d 4, k 6, n 128; leaner-clustering-lite32: d 32, ...'."""
    if EXPERIMENT not in runs or runs[EXPERIMENT].nunique() < 2:
        return setting(runs, final_n)
    return "; ".join(f"{name}: {setting(part, final_n)}" for name, part in runs.groupby(EXPERIMENT))


def setting(runs: pd.DataFrame, final_n: int | None = None) -> str:
    """The d, k and n the runs trained at, e.g. 'd 32, k 10/25, n 128/256'; with `final_n`, and d 32 runs
    among them, where their final values were measured: 'd 32, k 10/25, n 128/256 in training, the d 32
    runs' final values measured at n 512 (eval.d32_n) on fresh tasks from each last checkpoint'."""
    parts = []
    for key, word in ((D, "d"), (K, "k"), ("task.n", "n")):
        if key in runs:
            values = sorted(runs[key].dropna().unique())
            parts.append(f"{word} {'/'.join(f'{v:g}' for v in values)}")
    if final_n is None or not (runs[D] == D32).any():
        return ", ".join(parts)
    return (
        f"{', '.join(parts)} in training, the d {D32} runs' final values measured at n {final_n} "
        "(eval.d32_n) on fresh tasks from each last checkpoint"
    )


def label_keys(frame: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[str]:
    """The config keys that tell the configurations apart (every axis for a single one), but `drop`."""
    configs = frame[config_keys(frame.columns)].drop_duplicates()
    keys = varying(configs) if len(configs) > 1 else [k for k in AXES if k in frame]
    return [k for k in keys if k not in drop]


def config_label(row: pd.Series, keys: list[str]) -> str:
    """A configuration's name in a case: its short values of `keys` (analysis.style.short)."""
    return "-".join(short(k, row[k]) for k in keys) or "all"


def by_configuration(per_seed: pd.DataFrame, keys: list[str]) -> Iterator[tuple[pd.Series, pd.DataFrame]]:
    """(configuration row, per-seed values indexed by seed) per configuration."""
    for _, part in per_seed.groupby(config_keys(per_seed.columns), dropna=False, sort=False):
        yield part.iloc[0], part.set_index(SEED)[keys]


def threshold_cases(
    per_seed: pd.DataFrame, holds: Callable[[float, float], bool], level: float = 1.0
) -> list[Case]:
    """Per configuration: holds(its median - level, 0); the margin is that median - level."""
    keys = label_keys(per_seed)
    return [
        compare(config_label(row, keys), values["value"], level, holds, "{a}", (config_of(row),))
        for row, values in by_configuration(per_seed, ["value"])
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
    keys = label_keys(per_seed[per_seed[key].isin((a, b))], drop=(key,))
    words = f"{short(key, a)} {{a}} vs {short(key, b)} {{b}}"
    return [
        compare(
            config_label(row, keys),
            values["value"],
            right[match],
            holds,
            words,
            (config_of(row), config_of({**row, key: b})),
        )
        for row, values in by_configuration(per_seed[per_seed[key] == a], ["value"])
        if (match := tuple(row[k] for k in others)) in right
    ]


@dataclass
class Rise:
    """Per group of configurations that differ only in embedding and k: each embedding's value at the
    smallest and the largest k both embeddings have, as per-seed rises (seeds with both ends of both
    embeddings: a round of more seeds may reach one k and not the other) and as the rise of the medians."""

    label: str
    ks: tuple[object, object]
    per_seed: dict[str, pd.Series]
    of_medians: dict[str, float]
    configs: tuple[Config, ...]


def rises(per_seed: pd.DataFrame, embeddings: tuple[str, ...]) -> list[Rise]:
    """The Rise of `embeddings` with k in every group that has at least two k for all of them."""
    others = [k for k in config_keys(per_seed.columns) if k not in (EMB, K)]
    keys = [k for k in label_keys(per_seed) if k in others]
    found = []
    for _, part in per_seed.groupby(others, dropna=False):
        by = {e: part[part[EMB] == e].pivot_table(index=SEED, columns=K, values="value") for e in embeddings}
        ks = sorted(set.intersection(*(set(table.columns) for table in by.values())))
        if len(ks) < 2:
            continue
        seeds = by[embeddings[0]].index
        for table in by.values():
            seeds = seeds.intersection(table.index)
        ends = part[part[EMB].isin(embeddings) & part[K].isin((ks[0], ks[-1]))]
        found.append(
            Rise(
                config_label(part.iloc[0], keys),
                (ks[0], ks[-1]),
                {e: (t.loc[seeds, ks[-1]] - t.loc[seeds, ks[0]]).dropna() for e, t in by.items()},
                {e: float(t[ks[-1]].median() - t[ks[0]].median()) for e, t in by.items()},
                tuple(dict.fromkeys(config_of(row) for _, row in ends.iterrows())),
            )
        )
    return found


def _rise_case(rise: Rise, words: str, diffs: pd.Series, claimed: Callable[[float, float], bool]) -> Case:
    margin = float(np.median(diffs)) if len(diffs) else math.nan  # paired, as compare
    counts = signs(diffs.to_numpy(dtype=float), margin)
    return Case(rise.label, words, margin, claimed, iqr(diffs), rise.configs, len(diffs), *counts)


def rise_cases(per_seed: pd.DataFrame, rising: str = "binary", steady: str = "onehot") -> list[Case]:
    """`rising`'s value rises from the smallest to the largest k (both embeddings have) by more than
    `steady`'s (and at all): margin = the median over seeds of rise - max(steady's rise, 0), as compare."""
    cases = []
    for rise in rises(per_seed, (rising, steady)):
        diffs = (rise.per_seed[rising] - rise.per_seed[steady].clip(lower=0.0)).dropna()
        words = (
            f"k {rise.ks[0]}->{rise.ks[1]}: {short(EMB, rising)} {rise.of_medians[rising]:+.3f} "
            f"vs {short(EMB, steady)} {rise.of_medians[steady]:+.3f}"
        )
        cases.append(_rise_case(rise, words, diffs, gt))
    return cases


def k_rise_cases(
    per_seed: pd.DataFrame, embedding: str, claimed: Callable[[float, float], bool], beside: str = "onehot"
) -> list[Case]:
    """`embedding`'s own rise from the smallest to the largest k (those `beside` has too, so that two
    embeddings' cases are read at the same ends): margin = the median over seeds of that rise, judged by
    `claimed` (gt: it rises; le: it does not)."""
    cases = []
    for rise in rises(per_seed, tuple(dict.fromkeys((embedding, beside)))):
        words = f"k {rise.ks[0]}->{rise.ks[1]}: {short(EMB, embedding)} {rise.of_medians[embedding]:+.3f}"
        cases.append(_rise_case(rise, words, rise.per_seed[embedding], claimed))
    return cases


def rises_in_words(per_seed: pd.DataFrame, embeddings: tuple[str, ...]) -> str:
    """'k 6->25: BN +0.120, OH +0.050' per group: rises printed beside a claim, not judged."""
    return "; ".join(
        f"{rise.label} k {rise.ks[0]}->{rise.ks[1]}: "
        + ", ".join(f"{short(EMB, e)} {rise.of_medians[e]:+.3f}" for e in embeddings)
        for rise in rises(per_seed, embeddings)
    )
