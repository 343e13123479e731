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

from analysis.claims.cases import Part, verdict
from analysis.claims.configurations import seed_values, summary, with_enough_seeds
from analysis.claims.grid import flat_history, grid_runs
from analysis.claims.scopes import Scope
from analysis.context import scope
from analysis.runs import config_keys
from tracking.names import DIVERGED, OUTCOME, SEED, VAL_REL_LLOYD


@dataclass
class Evidence:
    """What the judges read. runs: training runs (an `outcome` column); grid: paper_grid() to count the cases
    the paper grid has (None: no counts); T: the probes' re-applications (the report's eval.steps);
    probe(runs, evaluation) -> (per-seed rows, why missing); history(runs) -> val_rel_lloyd points (run_id,
    step, value); speed: speed_memory rows; blocks: task_dissimilarity's family_blocks."""

    runs: pd.DataFrame
    grid: pd.DataFrame | None
    T: int
    probe: Callable[[pd.DataFrame, str], tuple[pd.DataFrame, str]] | None = None
    history: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    speed: list[dict] | None = None
    speed_source: str = ""
    blocks: pd.DataFrame | None = None


@dataclass
class View:
    """One claim's access to the evidence: every read is limited to a scope (the claim's own by default), and
    every scope read is summarised once in `notes`."""

    evidence: Evidence
    scope: Scope | None
    notes: list[str] = field(default_factory=list)
    probed: bool = False  # it read a probe (whose cases the paper grid cannot count)
    read_diverged: bool = False  # a scope it read holds a diverged run

    @property
    def T(self) -> int:
        return self.evidence.T

    def runs(self, where: Scope | None = None) -> pd.DataFrame:
        subgrid, slice_ = where or self.scope
        runs = scope(self.evidence.runs, subgrid, slice_)
        note = summary(runs, subgrid, slice_, self.evidence.grid)
        if note not in self.notes:
            self.notes.append(note)
        self.read_diverged |= bool(OUTCOME in runs and (runs[OUTCOME] == DIVERGED).any())
        return runs

    def finals(self, metric: str, where: Scope | None = None) -> pd.DataFrame:
        """Per seed, the final `metric` of the scope's configurations with >= 2 seeds."""
        return with_enough_seeds(seed_values(self.runs(where), metric))

    def histories(self, where: Scope | None = None) -> pd.DataFrame:
        """Per seed: val_rel_lloyd's `first` evaluation after training began (not the untrained step 0), its
        `lowest` over training, its final `value` (diverged: +inf)."""
        runs = self.runs(where)
        per_seed = self.finals(VAL_REL_LLOYD, where)
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
        self.probed = True
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
    status: str  # PASS, FAIL or UNTESTED
    numbers: str  # what was measured, and what is missing
    paper: str  # the paper's words (docs/science.md section 7.1)
    source: str = ""  # where the words stand in the paper
    marginal: int = 0  # cases whose seeds' IQR of the margin straddles zero
    beyond: bool = False  # a finding beyond the paper: its own heading, not among the paper's claims
    without_diverged: str = ""  # the verdict without the diverged runs, where that differs from `status`

    def mark(self) -> str:
        """What is printed beside the verdict: the marginal cases, and the verdict it rests on diverged runs
        for."""
        marks = [f"{self.marginal} marginal"] if self.marginal else []
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


def judge(record: Record, evidence: Evidence) -> Claim:
    """A claim's verdict on the evidence; with evidence.grid, each part also says how many cases the paper
    grid has (not for probe parts: the grid has no curves; not beyond the paper: the grid has none)."""
    view = View(evidence, record.scope)
    parts = record.judge(view)
    if evidence.grid is not None and record.scope is not None and not record.beyond:
        full = View(Evidence(grid_runs(evidence.grid), None, evidence.T, history=flat_history), record.scope)
        for part, counted in zip(parts, record.judge(full)):
            part.expected = None if full.probed else len(counted.cases)
    status = verdict(parts)
    alone = without_diverged(record, evidence, parts) if view.read_diverged else status
    numbers = "; ".join([*view.notes, *(part.describe() for part in parts)])
    marginal = sum(c.marginal for part in parts for c in part.cases)
    return Claim(
        record.name,
        status,
        numbers,
        record.paper,
        record.source,
        marginal,
        record.beyond,
        "" if alone == status else alone,
    )


def without_diverged(record: Record, evidence: Evidence, parts: list[Part]) -> str:
    """The verdict on the evidence less its diverged runs; each of `parts` (the judge's on all of it) whose
    own verdict that changes notes the other (Part.without_diverged). A diverged run counts as +inf, which
    beats nothing: a verdict that rests on that says so beside itself."""
    kept = replace(evidence, runs=evidence.runs[evidence.runs[OUTCOME] != DIVERGED], grid=None)
    rejudged = record.judge(View(kept, record.scope))
    for part, other in zip(parts, rejudged):
        if verdict([other]) != verdict([part]):
            part.without_diverged = verdict([other])
    return verdict(rejudged)
