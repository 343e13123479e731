"""Expand a sweep (conf/sweep/*.yaml) into configurations and jobs (a configuration at a seed).

A sweep names sub-grids; each is the product of its axes, every other axis at
the sweep's baseline. The union of the sub-grids is the set of distinct
configurations (a configuration named by several sub-grids appears once and
remembers all their names); every configuration runs once per seed. All of
this is checked here, with the training config's own validation, before any
job starts.

The sweep driver takes a sweep in one pass (prepare): every configuration validated, every job identified
(config_hash, run name, its configuration's override words) and the command line's overrides its trials
compose with, as one Sweep that none of its later steps comes back to config/ for.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from config.compose import compose, compose_sweep, keys_named, trial_words
from config.identity import format_value, seed_identities
from config.schema import ConfigError
from config.search import Search, declared
from config.validate import validate

SWEEP_KEYS = (
    *("name", "dry_run", "scheduler", "axes", "baseline", "seeds", "fixed", "subgrids"),
    *("confirm", "confirm_trials", "confirm_hours"),  # sweeper.driver.confirm: asked before a large sweep
    *("asha", "search"),  # ASHA's settings (sweeper.driver.tune), a random search (config.search)
)
SCHEDULERS = ("none", "asha")
ENVIRONMENT_READ = re.compile(r"\$\{oc\.env:[^${}]*\}")  # one read of the environment and nothing else


@dataclass(frozen=True)
class Configuration:
    """One grid point: the config overrides that make it, and the sub-grids naming it."""

    overrides: dict[str, Any]  # config key -> value
    subgrids: tuple[str, ...]

    def override_strings(self) -> list[str]:
        return [f"{key}={format_value(value)}" for key, value in self.overrides.items()]


@dataclass(frozen=True)
class Subgrid:
    name: str
    axes: tuple[tuple[str, int], ...]  # (axis, number of values), in file order

    @property
    def size(self) -> int:
        return math.prod(count for _, count in self.axes)


@dataclass(frozen=True)
class Job:
    """One grid entry, one model to train: a configuration at a seed; `key` is its config_hash.

    A Ray Tune trial trains one job, or a pack of them (cluster.pack=seeds): "trial" is only Tune's.
    """

    key: str
    seed: int
    name: str  # the run name, e.g. BN-L2 tau0.1 d32 k10 n512 s153476998 (config.identity.run_name)
    configuration: Configuration
    overrides: tuple[str, ...]  # its configuration's, as override words (Configuration.override_strings)
    label: str = ""  # its configuration's name with the sweep's axes, its `configuration` tag


@dataclass(frozen=True)
class Plan:
    name: str
    subgrids: tuple[Subgrid, ...]
    configurations: tuple[Configuration, ...]
    seeds: tuple[int, ...]
    search: Search | None = None  # the random search that drew the configurations from the grid's

    @property
    def job_count(self) -> int:
        return len(self.configurations) * len(self.seeds)

    @property
    def swept(self) -> tuple[str, ...]:
        """The config keys whose values differ among the configurations (the axes in use), in plan order."""
        keys = dict.fromkeys(key for c in self.configurations for key in c.overrides)
        values = {key: {format_value(c.overrides.get(key)) for c in self.configurations} for key in keys}
        return tuple(key for key in keys if len(values[key]) > 1)

    def summary(self) -> str:
        n, s = len(self.configurations), len(self.seeds)
        return f"{n} configurations x {s} seeds = {n * s} trials"

    def table(self) -> str:
        rows = [("sub-grid", "axes", "count")]
        rows += [(g.name, " x ".join(f"{a}({c})" for a, c in g.axes), str(g.size)) for g in self.subgrids]
        if self.search:
            rows.append(("search", self.search.describe(), f"x{self.search.samples}"))
        rows.append(("union", "distinct configurations", str(len(self.configurations))))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows)


@dataclass(frozen=True)
class Sweep:
    """A sweep as its driver runs it, made in one pass (prepare) so that no later step comes back to config/:
    the command line's configuration, its plan, every job with its identity, and the overrides each trial
    composes with before its configuration's (sweeper.driver.trial)."""

    cfg: DictConfig  # the command line's composition
    plan: Plan
    jobs: tuple[Job, ...]  # every configuration at every seed, in the plan's order
    base: tuple[str, ...]  # the command line's overrides a trial keeps: neither the sweep's nor the grid's

    def first(self, count: int) -> Sweep:
        """The sweep of its first `count` configurations alone (sweeper.scale.probe's smaller grids)."""
        plan = replace(self.plan, configurations=self.plan.configurations[:count])
        return replace(self, plan=plan, jobs=self.jobs[: count * len(plan.seeds)])


