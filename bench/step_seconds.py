"""`python -m bench step_seconds sweep=NAME`: seconds per training step (a pack of one,
bench.common.pack_step) of each shape of a sweep's onehot and binary models, the x axis of the report's
time_to_quality figure.

The models of its `compute` sub-grid (all its configurations when it has none, as the figure picks runs),
one per training shape (SHAPE_KEYS: the step time depends on those, not on seeds, tau or the
regularizer), each a fresh model at its configuration, timed round robin on train.device with the
configuration's train.threads (or --threads). The report reads the JSON this writes (`step_json=FILE`).
"""

from __future__ import annotations

import statistics
import sys

import torch
from omegaconf import DictConfig

from bench.common import alternate, log, pack_step
from bench.line import Timing, print_json, timing
from cli.entry import command
from config.compose import compose
from config.grid import expand
from config.help import composed_config
from config.schema import ConfigError
from training.device import pick_device

SHAPE_KEYS = ("task.n", "task.d", "task.k", "model.embedding", "model.qkv_mult", "train.batch")
EMBEDDINGS = ("onehot", "binary")  # the two the figure compares
SUBGRID = "compute"
ABOUT = "seconds per training step of a sweep's onehot/binary shapes (bench/step_seconds.py)"


@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    line = parse(argv)
    print_json(bench_step_seconds(line.overrides, line.repeats, line.threads), line.out)
    return 0


def parse(argv: list[str]) -> Timing:
    """The options, and the config overrides each configuration of the sweep is composed with; without
    --threads, the configuration's train.threads."""
    return timing("step_seconds", ABOUT, argv)


def bench_step_seconds(overrides: list[str], repeats: int, threads: int | None) -> dict:
    """Median seconds per training step of each shape (after one warm-up step), timed alternately."""
    sweep, configs = shapes(overrides)
    device = pick_device(configs[0].train.device)
    torch.set_num_threads(threads or configs[0].train.threads)
    steps = {}
    for cfg in configs:
        name = " ".join(f"{k.split('.')[1]}={_value(cfg, k)}" for k in SHAPE_KEYS)
        steps[name] = (cfg, pack_step([cfg], device))
    log(f"step_seconds: {len(steps)} shapes on {device}, {torch.get_num_threads()} threads, {repeats} rounds")
    times = alternate({name: step for name, (_, step) in steps.items()}, repeats, device)
    rows = [
        {
            "config": {key: _value(cfg, key) for key in SHAPE_KEYS},
            "seconds_per_step": statistics.median(times[name]),
        }
        for name, (cfg, _) in steps.items()
    ]
    return {
        "command": "step_seconds",
        "sweep": sweep,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "rounds": repeats,
        "rows": rows,
    }


def shapes(overrides: list[str]) -> tuple[str, list[DictConfig]]:
    """The sweep's name, and one configuration (composed with the overrides but sweep=) per training shape of
    its onehot/binary models."""
    base = [o for o in overrides if not o.startswith("sweep=")]
    sweep = compose(overrides).sweep
    if sweep is None:
        raise ConfigError("bench step_seconds: choose the sweep whose models to time, e.g. sweep=lite")
    plan = expand(sweep)
    chosen = [c for c in plan.configurations if SUBGRID in c.subgrids] or list(plan.configurations)
    out: dict[tuple, DictConfig] = {}
    for configuration in chosen:
        cfg = compose(base + configuration.override_strings())
        if cfg.model.embedding in EMBEDDINGS:
            out.setdefault(tuple(_value(cfg, key) for key in SHAPE_KEYS), cfg)
    return sweep.name, list(out.values())


def _value(cfg: DictConfig, key: str) -> object:
    group, name = key.split(".")
    return cfg[group][name]


if __name__ == "__main__":
    sys.exit(main())
