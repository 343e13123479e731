"""The sweep driver's writes outlast a tracking-server outage: PatientClient.

A driver of a night-long sweep must not stop because the MLflow server or the
database behind a postgresql:// store restarts. PatientClient is an MlflowClient
whose calls, when the server does not answer (an HTTP server's /health does not
reply; a database takes no connection), wait and retry until the server is
back, for up to tracking.outage_s; then TrackingOutage. An SQLite file has no
server: its errors are real ones. A call the server
refuses while it answers is a real error, raised at once. Retries are safe:
MLflow stores a metric point once per (key, step, timestamp, value), tags and
params are set to the same values, and a run whose creation reply was lost is
found by its config_hash rather than created twice. The trials keep training
meanwhile: the sweep's session (sweeper.driver.session) writes on a thread of its own,
which is the one that waits.

The driver logs one line when an outage starts and one when it ends.
"""

from __future__ import annotations

import time
from typing import Callable

from mlflow.tracking import MlflowClient

from cli.credentials import mask
from config import address
from tracking.names import CONFIG_HASH, MLFLOW_PARENT_RUN_ID
from tracking.store import TrackingError, probe

MAX_WAIT_S = 10.0  # longest pause between two tries of a write during an outage


class TrackingOutage(TrackingError):
    """The tracking server stayed away longer than tracking.outage_s."""


class PatientClient:
    """Forwards to an MlflowClient; each call waits out an outage of the server (see the module docstring)."""

    def __init__(
        self, client: MlflowClient, uri: str, outage_s: float, waiting: Callable[[], int] = lambda: 0
    ):
        self.client, self.uri, self.outage_s, self.waiting = client, uri, outage_s, waiting
        self.down_since: float | None = None
        self.outages = 0
        self.server = _server(uri)

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "client":  # pickle's probes, and before __init__ ran
            raise AttributeError(name)
        method = getattr(self.client, name)
        return lambda *args, **kwargs: self.call(lambda: method(*args, **kwargs))

    def _answers(self) -> bool:
        if self.server is None:
            return True  # an SQLite file: no server to wait for
        try:
            probe(self.uri)
            return True
        except TrackingError:
            return False

    def call(self, attempt: Callable[[], object]):
        pause = 1.0
        while True:
            try:
                result = attempt()
            except (
                Exception
            ) as err:  # MLflow wraps a refused connection in MlflowException after its own retries
                if self._answers():
                    raise
                self._down(err)
                time.sleep(pause)
                pause = min(2 * pause, MAX_WAIT_S)
                continue
            self._up()
            return result

    def _down(self, err: Exception) -> None:
        now = time.monotonic()
        if self.down_since is None:
            self.down_since, self.outages = now, self.outages + 1
            print(
                f"tracking: {self.server} unreachable ({type(err).__name__}); trials keep "
                f"training, {self.waiting()} writes wait and are retried for up to "
                f"tracking.outage_s={self.outage_s:g} s",
                flush=True,
            )
        elif now - self.down_since > self.outage_s:
            raise TrackingOutage(
                f"{self.server} unreachable for {now - self.down_since:.0f} s (tracking.outage_s="
                f"{self.outage_s:g}): the sweep driver stops. What was written before the outage is stored; "
                "once the server is back, start the same command again: finished trials are skipped, the "
                "others resume from their last recorded checkpoint"
            ) from None

    def _up(self) -> None:
        if self.down_since is not None:
            print(
                f"tracking: {self.server} back after {time.monotonic() - self.down_since:.0f} s; "
                f"writing the {self.waiting()} waiting writes",
                flush=True,
            )
            self.down_since = None

    def create_run(self, experiment_id: str, run_name: str | None = None, tags: dict | None = None):
        """Create a run once: a retry first looks for the run a lost reply may have created."""
        tried = False

        def attempt():
            nonlocal tried
            if tried and CONFIG_HASH in (tags or {}):
                query = (
                    f"tags.{CONFIG_HASH} = '{tags[CONFIG_HASH]}' and "
                    f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{tags[MLFLOW_PARENT_RUN_ID]}'"
                )
                found = self.client.search_runs([experiment_id], query, max_results=1)
                if found:
                    return found[0]
            tried = True
            return self.client.create_run(experiment_id, run_name=run_name, tags=tags)

        return self.call(attempt)

    def delete_tag(self, run_id: str, key: str) -> None:
        """Delete once: a retry finds the tag already gone when a lost reply had deleted it."""
        self.call(
            lambda: key in self.client.get_run(run_id).data.tags and self.client.delete_tag(run_id, key)
        )


def _server(uri: str) -> str | None:
    """The server behind a store, as the driver's messages name it (its password masked); None for an SQLite
    file."""
    if uri.startswith(tuple(f"{s}://" for s in address.SERVERS)):
        return f"MLflow server {mask(uri)}"
    if address.is_database(uri):
        return f"database {mask(uri)}"
    return None
