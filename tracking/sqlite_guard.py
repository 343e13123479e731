"""The guard of a SQLite tracking store: MLflow opens only a file that is a whole store of its own schema,
and a SQLite error met later names the store it came from.

  SqliteGuard(uri).open   tracking.store.connect's SQLite part: a folder, a missing file for a command that
                          only reads, a read-only store for one that writes, a store on a file system that
                          refuses file locks (locks_refused), each refused in one line; a new
                          store created by one of our processes at a time; then MLflow's client
  SqliteGuard(uri).check_file   the file is a whole MLflow store of this MLflow's schema (or empty or
                          missing: MLflow then creates it), read only (but for SQLite's rollback of what a
                          process that stopped midway left unfinished); a state MLflow's creation or
                          migration passes through is watched (_Watch) rather than refused at once
  name_sqlite_errors      every SQLite error of a store's engine carries the TrackingError naming that store
                          (cli.exit_codes.attach), which the command ends with: a store damaged or made
                          read-only after it was opened is one line, exit code 4, not a traceback

Each guard is one store's and holds its state; nothing is kept between two opens of a store.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import tempfile
import time
import urllib.parse
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from cli import exit_codes
from tracking import moved
from tracking.errors import TrackingError

log = logging.getLogger(__name__)
# Another process creating or migrating a SQLite store is waited for (check_file): at most MIGRATION_WAIT_S;
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
LOCKED_ADVICE = (
    "another process holds it; try again when it is done, or use a tracking server for many writers"
)
CONFLICT_ADVICE = (
    "another process wrote the same record at that moment (the file is sound); run the command again"
)
RESTORE = "restore it from a backup, or set tracking.uri to another store"
NO_LOCKS_ADVICE = (
    "put the store on a file system that grants them (a local disk; Lustre mounted with flock; NFS with its "
    "lock service), or use a tracking server (tracking.uri=http://HOST:PORT)"
)


class _Passing(TrackingError):
    """A state that MLflow's creation or migration of a store passes through; the message says what it means
    if the store stays in it."""


def writable(uri: str) -> bool:
    """Whether this process may write the store: a SQLite file and its folder (for SQLite's journal)."""
    if not uri.startswith("sqlite:///"):
        return True  # a server: its own permissions
    path = Path(uri.removeprefix("sqlite:///"))
    return os.access(path.parent, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))


def locks_refused(folder: Path) -> str | None:
    """Why the file system of `folder` refuses the file locks a store's writers take, or None when it grants
    them: SQLite's POSIX locks (fcntl) and the flock of a new store's creation (SqliteGuard._create), each
    tried on a file of its own there. Lustre mounted with `noflock` refuses both (ENOSYS); SQLite then fails
    its first write with 'disk I/O error', which reads as a damaged store."""
    fd, name = tempfile.mkstemp(prefix=".lock-probe-", dir=folder)
    try:
        for lock in (fcntl.lockf, fcntl.flock):
            lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock(fd, fcntl.LOCK_UN)
    except OSError as err:
        return f"{lock.__name__}: {err.strerror}"
    finally:
        os.close(fd)
        os.unlink(name)
    return None


