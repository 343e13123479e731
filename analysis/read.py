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

from analysis.checkpoint_eval import EvalSettings, Evaluator
from analysis.cli import expected_sizes
from analysis.context import Context, Want
from analysis.runs import histories, outcome_of, runs_to_analyse
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
    found = {e: runs_to_analyse(uri, e, own["select"]) for e, uri in stores.items()}
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
        ctx.evaluations.update(Evaluator(uri, experiment, settings, out_dir / "cache").each(ctx.runs, wanted))
    return ctx


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
