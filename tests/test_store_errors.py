"""A store that cannot be used, as every command reports it: one line naming the store, the code
docs/commands.md documents.

Each bad store is a real file (random bytes, a real store cut short, another program's SQLite database, a
real store whose MLflow schema version is older or unknown, a real store with a damaged table) and each
command is called as the console script calls it (main(argv)); the store's bytes must not change.
A read-only store is refused by the commands that write (train, sweep, rerun) and read by those that only
read (report, claims): run as subprocesses with the permissions a user without root has.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from mlflow.store.db.utils import _get_alembic_config
from support.repo import REPO, subprocess_env

from analysis import report
from analysis.claims import __main__ as claims
from cli import exit_codes
from cli.entry import command
from config.compose import compose
from sweeper import rerun, sweep, train
from tracking import sqlite_guard
from tracking.mlflow_recorder import MlflowRecorder
from training.loop import train as train_loop

RUN_ID = "0123456789abcdef0123456789abcdef"


def commands(uri: str, out: Path, run_id: str = RUN_ID) -> dict[str, tuple]:
    """command -> (main, argv) as its console script would call it, on the store `uri`."""
    return {
        "train": (train.main, [f"tracking.uri={uri}", "train.steps=2"]),
        "sweep": (sweep.main, ["sweep=smoke", f"tracking.uri={uri}"]),
        "rerun": (rerun.main, [run_id, f"tracking.uri={uri}"]),
        "report": (report.main, [f"tracking.uri={uri}", f"out={out}"]),
        "claims": (claims.main, [f"tracking.uri={uri}", f"out={out}"]),
    }


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def schema(db: Path, version: str) -> None:
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = ?", (version,))


def older_revision() -> str:
    script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
    return script.get_revision(script.get_current_head()).down_revision


def foreign(db: Path) -> None:
    db.unlink()
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE notes (text)")


def damaged_runs_table(db: Path) -> None:
    """The runs table's root page overwritten: the header, size and schema still look right."""
    with sqlite3.connect(db) as con:
        (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()
        (page,) = con.execute("PRAGMA page_size").fetchone()
    with open(db, "r+b") as file:
        file.seek((root - 1) * page)
        file.write(b"\xff" * page)


# case -> (how to spoil a copy of a real store, what the one line says)
CASES = {
    "corrupt": (lambda db: db.write_bytes(os.urandom(8192)), "is not an SQLite database"),
    "truncated": (lambda db: db.write_bytes(db.read_bytes()[: db.stat().st_size // 2]), "is truncated"),
    "foreign": (foreign, "is an SQLite database but not an MLflow store (tables: notes)"),
    "older-schema": (lambda db: schema(db, older_revision()), "run `mlflow db upgrade"),
    "newer-schema": (lambda db: schema(db, "feedfacecafe"), "unknown to this MLflow"),
}


# An older store is watched for QUIET_S before it is refused (a migration may be under way): 5 s each, slow.
BAD_STORES = [pytest.param(c, marks=pytest.mark.slow) if c == "older-schema" else c for c in sorted(CASES)]


@pytest.mark.parametrize("command", ["train", "sweep", "rerun", "report", "claims"])
@pytest.mark.parametrize("case", BAD_STORES)
def test_a_bad_store_is_one_line_and_exit_code_4(case, command, tmp_path, _empty_store, capsys):
    db = tmp_path / "mlflow.db"
    shutil.copyfile(_empty_store, db)
    spoil, says = CASES[case]
    spoil(db)
    before, uri = digest(db), f"sqlite:///{db}"
    main, argv = commands(uri, tmp_path / "reports")[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == exit_codes.TRACKING, err
    assert err.count("\n") == 1 and err.startswith(f"error: tracking store {uri}") and says in err, err
    assert digest(db) == before
    assert [p.name for p in tmp_path.iterdir()] == [db.name]  # nothing beside it: no report, no lock file


@pytest.fixture(scope="module")
def store_with_a_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store holding one tiny finished training run (experiment leaner-clustering)."""
    from conftest import TINY

    root = tmp_path_factory.mktemp("one-run")
    uri = f"sqlite:///{root}/mlflow.db"
    cfg = compose([*TINY, f"tracking.uri={uri}"])
    train_loop(cfg, MlflowRecorder(uri, cfg.tracking.experiment), root / "work")
    return root


def copy_store(source: Path, to: Path) -> Path:
    shutil.copytree(source, to, ignore=shutil.ignore_patterns("work", "*.lock"))
    return to / "mlflow.db"


@pytest.mark.parametrize("command", ["train", "rerun", "report", "claims"])
def test_a_store_damaged_inside_is_one_line_and_exit_code_4(command, store_with_a_run, tmp_path, capsys):
    """Damage the header checks cannot see surfaces inside MLflow; the command still answers in one line."""
    db = copy_store(store_with_a_run, tmp_path / "store")
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("SELECT run_uuid FROM runs").fetchone()  # rerun asks for a run it holds
    damaged_runs_table(db)
    before, uri = digest(db), f"sqlite:///{db}"
    main, argv = commands(uri, tmp_path / "reports", run_id)[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == exit_codes.TRACKING, err
    assert err == (
        f"error: tracking store {uri}: SQLite says 'database disk image is malformed': the file is damaged: "
        "restore it from a backup, or set tracking.uri to another store\n"
    )
    assert digest(db) == before


def test_a_refused_insert_is_a_conflict_never_called_damage() -> None:
    """A unique key refusing an insert another process made first says so; it once told users to restore a
    sound file from a backup (and lose what was recorded since)."""
    cause = sqlite3.IntegrityError(
        "UNIQUE constraint failed: experiment_tags.key, experiment_tags.experiment_id"
    )
    said = str(sqlite_guard.explanation("sqlite:////s/mlflow.db", cause))
    assert said.startswith("tracking store sqlite:////s/mlflow.db: SQLite says 'UNIQUE constraint failed: ")
    assert "another process wrote the same record" in said and "backup" not in said


def test_rerun_of_an_unknown_run_has_its_own_exit_code(store_with_a_run, tmp_path, capsys):
    db = copy_store(store_with_a_run, tmp_path / "store")
    before, uri = digest(db), f"sqlite:///{db}"
    code = rerun.main([RUN_ID, f"tracking.uri={uri}"])
    err = capsys.readouterr().err
    assert code == exit_codes.NO_SUCH_RUN == 9
    assert (
        err.startswith(f"error: run {RUN_ID} is not in the tracking store {uri}: ") and err.count("\n") == 1
    )
    assert digest(db) == before


@pytest.mark.parametrize("command", ["rerun", "report", "claims"])
@pytest.mark.parametrize("case", ["missing", "empty"])
def test_a_command_that_only_reads_creates_no_store(case, command, tmp_path, capsys):
    """A mistyped path (or an empty file) for a command that reads a store: MLflow made a 954 KB store there.
    One line naming the path, exit 4, and nothing written."""
    folder = tmp_path / "stores"
    folder.mkdir()
    db = folder / "mlfow.db"  # mistyped
    if case == "empty":
        db.touch()
    uri, out = f"sqlite:///{db}", tmp_path / "reports"
    main, argv = commands(uri, out)[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == exit_codes.TRACKING, err
    what = "no such file" if case == "missing" else "an empty file"
    assert err == (
        f"error: tracking store {uri}: nothing at {db} ({what}): set tracking.uri to the store that holds "
        "the runs (a sweep or train creates one)\n"
    )
    assert [p.name for p in folder.iterdir()] == ([] if case == "missing" else [db.name])
    assert case == "missing" or db.stat().st_size == 0
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "sweep", "rerun", "report", "claims"])
def test_a_folder_is_no_store(command, tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    db.mkdir()
    uri = f"sqlite:///{db}"
    main, argv = commands(uri, tmp_path / "reports")[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == exit_codes.TRACKING, err
    assert err == f"error: tracking store {uri}: {db} is a folder: set tracking.uri to sqlite:///FILE\n"
    assert list(db.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


def without_root(cmd: list[str]) -> list[str]:
    """The command as a user without root's override of file permissions runs it (root keeps its uid)."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: cannot drop the override of file permissions")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]


def read_only(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)


def writable_again(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWUSR)


@pytest.fixture
def read_only_store(store_with_a_run: Path, tmp_path: Path):
    db = copy_store(store_with_a_run, tmp_path / "store")
    read_only(db.parent)
    yield db
    writable_again(db.parent)


def run_command(module: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = without_root([sys.executable, "-m", module, *args])
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, args",
    [
        ("sweeper.train", ["train.steps=2"]),
        ("sweeper.sweep", ["sweep=smoke"]),
        ("sweeper.rerun", [RUN_ID]),
    ],
    ids=["train", "sweep", "rerun"],
)
def test_commands_that_write_refuse_a_read_only_store(module, args, read_only_store, tmp_path):
    before, uri = digest(read_only_store), f"sqlite:///{read_only_store}"
    done = run_command(module, [*args, f"tracking.uri={uri}"], tmp_path)
    assert done.returncode == exit_codes.TRACKING, done.stderr[-3000:]
    assert done.stderr == (
        f"error: tracking store {uri} is read-only (no write permission on {read_only_store} or its folder): "
        "make it writable, or copy its folder whole (the store with its artifacts beside it) elsewhere "
        "and set tracking.uri to the copy there\n"
    )
    assert digest(read_only_store) == before


@pytest.mark.slow
def test_report_and_claims_read_a_read_only_store(read_only_store, tmp_path):
    before, uri = digest(read_only_store), f"sqlite:///{read_only_store}"
    out = tmp_path / "reports"
    done = run_command("analysis.claims", [f"tracking.uri={uri}", f"out={out}"], REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "leaner-clustering" / "claims.csv").is_file()
    figures = "figures=[convergence,multistep]"  # a checkpoint evaluation too: cached, not logged
    done = run_command(
        "analysis.report", [f"tracking.uri={uri}", f"out={out}", figures, "eval.batches=1"], REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "leaner-clustering" / "index.md").is_file()
    assert digest(read_only_store) == before


def test_a_sqlalchemy_error_whose_cause_was_cut_still_names_the_store(tmp_path):
    """MLflow failing while it creates a store is re-raised `from None` (SqliteGuard.open_new): the SQLite
    error is then only SQLAlchemy's .orig. Seen as a 139-line traceback, exit 1, from a train whose new store
    was truncated while MLflow migrated it. The SQLAlchemy error itself carries the explanation."""
    import sqlalchemy

    from tracking import store

    db = tmp_path / "mlflow.db"
    store.connect(f"sqlite:///{db}")
    db.write_bytes(os.urandom(8192))
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as con:
            con.execute(sqlalchemy.text("SELECT * FROM runs"))
    except sqlalchemy.exc.DatabaseError as err:
        try:
            try:
                raise store.TrackingError("no other process at work on it")  # check_file's answer
            except store.TrackingError:
                raise err from None  # as open_new does: its context becomes the TrackingError
        except sqlalchemy.exc.DatabaseError as cut:
            assert cut.__cause__ is None and isinstance(cut.__context__, store.TrackingError)
            explained = exit_codes.explained(cut)
    finally:
        engine.dispose()
    assert isinstance(explained, store.TrackingError), explained
    assert str(explained).startswith(f"tracking store sqlite:///{db}: SQLite says 'file is not a database'")


def test_a_store_damaged_after_it_was_opened_is_named_among_two(tmp_path, _empty_store, capsys):
    """Two stores opened in one process (a notebook, a test's): a SQLite error of the first names the first,
    not the one opened last; through a command's error path, one line and exit code 4."""
    from tracking import store

    first, second = (tmp_path / name / "mlflow.db" for name in ("first", "second"))
    for db in (first, second):
        db.parent.mkdir()
        shutil.copyfile(_empty_store, db)
    client = store.connect(f"sqlite:///{first}")
    store.connect(f"sqlite:///{second}")
    first.write_bytes(os.urandom(8192))

    @command("leaner-probe", show_config=str)
    def main(argv: list[str]) -> int:
        client.search_experiments()
        return 0

    assert main([]) == exit_codes.TRACKING
    assert capsys.readouterr().err == (
        f"error: tracking store sqlite:///{first}: SQLite says 'file is not a database': the file is "
        "damaged: restore it from a backup, or set tracking.uri to another store\n"
    )


def killed_mid_write(db: Path) -> Path:
    """A writer killed in the middle of a transaction on the store, as a driver killed with its node is: its
    rollback journal is left behind, "hot". Returns the journal."""
    code = (
        "import sqlite3, sys, time\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA cache_size = 1')\n"  # a small cache: SQLite writes the store before the commit
        "db.execute('BEGIN IMMEDIATE')\n"
        "db.execute(\"UPDATE runs SET name = 'half-written'\")\n"
        "db.execute('CREATE TABLE filler (x)')\n"
        "db.executemany('INSERT INTO filler VALUES (zeroblob(4000))', [()] * 50)\n"
        "print('written', flush=True)\n"
        "time.sleep(600)\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "written\n"
    writer.kill()
    writer.wait()
    journal = db.with_name(f"{db.name}-journal")
    assert journal.is_file()
    return journal


def run_names(db: Path) -> list[str]:
    """The store's run names, and its tables past MLflow's (the killed writer's filler)."""
    with closing(sqlite3.connect(db)) as con:
        names = [name for (name,) in con.execute("SELECT name FROM runs")]
        return names + [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE name = 'filler'")]


def test_a_store_whose_writer_was_killed_midway_is_rolled_back_and_read(store_with_a_run, tmp_path, capsys):
    """SQLite rolls back what a killed writer left unfinished on the next open that may write; a read-only
    look must not take the journal it leaves for damage (a retried driver refused a store its lost
    predecessor was writing when killed)."""
    db = copy_store(store_with_a_run, tmp_path / "store")
    names = run_names(db)
    journal = killed_mid_write(db)
    code = claims.main([f"tracking.uri=sqlite:///{db}", f"out={tmp_path / 'reports'}"])
    assert code == 0, capsys.readouterr().err
    assert not journal.exists() and run_names(db) == names  # rolled back: the half-written name is gone


@pytest.mark.slow
def test_a_read_only_store_whose_writer_was_killed_midway_says_it_needs_writing(store_with_a_run, tmp_path):
    db = copy_store(store_with_a_run, tmp_path / "store")
    journal = killed_mid_write(db)
    read_only(db.parent)
    try:
        uri = f"sqlite:///{db}"
        done = run_command("analysis.claims", [f"tracking.uri={uri}", f"out={tmp_path / 'reports'}"], REPO)
    finally:
        writable_again(db.parent)
    assert done.returncode == exit_codes.TRACKING, done.stderr[-3000:]
    assert done.stderr == (
        f"error: tracking store {uri}: a process stopped in the middle of writing it, and SQLite must roll "
        f"its unfinished transaction back (from {journal}) before anyone reads it: make it writable, or copy "
        "its folder whole (the store with its artifacts beside it) elsewhere and set tracking.uri to the copy"
        " there\n"
    )
    assert journal.exists()
