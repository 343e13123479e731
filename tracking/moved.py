"""A SQLite store that was moved or copied to another folder: its artifact locations pointed there again.

MLflow records each experiment's artifact location and each run's artifact URI as absolute file URIs. A store
of this project keeps its artifacts beside its file (FOLDER/mlartifacts/EXPERIMENT, tracking.store), so an
experiment whose location names another FOLDER in that layout, and whose artifacts are here or gone from
there, belongs to a store that was moved or copied with its folder: opening it rewrites those locations to
the store's own folder, once, and says so in one line. (A store file copied alone, beside no artifacts of its
own, keeps reading the original's, as MLflow does.)
Locations in any other layout (set by hand, a server's) are left as they are. A store this process may not
write keeps its locations; it says where its artifacts are still read from.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlsplit

ARTIFACTS = "mlartifacts"  # the folder beside the store's file that holds its artifacts


def artifact_root(db: Path, experiment: str) -> str:
    """Where a store's experiment keeps its artifacts: beside the file, in its folder (a file URI)."""
    return (db.resolve().parent / ARTIFACTS / experiment).as_uri()


def mend(db: Path, writable: bool) -> None:
    """Point the artifact locations of a moved or copied store (file `db`) at its own folder."""
    here = db.resolve().parent
    try:
        _mend(db, here, writable)
    except sqlite3.DatabaseError:  # damage MLflow's own reads report, in one line: nothing written here
        pass


def _mend(db: Path, here: Path, writable: bool) -> None:
    with sqlite3.connect(db, timeout=30) as con:  # one transaction: committed whole, or rolled back
        rows = con.execute("SELECT name, artifact_location FROM experiments").fetchall()
        olds = {old for name, location in rows if _moved_here(old := _folder_of(location, name), here, name)}
        for old in sorted(olds):
            if not writable:
                print(
                    f"tracking store {db} was moved from {old} and is read-only: its artifacts are read there"
                )
                continue
            _relocate(con, (old / ARTIFACTS).as_uri() + "/", (here / ARTIFACTS).as_uri() + "/")
            print(f"tracking store {db} was moved from {old}: its artifact locations now point to {here}")


def _folder_of(location: str | None, experiment: str) -> Path | None:
    """The folder of the store that made `location`, when it is of the layout artifact_root makes."""
    parts = urlsplit(location or "")
    path = Path(unquote(parts.path))
    if parts.scheme != "file" or path.name != experiment or path.parent.name != ARTIFACTS:
        return None
    return path.parent.parent


def _moved_here(old: Path | None, here: Path, experiment: str) -> bool:
    """Whether the artifacts of a store made in `old` came with it `here`: they are here, or gone from there.
    (A store file copied alone keeps reading the original's artifacts, as MLflow does.)"""
    if old is None or old == here:
        return False
    return (here / ARTIFACTS / experiment).is_dir() or not (old / ARTIFACTS / experiment).is_dir()


def _relocate(con: sqlite3.Connection, old: str, new: str) -> None:
    """Every location under `old` (a URI prefix), experiments' and runs', moved under `new`."""
    for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
        con.execute(
            f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE substr({column}, 1, ?) = ?",
            (new, len(old) + 1, len(old), old),
        )
