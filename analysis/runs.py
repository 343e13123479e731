"""Runs and metric histories from the MLflow store, as pandas DataFrames.

`load_runs` pages through MlflowClient.search_runs (the page size is the
store's maximum, so 3,000 runs are a handful of queries) and returns one row
per run: its id, status, times, the tags the analysis needs and every config
value under its dotted key, typed (numbers as numbers). `histories` fetches
the metric points of many runs at once: one SQL query for a SQLite store, the
tracking server's bulk-history endpoint (100 runs per request) for a server,
and a thread pool of per-run calls only for any other store.
"""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import ViewType
from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.rest_utils import http_request
from sqlalchemy.engine import make_url

from sweeper.config import OPERATIONAL_TRAIN_KEYS, RETIRED_TRAIN_KEYS, RUN_GROUPS
from sweeper.metrics import CONFIG_HASH, DIVERGED, DIVERGED_AT, FINISHED, METRICS, OUTCOME, SEED, SUBGRIDS, SWEEP

PAGE = 5000  # runs per search_runs page (a SQL store allows up to 50,000)
TAGS = (CONFIG_HASH, SEED, OUTCOME, DIVERGED_AT, SUBGRIDS, SWEEP)
RUN_COLUMNS = ["run_id", "run_name", "status", "start_time", "end_time", "experiment_id", *TAGS, *METRICS]


class NoRuns(LookupError):
    """Nothing to analyse; the message says what is missing and where it was looked for."""


def config_keys(columns: Iterable[str]) -> list[str]:
    """The dotted keys that determine a run's numbers (the seed excluded): task.*, model.*, ..."""
    operational = {f"train.{key}" for key in (*OPERATIONAL_TRAIN_KEYS, *RETIRED_TRAIN_KEYS)}
    return sorted(c for c in columns if c.split(".")[0] in RUN_GROUPS and "." in c and c not in operational)


def typed(text: str | None) -> object:
    """A param value back as the number/bool it was; everything else stays text."""
    if text is None or text == "null":
        return None
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def experiment_id(client: MlflowClient, experiment: str) -> str:
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = sorted(e.name for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY))
        raise NoRuns(f"experiment {experiment!r} does not exist in {client.tracking_uri}; "
                     f"experiments there: {', '.join(names) or 'none'}")
    return found.experiment_id


def load_runs(uri: str, experiment: str, sweep: str | None = None, subgrid: str | None = None,
              where: dict[str, object] | None = None) -> pd.DataFrame:
    """One row per run of `experiment`, optionally only those of one sweep, sub-grid or config values.

    `where` maps dotted config keys to a value or a list of allowed values,
    e.g. {"task.d": 32, "model.embedding": ["onehot", "binary"]}.
    """
    client = MlflowClient(uri)
    exp_id = experiment_id(client, experiment)
    filters = [f"tags.{SWEEP} LIKE '%{sweep}%'"] if sweep else []  # a list (runs adopted by sweeps): exact below
    if subgrid:
        filters.append(f"tags.{SUBGRIDS} LIKE '%{subgrid}%'")  # exact match below
    rows, token = [], None
    while True:
        page = client.search_runs([exp_id], " and ".join(filters), ViewType.ACTIVE_ONLY, PAGE, page_token=token)
        rows += [_row(run) for run in page if CONFIG_HASH in run.data.tags]  # a sweep's parent run has no configuration
        token = page.token
        if not token:
            break
    runs = pd.DataFrame(rows, columns=None if rows else RUN_COLUMNS)
    if runs.empty:
        return runs
    if sweep:
        runs = runs[runs[SWEEP].fillna("").map(lambda s: sweep in s.split(","))]
    if subgrid:
        runs = runs[runs[SUBGRIDS].fillna("").map(lambda s: subgrid in s.split(","))]
    for key, wanted in (where or {}).items():
        if key not in runs:
            raise KeyError(f"config key {key!r} is not a param of these runs; they have: {', '.join(config_keys(runs))}")
        allowed = wanted if isinstance(wanted, (list, tuple, set)) else [wanted]
        runs = runs[runs[key].isin(allowed)]
    return runs.sort_values(["start_time", "run_id"]).reset_index(drop=True)


