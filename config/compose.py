"""Hydra composition of conf/ on the schema, with the user config directories, and the checks of the override
words themselves; what the types cannot express config.validate checks on every configuration composed.
Every failure is one ConfigError naming the key, the value and what is allowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, Iterable, Iterator

from hydra import compose as hydra_compose
from hydra import version
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException

from cli.credentials import mask
from cli.entry import CONFIG_DIR_ENV
from config import address
from config.schema import CONF_DIR, SCHEMAS, Config, ConfigError
from config.validate import validate, validate_analysis

# User config directories, searched before conf/ (a new sweep, a new option of a group, or a file that
# replaces conf/'s of the same name): `hydra.searchpath=[DIR, ...]` among the overrides (the form a sweep
# hands its trials), then $LEANER_CONFIG_DIR (directories joined by os.pathsep), where `--config-dir DIR` on
# a command line puts them for the command's life (cli.entry).
SEARCHPATH = "hydra.searchpath"
NO_SWEEP = "none"  # the sweep group's default: a single run, nothing to sweep
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"  # MLflow's, the default of tracking.experiment (conf/tracking)


def compose(
    overrides: Iterable[str] = (), config_name: str = "config", user_dirs: bool = True, trial: bool = False
) -> DictConfig:
    """Compose conf/<config_name>.yaml with Hydra overrides, then validate it (trial=True: as a sweep's Ray
    trials run it, `validate`); user_dirs=False: conf/ alone, without the user config directories nor the
    environment's tracking defaults (what conf/ itself says, e.g. of a sweep: the claims read it when
    imported, before a bad $MLFLOW_TRACKING_URI can be answered)."""
    if user_dirs:
        return _compose(list(overrides), config_name, user_config_dirs(overrides), trial)
    with _hidden(address.ENV, EXPERIMENT_ENV):
        cfg = _compose(list(overrides), config_name, [])
        OmegaConf.resolve(cfg)  # conf/tracking's ${oc.env:...} read while the variables are hidden
    return cfg


@contextlib.contextmanager
def _hidden(*names: str) -> Iterator[None]:
    """The environment without `names` for a moment, then as it was."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _compose(overrides: list[str], config_name: str, dirs: list[Path], trial: bool = False) -> DictConfig:
    _check_overrides(overrides, SCHEMAS[config_name])
    try:
        _initialize(dirs)
        cfg = hydra_compose(config_name=config_name, overrides=without_searchpath(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_explain(err, SCHEMAS[config_name], dirs)) from None
    except RecursionError:  # a user's file that names itself among its defaults (a new smoke.yaml on smoke)
        choices = " ".join(o for o in overrides if "=" in o and "." not in o.split("=", 1)[0])
        raise ConfigError(
            f"the defaults lists of {choices or config_name} (with the user config directories "
            f"{', '.join(map(str, dirs))}) include themselves: a file replacing conf/'s cannot extend it"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    if config_name == "analysis":
        validate_analysis(cfg)
        return cfg
    _no_sweep_to_none(cfg, dirs)
    try:
        validate(cfg, trial)
    except InterpolationResolutionError as err:  # read only now: ${oc.env:NAME} of a variable not set
        raise ConfigError(_explain(err, SCHEMAS[config_name], dirs)) from None
    return cfg


def _initialize(dirs: list[Path]) -> None:
    """Hydra's initialize_config_dir(CONF_DIR) with the user's directories before conf/ (Hydra's own
    hydra.searchpath and --config-dir search theirs after it, so they could add files but replace none)."""
    GlobalHydra.instance().clear()
    version.setbase(None)
    search_path = create_config_search_path(str(CONF_DIR))
    for path in dirs:  # each before conf/ ("main"), in the order given
        search_path.prepend("leaner user config", f"file://{path}", anchor="main")
    Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)


def user_config_dirs(overrides: Iterable[str] = ()) -> list[Path]:
    """The user config directories, absolute, first searched first: those of `hydra.searchpath=[...]`
    overrides, then $LEANER_CONFIG_DIR's; raises ConfigError for one that is not a directory."""
    given = [
        (SEARCHPATH, entry) for o in overrides if o.split("=", 1)[0] == SEARCHPATH for entry in _entries(o)
    ]
    given += [(CONFIG_DIR_ENV, v) for v in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if v]
    dirs: list[Path] = []
    for source, entry in given:
        path = Path(entry.removeprefix("file://")).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(
                f"{source}={entry!r} is not allowed: an existing directory laid out like conf/ "
                "(sweep/NAME.yaml, ...)"
            )
        if path not in dirs:
            dirs.append(path)
    return dirs


def _entries(override: str) -> list[str]:
    """The directories of one `hydra.searchpath=[DIR, ...]` (or `=DIR`) override."""
    try:
        value = OverridesParser.create().parse_override(override).value()
    except HydraException as err:
        raise ConfigError(_explain(err, SCHEMAS["config"], [])) from None
    entries = value if isinstance(value, list) else [value]
    if not all(isinstance(e, str) and e for e in entries):
        raise ConfigError(f"{SEARCHPATH}={value!r} is not allowed: a list of directories: [DIR, ...]")
    return entries


def without_searchpath(overrides: Iterable[str]) -> list[str]:
    return [o for o in overrides if o.split("=", 1)[0] != SEARCHPATH]


def searchpath_override(dirs: Iterable[Path]) -> list[str]:
    """The one override that gives a later compose (a sweep's trial, wherever it runs) these directories."""
    dirs = list(dirs)
    return [f"{SEARCHPATH}=[{','.join(repr(str(d)) for d in dirs)}]"] if dirs else []


def trial_words(overrides: list[str]) -> list[str]:
    """The command line as a sweep's trial composes with it: the user config directories as one override of
    absolute paths (a trial's worker has another working directory, and on a cluster not the driver's
    environment), then the other overrides, of which config.grid.prepare keeps what the grid does not set.
    Their credentials are masked: a trial never opens the store, and Ray keeps what it is handed."""
    return searchpath_override(user_config_dirs(overrides)) + [mask(o) for o in without_searchpath(overrides)]


def _no_sweep_to_none(cfg: DictConfig, dirs: list[Path]) -> None:
    """sweep=none (conf/sweep/none.yaml, no keys) composes to a SweepConfig of missing values: make it
    None."""
    sweep = cfg.sweep
    if sweep is None or not OmegaConf.is_missing(sweep, "name"):
        return
    given = [key for key in sweep if not OmegaConf.is_missing(sweep, key)]
    if given:
        raise ConfigError(
            f"sweep.{given[0]} is set but no sweep is chosen: add sweep=NAME ({', '.join(sweep_names(dirs))})"
        )
    cfg.sweep = None


def group_options(group: str, dirs: Iterable[Path] | None = None) -> list[str]:
    """The options of a config group: the file names of <dir>/<group>/ in the user config directories
    (`dirs`; by default $LEANER_CONFIG_DIR's) and conf/."""
    dirs = user_config_dirs() if dirs is None else dirs
    return sorted({path.stem for d in [*dirs, CONF_DIR] for path in (d / group).glob("*.yaml")})


def sweep_names(dirs: Iterable[Path] | None = None) -> list[str]:
    """The sweeps of conf/sweep/ and of the user config directories `dirs` (as group_options')."""
    return [name for name in group_options("sweep", dirs) if name != NO_SWEEP]


def compose_sweep(overrides: list[str]) -> DictConfig:
    """A sweep's configuration (sweep=NAME among the overrides), validated as its Ray trials run it; the
    grid of its sweep group is config.grid's to expand."""
    check_spacing(overrides)  # `sweep = smoke` is a spacing mistake, not a missing sweep
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("sweep=")]
    names = sweep_names(user_config_dirs(overrides))
    if not chosen or chosen[-1] not in names:
        got = f"sweep={chosen[-1]} is not a sweep" if chosen else "no sweep chosen"
        raise ConfigError(
            f"{got}: choose sweep=NAME with NAME one of {', '.join(names)} "
            "(conf/sweep/, or sweep/NAME.yaml of a --config-dir)"
        )
    return compose(overrides, trial=True)


