"""A SQLite store as SQL text and back: what a lean archive holds instead of the database file
(sweeper.archive --lean, sweeper.unpack).

The text holds the data without the indexes' copies of it and without free pages: an MLflow store of a
run in allocations packs to about a third of its file's size under xz, and a later allocation's text
differs from the last one's mostly by the rows it added, which is about all that git's deltas keep. Python's
Connection.iterdump would write the same statements, but through SQLite's quote(), which writes an
infinite value as a bare `Inf` (SQLite 3.40) that no SQLite reads back; here every value is written as
Python's repr of it, which reads back bit for bit.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

SUFFIX = ".sql"  # a store mlflow.db is archived as mlflow.sql beside where it was


def literal(value: object) -> str:
    """An SQL literal that reads back as exactly `value` (a column of SQLite's five storage classes)."""
    if value is None:
        return "NULL"
    if isinstance(value, float):
        if value != value:  # SQLite stores no NaN (it reads back as NULL); kept for completeness
            return "NULL"
        if value in (float("inf"), float("-inf")):
            return "9e999" if value > 0 else "-9e999"  # overflows to +-infinity when read
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    return "'" + str(value).replace("'", "''") + "'"


def dump(db: Path) -> Iterator[str]:
    """The statements that rebuild `db`: its tables with their rows (in the table's own order, rowid for
    MLflow's, so a later dump of a store that only grew adds to each table's part), then its indexes,
    triggers and views."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        schema = con.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")
        objects = schema.fetchall()
        yield "BEGIN TRANSACTION;"
        for kind, name, sql in objects:
            if kind != "table" or name.startswith("sqlite_"):
                continue
            yield f"{sql};"
            quoted = name.replace('"', '""')
            for row in con.execute(f'SELECT * FROM "{quoted}"'):
                yield f'INSERT INTO "{quoted}" VALUES({",".join(map(literal, row))});'
        if any(name == "sqlite_sequence" for _, name, _ in objects):  # AUTOINCREMENT's counters
            yield "DELETE FROM sqlite_sequence;"
            for name, seq in con.execute("SELECT name, seq FROM sqlite_sequence"):
                yield f"INSERT INTO sqlite_sequence VALUES({literal(name)},{seq});"
        for kind, _, sql in objects:
            if kind in ("index", "trigger", "view"):
                yield f"{sql};"
        yield "COMMIT;"


def write(db: Path, out: Path) -> None:
    """Write `db` as SQL text to `out`, a statement a line (a value's own line breaks kept)."""
    with out.open("w", encoding="utf-8") as f:
        for statement in dump(db):
            f.write(statement + "\n")


def restore(text: Path, db: Path) -> None:
    """Build the store `db` (which must not exist) from the SQL text `text`."""
    if db.exists():
        raise FileExistsError(f"{db} exists: unpack into a folder without it")
    with closing(sqlite3.connect(db)) as con:
        con.executescript(text.read_text(encoding="utf-8"))
