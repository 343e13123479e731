"""The analysis on a real store: the `smoke_store` sweep of conftest.py (Ray Tune, SQLite MLflow).
 Oracles are independent of the analysis
code: MlflowClient's own metric histories with numpy.median/percentile,
Lloyd's monotonicity, the exact Lloyd transformer, the loss recomputed from
the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from support.configs import SMALL_EVAL
from support.repo import REPO

from analysis import report
from analysis.aggregate import seed_band
from analysis.checkpoint_eval import EvalSettings, fresh_tasks, load_model, spec_of, trajectories
from analysis.claims import __main__ as claims
from analysis.claims.cases import FAIL, PASS, UNTESTED
from analysis.claims.evidence import evidence_of
from analysis.claims.records import CLAIMS, PAPER
from analysis.cli import expected_sizes
from analysis.context import Context
from analysis.eval_figures import MODELS
from analysis.figures import FIGURES
from analysis.plot import MissingInput
from analysis.read import read
from analysis.runs import load_runs
from analysis.style import EMBEDDING_COLORS, LLOYD
from bench.step_seconds import bench_step_seconds
from cli import exit_codes
from config.compose import compose
from models.exact import ExactLloydTransformer
from models.losses import smoothed_objective
from tasks.sampler import TaskSpec, sample_tasks
from tasks.spec import FAMILIES
from tracking.mlflow_recorder import MlflowRecorder
from tracking.names import (
    CONFIG_HASH,
    EVAL_OF,
    EVALUATION_LINK,
    MLFLOW_PARENT_RUN_ID,
    REPORT_DIR,
    SEED,
    SUBGRIDS,
    SWEEP,
    UI_RUN_COLOR,
    VAL_REL_LLOYD,
)
from training.loop import train

EXPERIMENT = "leaner-clustering"  # the tracking config's default experiment, where the sweep writes
SMALL = EvalSettings.configured(
    batches=1,
    batch=4,
    steps=4,
    inits=("random", "gonzalez"),
    lengths=(16, 32),
    surface_points=3,
    dissimilarity_tasks=2,
    device="cpu",
)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
# Figures whose sub-grid the smoke store lacks (tests/test_figures.py draws them on a store that has them).
ABSENT = {
    "ablation_lr": "lr",
    "ablation_lr_curves": "lr",
    "ablation_points": "points",
    "ablation_dim": "dim",
    "ablation_clusters": "clusters",
}


@pytest.fixture(scope="session")
def ctx(smoke_store, tmp_path_factory) -> Context:
    runs = load_runs(smoke_store, EXPERIMENT)
    out = tmp_path_factory.mktemp("report")
    # The step-time benchmark of the store's sweep, as `make reproduce` writes it before the report.
    step_json = out / "step_seconds.json"
    step_json.write_text(json.dumps(bench_step_seconds(["sweep=smoke", "train.device=cpu"], 1, 1)))
    everything = report.wants({"figures": None})  # what the full report reads: every figure's, the claims'
    return read(
        smoke_store, EXPERIMENT, runs, SMALL, out, everything, expected=expected_sizes(), step_json=step_json
    )


def _expected_embeddings(uri: str, family: str = "normal") -> set[str]:
    """Straight from MlflowClient: the embeddings of finished runs trained on `family`."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    found = client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'")
    short = {"onehot": "OH", "binary": "BN", "none": "NA"}
    return {
        short[r.data.params["model.embedding"]]
        for r in found
        if r.data.params.get("task.family") == family and "config_hash" in r.data.tags
    }


def test_iqr_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "g": rng.integers(0, 3, 600),
            "step": rng.integers(0, 5, 600),
            "seed": np.arange(600),
            "value": rng.lognormal(size=600),
        }
    )
    band = seed_band(frame, ["g"], "step", "value")
    for row in band.itertuples():
        values = frame[(frame["g"] == row.g) & (frame["step"] == row.step)]["value"].to_numpy()
        assert row.n_seeds == len(values)
        np.testing.assert_allclose(
            [row.q25, row.median, row.q75], np.percentile(values, [25, 50, 75]), rtol=1e-12
        )


