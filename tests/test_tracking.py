"""MLflow tracking of a run: over HTTP to a real server, SQLite, an unreachable server, no duplicate points;
the runs view an experiment carries."""

from __future__ import annotations

import getpass
import itertools
import json
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from support.servers import free_port

from cli import exit_codes
from config.compose import compose
from config.identity import config_hash, configuration_hash, configuration_name, flat_params
from sweeper.train import main
from tracking import store, ui, view
from tracking.mlflow_recorder import MlflowRecorder, TrackingError
from tracking.names import (
    BEST_CHECKPOINT,
    BEST_VAL_REL_LLOYD,
    CHECKPOINT_DIR,
    CONFIG_ARTIFACT,
    CONFIG_HASH,
    CONFIGURATION,
    CURVE_ARTIFACT,
    FINISHED,
    GIT_COMMIT,
    LAST_CHECKPOINT,
    METRICS,
    MLFLOW_GIT_COMMIT,
    MLFLOW_RUN_NOTE,
    MLFLOW_SOURCE_NAME,
    MLFLOW_USER,
    OUTCOME,
    SEED,
    TRAIN_LOSS,
    VAL_REL_LLOYD,
)
from training.loop import train


@pytest.mark.slow
def test_run_over_http_shows_params_tags_histories_and_artifacts(tiny, tmp_path, mlflow_server):
    cfg = compose(tiny + [f"tracking.uri={mlflow_server}", "tracking.experiment=http-test"])
    result = train(cfg, MlflowRecorder(cfg.tracking.uri, cfg.tracking.experiment), tmp_path)
    client = MlflowClient(tracking_uri=mlflow_server)
    found = client.get_run(result.run_id)
    assert found.info.status == "FINISHED" and found.info.run_name == "OH-L2 tau1 d2 k3 n64 s153476998 train"
    assert found.data.params == flat_params(cfg)
    tags = found.data.tags
    assert (tags[CONFIG_HASH], tags[SEED], tags[OUTCOME]) == (config_hash(cfg), str(cfg.seed), FINISHED)
    assert tags[GIT_COMMIT]
    steps = {key: [m.step for m in client.get_metric_history(result.run_id, key)] for key in METRICS}
    assert sorted(steps[TRAIN_LOSS]) == list(range(5, 41, 5))
    for key in set(METRICS) - {TRAIN_LOSS}:
        assert sorted(steps[key]) == [0, 10, 20, 30, 40], key
    assert found.data.metrics[VAL_REL_LLOYD] == result.metrics[VAL_REL_LLOYD]
    # What the MLflow UI shows: the seed-free configuration, a description, source, user and commit columns,
    # and best_val_rel_lloyd, the running minimum of val_rel_lloyd (what checkpoints/best.pt holds).
    assert (
        tags[CONFIGURATION]
        == configuration_name(cfg)
        == f"OH-L2 tau1 d2 k3 n64 #{configuration_hash(cfg)[:6]}"
    )
    assert "**onehot** token embedding" in tags[MLFLOW_RUN_NOTE] and "**tau 1**" in tags[MLFLOW_RUN_NOTE]
    assert (tags[MLFLOW_GIT_COMMIT], tags[MLFLOW_USER]) == (tags[GIT_COMMIT], getpass.getuser())
    # This process's entry point: the module it ran as (python -m pytest), else its script; a pytest-xdist
    # worker's __main__ has neither, and the tag says "python".
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    assert tags[MLFLOW_SOURCE_NAME] == (spec.name if spec else getattr(main, "__file__", "python"))
    val = [
        m.value for m in sorted(client.get_metric_history(result.run_id, VAL_REL_LLOYD), key=lambda m: m.step)
    ]
    best = [
        m.value
        for m in sorted(client.get_metric_history(result.run_id, BEST_VAL_REL_LLOYD), key=lambda m: m.step)
    ]
    assert best == list(itertools.accumulate(val, min)) and best[-1] == result.best_val
    top = {a.path for a in client.list_artifacts(result.run_id)}
    assert top == {CONFIG_ARTIFACT, CHECKPOINT_DIR, CURVE_ARTIFACT}
    stored = {a.path for a in client.list_artifacts(result.run_id, CHECKPOINT_DIR)}
    assert stored == {f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}", f"{CHECKPOINT_DIR}/{LAST_CHECKPOINT}"}
    local = client.download_artifacts(
        result.run_id, f"{CHECKPOINT_DIR}/{LAST_CHECKPOINT}", str(tmp_path / "dl")
    )
    state = torch.load(local, weights_only=True)
    assert (state["step"], state["run_id"]) == (40, result.run_id)
    yaml_path = client.download_artifacts(result.run_id, CONFIG_ARTIFACT, str(tmp_path / "dl"))
    assert OmegaConf.to_container(OmegaConf.load(yaml_path)) == OmegaConf.to_container(cfg)