def _fail(sweep: str, where: str, message: str) -> None:
    raise ConfigError(f"sweep {sweep!r}, {where}: {message}")


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node


def _axis_keys(name: str, axes: dict[str, str], axis: str) -> list[str]:
    """Config keys an axis sets; "d,k" is a zipped axis setting two keys."""
    parts = [part.strip() for part in str(axis).split(",")]
    unknown = [part for part in parts if part not in axes]
    if unknown:
        _fail(name, f"axis {axis!r}", f"unknown axis {unknown[0]!r}; {_declare(unknown[0], axes)}")
    return [axes[part] for part in parts]


def _declare(axis: str, axes: dict[str, str]) -> str:
    """The allowed axes, and how to declare `axis` as a new one (its config key where one has its name)."""
    key = (keys_named(axis) or ["KEY"])[0]
    return (
        f"allowed axes: {', '.join(axes)}; declare a new one in the sweep's axes, name -> config key: "
        f"+sweep.axes.{axis}={key}, or axes: {{{axis}: {key}}} in its file "
        "(docs/configuration.md, 'Declaring an axis of your own')"
    )


def _points(name: str, sub: dict, axes: dict[str, str]) -> tuple[Subgrid, list[dict[str, Any]]]:
    """The sub-grid's product, each point as config key -> value."""
    sub = dict(sub)
    label = sub.pop("name", None)
    if not label:
        _fail(name, "subgrids", f"every sub-grid needs a name, got {sub}")
    columns: list[list[dict[str, Any]]] = []
    counts: list[tuple[str, int]] = []
    for axis, values in sub.items():
        keys = _axis_keys(name, axes, axis)
        if not isinstance(values, list) or not values:
            _fail(
                name,
                f"sub-grid {label!r}, axis {axis!r}",
                f"needs a non-empty list of values, got {values!r}",
            )
        column = []
        for value in values:
            value = list(value) if isinstance(value, (list, tuple)) else [value]
            if len(value) != len(keys):
                _fail(
                    name, f"sub-grid {label!r}, axis {axis!r}", f"value {value!r} needs {len(keys)} entries"
                )
            if any(isinstance(v, (dict, list)) for v in value):
                _fail(
                    name,
                    f"sub-grid {label!r}, axis {axis!r}",
                    f"value {value!r}: values are numbers or names",
                )
            column.append(dict(zip(keys, value)))
        columns.append(column)
        counts.append((axis, len(values)))
    points = [dict(kv for part in combo for kv in part.items()) for combo in itertools.product(*columns)]
    return Subgrid(label, tuple(counts)), points


def expand(sweep: DictConfig, command_line: frozenset[str] = frozenset()) -> Plan:
    """The sub-grids, their union and the seeds of a sweep definition (structure checked).

    Keys in `command_line` (set by the user's overrides) keep the user's value over the sweep's `fixed` one;
    a key the grid sets in every trial (an axis, a baseline value, the seed) is an error there. The grid is
    read whole before its random search (config.search) is declared over it and draws at each of its points.
    """
    spec = _plain(sweep) or {}
    name = spec.get("name") or "?"
    _refuse_unknown(name, spec)
    axes = spec.get("axes") or {}
    baseline = _baseline(name, spec, axes)
    _refuse_overwritten(name, spec, axes, command_line)
    fixed = fixed_values(spec, command_line)
    seeds = _seeds(name, spec.get("seeds"))
    subgrids, points = _grid(name, spec, axes, baseline, fixed)
    search_spec = spec.get("search") or {}
    space_keys = {axis: _axis_keys(name, axes, axis) for axis in search_spec.get("space") or {}}
    held = _held(name, spec, axes, fixed, command_line)
    search = declared(name, search_spec, space_keys, held)
    union: dict[tuple, tuple[dict[str, Any], list[str]]] = {}
    for label, point in points:
        for overrides in search.draws(point) if search else [point]:
            key = tuple(sorted(overrides.items()))  # 1 and 1.0 are one value, as in the config
            names = union.setdefault(key, (overrides, []))[1]
            if label not in names:
                names.append(label)
    configurations = tuple(Configuration(o, tuple(n)) for o, n in union.values())
    return Plan(name, subgrids, configurations, seeds, search)


def _refuse_unknown(name: str, spec: dict) -> None:
    """A key a sweep does not have, or a scheduler there is none of."""
    unknown = sorted(set(spec) - set(SWEEP_KEYS))
    if unknown:
        _fail(name, f"key {unknown[0]!r}", f"unknown key; allowed keys: {', '.join(SWEEP_KEYS)}")
    if spec.get("scheduler", "none") not in SCHEDULERS:
        _fail(
            name,
            "sweep.scheduler",
            f"{spec['scheduler']!r} is not allowed: choose one of {', '.join(SCHEDULERS)}",
        )


