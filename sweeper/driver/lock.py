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
is older than STALE_S). The driver's hold on the sweep (sweeper.driver.hold) decides when to lock: after
its one read of the store, checking that no other driver wrote in between.

A driver killed with its host (a lost head pod, an allocation's end) is retried on a new Ray cluster on
another host, which cannot see whether its process is gone. So once a driver has joined Ray it adds its
cluster's GCS address and id to the tag (joined), and a driver that finds a lock whose cluster no longer
answers there takes it over once the holder's heartbeat is older than TAKEOVER_S (it waits for that, watching
the tag): a holder that still runs, whose cluster a network split hides, keeps beating and keeps its lock.
Both at once (its cluster unreachable from here and its store writes failing for TAKEOVER_S) is the one case
two drivers can overlap. A new cluster may answer at the lost one's address (`ray up` on the same head, a
requeued job on the same node, a reused pod IP): a GCS there with another cluster id is not the holder's. A
lock without a cluster (a driver killed before it joined Ray) waits for STALE_S.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import psutil
from mlflow.tracking import MlflowClient

from sweeper.errors import SweepLocked
from tracking.names import DRIVER

SETTLE_S = 1.0  # longer than one tag write and read: the last of simultaneous locks is seen by all
BEAT_S = 10.0  # heartbeat period
STALE_S = 600.0  # a lock from another host silent this long belongs to a dead driver
TAKEOVER_S = 4 * BEAT_S  # ... and this long, when its Ray cluster no longer answers
PROBE_S = 5.0  # how long a connection to the holder's GCS may take to be an answer


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


def answers(address: str) -> bool:
    """Whether anything listens at a GCS address (HOST:PORT): a cluster that is gone answers nothing."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
    except (OSError, ValueError):
        return False
    return True


def holds_cluster(holder: dict) -> bool:
    """Whether the holder's Ray cluster still answers at its GCS address: something listens there and, when
    the holder recorded its cluster's id, the GCS there reports that id or cannot be asked (not a GCS, or one
    that refuses this driver's token): then it may be the holder's."""
    if not answers(holder["gcs"]):
        return False
    if "cluster" not in holder:  # a tag of a driver before ids were recorded: by the address alone
        return True
    from ray._raylet import GcsClient  # pyproject.toml pins Ray's one version; tests/test_lock.py runs it

    try:
        there = GcsClient(address=holder["gcs"]).cluster_id.hex()
    except Exception:  # ray's RpcError, or a refusal: cannot tell, so as before, by the address alone
        return True
    return there == holder["cluster"]


def describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder["started"]))
    on = f", Ray cluster {holder['gcs']}" if holder.get("gcs") else ""
    return (
        f"host {holder['host']}, pid {holder['pid']}, started {started}{on} "
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
        if holder is not None and self._gone(holder):
            print(f"sweep: taking over the lock of a driver whose Ray cluster is gone ({describe(holder)})")
            holder = None
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

    def _gone(self, holder: dict) -> bool:
        """Whether a live-looking holder on another host is dead with its cluster: its GCS answers nothing
        and its heartbeat stays silent for TAKEOVER_S (waited for here: a live holder beats meanwhile)."""
        if holder["host"] == socket.gethostname() or not holder.get("gcs") or holds_cluster(holder):
            return False  # on this host its process is alive (alive): a live driver, whatever its cluster
        wait = holder["beat"] + TAKEOVER_S - time.time()
        if wait > 0:
            print(
                f"sweep: the driver holding the lock ({describe(holder)}) is on a Ray cluster that no longer "
                f"answers; waiting {wait:.0f} s for its heartbeat before taking over",
                flush=True,
            )
        while time.time() < holder["beat"] + TAKEOVER_S:
            time.sleep(min(BEAT_S / 2, max(holder["beat"] + TAKEOVER_S - time.time(), 0)))
            if self._read() != holder:  # it beat, released or was taken: not ours to take
                return False
        return True

    def joined(self, gcs: str, cluster: str) -> None:
        """Record the Ray cluster this driver joined (its GCS address and cluster id): the lock's holder can
        be told dead by it from another host (the module docstring)."""
        self.mine.update(gcs=gcs, cluster=cluster)
        self._write()

    def _write(self) -> None:
        """The tag renewed (beat, cluster), unless another driver holds it now: never taken back."""
        self.mine["beat"] = time.time()
        if self._holder() is None:
            self.client.set_tag(self.parent_id, DRIVER, json.dumps(self.mine))

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self._write()
            except Exception:  # the store is away: the writer says so; a missed beat costs nothing here
                pass

    def release(self) -> None:
        self._stop.set()
        try:
            if self._holder() is None and self._read():
                self.client.delete_tag(self.parent_id, DRIVER)
        except Exception as err:  # the store is away: the lock goes stale once this process is gone
            print(f"sweep: could not release the lock on the sweep's parent run ({type(err).__name__})")
