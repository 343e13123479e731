"""Training one configuration: determinism, the validation metrics, divergence, checkpoints, crash-resume."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from support.repo import subprocess_env

from cli import exit_codes
from config.compose import compose
from config.identity import config_hash, run_config
from models.transformer import ClusteringTransformer
from sweeper.sweep import load
from sweeper.train import main
from tasks.sampler import TaskSpec, validation_tasks
from tracking.names import (
    CONFIG_HASH,
    DIVERGED,
    DIVERGED_AT,
    FINISHED,
    LR,
    METRICS,
    OUTCOME,
    TRAIN_LOSS,
    VAL_KMEANS,
    VAL_REL_LLOYD,
)
from tracking.recorder import MemoryRecorder
from training import checkpoint
from training.checkpoint import CheckpointError
from training.faults import NAN_AT_STEP, STEP_PAUSE, Fault, Faults, from_environment
from training.loop import NON_FINITE, blown_up, default_workdir, objective_bound, train
from training.packed import train_pack


def run(overrides: list[str], workdir: Path) -> tuple[MemoryRecorder, object]:
    recorder = MemoryRecorder()
    return recorder, train(compose(overrides), recorder, workdir)


def test_same_seed_same_histories_other_seed_differs(tiny, tmp_path):
    first, result = run(tiny, tmp_path / "a")
    again, _ = run(tiny, tmp_path / "b")
    other, _ = run(tiny + ["seed=235510766"], tmp_path / "c")
    assert result.outcome == FINISHED and first.status == "FINISHED" and first.tags[OUTCOME] == FINISHED
    assert set(first.metrics) == set(METRICS)
    assert [s for s, _ in first.metrics[TRAIN_LOSS]] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert [s for s, _ in first.metrics[VAL_REL_LLOYD]] == [0, 10, 20, 30, 40]
    assert first.metrics == again.metrics
    assert first.metrics[VAL_REL_LLOYD] != other.metrics[VAL_REL_LLOYD]
    # train.deterministic (on by default: training.determinism) changes no number on a CPU, whose kernels
    # are deterministic, so runs recorded before the key had its default (config.schema.ADDED_TRAIN_KEYS).
    assert torch.are_deterministic_algorithms_enabled()
    fast, _ = run(tiny + ["train.deterministic=false"], tmp_path / "d")
    assert not torch.are_deterministic_algorithms_enabled() and fast.metrics == first.metrics
    assert sorted(first.artifacts) == [
        "checkpoints/best.pt",
        "checkpoints/last.pt",
        "config.yaml",
        "curves.png",
    ]


def numpy_objective(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """sum_i min_j ||x_i - c_j||^2 per task, by explicit broadcasting in float64."""
    return ((X[:, :, None, :] - C[:, None, :, :]) ** 2).sum(-1).min(-1).sum(-1)


def numpy_lloyd_step(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """One Lloyd iteration with plain loops; an empty cluster keeps its center."""
    out = C.copy()
    for b in range(X.shape[0]):
        nearest = ((X[b, :, None, :] - C[b, None, :, :]) ** 2).sum(-1).argmin(-1)
        for j in range(C.shape[1]):
            if (nearest == j).any():
                out[b, j] = X[b, nearest == j].mean(0)
    return out


def test_validation_metrics_match_an_independent_computation(tiny, tmp_path):
    recorder, result = run(tiny, tmp_path)
    cfg = compose(tiny)
    state = checkpoint.load(checkpoint.last_path(tmp_path))
    model = ClusteringTransformer(
        cfg.task.d, cfg.task.k, cfg.model.embedding, cfg.model.gamma, cfg.model.dropout
    )
    model.load_state_dict(state["model"])
    model.eval()
    spec = TaskSpec(**run_config(cfg)["task"])
    objective, ratio = [], []
    with torch.no_grad():
        for X, C in validation_tasks(spec, cfg.seed, cfg.train.val_batches, cfg.train.batch):
            mine = numpy_objective(X.double().numpy(), model(X, C).double().numpy())
            lloyd = numpy_objective(
                X.double().numpy(), numpy_lloyd_step(X.double().numpy(), C.double().numpy())
            )
            objective.append(mine)
            ratio.append(mine / lloyd)
    # float32 model and objective against float64 NumPy: relative 1e-5.
    assert result.metrics[VAL_KMEANS] == pytest.approx(np.concatenate(objective).mean(), rel=1e-5)
    assert result.metrics[VAL_REL_LLOYD] == pytest.approx(np.concatenate(ratio).mean(), rel=1e-5)
    assert result.best_val == min(v for _, v in recorder.metrics[VAL_REL_LLOYD])
    assert recorder.metrics[LR][0] == (0, cfg.optim.lr)


def test_non_finite_loss_stops_the_run_at_that_step(tiny, tmp_path):
    recorder = MemoryRecorder()
    result = train(compose(tiny), recorder, tmp_path, hook=Faults(nan=Fault(13)))
    assert (result.outcome, result.diverged_at, result.cause) == (DIVERGED, 13, NON_FINITE)
    assert recorder.status == "FAILED"
    assert recorder.tags[OUTCOME] == DIVERGED and recorder.tags[DIVERGED_AT] == "13"
    assert max(s for s, _ in recorder.metrics[TRAIN_LOSS]) == 10  # nothing logged from step 13 on
    state = checkpoint.load(checkpoint.last_path(tmp_path))
    assert state["step"] == 10 and all(torch.isfinite(v).all() for v in state["model"].values())


def nan_gradients_at(step: int) -> Callable[[list[str], list[int], torch.Tensor], torch.Tensor]:
    """A step hook that keeps every loss's value but makes its gradient NaN at `step`: sqrt's derivative at
    0 is infinite and abs's is 0 there, so the added term is 0 and its gradient inf * 0."""

    def hook(keys: list[str], steps: list[int], loss: torch.Tensor) -> torch.Tensor:
        return loss + (loss - loss.detach()).abs().sqrt() if step in steps else loss

    return hook


