"""A sweep's home folder (sweeper.driver.home) moves: checkpoints recorded relative to it, a moved store's
artifact locations mended when it is opened (tracking.moved), an archive with what resuming needs
(sweeper.archive); and the time budget's account and key (sweeper.driver.budget, cluster.time_budget_s). Fast:
a real SQLite store, no Ray (the sweep in allocations: tests/test_sweep_budget.py)."""

from __future__ import annotations

import shutil
import sqlite3
import struct
import tarfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from support.sweeps import sweep_jobs

from config.compose import compose
from config.schema import ConfigError
from sweeper import archive, sqltext, unpack
from sweeper.driver import home
from sweeper.driver.budget import Account, Budget, outlook
from sweeper.driver.session import rate_line
from tracking import moved, store
from tracking.names import FINISHED, OUTCOME, TUNE_CHECKPOINT


def test_a_checkpoint_in_the_home_is_recorded_relative_to_it_and_found_after_a_move(tmp_path):
    uri = f"sqlite:///{tmp_path / 'A' / 'mlflow.db'}"
    inside, outside = tmp_path / "A" / "ray" / "s" / "checkpoint_000003", "/shared/ray/s/checkpoint_000003"
    assert home.recorded(str(inside), uri) == "ray/s/checkpoint_000003"
    assert home.recorded(outside, uri) == outside  # cluster.storage elsewhere: as it is
    assert home.recorded("s3://bucket/s/checkpoint_1", uri) == "s3://bucket/s/checkpoint_1"
    moved = f"sqlite:///{tmp_path / 'B' / 'mlflow.db'}"
    assert home.resolved("ray/s/checkpoint_000003", moved) == str(tmp_path / "B" / "ray/s/checkpoint_000003")
    assert home.resolved(outside, moved) == outside
    server = "http://127.0.0.1:5000"  # no home: Ray's default or cluster.storage, recorded as it is
    assert home.recorded(str(inside), server) == str(inside) and home.storage(_cluster(None), server) is None


def _cluster(storage: str | None):
    return OmegaConf.create({"storage": storage})


def test_the_home_holds_rays_storage_unless_cluster_storage_says_otherwise(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert home.storage(_cluster(None), uri) == str(tmp_path / "ray")
    assert home.storage(_cluster(str(tmp_path / "elsewhere")), uri) == str(tmp_path / "elsewhere")
    assert home.storage(_cluster("s3://bucket/ray"), uri) == "s3://bucket/ray"


def _store_with_a_run(folder: Path) -> tuple[str, str]:
    """A store in `folder` with one run that has an artifact; (uri, run id)."""
    folder.mkdir()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = store.connect(uri)
    experiment = store.ensure_experiment(client, "moving")
    run_id = client.create_run(experiment).info.run_id
    (folder / "note.txt").write_text("kept")
    client.log_artifact(run_id, str(folder / "note.txt"))
    return uri, run_id


def test_a_moved_store_points_its_artifacts_at_its_new_folder_and_says_so_once(tmp_path, capsys):
    _, run_id = _store_with_a_run(tmp_path / "A")
    shutil.move(tmp_path / "A", tmp_path / "B")
    capsys.readouterr()
    uri = f"sqlite:///{tmp_path / 'B' / 'mlflow.db'}"
    client = store.connect(uri)
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and f"was moved from {tmp_path / 'A'}" in said, said
    run = client.get_run(run_id)
    assert run.info.artifact_uri.startswith((tmp_path / "B" / "mlartifacts" / "moving").as_uri())
    got = client.download_artifacts(run_id, "note.txt", str(tmp_path))
    assert Path(got).read_text() == "kept"
    store.connect(uri, write=False)  # mended: nothing more to say
    assert capsys.readouterr().out == ""


def test_a_moved_store_that_may_not_be_written_keeps_its_locations_and_says_where_they_are(tmp_path, capsys):
    """A read-only copy (a colleague's, a read-only mount): its locations are not rewritten
    (tracking.sqlite_guard passes writable=False for it; root here writes to any file, so the flag is given
    directly)."""
    uri, run_id = _store_with_a_run(tmp_path / "A")
    before = MlflowClient(tracking_uri=uri).get_run(run_id).info.artifact_uri
    shutil.copytree(tmp_path / "A", tmp_path / "B")
    capsys.readouterr()
    moved.mend(tmp_path / "B" / "mlflow.db", writable=False)
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and "is read-only: its artifacts are read there" in said, said
    copy = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'B' / 'mlflow.db'}")
    assert copy.get_run(run_id).info.artifact_uri == before


