"""A run as training takes it: its validated configuration and what identifies it, derived once.

Everything that names or records a run (its key, the config a checkpoint holds, its name, params and the
tags that say where it ran) comes from the whole configuration; RunSpec holds them, so that training, its
checkpoints and its tags read one description instead of each deriving its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from config.identity import (
    config_hash,
    configuration_name,
    flat_params,
    operational_values,
    run_config,
    run_name,
)
from config.validate import validate


@dataclass(frozen=True)
class RunSpec:
    """One run: `cfg`, the values it trains with, and its identity (config.identity), read only."""

    cfg: DictConfig
    key: str  # config_hash: the run's identity, seed included
    config: dict  # run_config: what its checkpoints hold, and must match to resume
    name: str  # run_name of a run outside a sweep (a sweep's driver names its runs itself)
    params: dict[str, str]  # flat_params: its MLflow params
    configuration: str  # configuration_name: seed-free, its `configuration` tag
    operational: dict[str, str]  # operational_values: where and how it runs and records, as tags

    @classmethod
    def of(cls, cfg: DictConfig) -> RunSpec:
        """Validate `cfg` (ConfigError) and derive the run's identity from it, once."""
        validate(cfg)
        return cls(
            cfg,
            config_hash(cfg),
            run_config(cfg),
            run_name(cfg),
            flat_params(cfg),
            configuration_name(cfg),
            operational_values(cfg),
        )
