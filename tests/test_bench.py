"""The benchmark suite runs and prints its figures; the straightforward reference model and the
fused CPU dropout attention compute what the model computes (no timed assertions)."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from support.configs import SHORT as TINY
from support.repo import REPO

from bench import gpu, pack, speed_memory, step, step_seconds, sweep
from bench.__main__ import COMMANDS, main
from bench.common import timed
from bench.pack import OP_PACKS, PACKS, QUICK, SIZES, THREADS, op_calls, pack_models
from bench.step_seconds import SHAPE_KEYS, bench_step_seconds
from cli.exit_codes import TABLE
from config.compose import compose
from config.schema import ConfigError
from models.flash_dropout import FlashDropout, dropped_positions
from models.losses import smoothed_objective
from models.reference import ReferenceTransformer, sample_tasks_loop, smoothed_objective_plain
from models.transformer import ClusteringTransformer
from tasks.sampler import TaskSpec


def bench(*args: str, module: str = "bench") -> dict:
    done = subprocess.run(
        [sys.executable, "-m", module, *args, "--threads", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_a_prepared_variant_times_its_run_alone() -> None:
    """(prepare, run): prepare's result is handed to run and only run is timed, as a backward pass is timed
    apart from the forward that made its loss (sleeps of 0.2 s and 0.01 s; bounds wide enough for a busy
    machine)."""
    cpu = torch.device("cpu")
    assert 0.01 <= timed((lambda: time.sleep(0.2) or 0.01, time.sleep), cpu) < 0.15
    assert timed(lambda: time.sleep(0.01), cpu) >= 0.01


def test_speed_memory_times_the_backward_pass_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """backward_seconds is the backward pass itself, timed apart from its forward: with a forward slowed by
    0.2 s it stays below that. Until 2026-12-05 it was the forward + backward median less the forward's,
    clipped at 0: on a busy machine a 0, and a onehot/binary ratio of 1e11 in the claims."""
    real = speed_memory._loss

    def slow_forward(*args: object) -> torch.Tensor:
        time.sleep(0.2)
        return real(*args)

    monkeypatch.setattr(speed_memory, "_loss", slow_forward)
    monkeypatch.setattr(speed_memory, "SPEED_MEMORY_D", (4,))
    monkeypatch.setattr(speed_memory, "SPEED_MEMORY_K", (8, 64))  # quick: k 8 alone
    ((row),) = speed_memory.bench_speed_memory(compose([]), repeats=1, quick=True)["rows"]
    for embedding in ("onehot", "binary"):
        assert 0 < row[embedding]["backward_seconds"] < 0.2, row


@pytest.mark.slow
def test_bench_step_prints_the_figures_as_json() -> None:
    out = bench("step", *TINY, "--repeats", "1")
    for figures in (out, out["reference"]):
        for key in (
            "seconds_per_step",
            "model_steps_per_second",
            "peak_memory_bytes",
            "flop_rate",
            "flop_fraction",
        ):
            assert positive(figures[key]), key
        assert figures["model_steps_per_second"] == pytest.approx(1 / figures["seconds_per_step"])
    assert positive(out["speedup"]) and positive(out["matmul_flop_rate"]) and out["memory_measure"]
    assert out["config"]["n"] == 24 and out["device"] == "cpu"


def test_bench_step_seconds_times_each_onehot_and_binary_shape_of_a_sweep() -> None:
    out = bench_step_seconds(["sweep=smoke", "model.qkv_mult=2", "train.device=cpu"], 1, 1)
    assert (out["command"], out["sweep"], out["device"], out["threads"]) == (
        "step_seconds",
        "smoke",
        "cpu",
        1,
    )
    # smoke's configurations: one per embedding; `none` is not in the figure, so not timed
    assert [r["config"]["model.embedding"] for r in out["rows"]] == ["onehot", "binary"]
    for row in out["rows"]:
        # the sweep's shape (its fixed task.n and train.batch) with the command line's other keys
        shape = {k: row["config"][k] for k in ("task.n", "train.batch", "model.qkv_mult")}
        assert set(row["config"]) == set(SHAPE_KEYS) and shape == {
            "task.n": 16,
            "train.batch": 4,
            "model.qkv_mult": 2,
        }
        assert positive(row["seconds_per_step"])
    with pytest.raises(ConfigError, match="sweep=lite"):
        bench_step_seconds(["train.device=cpu"], 1, 1)


def test_spec_name_analysis_bench_runs_the_same_benchmarks() -> None:
    """docs/science.md section 8 names `python -m analysis.bench step ...`: JSON with seconds_per_step."""
    out = bench("step", *TINY, "--repeats", "1", module="analysis.bench")
    assert positive(out["seconds_per_step"]) and positive(out["reference"]["seconds_per_step"])


FIGURES = ("seconds_per_step", "model_steps_per_second", "flop_rate", "flop_fraction")


def test_bench_pack_prints_every_figure_as_json_and_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    table = tmp_path / "pack.txt"
    args = ["pack", *TINY, "--packs", "1,3", "--op-packs", "1,3", "--threads", "1", "--repeats", "1"]
    assert main([*args, "--table", str(table)]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["command"] == "pack" and out["device"] == "cpu" and out["memory_measure"]
    (size,) = out["sizes"]  # the overrides set task.n/d/k: that size alone
    assert (size["n"], size["d"], size["k"]) == (24, 3, 4) and positive(size["flops_per_step"])
    (row,) = size["threads"]
    assert row["threads"] == 1 and positive(row["matmul_flop_rate"])
    assert [p["pack"] for p in row["packs"]] == [1, 3]
    for figures in (row["solo"], *row["packs"]):
        assert all(positive(figures[key]) for key in FIGURES), figures
        assert figures["peak_memory_bytes"] is None  # CPU without --memory
    for p in row["packs"]:
        assert positive(p["speedup_vs_solo"])
        assert p["flop_rate"] == pytest.approx(p["pack"] * size["flops_per_step"] / p["seconds_per_step"])
    assert [c["pack"] for c in size["op_calls"]] == [1, 3]
    for calls in size["op_calls"]:
        assert type(calls["aten_ops"]) is int and 0 < calls["aten_ops"] <= calls["aten_ops_max"]
        assert type(calls["aten_ops_max"]) is int and calls["kernel_launches"] is None
    assert table.read_text().strip() in captured.err and "operator calls per pack step" in captured.err


def test_bench_pack_of_both_regularizers_gives_each_model_its_own(capsys: pytest.CaptureFixture) -> None:
    """--regularizers l2,l2,ne: a pack's models take them in turn (make reproduce's 12: 9 l2, 3 ne)."""
    settings = pack.parse([*TINY, "--regularizers", "l2,l2,ne"])
    cfg = settings.cfg
    models = pack_models(cfg, settings.plan, 4)
    assert [m.loss.regularizer for m in models] == ["l2", "l2", "ne", "l2"]
    assert [m.seed for m in models] == [cfg.seed + i for i in range(4)]
    unchanged = pack_models(cfg, pack.parse(TINY).plan, 2)
    assert [m.loss.regularizer for m in unchanged] == [cfg.loss.regularizer] * 2  # the configured one for all

    run = ["--packs", "2", "--op-packs", "", "--threads", "1", "--repeats", "1"]
    assert main(["pack", *TINY, "--regularizers", "ne,l2", *run]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["regularizers"] == ["ne", "l2"] and "regularizers in turn ne,l2" in captured.err
    assert positive(out["sizes"][0]["threads"][0]["packs"][0]["model_steps_per_second"])


def test_op_calls_counts_each_aten_call_of_a_step() -> None:
    """The profiler counts calls, not time: k more additions are k more aten::add calls."""
    x = torch.ones(8)

    def adds(k: int) -> Callable[[], object]:
        return lambda: [torch.add(x, 1) for _ in range(k)]

    one, six = (op_calls(adds(k), torch.device("cpu")) for k in (1, 6))
    assert one["aten_ops"] == one["aten_ops_max"] >= 1  # every call alike
    assert six["aten_ops"] - one["aten_ops"] == 5 * one["aten_ops"]


def test_pack_plan_quick_fills_what_the_options_leave(capsys: pytest.CaptureFixture) -> None:
    plan = pack.parse(["--quick", "--packs", "2,5"]).plan
    assert plan.packs == (2, 5) and plan.sizes == {"laptop": SIZES["laptop"]}
    assert (plan.threads, plan.op_packs, plan.repeats) == (QUICK["threads"], QUICK["op_packs"], 3)
    full = pack.parse([]).plan
    assert (full.sizes, full.packs, full.threads, full.op_packs) == (SIZES, PACKS, THREADS, OP_PACKS)


@pytest.mark.parametrize(
    "args, named",
    [
        (["--sizes", "128x4"], "--sizes"),
        (["--packs", "0,3"], "--packs"),
        (["--threads", ""], "--threads"),
        (["--regularizers", "l2,l1"], "l2, ne"),
    ],
)
def test_bench_pack_rejects_bad_options_naming_them(
    args: list[str], named: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["pack", *args]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("command", ["step", "pack", "sweep", "speed_memory", "gpu", None])
def test_help_lists_the_options_and_exit_codes(command: str | None, capsys: pytest.CaptureFixture) -> None:
    assert main([command, "--help"] if command else ["--help"]) == 0
    text = capsys.readouterr().out
    assert all(f"  {row.code} " in text for row in TABLE), text
    own = {
        "step": ["--repeats", "--threads", "--out"],
        "pack": [
            "--sizes",
            "--packs",
            "--threads",
            "--op-packs",
            "--regularizers",
            "--quick",
            "--table",
            "--out",
        ],
        "sweep": ["--sweep-pack"],
        "speed_memory": ["--quick"],
        "gpu": ["--tiny"],
        None: list(COMMANDS),
    }[command]
    assert all(option in text for option in own), (own, text)
    if command in ("step", "pack"):
        assert "--sweep-pack" not in text  # its own options, not every command's


@pytest.mark.parametrize("module", [step, pack, sweep, step_seconds, speed_memory, gpu])
def test_each_benchmark_is_a_command_of_its_own(module: object, capsys: pytest.CaptureFixture) -> None:
    """`python -m bench NAME ...` is `python -m bench.NAME ...`: bench/__main__.py hands the rest of the line
    to the benchmark's own main, which answers alike (its --help, an unknown option)."""
    name = module.__name__.removeprefix("bench.")
    for words in (["--help"], ["--bogus"]):
        code = main([name, *words])
        via_bench = capsys.readouterr()
        assert module.main(words) == code == (0 if words == ["--help"] else 2)
        assert capsys.readouterr() == via_bench


