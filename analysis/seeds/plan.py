"""The rounds' plan (pure): which marginal cases more seeds could settle, and which configurations train which
of the paper's seeds next, within a budget of model-steps.

A marginal case (analysis.claims.cases) is settleable when, were every further seed to agree with its
margin's sign, the sign test would reach its level within the paper's seeds: `need` is the seeds that takes.
A round brings the configurations behind settleable cases to the same first `target` seeds of the paper's
ten, `target` the smallest need among them: one seeds list serves the whole round, as a sweep has one
(conf/sweep/*.yaml), and a configuration never trains a seed it has. Cases whose claim's verdict rests on
a marginal case go first, then the cheaper; a case whose seeds do not fit what is left of the budget waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from analysis.claims.cases import LEVEL, Case, sign_p

# A configuration of the base sweep as its overrides, sorted: config.grid.Configuration's, hashable.
Key = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class Wanted:
    """A marginal case, the configurations its values come from, and the seeds settling it needs."""

    claim: str
    label: str  # 'part: case'
    configurations: tuple[Key, ...]
    need: int | None  # seeds at which agreeing further seeds make it firm; None: not within the paper's
    rests: bool  # its claim's verdict rests on a marginal case


@dataclass(frozen=True)
class Round:
    """One round: the chosen configurations train the paper's first `target` seeds they lack."""

    target: int
    configurations: tuple[Key, ...]
    models: int  # (configuration, seed) pairs to train
    steps: int  # their model-steps
    cases: tuple[str, ...]  # 'claim: part: case' of the cases it adds seeds for


def need(case: Case, most: int) -> int | None:
    """The fewest seeds at which `case` is firm if every seed added agrees with its margin's sign; None when
    even the paper's `most` seeds would not do. A margin of zero has no sign yet: half its seeds count as
    agreeing either way."""
    agree = case.agree if case.margin != 0 else case.untied // 2
    for added in range(most - case.seeds + 1):
        if sign_p(agree + added, case.untied + added) <= LEVEL:
            return case.seeds + added
    return None


def plan_round(
    wanted: list[Wanted],
    ended: Callable[[Key], set[int]],
    paper: tuple[int, ...],
    steps_of: Callable[[Key], int],
    left: int,
) -> tuple[Round | None, str]:
    """The next round, or None and why there is none. `ended(c)`: the seeds configuration c has a run with
    an outcome for; `steps_of(c)`: its train.steps; `left`: the budget's model-steps left."""
    settleable = [w for w in wanted if w.need is not None and w.configurations]
    if not wanted:
        return None, "every case over seeds is firm"
    if not settleable:
        return None, "no marginal case more of the paper's seeds could settle"
    if left <= 0:
        return None, "the budget is spent"
    target = min(w.need for w in settleable)
    seeds = set(paper[:target])
    ordered = sorted(
        settleable, key=lambda w: (not w.rests, _cost(w, seeds, ended, steps_of), w.claim, w.label)
    )
    chosen: dict[Key, int] = {}  # configuration -> the model-steps of its missing seeds
    cases = []
    for w in ordered:
        extra = {c: len(seeds - ended(c)) * steps_of(c) for c in w.configurations if c not in chosen}
        if sum(chosen.values()) + sum(extra.values()) <= left:
            chosen.update(extra)
            cases.append(f"{w.claim}: {w.label}")
    chosen = {c: s for c, s in chosen.items() if s}
    if not chosen:
        return None, f"no case's next seeds are left to train within the budget's {left:,} model-steps left"
    models = sum(len(seeds - ended(c)) for c in chosen)
    return Round(target, tuple(chosen), models, sum(chosen.values()), tuple(cases)), ""


def _cost(w: Wanted, seeds: set[int], ended: Callable[[Key], set[int]], steps_of) -> int:
    return sum(len(seeds - ended(c)) * steps_of(c) for c in w.configurations)
