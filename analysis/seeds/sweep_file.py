"""The sweep a round writes (a `sweep=` file in the user's config directory) and what a store holds of it.

The round's sweep includes the base sweep (its axes, baseline, `fixed`), names each chosen configuration in
the sub-grids the base sweep names it in, with every axis at its value, and the paper's first `target` seeds:
its jobs are the base sweep's own (the same config_hash), so the sweep adopts the seeds a store holds and
trains only the rest (sweeper.driver.ledger: exactly once by config_hash).
"""

from __future__ import annotations

from numbers import Number
from pathlib import Path

import pandas as pd

from analysis.claims.scopes import Config
from analysis.seeds.plan import Key, Round
from config.compose import compose, group_options, searchpath_override, user_config_dirs
from config.grid import Configuration, Plan, expand
from config.identity import format_value
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED


def paper_seeds() -> tuple[int, ...]:
    """The paper's ten seeds, in order: conf/sweep/paper.yaml's."""
    return tuple(compose(["sweep=paper"], user_dirs=False).sweep.seeds)


def sweep_names() -> list[str]:
    """The sweeps of conf/sweep/ and of the user's config directories (--config-dir)."""
    return [name for name in group_options("sweep", user_config_dirs()) if name != "none"]


def plan_of(sweep: str, config_dir: Path | None = None) -> Plan:
    """A sweep's plan, from conf/ or, with `config_dir`, the user's directory first."""
    where = searchpath_override([config_dir.resolve()]) if config_dir else []
    return expand(compose([*where, f"sweep={sweep}"]).sweep)


def key_of(configuration: Configuration) -> Key:
    return tuple(sorted(configuration.overrides.items()))


def _same(a: object, b: object) -> bool:
    """Values as a store's typed params and a sweep's overrides write them: 1 and 1.0 alike."""
    if isinstance(a, Number) and isinstance(b, Number) and not isinstance(a, bool):
        return float(a) == float(b)
    return str(a) == str(b)


def matching(config: Config, plan: Plan) -> list[Key]:
    """The plan's configurations with a case's configuration's values (scopes.config_of: the claims' axes):
    one, or several where the plan differs on a key the claims do not name (train.steps)."""
    return [
        key_of(c)
        for c in plan.configurations
        if all(_same(c.overrides[k], v) for k, v in config if k in c.overrides)
        and all(k in c.overrides for k, _ in config)
    ]


def runs_of(runs: pd.DataFrame, key: Key) -> pd.DataFrame:
    """The runs of one configuration (every override key at its value; a key no run has matches none)."""
    if any(k not in runs for k, _ in key):
        return runs.iloc[:0]
    chosen = pd.Series(True, index=runs.index)
    for k, v in key:
        chosen &= runs[k].map(lambda x, v=v: _same(x, v))
    return runs[chosen]


def ended_seeds(runs: pd.DataFrame, key: Key) -> set[int]:
    """The seeds the configuration has a run with an outcome for (finished or diverged)."""
    mine = runs_of(runs, key)
    return {int(s) for s in mine.loc[mine[OUTCOME].isin((FINISHED, DIVERGED)), SEED]}


def unfinished(runs: pd.DataFrame, plan: Plan) -> int:
    """How many of the plan's jobs (configuration, seed) have no run with an outcome yet."""
    return sum(len(set(plan.seeds) - ended_seeds(runs, key_of(c))) for c in plan.configurations)


def write(path: Path, base: Plan, name: str, round_: Round, paper: tuple[int, ...], words: str) -> Path:
    """The round's sweep file at `path` (sweep/NAME.yaml of the user's config directory); `words`: the
    header's account of the round."""
    by_key = {key_of(c): c for c in base.configurations}
    axes = compose([f"sweep={base.name}"]).sweep.axes
    entries = []
    for key in round_.configurations:
        configuration = by_key[key]
        values = ", ".join(
            f"{axis}: [{format_value(configuration.overrides[k])}]"
            for axis, k in axes.items()
            if k in configuration.overrides
        )
        entries += [f"  - {{name: {subgrid}, {values}}}" for subgrid in configuration.subgrids]
    seeds = ", ".join(str(s) for s in paper[: round_.target])
    header = "".join(f"# {line}\n" for line in words.splitlines())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"# @package sweep\n{header}defaults:\n  - {base.name}\n  - _self_\n\nname: {name}\n"
        f"seeds: [{seeds}]\nsubgrids:\n" + "\n".join(entries) + "\n"
    )
    return path
