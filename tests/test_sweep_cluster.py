"""A two-node Ray cluster on this machine; the worker node dies mid-sweep; every trial finishes once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeper.metrics import CONFIG_HASH, FINISHED, OUTCOME
from sweeper.sweep import main
from helpers import check_histories, children, sweep_trials

pytestmark = pytest.mark.slow

SWEEP = ["sweep=smoke", "sweep.seeds=[1, 2]", "train.steps=150", "train.eval_every=10"]


@pytest.fixture
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=2)
    yield cluster, worker
    ray.shutdown()
    cluster.shutdown()


def kill_when_checkpointed(cluster, worker, storage: Path, done: threading.Event) -> threading.Thread:
    """Remove the worker node (its raylet and trials die) once trials have checkpoints to resume from."""
    def run() -> None:
        while not done.wait(0.5):
            if len(list(storage.glob("smoke-*/*/checkpoint_*"))) >= 3:
                cluster.remove_node(worker, allow_graceful=False)
                return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_worker_node_killed_mid_sweep_every_trial_finishes_once(two_nodes, tmp_path, capfd):
    cluster, worker = two_nodes
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    storage = tmp_path / "ray"  # one file system for both nodes: the shared-storage check passes
    done = threading.Event()
    killer = kill_when_checkpointed(cluster, worker, storage, done)
    try:
        code = main([*SWEEP, f"tracking.uri={uri}", f"cluster.storage={storage}", f"cluster.address={cluster.address}",
                     "cluster.cpus_per_trial=1", "cluster.max_failures=3"])
    finally:
        done.set()
        killer.join()
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    assert worker not in cluster.worker_nodes, "the worker node was never killed"
    retries = int(out.split(" retries;")[0].rsplit(";", 1)[1])
    assert retries >= 1, "no trial was running on the killed node"

    client = MlflowClient(tracking_uri=uri)
    runs = children(uri, "smoke")
    trials = sweep_trials(SWEEP)
    assert sorted(r.data.tags[CONFIG_HASH] for r in runs) == sorted(t.key for t in trials)  # one run each
    by_key = {r.data.tags[CONFIG_HASH]: r for r in runs}
    for t in trials:
        assert (by_key[t.key].data.tags[OUTCOME], by_key[t.key].info.status) == (FINISHED, "FINISHED")
    check_histories(client, by_key, trials, ["train.steps=150", "train.eval_every=10"])