def test_unreachable_server_is_a_clear_error_before_training(tiny, tmp_path, monkeypatch, capsys):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(TrackingError, match=uri):
        MlflowRecorder(uri, "x")
    monkeypatch.chdir(tmp_path)
    assert main(tiny + [f"tracking.uri={uri}"]) == exit_codes.TRACKING
    err = capsys.readouterr().err
    assert uri in err and "unreachable" in err and err.strip().count("\n") == 0
    assert not (tmp_path / "runs").exists()  # training never started


def test_resumed_recorder_skips_points_already_logged(sqlite_uri):
    first = MlflowRecorder(sqlite_uri, "dedupe")
    run_id = first.start("r", {"p": "1"}, {"t": "1"})
    for step in range(0, 31, 10):
        first.log_metrics(step, {"m": float(step)})
    first.flush()  # then the process dies: steps 0..30 are stored
    again = MlflowRecorder(sqlite_uri, "dedupe")
    assert again.start("r", {"p": "1"}, {"t": "1"}, run_id=run_id) == run_id
    for step in range(20, 51, 10):  # replayed from a checkpoint at step 10
        again.log_metrics(step, {"m": float(step)})
    again.finish("FINISHED")
    history = MlflowClient(tracking_uri=sqlite_uri).get_metric_history(run_id, "m")
    assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(0, 51, 10)]


def test_continuing_a_run_missing_from_the_store_is_an_error(sqlite_uri):
    with pytest.raises(TrackingError, match="train.resume=never"):
        MlflowRecorder(sqlite_uri, "x").start("r", {}, {}, run_id="0123456789abcdef0123456789abcdef")


def test_an_experiment_carries_the_runs_view_the_printed_link_opens(sqlite_uri):
    client = store.connect(sqlite_uri)
    experiment = store.ensure_experiment(client, "view")
    view.install(client, experiment)
    tag = client.get_experiment(experiment).tags[view.TAG]
    envelope = json.loads(tag)  # what MLflow's UI requires of a saved view: these fields and types
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": CONFIGURATION}]
    assert state["runsHiddenMode"] == "SHOW_ALL" and f"metrics.`{VAL_REL_LLOYD}`" in state["selectedColumns"]
    shown = [c for c in state["compareRunCharts"] if not c["deleted"]]
    assert shown[0]["metricKey"] == VAL_REL_LLOYD and {c["scaleType"] for c in shown} == {"log"}
    assert len(tag) < 20000  # the UI's limit on a tag value
    assert store.ensure_experiment(client, "view") == experiment
    view.install(client, experiment)
    assert client.get_experiment(experiment).tags[view.TAG] == tag  # installed again: not rewritten
    assert f"#/experiments/{experiment}/runs?viewStateShareKey={view.KEY}&" in ui.runs_table(
        sqlite_uri, experiment
    )


def test_mlflow_tag_names_spelled_in_names_are_mlflows_own():
    import mlflow.utils.mlflow_tags as mlflow_tags

    from tracking import names

    spelled = [n for n in dir(names) if n.startswith("MLFLOW_")]
    assert len(spelled) == 6 and all(getattr(names, n) == getattr(mlflow_tags, n) for n in spelled)
