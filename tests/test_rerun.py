"""`python -m sweeper.rerun RUN_ID`: the configuration read back from MLflow reproduces the run."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from config.schema import OPERATIONAL_TRAIN_KEYS
from sweeper.rerun import main as rerun_main
from sweeper.train import main as train_main
from tracking.names import CONFIG_HASH, METRICS, RERUN_OF, VAL_REL_LLOYD


@pytest.mark.slow
def test_rerun_reproduces_the_run_as_a_new_tagged_run(tiny, tmp_path, sqlite_uri, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    overrides = tiny + [
        "task.init=kmeans++",
        "loss.regularizer=ne",
        "loss.tau=0.5",
        "seed=7",
        f"tracking.uri={sqlite_uri}",
        "tracking.experiment=rerun-test",
    ]
    assert train_main(overrides) == 0
    client = MlflowClient(tracking_uri=sqlite_uri)
    experiment = client.get_experiment_by_name("rerun-test").experiment_id
    (original,) = client.search_runs([experiment])
    capsys.readouterr()

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_uri)
    assert rerun_main([original.info.run_id]) == 0
    printed = capsys.readouterr()
    out = printed.out.splitlines()
    assert out[-1] == "equal"
    # stderr is not a terminal here, as in a log file: a line per evaluation instead of the bar
    steps = [line.split(":")[1] for line in printed.err.splitlines() if line.startswith("rerun: step ")]
    assert steps == [f" step {s}/40" for s in (0, 10, 20, 30, 40)], printed.err
    runs = client.search_runs([experiment])
    (new,) = [r for r in runs if r.info.run_id != original.info.run_id]
    assert new.data.tags[RERUN_OF] == original.info.run_id
    assert new.data.tags[CONFIG_HASH] == original.data.tags[CONFIG_HASH]
    operational = {f"train.{key}" for key in OPERATIONAL_TRAIN_KEYS}  # a rerun runs locally, from scratch
    same = lambda run: {k: v for k, v in run.data.params.items() if k not in operational}  # noqa: E731
    assert same(new) == same(original)
    assert (
        repr(original.data.metrics[VAL_REL_LLOYD]) in out[0]
        and repr(new.data.metrics[VAL_REL_LLOYD]) in out[1]
    )

    def history(run, key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))

    for key in METRICS:
        assert history(new, key) == history(original, key), key


def test_rerun_of_an_unknown_run_names_the_store(sqlite_uri, capsys):
    assert rerun_main(["0123456789abcdef0123456789abcdef", f"tracking.uri={sqlite_uri}"]) == 9
    assert sqlite_uri in capsys.readouterr().err
