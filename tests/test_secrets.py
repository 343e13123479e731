"""A password given to the platform is written nowhere (docs/security.md), and a run still re-runs from its
record with the password from the environment.

The slow tests sweep on a real PostgreSQL (the session's pgserver) as a role that must log in with its
password (scram-sha-256 for this role alone; the server trusts the others), the password in tracking.uri on
the command line, as docs/configuration.md's form has it; then report on it. The password is then looked for
in every table of the store, every file under the sweep's folder (artifacts, Ray's storage, the report) and
the session Ray cluster's folder (its logs, its sessions), and in all that was printed.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
from mlflow.tracking import MlflowClient
from support.repo import subprocess_env
from support.sweeps import children
from test_tracking_auth import ADMIN
from test_tracking_auth import PASSWORD as ADMIN_PASSWORD
from test_tracking_auth import auth_server as auth_server  # the recipes' server with basic auth: a fixture

from cli import exit_codes
from cli.credentials import MASK, mask, masked, missing_password, unmasked
from config.compose import compose, trial_words
from config.help import composed_config
from config.identity import operational_values
from sweeper import archive, mask_store, rerun, train
from tracking.names import COMMAND, CONFIG_ARTIFACT, MLFLOW_RUN_NOTE
from tracking.parent_run import find_parent
from tracking.store import ensure_experiment, find_experiment

PASSWORD = f"pw-{secrets.token_hex(8)}"  # in nothing this test did not give it to
ROLE, DATABASE, EXPERIMENT = "secretive", "secretive", "secrets"


def test_mask_hides_a_uris_password_a_querys_secret_and_the_environments_credentials(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "env-secret-42")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/shared/secrets/ray-token")  # where a token is: no secret
    line = (
        "tracking.uri=postgresql+psycopg://ann:s3c:r/t@db:5432/mlflow cluster.storage=s3://b/p?region=x&"
        "secret_key=abc123 note=env-secret-42 /shared/secrets/ray-token http://mlflow:5000/a@b"
    )
    assert mask(line) == (
        f"tracking.uri=postgresql+psycopg://ann:{MASK}@db:5432/mlflow cluster.storage=s3://b/p?region=x&"
        f"secret_key={MASK} note={MASK} /shared/secrets/ray-token http://mlflow:5000/a@b"
    )
    assert unmasked(f"postgresql://ann:{MASK}@db/mlflow") == "postgresql://ann@db/mlflow"
    assert unmasked("postgresql://ann:pw@db/mlflow") == "postgresql://ann:pw@db/mlflow"


def test_masking_reads_an_environment_another_thread_changes(monkeypatch):
    """MLflow's telemetry thread sets and removes a variable while the driver masks what it records (a sweep
    once ended with exit 1 on a KeyError): for two seconds a thread sets and removes one while mask runs, and
    the environment's credential is still masked (the old `os.environ.items()` failed within 500 calls)."""
    monkeypatch.setenv("LEANER_TEST_DB_PASSWORD", "s3cret-value")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            os.environ["LEANER_TEST_CHURN"] = "1"
            os.environ.pop("LEANER_TEST_CHURN", None)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert mask("note=s3cret-value") == f"note={MASK}"
    finally:
        stop.set()
        thread.join()


def test_the_configuration_trials_tags_and_cfg_job_hold_the_password_masked():
    word = f"tracking.uri=postgresql://ann:{PASSWORD}@db/mlflow"
    cfg = compose([word])
    assert PASSWORD in cfg.tracking.uri  # the command itself opens the store with it
    shown = [
        composed_config([word]),
        str(masked(cfg)),
        *operational_values(cfg).values(),
        *trial_words([word]),
    ]
    assert not [text for text in shown if PASSWORD in text]
    assert operational_values(cfg)["tracking.uri"] == f"postgresql://ann:{MASK}@db/mlflow"