def test_non_finite_weights_under_a_finite_loss_stop_the_run_at_that_step(tiny, tmp_path):
    """NaN gradients under a finite loss make Adam propose NaN weights: the pack rejects them at that step,
    before a NaN reaches the next forward pass (where the loss would turn non-finite one step late)."""
    recorder = MemoryRecorder()
    result = train(compose(tiny), recorder, tmp_path, hook=nan_gradients_at(13))
    assert (result.outcome, result.diverged_at, result.cause) == (DIVERGED, 13, NON_FINITE)
    assert recorder.tags[DIVERGED_AT] == "13"
    state = checkpoint.load(checkpoint.last_path(tmp_path))
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_a_run_that_ends_past_any_centers_in_the_cube_is_diverged(tiny, tmp_path):
    """lr 1.0, seed 1 blows the tiny run's objective up to 6,856 by step 10 with finite weights and ends at
    3,030 (measured): beyond n * d = 128, which no centers in the unit cube exceed, so it is diverged, at
    its last step, having trained to the end."""
    recorder, result = run(tiny + ["optim.lr=1.0", "seed=1"], tmp_path)
    cfg = compose(tiny)
    assert objective_bound(cfg) == cfg.task.n * cfg.task.d == 128
    assert (result.outcome, result.diverged_at, result.step) == (DIVERGED, 40, 40)
    assert result.metrics[VAL_KMEANS] > 128 and blown_up(result.metrics, cfg)
    assert (
        result.cause == f"final validation k-means objective {result.metrics[VAL_KMEANS]:.4g} above n*d = 128"
    )
    assert recorder.status == "FAILED" and recorder.tags[OUTCOME] == DIVERGED  # what claims and figures count
    assert recorder.tags[DIVERGED_AT] == "40"
    assert [s for s, _ in recorder.metrics[VAL_KMEANS]] == [0, 10, 20, 30, 40]
    assert not blown_up({VAL_KMEANS: 128.0}, cfg) and blown_up({VAL_KMEANS: float("nan")}, cfg)


def test_a_blow_up_the_run_comes_back_from_leaves_it_finished(tiny, tmp_path):
    """lr 0.3, seed 0 leaves the cube's range at step 10 (val_kmeans 267 > n * d = 128, measured) and comes
    back to 6.5 by step 40: a worse local minimum, not divergence, so it finishes at its final value."""
    recorder, result = run(tiny + ["optim.lr=0.3", "seed=0"], tmp_path)
    assert (result.outcome, result.step, result.diverged_at, result.cause) == (FINISHED, 40, None, "")
    objective = dict(recorder.metrics[VAL_KMEANS])
    assert objective[10] > 128 > objective[40]
    assert recorder.status == "FINISHED" and recorder.tags[OUTCOME] == FINISHED
    assert DIVERGED_AT not in recorder.tags


