"""The ablation figures, time to quality and the probes' checkpoint, on small real MLflow stores.

`store` is a SQLite MLflow store written with MlflowClient as a sweep writes one (a configuration's
flat params, the config_hash, seed, subgrids and outcome tags, val_rel_lloyd points at steps 0, 10,
20) but with values drawn here, so no model is trained: a `clusters` sub-grid over k, d, tau,
regularizer and embedding (3 seeds; one run diverged, and one configuration whose runs all
diverged) and a small `lr` sub-grid. Oracles read the same values back through MlflowClient and
reduce them with numpy. The checkpoint tests train one tiny run for real.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from omegaconf import OmegaConf

from analysis import eval_figures, report
from analysis.checkpoint_eval import EvalSettings, Evaluator, load_model
from analysis.cli import expected_sizes
from analysis.context import Context
from analysis.figures import FIGURES
from analysis.plot import MissingInput
from analysis.read import read
from analysis.runs import load_runs
from analysis.style import LLOYD
from bench.step_seconds import SHAPE_KEYS
from config.compose import compose
from config.identity import config_hash, flat_params, run_name
from config.schema import ConfigError
from tracking.mlflow_recorder import MlflowRecorder
from tracking.names import (
    BEST_CHECKPOINT,
    CHECKPOINT_DIR,
    CONFIG_HASH,
    DIVERGED,
    EVAL_KEY,
    EVALUATION,
    FINISHED,
    LAST_CHECKPOINT,
    OUTCOME,
    RESULT_ARTIFACT,
    SEED,
    SUBGRIDS,
    TRAIN_LOSS,
    VAL_REL_LLOYD,
)
from training.loop import train

EXPERIMENT = "figures"
SEEDS = (1, 2, 3)
STEPS = (0, 10, 20)
BASE = ["task.n=32", "train.batch=2", "train.steps=20", "train.eval_every=10", "train.val_batches=1"]
SHORT = {"onehot": "OH", "binary": "BN", "l2": "L2", "ne": "NE"}
CLUSTERS = {
    "task.k": (6, 25),
    "task.d": (4, 32),
    "loss.tau": (1.0, 0.1),
    "loss.regularizer": ("l2", "ne"),
    "model.embedding": ("onehot", "binary"),
}
LR = {"optim.lr": (0.01, 0.1), "task.d": (4, 32)}
ONE_DIVERGED = {
    "task.k": 6,
    "task.d": 32,
    "loss.tau": 0.1,
    "loss.regularizer": "l2",
    "model.embedding": "onehot",
}
ALL_DIVERGED = {
    "task.k": 25,
    "task.d": 4,
    "loss.tau": 1.0,
    "loss.regularizer": "ne",
    "model.embedding": "binary",
}
SETTINGS = EvalSettings.configured(device="cpu")


def _log_runs(
    client: MlflowClient,
    exp_id: str,
    subgrid: str,
    axes: dict,
    rng: np.random.Generator,
    steps: dict[float, int] | None = None,
) -> None:
    """One run per configuration of the product of `axes` and seed, as sweeper.train logs it; `steps`: a tau's
    train.steps where not 20 (points at 0, steps / 2 and steps, train_loss too)."""
    base = compose(BASE)  # composed once: the typed config's own assignment checks each value below
    for values in itertools.product(*axes.values()):
        config = dict(zip(axes, values))
        if steps:
            config |= {"train.steps": steps[config["loss.tau"]]}
        for seed in SEEDS:
            cfg = base.copy()
            for key, value in {**config, "seed": seed}.items():
                OmegaConf.update(cfg, key, value)
            diverged = config == ALL_DIVERGED or (config == ONE_DIVERGED and seed == SEEDS[0])
            tags = {
                CONFIG_HASH: config_hash(cfg),
                SEED: str(seed),
                SUBGRIDS: subgrid,
                OUTCOME: DIVERGED if diverged else FINISHED,
                "mlflow.runName": run_name(cfg),
            }
            run_id = client.create_run(exp_id, tags=tags).info.run_id
            at = (0, cfg.train.steps // 2, cfg.train.steps)
            points = [
                Metric(VAL_REL_LLOYD, float(v), 1000 * s, s) for s, v in zip(at, rng.lognormal(0, 0.3, 3))
            ]
            if steps:
                points += [
                    Metric(TRAIN_LOSS, float(v), 1000 * s, s) for s, v in zip(at, rng.lognormal(2, 0.3, 3))
                ]
            client.log_batch(
                run_id, metrics=points, params=[Param(k, v) for k, v in flat_params(cfg).items()]
            )
            client.set_terminated(run_id, "FAILED" if diverged else "FINISHED")


@pytest.fixture(scope="module")
def store(tmp_path_factory, _empty_store: Path) -> str:
    root = tmp_path_factory.mktemp("figures_store")
    shutil.copyfile(_empty_store, root / "mlflow.db")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    rng = np.random.default_rng(0)
    _log_runs(client, exp_id, "clusters", CLUSTERS, rng)
    _log_runs(client, exp_id, "lr", LR, rng)
    return uri


TAU = {"loss.tau": (1.0, 0.1), "loss.regularizer": ("l2", "ne"), "model.embedding": ("onehot", "binary")}
TAU_STEPS = {1.0: 10, 0.1: 20}  # tau 1 trained shorter, as sweep=lite does (4,000 and 10,000 steps)


@pytest.fixture(scope="module")
def tau_store(tmp_path_factory, _empty_store: Path) -> str:
    """A `tau` sub-grid whose tau 1 runs train 10 steps and tau 0.1 runs 20."""
    root = tmp_path_factory.mktemp("tau_store")
    shutil.copyfile(_empty_store, root / "mlflow.db")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    _log_runs(client, exp_id, "tau", TAU, np.random.default_rng(1), steps=TAU_STEPS)
    return uri


# Seconds per step of each shape of the store's onehot/binary runs, as `python -m bench step_seconds` writes
# them: a different number per shape, so a series given another shape's time is caught.
STEP_TIMES = {
    (d, k, e): 0.001 * (i + 1)
    for i, (d, k, e) in enumerate(itertools.product((4, 32), (6, 25), ("onehot", "binary")))
}


def _step_json(path: Path) -> Path:
    base = compose(BASE)
    rows = [
        {
            "config": {
                **{key: OmegaConf.select(base, key) for key in SHAPE_KEYS},
                "task.d": d,
                "task.k": k,
                "model.embedding": e,
            },
            "seconds_per_step": seconds,
        }
        for (d, k, e), seconds in STEP_TIMES.items()
    ]
    body = {"command": "step_seconds", "sweep": "x", "device": "cpu", "threads": 1, "rounds": 3, "rows": rows}
    path.write_text(json.dumps(body))
    return path


@pytest.fixture
def ctx(store: str, tmp_path: Path) -> Context:
    return read(
        store,
        EXPERIMENT,
        load_runs(store, EXPERIMENT),
        SETTINGS,
        tmp_path,
        report.wants({"figures": None}),
        expected=expected_sizes(),
        step_json=_step_json(tmp_path / "step_seconds.json"),
    )


def _mlflow_runs(uri: str) -> list:
    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id], max_results=1000)


def test_ablation_clusters_plots_the_median_final_value_of_every_point(ctx: Context, store: str) -> None:
    figure = FIGURES["ablation_clusters"](ctx)
    assert (ctx.out_dir / "ablation_clusters.png").stat().st_size > 1000
    data = figure.data
    assert set(data["panel"]) == {"d=4, tau=0.1", "d=4, tau=1", "d=32, tau=0.1", "d=32, tau=1"}
    assert set(data["series"]) == {"OH-L2", "OH-NE", "BN-L2", "BN-NE", LLOYD}
    assert (data.loc[data["series"] == LLOYD, "median"] == 1).all()
    finals: dict[tuple, list[float]] = {}
    diverged: dict[tuple, int] = {}
    for run in _mlflow_runs(store):
        p = run.data.params
        if run.data.tags[SUBGRIDS] != "clusters":
            continue
        point = (
            f"d={p['task.d']}, tau={float(p['loss.tau']):g}",
            f"{SHORT[p['model.embedding']]}-{SHORT[p['loss.regularizer']]}",
            int(p["task.k"]),
        )
        if run.data.tags[OUTCOME] == DIVERGED:
            diverged[point] = diverged.get(point, 0) + 1
        else:
            finals.setdefault(point, []).append(run.data.metrics[VAL_REL_LLOYD])  # the latest point: step 20
    models = data[data["series"] != LLOYD].set_index(["panel", "series", "x"])
    assert set(models.index) == set(finals) | set(diverged)
    for point, values in finals.items():
        row = models.loc[point]
        np.testing.assert_allclose(
            row[["q25", "median", "q75"]].astype(float), np.percentile(values, [25, 50, 75]), rtol=1e-12
        )
        assert row["n_seeds"] == len(values)
    for point, count in diverged.items():
        assert models.loc[point, "diverged"] == f"{count}/{len(SEEDS)} diverged"
    assert len(diverged) == 2 and math.isnan(models.loc[("d=4, tau=1", "BN-NE", 25), "median"])
    assert any("`clusters` sub-grid: 32/96 configurations found" in note for note in figure.notes)


def test_ablation_lr_and_its_step_curves(ctx: Context, store: str) -> None:
    final = FIGURES["ablation_lr"](ctx).data
    assert set(final["panel"]) == {"d=4, tau=1", "d=32, tau=1"} and set(final["x"]) == {0.01, 0.1}
    curves = FIGURES["ablation_lr_curves"](ctx).data
    assert set(curves["panel"]) == {f"d={d}, tau=1, lr={lr:g}" for d in LR["task.d"] for lr in LR["optim.lr"]}
    history: dict[int, list[float]] = {}
    client = MlflowClient(store)
    for run in _mlflow_runs(store):
        p = run.data.params
        if run.data.tags[SUBGRIDS] == "lr" and p["task.d"] == "32" and p["optim.lr"] == "0.1":
            for m in client.get_metric_history(run.info.run_id, VAL_REL_LLOYD):
                history.setdefault(m.step, []).append(m.value)
    curve = curves[(curves["panel"] == "d=32, tau=1, lr=0.1") & (curves["series"] == "OH-L2")].set_index("x")
    assert sorted(curve.index) == list(STEPS)
    for step, values in history.items():
        assert curve.loc[step, "median"] == pytest.approx(np.median(values), rel=1e-12)


def test_convergence_draws_each_run_at_its_own_length(tau_store: str, tmp_path: Path) -> None:
    """Every run of the tau sub-grid is drawn, tau 1 to its 10 steps, tau 0.1 to its 20, each curve the median
    of MlflowClient's own points at each step."""
    runs = load_runs(tau_store, EXPERIMENT)
    figure = FIGURES["convergence"](read(tau_store, EXPERIMENT, runs, SETTINGS, tmp_path))
    assert set(figure.run_ids) == set(runs["run_id"])
    data = figure.data[figure.data["series"] != LLOYD]
    client = MlflowClient(tau_store)
    for tau, steps in TAU_STEPS.items():
        for metric in (TRAIN_LOSS, VAL_REL_LLOYD):
            panel = data[data["panel"] == f"{metric} | d=4, tau={tau:g}, steps={steps}"]
            assert set(panel["series"]) == {"OH-L2", "OH-NE", "BN-L2", "BN-NE"}
            chosen = runs[(runs["loss.tau"] == tau) & (runs["model.embedding"] == "binary")]
            chosen = chosen[chosen["loss.regularizer"] == "ne"]
            values = [
                [m.value for m in client.get_metric_history(r, metric) if m.step == steps]
                for r in chosen["run_id"]
            ]
            final = panel[(panel["series"] == "BN-NE") & (panel["x"] == steps)]["median"].item()
            assert final == pytest.approx(np.median(values), rel=1e-12)
            assert panel["x"].max() == steps


