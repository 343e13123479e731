"""Archive a sweep's home folder (sweeper.driver.home) with what resuming it and reporting on it need, and no
more: `python -m sweeper.archive FOLDER [--out FILE.tar.gz] [--lean]`.

    python -m sweeper.sweep sweep=lite32 tracking.uri=sqlite:///d32/mlflow.db cluster.time_budget_s=6600
    python -m sweeper.archive d32 --out d32.tar.gz          # the store, its artifacts, the live checkpoints
    python -m sweeper.unpack d32.tar.gz elsewhere/          # on another machine, in a fresh clone, ...
    python -m sweeper.sweep sweep=lite32 tracking.uri=sqlite:///elsewhere/d32/mlflow.db ...   # goes on

Kept: every SQLite store in the folder (copied with SQLite's backup, so a store another process has open is
archived whole), its artifacts (mlartifacts/: the finished runs' checkpoints, curves, reports) and any other
file of the user's; of Ray's storage (ray/) only the checkpoints that unfinished runs record (their
tune_checkpoint tag), from which the next driver resumes them. Left out: the rest of ray/ (earlier
checkpoints, work folders that are copies, Tune's own state, which a resumed sweep does not read) and lock
files. The archive holds the folder under its own name, gzip-compressed, xz where --out ends in .tar.xz
(a store's indexes shrink about twice as far) or uncompressed where it ends in .tar (for git, whose deltas
then keep what a later archive adds); `python -m sweeper.unpack` unpacks any of them.

--lean, for a run in allocations whose archives are committed (every clone downloads each forever): the
checkpoints and pictures of the runs that ended (their `outcome` tag) are left out, as whatever else can be
recomputed: `leaner-rerun` retrains such a run bit for bit, its curves come from the store, and its
evaluations, once the claims have run (docs/science.md section 7.3), are in the store as evaluation runs.
Its stores are SQL text (sweeper.sqltext: mlflow.db as mlflow.sql), about a third of the file's size under
xz; `python -m sweeper.unpack` builds the store from it again.
"""

from __future__ import annotations

import argparse
import io
import sqlite3
import sys
import tarfile
import tempfile
from contextlib import closing
from pathlib import Path

from cli.credentials import mask
from cli.entry import command
from config.help import composed_config
from sweeper import sqltext
from sweeper.driver.home import RAY_FOLDER
from tracking.masking import TEXT_ARTIFACTS
from tracking.names import ENDED, OUTCOME, RETIRED_OUTCOMES, TUNE_CHECKPOINT
from tracking.store import TrackingError

SQLITE_HEADER = b"SQLite format 3\x00"
SKIPPED_SUFFIXES = (".lock", "-journal", "-wal", "-shm")
LEAN_SUFFIXES = (".pt", ".png")  # what --lean leaves out of an ended run's artifacts


def stores(folder: Path) -> list[Path]:
    """The SQLite files at the top of the folder."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.open("rb").read(16) == SQLITE_HEADER)


def live_checkpoints(folder: Path, dbs: list[Path]) -> set[Path]:
    """The checkpoint folders the stores' unfinished runs record, those in this folder (relative tags)."""
    found = set()
    for db in dbs:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
            rows = con.execute("SELECT value FROM tags WHERE key = ?", (TUNE_CHECKPOINT,)).fetchall()
        found |= {folder / value for (value,) in rows if not Path(value).is_absolute() and "://" not in value}
    return {path for path in found if path.is_dir()}


def ended_runs(dbs: list[Path]) -> set[str]:
    """The ids of the stores' runs that ended for good (an outcome of tracking.names.ENDED)."""
    found: set[str] = set()
    names = (*ENDED, *RETIRED_OUTCOMES)  # an older store's names too
    marks = ",".join("?" * len(names))
    for db in dbs:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as con:
            query = f"SELECT run_uuid FROM tags WHERE key = ? AND value IN ({marks})"
            found |= {run for (run,) in con.execute(query, (OUTCOME, *names))}
    return found


def recomputable(path: Path, ended: set[str]) -> bool:
    """A checkpoint or picture among the artifacts of a run that ended (mlartifacts/EXPERIMENT/RUN_ID/...)."""
    return path.suffix in LEAN_SUFFIXES and not ended.isdisjoint(path.parts)


