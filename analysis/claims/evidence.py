"""The evidence a claim is judged on, one claim's view of it, and the judging of a Record.

Each claim is one Record (analysis.claims.records): its name, the paper's words and where they stand, its
scope (the sub-grid and slice it is about) and its judge. A judge reads the evidence only through a View
limited to the claim's scope, so other runs in a store never change a verdict. The judges are pure
functions of an Evidence (frames and callables), so tests build one from synthetic frames;
analysis.claims.from_context builds it from a store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import pandas as pd

from analysis.claims.cases import (
    FAIL,
    PAPER_STEPS,
    PARTIAL,
    PASS,
    UNTESTED,
    Case,
    Part,
    partial,
    verdict,
)
from analysis.claims.configurations import seed_values, summary, with_enough_seeds
from analysis.claims.coverage import judged_on, missing
from analysis.claims.grid import flat_history, grid_runs
from analysis.claims.scopes import D32, STEPS, Config, D, Scope, config_of
from analysis.context import scope
from analysis.runs import config_keys
from tracking.names import DIVERGED, OUTCOME, SEED, VAL_REL_LLOYD


@dataclass
class Evidence:
    """What the judges read. runs: training runs (an `outcome` column); grid: paper_grid() to count the cases
    the paper grid has (None: no counts); T: the probes' re-applications (the report's eval.steps);
    probe(runs, evaluation) -> (per-seed rows, why missing); history(runs) -> val_rel_lloyd points (run_id,
    step, value); speed: speed_memory rows; blocks: task_dissimilarity's family_blocks; final(runs) -> (the
    same runs with the final metrics of their d 32 ones measured at n final_n, why some are missing)."""

    runs: pd.DataFrame
    grid: pd.DataFrame | None
    T: int
    probe: Callable[[pd.DataFrame, str], tuple[pd.DataFrame, str]] | None = None
    history: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    speed: list[dict] | None = None
    speed_source: str = ""
    blocks: pd.DataFrame | None = None
    final: Callable[[pd.DataFrame], tuple[pd.DataFrame, str]] | None = None
    final_n: int | None = None

    @property
    def has_d32(self) -> bool:
        """Whether any run is at d 32 (sweep=lite32's, or the paper grid's)."""
        return bool(D in self.runs and (self.runs[D] == D32).any())


@dataclass
class View:
    """One claim's access to the evidence: every read is limited to a scope (the claim's own by default), and
    every scope read is summarised once in `notes`."""

    evidence: Evidence
    scope: Scope | None
    notes: list[str] = field(default_factory=list)
    probed: list[Scope] = field(default_factory=list)  # the scopes whose probes it read, in order
    read_diverged: bool = False  # a scope it read holds a diverged run

    @property
    def T(self) -> int:
        return self.evidence.T

    def runs(self, where: Scope | None = None, measured: bool = False) -> pd.DataFrame:
        """The scope's runs, summarised in the notes; `measured`: their final values are read where the
        evidence measures them (Evidence.final), which the summary names."""
        subgrid, slice_ = where or self.scope
        runs = scope(self.evidence.runs, subgrid, slice_)
        at = self.evidence.final_n if measured else None
        note = summary(runs, subgrid, slice_, self.evidence.grid, self.evidence.has_d32, at)
        if note not in self.notes:
            self.notes.append(note)
        self.read_diverged |= bool(OUTCOME in runs and (runs[OUTCOME] == DIVERGED).any())
        return runs

    def finals(self, metric: str, where: Scope | None = None, logged: bool = False) -> pd.DataFrame:
        """Per seed, the final `metric` of the scope's configurations with >= 2 seeds: the d 32 runs' measured
        at n final_n where the evidence measures them (Evidence.final) and not `logged`, else as logged."""
        measured = self.evidence.final is not None and not logged
        runs = self.runs(where, measured)
        if measured:
            runs, missing = self.evidence.final(runs)
            if missing and missing not in self.notes:
                self.notes.append(missing)
        return with_enough_seeds(seed_values(runs, metric))

    def histories(self, where: Scope | None = None) -> pd.DataFrame:
        """Per seed: val_rel_lloyd's `first` evaluation after training began (not the untrained step 0), its
        `lowest` over training, its final `value` (diverged: +inf), all as logged: one curve, at one n."""
        runs = self.runs(where)
        per_seed = self.finals(VAL_REL_LLOYD, where, logged=True)
        if self.evidence.history is None or per_seed.empty:
            return per_seed.assign(first=math.nan, lowest=math.nan)
        points = self.evidence.history(runs).sort_values("step")
        points = points[points["step"] > 0]
        stats = points.groupby("run_id")["value"].agg(first="first", lowest="min")
        keys = config_keys(runs.columns)
        by_seed = runs[keys + [SEED, "run_id"]].merge(stats, left_on="run_id", right_index=True)
        by_seed = by_seed.groupby(keys + [SEED], dropna=False)[["first", "lowest"]].mean().reset_index()
        return per_seed.merge(by_seed, on=keys + [SEED], how="left")

    def probe(self, evaluation: str, where: Scope | None = None) -> pd.DataFrame:
        """Per-seed rows of `evaluation` on the scope's runs; why they are missing goes into the notes."""
        self.probed.append(where or self.scope)
        runs = self.runs(where)
        if self.evidence.probe is None or runs.empty:  # no model in the scope: nothing to evaluate
            return pd.DataFrame(columns=["panel", "series", "method", SEED, "step", "value"])
        rows, missing = self.evidence.probe(runs, evaluation)
        if missing:
            self.notes.append(f"{evaluation} not evaluated: {missing}")
        return rows


