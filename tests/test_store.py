"""tracking.store on real stores: opening one (a store another process is creating, an older one),
experiments, paged searches, last logged steps and metric histories.

Histories have a fast path per store (SQL on a SQLite file, a server's bulk endpoint) and MLflow's public
API as the fallback; both must give the same frame, whether the fallback is asked for (fast=False) or taken
because the store is not the one the fast path was written for. MlflowClient's own calls are the oracle.
"""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from contextlib import closing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from mlflow import MlflowClient
from mlflow.entities import Metric
from mlflow.store.db.utils import _get_alembic_config
from support.configs import ONE_TRIAL
from support.repo import REPO
from support.sweeps import children, when

from analysis import report
from analysis.runs import histories, load_runs
from config import address
from config.compose import compose
from sweeper.sweep import main as sweep_main
from tracking import metric_points, sqlite_guard, store, view
from tracking.mlflow_recorder import MlflowRecorder
from tracking.names import (
    CONFIG_HASH,
    EXPERIMENT_KIND,
    FINISHED,
    MODEL_TRAINING,
    OUTCOME,
    SEED,
    TRAIN_LOSS,
    VAL_REL_LLOYD,
)
from training.loop import train

KEYS = [VAL_REL_LLOYD, TRAIN_LOSS]


def test_an_address_is_read_once_into_what_the_probe_and_the_client_need(tmp_path: Path) -> None:
    """config.address.parse: a server's address without its login (which it gives unquoted), an SQL
    server's host at its scheme's port unless the address names one (none through a local socket), an
    SQLite store's file, a form it cannot have; store.probe hands on the address the client opens."""
    server = address.parse("https://ann:p%40ss@mlflow.example:8443/base/")
    assert (server.server, server.login, server.database, server.sqlite_file, server.problem) == (
        "https://mlflow.example:8443/base/",
        ("ann", "p@ss"),
        False,
        None,
        None,
    )
    assert address.parse("postgresql+psycopg://ann@db/mlflow").database_host == ("db", 5432)
    assert address.parse("mysql://ann@db:3307/mlflow").database_host == ("db", 3307)
    through_socket = address.parse("postgresql://ann@/mlflow?host=/tmp")
    assert through_socket.database and through_socket.database_host is None and through_socket.server is None
    assert address.parse("sqlite:///runs/mlflow.db").sqlite_file == "runs/mlflow.db"
    assert address.parse("sqlite://mlflow.db").problem.startswith("takes three slashes")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert store.probe(uri) == uri


def test_experiment_is_created_once_tagged_and_beside_the_store(sqlite_uri: str) -> None:
    client = store.connect(sqlite_uri)
    made = store.ensure_experiment(client, "kinds")
    assert store.ensure_experiment(client, "kinds") == made
    assert store.experiment_names(client).count("kinds") == 1
    experiment = client.get_experiment(made)
    assert experiment.tags[EXPERIMENT_KIND] == MODEL_TRAINING
    db = Path(sqlite_uri.removeprefix("sqlite:///"))
    assert experiment.artifact_location == (db.parent / "mlartifacts" / "kinds").as_uri()
    assert store.find_experiment(client, "kinds") == made and store.find_experiment(client, "absent") is None
    assert "absent" not in store.experiment_names(client)  # looking one up creates nothing


def test_existing_experiments_are_tagged_as_model_training(sqlite_uri: str) -> None:
    client = MlflowClient(sqlite_uri)
    plain = client.create_experiment("plain")
    genai = client.create_experiment("genai", tags={EXPERIMENT_KIND: "genai_development"})
    assert EXPERIMENT_KIND not in client.get_experiment(plain).tags
    for name, made in (("plain", plain), ("genai", genai)):
        assert store.ensure_experiment(client, name) == made
        assert client.get_experiment(made).tags[EXPERIMENT_KIND] == MODEL_TRAINING, name


