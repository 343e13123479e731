"""The one pass in which report and claims read a store: each experiment's runs (analysis.runs), their
metric histories and the evaluations of their checkpoints that the figures and claims will ask for
(analysis.checkpoint_eval, cached), into a Context of plain frames. Nothing after it opens the store to draw
or judge.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd
from tqdm import tqdm

from analysis.checkpoint_eval import EvalSettings, Evaluator
from analysis.cli import expected_sizes
from analysis.context import Context, Want
from analysis.runs import NoRuns, histories, outcome_of, selected_runs
from cli import console
from config.schema import ConfigError
from tracking.names import METRICS

Wants = Callable[[Context], Iterable[Want]]  # the evaluations a command will ask for, from the runs alone


def read_store(own: dict, tracking: object, wants: Callable[[dict], Wants]) -> list[Context]:
    """A Context per experiment, read in one pass: `experiments` (the claims judged on several at once, each
    of tracking.uri or, written NAME@URI, of its own store), else tracking.experiment; its runs (select.*),
    their histories and the evaluations wants(settings) names, cached in its own report folder. An
    experiment without runs raises NoRuns, a report folder that cannot be written ConfigError, both before
    any is read."""
    settings = EvalSettings.of(own["eval"])
    stores = dict(where(e, tracking.uri) for e in own["experiments"] or [tracking.experiment])
    found = {e: _runs(uri, e, own["select"]) for e, uri in stores.items()}
    extra = {key: Path(own[key]) if own[key] else None for key in ("speed_json", "step_json")}
    extra["expected"] = expected_sizes()
    for e in found:  # once every experiment has runs: a missing one leaves no folder behind
        writable(Path(own["out"]) / e, own["out"])
    return [
        read(stores[e], e, runs, settings, Path(own["out"]) / e, wants(own), **extra)
        for e, runs in found.items()
    ]


def where(entry: str, uri: str) -> tuple[str, str]:
    """An entry of `experiments` as (experiment, its store): NAME is in tracking.uri, NAME@URI in that store
    (an experiment trained into a store of its own, such as an extension's run in allocations)."""
    name, at, own_uri = entry.partition("@")
    return name, own_uri if at else uri


def _runs(uri: str, experiment: str, select: dict) -> pd.DataFrame:
    """The experiment's training runs (select.*); NoRuns, saying how to fill it, when it has none."""
    try:
        runs = selected_runs(uri, experiment, select["sweep"], select["subgrid"])
    except NoRuns as err:
        advice = "" if err.choices else f". {_how_to_fill(uri, experiment)}"
        raise NoRuns(f"nothing to analyse: {err}{advice}") from None
    if runs.empty:  # a selection that matched nothing was answered above, naming what the store holds
        raise NoRuns(
            f"nothing to analyse: experiment {experiment!r} in {uri} has no training runs. "
            f"Every figure needs training runs with checkpoints and metrics (train_loss, "
            f"val_rel_lloyd ...). {_how_to_fill(uri, experiment)}"
        )
    return runs


def _how_to_fill(uri: str, experiment: str) -> str:
    where = f"tracking.uri={uri} tracking.experiment={experiment}"
    return (
        f"Fill it with `python -m sweeper.sweep sweep=demo {where}` (or sweep=paper for the full grid), "
        f"or point the report at another store with tracking.uri=... tracking.experiment=..."
    )


def writable(folder: Path, out: str) -> None:
    """Make the report folder, or refuse before any work when it cannot be written (a read-only mount, a
    colleague's folder): ConfigError naming `out`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise ConfigError(
            f"out={out!r} is not allowed: {folder} cannot be written ({err.strerror}); "
            "set out=DIR to a folder you can write"
        ) from None


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