def test_a_diverging_model_trains_on_in_its_pack_and_the_others_train_as_alone(tiny, tmp_path):
    """The lr 10 model blows up by step 10 and ends far past n * d (2.9e7 against 128, measured; at lr 1.0
    the end is chaotic: past the bound on one CPU, back to 98 on an AVX-512 one); it trains to the end beside
    its pack-mate, which finishes with a solo run's numbers (dropout 0, so the pack draws nothing differently;
    to 1e-5, training.packed's tolerance)."""
    cfgs = [compose(tiny + ["model.dropout=0", "seed=2", f"optim.lr={lr}"]) for lr in (10.0, 0.01)]
    recorders = [MemoryRecorder(), MemoryRecorder()]
    results = train_pack(cfgs, recorders, [tmp_path / "blown", tmp_path / "mate"])
    assert [(r.outcome, r.step) for r in results] == [(DIVERGED, 40), (FINISHED, 40)]
    assert recorders[0].metrics[VAL_KMEANS][1][1] > 128  # past the bound at step 10, yet it trained on
    alone, _ = run(tiny + ["model.dropout=0", "seed=2"], tmp_path / "alone")
    packed = recorders[1].metrics[VAL_REL_LLOYD]
    assert [s for s, _ in packed] == [s for s, _ in alone.metrics[VAL_REL_LLOYD]]
    assert [v for _, v in packed] == pytest.approx([v for _, v in alone.metrics[VAL_REL_LLOYD]], rel=1e-5)


def test_nan_fault_is_a_test_only_variable_not_configuration(tiny, monkeypatch):
    """LEANER_TEST_NAN_AT_STEP (the faults of tests whose training runs in another process)."""
    cfg = compose(tiny)
    key, other = config_hash(cfg), config_hash(compose(tiny + ["seed=1"]))
    assert "inject_nan_at_step" not in cfg.train
    monkeypatch.delenv(NAN_AT_STEP, raising=False)
    assert from_environment() is None
    monkeypatch.setenv(NAN_AT_STEP, "7")
    nan = from_environment().nan
    assert nan.at(key) == nan.at(other) == 7
    monkeypatch.setenv(NAN_AT_STEP, f"5@{other},{key}")
    nan = from_environment().nan
    assert nan.at(key) == 5 and nan.at(config_hash(compose(tiny + ["seed=2"]))) is None
    assert config_hash(compose(tiny)) == key  # the variable is not part of what a run computes
    monkeypatch.setenv(NAN_AT_STEP, "0")
    with pytest.raises(ValueError, match=NAN_AT_STEP):
        from_environment()


def test_step_pause_is_a_test_only_variable_that_changes_no_number(tiny, tmp_path, monkeypatch):
    """LEANER_TEST_STEP_PAUSE_S (the fault tests' slow trials): the same histories, the same config hash."""
    monkeypatch.delenv(STEP_PAUSE, raising=False)
    assert from_environment() is None
    key = config_hash(compose(tiny))
    plain, _ = run(tiny, tmp_path / "plain")
    monkeypatch.setenv(STEP_PAUSE, "0.05")
    assert from_environment().pause_s == 0.05
    start = time.monotonic()
    paced, result = run(tiny, tmp_path / "paced")
    assert time.monotonic() - start >= result.step * 0.05  # each step slept first (a sleep is never shorter)
    assert paced.metrics == plain.metrics and plain.metrics[VAL_REL_LLOYD]
    assert config_hash(compose(tiny)) == key  # the variable is not part of what a run computes
    for bad in ("-1", "slow", "11"):
        monkeypatch.setenv(STEP_PAUSE, bad)
        with pytest.raises(ValueError, match=STEP_PAUSE):
            from_environment()