def _explain(err: BaseException, schema: type, dirs: list[Path]) -> str:
    """One line out of Hydra's and OmegaConf's nested composition errors."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in err.missing_cfg_file:
        group, option = err.missing_cfg_file.rsplit("/", 1)
        return f"{group}={option} is not allowed: choose one of {', '.join(group_options(group, dirs))}"
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    if isinstance(cause, InterpolationResolutionError):
        return f"{cause.full_key} cannot be read: {str(cause.msg).splitlines()[0]}"
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        key = cause.full_key
        if isinstance(cause, (ConfigKeyError, AttributeError)):
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            return _unknown_key(schema, key, parent)
        kind = (
            type(cause.child_node).__name__.removesuffix("Node").lower()
            if cause.child_node is not None
            else ""
        )
        if typing.get_origin(_schema_type(schema, key)) is list and not isinstance(cause.value, list):
            return f"{key}={cause.value!r} is not allowed: a list, in brackets: {_as_list(key, cause.value)}"
        expected = _TYPE_WORDS.get(kind, str(cause.msg).splitlines()[0])
        return f"{key}={cause.value!r} is not allowed: {expected}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:3])


_TYPE_WORDS = {"integer": "an integer", "float": "a number", "boolean": "true or false", "string": "a string"}


def _as_list(key: str, value: object) -> str:
    """The list a scalar was likely meant as: `sweep.seeds=3` reads as three seeds as much as the seed 3."""
    if key.endswith("seeds") and isinstance(value, int) and not isinstance(value, bool) and 1 < value <= 10:
        many = ",".join(str(i) for i in range(value))
        return f"{key}=[{many}] for {value} seeds ({key}=[{value}] is the one seed {value})"
    return f"{key}=[{value}]"


def _unknown_key(schema: type, key: str, parent: str) -> str:
    """'unknown key 'lr': did you mean optim.lr? allowed keys are ...' (the keys under `parent`); beneath a
    mapping of the user's own keys (sweep.axes, sweep.search.space), how to add one."""
    if typing.get_origin(_schema_type(schema, parent)) is dict:
        return f"unknown key {key!r}: {parent} holds keys of your own; add one with +{key}=..."
    found = [k for k in keys_named(key.rsplit(".", 1)[-1], schema) if k != key]
    hint = f"did you mean {' or '.join(found)}? " if found else ""
    return f"unknown key {key!r}: {hint}allowed keys are {', '.join(_keys_of(schema, parent))}"


