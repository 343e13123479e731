"""Whether a tracking store answers and lets this process in, asked once before MLflow's client opens it
(tracking.store.probe): MLflow would retry an unreachable server, or an engine it cannot create, for minutes.

`check` takes the address as config.address read it (its masked password already dropped: cli.credentials)
and names the store as `shown`, masked; it reads nothing of the address again.
"""

from __future__ import annotations

import base64
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

from config.address import Address
from tracking.errors import TrackingError

LOGIN_VARIABLES = "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"


def check(where: Address, shown: str, timeout: float) -> None:
    """Fail within `timeout` seconds, naming the store, if it cannot be reached or used (or its address has
    no form it could have)."""
    if where.problem:
        raise TrackingError(f"tracking store {shown}: the address {where.problem}")
    if where.database:
        _database(where, shown, timeout)
        return
    if where.sqlite_file is not None:
        folder = Path(where.sqlite_file).parent
        if not folder.is_dir():
            raise TrackingError(f"tracking store {where.uri}: folder {folder} does not exist")
        return
    if where.server is None:
        return
    try:
        with urllib.request.urlopen(where.server.rstrip("/") + "/health", timeout=timeout) as reply:
            reply.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(
            f"MLflow tracking server {shown} is unreachable ({reason}); start it "
            f"(mlflow server --host HOST --port PORT) or set tracking.uri"
        ) from None
    _access(where, shown, timeout)


def _database(where: Address, shown: str, timeout: float) -> None:
    """An SQL server's address: its host answers within `timeout` (a local socket answers or refuses at
    once), its driver is installed and it lets this user in; once each (MLflow would retry an engine it
    cannot create for minutes)."""
    import sqlalchemy

    if where.database_host:
        try:
            socket.create_connection(where.database_host, timeout=timeout).close()
        except OSError as err:
            raise TrackingError(
                f"database {shown} is unreachable ({err.strerror or err}): start it, or set tracking.uri"
            ) from None
    try:
        engine = sqlalchemy.create_engine(where.uri)
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


def _access(where: Address, shown: str, timeout: float) -> None:
    """/health needs no login; a server with auth (MLflow's basic auth, a proxy taking tokens) refuses the
    API itself, so ask it once with the credentials MLflow's client would send (_login)."""
    authorization, refused = _login(where.login)
    request = urllib.request.Request(
        where.server.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    )
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


def _login(given: tuple[str, str]) -> tuple[str | None, str]:
    """The Authorization header MLflow's client sends, and what a refusal of it says: MLFLOW_TRACKING_USERNAME
    and _PASSWORD when both are set, else the address's own login (`given`), else MLFLOW_TRACKING_TOKEN as a
    bearer token (mlflow.utils.rest_utils: basic auth before a token)."""
    env = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    login = next((pair for pair in (env, given) if all(pair)), None)
    if login:
        basic = "Basic " + base64.b64encode(":".join(login).encode()).decode()
        return basic, f"to the login given: set {LOGIN_VARIABLES}"
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return (
            f"Bearer {token}",
            f"to the token in MLFLOW_TRACKING_TOKEN: set the right one, or {LOGIN_VARIABLES}",
        )
    return None, f"without credentials: set {LOGIN_VARIABLES} (or MLFLOW_TRACKING_TOKEN)"