def test_corrupt_checkpoint_is_an_error_when_resuming_strictly(tiny, tmp_path):
    """train.resume=must; with auto a damaged checkpoint is logged and training restarts
    (test_bad_checkpoints)."""
    checkpoint.last_path(tmp_path).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="last.pt.*train.resume=never"):
        run(tiny + ["train.resume=must"], tmp_path)
    _, result = run(tiny + ["train.resume=never"], tmp_path)
    assert result.outcome == FINISHED
    with pytest.raises(CheckpointError, match="already finished"):
        run(tiny + ["train.resume=must"], tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run(tiny + ["train.resume=must"], tmp_path / "empty")


def test_a_finished_run_is_not_continued_but_repeated(tiny, tmp_path):
    first, _ = run(tiny, tmp_path)
    second, _ = run(tiny, tmp_path)
    assert second.metrics == first.metrics


# Trains like the CLI, but SIGKILLs itself right after the checkpoint of step 20.
KILLED_AT_20 = textwrap.dedent("""
    import os, signal, sys
    from config.compose import compose
    from tracking.mlflow_recorder import MlflowRecorder
    from training.loop import default_workdir, train

    def on_eval(step, metrics, workdir):
        if step == 20:
            os.kill(os.getpid(), signal.SIGKILL)

    cfg = compose(sys.argv[1:])
    train(cfg, MlflowRecorder(cfg.tracking.uri, cfg.tracking.experiment), default_workdir(cfg), on_eval)
""")


@pytest.mark.slow
def test_killed_run_resumes_in_the_same_mlflow_run_with_identical_numbers(
    tiny, tmp_path, sqlite_uri, monkeypatch
):
    overrides = tiny + [f"tracking.uri={sqlite_uri}", f"train.workdir={tmp_path / 'runs'}"]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT_20, *overrides],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr
    workdir = default_workdir(compose(overrides))
    run_id = checkpoint.load(checkpoint.last_path(workdir))["run_id"]
    client = MlflowClient(tracking_uri=sqlite_uri)
    assert client.get_run(run_id).info.status == "RUNNING"  # killed: nobody closed it
    assert max(m.step for m in client.get_metric_history(run_id, VAL_REL_LLOYD)) == 20

    monkeypatch.chdir(tmp_path)
    assert main(overrides) == 0  # the same command again
    runs = client.search_runs([client.get_experiment_by_name("leaner-clustering").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].info.status == "FINISHED" and runs[0].data.tags[OUTCOME] == FINISHED

    uninterrupted, _ = run(tiny, tmp_path / "uninterrupted")
    for key in METRICS:
        logged = [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        assert sorted(logged) == uninterrupted.metrics[key], key  # exact, and no step twice


@pytest.mark.slow
def test_cli_divergence_exits_3_and_marks_the_run_failed(tiny, tmp_path, sqlite_uri, capsys, monkeypatch):
    monkeypatch.setenv(NAN_AT_STEP, "7")
    code = main(tiny + [f"tracking.uri={sqlite_uri}", f"train.workdir={tmp_path / 'runs'}"])
    assert code == exit_codes.DIVERGED == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("diverged: non-finite loss or parameters at step 7")
    client = MlflowClient(tracking_uri=sqlite_uri)
    (found,) = client.search_runs([client.get_experiment_by_name("leaner-clustering").experiment_id])
    assert found.info.status == "FAILED"
    assert (found.data.tags[OUTCOME], found.data.tags[DIVERGED_AT]) == (DIVERGED, "7")


def test_train_with_a_sweep_trains_as_its_trials_do_the_command_line_winning(tmp_path, sqlite_uri, capsys):
    """`sweeper.train sweep=smoke` trains at the sweep's `fixed` values (n 16, 20 steps, batch 4), so the
    run is the sweep's job for that configuration and seed (same config_hash: a sweep skips it); a key on
    the command line keeps the command line's value, in the run and in the sweep's job alike."""
    line = ["sweep=smoke", "train.eval_every=10", "train.device=cpu"]
    chosen = ["model.embedding=binary", "seed=235510766"]
    assert main([*line, *chosen, "--cfg", "job"]) == 0  # first what it will train (the paper's 10,000 steps
    shown = yaml.safe_load(capsys.readouterr().out)  # would take minutes here)
    assert (shown["task"]["n"], shown["train"]["steps"], shown["train"]["eval_every"]) == (16, 20, 10)
    assert main([*line, *chosen, f"tracking.uri={sqlite_uri}", f"train.workdir={tmp_path}"]) == 0
    client = MlflowClient(tracking_uri=sqlite_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("leaner-clustering").experiment_id])
    params = run.data.params
    assert (params["task.n"], params["train.steps"], params["train.batch"]) == ("16", "20", "4")
    assert params["train.eval_every"] == "10"  # smoke's fixed value is 5
    (job,) = [
        j
        for j in load(line).jobs
        if j.seed == 235510766 and j.configuration.overrides["model.embedding"] == "binary"
    ]
    assert run.data.tags[CONFIG_HASH] == job.key