def _baseline(name: str, spec: dict, axes: dict[str, str]) -> dict[str, Any]:
    """The baseline's values by config key: every axis of a sub-grid but its own is held there."""
    baseline = {}
    for axis, value in (spec.get("baseline") or {}).items():
        (key,) = _axis_keys(name, axes, axis)
        baseline[key] = value
    return baseline


def _grid(
    name: str, spec: dict, axes: dict[str, str], baseline: dict[str, Any], fixed: dict[str, Any]
) -> tuple[tuple[Subgrid, ...], list[tuple[str, dict[str, Any]]]]:
    """The sub-grids and every point of each, (sub-grid name, config key -> value), at the baseline and the
    fixed values; a grid without a point is refused."""
    subgrids, points = [], []
    for sub in spec.get("subgrids") or []:
        grid, own = _points(name, sub, axes)
        subgrids.append(grid)
        points += [(grid.name, {**baseline, **point, **fixed}) for point in own]
    if not points:
        _fail(
            name,
            "sweep.subgrids",
            "the grid is empty: name at least one sub-grid with at least one value per axis",
        )
    return tuple(subgrids), points


def _held(
    name: str, spec: dict, axes: dict[str, str], fixed: dict[str, Any], command_line: frozenset[str]
) -> dict[str, str]:
    """Config key -> what else sets it in every trial (the command line, sweep.fixed, a sub-grid): an axis the
    random search draws may be none of them."""
    held = dict.fromkeys(command_line, "the command line")
    held.update(dict.fromkeys(fixed, "sweep.fixed"))
    for sub in spec.get("subgrids") or []:
        for axis in (a for a in sub if a != "name"):
            held.update(dict.fromkeys(_axis_keys(name, axes, axis), f"sub-grid {sub.get('name')!r}"))
    return held


def override_key(override: str) -> str:
    """The config key an override sets (`key=v`, `+key=v` and `~key` alike)."""
    return override.split("=", 1)[0].lstrip("+~")


def command_line_keys(overrides: Iterable[str]) -> frozenset[str]:
    return frozenset(override_key(o) for o in overrides)


def fixed_values(spec: dict, command_line: frozenset[str]) -> dict[str, Any]:
    """A sweep's `fixed` values (dotted keys), less the keys in `command_line`: the user's value wins."""
    return {k: v for k, v in flatten(spec.get("fixed") or {}).items() if k not in command_line}


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested keys dotted: {train: {steps: 5}} and {train.steps: 5} alike -> {"train.steps": 5}."""
    out: dict[str, Any] = {}
    for key, child in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(child, name) if isinstance(child, dict) else {name: child})
    return out


def compose_one(overrides: list[str]) -> DictConfig:
    """One run's configuration (python -m sweeper.train): with sweep=NAME, at that sweep's `fixed` values
    where the command line leaves them, as the sweep's own trials train (sweep=smoke: 20 steps on n=16)."""
    cfg = compose(overrides)
    fixed = fixed_values(_plain(cfg.sweep), command_line_keys(overrides)) if cfg.sweep is not None else {}
    if not fixed:
        return cfg
    return compose([*(f"{k}={format_value(v)}" for k, v in fixed.items()), *overrides])


def _refuse_overwritten(name: str, spec: dict, axes: dict[str, str], command_line: frozenset[str]) -> None:
    """A command-line override the grid would silently overwrite in every trial is rejected instead."""
    if "seed" in command_line:
        _fail(
            name,
            "sweep.seeds",
            "seed on the command line would be overwritten: each trial takes its seed "
            "from sweep.seeds; set sweep.seeds=[...] instead",
        )
    for sub in spec.get("subgrids") or []:
        for axis in (a for a in sub if a != "name"):
            for key in set(_axis_keys(name, axes, axis)) & command_line:
                _fail(
                    name,
                    f"sub-grid {sub.get('name')!r}",
                    f"{key} on the command line would be overwritten: "
                    f"this sub-grid sweeps it (axis {axis!r}); change the sweep instead "
                    "(sweep.baseline, sweep.subgrids)",
                )
    for axis, value in (spec.get("baseline") or {}).items():
        (key,) = _axis_keys(name, axes, axis)
        if key in command_line:
            _fail(
                name,
                "sweep.baseline",
                f"{key} on the command line would be overwritten: every sub-grid holds it at the baseline "
                f"{axis}={format_value(value)}; set sweep.baseline.{axis}=... instead",
            )


