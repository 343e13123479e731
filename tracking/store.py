"""The MLflow tracking store: the one module that opens it, finds experiments and searches runs.

Training (tracking.recorder), the sweep driver (sweeper.driver.session), reruns and the analysis write and
read runs through MlflowClient; what they share about the store is written here once:
  connect        open a store, a corridor: its masked password dropped once (cli.credentials), its address
                 read once (config.address), then fail fast, naming the URI, when the store cannot be reached
                 or used (tracking.reach: a PostgreSQL server too, which MLflow would retry for minutes);
                 else a client. A SQLite file passes tracking.sqlite_guard first (a store another process is
                 creating is waited for; the analysis and reruns create none)
  ensure_experiment  get or create an experiment, tagged as a model-training one (MLflow 3's UI then shows
                 runs) and given its runs view (tracking.view), each tag set again where another process
                 set it at that moment; find_experiment only finds one
  search         every page of a run search
  last_steps     per metric, the last step a run holds: a resumed run skips the points up to it
The metric points of many runs at once are tracking.metric_points' (fast paths beside the public API).

Opening a store turns MLflow's artifact progress bars off (unless MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR is
set): a report downloads one checkpoint per run and each download drew its own bar; our commands draw one
bar per long step themselves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from mlflow.entities import Run, ViewType
from mlflow.environment_variables import (
    MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR,
    MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT,
)
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import IntegrityError

from cli.credentials import mask, unmasked
from config import address
from tracking import moved, reach, view
from tracking.errors import TrackingError  # noqa: F401 - raised beneath; importable from here (docs/notebook.md)
from tracking.names import EXPERIMENT_KIND, MODEL_TRAINING
from tracking.sqlite_guard import SqliteGuard

PROBE_TIMEOUT_S = 5.0
T = TypeVar("T")
PAGE = 5000  # runs per search page (a SQL store allows up to 50,000)


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """Fail within `timeout` seconds, naming the URI, if the tracking store cannot be reached (or has no
    form it could have: config.address; tracking.reach); else the address its client opens: a masked
    password is the environment's, dropped here once (cli.credentials)."""
    uri, shown = unmasked(uri), mask(uri)
    reach.check(address.parse(uri), shown, timeout)
    return uri


def connect(uri: str, write: bool = True, create: bool = True) -> MlflowClient:
    """Open the store at `uri`: a client, once probe() found it reachable; MLflow's artifact bars off.

    A SQLite file is checked before MLflow opens it (tracking.sqlite_guard), so that a damaged or foreign file
    is reported in one line and never migrated or written to. `write=False` (the analysis) opens a read-only
    store as it is; `write=True` (train, sweep, rerun) refuses it before any work. A missing or empty file
    becomes a new store only for a command that writes and may create one (train, sweep); the others (the
    analysis, and rerun with create=False: its run cannot be in a new store) refuse it and write nothing.
    """
    uri = probe(uri)
    os.environ.setdefault(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, "false")  # read at every transfer
    # MLflow's own "View run ... at: URI" lines spell the address with its login, and not the runs view:
    # the commands print their addresses themselves (tracking.ui).
    os.environ.setdefault(MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name, "true")
    if uri.startswith(address.SQLITE):
        return SqliteGuard(uri).open(write, create)
    return MlflowClient(tracking_uri=uri)


def ensure_experiment(client: MlflowClient, name: str, swept: Sequence[str] = ()) -> str:
    """The id of experiment `name`, created when missing; either way tagged as a model-training experiment
    (MLflow 3's UI then shows its runs) and given its runs view (tracking.view; `swept`: a sweep's swept
    config keys, whose columns join the view's). Two processes doing it at once both succeed (_written)."""
    experiment_id = _written(lambda: _kind_tagged(client, name))
    _written(lambda: view.install(client, experiment_id, swept))
    return experiment_id


def _kind_tagged(client: MlflowClient, name: str) -> str:
    """The id of experiment `name`, created when missing, tagged as a model-training one unless it is."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(
                name,
                artifact_location=_artifact_root(client.tracking_uri, name),
                tags={EXPERIMENT_KIND: MODEL_TRAINING},
            )
        except MlflowException:
            found = client.get_experiment_by_name(name)  # created meanwhile by another process
            if found is None:
                raise  # not that: the store refused the write (locked, read-only, away)
    if found.tags.get(EXPERIMENT_KIND) != MODEL_TRAINING:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
    return found.experiment_id


def _written(write: Callable[[], T]) -> T:
    """`write()` (a step that reads the tag it sets), run once more when it lost a race: MLflow's SQL store
    looks for a tag's row, then inserts it, and two processes setting one new tag at once (two sweep drivers
    started together) both insert; the unique key refuses the second. Run again, it reads the winner's value
    and, when it still writes, updates the row that is there now."""
    try:
        return write()
    except MlflowException as error:
        if not isinstance(error.__cause__, IntegrityError):
            raise
    return write()


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