USERS = {"model.gamma": (0.5, 1.0), "optim.lr": (0.01, 0.03), "loss.tau": (1.0,)}  # a user's gamma x lr


@pytest.fixture(scope="module")
def users_store(tmp_path_factory, _empty_store: Path) -> str:
    """A user's two-axis sweep (gamma x lr, sub-grid `mine`): 4 configurations, none of the paper's
    sub-grids."""
    root = tmp_path_factory.mktemp("users_store")
    shutil.copyfile(_empty_store, root / "mlflow.db")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    _log_runs(client, exp_id, "mine", USERS, np.random.default_rng(2), steps={1.0: 20})
    return uri


def test_figures_that_draw_some_configurations_name_them_and_why(users_store: str, tmp_path: Path) -> None:
    """Convergence compares tau, regularizer, embedding and d, time to quality embedding, d and k: of a
    gamma x lr sweep each draws one configuration, and its notes name it (lr at the reference 0.01, gamma at
    the first of two equally common values), as do those of the probes that narrow the same way."""
    runs = load_runs(users_store, EXPERIMENT)
    steps = _step_json(tmp_path / "step_seconds.json")
    ctx = read(users_store, EXPERIMENT, runs, SETTINGS, tmp_path, step_json=steps)
    drawn = runs[(runs["optim.lr"] == 0.01) & (runs["model.gamma"] == 0.5)]
    assert len(drawn) == len(SEEDS)
    held = "optim.lr=0.01 (the reference); model.gamma=0.5 (the value most runs have, the first on a tie)."
    for name, compared in (
        ("convergence", "loss.tau, loss.regularizer, model.embedding, task.d, train.steps"),
        ("time_to_quality", "model.embedding, task.d, task.k"),
    ):
        figure = FIGURES[name](ctx)
        assert set(figure.run_ids) == set(drawn["run_id"]), name
        note = f"draws 1 of the 4 configurations of its runs: it compares {compared} and holds each other key"
        assert any(n.startswith(f"{note} that varies at one value: {held}") for n in figure.notes), (
            figure.notes
        )
    for probe in ("multistep", "loss_surface"):
        models, notes = eval_figures.MODELS[probe](ctx)
        assert set(models["run_id"]) <= set(drawn["run_id"]), probe
        assert any(f"at one value: {held}" in n for n in notes), (probe, notes)