@pytest.mark.parametrize("tag", ["kind", "view"])
def test_a_tag_another_process_sets_at_that_moment_is_set_again(sqlite_uri: str, tag: str) -> None:
    """Two sweep drivers started together both tag the experiment: MLflow looks for the tag's row, then
    inserts it, and the other process's insert between the two made the unique key refuse ours (a driver
    then died calling the store damaged). A second SQLite connection makes that insert at that moment."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    client = MlflowClient(sqlite_uri)
    key = {"kind": EXPERIMENT_KIND, "view": view.TAG}[tag]
    kind = {EXPERIMENT_KIND: MODEL_TRAINING} if tag == "view" else {}  # the first tag ensure_experiment sets
    experiment = client.create_experiment("raced", tags=kind)
    db = sqlite_uri.removeprefix("sqlite:///")

    def the_other_process_first(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.startswith("INSERT INTO experiment_tags") and not inserted:
            inserted.append(key)
            with closing(sqlite3.connect(db)) as other, other:
                other.execute("INSERT INTO experiment_tags VALUES (?, ?, ?)", (key, "theirs", experiment))

    inserted: list[str] = []
    event.listen(Engine, "before_cursor_execute", the_other_process_first)
    try:
        assert store.ensure_experiment(client, "raced", ["model.embedding"]) == experiment
    finally:
        event.remove(Engine, "before_cursor_execute", the_other_process_first)
    assert inserted == [key], "the other insert came first"
    tags = client.get_experiment(experiment).tags
    assert tags[EXPERIMENT_KIND] == MODEL_TRAINING and "model.embedding" in tags[view.TAG]


OPEN_ON_GO = """
import sys
from tracking import store
print("ready", flush=True)
sys.stdin.readline()  # both processes open the store at the same moment
print(store.ensure_experiment(store.connect(sys.argv[1]), "e"))
"""


@pytest.mark.slow
def test_two_processes_open_a_new_sqlite_store_at_once(tmp_path: Path) -> None:
    """Creating MLflow's schema on a new file, one of two processes failed (alembic) until connect serialised
    it."""
    for attempt in range(2):
        uri = f"sqlite:///{tmp_path}/m{attempt}.db"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_ON_GO, uri],
                cwd=REPO,
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(2)
        ]
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (_, err) in zip(procs, outs):
            assert p.returncode == 0, f"attempt {attempt}: a process failed to open {uri}:\n{err[-2000:]}"
        assert [out.strip() for out, _ in outs] == ["1", "1"], "both see the one experiment"


# Any other MLflow client opening a new store (`mlflow ui`, a notebook): it creates MLflow's first tables,
# then migrates them to the current schema one committed step at a time.
CREATE = "import sys; from mlflow import MlflowClient; MlflowClient(sys.argv[1]).search_experiments()"


def schema_version(db: Path) -> str | None:
    """The store's MLflow schema version; None before it has one, or while a writer locks the file."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05)) as con:
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def schema_versions() -> tuple[str, str]:
    """This MLflow's schema version and the one before it."""
    script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
    head = script.get_current_head()
    return head, script.get_revision(head).down_revision


def pause_creation(db: Path, versions: int) -> subprocess.Popen:
    """Another process creating the store at `db`, stopped (SIGSTOP) once its migration reached its
    `versions`-th schema version (0: once it created its first tables)."""
    creator = subprocess.Popen([sys.executable, "-c", CREATE, f"sqlite:///{db}"], stderr=subprocess.DEVNULL)
    seen: list[str] = []
    while len(seen) < versions or not db.exists() or db.stat().st_size == 0:
        assert creator.poll() is None, "the other process ended before the test could stop it"
        version = schema_version(db)
        if version and version not in seen:
            seen.append(version)
        time.sleep(0.002)
    os.kill(creator.pid, signal.SIGSTOP)
    assert schema_version(db) != schema_versions()[0], "stopped after its migration ended"
    return creator