@pytest.mark.parametrize("embedding", ["binary", "onehot"])
def test_iterating_the_exact_transformer_is_lloyd(embedding: str) -> None:
    """Re-embedded and naive iteration of the exact Lloyd transformer both reproduce Lloyd's curve."""
    X, C0 = sample_tasks(TaskSpec(n=64, d=3, k=5), 6, torch.Generator().manual_seed(1))
    model = ExactLloydTransformer(3, 5, embedding).double()
    curves = trajectories(model, X.double(), C0.double(), 6, ("reembed", "naive"))
    torch.testing.assert_close(curves["reembed"], curves["lloyd"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(curves["naive"], curves["lloyd"], rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in FIGURES if n not in ("speed_memory", *ABSENT)])
def test_each_figure_returns_what_it_plotted(ctx: Context, smoke_store: str, name: str) -> None:
    figure = FIGURES[name](ctx)
    png = ctx.out_dir / f"{name}.png"
    assert png.stat().st_size > 1000 and (ctx.out_dir / f"{name}.pdf").stat().st_size > 1000
    data = figure.data
    assert not data.empty
    embeddings = _expected_embeddings(smoke_store)
    panels, series = set(data.get("panel", [])), set(data.get("series", [])) - {LLOYD}
    if name == "convergence":
        assert panels == {"train_loss | d=4, tau=1", "val_rel_lloyd | d=4, tau=1"}
        assert series == {f"{e}-L2" for e in embeddings}
    elif name == "multistep":
        assert panels == {f"init {i} | {m}" for i in SMALL.inits for m in ("reembed", "naive", "attention")}
        assert series == embeddings
    elif name == "mixture_shift":
        assert panels == {
            f"test: {s}" for s in ("train", "unequal_weights", "anisotropic", "scale_0.05", "scale_0.2")
        }
        assert series == embeddings
    elif name == "length":
        assert panels == {f"test n={n}" for n in SMALL.lengths} and series == embeddings
    elif name == "family_transfer":
        trained = {f for f in ("normal", "cauchy") if _expected_embeddings(smoke_store, f)}
        assert {p.split(" | ")[1] for p in panels} == {f"test {f}" for f in FAMILIES}
        assert {p.split(" | ")[0].split(" (")[0] for p in panels} == {f"train {f}" for f in trained}
        assert set(figure.tables["family_transfer_table"]["test"]) == set(FAMILIES)
    elif name == "ablation_family":
        assert panels == {"d=4, tau=1"} and series == {"OH-L2"}
        assert set(data.loc[data["series"] != LLOYD, "x"]) == {"normal", "cauchy"}
    elif name == "time_to_quality":
        assert series == embeddings - {"NA"} and (data["x"] >= 0).all()
        measured = {  # the benchmark's seconds per step of each embedding (smoke: one shape each)
            {"onehot": "OH", "binary": "BN"}[r["config"]["model.embedding"]]: r["seconds_per_step"]
            for r in json.loads(ctx.step_json.read_text())["rows"]
        }
        assert (
            dict(
                zip(
                    figure.tables["step_seconds"]["series"], figure.tables["step_seconds"]["seconds_per_step"]
                )
            )
            == measured
        )
    elif name == "loss_surface":
        assert len(data) == len(panels) * SMALL.surface_points**2
        assert {p.split(", ")[1] for p in panels} == embeddings - {"NA"}
    elif name == "task_dissimilarity":
        m = len(FAMILIES) * SMALL.dissimilarity_tasks
        assert len(data) == m * m and (data.loc[data["task_i"] == data["task_j"], "distance"] == 0).all()
        matrix = data.pivot(index="task_i", columns="task_j", values="distance")
        np.testing.assert_allclose(matrix.to_numpy(), matrix.to_numpy().T)
    if name not in ("loss_surface", "task_dissimilarity"):
        assert LLOYD in set(data["series"])  # every curve figure shows Lloyd's
    if name in ("multistep", "mixture_shift", "length", "family_transfer", "loss_surface"):
        assert any("checkpoints/last.pt` (eval.checkpoint=last" in note for note in figure.notes)


@pytest.mark.slow
def test_lloyd_curves_never_increase(ctx: Context) -> None:
    data = FIGURES["multistep"](ctx).data
    lloyd = data[data["series"] == LLOYD]
    assert lloyd["panel"].nunique() == len(SMALL.inits) * 3
    for _, curve in lloyd.groupby("panel"):
        for column in ("median", "q25", "q75"):
            values = curve.sort_values("x")[column].to_numpy()
            assert (np.diff(values) <= 1e-9).all(), (column, values)


@pytest.mark.slow
def test_convergence_medians_match_mlflow_histories(ctx: Context, smoke_store: str) -> None:
    data = FIGURES["convergence"](ctx).data
    client = MlflowClient(smoke_store)
    runs = ctx.runs[(ctx.runs["model.embedding"] == "binary") & (ctx.runs["task.family"] == "normal")]
    per_step: dict[int, list[float]] = {}
    for run_id in runs["run_id"]:
        for m in client.get_metric_history(run_id, VAL_REL_LLOYD):
            per_step.setdefault(m.step, []).append(m.value)
    curve = data[(data["series"] == "BN-L2") & data["panel"].str.startswith(VAL_REL_LLOYD)].set_index("x")
    assert sorted(curve.index) == sorted(per_step)
    for step, values in per_step.items():
        np.testing.assert_allclose(
            curve.loc[step, ["q25", "median", "q75"]].astype(float),
            np.percentile(values, [25, 50, 75]),
            rtol=1e-12,
        )


@pytest.mark.slow
def test_convergence_y_range_leaves_out_the_untrained_spike(ctx: Context) -> None:
    """Each panel's y-range holds every curve's final median and Lloyd's line, not the untrained model's
    first point (val_rel_lloyd ~12-60 on the smoke store, against ~3-5 once trained)."""
    figure = FIGURES["convergence"](ctx)
    data = figure.data
    assert set(figure.ylims) == set(data["panel"]) and len(figure.ylims) == 2
    for panel, (low, high) in figure.ylims.items():
        curves = data[(data["panel"] == panel) & (data["series"] != LLOYD)].sort_values("x")
        firsts = curves.groupby("series")["median"].first()
        finals = curves.groupby("series")["median"].last()
        assert firsts.max() > high, (panel, firsts.max(), high)  # the spike lies above the range
        assert ((low <= finals) & (finals <= high)).all(), (panel, finals.to_dict(), low, high)
        if panel.startswith(VAL_REL_LLOYD):
            assert low < 1 < high  # Lloyd's line
    assert any("leaves out every curve's first point" in note for note in figure.notes)


@pytest.mark.slow
def test_loss_surface_centre_is_the_trained_models_loss(ctx: Context, smoke_store: str) -> None:
    drawn, _ = MODELS["loss_surface"](ctx)  # the models the figure evaluates, read with the context
    run = drawn[(drawn["model.embedding"] == "onehot") & (drawn["task.family"] == "normal")].iloc[0]
    table = ctx.evaluation("loss_surface", run)
    centre = table[(table["alpha"] == 0) & (table["beta"] == 0)]["value"].item()
    model = load_model(MlflowClient(smoke_store), run, torch.device("cpu"), SMALL.checkpoint)
    tasks = fresh_tasks(spec_of(run), SMALL, run[SEED], "loss_surface")
    with torch.no_grad():
        loss = torch.cat([smoothed_objective(X, model(X, C), 1.0, "l2") for X, C in tasks]).mean()
    assert centre == pytest.approx(float(loss), rel=1e-6)


@pytest.mark.slow
def test_missing_inputs_are_named(ctx: Context) -> None:
    with pytest.raises(MissingInput, match="speed_memory"):
        FIGURES["speed_memory"](ctx)
    figure = FIGURES["family_transfer"](ctx)
    assert any("`family` sub-grid" in note and "/60 configurations found" in note for note in figure.notes)
    for name, subgrid in ABSENT.items():
        with pytest.raises(MissingInput, match=f"`{subgrid}` sub-grid"):
            FIGURES[name](ctx)


@pytest.mark.slow
def test_report_cli_writes_index_and_reuses_evaluations(smoke_store: str, tmp_path: Path) -> None:
    args = [
        sys.executable,
        "-m",
        "analysis.report",
        f"tracking.uri={smoke_store}",
        f"out={tmp_path}",
        "figures=[speed_memory,length]",
        f"speed_json={tmp_path}/none.json",
        *SMALL_EVAL,
    ]
    first = subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    last = first.stdout.strip().splitlines()[-1]
    assert last.startswith("report: "), last  # labelled, the last line
    index = Path(last.removeprefix("report: "))
    assert index == (tmp_path / EXPERIMENT / "index.md").resolve()
    text = index.read_text()
    assert "![length](length.png)" in text and "Runs used: 6" in text
    assert "Checkpoints: probes load each run's `checkpoints/last.pt` (eval.checkpoint=last" in text
    assert "## speed_memory" not in text  # not drawn: named once, at the end, with what it needs
    assert text.split("## Not drawn")[1].startswith("\n\nWhat this store cannot support")
    assert "- **speed_memory**: needs the benchmark's JSON" in text
    assert "The paper's claims: not judged by a report of chosen figures" in text
    assert (index.parent / "length.png").stat().st_size > 1000
    client = MlflowClient(smoke_store)
    evaluations = client.get_experiment_by_name(f"{EXPERIMENT}-evaluations")
    logged = client.search_runs([evaluations.experiment_id], "tags.evaluation = 'length'")
    finished_normal = load_runs(smoke_store, EXPERIMENT, where={"task.family": "normal"})
    assert {r.data.tags[EVAL_OF] for r in logged} == set(finished_normal["run_id"])
    for evaluation in logged:  # and each training run links to its evaluation
        assert (
            client.get_run(evaluation.data.tags[EVAL_OF]).data.tags[EVALUATION_LINK + "length"]
            == evaluation.info.run_id
        )
    # A report on one sweep's runs is stored in the sweep's parent run, and the printed address opens it.
    parent = client.get_run(logged[0].data.tags[EVAL_OF]).data.tags[MLFLOW_PARENT_RUN_ID]
    assert (
        f"/runs/{parent}/artifactPath/{REPORT_DIR}/index.html?workflowType=machine_learning" in first.stdout
    )
    attached = {a.path for a in client.list_artifacts(parent, REPORT_DIR)}
    assert {
        f"{REPORT_DIR}/{name}" for name in ("index.md", "index.html", "length.png", "length.csv")
    } <= attached
    assert (
        Path(client.download_artifacts(parent, f"{REPORT_DIR}/index.md", str(tmp_path / "dl"))).read_text()
        == text
    )
    before = pd.read_csv(index.parent / "length.csv")
    # A second report, without the local cache: the evaluations come back from MLflow, none is rerun.
    for cached in (index.parent / "cache").iterdir():
        cached.unlink()
    assert report.main(args[3:]) == 0  # the same command, in this process
    assert len(client.search_runs([evaluations.experiment_id], "tags.evaluation = 'length'")) == len(logged)
    pd.testing.assert_frame_equal(pd.read_csv(index.parent / "length.csv"), before)


@pytest.mark.slow
def test_a_report_beside_a_process_holding_the_stores_lock_is_written_and_attached_later(
    smoke_store: str, tmp_path: Path, capsys
) -> None:
    """Another process holds the SQLite file's write lock for the whole report (a sweep mid-write, a
    database browser's open transaction): the report is written with every figure, its evaluations kept
    under reports/ and its parent-run attach left for later, each said in one line (exit 0); it waits out
    the store's timeout twice, not at each evaluation. The same command, the lock gone, attaches it."""
    from conftest import _copy_store

    (tmp_path / "store").mkdir()
    uri = _copy_store(Path(smoke_store.removeprefix("sqlite:///")).parent, tmp_path / "store")
    # eval.steps=3: evaluations no other test logged in the copied store, so the report must write them
    args = [
        f"tracking.uri={uri}",
        f"out={tmp_path}",
        "figures=[length,multistep]",
        *SMALL_EVAL,
        "eval.steps=3",
    ]
    holder = sqlite3.connect(uri.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, as a writer mid-transaction holds it
    try:
        assert report.main(args) == 0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    said = capsys.readouterr()
    assert "the evaluations are kept under" in said.err and "'database is locked'" in said.err
    assert "Traceback" not in said.err  # MLflow's own log of each refusal: said once, in our line
    assert "the report stays here, not on sweep smoke's run (the same command attaches it)" in said.out
    index = tmp_path / EXPERIMENT / "index.md"
    assert "![length](length.png)" in index.read_text() and "failed" not in index.read_text()
    assert report.main(args) == 0
    assert "report attached to the parent run of sweep smoke" in capsys.readouterr().out


@pytest.mark.slow
def test_claims_fail_on_a_store_built_to_contradict_them(smoke_store: str, tmp_path: Path, capsys) -> None:
    """Barely trained tau=0.1 onehot/binary models of the `tau` sub-grid lose to one Lloyd step:
    tau01_beats_lloyd must FAIL, no claim about models may PASS, and those whose sub-grids the store lacks
    are UNTESTED."""
    experiment = "contradiction"
    recorder = MlflowRecorder(smoke_store, experiment, tags={SUBGRIDS: "tau"})
    for embedding in ("onehot", "binary"):
        for seed in (153476998, 235510766):
            cfg = compose(
                [
                    "task.n=16",
                    "train.steps=2",
                    "train.eval_every=1",
                    "train.batch=4",
                    "train.val_batches=1",
                    "optim.lr=1e-6",
                    "loss.tau=0.1",
                    f"model.embedding={embedding}",
                    f"seed={seed}",
                    f"tracking.uri={smoke_store}",
                    f"tracking.experiment={experiment}",
                ]
            )
            result = train(cfg, recorder, tmp_path / f"{embedding}-{seed}")
            assert result.metrics[VAL_REL_LLOYD] > 1  # the store contradicts the claim
    args = [
        f"tracking.uri={smoke_store}",
        f"tracking.experiment={experiment}",
        f"out={tmp_path}",
        f"speed_json={tmp_path}/none.json",
        *SMALL_EVAL,
    ]
    assert claims.main(args) == 0
    printed = capsys.readouterr().out
    assert PAPER["tau01_beats_lloyd"] in printed and printed.strip().endswith("claims.csv")
    table = pd.read_csv(tmp_path / experiment / "claims.csv").set_index("name")
    paper = table[~table["beyond"]]
    assert f"\ntotals: the paper's {len(paper)} claims: {(paper['status'] == PASS).sum()} PASS, " in printed
    assert list(table.index) == [record.name for record in CLAIMS]
    status = table["status"]
    assert status["tau01_beats_lloyd"] == FAIL and "0/2 cases" in table.loc["tau01_beats_lloyd", "numbers"]
    assert not (status.drop("cauchy_dissimilar") == PASS).any(), table
    probed = ["reembed_beats_lloyd", "length_generalises", "shift_generalises", "reembed_from_good_inits"]
    assert (status[probed] != UNTESTED).all(), table.loc[probed, "numbers"]
    assert all("2/4 configurations with >= 2 seeds" in table.loc[name, "numbers"] for name in probed)
    absent = [
        "l2_lower_train_loss",
        "l2_better_val_tau1_d4",
        "noembed_reembed_trails_lloyd",
        "cauchy_fails",
        "families_generalise",
        "ne_fails_gumbel_laplace_tau1",
        "clusters_d4_tau1",
        "large_lr_worse",
        "binary_faster_leaner",
        "ne_val_rises_tau1",
        "family_transfer_multistep",
        "clusters_d4_tau01",
        "clusters_d32",
    ]
    assert (status[absent] == UNTESTED).all(), table.loc[absent, "numbers"]
    assert "## Beyond the paper" in (tmp_path / experiment / "claims.md").read_text()
    # The figures draw exactly the models the claims judged (one set): the tau 0.1, d 4 runs of `tau`.
    runs = load_runs(smoke_store, experiment)
    ctx = read(smoke_store, experiment, runs, SMALL, tmp_path / experiment, report.wants({"figures": None}))
    for name in ("multistep", "length", "mixture_shift"):
        assert set(FIGURES[name](ctx).run_ids) == set(runs["run_id"]), name


@pytest.mark.slow
def test_claims_reuse_what_the_report_drew(ctx: Context) -> None:
    figure = FIGURES["task_dissimilarity"](ctx)
    assert evidence_of([ctx], {"task_dissimilarity": figure}).blocks is figure.tables["family_blocks"]
    png = ctx.out_dir / "task_dissimilarity.png"
    png.unlink()
    alone = evidence_of([ctx]).blocks  # `python -m analysis.claims`: computed, not drawn
    pd.testing.assert_frame_equal(alone, figure.tables["family_blocks"])
    assert not png.exists()


def test_report_on_an_empty_experiment_explains_and_fails(tmp_path: Path, sqlite_uri: str, capsys) -> None:
    uri = sqlite_uri
    MlflowClient(uri).create_experiment("empty", artifact_location=(tmp_path / "artifacts").as_uri())
    for experiment, words in (("empty", "has no training runs"), ("absent", "does not exist")):
        assert (
            report.main([f"tracking.uri={uri}", f"tracking.experiment={experiment}", f"out={tmp_path}"]) == 7
        )
        err = capsys.readouterr().err
        assert (
            "nothing to analyse" in err
            and words in err
            and experiment in err
            and "python -m sweeper.sweep" in err
        )
        assert not (tmp_path / experiment / "index.md").exists()


def test_a_sweep_the_experiment_lacks_is_answered_with_those_it_holds(
    tmp_path: Path, sqlite_uri: str, capsys
) -> None:
    """A typo in select.sweep (or select.subgrid) is not an empty store: the answer lists the sweeps and
    sub-grids there, and sends nobody to fill the store with the demo sweep."""
    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment("held", artifact_location=(tmp_path / "artifacts").as_uri())
    for seed in (1, 2):
        client.create_run(experiment, tags={CONFIG_HASH: f"h{seed}", SWEEP: "smoke", SUBGRIDS: "smoke,tau"})
    for select in ("select.sweep=smokey", "select.subgrid=taus"):
        argv = [f"tracking.uri={sqlite_uri}", "tracking.experiment=held", select, f"out={tmp_path}"]
        assert report.main(argv) == exit_codes.NO_RUNS
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "sweeps smoke, sub-grids smoke, tau" in err, err
        assert "sweep=demo" not in err and "no training runs" not in err, err


def test_bad_arguments_are_rejected_before_any_work(tmp_path: Path, capsys) -> None:
    for bad, named in (
        ("eval.colour=red", "allowed keys are seed, batches, batch, steps"),  # eval's keys (conf/report)
        (
            "colour=red",
            "allowed keys are tracking, figures, experiments, out, select, speed_json, step_json, eval",
        ),
        ("figures=[multistep,nope]", "family_transfer"),
    ):
        assert report.main([f"tracking.uri=sqlite:///{tmp_path}/x.db", bad]) == 2
        err = capsys.readouterr().err
        assert bad.split("=")[0] in err and named in err
    assert not (tmp_path / "x.db").exists()  # rejected before the store was opened


@pytest.mark.slow
def test_unknown_config_key_in_a_filter_is_named(smoke_store: str) -> None:
    with pytest.raises(KeyError, match="task.q"):
        load_runs(smoke_store, EXPERIMENT, where={"task.q": 1})


@pytest.mark.slow
def test_speed_memory_plots_the_benchmark_rows(ctx: Context, tmp_path: Path) -> None:
    """The benchmark's JSON (`python -m bench speed_memory --out FILE`): every measured value is plotted."""
    rows = [
        {
            "d": d,
            "k": k,
            **{
                e: {
                    "d_emb": d + k,
                    "forward_seconds": 0.001 * d * k * (2 if e == "onehot" else 1),
                    "backward_seconds": 0.002 * k,
                    "peak_memory_bytes": 1000 * k + d,
                }
                for e in ("onehot", "binary")
            },
            "onehot_over_binary_forward_seconds": 2.0,
        }
        for d in (4, 16)
        for k in (8, 64)
    ]
    path = tmp_path / "speed_memory.json"
    path.write_text(json.dumps({"command": "speed_memory", "rows": rows}))
    figure = FIGURES["speed_memory"](dataclasses.replace(ctx, speed_json=path, out_dir=tmp_path))
    assert (tmp_path / "speed_memory.png").stat().st_size > 1000
    data = figure.data
    assert set(data["series"]) == {"OH", "BN"} and data["panel"].nunique() == 3 * 2
    for row in rows:
        for e, label in (("onehot", "OH"), ("binary", "BN")):
            for measure, value in row[e].items():
                if measure != "d_emb":
                    hit = data[
                        (data["panel"] == f"{measure} | d={row['d']}")
                        & (data["series"] == label)
                        & (data["x"] == row["k"])
                    ]
                    assert hit["median"].item() == value


@pytest.mark.slow
def test_full_report_opens_on_the_headline_and_lists_what_it_left_out(
    smoke_store: str, tmp_path: Path
) -> None:
    """The whole report on the smoke store (n 16, k 6: the test length n x 1/4 = 4 cannot hold 6 clusters)
    exits 0; index.md and index.html open on the headline (the median final val_rel_lloyd per embedding,
    against MlflowClient's own final values, and the claims' verdicts), draw convergence first, and name
    every figure they left out, and why, once, at the end.

    Last in this file: its length evaluations (other eval settings) relink the store's training runs to
    them, which test_report_cli_writes_index_and_reuses_evaluations checks for its own."""
    small = [arg for arg in SMALL_EVAL if not arg.startswith("eval.lengths=")]
    args = [f"tracking.uri={smoke_store}", f"out={tmp_path}", "speed_json=null", "step_json=null"]
    assert report.main([*args, *small, "eval.lengths=[]"]) == 0
    folder = tmp_path / EXPERIMENT
    text = (folder / "index.md").read_text()
    headings = [line.removeprefix("## ") for line in text.splitlines() if line.startswith("## ")]
    assert headings[:2] == ["Headline", "convergence"] and headings[-2:] == ["claims", "Not drawn"]
    left_out = text.split("## Not drawn")[1]
    for name in ("speed_memory", "time_to_quality", *ABSENT):
        assert name not in headings and f"- **{name}**: " in left_out and "needs" in left_out
    assert text.count("needs the `lr` sub-grid") == 2  # said once for each lr figure, at the end only
    assert "test n=4 left out for " in text and "task.n=4 is not allowed: an integer >= k (k=6)" in text
    headline = text.split("## Headline")[1].split("## convergence")[0]
    client = MlflowClient(smoke_store)
    finished = client.search_runs(
        [client.get_experiment_by_name(EXPERIMENT).experiment_id], "attributes.status = 'FINISHED'"
    )
    finals: dict[str, list[float]] = {}
    for run in finished:
        if "config_hash" in run.data.tags:
            embedding = run.data.params["model.embedding"]
            finals.setdefault(embedding, []).append(run.data.metrics[VAL_REL_LLOYD])
            assert run.data.tags[UI_RUN_COLOR] == EMBEDDING_COLORS[embedding]  # the UI's colour, as here
    for embedding, values in finals.items():
        assert f"| {embedding} | {len(values)} | {float(np.median(values)):.4g} |" in headline, embedding
    assert "| PASS | `cauchy_dissimilar`" in headline
    html_ids = re.findall(r'<h2 id="([^"]+)"', (folder / "index.html").read_text())
    assert html_ids[:2] == ["headline", "convergence"] and html_ids[-1] == "not-drawn"
    counts = re.search(
        r"The paper's (\d+ claims: \d+ PASS, \d+ PARTIAL, \d+ FAIL, \d+ UNTESTED)", headline
    ).group(1)
    # A report of chosen figures judges no claim: its headline reads the claims.csv the full one left.
    assert report.main([*args, *small, "eval.lengths=[]", "figures=[convergence]"]) == 0
    again = (folder / "index.md").read_text().split("## convergence")[0]
    assert f"The paper's {counts} (from [claims.csv](claims.csv) beside this report" in again
