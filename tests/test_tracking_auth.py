"""The tracking server of the recipes, with basic auth, against the sweep driver's requests.

A real `mlflow server --app-name basic-auth` with docker/mlflow/Dockerfile's settings: the driver of a real
sweep sends one log-batch request per model and report (a report's points and the location of the
checkpoint they lead up to together), and the server trusts a checked credential for a while (its
credential cache) instead of hashing the password on every request. What these cost at volume is a
benchmark's figure (docs/cluster.md, "The tracking server at volume"), not a test's.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support.repo import REPO, subprocess_env
from support.servers import MlflowServer
from support.sweeps import children, run_sweep

from tracking import store
from tracking.errors import TrackingError
from tracking.names import VAL_REL_LLOYD

pytestmark = pytest.mark.slow

ADMIN, PASSWORD = "admin", "a-long-admin-password-1"
LOG_BATCH = re.compile(r'"POST /api/2\.0/mlflow/runs/log-batch HTTP/1\.1" 200')


def recipe_auth_config() -> Path:
    """The basic-auth settings docker/mlflow/Dockerfile copies into its image and points the server at."""
    lines = (REPO / "docker" / "mlflow" / "Dockerfile").read_text().splitlines()
    (env,) = [l.split("=", 1)[1] for l in lines if l.startswith("ENV MLFLOW_AUTH_CONFIG_PATH=")]
    # the server reads the file the image holds: the one COPY to that path (the image copies the lock too)
    (source,) = [l.split()[1] for l in lines if l.startswith("COPY ") and l.split()[-1] == env]
    return REPO / source


def recipe_server(root: Path, empty_store: Path, login: str | None = None, env: dict[str, str] | None = None):
    """The recipe's `mlflow server --app-name basic-auth` over a copy of `empty_store` in `root` (its working
    directory: basic_auth.db), started; `login`: another authorization_function for its auth config."""
    root.mkdir()
    shutil.copyfile(empty_store, root / "mlflow.db")
    config = recipe_auth_config()
    if login:
        config = root / "auth.ini"
        basic = "mlflow.server.auth:authenticate_request_basic_auth"
        config.write_text(recipe_auth_config().read_text().replace(basic, login))
    env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN,
        "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret",
        **(env or {}),
    }
    server = MlflowServer(f"sqlite:///{root}/mlflow.db", root, ("--app-name", "basic-auth"), env)
    server.start()
    return server


@pytest.fixture
def auth_server(tmp_path: Path, _empty_store: Path):
    server = recipe_server(tmp_path / "server", _empty_store)
    yield server
    server.stop()


TOKEN = "a-site-token-1"


@pytest.fixture
def token_server(tmp_path: Path, _empty_store: Path):
    """The recipe's server with a bearer-token login instead of basic auth (support/token_auth.py, through
    the auth config's authorization_function): TOKEN acts as the admin."""
    support = {"LEANER_TEST_TOKEN": TOKEN, "PYTHONPATH": str(REPO / "tests" / "support")}
    server = recipe_server(tmp_path / "token-server", _empty_store, "token_auth:authenticate", support)
    yield server
    server.stop()


def status(uri: str, user: str, password: str) -> int:
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1")
    request.add_header("Authorization", "Basic " + b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_recipes_server_trusts_a_checked_credential_for_a_while(auth_server):
    """With the cache on, a credential the server checked stays valid when the stored hash changes behind its
    back (as it would for a password changed on another worker), until the cache's time is up; without the
    cache the next request is refused. A wrong password is refused either way."""
    assert status(auth_server.uri, ADMIN, PASSWORD) == 200
    with sqlite3.connect(auth_server.root / "basic_auth.db") as db:  # out of band: no worker hears of it
        db.execute("UPDATE users SET password_hash = 'no-password-matches' WHERE username = ?", (ADMIN,))
    assert status(auth_server.uri, ADMIN, PASSWORD) == 200, "checked once, trusted: the cache is on"
    assert status(auth_server.uri, ADMIN, "wrong-password-3") == 401


def test_the_driver_sends_one_request_per_model_and_report(auth_server, ray_cluster, tmp_path):
    """A smoke sweep (6 models, a report per evaluation and one at the end) through the driver: log-batch
    requests, counted in the server's access log, are one per model and report and the parent run's few (it
    was two per report and more: the points and the checkpoint's location apart, the params first)."""
    experiment = "auth-requests"
    env = {**subprocess_env(), "MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    before = len(LOG_BATCH.findall(auth_server.log.read_text()))
    done = run_sweep(
        [
            "sweep=smoke",
            ray_cluster,
            f"tracking.uri={auth_server.uri}",
            f"tracking.experiment={experiment}",
            f"cluster.storage={tmp_path}/ray",
            "cluster.report_every=1",
        ],
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    requests = len(LOG_BATCH.findall(auth_server.log.read_text())) - before
    client = MlflowClient(tracking_uri=auth_server.uri)
    with pytest.MonkeyPatch.context() as env_of_test:
        env_of_test.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
        env_of_test.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
        runs = children(auth_server.uri, "smoke", experiment)
        # A report per evaluation (report_every=1), and the last with the outcome.
        reports = sum(len(client.get_metric_history(r.info.run_id, VAL_REL_LLOYD)) + 1 for r in runs)
    assert len(runs) == 6 and reports >= 6 * 5
    parent = 2 + len(runs)  # the parent run's: its tags, then its counts at the start and as each model ends
    assert reports <= requests <= reports + parent, (requests, reports)


def test_the_store_probe_sends_mlflows_token_and_names_it_when_refused(token_server, monkeypatch):
    """MLFLOW_TRACKING_TOKEN, which MLflow's client sends as a bearer token when no username and password are
    set: the probe sends it too, so a wrong token is named before any work (not as the first write's 401),
    and the right one opens the store as MLflow's client does."""
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    with pytest.raises(
        TrackingError, match=r"refused access \(401\) without credentials: .*MLFLOW_TRACKING_TOKEN"
    ):
        store.probe(token_server.uri)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "not-the-token")
    with pytest.raises(TrackingError, match=r"refused access \(401\) to the token in MLFLOW_TRACKING_TOKEN"):
        store.probe(token_server.uri)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    store.probe(token_server.uri)
    assert MlflowClient(tracking_uri=token_server.uri).search_experiments()  # MLflow's own client agrees
