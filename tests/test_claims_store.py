"""The claims on real SQLite stores (conftest's sqlite_uri): tiny models trained in this process and tagged as
a sweep tags them, their checkpoints evaluated by analysis.checkpoint_eval. The oracles compute from the
checkpoints with models/ directly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from analysis.checkpoint_eval import EvalSettings, Evaluator, fresh_tasks, load_model, spec_of
from analysis.claims.evidence import judge
from analysis.claims.from_context import evidence
from analysis.claims.records import RECORDS
from analysis.claims.scopes import D
from analysis.context import Context
from analysis.runs import load_runs
from config.compose import compose
from models.lloyd import lloyd_step
from models.losses import kmeans_objective, smoothed_objective
from tracking.mlflow_recorder import MlflowRecorder
from tracking.names import SEED, SUBGRIDS, TRAIN_LOSS, VAL_KMEANS, VAL_REL_LLOYD
from training.loop import train

SEEDS = (153476998, 235510766)
# A few steps at n 16: the claims need finished runs with checkpoints, not trained models.
QUICK = [
    "task.n=16",
    "task.k=4",
    "train.batch=4",
    "train.steps=3",
    "train.eval_every=1",
    "train.val_batches=1",
    "train.log_every=1",
    "train.device=cpu",
    "loss.tau=1.0",
    "model.embedding=onehot",
]
SETTINGS = EvalSettings.configured(batches=1, batch=4, device="cpu", d32_n=64)


def trained(uri: str, experiment: str, folder: Path, subgrid: str, *overrides: str) -> None:
    """Two seeds of one configuration, tagged with `subgrid` as a sweep tags its runs."""
    recorder = MlflowRecorder(uri, experiment, tags={SUBGRIDS: subgrid})
    for seed in SEEDS:
        where = [f"tracking.uri={uri}", f"tracking.experiment={experiment}", f"seed={seed}"]
        train(
            compose([*QUICK, *overrides, *where]), recorder, folder / f"{experiment}-{seed}-{len(overrides)}"
        )


@pytest.fixture
def d32_store(sqlite_uri: str, tmp_path: Path) -> str:
    """`clusters` runs at d 32 and at d 4 (onehot, l2, tau 1, k 4), trained at n 16."""
    trained(sqlite_uri, "lite32", tmp_path, "clusters", "task.d=32")
    trained(sqlite_uri, "lite32", tmp_path, "clusters", "task.d=4", "optim.lr=0.001")
    return sqlite_uri


def context(uri: str, experiment: str, out: Path, settings: EvalSettings = SETTINGS) -> Context:
    return Context.build(uri, experiment, load_runs(uri, experiment), settings, out)


def final_runs(client: MlflowClient, experiment: str) -> list:
    found = client.get_experiment_by_name(f"{experiment}-evaluations")
    return client.search_runs([found.experiment_id], "tags.evaluation = 'final'") if found else []


def test_d32_runs_final_values_are_measured_at_eval_d32_n_from_their_checkpoints(
    d32_store: str, tmp_path: Path
) -> None:
    """Trained at n 16, the d 32 runs' final val_rel_lloyd and train_loss are read at eval.d32_n (64 here,
    512 by default) on fresh tasks from each last checkpoint; the d 4 runs keep what they logged; a second
    judgement reads the cached tables, another n measures anew, and eval.d32_n=null reads the logged
    values."""
    ctx = context(d32_store, "lite32", tmp_path / "out")
    found = evidence(ctx)
    measured, missing = found.final(ctx.runs)
    assert missing == ""
    d32 = ctx.runs[D] == 32
    for i, run in ctx.runs[d32].iterrows():
        model = load_model(d32_store, run, torch.device("cpu"), "last")
        ((X, C),) = fresh_tasks(spec_of(run, n=64), SETTINGS, run[SEED], "final/64")
        assert X.shape[1] == 64
        with torch.no_grad():
            centers = model(X, C)
        ratio = (kmeans_objective(X, centers) / kmeans_objective(X, lloyd_step(X, C))).mean().item()
        assert measured.loc[i, VAL_REL_LLOYD] == pytest.approx(ratio, rel=1e-5)
        assert measured.loc[i, VAL_REL_LLOYD] != pytest.approx(run[VAL_REL_LLOYD], rel=1e-3)  # not the logged
        loss = smoothed_objective(X, centers, 1.0, "l2").mean().item()
        assert measured.loc[i, TRAIN_LOSS] == pytest.approx(loss, rel=1e-5)
    logged = [VAL_KMEANS, VAL_REL_LLOYD, TRAIN_LOSS]
    pd.testing.assert_frame_equal(measured.loc[~d32, logged], ctx.runs.loc[~d32, logged])

    claim = judge(RECORDS["clusters_d32"], found)
    assert f"{np.median(measured.loc[d32, VAL_REL_LLOYD]):.3f} (margin" in claim.numbers, claim.numbers
    assert (
        "(judged at d 32, k 4, n 16 in training, the d 32 runs' final values measured at n 64 (eval.d32_n) "
        "on fresh tasks from each last checkpoint)"
    ) in claim.numbers
    client = MlflowClient(d32_store)
    assert len(final_runs(client, "lite32")) == 2  # one measurement per d 32 run, logged beside the probes'
    judge(RECORDS["clusters_d32"], evidence(context(d32_store, "lite32", tmp_path / "again")))
    assert len(final_runs(client, "lite32")) == 2  # read back from the store, not measured again
    judge(
        RECORDS["clusters_d32"],
        evidence(context(d32_store, "lite32", tmp_path / "out", replace(SETTINGS, d32_n=32))),
    )
    assert len(final_runs(client, "lite32")) == 4  # another n is another measurement

    as_logged = judge(
        RECORDS["clusters_d32"],
        evidence(context(d32_store, "lite32", tmp_path / "out", replace(SETTINGS, d32_n=None))),
    )
    assert f"{np.median(ctx.runs.loc[d32, VAL_REL_LLOYD]):.3f} (margin" in as_logged.numbers
    assert "measured at" not in as_logged.numbers and "(judged at d 32, k 4, n 16)" in as_logged.numbers


def test_d32_n_keys_only_the_tables_measured_at_it(sqlite_uri: str, tmp_path: Path) -> None:
    """Every other cached evaluation keeps its key whatever eval.d32_n is (no report evaluates again after
    it was added or changed); a table measured at an n is keyed by that n."""
    ours = Evaluator(sqlite_uri, "e", SETTINGS, tmp_path / "a")
    other = Evaluator(sqlite_uri, "e", replace(SETTINGS, d32_n=7), tmp_path / "b")
    assert ours.key("multistep", "r") == other.key("multistep", "r")
    assert len({ours.key("final", "r", 64), ours.key("final", "r", 128), ours.key("final", "r")}) == 3