def _row(run) -> dict:
    info, data = run.info, run.data
    row = {"run_id": info.run_id, "run_name": info.run_name, "status": info.status,
           "start_time": info.start_time, "end_time": info.end_time, "experiment_id": info.experiment_id}
    row.update({tag: data.tags.get(tag) for tag in TAGS})
    row.update({key: typed(value) for key, value in data.params.items()})
    row.update({key: data.metrics.get(key) for key in METRICS})  # the latest value of each metric
    row[SEED] = typed(data.tags.get(SEED, data.params.get(SEED)))
    return row


def outcome_of(runs: pd.DataFrame) -> pd.Series:
    """finished / diverged / other (running, killed, crashed) per run."""
    tagged = runs[OUTCOME].where(runs[OUTCOME].isin([FINISHED, DIVERGED]), "other")
    return tagged.where(~((tagged == "other") & (runs["status"] == "FINISHED")), FINISHED)


def histories(uri: str, runs: pd.DataFrame, keys: Iterable[str]) -> pd.DataFrame:
    """Metric points of all `runs` for `keys`: columns run_id, key, step, timestamp (ms), value.

    A point logged twice at one step (a resumed run re-logging) keeps its latest value.
    """
    keys = list(keys)
    columns = ["run_id", "key", "step", "timestamp", "value"]
    if runs.empty or not keys:
        return pd.DataFrame(columns=columns)
    scheme = make_url(uri).get_backend_name() if "://" in uri else "file"
    if scheme == "sqlite":
        points = _sqlite_histories(uri, runs, keys)
    elif scheme in ("http", "https"):
        points = _server_histories(uri, list(runs["run_id"]), keys)
    else:
        points = _threaded_histories(uri, list(runs["run_id"]), keys)
    points = points[points["run_id"].isin(set(runs["run_id"]))]
    points = points.sort_values(["run_id", "key", "step", "timestamp"])
    return points.drop_duplicates(["run_id", "key", "step"], keep="last").reset_index(drop=True)[columns]


def _sqlite_histories(uri: str, runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One read-only query over the store's metrics table, for every run of the experiments involved."""
    path = make_url(uri).database
    experiments = sorted({int(e) for e in runs["experiment_id"]})
    query = (f"SELECT m.run_uuid AS run_id, m.key AS key, m.step AS step, m.timestamp AS timestamp, "
             f"CASE WHEN m.is_nan THEN NULL ELSE m.value END AS value FROM metrics m "
             f"JOIN runs r ON r.run_uuid = m.run_uuid "
             f"WHERE r.experiment_id IN ({','.join('?' * len(experiments))}) AND m.key IN ({','.join('?' * len(keys))})")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        points = pd.read_sql_query(query, db, params=[*experiments, *keys])
    points["value"] = points["value"].astype(float)  # NaN points come back as NULL
    return points


def _server_histories(uri: str, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    """The server's get-history-bulk endpoint: 100 runs and up to 25,000 points per request."""
    creds, frames = get_default_host_creds(uri), []
    for key in keys:
        for start in range(0, len(run_ids), 100):
            chunk = run_ids[start:start + 100]
            response = http_request(creds, "/ajax-api/2.0/mlflow/metrics/get-history-bulk", "GET",
                                    params={"run_id": chunk, "metric_key": key, "max_results": 25000})
            response.raise_for_status()
            metrics = response.json().get("metrics", [])
            if len(metrics) >= 25000:  # truncated by the server: fetch this chunk run by run
                frames.append(_threaded_histories(uri, chunk, [key]))
            else:
                frames.append(pd.DataFrame(metrics, columns=["run_id", "key", "step", "timestamp", "value"]))
    return pd.concat(frames, ignore_index=True)


def _threaded_histories(uri: str, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    client = MlflowClient(uri)

    def one(job: tuple[str, str]) -> list[tuple]:
        run_id, key = job
        return [(run_id, key, m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]

    with ThreadPoolExecutor(8) as pool:
        rows = [row for part in pool.map(one, [(r, k) for r in run_ids for k in keys]) for row in part]
    return pd.DataFrame(rows, columns=["run_id", "key", "step", "timestamp", "value"])
