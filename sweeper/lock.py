"""One driver per sweep: a lock on the sweep's parent run in the tracking store.

Two drivers of one sweep (a second terminal, a retried job, a RayJob that
Kubernetes restarted) would train the same pending models twice, into two
runs each. So a driver locks the sweep before it starts any work: it writes
the DRIVER tag (host, pid, process start, heartbeat) on the parent run, waits
SETTLE_S and reads the tag back; of drivers that lock at once the last write
wins and the others refuse. A second driver refuses, naming the running one.
The tag is deleted when the driver exits; a driver killed outright leaves it
behind, and it is stale, not blocking a restart, when its process is gone
from this host (or, on another host, when its heartbeat, renewed every BEAT_S,
is older than STALE_S). The driver's claim on the sweep (sweeper.ledger) decides when to lock: after
its one read of the store, checking that no other driver wrote in between.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import psutil
from mlflow.tracking import MlflowClient

from cli import exit_codes
from tracking.names import DRIVER

SETTLE_S = 1.0  # longer than one tag write and read: the last of simultaneous locks is seen by all
BEAT_S = 60.0  # heartbeat period
STALE_S = 600.0  # a lock from another host silent this long belongs to a dead driver


class SweepLocked(RuntimeError, exit_codes.CommandError):
    """Another driver runs this sweep; the message names it."""

    exit_code = exit_codes.LOCKED


def me() -> dict:
    started = psutil.Process().create_time()
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": started, "beat": time.time()}


def alive(holder: dict) -> bool:
    """Whether the locking driver still runs: its process on this host, its heartbeat elsewhere."""
    if holder["host"] != socket.gethostname():
        return time.time() - holder["beat"] < STALE_S
    try:  # a pid is reused: the process must also have started when the holder did
        return abs(psutil.Process(holder["pid"]).create_time() - holder["started"]) < 1.0
    except psutil.NoSuchProcess:
        return False


def describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder["started"]))
    return (
        f"host {holder['host']}, pid {holder['pid']}, started {started} "
        f"(last heard {time.time() - holder['beat']:.0f} s ago)"
    )


class DriverLock:
    """This driver's lock on a sweep's parent run: held from take() to release()."""

    def __init__(self, client: MlflowClient, parent_id: str, sweep: str) -> None:
        self.client, self.parent_id, self.sweep = client, parent_id, sweep
        self.mine = me()
        self._stop = threading.Event()

    def _read(self) -> dict | None:
        text = self.client.get_run(self.parent_id).data.tags.get(DRIVER)
        return json.loads(text) if text else None

    def _holder(self) -> dict | None:
        held = self._read()
        same = held and all(held[k] == self.mine[k] for k in ("host", "pid", "started"))
        return None if same or not held or not alive(held) else held

    def take(self) -> None:
        """Lock the sweep, or raise SweepLocked naming the driver that runs it."""
        holder = self._holder()
        if holder is None:  # write, settle, read back: of simultaneous locks only the last one stays
            self.client.set_tag(self.parent_id, DRIVER, json.dumps(self.mine))
            time.sleep(SETTLE_S)
            holder = self._holder()
        if holder is not None:
            raise SweepLocked(
                f"sweep {self.sweep} is being run by another driver ({describe(holder)}); "
                "stop that one first, or let it finish: this driver started nothing"
            )
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self.mine["beat"] = time.time()
                self.client.set_tag(self.parent_id, DRIVER, json.dumps(self.mine))
            except Exception:  # the store is away: the writer says so; a missed beat costs nothing here
                pass

    def release(self) -> None:
        self._stop.set()
        try:
            if self._holder() is None and self._read():
                self.client.delete_tag(self.parent_id, DRIVER)
        except Exception as err:  # the store is away: the lock goes stale once this process is gone
            print(f"sweep: could not release the lock on the sweep's parent run ({type(err).__name__})")