def test_missing_sub_grids_are_named(ctx: Context) -> None:
    for name, subgrid in (
        ("ablation_points", "points"),
        ("ablation_dim", "dim"),
        ("ablation_family", "family"),
    ):
        with pytest.raises(MissingInput, match=f"`{subgrid}` sub-grid"):
            FIGURES[name](ctx)


def test_time_to_quality_x_is_step_times_seconds_per_step(ctx: Context) -> None:
    figure = FIGURES["time_to_quality"](ctx)
    seconds = figure.tables["step_seconds"]
    assert set(seconds["panel"]) == {f"d={d}, k={k}" for d in (4, 32) for k in (6, 25)}
    assert set(seconds["series"]) == {"OH", "BN"} and len(seconds) == 8
    models = figure.data[figure.data["series"] != LLOYD]
    embedding = {"OH": "onehot", "BN": "binary"}
    for row in seconds.itertuples():
        d, k = (int(part.split("=")[1]) for part in row.panel.split(", "))
        measured = STEP_TIMES[(d, k, embedding[row.series])]
        assert row.seconds_per_step == measured  # the benchmark's number for this series' shape
        x = models[(models["panel"] == row.panel) & (models["series"] == row.series)]["x"]
        np.testing.assert_allclose(sorted(x), [s * measured for s in STEPS], rtol=1e-12)
    assert any(f"from {ctx.step_json}" in note and "on cpu with 1 threads" in note for note in figure.notes)


