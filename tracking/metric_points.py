"""The metric points of many runs at once, from an MLflow store: `read`.

The public API reads histories one call per run and metric (6,000 calls for two metrics of the paper's 3,000
runs), so `read` tries a fast path first: one SQL query on a SQLite store's metrics table, or a tracking
server's bulk endpoint (the one MLflow's own UI calls, under /ajax-api: not part of the public API). Neither
is MLflow's promise, so each is used only when the store answers as expected; otherwise one line is logged
and the public API answers.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

import pandas as pd
from mlflow.tracking import MlflowClient
from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.rest_utils import http_request
from tqdm import tqdm

log = logging.getLogger(__name__)
POINT_COLUMNS = ["run_id", "key", "step", "timestamp", "value"]
POINT_TYPES = {"step": "int64", "timestamp": "int64", "value": "float64"}
# The fast paths' assumptions: the columns of the metrics table in MLflow's SQL schema (the query below reads
# them all), and the server's bulk endpoint with its limits per request.
METRICS_TABLE = {"key", "value", "timestamp", "step", "is_nan", "run_uuid"}
BULK_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"
BULK_RUNS, BULK_POINTS = 100, 25000


class _Unexpected(Exception):
    """A fast read path met a store other than the one it was written for."""


def read(client: MlflowClient, run_ids: list[str], keys: list[str], fast: bool = True) -> pd.DataFrame:
    """The stored points of `keys` of `run_ids`, unordered: columns run_id, key, step, timestamp (ms), value.

    fast=False reads through the public API only (what the fast paths fall back to).
    """
    run_ids, keys = list(run_ids), list(keys)
    if not run_ids or not keys:
        return pd.DataFrame({c: pd.Series(dtype=POINT_TYPES.get(c, object)) for c in POINT_COLUMNS})
    uri = client.tracking_uri
    scheme = urllib.parse.urlparse(uri).scheme.split("+")[0]  # sqlite+pysqlite: sqlite
    fast_path = {"sqlite": _sqlite_points, "http": _bulk_points, "https": _bulk_points}.get(scheme)
    points = None
    if fast and fast_path:
        try:
            points = fast_path(client, run_ids, keys)
        except Exception as err:  # an optimisation must never cost an answer: any failure goes the public way
            log.warning(
                "metric histories: the fast path for a %s store failed (%s: %s); reading them through "
                "MLflow's public API instead",
                scheme,
                type(err).__name__,
                err,
            )
    if points is None:
        points = _public_points(client, run_ids, keys)
    return points[POINT_COLUMNS].astype(POINT_TYPES)


def _sqlite_points(client: MlflowClient, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    """One read-only query on the store's metrics table (NaN is stored as value 0 with is_nan set)."""
    # MLflow's parser of database URIs, slow to import (python -X importtime -c 'import sqlalchemy.engine')
    from sqlalchemy.engine import make_url

    path = make_url(client.tracking_uri).database
    with closing(sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=ro", uri=True)) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(metrics)")}
        if columns != METRICS_TABLE:
            raise _Unexpected(f"the metrics table has columns {sorted(columns)}, not {sorted(METRICS_TABLE)}")
        query = (
            "SELECT run_uuid AS run_id, key, step, timestamp, "
            "CASE WHEN is_nan THEN NULL ELSE value END AS value "
            "FROM metrics WHERE run_uuid IN (SELECT value FROM json_each(?)) "
            f"AND key IN ({','.join('?' * len(keys))})"
        )
        return pd.read_sql_query(query, db, params=[json.dumps(run_ids), *keys])


def _bulk_points(client: MlflowClient, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    """The server's bulk endpoint: BULK_RUNS runs and up to BULK_POINTS points per request."""
    creds, frames = get_default_host_creds(client.tracking_uri), []
    for key in keys:
        for start in range(0, len(run_ids), BULK_RUNS):
            chunk = run_ids[start : start + BULK_RUNS]
            response = http_request(
                creds,
                BULK_ENDPOINT,
                "GET",
                params={"run_id": chunk, "metric_key": key, "max_results": BULK_POINTS},
            )
            if response.status_code != 200:
                raise _Unexpected(f"{BULK_ENDPOINT} answered HTTP {response.status_code}")
            metrics = response.json()["metrics"]
            if metrics and not set(POINT_COLUMNS) <= set(metrics[0]):
                raise _Unexpected(f"{BULK_ENDPOINT} answered points with fields {sorted(metrics[0])}")
            if len(metrics) >= BULK_POINTS:  # truncated by the server: this chunk run by run
                frames.append(_public_points(client, chunk, [key]))
            else:
                frames.append(pd.DataFrame(metrics, columns=POINT_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def _public_points(client: MlflowClient, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    """MlflowClient.get_metric_history per run and key, eight at a time."""

    def one(job: tuple[str, str]) -> list[tuple]:
        run_id, key = job
        return [(run_id, key, m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]

    jobs = [(run_id, key) for run_id in run_ids for key in keys]
    with ThreadPoolExecutor(8) as pool:
        parts = list(
            tqdm(
                pool.map(one, jobs),
                total=len(jobs),
                desc="metric histories",
                unit="history",
                leave=False,
                disable=len(jobs) < 1000,
            )
        )
    return pd.DataFrame([row for part in parts for row in part], columns=POINT_COLUMNS)