class SqliteGuard:
    """The store at `uri` (sqlite:///PATH), checked before MLflow opens it."""

    def __init__(self, uri: str) -> None:
        self.uri, self.path = uri, Path(uri.removeprefix("sqlite:///"))

    def refused(self, why: str) -> TrackingError:
        return TrackingError(f"tracking store {self.uri}: {why}")

    def open(self, write: bool, create: bool) -> MlflowClient:
        """A client of the store (tracking.store.connect says what `write` and `create` allow)."""
        name_sqlite_errors()
        self._refuse(write, create)
        if not self.path.exists() or self.path.stat().st_size == 0:
            return self._create()
        self.check_file()  # an existing store: judged as it is, no lock (nor its file)
        if create or not write:  # not rerun's first look, which may refuse its run: nothing written then
            moved.mend(self.path, writable(self.uri))
        return MlflowClient(tracking_uri=self.uri)

    def _refuse(self, write: bool, create: bool) -> None:
        """Refuse, before MLflow sees it, a folder, a missing or empty file for a command that may not
        create a store (the analysis; rerun) and a store a command that writes may not write."""
        path = self.path
        if path.is_dir():
            raise self.refused(f"{path} is a folder: set tracking.uri to sqlite:///FILE")
        if not (write and create) and (not path.exists() or path.stat().st_size == 0):
            raise self.refused(
                f"nothing at {path} ({'an empty file' if path.exists() else 'no such file'}): set "
                "tracking.uri to the store that holds the runs (a sweep or train creates one)"
            )
        if write and not writable(self.uri):
            raise TrackingError(
                f"tracking store {self.uri} is read-only (no write permission on {path} or its folder): "
                f"{READ_ONLY_ADVICE}"
            )
        why = locks_refused(path.parent) if write else None
        if why is not None:
            raise self.refused(
                f"the file system of {path.parent} refuses file locks ({why}): {NO_LOCKS_ADVICE}"
            )

    def _create(self) -> MlflowClient:
        """A new store (a missing or empty file), created by one of our processes at a time.

        Opening a SQLite store creates or migrates MLflow's schema; two of our processes doing it at once on
        a new file (two drivers, a sweep and a train) make one of them fail. One at a time, the second finds
        it done. Any other MLflow client (`mlflow ui`, a notebook) takes no such lock: open_new.
        """
        with open(f"{self.path}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            new = not self.path.exists() or self.path.stat().st_size == 0
            self.check_file()
            return self.open_new() if new else MlflowClient(tracking_uri=self.uri)

    def open_new(self) -> MlflowClient:
        """Create the store (a missing or empty file) with MLflow, unless another MLflow client began creating
        it at the same moment: MLflow then fails in one of the two processes (a table that exists already, a
        schema version that moved), and this one waits for the other's store and opens it."""
        try:
            return MlflowClient(tracking_uri=self.uri)
        except Exception as err:  # noqa: BLE001 - MLflow, SQLAlchemy and alembic each raise their own kinds
            try:
                self.check_file()  # waits while the other process works; refuses what it leaves unfinished
            except TrackingError:
                raise err from None  # no other process: this failure was MLflow's own, reported as it is
            return MlflowClient(tracking_uri=self.uri)

    def check_file(self) -> None:
        """Raise TrackingError, naming the store and what to do, unless its file is a whole MLflow store of
        this MLflow's schema (or empty or missing: MLflow then creates it). Reads the file only, but for
        SQLite's rollback of a transaction whose process stopped midway (_roll_back_unfinished).

        An MLflow client that opens a new file (`mlflow ui`, a notebook, another command) creates MLflow's
        first tables, then migrates them to the current schema step by step, committing each step: caught in
        between, the new store looks like an older or foreign one. Nothing in the file tells the two
        apart (no mark of a migration under way; an abandoned store can be as young as a new one), so such a
        state (_Passing) is watched, not refused at once (_Watch): a truly older store is refused after
        QUIET_S.
        """
        watch = _Watch(self.uri, time.monotonic() + MIGRATION_WAIT_S)
        while True:
            try:
                return self._look()
            except _Passing as state:
                watch.saw(state, self._files())
                time.sleep(WATCH_S)

    def _files(self) -> tuple:
        """Size and modification time of the store's file, its rollback journal and its write-ahead log."""
        marks = []
        for file in (self.path, Path(f"{self.path}-journal"), Path(f"{self.path}-wal")):
            try:
                stat = file.stat()
                marks.append((stat.st_size, stat.st_mtime_ns))
            except FileNotFoundError:
                marks.append(None)
        return tuple(marks)

    def _look(self) -> None:
        """check_file's one look at the file: raises _Passing for a state a creation passes through."""
        path, journal, wal = self.path, Path(f"{self.path}-journal"), Path(f"{self.path}-wal")
        locked = _Passing(f"tracking store {self.uri}: SQLite says 'database is locked': {LOCKED_ADVICE}")
        if not path.exists() or path.stat().st_size == 0:
            if journal.exists() or wal.exists():
                raise locked  # another process is writing its first transaction
            return
        if journal.exists() and writable(self.uri):
            self._roll_back_unfinished()
        with open(path, "rb") as file:
            header = file.read(100)
        if not header.startswith(b"SQLite format 3\x00"):
            raise self.refused(f"{path} is not an SQLite database (damaged?): {RESTORE}")
        expected = _sqlite_size(header)
        if expected and path.stat().st_size < expected and not wal.exists():
            truncated = TrackingError if not journal.exists() else _Passing  # mid-commit?
            raise truncated(
                f"tracking store {self.uri}: {path} is truncated ({path.stat().st_size} of its {expected} "
                f"bytes): {RESTORE}"
            )
        try:
            tables, found = self._schema()
        except sqlite3.DatabaseError as err:
            if "locked" in str(err):  # a writer at work, or one that stopped holding it: watched
                raise locked from None
            if "readonly" in str(err) and journal.exists():  # _roll_back_unfinished could not: read-only
                raise self.refused(
                    f"a process stopped in the middle of writing it, and SQLite must roll its unfinished "
                    f"transaction back (from {journal}) before anyone reads it: {READ_ONLY_ADVICE}"
                ) from None
            raise self.refused(f"SQLite cannot read {path} ({err}): {RESTORE}") from None
        if found is None or not {"experiments", "runs", "metrics"} <= tables:
            foreign = _Passing if found is None and _mlflow_tables(tables) else TrackingError
            raise foreign(
                f"tracking store {self.uri}: {path} is an SQLite database but not an MLflow store (tables: "
                f"{', '.join(sorted(tables)) or 'none'}): set tracking.uri to an MLflow store or a new file"
            )
        self._check_schema(found)

    def _roll_back_unfinished(self) -> None:
        """Let SQLite roll back the transaction of a process that stopped in the middle of writing the store
        (killed, or its node lost): its rollback journal is then "hot", and SQLite rolls it back on the first
        read of a connection that may write, as MLflow's own would. A read-only connection (_schema's) cannot,
        and fails with "attempt to write a readonly database". A journal that a live writer holds is not hot:
        this read leaves it be (or finds the store locked, which the look that follows watches)."""
        location = f"file:{urllib.parse.quote(str(self.path))}?mode=rw"
        try:
            with closing(sqlite3.connect(location, uri=True, timeout=1)) as db:
                db.execute("PRAGMA schema_version").fetchone()
        except sqlite3.DatabaseError:
            pass  # locked by a live writer, or damaged: the look that follows says which

    def _schema(self) -> tuple[set[str], str | None]:
        """The file's tables and its MLflow schema version (alembic's), read only."""
        location = f"file:{urllib.parse.quote(str(self.path))}?mode=ro"
        with closing(sqlite3.connect(location, uri=True, timeout=1)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "alembic_version" not in tables:
                return tables, None
            found = db.execute("SELECT version_num FROM alembic_version").fetchone()
            return tables, found[0] if found else None

    def _check_schema(self, version: str) -> None:
        """Another MLflow schema version: MLflow would refuse it (older) or fail in alembic (newer)."""
        from alembic.script import ScriptDirectory
        from mlflow.store.db.utils import _get_alembic_config  # MLflow's own migrations; private: guarded

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
        if known:  # a store being migrated passes through every older version: check_file watches it
            raise _Passing(
                f"tracking store {self.uri} has MLflow schema {version}, older than this MLflow's {head}: "
                f"back the file up, then run `mlflow db upgrade {self.uri}`"
            )
        raise TrackingError(
            f"tracking store {self.uri} has MLflow schema {version}, unknown to this MLflow (schema {head}): "
            "it was written by a newer MLflow; use that version (requirements.lock pins this one) or another "
            "store"
        )


@dataclass
class _Watch:
    """check_file's watch of a store in a passing state: while the store changes (its state, the size or time
    of its files) a process is at work on it and is waited for, up to `deadline`; once it has stood still
    for QUIET_S, it is judged as it stands."""

    uri: str
    deadline: float
    seen: tuple | None = None  # the last state and files seen
    still_since: float = 0.0
    told: bool = False  # whether the wait was logged

    def saw(self, state: _Passing, files: tuple) -> None:
        """Note one look; raise TrackingError once the store stood still for QUIET_S or the wait is over."""
        now, mark = time.monotonic(), (str(state), files)
        if mark != self.seen:
            if self.seen is not None and not self.told:
                log.warning(
                    "tracking store %s: another process is creating or migrating it; waiting for it (at most "
                    "%.0f s)",
                    self.uri,
                    MIGRATION_WAIT_S,
                )
                self.told = True
            self.seen, self.still_since = mark, now
        if now - self.still_since >= QUIET_S:
            raise TrackingError(str(state)) from None
        if now >= self.deadline:
            raise TrackingError(
                f"tracking store {self.uri}: another process has been creating or migrating it for "
                f"{MIGRATION_WAIT_S:.0f} s and it is not done: try again when it is"
            ) from None


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


def name_sqlite_errors() -> None:
    """Have every SQLite error of an SQLAlchemy engine (MLflow's, of any store this process opens) carry
    the TrackingError naming its store: registered once, on SQLAlchemy's Engine class, so that the stores
    MLflow creates later are covered from their first statement."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "handle_error", _name_the_store):
        event.listen(Engine, "handle_error", _name_the_store)


def _name_the_store(context) -> None:
    """SQLAlchemy's handle_error hook (an ExceptionContext): the store is the failing engine's URL."""
    cause, raised = context.original_exception, context.sqlalchemy_exception
    if raised is None or not isinstance(cause, sqlite3.DatabaseError) or context.engine is None:
        return
    exit_codes.attach(raised, explanation(str(context.engine.url), cause))


def explanation(uri: str, cause: sqlite3.DatabaseError) -> TrackingError:
    """A SQLite error met while using the store at `uri` (a file damaged after it was opened, a write
    refused) as one line naming the store."""
    reason = str(cause).splitlines()[0]
    if "readonly" in reason:
        advice = READ_ONLY_ADVICE
    elif "locked" in reason:
        advice = LOCKED_ADVICE
    elif isinstance(cause, sqlite3.IntegrityError):
        advice = CONFLICT_ADVICE
    else:
        advice = f"the file is damaged: {RESTORE}"
    return TrackingError(f"tracking store {uri}: SQLite says {reason!r}: {advice}")
