"""The MLflow tracking store: the one module that opens it, finds experiments and searches runs.

Training (tracking.recorder), the sweep driver (sweeper.session), reruns and the analysis write and
read runs through MlflowClient; what they share about the store is written here once:
  connect        fail fast, naming the URI, when the store cannot be reached or used, or its address has
                 no form of config.address (a PostgreSQL server too: MLflow would retry it for minutes);
                 else a client (a store another process is creating is waited for; the analysis and reruns
                 create none)
  explain        a SQLite error met later, as one line naming the store
  ensure_experiment  get or create an experiment, tagged as a model-training one (MLflow 3's UI then shows
                 runs) and with the runs view of tracking.view; find_experiment only finds one
  search         every page of a run search
  last_steps     per metric, the last step a run holds: a resumed run skips the points up to it
The metric points of many runs at once are tracking.metric_points' (fast paths beside the public API).

Opening a store turns MLflow's artifact progress bars off (unless MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR is
set): a report downloads one checkpoint per run and each download drew its own bar; our commands draw one
bar per long step themselves.
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import socket
import sqlite3
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

from mlflow.entities import Run, ViewType
from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from cli import exit_codes
from config import address
from tracking import moved, view
from tracking.names import EXPERIMENT_KIND, MODEL_TRAINING

log = logging.getLogger(__name__)
_opened: list[str] = []  # the SQLite stores this process opened (explain names the last)
_checked: set[str] = set()  # the SQLite stores check_sqlite found sound
PROBE_TIMEOUT_S = 5.0
# Another process creating or migrating a SQLite store is waited for (check_sqlite): at most MIGRATION_WAIT_S;
# a store that stood still for QUIET_S is judged as it stands (many times the pauses between the steps of
# MLflow's migration of a new store, a busy machine's included); WATCH_S between looks.
MIGRATION_WAIT_S = 60.0
QUIET_S = 5.0
WATCH_S = 0.1
# Said whole in the message: a pip install has no docs/ folder to point at.
READ_ONLY_ADVICE = (
    "make it writable, or copy its folder whole (the store with its artifacts beside it) elsewhere and set "
    "tracking.uri to the copy there"
)
PAGE = 5000  # runs per search page (a SQL store allows up to 50,000)


class TrackingError(RuntimeError, exit_codes.CommandError):
    """The tracking store cannot be used; the message names its URI."""

    exit_code = exit_codes.TRACKING


class _Passing(TrackingError):
    """A state that MLflow's creation or migration of a store passes through; the message says what it means
    if the store stays in it."""


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fail within `timeout` seconds, naming the URI, if the tracking store cannot be reached (or has no
    form it could have: config.address)."""
    why = address.problem(uri)
    if why:
        raise TrackingError(f"tracking store {uri}: the address {why}")
    if address.is_database(uri):
        _probe_database(uri, timeout)
        return
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        if not folder.is_dir():
            raise TrackingError(f"tracking store {uri}: folder {folder} does not exist")
        return
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as reply:
            reply.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(
            f"MLflow tracking server {uri} is unreachable ({reason}); start it "
            f"(mlflow server --host HOST --port PORT) or set tracking.uri"
        ) from None
    _probe_access(uri, timeout)


def _probe_database(uri: str, timeout: float) -> None:
    """An SQL server's address: its host answers within `timeout` (a local socket answers or refuses at
    once), its driver is installed and it lets this user in; once each (MLflow would retry an engine it
    cannot create for minutes)."""
    import sqlalchemy

    shown = sqlalchemy.make_url(uri).render_as_string(hide_password=True)
    if address.database_host(uri):
        try:
            socket.create_connection(address.database_host(uri), timeout=timeout).close()
        except OSError as err:
            raise TrackingError(
                f"database {shown} is unreachable ({err.strerror or err}): start it, or set tracking.uri"
            ) from None
    try:
        engine = sqlalchemy.create_engine(uri)
    except ImportError as err:
        raise TrackingError(
            f"tracking store {shown}: its driver {err.name} is not installed: install it (postgresql://: "
            f"pip install 'psycopg[binary]')"
        ) from None
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as err:
        reason = str(getattr(err, "orig", err)).strip().splitlines()[0]
        raise TrackingError(f"database {shown} refused the connection ({reason}): set tracking.uri") from None
    finally:
        engine.dispose()