def test_the_archive_holds_the_store_artifacts_and_the_live_checkpoints_only(tmp_path, capsys):
    uri, run_id = _store_with_a_run(tmp_path / "A")
    ray = tmp_path / "A" / "ray" / "sweep-1" / "trial"
    for part in ("checkpoint_000001", "checkpoint_000002", "work"):
        (ray / part / "job").mkdir(parents=True)
        (ray / part / "job" / "last.pt").write_bytes(b"x" * 1000)
    (ray.parent / "experiment_state.json").write_text("{}")
    MlflowClient(tracking_uri=uri).set_tag(run_id, TUNE_CHECKPOINT, "ray/sweep-1/trial/checkpoint_000002")
    out = tmp_path / "a.tar.gz"
    assert archive.main([str(tmp_path / "A"), "--out", str(out)]) == 0
    assert "MB" in capsys.readouterr().out
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
    assert "A/mlflow.db" in names and "A/note.txt" in names
    assert any(n.startswith("A/mlartifacts/moving/") and n.endswith("note.txt") for n in names)
    assert "A/ray/sweep-1/trial/checkpoint_000002/job/last.pt" in names
    assert not [
        n for n in names if "checkpoint_000001" in n or "/work" in n or n.endswith((".json", ".lock"))
    ]


def test_a_lean_archive_leaves_out_what_an_ended_run_can_recompute(tmp_path):
    """--lean (a run in allocations whose archives are committed): the checkpoints and pictures of a run that
    ended are left out, its other artifacts (an evaluation's table, its config) kept; a run still going keeps
    its checkpoint; the store is SQL text; .tar.xz writes xz. Without --lean every artifact stays."""
    uri, ended = _store_with_a_run(tmp_path / "A")
    client = MlflowClient(tracking_uri=uri)
    going = client.create_run(client.get_run(ended).info.experiment_id).info.run_id
    for run_id in (ended, going):
        for name in ("last.pt", "curves.png", "result.csv"):
            (tmp_path / name).write_bytes(b"x" * 100)
            client.log_artifact(run_id, str(tmp_path / name), "checkpoints" if name.endswith(".pt") else None)
    client.set_tag(ended, OUTCOME, FINISHED)
    out = tmp_path / "a.tar.xz"
    assert archive.main([str(tmp_path / "A"), "--out", str(out), "--lean"]) == 0
    with tarfile.open(out, "r:xz") as tar:
        names = set(tar.getnames())
    assert "A/mlflow.sql" in names and "A/mlflow.db" not in names  # the store as SQL text
    kept = {Path(n).name for n in names if f"/{ended}/" in n}
    assert "result.csv" in kept and not kept & {"last.pt", "curves.png"}, names
    assert {Path(n).name for n in names if f"/{going}/" in n} >= {"last.pt", "curves.png", "result.csv"}
    assert archive.main([str(tmp_path / "A"), "--out", str(tmp_path / "b.tar.gz")]) == 0
    with tarfile.open(tmp_path / "b.tar.gz", "r:gz") as tar:
        assert {Path(n).name for n in tar.getnames() if f"/{ended}/" in n} >= {"last.pt", "curves.png"}


def test_a_lean_archive_unpacks_into_the_same_store_bit_for_bit(tmp_path, capsys):
    """sweeper.unpack builds a lean archive's store from its SQL text: every table's rows equal the
    original's (floats compared by their bits: a NaN metric, quotes and line breaks in text included; MLflow
    clamps infinities to the largest float), MLflow reads the same run, the artifacts land beside it (.tar,
    uncompressed, here). A second unpack into the same folder is refused before it writes."""
    uri, run_id = _store_with_a_run(tmp_path / "A")
    client = MlflowClient(tracking_uri=uri)
    for step, value in enumerate([0.1 + 0.2, float("inf"), float("-inf"), float("nan"), 5e-324, -0.0]):
        client.log_metric(run_id, "loss", value, step=step)
    client.set_tag(run_id, "note", "it's two\nlines, ünïcode")
    client.log_param(run_id, "lr", "0.1")
    out = tmp_path / "a.tar"
    assert archive.main([str(tmp_path / "A"), "--out", str(out), "--lean"]) == 0
    assert "python -m sweeper.unpack" in capsys.readouterr().out
    assert tarfile.open(out).getnames()[0] == "A/mlflow.sql"
    assert unpack.main([str(out), str(tmp_path / "B")]) == 0
    folder = tmp_path / "B" / "A"
    assert sorted(p.name for p in folder.iterdir()) == ["mlartifacts", "mlflow.db", "note.txt"]
    rows = {db: _every_row(db) for db in (tmp_path / "A" / "mlflow.db", folder / "mlflow.db")}
    first, second = rows.values()
    assert first == second and len(first["metrics"]) >= 6
    unpacked = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    copy = unpacked.get_run(run_id)
    assert copy.data.tags["note"] == "it's two\nlines, ünïcode" and copy.data.params == {"lr": "0.1"}
    history, original = (c.get_metric_history(run_id, "loss") for c in (unpacked, client))
    assert [repr(m.value) for m in history] == [repr(m.value) for m in original]
    before = (folder / "mlflow.db").read_bytes()
    assert unpack.main([str(out), str(tmp_path / "B")]) == 4
    assert "already" in capsys.readouterr().err and (folder / "mlflow.db").read_bytes() == before


