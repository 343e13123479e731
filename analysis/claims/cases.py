"""Cases, parts and verdicts: how a claim's comparisons decide it.

A case compares a model with its reference seed by seed: its margin is the median over seeds of the paired
difference (model minus reference), and the case holds when that margin has the claimed sign. A case holds
by nothing else, so a verdict is always the sign of the margin printed beside it; a case without a margin
(no seed with a value on both sides) is not judged, neither holding nor failing. The seeds' IQR of the
difference is printed too; a case whose IQR straddles zero is *marginal*, which informs and never changes a
verdict. A part is one condition of a claim over its cases; one failing case makes the claim FAIL, else a
part without cases or a case not judged makes it UNTESTED (never PASS on zero cases), else PASS, which
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

PASS, PARTIAL, FAIL, UNTESTED = "PASS", "PARTIAL", "FAIL", "UNTESTED"
STATUSES = (PASS, PARTIAL, FAIL, UNTESTED)  # the order counts are printed in
SHOWN = 4  # cases printed per part and outcome


@dataclass
class Case:
    """One comparison: `measured` in words, the margin (the median over seeds of the paired difference model
    minus reference; NaN: not judged), the sign it is claimed to have (`claimed(margin, 0)`: lt, gt, ge),
    the seeds' IQR of that difference and how many seeds it rests on (0: one measurement, no seeds), and
    the configurations its values come from (scopes.config_of; none for a probe's or a benchmark's case),
    which tell whether a claim was judged on all of its scope."""

    label: str
    measured: str
    margin: float
    claimed: Callable[[float, float], bool]
    iqr: tuple[float, float] = (math.nan, math.nan)
    configs: tuple[Config, ...] = ()
    seeds: int = 0

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
    def marginal(self) -> bool:
        return bool(self.iqr[0] < 0 < self.iqr[1])

    def describe(self) -> str:
        if not self.judged:
            return f"{self.label} {self.measured} (no seed with a value on both sides)"
        if math.isnan(self.iqr[0]) and math.isnan(self.iqr[1]):  # one measurement, no seeds to spread over
            return f"{self.label} {self.measured} (margin {signed(self.margin)})"
        mark = ", marginal" if self.marginal else ""
        return (
            f"{self.label} {self.measured} (margin {signed(self.margin)}, "
            f"IQR [{signed(self.iqr[0])}, {signed(self.iqr[1])}]{mark})"
        )


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
    diffs = np.asarray(diffs, dtype=float)
    if not len(diffs):
        return math.nan, math.nan
    with np.errstate(invalid="ignore"):  # a quartile between two infinities is NaN: no band, never marginal
        q25, q75 = np.percentile(diffs, [25, 75])
    return float(q25), float(q75)


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
    return Case(label, words.format(a=fmt(a), b=fmt(b)), margin, holds, iqr(diffs), configs, len(diffs))


# The claimed signs a case is judged on: holds(margin, 0).


def lt(a: float, b: float) -> bool:
    return a < b


def gt(a: float, b: float) -> bool:
    return a > b


def ge(a: float, b: float) -> bool:
    return a >= b