def _probe_access(uri: str, timeout: float) -> None:
    """/health needs no login; a server with basic auth refuses the API itself, so ask it once."""
    request = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read()
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise TrackingError(
                f"MLflow tracking server {uri} refused access ({err.code}): set "
                f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
            ) from None
    except (urllib.error.URLError, OSError):
        pass  # reachable a moment ago: let MLflow's own client report anything else


def connect(uri: str, write: bool = True, create: bool = True) -> MlflowClient:
    """A client of the store at `uri`, once probe() found it reachable; MLflow's artifact progress bars off.

    A SQLite file is checked before MLflow opens it (check_sqlite), so that a damaged or foreign file is
    reported in one line and never migrated or written to. `write=False` (the analysis) opens a read-only
    store as it is; `write=True` (train, sweep, rerun) refuses it before any work. A missing or empty file
    becomes a new store only for a command that writes and may create one (train, sweep); the others (the
    analysis, and rerun with create=False: its run cannot be in a new store) refuse it and write nothing.
    """
    probe(uri)
    os.environ.setdefault(
        MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, "false"
    )  # read by MLflow at every transfer
    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    path = Path(uri.removeprefix("sqlite:///"))
    _opened.append(uri)
    if path.is_dir():
        raise TrackingError(f"tracking store {uri}: {path} is a folder: set tracking.uri to sqlite:///FILE")
    if not (write and create) and (not path.exists() or path.stat().st_size == 0):
        what = "an empty file" if path.exists() else "no such file"
        raise TrackingError(
            f"tracking store {uri}: nothing at {path} ({what}): set tracking.uri to the store that holds "
            f"the runs (a sweep or train creates one)"
        )
    if not write:  # an existing store, read: nothing is created or migrated, so no lock (nor its file)
        check_sqlite(uri)
        moved.mend(path, writable(uri))
        return MlflowClient(tracking_uri=uri)
    if not writable(uri):
        raise TrackingError(
            f"tracking store {uri} is read-only (no write permission on {path} or its folder): "
            f"{READ_ONLY_ADVICE}"
        )
    if (
        path.exists() and path.stat().st_size > 0
    ):  # an existing store: judged as it is, no lock (nor its file)
        check_sqlite(uri)
        if create:  # not rerun's first look, which may refuse the run it asks for: nothing written then
            moved.mend(path, True)
        return MlflowClient(tracking_uri=uri)
    # Opening a SQLite store creates or migrates MLflow's schema; two of our processes doing it at once on a
    # new file (two drivers, a sweep and a train) make one of them fail. One at a time, the second finds it
    # done. Any other MLflow client (`mlflow ui`, a notebook) takes no such lock: _open_new.
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        new = not path.exists() or path.stat().st_size == 0
        check_sqlite(uri)
        return _open_new(uri) if new else MlflowClient(tracking_uri=uri)


def _open_new(uri: str) -> MlflowClient:
    """Create the store at `uri` (a missing or empty file) with MLflow, unless another MLflow client began
    creating it at the same moment: MLflow then fails in one of the two processes (a table that exists
    already, a schema version that moved), and this one waits for the other's store and opens it."""
    try:
        return MlflowClient(tracking_uri=uri)
    except Exception as err:  # noqa: BLE001 - MLflow, SQLAlchemy and alembic each raise their own kinds
        try:
            check_sqlite(uri)  # waits while the other process works; refuses what it leaves unfinished
        except TrackingError:
            raise err from None  # no other process: this failure was MLflow's own, reported as it is
        return MlflowClient(tracking_uri=uri)


def writable(uri: str) -> bool:
    """Whether this process may write the store: a SQLite file and its folder (for SQLite's journal)."""
    if not uri.startswith("sqlite:///"):
        return True  # a server: its own permissions
    path = Path(uri.removeprefix("sqlite:///"))
    return os.access(path.parent, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))