@dataclass
class Claim:
    name: str
    status: str  # PASS, PARTIAL, FAIL or UNTESTED
    numbers: str  # what was measured, and what is missing
    paper: str  # the paper's words (docs/science.md section 7.1)
    source: str = ""  # where the words stand in the paper
    marginal: int = 0  # judged cases over seeds whose sign is not settled (cases.LEVEL)
    beyond: bool = False  # a finding beyond the paper: its own heading, not among the paper's claims
    without_diverged: str = ""  # the verdict without the diverged runs, where that differs from `status`
    seeds: str = ""  # the judged cases' seeds, "3" or "3-5"; "" where no case rests on seeds
    cases: int = 0  # judged cases
    firm: int = 0  # judged cases whose sign is settled
    straddles: int = 0  # judged cases over seeds whose IQR of the paired difference straddles zero
    rests_on_marginal: bool = False  # one marginal case turning would change the verdict (rests_on_marginal)
    judged: tuple[tuple[str, Case], ...] = ()  # (part, case) for every case, judged or not, in part order

    def mark(self) -> str:
        """What is printed beside the verdict: how many seeds it rests on, how many of its cases are
        marginal and how many have an IQR that straddles zero, whether the verdict rests on a marginal one
        (OH had numerical issues in 3 of the paper's 10 trials at d 32, tau 0.1, k 25, so a verdict on 3
        seeds can turn on which were drawn), and the verdict it rests on diverged runs for."""
        marks = []
        if self.seeds:
            firmness = (
                f"{self.marginal} of {self.cases} cases marginal" if self.marginal else "every case firm"
            )
            straddles = f", {self.straddles} whose IQR straddles zero" if self.straddles else ""
            rests = ", the verdict rests on a marginal case" if self.rests_on_marginal else ""
            marks.append(f"{self.seeds} seeds, {firmness}{straddles}{rests}")
        if self.without_diverged:
            marks.append(f"{self.without_diverged} without its diverged runs")
        return f" ({', '.join(marks)})" if marks else ""


@dataclass(frozen=True)
class Record:
    """One claim: what the paper says, where, the runs it is about, and its judge (a View -> its parts)."""

    name: str
    paper: str
    source: str
    scope: Scope | None  # None: judged on a benchmark or on sampled tasks, not on runs
    judge: Callable[[View], list[Part]]
    beyond: bool = False
    # Slice values its scope takes in the paper grid when they differ from its own: a `_lite` twin's scope is
    # counted at the paper's d and k, where the grid holds the statement's configurations.
    counted_at: dict = field(default_factory=dict)

    def counted(self) -> Scope:
        """Its scope as counted in the paper grid."""
        subgrid, where = self.scope
        return subgrid, {**where, **self.counted_at}