def test_time_to_quality_without_the_benchmark_names_the_command(ctx: Context, tmp_path: Path) -> None:
    with pytest.raises(MissingInput, match=r"`python -m bench step_seconds sweep=NAME --out .*none.json`"):
        FIGURES["time_to_quality"](dataclasses.replace(ctx, step_json=tmp_path / "none.json"))
    other = json.loads(ctx.step_json.read_text())
    other["rows"] = [r for r in other["rows"] if r["config"]["task.k"] != 25]  # no k=25 shape measured
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(other))
    with pytest.raises(MissingInput, match=r"no step time for .*task.k=25"):
        FIGURES["time_to_quality"](dataclasses.replace(ctx, step_json=partial))


@pytest.fixture
def trained(sqlite_uri: str, tiny: list[str], tmp_path: Path) -> dict:
    """One tiny run trained for real, and both checkpoint artifacts. At lr 1.0 the tiny model overshoots
    (val_rel_lloyd 12.6 at step 0, in the hundreds after): its best checkpoint (step 0's) is not its last."""
    cfg = compose(tiny + ["optim.lr=1.0", f"tracking.uri={sqlite_uri}"])
    train(cfg, MlflowRecorder(sqlite_uri, cfg.tracking.experiment), tmp_path / "work")
    run = load_runs(sqlite_uri, cfg.tracking.experiment).iloc[0]
    client = MlflowClient(sqlite_uri)
    states = {}
    for name in (BEST_CHECKPOINT, LAST_CHECKPOINT):
        path = client.download_artifacts(run["run_id"], f"{CHECKPOINT_DIR}/{name}", str(tmp_path))
        states[name] = torch.load(path, map_location="cpu", weights_only=True)["model"]
    return {"uri": sqlite_uri, "run": run, "states": states}


