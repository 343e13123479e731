"""The configuration of a run: Hydra composition of conf/, typed and validated.

The dataclasses below are the schema (types only); every default value lives
in the YAML files under conf/. `compose` merges the YAML on the schema, so an
unknown key or a wrongly typed value fails there, and `validate` checks the
ranges and the allowed names, which come from tasks/ and models/ themselves.
Every failure is one ConfigError naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from models.embedding import EMBEDDINGS
from models.losses import REGULARIZERS
from tasks.sampler import TaskSpec

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
RESUME_MODES = ("auto", "never", "must")
COMPILE_MODES = ("off", "inductor", "cudagraphs", "aot_eager")  # train.compile; see training.loop.compiled
PACK_MODES = ("none", "seeds")  # cluster.pack: one model per sweep trial, or the seeds of a configuration together
# Keys of `train` that say how and where a run executes, not what it computes:
# they stay out of run_config and config_hash, so a resumed run (say with
# train.resume=must) keeps its hash and finds its own checkpoint.
OPERATIONAL_TRAIN_KEYS = ("device", "resume", "workdir")
# train.* keys since removed from the schema, with the one value every run recorded: hashed as if still
# there, so runs recorded before keep their config_hash (the sweep's ledger, reruns), and skipped when a
# configuration is rebuilt from a run's params.
RETIRED_TRAIN_KEYS = {"inject_nan_at_step": None}
RUN_GROUPS = ("task", "model", "loss", "optim", "train")


class ConfigError(ValueError):
    """A rejected configuration; the message names key, value and what is allowed."""


# The schema: one dataclass per config group, keys and types only. They look alike on purpose (the
# `duplicates` tool pairs them by shape): each mirrors one conf/ group, and their defaults live in the YAML.
@dataclass
class TaskConfig:
    family: str = MISSING
    n: int = MISSING
    d: int = MISSING
    k: int = MISSING
    scale: float = MISSING
    equal_weights: bool = MISSING
    equal_scales: bool = MISSING
    init: str = MISSING


@dataclass
class ModelConfig:
    embedding: str = MISSING
    gamma: float = MISSING
    dropout: float = MISSING
    qkv_mult: int = MISSING


@dataclass
class LossConfig:
    regularizer: str = MISSING
    tau: float = MISSING


@dataclass
class OptimConfig:
    lr: float = MISSING
    lr_factor: float = MISSING
    lr_patience: int = MISSING


@dataclass
class TrainConfig:
    steps: int = MISSING
    batch: int = MISSING
    eval_every: int = MISSING
    val_batches: int = MISSING
    log_every: int = MISSING
    threads: int = MISSING
    compile: str = MISSING
    device: str = MISSING
    resume: str = MISSING
    workdir: str = MISSING


@dataclass
class TrackingConfig:
    uri: str = MISSING
    experiment: str = MISSING
    outage_s: float = MISSING


@dataclass
class ClusterConfig:
    address: Optional[str] = MISSING
    cpus_per_trial: float = MISSING
    gpus_per_trial: float = MISSING
    max_concurrent: Optional[int] = MISSING
    storage: Optional[str] = MISSING
    max_failures: int = MISSING
    dashboard_host: str = MISSING
    pack: str = MISSING


@dataclass
class SweepConfig:
    """The keys of a sweep (conf/sweep/*.yaml); sweeper.grid checks what types cannot."""

    name: str = MISSING
    dry_run: bool = MISSING
    scheduler: str = MISSING
    axes: Dict[str, str] = MISSING
    baseline: Dict[str, Any] = MISSING
    seeds: List[Any] = MISSING
    fixed: Dict[str, Any] = MISSING
    subgrids: List[Any] = MISSING


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    seed: int = MISSING
    sweep: Optional[SweepConfig] = None  # conf/sweep/; `none` (no keys) for a single run


ConfigStore.instance().store(name="schema", node=Config)


def compose(overrides: Iterable[str] = (), config_name: str = "config") -> DictConfig:
    """Compose conf/<config_name>.yaml with Hydra overrides, then validate it."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_explain(err)) from None
    _no_sweep_to_none(cfg)
    validate(cfg)
    return cfg


def _no_sweep_to_none(cfg: DictConfig) -> None:
    """sweep=none (conf/sweep/none.yaml, no keys) composes to a SweepConfig of missing values: make it None."""
    sweep = cfg.sweep
    if sweep is None or not OmegaConf.is_missing(sweep, "name"):
        return
    given = [key for key in sweep if not OmegaConf.is_missing(sweep, key)]
    if given:
        raise ConfigError(f"sweep.{given[0]} is set but no sweep is chosen: add sweep=NAME "
                          f"({', '.join(o for o in group_options('sweep') if o != 'none')})")
    cfg.sweep = None


def group_options(group: str) -> list[str]:
    """The options of a config group: the file names of conf/<group>/."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def _explain(err: BaseException) -> str:
    """One line out of Hydra's and OmegaConf's nested composition errors."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in err.missing_cfg_file:
        group, option = err.missing_cfg_file.rsplit("/", 1)
        return f"{group}={option} is not allowed: choose one of {', '.join(group_options(group))}"
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        key = cause.full_key
        if isinstance(cause, (ConfigKeyError, AttributeError)):
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            return f"unknown key {key!r}: allowed keys are {', '.join(_keys_of(parent))}"
        kind = type(cause.child_node).__name__.removesuffix("Node").lower() if cause.child_node is not None else ""
        expected = _TYPE_WORDS.get(kind, str(cause.msg).splitlines()[0])
        return f"{key}={cause.value!r} is not allowed: {expected}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:3])


_TYPE_WORDS = {"integer": "an integer", "float": "a number", "boolean": "true or false", "string": "a string"}


def _keys_of(parent: str) -> list[str]:
    """The schema's keys under `parent` ("" for the top), following the dataclasses' type hints."""
    node: Any = Config
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
    _require(re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", t.device) is not None, "train.device", t.device,
             "auto, cpu, cuda, cuda:N or mps")
    _one_of("train.resume", t.resume, RESUME_MODES)
    _one_of("train.compile", t.compile, COMPILE_MODES)
    _require(t.compile != "cudagraphs" or t.device not in ("cpu", "mps"), "train.compile", t.compile,
             f"cudagraphs needs a CUDA device (train.device={t.device}): use inductor or off")
    _require(0 <= cfg.seed < 2**63, "seed", cfg.seed, "an integer in [0, 2**63)")
    _require(bool(cfg.tracking.uri), "tracking.uri", cfg.tracking.uri, "a tracking URI such as sqlite:///mlflow.db")
    _require(bool(cfg.tracking.experiment), "tracking.experiment", cfg.tracking.experiment, "a non-empty name")
    _positive("tracking.outage_s", cfg.tracking.outage_s)
    _positive("cluster.cpus_per_trial", c.cpus_per_trial)
    _require(c.gpus_per_trial >= 0, "cluster.gpus_per_trial", c.gpus_per_trial, "a number >= 0")
    _require(c.max_concurrent is None or c.max_concurrent >= 1, "cluster.max_concurrent", c.max_concurrent,
             "null (no limit) or an integer >= 1")
    _at_least("cluster.max_failures", c.max_failures, -1)
    _one_of("cluster.pack", c.pack, PACK_MODES)


def run_config(cfg: DictConfig) -> dict:
    """Everything that determines a run's numbers: task, model, loss, optim, train, seed."""
    out = {group: OmegaConf.to_container(cfg[group], resolve=True) for group in RUN_GROUPS}
    for key in OPERATIONAL_TRAIN_KEYS:
        out["train"].pop(key)
    out["seed"] = int(cfg.seed)
    return out


def config_hash(cfg: DictConfig) -> str:
    """Same configuration and seed, same hash (16 hex digits)."""
    return _digest(run_config(cfg))


def configuration_hash(cfg: DictConfig) -> str:
    """config_hash without the seed: one value for all the seeds of a configuration (16 hex digits)."""
    config = run_config(cfg)
    del config["seed"]
    return _digest(config)


def _digest(config: dict) -> str:
    config["train"].update(RETIRED_TRAIN_KEYS)
    text = json.dumps(config, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def configuration_name(cfg: DictConfig) -> str:
    """Readable and seed-free, e.g. tau0.1-l2-binary-d32-k10-n512-normal-lr0.01-1a2b3c4d.

    The paper's axes spell it; the last part, 8 digits of configuration_hash, tells apart
    configurations that differ only elsewhere (steps, scale, ...): demo, smoke and paper runs.
    """
    t, m, loss, opt = cfg.task, cfg.model, cfg.loss, cfg.optim
    return (f"tau{loss.tau:g}-{loss.regularizer}-{m.embedding}-d{t.d}-k{t.k}-n{t.n}-{t.family}"
            f"-lr{opt.lr:g}-{configuration_hash(cfg)[:8]}")


def run_name(cfg: DictConfig, sweep: str | None = None) -> str:
    """SWEEP/CONFIGURATION/sSEED, unique in an experiment (a sweep trains a configuration and seed once);
    a run outside a sweep is train/CONFIGURATION/sSEED/ followed by its start time."""
    name = f"{configuration_name(cfg)}/s{cfg.seed}"
    return f"{sweep}/{name}" if sweep else f"train/{name}/{time.strftime('%Y%m%d-%H%M%S')}"


def format_value(value: object) -> str:
    """A config value as text that a Hydra override parses back to the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def flat_params(cfg: DictConfig) -> dict[str, str]:
    """Every resolved value that determines the run's numbers, with dotted keys: the MLflow params.

    Where and how a run executes and records (operational_values) and the sweep group are left out:
    they are no part of the configuration.
    """
    out = _flat({group: OmegaConf.to_container(cfg[group], resolve=True) for group in RUN_GROUPS})
    for key in OPERATIONAL_TRAIN_KEYS:
        out.pop(f"train.{key}")
    return {**out, "seed": format_value(cfg.seed)}


def operational_values(cfg: DictConfig) -> dict[str, str]:
    """Where and how a run executes and records (tracking.*, cluster.*, train.device/resume/workdir), with
    dotted keys: a run carries them as tags, so that with its params it holds every config value (SPEC 8)."""
    out = _flat({group: OmegaConf.to_container(cfg[group], resolve=True) for group in ("tracking", "cluster")})
    out["tracking.uri"] = re.sub(r"//[^/@]*@", "//", out["tracking.uri"])  # no user:password@ in a tag
    return {**out, **{f"train.{key}": format_value(cfg.train[key]) for key in OPERATIONAL_TRAIN_KEYS}}


def _flat(tree: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, child in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(_flat(child, name) if isinstance(child, dict) else {name: format_value(child)})
    return out


def run_overrides(params: dict[str, str]) -> list[str]:
    """Hydra overrides that rebuild a run's configuration from its flat params."""
    wanted = {f"{group}." for group in RUN_GROUPS}
    skip = {f"train.{key}" for key in (*OPERATIONAL_TRAIN_KEYS, *RETIRED_TRAIN_KEYS)}
    keys = [k for k in params if (k == "seed" or k[: k.find(".") + 1] in wanted) and k not in skip]
    return [f"{key}={_quote(params[key])}" for key in sorted(keys)]


def _quote(text: str) -> str:
    """Quote strings so URIs, 'kmeans++' and the like survive Hydra's override parser."""
    if text == "null" or re.fullmatch(r"-?[\d.eE+-]+|true|false|-?inf|nan", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