@pytest.mark.slow
@pytest.mark.parametrize("versions", [0, 1, 20], ids=["first-tables", "first-version", "mid-migration"])
def test_a_sweep_waits_for_a_store_another_process_is_creating(
    versions, tmp_path, ray_cluster, caplog
) -> None:
    """The driver's check met the other process's unfinished store and refused it as older (exit 4, "run
    mlflow db upgrade"). The other process is stopped part-way and let go once the sweep checks the file, so
    the sweep meets the store unfinished every time; it waits, then runs its one trial."""
    db, ready, main = tmp_path / "mlflow.db", threading.Event(), threading.current_thread()
    uri = f"sqlite:///{db}"
    creator = pause_creation(db, versions)
    try:
        # let go a second after the sweep met its unfinished store: well within the sweep's QUIET_S
        resume = lambda: (time.sleep(1), os.kill(creator.pid, signal.SIGCONT))  # noqa: E731
        when(lambda: running(main, "check_file"), resume, ready, every=0.05)
        with caplog.at_level(logging.WARNING, logger=sqlite_guard.__name__):
            code = sweep_main(
                [*ONE_TRIAL, ray_cluster, f"tracking.uri={uri}", f"cluster.storage={tmp_path}/ray"]
            )
    finally:
        ready.set()
        os.kill(creator.pid, signal.SIGCONT)
        creator.wait(timeout=120)
    assert code == 0
    assert "another process is creating or migrating it; waiting for it" in caplog.text
    assert creator.returncode == 0, "the other process finished its store"
    assert schema_version(db) == schema_versions()[0]
    (run,) = children(uri, "smoke")
    assert run.data.tags[OUTCOME] == FINISHED


def stop_while_writing(db: Path) -> subprocess.Popen:
    """Another process creating the store at `db`, stopped mid-write (its rollback journal there): it holds
    SQLite's write lock until it is let go."""
    import psutil

    creator = subprocess.Popen([sys.executable, "-c", CREATE, f"sqlite:///{db}"], stderr=subprocess.DEVNULL)
    journal, process = Path(f"{db}-journal"), psutil.Process(creator.pid)
    while True:
        assert creator.poll() is None, "the other process ended before the test could stop it"
        if journal.exists():
            os.kill(creator.pid, signal.SIGSTOP)
            while process.status() != psutil.STATUS_STOPPED:
                time.sleep(0.001)
            if journal.exists():
                return creator
            os.kill(creator.pid, signal.SIGCONT)
        time.sleep(0.001)


def running(thread: threading.Thread, function: str) -> bool:
    """Whether `function` is on `thread`'s stack now."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None and frame.f_code.co_name != function:
        frame = frame.f_back
    return frame is not None


@pytest.mark.slow
def test_a_new_store_two_processes_create_at_once_is_opened(tmp_path, caplog) -> None:
    """connect found the file empty a moment ago and creates it (SqliteGuard.open_new) while another MLflow
    client does too: MLflow then fails in one of the two. Here it fails in this one (the other holds SQLite's
    write lock longer than MLflow waits for it), which then waits for the other's store and opens it."""
    db, done = tmp_path / "mlflow.db", threading.Event()
    creator = stop_while_writing(db)
    main = threading.current_thread()
    # let go once this process's MLflow failed and it watches the store: well within QUIET_S
    resume = lambda: (time.sleep(1), os.kill(creator.pid, signal.SIGCONT))  # noqa: E731
    when(lambda: running(main, "check_file"), resume, done, every=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger=sqlite_guard.__name__):
            client = sqlite_guard.SqliteGuard(f"sqlite:///{db}").open_new()
    finally:
        done.set()
        os.kill(creator.pid, signal.SIGCONT)
        creator.wait(timeout=120)
    assert "another process is creating or migrating it; waiting for it" in caplog.text
    assert creator.returncode == 0, "the other process finished its store"
    assert schema_version(db) == schema_versions()[0]
    assert store.experiment_names(client) == ["Default"]


