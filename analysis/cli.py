"""Command-line settings shared by `analysis.report` and `analysis.claims`.

Overrides are Hydra-style `key=value` on conf/analysis.yaml: `tracking.*` from conf/tracking (as for
training, $MLFLOW_TRACKING_URI and $MLFLOW_EXPERIMENT_NAME included), the rest from conf/report, the one
place their defaults live. An unknown key fails before any work (ConfigError, exit code 2), naming the
key and the allowed ones.
"""

from __future__ import annotations

from omegaconf import OmegaConf

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


def settings_of(argv: list[str], figures: list[str] = (), several: bool = True) -> tuple[dict, object]:
    """The command line of the report (`figures`: those it may draw, of one experiment) or of the claims
    (`several`: `experiments` judged as one), parsed; ConfigError, before any work, for a figure it does not
    know or a list of experiments where the report draws one."""
    own, tracking = parse(argv)
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
    return own, tracking
