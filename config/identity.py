"""What identifies a run: the values that determine its numbers, their hashes, names and flat params."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Iterable, Mapping

from omegaconf import DictConfig, OmegaConf

from cli.credentials import mask
from config.defaults import default
from config.schema import ADDED_TRAIN_KEYS, OPERATIONAL_TRAIN_KEYS, RETIRED_TRAIN_KEYS, RUN_GROUPS
from models.options import EMBEDDINGS, REGULARIZERS


def run_config(cfg: DictConfig) -> dict:
    """Everything that determines a run's numbers: task, model, loss, optim, train, seed.

    A key added since runs were recorded is left out at the value those runs had (ADDED_TRAIN_KEYS).
    """
    out = {group: OmegaConf.to_container(cfg[group], resolve=True) for group in RUN_GROUPS}
    for key in OPERATIONAL_TRAIN_KEYS:
        out["train"].pop(key)
    for key, earlier in ADDED_TRAIN_KEYS.items():
        if out["train"][key] == earlier:
            del out["train"][key]
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


# The axes a name spells only away from their defaults (conf/'s), each varied in one sub-grid of the paper's.
UNSPELT = {key: default(key) for key in ("task.family", "optim.lr")}
# The keys readable() always spells, or away from their defaults: a sweep's other axes follow as NAMEVALUE.
SPELT = ("model.embedding", "loss.regularizer", "loss.tau", "task.d", "task.k", "task.n", *UNSPELT)


def readable(cfg: DictConfig, axes: Mapping[str, str] | None = None) -> str:
    """The paper's axes of a configuration in a few characters, e.g. 'BN-L2 tau0.1 d32 k10 n512', then the
    other axes its sweep declares (its name and value: 'gamma0.5', 'steps4000'): `axes`, else cfg.sweep's.

    The family and the learning rate appear only away from their defaults (normal, 0.01: '... cauchy lr0.1').
    """
    t, loss = cfg.task, cfg.loss
    words = [
        f"{EMBEDDINGS.get(cfg.model.embedding, cfg.model.embedding)}-"
        f"{REGULARIZERS.get(loss.regularizer, loss.regularizer)}",
        f"tau{loss.tau:g}",
        f"d{t.d}",
        f"k{t.k}",
        f"n{t.n}",
    ]
    if t.family != UNSPELT["task.family"]:
        words.append(str(t.family))
    if cfg.optim.lr != UNSPELT["optim.lr"]:
        words.append(f"lr{cfg.optim.lr:g}")
    return " ".join(words + _other_axes(cfg, axes))


def _other_axes(cfg: DictConfig, axes: Mapping[str, str] | None) -> list[str]:
    """'gamma0.5' for each axis of the run's sweep (name -> key) that readable's words leave out, so that two
    configurations of a user's sweep never share a name."""
    if axes is None:
        axes = (cfg.get("sweep") or {}).get("axes") or {}
    return [f"{name}{_word(OmegaConf.select(cfg, key))}" for name, key in axes.items() if key not in SPELT]


def _word(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else format_value(value)


def configuration_name(cfg: DictConfig, axes: Mapping[str, str] | None = None) -> str:
    """Seed-free and distinct per configuration, e.g. 'BN-L2 tau0.1 d32 k10 n512 #1a2b3c'.

    The paper's axes (readable) and 6 hex digits of configuration_hash, which tell apart configurations
    that differ only elsewhere (steps, scale, ...): demo, smoke and paper runs. The hash comes last, so a
    cut-off label in the MLflow UI still shows the axes.
    """
    return f"{readable(cfg, axes)} #{configuration_hash(cfg)[:6]}"


def run_name(cfg: DictConfig, sweep: str | None = None) -> str:
    """The axes and the seed, e.g. 'BN-L2 tau0.1 d32 k10 n512 s153476998': distinct among a sweep's runs
    (its grid varies the axes a name spells); ' train' follows for a run outside a sweep (sweeper.train,
    sweeper.rerun). The sweep's name is the run's `sweep` tag and its parent row; the full configuration is
    in its params and its `configuration` tag."""
    return _named(readable(cfg), cfg.seed, sweep)


def _named(axes: str, seed: int, sweep: str | None) -> str:
    return f"{axes} s{seed}" if sweep else f"{axes} s{seed} train"


def seed_identities(
    cfg: DictConfig, seeds: Iterable[int], sweep: str, axes: Mapping[str, str]
) -> tuple[str, list[tuple[str, str]]]:
    """configuration_name of `cfg`, and its config_hash and run_name at each of `seeds`, its configuration
    read once: a sweep's jobs are each configuration at every seed of the sweep (config.grid.jobs; `axes`:
    the sweep's)."""
    config, words = run_config(cfg), readable(cfg, axes)
    out = []
    for seed in seeds:
        config["seed"] = seed
        out.append((_digest(config), _named(words, seed, sweep)))
    del config["seed"]
    return f"{words} #{_digest(config)[:6]}", out


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
    out = _formatted({group: OmegaConf.to_container(cfg[group], resolve=True) for group in RUN_GROUPS})
    for key in OPERATIONAL_TRAIN_KEYS:
        out.pop(f"train.{key}")
    return {**out, "seed": format_value(cfg.seed)}


def operational_values(cfg: DictConfig) -> dict[str, str]:
    """Where and how a run executes and records (tracking.*, cluster.*, train.device/resume/workdir), with
    dotted keys: a run carries them as tags, so that with its params it holds every config value
    (docs/science.md section 8)."""
    out = _formatted(
        {group: OmegaConf.to_container(cfg[group], resolve=True) for group in ("tracking", "cluster")}
    )
    out = {key: mask(value) for key, value in out.items()}  # tags are records: no credential in them
    return {**out, **{f"train.{key}": format_value(cfg.train[key]) for key in OPERATIONAL_TRAIN_KEYS}}


def _formatted(groups: dict[str, dict]) -> dict[str, str]:
    """{group: {key: value}} (the schema's groups hold no nested ones) as {"group.key": override text}."""
    return {
        f"{group}.{key}": format_value(value)
        for group, values in groups.items()
        for key, value in values.items()
    }


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
