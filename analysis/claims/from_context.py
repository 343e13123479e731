"""The claims' evidence from what was read of a store (a Context of plain frames, analysis.read): its runs,
their probes' evaluations, the d 32 runs' final values measured at the paper's n, val_rel_lloyd's histories,
the speed_memory benchmark and the sampled tasks' dissimilarity; every claim checked against it. `reads` names
the evaluations to read first; nothing here opens the store.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import pandas as pd

from analysis.checkpoint_eval import FINAL_METRICS, LLOYD_METHOD
from analysis.claims.evidence import Claim, Evidence, judge
from analysis.claims.grid import paper_grid
from analysis.claims.records import CLAIMS
from analysis.claims.scopes import D32, EMB, EXPERIMENT, D, config_of
from analysis.context import (
    Context,
    Want,
    count_once,
    evaluation_rows,
    evaluations_of,
    scope,
    series_labels,
    varying,
)
from analysis.eval_figures import PROBES, dissimilarity
from analysis.plot import Figure, MissingInput
from analysis.style import LLOYD
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED, VAL_REL_LLOYD

# Per probe: the column of its evaluation table that names a panel, and the iterations the claims read.
PANELS = {"multistep": "init", "length": "n", "mixture_shift": "shift", "family_transfer": "test_family"}
METHODS = {"multistep": ("reembed", "naive")}


def reads(ctx: Context) -> list[Want]:
    """The evaluations the claims read: each probe's of every finished model its figure draws (PROBES: a probe
    claim's scope is a part of those), and with eval.d32_n the final values at that n of the finished d 32
    runs in any claim's scope."""
    probes = [want for name in PANELS for want in evaluations_of(name, scope(ctx.runs, *PROBES[name]))]
    n = ctx.settings.d32_n
    if n is None:
        return probes
    scoped = pd.concat([scope(ctx.runs, *record.scope) for record in CLAIMS if record.scope is not None])
    d32 = scoped[(scoped[D] == D32) & (scoped[OUTCOME] == FINISHED)] if D in scoped else scoped[:0]
    return probes + [("final", run_id, n) for run_id in dict.fromkeys(d32["run_id"])]


def probe_rows(ctx: Context, runs: pd.DataFrame, evaluation: str) -> pd.DataFrame:
    """Per-seed rows of `evaluation` for these runs (their evaluations as read): one series per configuration,
    panels '<column>=<value>', and a diverged model counted as +inf at every panel and step (it beats
    nothing); a model row's `config` names its configuration (scopes.config_of), Lloyd's is None."""
    labels, _ = series_labels(runs, varying(runs) or [EMB])
    column = PANELS[evaluation]
    frames = []
    for method in METHODS.get(evaluation, ("reembed",)):
        panel = lambda t, r: column + "=" + t[column].astype(str)  # noqa: E731
        rows = count_once(evaluation_rows(ctx, runs, evaluation, panel, labels, (method,)))
        points = rows.loc[rows["series"] != LLOYD, ["panel", "step"]].drop_duplicates()
        lost = [
            points.assign(series=labels[i], unit=run["run_id"], value=math.inf, **{SEED: run[SEED]})
            for i, run in runs[runs[OUTCOME] == DIVERGED].iterrows()
        ]
        frames.append(pd.concat([rows, *lost], ignore_index=True).assign(method=method))
    rows = pd.concat(frames, ignore_index=True)
    rows.loc[rows["series"] == LLOYD, "method"] = LLOYD_METHOD
    configs = {labels[i]: config_of(run) for i, run in runs.iterrows()}
    rows["config"] = [configs.get(series) for series in rows["series"]]
    return rows[["panel", "series", "method", SEED, "step", "value", "config"]]


def _probe(ctx: Context) -> Callable[[pd.DataFrame, str], tuple[pd.DataFrame, str]]:
    def rows(runs: pd.DataFrame, evaluation: str) -> tuple[pd.DataFrame, str]:
        try:
            return probe_rows(ctx, runs, evaluation), ""
        except (MissingInput, FileNotFoundError) as err:
            return pd.DataFrame(columns=["panel", "series", "method", SEED, "step", "value"]), str(err)

    return rows


def _history(ctx: Context) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def points(runs: pd.DataFrame) -> pd.DataFrame:
        h = ctx.histories
        return h[(h["key"] == VAL_REL_LLOYD) & h["run_id"].isin(runs["run_id"])][["run_id", "step", "value"]]

    return points