def check_sqlite(uri: str) -> None:
    """Raise TrackingError, naming the store and what to do, unless its file is a whole MLflow store of this
    MLflow's schema (or empty or missing: MLflow then creates it). Reads the file only.

    An MLflow client that opens a new file (`mlflow ui`, a notebook, another command) creates MLflow's first
    tables, then migrates them to the current schema step by step, committing each step: caught in between,
    the new store looks like an older or foreign one. Nothing in the file tells the two apart (no mark of a
    migration under way; an abandoned store can be as young as a new one), so such a state (_Passing) is
    watched, not refused at once: while the store changes (its state, the size or time of its files) a
    process is at work on it, and it is waited for, up to MIGRATION_WAIT_S; once it has stood still for
    QUIET_S, it is judged as it stands. A truly older store is thus refused after QUIET_S.
    """
    path = Path(uri.removeprefix("sqlite:///"))
    deadline, seen, still_since, told = time.monotonic() + MIGRATION_WAIT_S, None, 0.0, False
    while uri not in _checked:
        try:
            _check_once(uri, path)
            return
        except _Passing as state:
            now, mark = time.monotonic(), (str(state), _files(path))
            if mark != seen:
                if seen is not None and not told:
                    log.warning(
                        "tracking store %s: another process is creating or migrating it; waiting for it "
                        "(at most %.0f s)",
                        uri,
                        MIGRATION_WAIT_S,
                    )
                    told = True
                seen, still_since = mark, now
            if now - still_since >= QUIET_S:
                raise TrackingError(str(state)) from None
            if now >= deadline:
                raise TrackingError(
                    f"tracking store {uri}: another process has been creating or migrating it for "
                    f"{MIGRATION_WAIT_S:.0f} s and it is not done: try again when it is"
                ) from None
            time.sleep(WATCH_S)


def _files(path: Path) -> tuple:
    """Size and modification time of the store's file, its rollback journal and its write-ahead log."""
    marks = []
    for file in (path, Path(f"{path}-journal"), Path(f"{path}-wal")):
        try:
            stat = file.stat()
            marks.append((stat.st_size, stat.st_mtime_ns))
        except FileNotFoundError:
            marks.append(None)
    return tuple(marks)


def _check_once(uri: str, path: Path) -> None:
    """check_sqlite's one look at the file: raises _Passing for a state a creation passes through."""
    locked = _Passing(
        f"tracking store {uri}: SQLite says 'database is locked': another process holds it; try again when "
        f"it is done, or use a tracking server for many writers"
    )
    if not path.exists() or path.stat().st_size == 0:
        if Path(f"{path}-journal").exists() or Path(f"{path}-wal").exists():
            raise locked  # another process is writing its first transaction
        return
    restore = "restore it from a backup, or set tracking.uri to another store"
    with open(path, "rb") as file:
        header = file.read(100)
    if not header.startswith(b"SQLite format 3\x00"):
        raise TrackingError(f"tracking store {uri}: {path} is not an SQLite database (damaged?): {restore}")
    expected = _sqlite_size(header)
    if expected and path.stat().st_size < expected and not Path(f"{path}-wal").exists():
        truncated = TrackingError if not Path(f"{path}-journal").exists() else _Passing  # mid-commit?
        raise truncated(
            f"tracking store {uri}: {path} is truncated ({path.stat().st_size} of its {expected} bytes): "
            f"{restore}"
        )
    try:
        with closing(
            sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True, timeout=1)
        ) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            found = (
                db.execute("SELECT version_num FROM alembic_version").fetchone()
                if "alembic_version" in tables
                else None
            )
    except sqlite3.DatabaseError as err:
        if "locked" in str(err):  # a writer at work, or one that stopped holding it: watched
            raise locked from None
        raise TrackingError(f"tracking store {uri}: SQLite cannot read {path} ({err}): {restore}") from None
    if found is None or not {"experiments", "runs", "metrics"} <= tables:
        foreign = _Passing if found is None and _mlflow_tables(tables) else TrackingError
        raise foreign(
            f"tracking store {uri}: {path} is an SQLite database but not an MLflow store (tables: "
            f"{', '.join(sorted(tables)) or 'none'}): set tracking.uri to an MLflow store or a new file"
        )
    _check_schema(uri, found[0])
    _checked.add(uri)


def _mlflow_tables(tables: set[str]) -> bool:
    """Whether every table is one MLflow makes: its schema's (first or current) or alembic's own, with the
    copies alembic's batch migrations make of a table on SQLite (_alembic_tmp_NAME)."""
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.tracking.dbmodels import initial_models, models  # noqa: F401 - fill Base's tables

    known = {*Base.metadata.tables, *initial_models.Base.metadata.tables, "alembic_version"}
    return all(t in known or t.startswith("_alembic_tmp_") for t in tables)


