"""A sweep's home: the folder of its SQLite store, which holds everything else of the sweep by default.

    A/mlflow.db              the store (tracking.uri=sqlite:///A/mlflow.db)
    A/mlartifacts/           its runs' artifacts (tracking.store)
    A/ray/                   Ray Tune's storage: the trials' work folders and checkpoints (cluster.storage)

Nothing in the store records where the folder is: a checkpoint under the home is recorded relative to it
(the run's tune_checkpoint tag), and the artifact locations are mended when a moved store is opened
(tracking.moved). So the folder can be moved, copied or archived (sweeper.archive) to another path or
machine, and the same command, pointed at the store there, goes on. A tracking server's sweep has no home:
its storage is cluster.storage (shared by the cluster's nodes), or Ray's default, recorded as it is.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

RAY_FOLDER = "ray"  # the home's subfolder for Ray Tune's storage


def home(uri: str) -> Path | None:
    """The folder of a SQLite store (absolute); None for a tracking server."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///")).resolve().parent


def storage(cluster: DictConfig, uri: str) -> str | None:
    """Where Ray Tune writes the trials' work folders and checkpoints: cluster.storage when set, else the
    home's ray/ folder (None for a tracking server: Ray's default, ~/ray_results)."""
    if cluster.storage is not None:
        if "://" in cluster.storage:
            return cluster.storage
        return str(Path(cluster.storage).expanduser().resolve())
    folder = home(uri)
    return None if folder is None else str(folder / RAY_FOLDER)


def recorded(location: str, uri: str) -> str:
    """How a checkpoint's location is recorded in its run: relative to the home when it lies there."""
    folder = home(uri)
    if folder is None or "://" in location:
        return location
    try:
        return Path(location).relative_to(folder).as_posix()
    except ValueError:  # elsewhere (cluster.storage): kept as it is
        return location


def resolved(location: str, uri: str) -> str:
    """A recorded checkpoint location as a path or URI here: a relative one lies in this store's home."""
    folder = home(uri)
    if folder is None or "://" in location or Path(location).is_absolute():
        return location
    return str(folder / location)