@pytest.mark.slow
def test_a_benchmark_runs_as_python_m_bench_dot_its_name() -> None:
    out = bench("sweep=smoke", "train.device=cpu", "--repeats", "1", module="bench.step_seconds")
    assert (out["command"], out["sweep"], out["threads"]) == ("step_seconds", "smoke", 1)
    assert [r["config"]["model.embedding"] for r in out["rows"]] == ["onehot", "binary"]


def test_the_old_path_bench_cli_works_for_one_release_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.cli, the command until it moved to bench/__main__.py, gives the same main for one more release
    and says where it is now."""
    monkeypatch.delitem(sys.modules, "bench.cli", raising=False)  # imported afresh: its warning comes
    with pytest.warns(DeprecationWarning, match="bench.__main__"):
        old = importlib.import_module("bench.cli")
    assert old.main is main and old.COMMANDS is COMMANDS


def test_bench_rejects_a_bad_override_naming_it(capsys: pytest.CaptureFixture) -> None:
    assert main(["step", "model.embedding=ternary"]) == 2
    err = capsys.readouterr().err
    assert "model.embedding" in err and "ternary" in err


@pytest.mark.parametrize("embedding", ["onehot", "binary", "none"])
@pytest.mark.parametrize("qkv_mult", [1, 2])
def test_reference_computes_the_model_function(embedding: str, qkv_mult: int) -> None:
    torch.manual_seed(0)
    model = ClusteringTransformer(3, 5, embedding, gamma=0.7, dropout=0.0, qkv_mult=qkv_mult)
    base = ReferenceTransformer.like(model)
    X, C = torch.rand(2, 30, 3), torch.rand(2, 5, 3)
    outs = []
    for m in (model, base):
        out = m(X, C)
        smoothed_objective(X, out, 0.5, "l2").sum().backward()
        outs.append((out.detach(), {name: p.grad for name, p in m.named_parameters()}))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=0, atol=1e-5)
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(outs[1][1][name], grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("regularizer", ["l2", "ne"])
def test_reference_loss_is_the_smoothed_objective(regularizer: str) -> None:
    X, C = torch.rand(3, 40, 2), torch.rand(3, 6, 2)
    torch.testing.assert_close(
        smoothed_objective_plain(X, C, 0.3, regularizer),
        smoothed_objective(X, C, 0.3, regularizer),
        rtol=1e-5,
        atol=1e-5,
    )


def test_reference_sampler_draws_tasks_in_the_unit_cube_with_data_point_centers() -> None:
    torch.manual_seed(0)
    spec = TaskSpec(family="gumbel", n=50, d=3, k=4, equal_weights=False, equal_scales=False)
    X, C = sample_tasks_loop(spec, 5, torch.Generator().manual_seed(1))
    assert X.shape == (5, 50, 3) and C.shape == (5, 4, 3)
    assert torch.all(X.amin(1) == 0) and torch.allclose(X.amax((1, 2)), torch.ones(5))
    assert torch.all((C.unsqueeze(2) == X.unsqueeze(1)).all(-1).any(-1))  # every center is one of the points


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_flash_dropout_equals_dense_attention_with_that_mask(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    N, L, S, E, p, scale = 3, 9, 6, 5, 0.3, 0.7
    q, k, v = (torch.randn(N, 1, n, E, dtype=dtype, requires_grad=True) for n in (L, S, S))
    dropped = dropped_positions(N * L * S, p)
    mask = torch.ones(N * L * S, dtype=dtype)
    mask[dropped] = 0
    reference = (torch.softmax(scale * q @ k.transpose(-1, -2), -1) * mask.view(N, 1, L, S)) @ v / (1 - p)
    fused = FlashDropout.apply(q, k, v, scale, p, dropped)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(fused, reference, rtol=0, atol=tol)
    w = torch.randn_like(reference)
    for mine, ref in zip(
        torch.autograd.grad(fused, (q, k, v), w), torch.autograd.grad(reference, (q, k, v), w)
    ):
        torch.testing.assert_close(mine, ref, rtol=0, atol=tol)


def test_dropped_positions_are_a_bernoulli_process() -> None:
    torch.manual_seed(0)
    total, p = 400_000, 0.01
    positions = dropped_positions(total, p)
    assert positions.min() >= 0 and positions.max() < total
    assert torch.all(positions[1:] > positions[:-1])  # sorted, distinct
    sigma = math.sqrt(total * p * (1 - p))
    assert abs(len(positions) - total * p) < 6 * sigma
    # Uniform over the range: each tenth holds a tenth of them (6 sigma).
    counts = torch.bincount(positions * 10 // total, minlength=10).double()
    assert torch.all((counts - total * p / 10).abs() < 6 * math.sqrt(total * p / 10))