def older_store(db: Path, revision: str) -> None:
    """A store as an MLflow of an older schema made it: MLflow's first tables, migrated up to `revision`."""
    from alembic import command
    from mlflow.store.db.utils import create_sqlalchemy_engine
    from mlflow.store.tracking.dbmodels.initial_models import Base

    engine = create_sqlalchemy_engine(f"sqlite:///{db}")
    Base.metadata.create_all(engine)
    config = _get_alembic_config(str(engine.url))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


@pytest.mark.slow  # an MLflow schema migration: 7 s
def test_an_older_store_is_refused_until_upgraded(tmp_path: Path) -> None:
    """Watched for QUIET_S (nobody migrates it), it is refused with the advice; the advice makes it usable."""
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    head, previous = schema_versions()
    older_store(db, previous)
    assert schema_version(db) == previous
    started = time.monotonic()
    with pytest.raises(store.TrackingError) as refused:
        store.connect(uri)
    assert str(refused.value) == (
        f"tracking store {uri} has MLflow schema {previous}, older than this MLflow's {head}: back the file "
        f"up, then run `mlflow db upgrade {uri}`"
    )
    assert time.monotonic() - started >= sqlite_guard.QUIET_S  # watched before it was judged
    from mlflow.db import commands

    upgraded = CliRunner().invoke(commands, ["upgrade", uri])  # `mlflow db upgrade URI`, in this process
    assert upgraded.exit_code == 0, upgraded.output
    client = store.connect(uri)
    assert store.find_experiment(client, store.experiment_names(client)[0]) == "0"  # MLflow's Default


def test_search_reads_every_page(sqlite_uri: str) -> None:
    client = store.connect(sqlite_uri)
    experiment = store.ensure_experiment(client, "pages")
    made = [client.create_run(experiment, tags={"parity": str(i % 2)}).info.run_id for i in range(7)]
    assert len(client.search_runs([experiment], max_results=3)) == 3  # so a page of 3 needs three pages
    assert sorted(r.info.run_id for r in store.search(client, [experiment], page=3)) == sorted(made)
    even = store.search(client, [experiment], "tags.parity = '0'", page=2)
    assert sorted(r.info.run_id for r in even) == sorted(made[::2])


def test_last_steps_per_metric(sqlite_uri: str) -> None:
    client = store.connect(sqlite_uri)
    run_id = client.create_run(store.ensure_experiment(client, "steps")).info.run_id
    points = [("a", 0), ("a", 10), ("a", 5), ("b", 3), ("b", 3)]  # out of order, and a step logged twice
    client.log_batch(
        run_id, metrics=[Metric(key, 1.0, 1000 + i, step) for i, (key, step) in enumerate(points)]
    )
    assert store.last_steps(client, client.get_run(run_id)) == {"a": 10, "b": 3}
    fresh = client.create_run(store.ensure_experiment(client, "steps")).info.run_id
    assert store.last_steps(client, client.get_run(fresh)) == {}


def _log_runs(client: MlflowClient, experiment: str, count: int) -> list[str]:
    """Runs whose histories hold what a read path could get wrong: a NaN, an infinity, a step logged twice
    (the later point wins), a run with one key only, and a key nobody asked for."""
    ids = []
    for j in range(count):
        run_id = client.create_run(experiment, tags={CONFIG_HASH: f"h{j}", SEED: str(j)}).info.run_id
        points = [Metric(VAL_REL_LLOYD, j + step / 10, 1000 * step, step) for step in range(6)]
        points += [
            Metric(VAL_REL_LLOYD, j + 0.5, 9000, 2),  # step 2 again, later
            Metric("unasked", 1.0, 0, 0),
        ]
        if j != 1:
            points += [
                Metric(TRAIN_LOSS, v, 500 + step, step) for step, v in enumerate([float("nan"), 2.0, np.inf])
            ]
        client.log_batch(run_id, metrics=points)
        client.set_terminated(run_id)
        ids.append(run_id)
    return ids


def _expected(client: MlflowClient, run_ids: list[str]) -> list[tuple]:
    """MlflowClient's histories, the latest point per step (NaN written as None, comparable)."""
    rows = {}
    for run_id in run_ids:
        for key in KEYS:
            for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
                rows[run_id, key, m.step] = (
                    run_id,
                    key,
                    m.step,
                    m.timestamp,
                    None if np.isnan(m.value) else m.value,
                )
    return sorted(rows.values())