def _seeds(name: str, seeds: Any) -> tuple[int, ...]:
    if not isinstance(seeds, list) or not seeds:
        _fail(name, "sweep.seeds", f"needs a non-empty list of integer seeds, got {seeds!r}")
    bad = [s for s in seeds if not isinstance(s, int) or isinstance(s, bool) or s < 0]
    if bad:
        _fail(name, "sweep.seeds", f"{bad[0]!r} is not a seed: seeds are integers >= 0")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        _fail(name, "sweep.seeds", f"duplicate seeds {repeated}: each repetition needs its own seed")
    return tuple(seeds)


def _configured(base: DictConfig, plan: Plan) -> Iterator[tuple[Configuration, DictConfig]]:
    """Each configuration applied to one working copy of `base` (copying per trial is slow)."""
    work = base.copy()
    work.sweep = None
    keys = {key for c in plan.configurations for key in c.overrides}
    _read_environment_once(work, keys)
    absent = object()
    defaults = {key: OmegaConf.select(work, key, default=absent) for key in keys}
    unknown = sorted(key for key, value in defaults.items() if value is absent)
    if unknown:
        raise ConfigError(
            f"sweep {plan.name!r}: {unknown[0]!r} is not a config key (python -m sweeper.train "
            "--help lists them)"
        )
    for configuration in plan.configurations:
        with _rejecting(plan, configuration):
            for key in keys:
                OmegaConf.update(work, key, configuration.overrides.get(key, defaults[key]), merge=False)
        yield configuration, work


def _read_environment_once(work: DictConfig, gridded: set[str]) -> None:
    """Resolve the working copy's reads of the environment (${oc.env:...}, the tracking defaults) once: the
    same for every configuration, and OmegaConf parses an interpolation again at each read (validation read
    the tracking section's at each of the paper grid's 300 configurations: a third of its expansion)."""
    for key, value in _leaves(OmegaConf.to_container(work, resolve=False)):
        if key not in gridded and isinstance(value, str) and ENVIRONMENT_READ.fullmatch(value):
            try:
                OmegaConf.update(work, key, OmegaConf.select(work, key), merge=False)
            except OmegaConfBaseException:
                pass  # unset, no default: each configuration's validation says so, naming it


def _leaves(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of each leaf of a plain config tree."""
    for name, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


@contextlib.contextmanager
def _rejecting(plan: Plan, configuration: Configuration) -> Iterator[None]:
    """A configuration's error, from OmegaConf or from validation, as one ConfigError that names it."""
    try:
        yield
    except OmegaConfBaseException as err:
        why = f"{err.full_key}: {str(err).splitlines()[0]}"
    except ConfigError as err:
        why = str(err)
    else:
        return
    raise ConfigError(
        f"sweep {plan.name!r}, sub-grid {','.join(configuration.subgrids)!r}: {why} "
        f"(configuration {' '.join(configuration.override_strings())})"
    ) from None


def jobs(base: DictConfig, plan: Plan) -> list[Job]:
    """Every configuration validated as a sweep's Ray trial runs it (`base`, the command line's, was validated
    so when composed: config.compose.compose_sweep), and at each seed a job with its config_hash, the key of
    exactly-once: one pass, each configuration read once for all its seeds."""
    out = []
    for configuration, cfg in _configured(base, plan):
        words = tuple(configuration.override_strings())
        with _rejecting(plan, configuration):
            validate(cfg, trial=True)
        label, identities = seed_identities(cfg, plan.seeds, plan.name, base.sweep.axes)
        for seed, (key, name) in zip(plan.seeds, identities):
            out.append(Job(key, seed, name, configuration, words, label))
    return out


def prepare(cfg: DictConfig, plan: Plan, words: list[str]) -> Sweep:
    """The sweep of `plan` on the command line's configuration `cfg`: every configuration validated, every job
    identified (jobs). words: the command line as a trial composes with it (config.compose.trial_words), of
    which a trial keeps what neither the sweep nor the grid sets."""
    gridded = {key for c in plan.configurations for key in c.overrides} | {"seed"}
    keys = [(word, override_key(word)) for word in words]
    base = tuple(
        w for w, key in keys if key != "sweep" and not key.startswith("sweep.") and key not in gridded
    )
    return Sweep(cfg, plan, tuple(jobs(cfg, plan)), base)


def load(overrides: list[str]) -> Sweep:
    """A sweep's command line (python -m sweeper.sweep, sweeper.preflight) composed, expanded and validated,
    every job identified: every error here comes before Ray starts."""
    keys = command_line_keys(overrides)
    cfg, words = compose_sweep(overrides), trial_words(overrides)  # config.compose's two readings, at once
    plan = expand(cfg.sweep, keys)
    return prepare(cfg, plan, words)