def keys_named(name: str, schema: type = Config) -> list[str]:
    """The run configuration's dotted keys whose last part is `name`: keys_named("lr") == ["optim.lr"]."""
    return [k for k in _leaf_keys(schema) if k.rsplit(".", 1)[-1] == name]


def _leaf_keys(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key of the schema's dataclasses, depth first."""
    if not dataclasses.is_dataclass(node):
        return []
    keys = []
    for name, hint in typing.get_type_hints(node).items():
        inner = _leaf_keys(_unwrap(hint), f"{prefix}{name}.")
        keys += inner or [f"{prefix}{name}"]
    return keys


def _check_overrides(overrides: list[str], schema: type) -> None:
    """Refuse what Hydra would take silently or fail on with a traceback: a key the schema does not have
    added with + or ++ (or Hydra's own hydra.*, which no command reads), a key added under no chosen sweep,
    a word without a key, and a boolean set to anything but true or false (OmegaConf reads 2, 0, yes and on
    as booleans)."""
    check_spacing(overrides)
    parser = OverridesParser.create()
    for word in overrides:
        try:
            override = parser.parse_override(word)
        except HydraException:
            _check_quoting(parser, word)
            continue  # compose reports Hydra's own parse error, in one line
        key = override.key_or_group
        if not key:
            raise ConfigError(f"{word!r} is not an override: write key=value")
        if key == SEARCHPATH:
            continue
        kind = _schema_type(schema, key)
        adds = override.is_add() or override.is_force_add()
        if kind is None and (adds or key.startswith("hydra.")):
            known = (
                key.rsplit(".", 1)[0] if "." in key and _schema_type(schema, key.rsplit(".", 1)[0]) else ""
            )
            raise ConfigError(_unknown_key(schema, key, known))
        if adds and key.startswith("sweep.") and not _sweep_chosen(overrides):
            raise ConfigError(f"{key} is set but no sweep is chosen: add sweep=NAME")
        if kind is bool and not override.is_delete() and not isinstance(override.value(), bool):
            raise ConfigError(f"{key}={override.value()!r} is not allowed: true or false")


def _check_quoting(parser: OverridesParser, word: str) -> None:
    """A value with an `=` of its own (a database address through a socket: postgresql://USER@/DB?host=/tmp)
    reads once quoted: say so, rather than Hydra's "mismatched input '='"."""
    key, _, value = word.partition("=")
    if not key or "=" not in value or value[0] in "'\"[{(" or "'" in value:
        return
    try:
        parser.parse_override(f"{key}='{value}'")
    except HydraException:
        return
    raise ConfigError(
        f"{word!r}: the value of {key} holds an '=', which the override grammar reads as its own: "
        f"quote it, {key}='{value}' (in a shell: \"{key}='{value}'\")"
    )


def check_spacing(words: list[str]) -> None:
    """Refuse an override the shell split at spaces around its `=` (`sweep = smoke`, `sweep =smoke`,
    `sweep= smoke`), naming the one word it should be: the parts alone read as a stray `=`, a key without
    a value and a word that is no override."""
    for i, word in enumerate(words):
        before, after = words[i - 1] if i else "", words[i + 1] if i + 1 < len(words) else ""
        if word == "=" and before and after and "=" not in before:
            parts = [before, word, after]
        elif word.startswith("=") and word != "=" and before and "=" not in before:
            parts = [before, word]
        elif word.endswith("=") and word.count("=") == 1 and after and "=" not in after:
            parts = [word, after]
        else:
            continue
        raise ConfigError(
            f"{' '.join(parts)!r}: the shell split one override at the spaces around its '=' into "
            f"{len(parts)} words; write {''.join(parts)} (no spaces; quote a value that has some: key='a b')"
        )


def _sweep_chosen(overrides: list[str]) -> bool:
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("sweep=")]
    return bool(chosen) and chosen[-1] != NO_SWEEP


_OPEN = object()  # the type of a key beneath a dict field (sweep.fixed, sweep.axes): any key is allowed


def _schema_type(schema: type, key: str) -> Any:
    """The type of `key` in the schema (Optional[T] as T); _OPEN beneath a dict field; None: no such key."""
    node: Any = schema
    for name in key.split("."):
        if typing.get_origin(node) is dict:
            return _OPEN
        hints = typing.get_type_hints(node) if dataclasses.is_dataclass(node) else {}
        if name not in hints:
            return None
        node = _unwrap(hints[name])
    return node


def _unwrap(hint: Any) -> Any:
    """Optional[T] as T; any other hint as it is."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def _keys_of(schema: type, parent: str) -> list[str]:
    """The schema's keys under `parent` ("" for the top), following the dataclasses' type hints."""
    node: Any = schema
    for name in filter(None, parent.split(".")):
        hints = typing.get_type_hints(node) if dataclasses.is_dataclass(node) else {}
        node = next((a for a in typing.get_args(hints.get(name)) if a is not type(None)), hints.get(name))
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []
