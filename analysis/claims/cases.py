"""Cases, parts and verdicts: how a claim's comparisons decide it.

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
(analysis.claims.coverage): a claim judged on part of its scope never reads PASS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from analysis.claims.scopes import Config
from config.defaults import default

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
    # The training steps of its runs where fewer than the paper's (evidence.short_of_paper): said in its row.
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
