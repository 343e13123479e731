"""Command-line settings shared by `analysis.report` and `analysis.claims`.

Overrides are Hydra-style `key=value` on conf/analysis.yaml: `tracking.*` from conf/tracking (as for
training, $MLFLOW_TRACKING_URI and $MLFLOW_EXPERIMENT_NAME included), the rest from conf/report, the one
place their defaults live. An unknown key fails before any work (ConfigError, exit code 2), naming the
key and the allowed ones.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import pandas as pd
from omegaconf import OmegaConf

from analysis.checkpoint_eval import EvalSettings
from analysis.context import Context
from analysis.read import Wants, read
from analysis.runs import NoRuns, selected_runs
from config.compose import compose
from config.grid import expand
from config.schema import ConfigError

ANALYSIS = "analysis"  # conf/analysis.yaml
# Sweeps whose sub-grid sizes say how complete a store is ("4/60 configurations found").
REFERENCE_SWEEPS = ("paper", "points")


def parse(argv: list[str]) -> tuple[dict, object]:
    """(analysis settings, tracking config) from the overrides."""
    cfg = compose(argv, config_name=ANALYSIS)
    own = OmegaConf.to_container(cfg, resolve=True)
    del own["tracking"]
    return own, cfg.tracking


def options_help(figures: list[str] = ()) -> str:
    """--help's list of the keys report and claims take, with their defaults (and the figures to choose)."""
    own, _ = parse([])
    flat = {}
    for key, value in own.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{sub}": default for sub, default in value.items()})
        elif key != "figures":  # its own line below, with the figures to choose from
            flat[key] = value
    lines = [
        "Options (key=value, default after the =; conf/report/default.yaml):",
        "  tracking.uri, tracking.experiment: the store (sqlite:///FILE, http://HOST:PORT or postgresql://...)",
        "    and experiment ($MLFLOW_TRACKING_URI and $MLFLOW_EXPERIMENT_NAME when set)",
        "  select.sweep, select.subgrid: only the runs of that sweep / sub-grid",
    ]
    lines += [f"  {key}={_shown(value)}" for key, value in flat.items()]
    if figures:
        lines.append(f"  figures=[a,b,...] draws only those (null: all) of {', '.join(figures)}")
    return "\n".join(lines)


def _shown(value: object) -> str:
    """A default as it is typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return f"[{','.join(map(str, value))}]"
    return str(value)


def expected_sizes() -> dict[str, int]:
    """Sub-grid name -> number of configurations, from conf/sweep (the one place the grid is written)."""
    sizes: dict[str, int] = {}
    for name in REFERENCE_SWEEPS:
        plan = expand(compose([f"sweep={name}"]).sweep)
        sizes.update({grid.name: grid.size for grid in plan.subgrids})
    return sizes


def job_config(argv: list[str]) -> str:
    """`--cfg job`: the analysis config (tracking and the report's keys) the overrides compose to."""
    return OmegaConf.to_yaml(OmegaConf.to_container(compose(argv, config_name=ANALYSIS), resolve=True))


def open_context(argv: list[str], figures: list[str], wants: Callable[[dict], Wants]) -> tuple[Context, dict]:
    """The report's: one experiment's Context (it draws one experiment's figures), as open_contexts; a list
    of `experiments` is refused before any work."""
    contexts, own = open_contexts(argv, wants, figures, several=False)
    return contexts[0], own


def open_contexts(
    argv: list[str], wants: Callable[[dict], Wants], figures: list[str] = (), several: bool = True
) -> tuple[list[Context], dict]:
    """Parse, then read a Context per experiment of tracking.uri in one pass (analysis.read): `experiments`
    (the claims judged on several at once), else tracking.experiment; its runs, their histories and the
    evaluations wants(settings) names, cached in its own report folder. Bad input raises ConfigError, an
    experiment without runs NoRuns."""
    own, tracking = parse(argv)
    settings = EvalSettings.of(own["eval"])
    unknown = [name for name in own["figures"] or [] if name not in figures]
    if unknown:
        raise ConfigError(
            f"figures={own['figures']!r} is not allowed: {', '.join(unknown)} unknown; "
            f"choose from {', '.join(figures)}"
        )
    if own["experiments"] and not several:
        raise ConfigError(
            f"experiments={own['experiments']!r} is not allowed here: the report draws one experiment's "
            "figures (tracking.experiment=NAME); `python -m analysis.claims experiments=[a,b]` judges "
            "several in one table"
        )
    found = {e: _runs(tracking.uri, e, own["select"]) for e in own["experiments"] or [tracking.experiment]}
    extra = {key: Path(own[key]) if own[key] else None for key in ("speed_json", "step_json")}
    extra["expected"] = expected_sizes()
    for e in found:  # once every experiment has runs: a missing one leaves no folder behind
        writable(Path(own["out"]) / e, own["out"])
    contexts = [
        read(tracking.uri, e, runs, settings, Path(own["out"]) / e, wants(own), **extra)
        for e, runs in found.items()
    ]
    return contexts, own


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