def test_a_uri_without_its_password_says_where_it_would_come_from(monkeypatch, tmp_path):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.delenv("PGPASSFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pgpass
    line = missing_password(f"postgresql://ann:{MASK}@db/mlflow")
    assert line and "PGPASSWORD" in line and "~/.pgpass" in line
    monkeypatch.setenv("PGPASSWORD", "given")
    assert missing_password(f"postgresql://ann:{MASK}@db/mlflow") is None
    assert missing_password("sqlite:///mlflow.db") is None


def test_the_archive_of_an_older_store_holds_its_credentials_masked(
    sqlite_uri, tmp_path, tmp_path_factory, capsys
):
    """A store whose run recorded a password before the masking (a tag and a config.yaml, written here as the
    older code wrote them): its archive holds both masked and says how many; the folder is left as it was."""
    client = MlflowClient(tracking_uri=sqlite_uri)
    run = client.create_run(ensure_experiment(client, "older")).info.run_id  # artifacts beside the store
    secret = f"postgresql://ann:{PASSWORD}@db/mlflow"
    client.set_tag(run, COMMAND, f"python -m sweeper.sweep tracking.uri={secret}")
    written = tmp_path_factory.mktemp("written") / CONFIG_ARTIFACT
    written.write_text(f"tracking:\n  uri: {secret}\n")
    client.log_artifact(run, str(written))
    out = tmp_path_factory.mktemp("archive") / "older.tar.gz"
    assert archive.main([str(tmp_path), "--out", str(out)]) == 0
    assert "masked 2 recorded credentials in the archive" in capsys.readouterr().out
    with tarfile.open(out) as tar:
        tar.extractall(out.parent, filter="data")
    unpacked = out.parent / tmp_path.name
    assert _files_holding(unpacked, PASSWORD) == [] and _files_holding(unpacked, "ann:***@")
    assert sorted(p.name for p in _files_holding(tmp_path, PASSWORD)) == [CONFIG_ARTIFACT, "mlflow.db"]


# ---- a sweep, its report and a rerun on a PostgreSQL role that logs in with its password ----


@pytest.fixture(scope="module")
def secret_store(postgres: str) -> str:
    """postgresql://ROLE:PASSWORD@.../DATABASE: a role and database of the session's server whose login
    checks the password (an hba line for this role, first; the server's other users stay trusted)."""
    with psycopg.connect(postgres, autocommit=True) as db:
        hba = Path(db.execute("SHOW hba_file").fetchone()[0])
        db.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
        db.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        hba.write_text(
            f"local {DATABASE} {ROLE} scram-sha-256\nhost {DATABASE} {ROLE} all scram-sha-256\n"
            + hba.read_text()
        )
        db.execute("SELECT pg_reload_conf()")
    base, query = postgres.split("?", 1) if "?" in postgres else (postgres, "")
    uri = base.replace("postgres:@", f"{ROLE}:{PASSWORD}@").rsplit("/", 1)[0] + f"/{DATABASE}"
    return f"{uri}?{query}" if query else uri


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`python -m ARGS` in `cwd` (a store's artifacts go to its ./mlruns), no PGPASSWORD but `env`'s."""
    environment = {k: v for k, v in subprocess_env().items() if k != "PGPASSWORD"} | env
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def swept(secret_store: str, ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """sweep=smoke on the store, the password on the command line, then its report: the sweep's folder and
    all they printed."""
    folder = tmp_path_factory.mktemp("secret-sweep")
    uri = f"tracking.uri='{secret_store}'"  # quoted: its query's '=' (the socket's folder)
    sweep = _run(
        [
            "sweeper.sweep",
            "sweep=smoke",
            uri,
            f"tracking.experiment={EXPERIMENT}",
            ray_cluster,
            f"cluster.storage={folder}/ray",
            "cluster.max_concurrent=2",
        ],
        folder,
    )
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    report = _run(
        [
            "analysis.report",
            uri,
            f"tracking.experiment={EXPERIMENT}",
            "select.sweep=smoke",
            "out=reports",
            "figures=[convergence]",
            "speed_json=none.json",
            "eval.device=cpu",
        ],
        folder,
    )
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    return {"folder": folder, "printed": [sweep.stdout, sweep.stderr, report.stdout, report.stderr]}


def _tables_holding(uri: str, text: str) -> list[str]:
    """The tables of the store's database with a row that holds `text` anywhere."""
    with psycopg.connect(uri) as db:
        tables = [t for (t,) in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return [
            t
            for t in tables
            if db.execute(f'SELECT 1 FROM "{t}" x WHERE x::text LIKE %s', (f"%{text}%",)).fetchone()
        ]


def _files_holding(root: Path, text: str) -> list[Path]:
    return [
        p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and text.encode() in p.read_bytes()
    ]


def _ray_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session Ray cluster's folder (support.ray_nodes: its record in the session's shared folder)."""
    base = tmp_path_factory.getbasetemp()
    record = next(p for p in (base, base.parent) if (p / "ray-head.json").exists()) / "ray-head.json"
    return Path(json.loads(record.read_text())["root"])


@pytest.mark.slow
def test_a_sweep_and_its_report_write_the_password_nowhere(swept, secret_store, tmp_path_factory):
    folder = swept["folder"]
    assert len(children(secret_store, "smoke", EXPERIMENT)) == 6  # the store opened with the password
    assert list(folder.glob("mlruns/*/*/artifacts/config.yaml")), "the runs' config.yaml: checked below"
    assert (folder / "reports" / EXPERIMENT / "index.md").is_file()
    assert not [text for text in swept["printed"] if PASSWORD in text]
    assert _tables_holding(secret_store, PASSWORD) == []
    assert _tables_holding(
        secret_store, "secretive:***@"
    )  # what the records hold instead (the oracle's check)
    assert _files_holding(folder, PASSWORD) == []
    assert _files_holding(_ray_folder(tmp_path_factory), PASSWORD) == []


@pytest.mark.slow
def test_a_rerun_from_the_masked_record_takes_the_password_from_the_environment(swept, secret_store):
    client = MlflowClient(tracking_uri=secret_store)
    experiment = find_experiment(client, EXPERIMENT)
    parent = client.get_run(find_parent(client, experiment, "smoke"))
    (recorded,) = [w for w in shlex.split(parent.data.tags[COMMAND]) if w.startswith("tracking.uri=")]
    assert recorded == f"tracking.uri='{mask(secret_store)}'" and MASK in recorded
    run = children(secret_store, "smoke", EXPERIMENT)[0].info.run_id
    refused = _run(["sweeper.rerun", run, recorded], swept["folder"])
    assert refused.returncode == 4, refused.stdout + refused.stderr
    said = refused.stderr.splitlines()
    assert [l for l in said if l.startswith("rerun: no password for")] and said[-1].startswith(
        "error: database"
    )
    again = _run(["sweeper.rerun", run, recorded], swept["folder"], PGPASSWORD=PASSWORD)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "no password" not in again.stderr and PASSWORD not in again.stdout + again.stderr


@pytest.mark.slow
def test_the_mask_command_masks_what_an_older_store_recorded(swept, secret_store, capsys):
    """Records written before the masking (a tag and a config.yaml holding the password, written here as the
    older code wrote them) are masked in place, and the command says how many."""
    client = MlflowClient(tracking_uri=secret_store)
    experiment = find_experiment(client, EXPERIMENT)
    old = client.create_run(experiment, run_name="before the masking").info.run_id
    client.set_tag(old, COMMAND, f"python -m sweeper.sweep tracking.uri={secret_store}")
    client.set_tag(old, MLFLOW_RUN_NOTE, f"Started with `tracking.uri={secret_store}`")
    written = swept["folder"] / CONFIG_ARTIFACT
    written.write_text(f"tracking:\n  uri: {secret_store}\n")
    client.log_artifact(old, str(written))
    assert _tables_holding(secret_store, PASSWORD) == ["tags"]
    masked_uri = (
        f"tracking.uri='{mask(secret_store)}'"  # as the records have it: the password from PGPASSWORD
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PGPASSWORD", PASSWORD)
        assert mask_store.main([masked_uri]) == 0
        assert mask_store.main([masked_uri]) == 0  # nothing left to mask
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith("masked 3 recorded credentials") and second.startswith("masked 0 ")
    assert _tables_holding(secret_store, PASSWORD) == [] and PASSWORD not in first
    assert _files_holding(swept["folder"], PASSWORD) == [written]  # the test's own copy, not the artifact


@pytest.mark.slow
def test_training_and_a_refused_rerun_print_and_record_the_password_masked(
    secret_store, tiny, tmp_path, capfd
):
    """`python -m sweeper.train` with the password in tracking.uri (in this process: a tiny run): its
    config.yaml (the run's artifact and the copy in its workdir) and its last line hold it masked; a rerun
    of a run the store lacks names the store, masked, in its error line."""
    uri = f"tracking.uri='{secret_store}'"
    # An experiment of its own, its artifacts in this test's folder (a store without an artifact root puts
    # them under the working directory of the first client of this process that opened it).
    MlflowClient(tracking_uri=secret_store).create_experiment(
        "train", artifact_location=str(tmp_path / "art")
    )
    with pytest.MonkeyPatch.context() as env:
        env.chdir(tmp_path)  # the run's workdir (runs/)
        assert train.main([*tiny, uri, "tracking.experiment=train"]) == 0
        assert rerun.main(["0123456789abcdef0123456789abcdef", uri]) == exit_codes.NO_SUCH_RUN
    printed = capfd.readouterr()
    assert "error: run 0123456789abcdef0123456789abcdef is not in" in printed.err
    assert PASSWORD not in printed.out + printed.err and MASK in printed.out
    configs = list(tmp_path.rglob(CONFIG_ARTIFACT))
    assert len(configs) == 2 and _files_holding(tmp_path, PASSWORD) == []
    assert all(f"uri: {mask(secret_store)}" in path.read_text() for path in configs)


@pytest.mark.slow
def test_a_login_in_a_servers_address_is_written_nowhere_and_reruns_from_the_environment(
    auth_server, tiny, tmp_path, capfd
):
    """The recipes' MLflow server with basic auth, its login in tracking.uri (http://USER:PASSWORD@HOST): a
    tiny run trains through it, and the password is in nothing the server stored (its store, the run's
    artifacts, its log) or printed; the run re-runs from its record (the address masked) with the login in
    MLflow's environment variables."""
    given = auth_server.uri.replace("://", f"://{ADMIN}:{ADMIN_PASSWORD}@")
    with pytest.MonkeyPatch.context() as env:
        env.chdir(tmp_path)
        env.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        env.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
        assert train.main([*tiny, f"tracking.uri={given}", "tracking.experiment=login"]) == 0
        client = MlflowClient(tracking_uri=given)
        (run,) = client.search_runs([find_experiment(client, "login")])
        recorded = run.data.tags["tracking.uri"]
        assert recorded == mask(given) and MASK in recorded
        env.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
        env.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
        assert rerun.main([run.info.run_id, f"tracking.uri={recorded}"]) == 0
    printed = capfd.readouterr()
    assert ADMIN_PASSWORD not in printed.out + printed.err and "rerun: no password" not in printed.err
    assert _files_holding(auth_server.root, ADMIN_PASSWORD) == [] == _files_holding(tmp_path, ADMIN_PASSWORD)


@pytest.mark.slow  # an interpreter importing Hydra and the config tree
def test_a_storage_key_in_cluster_storage_is_refused_before_ray_in_one_line():
    """Ray writes cluster.storage's address into its own records of the sweep (Tune's state), which no masking
    reaches: a secret in its query is refused by the sweep's console script, exit 2, the key not printed;
    the same address without it is taken."""
    key = secrets.token_hex(8)
    storage = f"cluster.storage='s3://bucket/ray?secret_access_key={key}&region=eu'"
    script = str(Path(sys.executable).parent / "leaner-sweep")
    done = subprocess.run(
        [script, "sweep=smoke", "sweep.dry_run=true", storage], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == exit_codes.CONFIG and key not in done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "error: cluster.storage='s3://bucket/ray?secret_access_key=***&region=eu' is not allowed: a "
        "credential in its address would be written into Ray's records of the sweep; give storage keys "
        "through the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...; docs/security.md)"
    ]
    compose(["sweep=smoke", "cluster.storage='s3://bucket/ray?region=eu'"])
