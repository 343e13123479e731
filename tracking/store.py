"""The MLflow tracking store: the one module that opens it, finds experiments and searches runs.

Training (tracking.recorder), the sweep driver (sweeper.driver.session), reruns and the analysis write and
read runs through MlflowClient; what they share about the store is written here once:
  connect        open a store: fail fast, naming the URI, when the store cannot be reached or used, or its
                 address has no form of config.address (a PostgreSQL server too: MLflow would retry it for
                 minutes); else a client. A SQLite file passes tracking.sqlite_guard first (a store another
                 process is creating is waited for; the analysis and reruns create none)
  ensure_experiment  get or create an experiment, tagged as a model-training one (MLflow 3's UI then shows
                 runs); find_experiment only finds one. Its runs view is tracking.view.install's step
  search         every page of a run search
  last_steps     per metric, the last step a run holds: a resumed run skips the points up to it
The metric points of many runs at once are tracking.metric_points' (fast paths beside the public API).

Opening a store turns MLflow's artifact progress bars off (unless MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR is
set): a report downloads one checkpoint per run and each download drew its own bar; our commands draw one
bar per long step themselves.
"""

from __future__ import annotations

import base64
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from mlflow.entities import Run, ViewType
from mlflow.environment_variables import (
    MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR,
    MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT,
)
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from cli.credentials import mask, unmasked
from config import address
from tracking import moved
from tracking.errors import TrackingError
from tracking.names import EXPERIMENT_KIND, MODEL_TRAINING
from tracking.sqlite_guard import SqliteGuard

PROBE_TIMEOUT_S = 5.0
LOGIN_VARIABLES = "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
PAGE = 5000  # runs per search page (a SQL store allows up to 50,000)


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fail within `timeout` seconds, naming the URI, if the tracking store cannot be reached (or has no
    form it could have: config.address). A masked password is the environment's (cli.credentials)."""
    uri, shown = unmasked(uri), mask(uri)
    why = address.problem(uri)
    if why:
        raise TrackingError(f"tracking store {shown}: the address {why}")
    if address.is_database(uri):
        _probe_database(uri, shown, timeout)
        return
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        if not folder.is_dir():
            raise TrackingError(f"tracking store {uri}: folder {folder} does not exist")
        return
    if not uri.startswith(("http://", "https://")):
        return
    uri, authorization, refused = _login(uri)
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as reply:
            reply.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(
            f"MLflow tracking server {shown} is unreachable ({reason}); start it "
            f"(mlflow server --host HOST --port PORT) or set tracking.uri"
        ) from None
    _probe_access(uri, shown, authorization, refused, timeout)


def _login(uri: str) -> tuple[str, str | None, str]:
    """A server's address without its USER:PASSWORD@ (urllib takes none), the Authorization header MLflow's
    client sends, and what a refusal of it says: MLFLOW_TRACKING_USERNAME and
    _PASSWORD when both are set, else the address's own login, else MLFLOW_TRACKING_TOKEN as a bearer token
    (mlflow.utils.rest_utils: basic auth before a token)."""
    parts = urllib.parse.urlsplit(uri)
    bare = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    env = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    given = urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")
    login = next((pair for pair in (env, given) if all(pair)), None)
    if login:
        basic = "Basic " + base64.b64encode(":".join(login).encode()).decode()
        return bare, basic, f"to the login given: set {LOGIN_VARIABLES}"
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return (
            bare,
            f"Bearer {token}",
            f"to the token in MLFLOW_TRACKING_TOKEN: set the right one, or {LOGIN_VARIABLES}",
        )
    return bare, None, f"without credentials: set {LOGIN_VARIABLES} (or MLFLOW_TRACKING_TOKEN)"


def _probe_database(uri: str, shown: str, timeout: float) -> None:
    """An SQL server's address: its host answers within `timeout` (a local socket answers or refuses at
    once), its driver is installed and it lets this user in; once each (MLflow would retry an engine it
    cannot create for minutes)."""
    import sqlalchemy

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


def _probe_access(uri: str, shown: str, authorization: str | None, refused: str, timeout: float) -> None:
    """/health needs no login; a server with auth (MLflow's basic auth, a proxy taking tokens) refuses the
    API itself, so ask it once with the credentials MLflow's client would send."""
    request = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    if authorization:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            reply.read()
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise TrackingError(
                f"MLflow tracking server {shown} refused access ({err.code}) {refused}"
            ) from None
    except (urllib.error.URLError, OSError):
        pass  # reachable a moment ago: let MLflow's own client report anything else


def connect(uri: str, write: bool = True, create: bool = True) -> MlflowClient:
    """Open the store at `uri`: a client, once probe() found it reachable; MLflow's artifact bars off.

    A SQLite file is checked before MLflow opens it (tracking.sqlite_guard), so that a damaged or foreign file
    is reported in one line and never migrated or written to. `write=False` (the analysis) opens a read-only
    store as it is; `write=True` (train, sweep, rerun) refuses it before any work. A missing or empty file
    becomes a new store only for a command that writes and may create one (train, sweep); the others (the
    analysis, and rerun with create=False: its run cannot be in a new store) refuse it and write nothing.
    """
    probe(uri)
    uri = unmasked(uri)
    os.environ.setdefault(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, "false")  # read at every transfer
    # MLflow's own "View run ... at: URI" lines spell the address with its login, and not the runs view:
    # the commands print their addresses themselves (tracking.ui).
    os.environ.setdefault(MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name, "true")
    if uri.startswith("sqlite:///"):
        return SqliteGuard(uri).open(write, create)
    return MlflowClient(tracking_uri=uri)


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """The id of experiment `name`, created when missing; either way tagged as a model-training experiment
    (MLflow 3's UI then shows its runs). Its runs view is another step: tracking.view.install."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(
                name,
                artifact_location=_artifact_root(client.tracking_uri, name),
                tags={EXPERIMENT_KIND: MODEL_TRAINING},
            )
        except MlflowException:  # created meanwhile by another process
            found = client.get_experiment_by_name(name)
    if found.tags.get(EXPERIMENT_KIND) != MODEL_TRAINING:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
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
