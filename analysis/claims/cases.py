"""What a judge states: cases, parts of cases, and the verdict they give; the cases made from final values per
seed and from a probe's rows.

A case compares a model with its reference seed by seed: its margin is the median over seeds of the paired
difference (model minus reference), and the case holds when that margin has the claimed sign. A case holds
by nothing else, so a verdict is always the sign of the margin printed beside it; a case without a margin
(no seed with a value on both sides) is not judged, neither holding nor failing. The seeds' IQR of the
difference is printed too, marked where it straddles zero (one seed more could move the margin across it).
A case over seeds is *firm* when the sign of its margin is settled, else
*marginal*: firm when a one-sided exact sign test of its paired differences, in the direction of its margin,
reaches LEVEL (docs/science.md section 7.2: at least 5 seeds, all agreeing); firmness informs and never
changes a verdict. A part is one condition of a claim over its cases; one failing case makes the claim FAIL,
else a part without cases or a case not judged makes it UNTESTED (never PASS on zero cases), else PASS, which
reads PARTIAL where the claim's cases leave out configurations its scope holds in the paper grid
(analysis.claims.verdicts): a claim judged on part of its scope never reads PASS.

From final values per seed (View.finals), a case compares a configuration's seeds with a fixed level
(threshold_cases), with the configuration that differs from it in one key (pair_cases), or the rise of two
embeddings' values with k (rise_cases). From a probe's rows (View.probe: per seed, the mean log objective
after `step` iterations, on fresh tasks), it compares the models' median over seeds with Lloyd's after the
same T steps (vs_lloyd), or with their own after one (vs_step1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from analysis.claims.scopes import AXES, EMB, Config, K, config_of
from analysis.context import config_keys, varying
from analysis.style import LLOYD, label, short
from config.defaults import default
from tracking.names import SEED

PASS, PARTIAL, FAIL, UNTESTED = "PASS", "PARTIAL", "FAIL", "UNTESTED"
PAPER_STEPS: int = default("train.steps")  # the paper's 10,000 training steps (conf/train/paper.yaml)
STATUSES = (PASS, PARTIAL, FAIL, UNTESTED)  # the order counts are printed in
SHOWN = 4  # cases printed per part and outcome
# The firmness rule's level (docs/science.md section 7.2), fixed before any run it judges: a case is firm when
# seeds whose paired differences had median zero would agree this often in the margin's direction at most
# this often.
LEVEL = 0.05


@dataclass
class Case:
    """One comparison: `measured` in words, the margin (the median over seeds of the paired difference model
    minus reference; NaN: not judged), the sign it is claimed to have (`claimed(margin, 0)`: lt, gt, ge, le),
    the seeds' IQR of that difference and how many seeds it rests on (0: one measurement, no seeds), of them
    how many differ from the reference (`untied`) and how many of those on the margin's side (`agree`): the
    sign test's counts; and the configurations its values come from (scopes.config_of; a probe's models'
    configurations, where its rows name them; none for a benchmark's case), which tell whether a claim was
    judged on all of its scope and which configurations more seeds would go to (analysis.seeds)."""

    label: str
    measured: str
    margin: float
    claimed: Callable[[float, float], bool]
    iqr: tuple[float, float] = (math.nan, math.nan)
    configs: tuple[Config, ...] = ()
    seeds: int = 0
    agree: int = 0
    untied: int = 0
    # The training steps of its runs where fewer than the paper's (verdicts.short_of_paper): said in its row.
    short_steps: tuple[int, ...] = ()

    @property
    def judged(self) -> bool:
        return not math.isnan(self.margin)

    @property
    def holds(self) -> bool:
        return self.judged and bool(self.claimed(self.margin, 0.0))

    @property
    def fails(self) -> bool:
        return self.judged and not self.holds

    @property
    def p(self) -> float:
        """The one-sided exact sign test's p in the margin's direction: 1 for a margin of zero."""
        return sign_p(self.agree, self.untied) if self.margin != 0 else 1.0

    @property
    def firm(self) -> bool:
        return self.judged and self.seeds > 0 and self.p <= LEVEL

    @property
    def marginal(self) -> bool:
        """Judged over seeds, its sign not settled; a case of one measurement (no seeds) is neither."""
        return self.judged and self.seeds > 0 and not self.firm

    @property
    def straddles(self) -> bool:
        """The seeds' IQR of the paired difference reaches both sides of zero: the mark docs/science.md
        section 7.1 prints beside the firmness (a band from 0 to a positive value does not straddle)."""
        lo, hi = self.iqr
        return self.judged and self.seeds > 0 and lo < 0 < hi

    @property
    def steps_said(self) -> str:
        """', trained 4,000 steps of the paper's 10,000' where its runs trained fewer, else ''."""
        if not self.short_steps:
            return ""
        return (
            f", trained {'/'.join(f'{s:,}' for s in self.short_steps)} steps of the paper's {PAPER_STEPS:,}"
        )

    def describe(self) -> str:
        if not self.judged:
            return f"{self.label} {self.measured} (no seed with a value on both sides{self.steps_said})"
        if math.isnan(self.iqr[0]) and math.isnan(self.iqr[1]):  # one measurement, no seeds to spread over
            return f"{self.label} {self.measured} (margin {signed(self.margin)}{self.steps_said})"
        return (
            f"{self.label} {self.measured} (margin {signed(self.margin)}, "
            f"IQR [{signed(self.iqr[0])}, {signed(self.iqr[1])}], {self.firmness()}{self.steps_said})"
        )

    def firmness(self) -> str:
        """'4 of 5 seeds agree, marginal, IQR straddles zero': the sign test's counts and its outcome, and
        whether the seeds' IQR straddles zero."""
        straddles = ", IQR straddles zero" if self.straddles else ""
        return f"{self.agree} of {self.seeds} seeds agree, {'firm' if self.firm else 'marginal'}{straddles}"


