"""Unpack an archive of a sweep's folder (sweeper.archive): `python -m sweeper.unpack ARCHIVE [DEST]`.

    python -m sweeper.unpack docs/results/plus/run.tar.xz .     # unpacks as ./plus/, its store built
    python -m sweeper.sweep ... tracking.uri=sqlite:///$PWD/plus/mlflow.db   # goes on

Any archive sweeper.archive writes (gzip, xz or none): its files land under DEST/FOLDER/ as they were,
and a lean archive's stores, held as SQL text (FOLDER/mlflow.sql, sweeper.sqltext), are built into
SQLite files again (FOLDER/mlflow.db), the text removed. A store already at DEST is never overwritten:
the command refuses before it unpacks anything.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path, PurePosixPath

from cli.entry import command
from config.help import composed_config
from sweeper import sqltext
from tracking.store import TrackingError


def unpack(archive: Path, dest: Path) -> list[Path]:
    """Unpack `archive` into `dest` and build its SQL-text stores; the stores it holds (their paths)."""
    with tarfile.open(archive) as tar:
        names = [PurePosixPath(n) for n in tar.getnames()]
        texts = [n for n in names if len(n.parts) == 2 and n.suffix == sqltext.SUFFIX]
        files = [n for n in names if len(n.parts) == 2 and n.suffix == ".db"]
        stores = [dest / n.with_suffix(".db") for n in texts] + [dest / n for n in files]
        clash = [str(s) for s in stores if s.exists()]
        if clash:
            raise TrackingError(f"{', '.join(clash)}: a store is there already; unpack {archive} elsewhere")
        tar.extractall(dest, filter="data")
    for name in texts:
        sqltext.restore(dest / name, dest / name.with_suffix(".db"))
        (dest / name).unlink()
    return stores


@command("leaner-unpack", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sweeper.unpack",
        description="Unpack an archive of a sweep's folder (python -m sweeper.archive), its store built.",
    )
    parser.add_argument("archive", type=Path, help="the archive (.tar.gz, .tar.xz or .tar)")
    parser.add_argument("dest", type=Path, nargs="?", default=Path("."), help="where to unpack (default: .)")
    args = parser.parse_args(argv)
    if not args.archive.is_file():
        raise TrackingError(f"{args.archive} is not a file: give an archive python -m sweeper.archive wrote")
    if not tarfile.is_tarfile(args.archive):
        raise TrackingError(f"{args.archive} is not a tar archive: give one python -m sweeper.archive wrote")
    args.dest.mkdir(parents=True, exist_ok=True)
    for store in unpack(args.archive, args.dest):
        print(f"unpacked {store.parent}: point tracking.uri at sqlite:///{store.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
