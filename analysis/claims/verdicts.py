"""A claim's verdict (`judge`): its judge's parts on a View of its scope, read against the paper grid and
without the diverged runs.

One failing case makes the claim FAIL, else a part without cases, or a case without a margin (no seed on
both sides: not judged), makes it UNTESTED (never PASS on zero cases), else PASS (cases.verdict); a PASS
whose cases leave out configurations the paper grid holds in its scope reads PARTIAL, naming them (never PASS
on part of its scope).

What a claim was judged on is compared, part by part, with what the same judge reads in the paper grid
(grid_runs: two seeds of each of its configurations): a run part by the configurations behind its cases
(Case.configs), so a configuration its judge never reads (clusters_d32's tau 1 ne) is never missing; a probe,
whose cases are curves, by the models of the scope it probed (configurations with >= 2 seeds that finished
or diverged, as the probes count them). A store may train part of a scope (sweep=lite32 trains the family
claims on OH-L2 only, where the paper says "both regularizers and OH or BN"); configurations judged that the
paper grid's judgement does not rest on (sweep=lite32 trains its lr models at k 10, the paper's lr sub-grid
has k 6) are named beside the missing ones.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pandas as pd

from analysis.claims.cases import FAIL, PAPER_STEPS, PARTIAL, PASS, UNTESTED, Case, Part, partial, verdict
from analysis.claims.evidence import Evidence, View, evidence_of
from analysis.claims.records import CLAIMS, Record
from analysis.claims.scopes import STEPS, Config, config_of
from analysis.claims.table import Claim
from analysis.context import Context, scope
from analysis.plot import Figure
from analysis.style import short
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED, TRAIN_LOSS, VAL_REL_LLOYD

NAMED = 4  # missing configurations listed by name


def check(ctx: Context, drawn: dict[str, Figure] | None = None) -> list[Claim]:
    """Every claim of docs/science.md section 7.1 against what was read of one experiment, in order, then the
    ones beyond it; `drawn`: the figures the report drew, whose data the claims reuse (evidence_of)."""
    found = evidence_of([ctx], drawn)
    return [judge(record, found) for record in CLAIMS]


def judge(record: Record, evidence: Evidence) -> Claim:
    """A claim's verdict on the evidence. With evidence.grid the same judge also reads the paper grid's
    configurations in the claim's scope: each part says how many cases the grid has (not for probe parts: the
    grid has no curves), and a PASS on part of them reads PARTIAL, naming what is missing (`missing`)."""
    view = View(evidence, record.scope)
    parts = record.judge(view)
    grid = in_paper_grid(record, evidence)
    if grid is not None:
        for part, counted in zip(parts, grid[1]):
            part.expected = None if grid[0].probed else len(counted.cases)
    left_out = _left_out(record, view, parts, grid)
    status = partial(verdict(parts), left_out)
    alone = without_diverged(record, evidence, parts, grid) if view.read_diverged else status
    short_of_paper(record, evidence, parts)
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
    """The claim's judge on two seeds of every paper-grid configuration (grid_runs) in its counted
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


# ---- what of its scope a claim was judged on ----


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
        more = f" +{len(absent) - 2 * NAMED} more" if len(absent) > 2 * NAMED else ""
        return f"none with {' or '.join(absent[: 2 * NAMED])}{more}"
    varying = [key for key, _ in next(iter(every)) if len({dict(c)[key] for c in every}) > 1]
    names = sorted("-".join(short(k, dict(c)[k]) for k in varying) for c in left_out)
    more = f" +{len(names) - NAMED} more" if len(names) > NAMED else ""
    return f"not {', '.join(names[:NAMED])}{more}"


def grid_runs(grid: pd.DataFrame) -> pd.DataFrame:
    """Two finished seeds of every grid configuration, every metric 0: a judge counts the grid's cases."""
    seeds = [
        grid.assign(**{SEED: s, OUTCOME: FINISHED, "run_id": [f"g{s}-{i}" for i in range(len(grid))]})
        for s in (1, 2)
    ]
    return pd.concat(seeds, ignore_index=True).assign(**{TRAIN_LOSS: 0.0, VAL_REL_LLOYD: 0.0})


def flat_history(runs: pd.DataFrame) -> pd.DataFrame:
    """One val_rel_lloyd point per run (step 0, value 0): the history grid_runs' runs have."""
    return pd.DataFrame({"run_id": runs["run_id"], "step": 0, "value": 0.0})