@dataclass
class Part:
    """One condition of a claim over its cases; `expected`: how many cases the paper grid has."""

    what: str
    cases: list[Case]
    expected: int | None = None
    without_diverged: str = ""  # the part's verdict without the diverged runs, where that differs

    def describe(self) -> str:
        of = f" of {self.expected} in the paper grid" if self.expected is not None else ""
        rests = (
            f" [rests on diverged runs: {self.without_diverged} without them]"
            if self.without_diverged
            else ""
        )
        if not self.cases:
            return f"{self.what}: untested, no case{of}{rests}"
        shown = []
        for word, chosen in (
            ("fails", [c for c in self.cases if c.fails]),
            ("holds", [c for c in self.cases if c.holds]),
            ("not judged", [c for c in self.cases if not c.judged]),
        ):
            items = [
                c.describe() for c in sorted(chosen, key=lambda c: not c.marginal)
            ]  # marginal ones first
            if items:
                more = f" +{len(items) - SHOWN} more" if len(items) > SHOWN else ""
                shown.append(f"{word}: {', '.join(items[:SHOWN])}{more}")
        held = sum(c.holds for c in self.cases)
        return f"{self.what}: {held}/{len(self.cases)} cases{of}{rests} ({'; '.join(shown)})"


def partial(status: str, missing: str) -> str:
    """A PASS on part of the claim's scope (`missing` names the rest) reads PARTIAL; other verdicts stand: a
    counterexample FAILs the claim however much of its scope was judged."""
    return PARTIAL if status == PASS and missing else status


def verdict(parts: list[Part]) -> str:
    """FAIL on any failing case (a counterexample decides); else UNTESTED if a part has no case or a case is
    not judged; else PASS."""
    cases = [c for part in parts for c in part.cases]
    if any(c.fails for c in cases):
        return FAIL
    tested = parts and all(part.cases for part in parts) and all(c.judged for c in cases)
    return PASS if tested else UNTESTED


def fmt(value: float) -> str:
    return "diverged" if value == math.inf else f"{value:.3f}"