def _final(ctx: Context) -> Callable[[pd.DataFrame], tuple[pd.DataFrame, str]] | None:
    """Runs -> (the same runs, their finished d 32 ones' final metrics measured at n eval.d32_n on fresh tasks
    from each last checkpoint (checkpoint_eval.final, as read), why some are missing); None when eval.d32_n is
    null. Other runs keep the values they logged at their training n."""
    n = ctx.settings.d32_n
    if n is None:
        return None

    def measured(runs: pd.DataFrame) -> tuple[pd.DataFrame, str]:
        runs, failed = runs.copy(), []
        for i, run in runs[(runs[D] == D32) & (runs[OUTCOME] == FINISHED)].iterrows():
            try:
                values = ctx.evaluation("final", run, n=n).set_index("metric")["value"]
            except (FileNotFoundError, ValueError) as err:  # no checkpoint; tasks of n it cannot have (n < k)
                runs.loc[i, list(FINAL_METRICS)] = math.nan  # not judged, never read as logged at another n
                failed.append(f"{run['run_id']}: {err}")
            else:
                runs.loc[i, list(values.index)] = values.to_numpy()
        why = f"final values at n {n} not measured for {len(failed)} runs ({'; '.join(failed[:2])})"
        return runs, why if failed else ""

    return measured


def _speed_rows(path: Path | None) -> list[dict] | None:
    return json.loads(path.read_text()).get("rows", []) if path is not None and path.exists() else None


def evidence(ctx: Context, drawn: dict[str, Figure] | None = None) -> Evidence:
    """The claims' inputs from ctx; `drawn` (figure name -> Figure) holds what the report already drew, which
    is reused rather than computed again."""
    drawn = drawn or {}
    figure = drawn.get("task_dissimilarity")
    blocks = figure.tables["family_blocks"] if figure is not None else dissimilarity(ctx)[4]
    return Evidence(
        ctx.runs.assign(**{EXPERIMENT: ctx.experiment}),
        paper_grid(),
        ctx.settings.steps,
        _probe(ctx),
        _history(ctx),
        _speed_rows(ctx.speed_json),
        f"{ctx.speed_json} (`python -m bench speed_memory --out FILE`, then speed_json=FILE)",
        blocks,
        _final(ctx),
        ctx.settings.d32_n,
    )


def combined(found: list[Evidence]) -> Evidence:
    """One Evidence from several stores' (sweep=lite's d 4 runs and sweep=lite32's d 32 runs, each in its own
    experiment): their runs side by side; a probe or history read goes to the evidences holding the runs
    read; the grid, benchmarks and dissimilarity table are the first's that has them. So every claim is
    judged once, on the runs of its scope wherever they were trained (large_lr_worse: d 4 from one, d 32
    from the other)."""

    def own(scoped: pd.DataFrame, e: Evidence) -> pd.DataFrame:
        return scoped[scoped["run_id"].isin(e.runs["run_id"])]

    def probe(scoped: pd.DataFrame, evaluation: str) -> tuple[pd.DataFrame, str]:
        rows, missing = [], []
        for e in found:
            if e.probe is not None and not own(scoped, e).empty:
                part, why = e.probe(own(scoped, e), evaluation)
                rows.append(part)
                missing += [why] if why else []
        empty = pd.DataFrame(columns=["panel", "series", "method", SEED, "step", "value"])
        return (pd.concat(rows, ignore_index=True) if rows else empty), "; ".join(missing)

    def history(scoped: pd.DataFrame) -> pd.DataFrame:
        parts = [e.history(own(scoped, e)) for e in found if e.history is not None]
        return (
            pd.concat(parts, ignore_index=True)
            if parts
            else pd.DataFrame(columns=["run_id", "step", "value"])
        )

    def final(scoped: pd.DataFrame) -> tuple[pd.DataFrame, str]:
        frames, missing = [scoped.iloc[:0]], []
        for e in found:
            mine = own(scoped, e)
            measured, why = e.final(mine) if e.final is not None and not mine.empty else (mine, "")
            frames.append(measured)
            missing += [why] if why else []
        return pd.concat(frames), "; ".join(missing)

    def first(attr: str):
        return next((getattr(e, attr) for e in found if getattr(e, attr) is not None), None)

    with_speed = next((e for e in found if e.speed is not None), found[0])
    return Evidence(
        pd.concat([e.runs for e in found], ignore_index=True),
        first("grid"),
        found[0].T,
        probe,
        history,
        with_speed.speed,
        with_speed.speed_source,
        first("blocks"),
        final if any(e.final is not None for e in found) else None,
        first("final_n"),
    )


def check(ctx: Context, drawn: dict[str, Figure] | None = None) -> list[Claim]:
    """Every claim of docs/science.md section 7.1 against ctx's store, in order, then the ones beyond it;
    `drawn`: the figures the report drew, whose data the claims reuse (see `evidence`)."""
    found = evidence(ctx, drawn)
    return [judge(record, found) for record in CLAIMS]


def check_together(contexts: list[Context]) -> list[Claim]:
    """Every claim, as `check`, on the runs of several experiments judged as one (`combined`)."""
    if len(contexts) == 1:
        return check(contexts[0])
    found = combined([evidence(ctx) for ctx in contexts])
    return [judge(record, found) for record in CLAIMS]
