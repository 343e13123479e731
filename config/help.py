"""What a command line shows of the training configuration: `--cfg job`'s composed config and --help's
config groups (train and sweep; bench and rerun, whose own options argparse lists, show the config too).

cli.entry's `@command` answers both flags with the functions its command hands it: these, or analysis's
for report and claims (analysis.cli).
"""

from __future__ import annotations

from omegaconf import OmegaConf

from cli.credentials import masked
from config.compose import group_options
from config.grid import compose_one
from config.schema import RUN_GROUPS


def composed_config(words: list[str]) -> str:
    """The training config composed from the `key=value` words of the line (others, like bench's, skipped),
    at the chosen sweep's `fixed` values as `python -m sweeper.train` trains it."""
    return OmegaConf.to_yaml(masked(compose_one([w for w in words if "=" in w and not w.startswith("-")])))


def config_groups() -> str:
    """--help's list of the training config's groups and their options."""
    lines = [
        "Config groups (group=option picks a file of conf/<group>/, or of a --config-dir DIR searched first; "
        "any key is set as group.key=value):"
    ]
    lines += [f"  {g}: {', '.join(group_options(g))}" for g in (*RUN_GROUPS, "tracking", "cluster", "sweep")]
    lines.append(
        "Every key and its value: --cfg job; what each allows: docs/configuration.md of the source "
        "repository (a pip install has no docs/)."
    )
    return "\n".join(lines)