def signed(value: float) -> str:
    return "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:+.3f}"


def iqr(diffs: np.ndarray) -> tuple[float, float]:
    """The 25th and 75th percentiles of the seeds' paired differences; NaN, NaN without any."""
    diffs = np.sort(np.asarray(diffs, dtype=float))
    if not len(diffs):
        return math.nan, math.nan
    return _percentile(diffs, 0.25), _percentile(diffs, 0.75)


def _percentile(ordered: np.ndarray, q: float) -> float:
    """numpy's default (linear) percentile of sorted values, where a diverged run's +inf stays +inf: numpy
    interpolates as b - (b - a)(1 - t) above the midpoint, NaN for a finite a and an infinite b."""
    at = (len(ordered) - 1) * q
    a, b = float(ordered[math.floor(at)]), float(ordered[math.ceil(at)])
    return a if a == b else a + (b - a) * (at - math.floor(at))


def sign_p(agree: int, untied: int) -> float:
    """P(at least `agree` of `untied` fair coins land on one side): the one-sided exact sign test (ties,
    differences of zero, left out); 1 without untied differences."""
    return sum(math.comb(untied, i) for i in range(agree, untied + 1)) / 2**untied if untied else 1.0


def signs(diffs: np.ndarray, margin: float) -> tuple[int, int]:
    """(differences on the margin's side, differences not zero): the sign test's counts."""
    diffs = np.asarray(diffs, dtype=float)
    side = np.sign(margin) if not math.isnan(margin) else 0.0
    return int((np.sign(diffs) == side).sum()) if side else 0, int((diffs != 0).sum())


def _median(values: pd.Series) -> float:
    return float(np.median(values.to_numpy(dtype=float)))


def _margin(a: float, b: float) -> float:
    """a - b, where two diverged values (+inf) are equal: neither beats the other."""
    return 0.0 if a == b == math.inf else a - b


def compare(
    label: str,
    model: pd.Series,
    reference: pd.Series | float,
    holds: Callable[[float, float], bool],
    words: str,
    configs: tuple[Config, ...] = (),
) -> Case:
    """A case from per-seed values (indexed by seed), judged on the paired differences: holds(m, 0) for m the
    median over seeds of model - reference (seeds both sides have; every seed for a fixed reference), the
    margin printed; not judged without such a seed. `words` shows the two medians ({a}, {b}); they inform,
    the margin decides; `configs`: the configurations the values come from."""
    a = _median(model)
    if isinstance(reference, pd.Series):
        b, common = _median(reference), model.index.intersection(reference.index)
        diffs = np.array([_margin(model[s], reference[s]) for s in common], dtype=float)
    else:
        b = float(reference)
        diffs = np.array([_margin(v, b) for v in model], dtype=float)
    margin = float(np.median(diffs)) if len(diffs) else math.nan
    words = words.format(a=fmt(a), b=fmt(b))
    return Case(label, words, margin, holds, iqr(diffs), configs, len(diffs), *signs(diffs, margin))


# The claimed signs a case is judged on: holds(margin, 0).


def lt(a: float, b: float) -> bool:
    return a < b


def gt(a: float, b: float) -> bool:
    return a > b


def ge(a: float, b: float) -> bool:
    return a >= b


def le(a: float, b: float) -> bool:
    return a <= b


# ---- cases from final values per seed and configuration ----


def label_keys(frame: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[str]:
    """The config keys that tell the configurations apart (every axis for a single one), but `drop`."""
    configs = frame[config_keys(frame.columns)].drop_duplicates()
    keys = varying(configs) if len(configs) > 1 else [k for k in AXES if k in frame]
    return [k for k in keys if k not in drop]


def config_label(row: pd.Series, keys: list[str]) -> str:
    """A configuration's name in a case: its values of `keys`, as a series is labelled (analysis.style)."""
    return label({k: row[k] for k in keys}) or "all"


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


# ---- cases from a probe's rows: models against Lloyd's iterations, or against their own t=1 ----


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