def _rows(points: pd.DataFrame) -> list[tuple]:
    return sorted(
        (r.run_id, r.key, r.step, r.timestamp, None if np.isnan(r.value) else r.value)
        for r in points.itertuples()
    )


@pytest.fixture
def logged(sqlite_uri: str) -> tuple[str, pd.DataFrame]:
    client = MlflowClient(sqlite_uri)
    _log_runs(client, client.create_experiment("histories"), 3)
    return sqlite_uri, load_runs(sqlite_uri, "histories")


def test_sqlite_fast_path_and_public_api_give_the_same_frame(logged, caplog) -> None:
    uri, runs = logged
    with caplog.at_level(logging.WARNING, logger=metric_points.__name__):
        fast = histories(uri, runs, KEYS)
    assert not caplog.records  # the fast path answered
    pd.testing.assert_frame_equal(fast, histories(uri, runs, KEYS, fast=False))
    assert _rows(fast) == _expected(MlflowClient(uri), list(runs["run_id"]))
    assert len(fast) == 3 * 6 + 2 * 3 and fast["value"].isna().sum() == 2
    assert histories(uri, runs.iloc[:0], KEYS).empty


def test_a_sqlite_schema_the_fast_path_was_not_written_for_falls_back(logged, caplog) -> None:
    """A column MLflow's next schema might add: the fast path refuses the store, the public API answers."""
    uri, runs = logged
    before = histories(uri, runs, KEYS)
    with sqlite3.connect(uri.removeprefix("sqlite:///")) as db:
        db.execute("ALTER TABLE metrics ADD COLUMN origin TEXT")
    with caplog.at_level(logging.WARNING, logger=metric_points.__name__):
        after = histories(uri, runs, KEYS)
    pd.testing.assert_frame_equal(after, before)
    (record,) = caplog.records
    assert "origin" in record.getMessage() and "public API" in record.getMessage()


@pytest.mark.slow
def test_server_bulk_endpoint_and_public_api_give_the_same_frame(mlflow_server: str, caplog) -> None:
    client = MlflowClient(mlflow_server)
    name = f"store-bulk-{uuid.uuid4().hex[:8]}"
    _log_runs(client, client.create_experiment(name), 3)
    runs = load_runs(mlflow_server, name)
    with caplog.at_level(logging.WARNING, logger=metric_points.__name__):
        fast = histories(mlflow_server, runs, KEYS)
    assert not caplog.records  # the bulk endpoint answered
    pd.testing.assert_frame_equal(fast, histories(mlflow_server, runs, KEYS, fast=False))
    assert _rows(fast) == _expected(client, list(runs["run_id"]))


def test_report_prints_no_artifact_progress_bars(
    sqlite_uri: str, tiny: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:
    """`make demo`'s report downloaded a checkpoint per run, each under its own MLflow progress bar."""
    cfg = compose(tiny + [f"tracking.uri={sqlite_uri}"])
    train(cfg, MlflowRecorder(sqlite_uri, cfg.tracking.experiment), tmp_path / "work")
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)  # MLflow's default: bars on
    capsys.readouterr()
    assert (
        report.main(
            [
                f"tracking.uri={sqlite_uri}",
                f"out={tmp_path}",
                "figures=[length]",
                "eval.lengths=[16]",
                "eval.batches=1",
                "eval.batch=2",
                "eval.steps=2",
                "eval.device=cpu",
            ]
        )
        == 0
    )
    assert (
        tmp_path / cfg.tracking.experiment / "length.png"
    ).exists()  # the checkpoint was downloaded and used
    printed = capsys.readouterr()
    # The report's own progress: a line per figure, as stderr is not a terminal here (a bar on one).
    assert "report: figure 1/1: length\n" in printed.err
    assert "Downloading" not in printed.out + printed.err
