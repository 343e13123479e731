"""The forms of tracking.uri this project opens, and one line for an address that is none of them.

MLflow reads a bare path (`mlflow.db`, `./mlruns`) and `file:` as its file store, which its current versions
refuse in a 40-line traceback, and SQLAlchemy meets `sqlite://mlflow.db` (two slashes) or a misspelt scheme
with one of its own. The configuration (config.validate) and the store (tracking.store.probe, for an address
given in Python, as the notebook API takes one) check the form here first. No MLflow import: every command's
configuration is checked before anything heavy loads.

`parse` reads an address once into an `Address`: its form's problem and what the store's probe
(tracking.reach) and client need of it, so that nothing after it splits the address again.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

SQLITE = "sqlite:///"
ENV = "MLFLOW_TRACKING_URI"  # MLflow's own variable, the default of tracking.uri (conf/tracking)
FORMS = (
    "sqlite:///FILE (an SQLite file), http://HOST:PORT (an MLflow server) or "
    "postgresql://USER:PASSWORD@HOST:PORT/DB"
)
# The SQL servers MLflow stores runs in, by URI scheme (a driver may follow: postgresql+psycopg), and the
# port each listens on unless the address names one.
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
SERVERS = ("http", "https")


@dataclass(frozen=True)
class Address:
    """A store's address read once (parse): `uri` as the store's client opens it, and its facts."""

    uri: str
    problem: str | None  # what is wrong with its form (problem); None when it has one of FORMS
    sqlite_file: str | None  # an SQLite store's file, as the address spells it
    database: bool  # an SQL server's database (is_database)
    database_host: tuple[str, int] | None  # (host, port) to reach it at; None: a local socket, or no server
    server: str | None  # an MLflow server's address without its USER:PASSWORD@ (urllib takes none)
    login: tuple[str, str]  # the USER and PASSWORD the address itself gives, unquoted ("" where none)


def parse(uri: str) -> Address:
    """The facts of `uri` (already unmasked: cli.credentials), each read here once."""
    parts = urllib.parse.urlsplit(uri)
    server = uri.startswith(tuple(f"{s}://" for s in SERVERS))
    return Address(
        uri=uri,
        problem=problem(uri),
        sqlite_file=uri.removeprefix(SQLITE) if uri.startswith(SQLITE) else None,
        database=is_database(uri),
        database_host=_database_host(parts),
        server=parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if server else None,
        login=(urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")),
    )


def problem(uri: str) -> str | None:
    """What is wrong with the form of `uri`, as a clause that ends with the forms expected; None when it
    has one of them (whether anything answers there is tracking.store.probe's question)."""
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme == "sqlite":
        return _sqlite(uri)
    if scheme in SERVERS:
        return None if urllib.parse.urlsplit(uri).hostname else f"names no host: write {FORMS}"
    if is_database(uri):
        return None if uri.startswith(f"{scheme}://") else f"takes // after {scheme}: write {FORMS}"
    if scheme == "file" or not scheme or len(scheme) == 1:  # one letter: a Windows drive (C:\...)
        return (
            f"is a path, which MLflow takes for its file store (not supported here): for an SQLite file "
            f"write {_sqlite_of(uri.removeprefix('file:').removeprefix('//'))}; else {FORMS}"
        )
    return f"has the unknown scheme {scheme!r}: write {FORMS}"


def is_database(uri: str) -> bool:
    """Whether `uri` names an SQL server's database (postgresql://..., through a host or a local socket)."""
    return urllib.parse.urlsplit(uri).scheme.split("+")[0] in DATABASE_PORTS


def _sqlite(uri: str) -> str | None:
    """An SQLite address names its file after three slashes (four for an absolute path)."""
    path = uri.removeprefix("sqlite:").lstrip("/")
    if path in ("", ":memory:"):
        return f"names no file (an in-memory store keeps nothing): write {SQLITE}FILE"
    if not uri.startswith(SQLITE):
        return f"takes three slashes before the file: write {SQLITE}{path} (four before an absolute path)"
    return None


def _sqlite_of(path: str) -> str:
    """The SQLite address of a path that names a database file; else the usual one's."""
    return SQLITE + (path if path.endswith((".db", ".sqlite", ".sqlite3")) else "mlflow.db")


def _database_host(parts: urllib.parse.SplitResult) -> tuple[str, int] | None:
    """(host, port) of an SQL server's address (postgresql://...), None for any other store or one that
    names no host (a local socket)."""
    port = DATABASE_PORTS.get(parts.scheme.split("+")[0])
    if port is None or not parts.hostname:
        return None
    return parts.hostname, parts.port or port
