"""The one pass in which report and claims read a store: an experiment's runs' metric histories and the
evaluations of their checkpoints that the figures and claims will ask for (analysis.checkpoint_eval, cached),
into a Context of plain frames. Nothing after it opens the store to draw or judge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import pandas as pd
from tqdm import tqdm

from analysis.checkpoint_eval import EvalSettings, Evaluator
from analysis.context import Context, Want
from analysis.runs import histories, outcome_of
from cli import console
from tracking.names import METRICS

Wants = Callable[[Context], Iterable[Want]]  # the evaluations a command will ask for, from the runs alone


def read(
    uri: str,
    experiment: str,
    runs: pd.DataFrame,
    settings: EvalSettings,
    out_dir: Path,
    wants: Wants = lambda ctx: (),
    **extra: object,
) -> Context:
    """The experiment's runs, every metric point of theirs and each evaluation `wants` names (cached under
    out_dir/cache and, where the store is writable, as evaluation runs), read once."""
    runs = runs.assign(outcome=outcome_of(runs))
    ctx = Context(uri, experiment, runs, histories(uri, runs, METRICS), {}, settings, out_dir, **extra)
    wanted = list(dict.fromkeys(wants(ctx)))  # in order, each once
    if wanted:
        ctx.evaluations.update(
            _evaluations(Evaluator(uri, experiment, settings, out_dir / "cache"), ctx, wanted)
        )
    return ctx


def _evaluations(
    evaluator: Evaluator, ctx: Context, wanted: list[Want]
) -> dict[Want, pd.DataFrame | Exception]:
    """Each wanted evaluation, or the error that stopped it: raised again where a figure or claim reads it, so
    each says why it is missing (a run without its checkpoint; tasks of an n the run cannot have, n < k) and
    one that fails still fails alone, as when it evaluated for itself."""
    rows = ctx.runs.set_index("run_id", drop=False)
    found: dict[Want, pd.DataFrame | Exception] = {}
    # A bar on a terminal only: in a log file a line per evaluation would drown the report's lines.
    for want in tqdm(wanted, desc="evaluations", unit="run", leave=False, disable=console.lines_not_bars()):
        name, run_id, n = want
        try:
            found[want] = evaluator(name, rows.loc[run_id], n=n)
        except Exception as err:  # noqa: BLE001 (kept, and raised where it is read)
            found[want] = err
    return found