def judge(record: Record, evidence: Evidence) -> Claim:
    """A claim's verdict on the evidence. With evidence.grid the same judge also reads the paper grid's
    configurations in the claim's scope: each part says how many cases the grid has (not for probe parts: the
    grid has no curves), and a PASS on part of them reads PARTIAL, naming what is missing (coverage)."""
    view = View(evidence, record.scope)
    parts = record.judge(view)
    short_of_paper(record, evidence, parts)
    grid = in_paper_grid(record, evidence)
    if grid is not None:
        for part, counted in zip(parts, grid[1]):
            part.expected = None if grid[0].probed else len(counted.cases)
    left_out = _left_out(record, view, parts, grid)
    status = partial(verdict(parts), left_out)
    alone = without_diverged(record, evidence, parts, grid) if view.read_diverged else status
    scoped = [left_out] if left_out and status != UNTESTED else []
    numbers = "; ".join([*view.notes, *scoped, *(part.describe() for part in parts)])
    judged = [c for part in parts for c in part.cases if c.judged]
    every = tuple((part.what, c) for part in parts for c in part.cases)
    return Claim(
        record.name,
        status,
        numbers,
        record.paper,
        record.source,
        marginal=sum(c.marginal for c in judged),
        beyond=record.beyond,
        without_diverged="" if alone == status else alone,
        seeds=_seeds(judged),
        cases=len(judged),
        firm=sum(c.firm for c in judged),
        straddles=sum(c.straddles for c in judged),
        rests_on_marginal=rests_on_marginal(status, judged),
        judged=every,
    )


def short_of_paper(record: Record, evidence: Evidence, parts: list[Part]) -> None:
    """Each case learns the training steps of its runs (those of the claim's sub-grid with its
    configurations) that trained fewer than the paper's, so its row says so (docs/science.md section 7.1)."""
    if record.scope is None or STEPS not in evidence.runs:
        return
    runs = scope(evidence.runs, record.scope[0], {})
    short = runs[runs[STEPS].astype(float) < PAPER_STEPS]
    if short.empty:
        return
    steps_of: dict[Config, set[int]] = {}
    for _, row in short.iterrows():
        steps_of.setdefault(config_of(row), set()).add(int(row[STEPS]))
    for case in (c for part in parts for c in part.cases):
        found = set().union(*(steps_of.get(config, set()) for config in case.configs))
        case.short_steps = tuple(sorted(found))


def rests_on_marginal(status: str, judged: list[Case]) -> bool:
    """Whether one marginal case turning would change the verdict: a FAIL whose every failing case is
    marginal, or a PASS (PARTIAL) with a marginal case among those that hold (one that fails FAILs it)."""
    if status == FAIL:
        return all(c.marginal for c in judged if c.fails)
    return status in (PASS, PARTIAL) and any(c.marginal for c in judged)


def _seeds(cases: list[Case]) -> str:
    """How many seeds the cases rest on: '3', or '2-3' where they differ; '' without seeds."""
    counts = sorted({c.seeds for c in cases if c.seeds})
    return "" if not counts else str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def in_paper_grid(record: Record, evidence: Evidence) -> tuple[View, list[Part]] | None:
    """The claim's judge on two seeds of every paper-grid configuration (grid.grid_runs) in its counted
    scope: its view and parts; None without a grid or a scope."""
    if evidence.grid is None or record.scope is None:
        return None
    full = View(Evidence(grid_runs(evidence.grid), None, evidence.T, history=flat_history), record.counted())
    return full, record.judge(full)


def _left_out(record: Record, view: View, parts: list[Part], grid: tuple[View, list[Part]] | None) -> str:
    """What of the claim's scope in the paper grid its cases leave out, in words ('' for none)."""
    if grid is None:
        return ""
    judged = judged_on(view.evidence.runs, parts, view.probed)
    in_grid = judged_on(grid[0].evidence.runs, grid[1], grid[0].probed)
    return missing(judged, in_grid, frozenset(record.counted_at))


def without_diverged(
    record: Record, evidence: Evidence, parts: list[Part], grid: tuple[View, list[Part]] | None = None
) -> str:
    """The verdict on the evidence less its diverged runs (PARTIAL where that PASS rests on part of the
    scope); each of `parts` (the judge's on all of it) whose own verdict that changes notes the other
    (Part.without_diverged). A diverged run counts as +inf, which beats nothing: a verdict that rests on that
    says so beside itself."""
    kept = replace(evidence, runs=evidence.runs[evidence.runs[OUTCOME] != DIVERGED], grid=None)
    view = View(kept, record.scope)
    rejudged = record.judge(view)
    for part, other in zip(parts, rejudged):
        if verdict([other]) != verdict([part]):
            part.without_diverged = verdict([other])
    return partial(verdict(rejudged), _left_out(record, view, rejudged, grid))