def members(folder: Path, dbs: list[Path], lean: bool = False) -> list[Path]:
    """The files and folders to archive (folders whole), in a stable order; stores not among them; `lean`:
    not the checkpoints and pictures of runs that ended."""
    ray, kept = folder / RAY_FOLDER, live_checkpoints(folder, dbs)
    ended = ended_runs(dbs) if lean else set()
    chosen = sorted(kept)
    for path in sorted(folder.rglob("*")):
        inside_ray = path == ray or ray in path.parents
        if path in dbs or not path.is_file() or path.name.endswith(SKIPPED_SUFFIXES) or inside_ray:
            continue
        if not recomputable(path.relative_to(folder), ended):
            chosen.append(path)
    return chosen


def mode_of(out: Path) -> str:
    """tarfile's mode for the archive's name: xz (.tar.xz), none (.tar), else gzip."""
    return "w:xz" if out.name.endswith(".tar.xz") else "w" if out.name.endswith(".tar") else "w:gz"


def archive(folder: Path, out: Path, lean: bool = False) -> tuple[int, int, int]:
    """Write the archive (compressed as its name says: mode_of); (its size, the folder's size) in bytes,
    and how many recorded credentials it masked (an older store's: docs/security.md)."""
    folder = folder.resolve()
    dbs = stores(folder)
    if not dbs:
        raise TrackingError(f"{folder} holds no SQLite tracking store (mlflow.db): not a sweep's folder")
    masked = 0
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(out, mode_of(out)) as tar:
        for db in dbs:  # a consistent copy, even while another process writes
            copy = Path(tmp) / db.name
            with sqlite3.connect(db, timeout=30) as src, sqlite3.connect(copy) as dst:
                src.backup(dst)
            masked += mask_tags(copy)
            if lean:  # as SQL text (sweeper.sqltext)
                text = copy.with_suffix(sqltext.SUFFIX)
                sqltext.write(copy, text)
                tar.add(text, arcname=f"{folder.name}/{text.name}")
            else:
                tar.add(copy, arcname=f"{folder.name}/{db.name}")
        for path in members(folder, dbs, lean):
            masked += add_masked(tar, path, f"{folder.name}/{path.relative_to(folder).as_posix()}")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return out.stat().st_size, size, masked


def mask_tags(db: Path) -> int:
    """Mask the credentials the tags of a store's copy hold (its runs' and experiments'); how many."""
    with closing(sqlite3.connect(db)) as con, con:
        con.create_function("masked", 1, mask, deterministic=True)
        changed = [
            con.execute(f"UPDATE {table} SET value = masked(value) WHERE value <> masked(value)").rowcount
            for table in ("tags", "experiment_tags")
        ]
    return sum(changed)


def add_masked(tar: tarfile.TarFile, path: Path, name: str) -> int:
    """Add `path` (a folder whole) as `name`; a text file with a credential in it masked. How many were."""
    if path.is_dir() or not path.name.endswith(TEXT_ARTIFACTS):
        tar.add(path, arcname=name)
        return 0
    text = path.read_text(errors="replace")
    if mask(text) == text:
        tar.add(path, arcname=name)
        return 0
    data = mask(text).encode()
    info = tar.gettarinfo(path, arcname=name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return 1


@command("leaner-archive", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sweeper.archive",
        description="Archive a sweep's folder (its SQLite store's) with what resuming and reporting need.",
    )
    parser.add_argument(
        "folder", type=Path, help="the folder of the sweep's store (tracking.uri=sqlite:///FOLDER/mlflow.db)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="the archive to write (default: FOLDER.tar.gz beside FOLDER; .tar.xz: xz-compressed; .tar: not)",
    )
    parser.add_argument(
        "--lean",
        action="store_true",
        help="leave out the checkpoints and pictures of runs that ended (leaner-rerun recomputes them) and "
        "write the stores as SQL text (for archives committed to git)",
    )
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        raise TrackingError(f"{args.folder} is not a folder: give the folder of the sweep's SQLite store")
    out = args.out or args.folder.resolve().with_suffix(".tar.gz")
    packed, size, masked = archive(args.folder, out, args.lean)
    print(f"archived {args.folder} into {out}: {packed / 1e6:.1f} MB (the folder holds {size / 1e6:.1f} MB)")
    if masked:  # an older store's (docs/security.md): leaner-mask-store masks them in the folder too
        print(f"masked {masked} recorded credentials in the archive; the folder still holds them")
    name = args.folder.resolve().name
    print(f"unpack it with: python -m sweeper.unpack {out} DEST, then point tracking.uri at DEST/{name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
