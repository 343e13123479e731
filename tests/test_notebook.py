"""analysis.notebook on a real store (the smoke_store sweep of conftest.py): its runs and histories against
MLflow's own client, and its defaults read from the environment as the commands read them."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from analysis import context, notebook
from analysis import runs as loaders
from analysis.runs import NoRuns
from tracking.names import CONFIG_HASH, SUBGRIDS, SWEEP, VAL_REL_LLOYD
from tracking.store import TrackingError

EXPERIMENT = "leaner-clustering"  # where the smoke sweep writes (the tracking config's default)


@pytest.mark.slow
def test_runs_and_histories_are_mlflows(smoke_store: str, monkeypatch) -> None:
    client = MlflowClient(smoke_store)
    (experiment,) = [e for e in client.search_experiments() if e.name == EXPERIMENT]
    stored = [r for r in client.search_runs([experiment.experiment_id]) if CONFIG_HASH in r.data.tags]
    smoke = {r.info.run_id: r for r in stored if "smoke" in r.data.tags["subgrids"].split(",")}
    assert len(smoke) == 6  # 3 embeddings x 2 seeds

    monkeypatch.setenv("MLFLOW_TRACKING_URI", smoke_store)  # the defaults, as a notebook started there
    runs = notebook.runs(sweep="smoke", subgrid="smoke")
    assert set(runs.run_id) == set(smoke) and len(runs) == len(smoke)
    assert set(notebook.runs(smoke_store, EXPERIMENT).run_id) == {r.info.run_id for r in stored}
    for row in runs.itertuples():
        run = smoke[row.run_id]
        assert getattr(row, VAL_REL_LLOYD) == run.data.metrics[VAL_REL_LLOYD]
        assert row.seed == int(run.data.params["seed"]) and row.outcome == "finished"
    assert runs["task.n"].tolist() == [16] * 6 and sorted(runs["model.embedding"]) == sorted(
        ["onehot", "binary", "none"] * 2
    )

    chosen = runs[runs["model.embedding"] == "binary"]  # a selection keeps the store it came from
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    points = notebook.histories(chosen, [VAL_REL_LLOYD])
    assert list(points.columns) == ["run_id", "key", "step", "timestamp", "value"]
    for run_id in chosen.run_id:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, VAL_REL_LLOYD))
        mine = points[points.run_id == run_id].sort_values("step")
        assert list(zip(mine.step, mine.value)) == history and len(history) == 5  # steps 0, 5, ..., 20
    assert set(points.key) == {VAL_REL_LLOYD} and set(points.run_id) == set(chosen.run_id)

    with pytest.raises(NoRuns, match="no-such-experiment"):
        notebook.runs(smoke_store, "no-such-experiment")


@pytest.mark.parametrize(
    "uri", ["mlflow.db", "./mlruns", "file:./mlruns", "sqlite://mlflow.db", "sqlte:///x.db"]
)
def test_an_address_of_no_store_form_raises_the_documented_error(uri: str, tmp_path, monkeypatch) -> None:
    """MLflow meets these with its own errors (a file store it refuses, SQLAlchemy's parse error); the
    notebook's documented one names the forms it takes, and nothing is created."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TrackingError, match=r"sqlite:///FILE|sqlite:///mlflow\.db"):
        notebook.runs(uri)
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_the_store_lacks_raises_naming_those_it_holds(sqlite_uri: str, tmp_path) -> None:
    """Not an empty frame without columns, on which a notebook's next line dies with a KeyError."""
    client = MlflowClient(sqlite_uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "artifacts").as_uri())
    client.create_run(experiment, tags={CONFIG_HASH: "h1", SWEEP: "smoke", SUBGRIDS: "smoke"})
    with pytest.raises(NoRuns, match=r"no training run of sweep=demo: 1 runs of the sweeps smoke,"):
        notebook.runs(sqlite_uri, sweep="demo")
    assert list(notebook.runs(sqlite_uri, sweep="smoke").run_id) == [
        client.search_runs([experiment])[0].info.run_id
    ]


def test_config_keys_keeps_its_old_name_for_a_release() -> None:
    """docs/notebook.md named analysis.runs.config_keys; it lives beside the frames' other helpers now."""
    columns = ["run_id", "seed", "task.d", "model.embedding", "train.device", "train.steps", "tracking.uri"]
    with pytest.warns(DeprecationWarning, match="analysis.context.config_keys"):
        old = loaders.config_keys(columns)
    assert old == context.config_keys(columns) == ["model.embedding", "task.d", "train.steps"]
