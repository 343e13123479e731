"""The value conf/ gives a key when nothing overrides it: conf/config.yaml's defaults list chooses each
group's file (task: paper, conf/task/paper.yaml), and that file holds the key's value.

Read with OmegaConf alone, neither through Hydra nor from the user's config directories: which values a run's
name leaves out (config.identity) and which models the probes pick (analysis.context) are then the same in
every process, and reading a few small files at import costs next to nothing.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from config.schema import CONF_DIR


@cache
def chosen_options() -> dict[str, str]:
    """Config group -> its default option, from conf/config.yaml's defaults list."""
    entries = OmegaConf.load(CONF_DIR / "config.yaml").defaults
    return {k: str(v) for e in entries if OmegaConf.is_dict(e) for k, v in e.items()}


def group_file(group: str) -> Path:
    """The file of a group's default option, e.g. conf/task/paper.yaml."""
    return CONF_DIR / group / f"{chosen_options()[group]}.yaml"


@cache
def _values(group: str) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(group_file(group)))  # type: ignore[return-value]


def default(key: str) -> Any:
    """The default of a dotted key of a config group, e.g. default("task.family") == "normal"."""
    group, name = key.split(".", 1)
    return _values(group)[name]