def test_sql_text_reads_back_every_value_sqlite_stores_exactly(tmp_path):
    """SQLite's own quote() (Python's iterdump) writes infinity as a bare Inf that SQLite 3.40 cannot read
    back; sweeper.sqltext writes every storage class so that it reads back bit for bit."""
    db, text, copy = tmp_path / "a.db", tmp_path / "a.sql", tmp_path / "b.db"
    text_value = 'a\'b\n"c"'
    values = [float("inf"), float("-inf"), -0.0, 5e-324, 0.1 + 0.2, 2**63 - 1, None, b"\x00\xff", text_value]
    with sqlite3.connect(db) as con:
        con.execute('CREATE TABLE "odd ""name""" (id INTEGER PRIMARY KEY AUTOINCREMENT, v)')
        con.executemany('INSERT INTO "odd ""name""" (v) VALUES (?)', [(v,) for v in values])
        con.execute('CREATE INDEX by_v ON "odd ""name""" (v)')
    sqltext.write(db, text)
    sqltext.restore(text, copy)
    assert _every_row(copy) == _every_row(db) and len(_every_row(copy)['odd "name"']) == len(values)
    with sqlite3.connect(copy) as con:
        assert con.execute("SELECT name FROM sqlite_master WHERE type = 'index'").fetchall() == [("by_v",)]
        assert con.execute("SELECT seq FROM sqlite_sequence").fetchone() == (len(values),)


def _every_row(db: Path) -> dict[str, list]:
    """Each table's rows, floats as their bits (so -0.0, NaN and the infinities compare exactly)."""

    def exact(value):
        return struct.pack("<d", value) if isinstance(value, float) else value

    with sqlite3.connect(db) as con:
        tables = [name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        selects = {t: 'SELECT * FROM "{}"'.format(t.replace('"', '""')) for t in tables}
        return {t: [tuple(map(exact, r)) for r in con.execute(selects[t])] for t in tables}


FOUR = ["sweep=smoke", "sweep.seeds=[1, 2]", "sweep.subgrids=[{name: smoke, embedding: [onehot, binary]}]"]


def test_the_account_counts_model_steps_by_where_each_model_resumes():
    jobs = sweep_jobs(FOUR)  # 20 steps each
    a, b, c, d = (j.key for j in jobs)
    start = Account.of(jobs, 20, {a}, {b: 10})
    assert (start.total, start.done) == (80, 30)
    assert start.models() == "models: 1 finished, 1 stopped at a checkpoint, 2 not started"
    now = Account.of(jobs, 20, {a, b}, {c: 5, d: 0})
    assert now.done == 45 and now.steps_line() == "45 of 80 model-steps done (56%)"
    line, rate = rate_line(now, start, 3.0)
    assert rate == 5.0 and "15 in this allocation at 5.0 model-steps/s; the 35 left need about 7 s" in line
    assert rate_line(start, start, 3.0) == ("no model-steps trained in this allocation", None)


def test_the_outlook_says_whether_the_sweep_should_end_within_its_budget():
    jobs = sweep_jobs(FOUR)
    account = Account.of(jobs, 20, set(), {})  # 80 model-steps left
    budget = Budget(600, started=time.time())  # a budget from now: this process may be older than 600 s
    assert "should end within it" in outlook(account, budget, 1.0)
    assert "should not end within it" in outlook(account, Budget(60, budget.started), 0.1)
    assert "no rate measured for this sweep yet" in outlook(account, budget, None)


@pytest.mark.parametrize("value", ["0", "-5", "inf"])
def test_a_time_budget_that_is_not_a_positive_number_of_seconds_is_refused(value):
    with pytest.raises(
        ConfigError, match=r"cluster.time_budget_s.*null \(no budget\) or a number of seconds"
    ):
        compose(["sweep=smoke", f"cluster.time_budget_s={value}"])
