"""A sweep's cost preview, printed before it starts and by its dry run: its model-steps and, at the step
times `python -m bench step_seconds` measured (cluster.step_seconds=FILE, its JSON), the device-hours they
need and, at a price per device-hour (cluster.price_per_gpu_hour, or cluster.price_per_core_hour for step
times measured on a CPU), their cost.

The hours are those of one model at a time on the measured device (a pack of one, as the benchmark times
it): an upper bound where packs and shared GPUs train faster (docs/cluster.md "The arithmetic", `python -m
bench pack`). Models whose shape the file has no time for are counted apart, not guessed.

The command line (sweeper.sweep) reckons it once (reckon) and hands the Cost on: the preview it prints, the
ETA and the guard's size (sweeper.driver.confirm), and on a cluster the preflight's budget and cost rows
(sweeper.preflight).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from config.grid import Configuration, Plan
from config.schema import ConfigError


@dataclass(frozen=True)
class Estimate:
    """The sweep's model-steps priced at the measured step times (cluster.step_seconds): what the preview
    prints, and what the preflight (sweeper.preflight) weighs the time budget against."""

    measured: dict  # the benchmark's JSON
    seconds: float  # the priced model-steps' device-seconds, one model at a time
    unpriced: int  # model-steps of shapes the file has no time for
    steps_to_report: list[tuple[int, float]]  # per priced configuration: steps to its first report, s/step

    @property
    def gpu(self) -> bool:
        return str(self.measured["device"]).startswith("cuda")

    @property
    def hours(self) -> float:
        """GPU-hours, or core-hours for step times measured on a CPU (each at its threads)."""
        return self.seconds / 3600 * (1 if self.gpu else int(self.measured.get("threads", 1)))

    @property
    def unit(self) -> str:
        return "GPU-hours" if self.gpu else "core-hours"


@dataclass(frozen=True)
class Cost:
    """The plan's cost as reckoned once before the sweep starts: the preview's lines and their estimate."""

    lines: tuple[str, ...]  # the preview (preview)
    priced: Estimate | None  # None without step times (cluster.step_seconds)


def reckon(cfg: DictConfig, plan: Plan) -> Cost:
    """The plan's cost: its model-steps at the step times of cluster.step_seconds, and the preview's lines."""
    priced = estimate(cfg, plan)
    return Cost(tuple(preview(cfg, plan, priced)), priced)


def estimate(cfg: DictConfig, plan: Plan) -> Estimate | None:
    """The plan's model-steps at the step times of cluster.step_seconds; None when it is not set."""
    if cfg.cluster.step_seconds is None:
        return None
    measured = read(cfg.cluster.step_seconds)
    seconds, unpriced, reports = 0.0, 0, []
    for configuration in plan.configurations:
        model_steps = _value(cfg, configuration, "train.steps") * len(plan.seeds)
        per_step = _seconds_per_step(measured, cfg, configuration)
        if per_step is None:
            unpriced += model_steps
            continue
        seconds += model_steps * per_step
        every = _value(cfg, configuration, "train.eval_every") * cfg.cluster.report_every
        reports.append((min(every, _value(cfg, configuration, "train.steps")), per_step))
    return Estimate(measured, seconds, unpriced, reports)


def preview(cfg: DictConfig, plan: Plan, priced: Estimate | None) -> list[str]:
    """The preview's lines: the model-steps, then their hours and cost where step times are given."""
    total = sum(_value(cfg, c, "train.steps") * len(plan.seeds) for c in plan.configurations)
    lines = [f"cost: {plan.job_count:,} models, {total:,} model-steps"]
    c = cfg.cluster
    if priced is None:
        how = f"`python -m bench step_seconds sweep={plan.name} --out FILE` on a node of the cluster's kind"
        return [*lines, f"cost: no step times to price them (cluster.step_seconds=FILE: {how})"]
    unit, price_key = priced.unit, "price_per_gpu_hour" if priced.gpu else "price_per_core_hour"
    unpriced = priced.unpriced
    left_out = f"; {unpriced:,} model-steps of shapes it has no time for left out" if unpriced else ""
    lines.append(
        f"cost: {priced.hours:,.1f} {unit} at the step times of {c.step_seconds} (on "
        f"{priced.measured['device']}, one model at a time: packs and shared GPUs train faster){left_out}"
    )
    price = c[price_key]
    if price is None:
        lines.append(f"cost: no price per {unit[:-1]} (cluster.{price_key})")
    else:
        lines.append(f"cost: {priced.hours * price:,.2f} at {price:g} per {unit[:-1]} (cluster.{price_key})")
    return lines


def read(path: str) -> dict:
    """The step_seconds benchmark's JSON, or a ConfigError naming cluster.step_seconds."""
    try:
        measured = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"cluster.step_seconds={path} is not readable JSON ({type(err).__name__}): it must be the file "
            "`python -m bench step_seconds sweep=NAME --out FILE` wrote, or null"
        ) from None
    if (
        not isinstance(measured, dict)
        or measured.get("command") != "step_seconds"
        or "device" not in measured
    ):
        raise ConfigError(
            f"cluster.step_seconds={path} is not the JSON of `python -m bench step_seconds` (no "
            '"command": "step_seconds" with its device and rows): write it with --out FILE, or set null'
        )
    return measured


def _seconds_per_step(measured: dict, cfg: DictConfig, configuration: Configuration) -> float | None:
    """The measured row whose shape (every key it names) is the configuration's, its seconds per step."""
    for row in measured.get("rows", []):
        if all(_value(cfg, configuration, key) == value for key, value in row["config"].items()):
            return float(row["seconds_per_step"])
    return None


def _value(cfg: DictConfig, configuration: Configuration, key: str):
    return configuration.overrides.get(key, OmegaConf.select(cfg, key))
