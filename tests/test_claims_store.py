"""The claims on real SQLite stores (conftest's sqlite_uri): tiny models trained in this process and tagged as
a sweep tags them, their checkpoints evaluated by analysis.checkpoint_eval. The oracles compute from the
checkpoints with models/ directly."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from support.repo import REPO, subprocess_env

from analysis import report
from analysis.checkpoint_eval import EvalSettings, Evaluator, fresh_tasks, load_model, spec_of
from analysis.claims import __main__ as claims
from analysis.claims.cases import UNTESTED
from analysis.claims.evidence import evidence_of
from analysis.claims.records import CLAIMS, RECORDS, reads
from analysis.claims.scopes import D
from analysis.claims.settings import at_setting
from analysis.claims.verdicts import judge
from analysis.context import Context
from analysis.read import read
from analysis.runs import load_runs
from cli import exit_codes
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
QUICK_EVAL = ["eval.batches=1", "eval.batch=4", "eval.steps=2", "eval.device=cpu", "eval.d32_n=64"]


def trained(uri: str, experiment: str, folder: Path, subgrid: str, *overrides: str) -> None:
    """Two seeds of one configuration, tagged with `subgrid` as a sweep tags its runs."""
    recorder = MlflowRecorder(uri, experiment, tags={SUBGRIDS: subgrid})
    for seed in SEEDS:
        where = [f"tracking.uri={uri}", f"tracking.experiment={experiment}", f"seed={seed}"]
        train(
            compose([*QUICK, *overrides, *where]),
            recorder,
            folder / "_".join([experiment, str(seed), *overrides]),
        )


@pytest.fixture
def d32_store(sqlite_uri: str, tmp_path: Path) -> str:
    """`clusters` runs at d 32, k 10 and at d 4, k 6 (onehot, l2, tau 1), trained at n 16."""
    trained(sqlite_uri, "lite32", tmp_path, "clusters", "task.d=32", "task.k=10")
    trained(sqlite_uri, "lite32", tmp_path, "clusters", "task.d=4", "task.k=6")
    return sqlite_uri


def context(uri: str, experiment: str, out: Path, settings: EvalSettings = SETTINGS) -> Context:
    return read(uri, experiment, load_runs(uri, experiment), settings, out, reads)


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
    found = evidence_of([ctx])
    measured, missing = found.final(ctx.runs)
    assert missing == ""
    d32 = ctx.runs[D] == 32
    for i, run in ctx.runs[d32].iterrows():
        model = load_model(MlflowClient(d32_store), run, torch.device("cpu"), "last")
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
        "(judged at d 32, k 10, n 16 in training, the d 32 runs' final values measured at n 64 (eval.d32_n) "
        "on fresh tasks from each last checkpoint)"
    ) in claim.numbers
    client = MlflowClient(d32_store)
    assert len(final_runs(client, "lite32")) == 2  # one measurement per d 32 run, logged beside the probes'
    judge(RECORDS["clusters_d32"], evidence_of([context(d32_store, "lite32", tmp_path / "again")]))
    assert len(final_runs(client, "lite32")) == 2  # read back from the store, not measured again
    judge(
        RECORDS["clusters_d32"],
        evidence_of([context(d32_store, "lite32", tmp_path / "out", replace(SETTINGS, d32_n=32))]),
    )
    assert len(final_runs(client, "lite32")) == 4  # another n is another measurement

    as_logged = judge(
        RECORDS["clusters_d32"],
        evidence_of([context(d32_store, "lite32", tmp_path / "out", replace(SETTINGS, d32_n=None))]),
    )
    assert f"{np.median(ctx.runs.loc[d32, VAL_REL_LLOYD]):.3f} (margin" in as_logged.numbers
    assert "measured at" not in as_logged.numbers and "(judged at d 32, k 10, n 16)" in as_logged.numbers


def test_d32_n_keys_only_the_tables_measured_at_it(sqlite_uri: str, tmp_path: Path) -> None:
    """Every other cached evaluation keeps its key whatever eval.d32_n is (no report evaluates again after
    it was added or changed); a table measured at an n is keyed by that n."""
    ours = Evaluator(sqlite_uri, "e", SETTINGS, tmp_path / "a")
    other = Evaluator(sqlite_uri, "e", replace(SETTINGS, d32_n=7), tmp_path / "b")
    assert ours.key("multistep", "r") == other.key("multistep", "r")
    assert len({ours.key("final", "r", 64), ours.key("final", "r", 128), ours.key("final", "r")}) == 3


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory: pytest.TempPathFactory, _empty_store: Path) -> str:
    """sweep=lite's part of `lr` in one experiment (d 4: lr 1.0 beside 0.01), sweep=lite32's in another
    (d 32: 0.1 and 1.0 beside 0.01), as `make reproduce` and `make reproduce-d32` leave them in one store;
    trained once for the tests that read it."""
    folder = tmp_path_factory.mktemp("two_sweeps")
    shutil.copyfile(_empty_store, folder / "mlflow.db")
    uri, lr = f"sqlite:///{folder / 'mlflow.db'}", ["loss.tau=0.1", "train.steps=2"]
    for rate in (0.01, 1.0):
        trained(uri, "lite", folder, "lr", *lr, "task.d=4", "task.k=6", f"optim.lr={rate}")
    for rate in (0.01, 0.1, 1.0):
        trained(uri, "lite32", folder, "lr", *lr, "task.d=32", "task.k=10", f"optim.lr={rate}")
    return uri


def claims_of(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / "claims.csv").set_index("name")


@pytest.mark.slow  # claims over several experiments: 8 s
def test_one_claims_command_judges_several_experiments_in_one_table(
    two_sweeps: str, tmp_path: Path, capsys
) -> None:
    """Alone, neither experiment gives large_lr_worse both halves (UNTESTED in each); `experiments=[...]`
    judges both as one, into <out>/<a>+<b>/, and the claim names the setting each experiment's runs were
    judged at."""
    words = [f"tracking.uri={two_sweeps}", f"out={tmp_path}", "speed_json=null", *QUICK_EVAL]
    for experiment in ("lite", "lite32"):
        assert claims.main([*words, f"tracking.experiment={experiment}"]) == 0
        assert claims_of(tmp_path / experiment).loc["large_lr_worse", "status"] == UNTESTED
    assert claims.main([*words, "experiments=[lite,lite32]"]) == 0
    assert capsys.readouterr().out.strip().endswith(str(tmp_path / "lite+lite32" / "claims.csv"))
    table = claims_of(tmp_path / "lite+lite32")
    assert list(table.index) == [record.name for record in CLAIMS]
    lr = table.loc["large_lr_worse"]
    assert lr["status"] != UNTESTED, lr["numbers"]  # both halves judged, whatever two steps trained
    setting = "judged at lite: d 4, k 6, n 16; lite32: d 32, k 10, n 16 in training, the d 32 runs' final"
    assert setting in lr["numbers"], lr["numbers"]
    assert "d 32: final train_loss at lr 0.1 and 1.0 > at 0.01: " in lr["numbers"]
    assert re.search(r"at 0.01: \d/2 cases of 24 in the paper grid", lr["numbers"])  # lr 0.1 and 1.0, d 32
    assert re.search(r"d 4: final train_loss at lr 1.0 > at 0.01: \d/1 cases of 12", lr["numbers"])


@pytest.mark.slow  # claims over several experiments: 8 s
def test_several_experiments_judge_each_configuration_at_the_setting_nearest_the_papers(
    two_sweeps: str, sqlite_uri: str, tmp_path: Path
) -> None:
    """A third experiment, in a store of its own (NAME@URI), trains lite's d 4 lr pair again at n 32, nearer
    the paper's 512 than lite's 16: judged as one, large_lr_worse reads that pair from it alone (its numbers
    name its n, not lite's), and at lite scale from lite alone; the d 32 half, which only lite32 trains, is
    read in both."""
    for rate in (0.01, 1.0):
        trained(sqlite_uri, "plus", tmp_path, "lr", "loss.tau=0.1", "train.steps=2", "task.d=4", "task.k=6",
                "task.n=32", f"optim.lr={rate}")  # fmt: skip
    words = [f"tracking.uri={two_sweeps}", f"out={tmp_path}", "speed_json=null", *QUICK_EVAL]
    assert claims.main([*words, "eval.d32_n=null", f"experiments=[lite,lite32,plus@{sqlite_uri}]"]) == 0
    nearest = claims_of(tmp_path / "lite+lite32+plus").loc["large_lr_worse", "numbers"]
    assert "lite32: d 32, k 10, n 16" in nearest and "plus: d 4, k 6, n 32" in nearest, nearest
    assert "lite: d 4" not in nearest, nearest

    settings = replace(SETTINGS, d32_n=None)
    stores = {"lite": two_sweeps, "lite32": two_sweeps, "plus": sqlite_uri}
    found = evidence_of([context(uri, e, tmp_path / e, settings) for e, uri in stores.items()])
    farthest = judge(RECORDS["large_lr_worse"], at_setting(found, nearest=False)).numbers
    assert "lite32: d 32, k 10, n 16" in farthest and "lite: d 4, k 6, n 16" in farthest, farthest
    assert "plus:" not in farthest, farthest
    pooled = judge(RECORDS["large_lr_worse"], found).numbers  # unchosen, both d 4 settings are read
    assert "lite: d 4, k 6, n 16" in pooled and "plus: d 4, k 6, n 32" in pooled


def test_several_experiments_are_checked_before_any_work(two_sweeps: str, tmp_path: Path, capsys) -> None:
    words = [f"tracking.uri={two_sweeps}", f"out={tmp_path}", "speed_json=null", *QUICK_EVAL]
    assert claims.main([*words, "experiments=[lite,lite]"]) == exit_codes.CONFIG
    assert (
        "experiments=['lite', 'lite'] is not allowed: null or a list of distinct experiment names, [a,b,...]"
        in capsys.readouterr().err
    )
    assert claims.main([*words, "experiments=[lite,lite64]"]) == exit_codes.NO_RUNS
    assert "experiment 'lite64' does not exist" in capsys.readouterr().err
    assert report.main([*words, "experiments=[lite,lite32]"]) == exit_codes.CONFIG
    assert (
        "experiments=['lite', 'lite32'] is not allowed here: the report draws one" in capsys.readouterr().err
    )
    assert not (tmp_path / "lite+lite32").exists() and not (tmp_path / "lite").exists()


@pytest.mark.slow  # claims over two experiments: 8 s
def test_make_targets_end_with_the_claims_on_both_experiments_once_the_store_holds_both(
    sqlite_uri: str, tmp_path: Path
) -> None:
    """Both targets' last recipe line is the claims on both experiments. Run as make runs it, in a folder
    whose ./mlflow.db holds lite's experiment only, it names the missing experiment and ends the target
    without failing it (exit code 7, no runs); any other exit code still fails it."""
    trained(sqlite_uri, "leaner-clustering-lite", tmp_path, "lr", "task.d=4", "task.k=6")
    claims_cli = f"{sys.executable} -m analysis.claims"
    lines = []
    for target in ("reproduce", "reproduce-d32"):
        recipe = subprocess.run(
            ["make", "--no-print-directory", "-n", target, f"PY={sys.executable}"],  # also under `make test`
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        lines.append(recipe.stdout.strip().splitlines()[-1])
        assert lines[-1].startswith(
            f"{claims_cli} experiments=[leaner-clustering-lite,leaner-clustering-lite32] "
        )
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("MLFLOW_")}  # ./mlflow.db, as make

    def run(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True)

    skipped = run(lines[0])
    assert skipped.returncode == 0, skipped.stderr
    assert "experiment 'leaner-clustering-lite32' does not exist" in skipped.stderr
    for line in lines:  # in both targets: exit code 7 ends it, any other (1 here) fails it
        assert run(line.replace(claims_cli, "sh -c 'exit 7' --")).returncode == 0, line
        assert run(line.replace(claims_cli, "false")).returncode != 0, line
