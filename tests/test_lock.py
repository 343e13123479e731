"""The driver lock's takeover (sweeper.driver.lock) on a real SQLite store: a lock held from another host is
taken over only when its holder's Ray cluster answers nothing at its GCS address, or a cluster of another id
answers there, and its heartbeat stays silent for TAKEOVER_S; a holder that answers or beats keeps it. The
holders are tags as a driver writes them; the retried driver on a new Ray cluster is
tests/test_sweep_drivers.py's."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from mlflow.tracking import MlflowClient
from support.servers import free_port

from sweeper.driver import cluster
from sweeper.driver.lock import TAKEOVER_S, DriverLock, answers
from sweeper.errors import SweepLocked
from tracking.names import DRIVER


def locked_parent(uri: str, **holder) -> tuple[MlflowClient, str]:
    """A parent run whose lock another host's driver holds: host lost-head, the given fields."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("lock")
    run_id = client.create_run(experiment).info.run_id
    held = {"host": "lost-head", "pid": 1, "started": time.time() - 3600, **holder}
    client.set_tag(run_id, DRIVER, json.dumps(held))
    return client, run_id


def holder_of(client: MlflowClient, run_id: str) -> dict:
    return json.loads(client.get_run(run_id).data.tags[DRIVER])


def test_a_lock_whose_cluster_is_gone_and_silent_is_taken_over(sqlite_uri):
    gone = f"127.0.0.1:{free_port()}"  # nothing listens there
    client, run_id = locked_parent(sqlite_uri, beat=time.time() - TAKEOVER_S - 1, gcs=gone)
    assert_taken_over(client, run_id)


def assert_taken_over(client: MlflowClient, run_id: str) -> None:
    """This driver takes the lock: the holder is this host (then it lets go)."""
    lock = DriverLock(client, run_id, "smoke")
    lock.take()
    try:
        assert holder_of(client, run_id)["host"] == socket.gethostname()
    finally:
        lock.release()


def test_a_holder_whose_cluster_answers_keeps_its_lock(sqlite_uri):
    with socket.create_server(("127.0.0.1", 0)) as listening:  # its GCS: something answers there
        gcs = f"127.0.0.1:{listening.getsockname()[1]}"
        client, run_id = locked_parent(sqlite_uri, beat=time.time() - TAKEOVER_S - 1, gcs=gcs)
        with pytest.raises(SweepLocked, match=f"host lost-head, pid 1, .*Ray cluster {gcs}"):
            DriverLock(client, run_id, "smoke").take()
    assert holder_of(client, run_id)["host"] == "lost-head"


def test_a_holder_that_keeps_beating_keeps_its_lock_though_its_cluster_does_not_answer(sqlite_uri):
    """A live driver whose cluster a network split hides from this one: its heartbeat tells it is alive."""
    gone = f"127.0.0.1:{free_port()}"
    client, run_id = locked_parent(sqlite_uri, beat=time.time(), gcs=gone)

    def beat() -> None:
        time.sleep(1)
        held = holder_of(client, run_id)
        client.set_tag(run_id, DRIVER, json.dumps({**held, "beat": time.time()}))

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        with pytest.raises(SweepLocked, match="host lost-head"):
            DriverLock(client, run_id, "smoke").take()
    finally:
        beating.join()
    assert holder_of(client, run_id)["host"] == "lost-head"


def test_a_new_cluster_at_the_lost_ones_address_does_not_keep_its_lock(sqlite_uri, local_ray):
    """`ray up` on the same head, a requeued job on the same node, a reused pod IP: a new Ray cluster answers
    at the lost one's GCS address. The lock names its cluster by id: another id there is not the holder's
    cluster, and the lock is taken over; the holder's own cluster, answering with its id, keeps it."""
    gcs, cluster_id = cluster.identity()  # the local Ray instance: a live GCS, with its id
    assert answers(gcs)
    client, run_id = locked_parent(sqlite_uri, beat=time.time() - TAKEOVER_S - 1, gcs=gcs, cluster=cluster_id)
    with pytest.raises(SweepLocked, match="host lost-head"):
        DriverLock(client, run_id, "smoke").take()
    lost = {**holder_of(client, run_id), "cluster": "0" * len(cluster_id)}  # an earlier cluster at gcs
    client.set_tag(run_id, DRIVER, json.dumps(lost))
    assert_taken_over(client, run_id)


def test_a_driver_whose_lock_was_taken_over_does_not_take_it_back(sqlite_uri):
    client, run_id = locked_parent(
        sqlite_uri, beat=time.time() - TAKEOVER_S - 1, gcs=f"127.0.0.1:{free_port()}"
    )
    lock = DriverLock(client, run_id, "smoke")
    lock.take()
    try:  # another driver took it over (this one's cluster looked gone): a late beat leaves it there
        successor = {"host": "new-head", "pid": 2, "started": time.time(), "beat": time.time()}
        client.set_tag(run_id, DRIVER, json.dumps(successor))
        lock.joined("127.0.0.1:6379", "ab" * 28)
        assert holder_of(client, run_id) == successor
    finally:
        lock.release()
    assert holder_of(client, run_id) == successor  # nor does its release delete it