def test_eval_checkpoint_loads_last_or_best(trained: dict) -> None:
    states = trained["states"]
    assert any(
        not torch.equal(states[BEST_CHECKPOINT][k], states[LAST_CHECKPOINT][k])
        for k in states[LAST_CHECKPOINT]
    )
    for checkpoint, artifact in (("last", LAST_CHECKPOINT), ("best", BEST_CHECKPOINT)):
        client = MlflowClient(trained["uri"])
        loaded = load_model(client, trained["run"], torch.device("cpu"), checkpoint).state_dict()
        assert loaded.keys() == states[artifact].keys()
        assert all(torch.equal(loaded[k], states[artifact][k]) for k in loaded), checkpoint
    assert EvalSettings.configured().checkpoint == "last"
    keys = {
        c: Evaluator(
            trained["uri"], "x", EvalSettings.configured(checkpoint=c), Path(trained["uri"][10:]).parent / c
        ).key("multistep", trained["run"]["run_id"])
        for c in ("last", "best")
    }
    assert keys["last"] != keys["best"]  # cached results of one never stand in for the other


def test_a_bad_eval_checkpoint_is_rejected_naming_the_field_and_choices(tmp_path: Path, capsys) -> None:
    with pytest.raises(
        ConfigError, match=r"eval.checkpoint='middle' is not allowed: choose one of last, best"
    ):
        EvalSettings.configured(checkpoint="middle")
    assert report.main([f"tracking.uri=sqlite:///{tmp_path}/x.db", "eval.checkpoint=middle"]) == 2
    err = capsys.readouterr().err
    assert "eval.checkpoint='middle'" in err and "last, best" in err
    assert not (tmp_path / "x.db").exists()  # rejected before the store was opened


def test_an_evaluation_read_once_is_reused_from_memory(trained: dict, tmp_path: Path) -> None:
    """The claims call the evaluator on the runs the figures evaluated: the report reads each table once."""
    settings = EvalSettings.configured(device="cpu", batches=1, batch=4, steps=2)
    evaluator = Evaluator(trained["uri"], "x", settings, tmp_path / "cache")
    first = evaluator("multistep", trained["run"])
    expected = first.copy()
    first["value"] = 0.0  # a caller's columns and edits stay its own
    for cached in (tmp_path / "cache").iterdir():
        cached.unlink()
    pd.testing.assert_frame_equal(evaluator("multistep", trained["run"]), expected)
    assert not list((tmp_path / "cache").iterdir())  # from memory: neither recomputed nor re-read


