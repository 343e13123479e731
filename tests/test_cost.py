"""The sweep's cost preview (sweeper.driver.cost), printed by its dry run: model-steps, and at the step times
of a real `python -m bench step_seconds` run on this CPU the core-hours they need and their price; the same
file as a GPU writes it gives GPU-hours at the GPU price. Its keys are refused in one line naming them."""

from __future__ import annotations

import json

import pytest
from support.sweeps import sweep_jobs

from bench.step_seconds import bench_step_seconds
from cli import exit_codes
from config.compose import compose
from sweeper.sweep import main

SMOKE = ["sweep=smoke", "train.device=cpu", "train.steps=3000000"]  # hours enough to tell 1 thread from 2


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple:
    """The smoke sweep's step times on this CPU at two threads (core-hours count both), as `--out FILE`
    writes them."""
    path = tmp_path_factory.mktemp("bench") / "step_seconds.json"
    path.write_text(json.dumps(bench_step_seconds(SMOKE, 1, 2)))
    return path, json.loads(path.read_text())


def device_seconds(rows: list[dict]) -> tuple[float, int, int]:
    """Each smoke model's steps at its shape's measured step time, composed on its own; the model-steps of
    shapes without one (the benchmark times onehot and binary models only); all model-steps."""
    seconds, unpriced, total = 0.0, 0, 0
    for job in sweep_jobs(SMOKE):
        cfg = compose([*SMOKE[1:], *job.configuration.override_strings()])
        total += cfg.train.steps
        hits = [
            r
            for r in rows
            if all(str(cfg[k.split(".")[0]][k.split(".")[1]]) == str(v) for k, v in r["config"].items())
        ]
        if hits:
            seconds += cfg.train.steps * hits[0]["seconds_per_step"]
        else:
            unpriced += cfg.train.steps
    return seconds, unpriced, total


def cost_lines(argv: list[str], capsys) -> list[str]:
    assert main([*SMOKE, "sweep.dry_run=true", *argv]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("cost: ")]


def test_the_dry_run_prices_the_sweep_at_the_measured_cpu_step_times(measured, capsys):
    path, bench = measured
    seconds, unpriced, total = device_seconds(bench["rows"])
    assert seconds > 0 and unpriced > 0  # the smoke grid's unembedded models have no step time
    core_hours = seconds * bench["threads"] / 3600
    lines = cost_lines([f"cluster.step_seconds={path}", "cluster.price_per_core_hour=0.04"], capsys)
    assert lines[0] == f"cost: {len(sweep_jobs(SMOKE)):,} models, {total:,} model-steps"
    assert lines[1].startswith(f"cost: {core_hours:,.1f} core-hours at the step times of {path} (on cpu")
    assert lines[1].endswith(f"; {unpriced:,} model-steps of shapes it has no time for left out")
    assert lines[2] == f"cost: {core_hours * 0.04:,.2f} at 0.04 per core-hour (cluster.price_per_core_hour)"


def test_step_times_measured_on_a_gpu_are_gpu_hours_at_the_gpu_price(measured, tmp_path, capsys):
    path, bench = measured
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({**bench, "device": "cuda", "threads": 4}))  # as bench writes it on a GPU
    hours = device_seconds(bench["rows"])[0] / 3600  # a GPU-hour is the device's, whatever its threads
    argv = [f"cluster.step_seconds={gpu}", "cluster.price_per_gpu_hour=2.5", "cluster.price_per_core_hour=9"]
    lines = cost_lines(argv, capsys)
    assert lines[1].startswith(f"cost: {hours:,.1f} GPU-hours at the step times of {gpu} (on cuda")
    assert lines[2] == f"cost: {hours * 2.5:,.2f} at 2.5 per GPU-hour (cluster.price_per_gpu_hour)"


def test_without_step_times_the_preview_says_how_to_measure_them(capsys):
    lines = cost_lines([], capsys)
    assert lines[1] == (
        "cost: no step times to price them (cluster.step_seconds=FILE: `python -m bench step_seconds "
        "sweep=smoke --out FILE` on a node of the cluster's kind)"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "cluster.price_per_gpu_hour=-1",
            "cluster.price_per_gpu_hour=-1.0 is not allowed: null (no price) or a number >= 0, finite",
        ),
        (
            "cluster.price_per_core_hour=inf",
            "cluster.price_per_core_hour=inf is not allowed: null (no price) or a number >= 0, finite",
        ),
        ("cluster.step_seconds=/no/such.json", "cluster.step_seconds='/no/such.json' is not allowed: null"),
    ],
)
def test_the_cost_keys_are_refused_naming_the_key_and_what_is_allowed(override, message, capsys):
    assert main([*SMOKE, "sweep.dry_run=true", override]) == exit_codes.CONFIG
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_a_file_that_is_not_the_step_time_benchmarks_is_refused_naming_the_key(tmp_path, capsys):
    other = tmp_path / "speed.json"
    other.write_text(json.dumps({"command": "speed_memory", "device": "cpu", "rows": []}))
    assert main([*SMOKE, "sweep.dry_run=true", f"cluster.step_seconds={other}"]) == exit_codes.CONFIG
    assert capsys.readouterr().err.startswith(
        f"error: cluster.step_seconds={other} is not the JSON of `python -m bench step_seconds`"
    )
