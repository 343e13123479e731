"""Hydra composition of conf/ on the schema, and the range checks types cannot express.

`validate` checks the ranges and the allowed names, which come from tasks/ and
models/ themselves. Every failure is one ConfigError naming the key, the value
and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any, Iterable

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from config.schema import (
    COMPILE_MODES,
    CONF_DIR,
    EVAL_CHECKPOINTS,
    PACK_MODES,
    RESUME_MODES,
    SCHEMAS,
    ConfigError,
)
from models.options import EMBEDDINGS, REGULARIZERS
from tasks.spec import TaskSpec


def compose(overrides: Iterable[str] = (), config_name: str = "config") -> DictConfig:
    """Compose conf/<config_name>.yaml with Hydra overrides, then validate it."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_explain(err, SCHEMAS[config_name])) from None
    if config_name == "analysis":
        validate_analysis(cfg)
        return cfg
    _no_sweep_to_none(cfg)
    validate(cfg)
    return cfg


def _no_sweep_to_none(cfg: DictConfig) -> None:
    """sweep=none (conf/sweep/none.yaml, no keys) composes to a SweepConfig of missing values: make it
    None."""
    sweep = cfg.sweep
    if sweep is None or not OmegaConf.is_missing(sweep, "name"):
        return
    given = [key for key in sweep if not OmegaConf.is_missing(sweep, key)]
    if given:
        raise ConfigError(
            f"sweep.{given[0]} is set but no sweep is chosen: add sweep=NAME "
            f"({', '.join(o for o in group_options('sweep') if o != 'none')})"
        )
    cfg.sweep = None


def group_options(group: str) -> list[str]:
    """The options of a config group: the file names of conf/<group>/."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def _explain(err: BaseException, schema: type) -> str:
    """One line out of Hydra's and OmegaConf's nested composition errors."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in err.missing_cfg_file:
        group, option = err.missing_cfg_file.rsplit("/", 1)
        return f"{group}={option} is not allowed: choose one of {', '.join(group_options(group))}"
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        key = cause.full_key
        if isinstance(cause, (ConfigKeyError, AttributeError)):
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            return f"unknown key {key!r}: allowed keys are {', '.join(_keys_of(schema, parent))}"
        kind = (
            type(cause.child_node).__name__.removesuffix("Node").lower()
            if cause.child_node is not None
            else ""
        )
        expected = _TYPE_WORDS.get(kind, str(cause.msg).splitlines()[0])
        return f"{key}={cause.value!r} is not allowed: {expected}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:3])


_TYPE_WORDS = {"integer": "an integer", "float": "a number", "boolean": "true or false", "string": "a string"}


def _keys_of(schema: type, parent: str) -> list[str]:
    """The schema's keys under `parent` ("" for the top), following the dataclasses' type hints."""
    node: Any = schema
    for name in filter(None, parent.split(".")):
        hints = typing.get_type_hints(node) if dataclasses.is_dataclass(node) else {}
        node = next((a for a in typing.get_args(hints.get(name)) if a is not type(None)), hints.get(name))
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def _require(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _one_of(key: str, value: object, choices: tuple[str, ...]) -> None:
    _require(value in choices, key, value, f"choose one of {', '.join(choices)}")


def _positive(key: str, value: float, allow_inf: bool = False) -> None:
    ok = value > 0 and (allow_inf or math.isfinite(value))
    _require(ok, key, value, "a number > 0" + ("" if allow_inf else ", finite"))


def _at_least(key: str, value: int, low: int) -> None:
    _require(value >= low, key, value, f"an integer >= {low}")


def _device(key: str, value: str) -> None:
    ok = re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", value) is not None
    _require(ok, key, value, "auto, cpu, cuda, cuda:N or mps")


def _tracking(cfg: DictConfig) -> None:
    _require(
        bool(cfg.tracking.uri), "tracking.uri", cfg.tracking.uri, "a tracking URI such as sqlite:///mlflow.db"
    )
    _require(
        bool(cfg.tracking.experiment), "tracking.experiment", cfg.tracking.experiment, "a non-empty name"
    )
    _positive("tracking.outage_s", cfg.tracking.outage_s)


def validate_analysis(cfg: DictConfig) -> None:
    """The report's and the claims' ranges (conf/analysis.yaml); figure names are checked by the report."""
    _tracking(cfg)
    e = cfg.eval
    for key in ("batches", "batch", "steps", "dissimilarity_tasks", "threads", "max_elements"):
        _at_least(f"eval.{key}", e[key], 1)
    _at_least("eval.surface_points", e.surface_points, 2)
    _positive("eval.surface_span", e.surface_span)
    _require(all(n >= 1 for n in e.lengths), "eval.lengths", list(e.lengths), "a list of integers >= 1")
    _device("eval.device", e.device)
    _one_of("eval.checkpoint", e.checkpoint, EVAL_CHECKPOINTS)


def validate(cfg: DictConfig) -> None:
    """Range and name checks the types cannot express; raises ConfigError."""
    try:
        TaskSpec(**OmegaConf.to_container(cfg.task))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    m, loss, opt, t, c = cfg.model, cfg.loss, cfg.optim, cfg.train, cfg.cluster
    _one_of("model.embedding", m.embedding, EMBEDDINGS)
    _positive("model.gamma", m.gamma, allow_inf=True)
    _require(0 <= m.dropout < 1, "model.dropout", m.dropout, "a number in [0, 1)")
    _at_least("model.qkv_mult", m.qkv_mult, 1)
    _one_of("loss.regularizer", loss.regularizer, REGULARIZERS)
    _positive("loss.tau", loss.tau)
    _positive("optim.lr", opt.lr)
    _require(0 < opt.lr_factor < 1, "optim.lr_factor", opt.lr_factor, "a number in (0, 1)")
    _at_least("optim.lr_patience", opt.lr_patience, 0)
    for key in ("steps", "batch", "eval_every", "val_batches", "log_every", "threads"):
        _at_least(f"train.{key}", t[key], 1)
    _device("train.device", t.device)
    _one_of("train.resume", t.resume, RESUME_MODES)
    _one_of("train.compile", t.compile, COMPILE_MODES)
    _require(
        t.compile != "cudagraphs" or t.device not in ("cpu", "mps"),
        "train.compile",
        t.compile,
        f"cudagraphs needs a CUDA device (train.device={t.device}): use inductor or off",
    )
    _require(0 <= cfg.seed < 2**63, "seed", cfg.seed, "an integer in [0, 2**63)")
    _tracking(cfg)
    _positive("cluster.cpus_per_trial", c.cpus_per_trial)
    _require(c.gpus_per_trial >= 0, "cluster.gpus_per_trial", c.gpus_per_trial, "a number >= 0")
    _require(
        c.max_concurrent is None or c.max_concurrent >= 1,
        "cluster.max_concurrent",
        c.max_concurrent,
        "null (no limit) or an integer >= 1",
    )
    _at_least("cluster.max_failures", c.max_failures, -1)
    _one_of("cluster.pack", c.pack, PACK_MODES)
    _at_least("cluster.pack_size", c.pack_size, 1)
    _at_least("cluster.report_every", c.report_every, 1)