@pytest.mark.slow  # MLflow waits out SQLite's busy timeout (20 s) once
def test_a_store_whose_lock_another_process_holds_keeps_the_evaluations_under_reports(
    trained: dict, tmp_path: Path, capsys
) -> None:
    """Another process holding the store's write lock (a sweep mid-write, a database browser's open
    transaction): every evaluation is still computed and kept under reports/, one line says the store
    refused them, and the store is asked once, not at each evaluation. It was each figure failing on
    "'NoneType' object has no attribute 'tags'" (the refused experiment taken for one made meanwhile). The
    lock gone, the next report logs the tables it kept, as kept, not computed again (they were left out of the
    store for good)."""
    settings = EvalSettings.configured(device="cpu", batches=1, batch=4, steps=2)
    evaluator = Evaluator(trained["uri"], "x", settings, tmp_path / "cache")
    run_id = trained["run"]["run_id"]
    holder = sqlite3.connect(trained["uri"].removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, as a writer mid-transaction holds it
    try:
        found = evaluator.each(
            pd.DataFrame([trained["run"]]), [("multistep", run_id, None), ("final", run_id, None)]
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert all(isinstance(table, pd.DataFrame) and len(table) for table in found.values()), found
    assert len(list((tmp_path / "cache").iterdir())) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("report: ")]
    assert len(said) == 1 and "kept under" in said[0] and "database is locked" in said[0], said
    assert (
        MlflowClient(trained["uri"]).get_experiment_by_name("x-evaluations") is None
    )  # nothing half-written

    kept = {}
    for path in (tmp_path / "cache").iterdir():  # marked: a table computed again would lack the mark
        kept[path.name] = pd.read_csv(path).assign(kept="under reports/")
        kept[path.name].to_csv(path, index=False)
    later = Evaluator(trained["uri"], "x", settings, tmp_path / "cache")
    later.each(pd.DataFrame([trained["run"]]), [("multistep", run_id, None), ("final", run_id, None)])
    client = MlflowClient(trained["uri"])
    logged = client.search_runs([client.get_experiment_by_name("x-evaluations").experiment_id])
    assert sorted(r.data.tags[EVALUATION] for r in logged) == ["final", "multistep"]
    for run in logged:  # the kept table itself
        artifact = client.download_artifacts(run.info.run_id, RESULT_ARTIFACT, str(tmp_path))
        name = f"{run.data.tags[EVALUATION]}-{run.data.tags[EVAL_KEY]}.csv"
        pd.testing.assert_frame_equal(pd.read_csv(artifact), kept[name])


def test_points_of_a_series_only_some_panels_have(tmp_path: Path) -> None:
    """lite's ablation_family: ne models at tau 1 only, so the tau 0.1 panel has no OH-NE points (the
    figure failed on pandas' string x of the empty series)."""
    from analysis.context import lloyd_reference
    from analysis.plot import draw_points

    rows = [
        {"panel": panel, "series": series, "x": family, "median": 1.1, "q25": 1.0, "q75": 1.2, "diverged": ""}
        for panel, names in (("tau=0.1", ["OH-L2"]), ("tau=1", ["OH-L2", "OH-NE"]))
        for series in names
        for family in ("normal", "gumbel")
    ]
    data = lloyd_reference(pd.DataFrame(rows))
    styles = {"OH-L2": {"color": "C0"}, "OH-NE": {"color": "C1"}}
    files = draw_points(
        data, styles, tmp_path, "points", xlabel="family", ylabel="v", panels=["tau=0.1", "tau=1"]
    )
    assert sorted(p.suffix for p in files) == [".pdf", ".png"] and all(p.stat().st_size > 1000 for p in files)