def _sqlite_size(header: bytes) -> int | None:
    """The file size an SQLite header promises (page size x page count), None when the count is not valid."""
    page_size = int.from_bytes(header[16:18], "big")
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96]  # SQLite's own rule for trusting the page count
    return (65536 if page_size == 1 else page_size) * pages if valid and pages else None


def _check_schema(uri: str, version: str) -> None:
    """A store of another MLflow schema version: MLflow would refuse it (older) or fail in alembic (newer)."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config  # MLflow's own migrations; private, hence guarded

    try:
        script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
        head = script.get_current_head()
    except Exception:  # noqa: BLE001 - a message's refinement only: MLflow checks the schema itself too
        return
    if version == head:
        return
    try:
        known = script.get_revision(version) is not None
    except Exception:  # noqa: BLE001 - alembic raises several kinds for a revision it does not know
        known = False
    if known:  # a store being migrated passes through every older version: check_sqlite watches it
        raise _Passing(
            f"tracking store {uri} has MLflow schema {version}, older than this MLflow's {head}: back the "
            f"file up, then run `mlflow db upgrade {uri}`"
        )
    raise TrackingError(
        f"tracking store {uri} has MLflow schema {version}, unknown to this MLflow (schema {head}): it was "
        f"written by a newer MLflow; use that version (requirements.lock pins this one) or another store"
    )


def explain(err: BaseException) -> TrackingError | None:
    """A SQLite error met while using a store (a file damaged after it was opened, a write refused) as one
    line naming the store; None for any other error."""
    # SQLAlchemy keeps the driver's error as .orig (and as __cause__, unless a `raise ... from None` cut it)
    found = (getattr(e, "orig", e) for e in _chain(err))
    cause = next((e for e in found if isinstance(e, sqlite3.DatabaseError)), None)
    if cause is None or not _opened:
        return None
    uri = _opened[-1]
    reason = str(cause).splitlines()[0]
    if "readonly" in reason:
        advice = READ_ONLY_ADVICE
    elif "locked" in reason:
        advice = (
            "another process holds it; try again when it is done, or use a tracking server for many writers"
        )
    else:
        advice = "the file is damaged: restore it from a backup, or set tracking.uri to another store"
    return TrackingError(f"tracking store {uri}: SQLite says {reason!r}: {advice}")


def _chain(err: BaseException) -> Iterator[BaseException]:
    """err, then its cause (else its context), then that one's, ...: each once, for a chain can loop
    (`raise e from e`: Ray's missing-dashboard error is its own cause)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """The id of experiment `name`, created when missing; either way tagged as a model-training experiment
    and with the runs view that tracking.ui.runs_table opens (tracking.view)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            created = client.create_experiment(
                name,
                artifact_location=_artifact_root(client.tracking_uri, name),
                tags={EXPERIMENT_KIND: MODEL_TRAINING},
            )
            view.install(client, created, {})
            return created
        except MlflowException:  # created meanwhile by another process
            found = client.get_experiment_by_name(name)
    if found.tags.get(EXPERIMENT_KIND) != MODEL_TRAINING:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
    view.install(client, found.experiment_id, found.tags)
    return found.experiment_id


def _artifact_root(uri: str, name: str) -> str | None:
    """Keep a SQLite store's artifacts beside its file, not in whatever the working directory is."""
    if not uri.startswith("sqlite:///"):
        return None  # a server's own artifact root
    return moved.artifact_root(Path(uri.removeprefix("sqlite:///")), name)


def find_experiment(client: MlflowClient, name: str) -> str | None:
    """The id of experiment `name`, None when there is none (nothing is created)."""
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found else None


def experiment_names(client: MlflowClient) -> list[str]:
    """The names of the store's active experiments, sorted."""
    return sorted(e.name for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY))


def search(client: MlflowClient, experiment_ids: list[str], query: str = "", page: int = PAGE) -> list[Run]:
    """Every active run of the experiments that matches `query` (MLflow's search syntax), page by page."""
    runs, token = [], None
    while True:
        found = client.search_runs(experiment_ids, query, ViewType.ACTIVE_ONLY, page, page_token=token)
        runs += found
        token = found.token
        if not token:
            return runs


def last_steps(client: MlflowClient, run: Run) -> dict[str, int]:
    """Metric -> the last step `run` holds: a resumed run replays its steps, skipping the points up to it."""
    return {
        key: max(m.step for m in client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics
    }
