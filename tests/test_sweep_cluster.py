"""A simulated GPU cluster on this machine; a worker node dies mid-sweep; every model finishes once.

A head node declaring no GPU and two workers declaring one GPU and two CPUs each (`ray start
--num-gpus=1 --num-cpus=2`: Ray schedules by what a node declares, so the GPUs need not exist).
A packed sweep (cluster.pack=seeds) at cluster.gpus_per_trial=0.1 and cpus_per_trial=1 trains on
the CPU (train.device=cpu); Ray's own task records must show no trial on the head (it has no GPU) and at most
min(1 / 0.1, 2 / 1) = 2 trials at once per worker, reached on each. A worker is killed while
its trials have checkpoints; the sweep ends on the others with exactly one run per model, every
metric point once and equal to the model trained locally.

A driver joining a running cluster (the session's) hands its trials the test-only faults set in its own
environment (training/faults.py): a cluster's workers inherit their node's environment, not the driver's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support.configs import PACED
from support.histories import check_histories
from support.once import assert_every_job_once
from support.ray_nodes import RayNodes, peak_overlap, trial_spans
from support.sweeps import sweep_jobs, when

from config.compose import compose
from sweeper.driver import cluster
from sweeper.sweep import main
from tracking.names import FINISHED, OUTCOME
from training.faults import STEP_PAUSE

pytestmark = pytest.mark.slow

# dropout 0: packed equals solo (1e-5). 80 paced steps (tests/support/configs.py: trials sleep 50 ms a step on
# every node), 4 s a trial: four train at once and checkpoint before the kill, at the CPU of 80 steps.
BASE = ["train.steps=80", "train.eval_every=10", "model.dropout=0.0"]
SWEEP = [
    "sweep=smoke",
    "sweep.seeds=[1, 2]",
    *BASE,  # 6 configurations x 2 seeds: 6 trials of 2 models
    "sweep.subgrids=[{name: smoke, embedding: [onehot, binary, none], regularizer: [l2, ne]}]",
]
WORKER_CPUS, WORKER_GPUS = 2, 1
CPUS_PER_TRIAL, GPUS_PER_TRIAL = 1, 0.1
AT_ONCE = min(int(WORKER_GPUS / GPUS_PER_TRIAL), int(WORKER_CPUS / CPUS_PER_TRIAL))  # per worker: 2


@pytest.fixture
def nodes():
    import ray

    ray.shutdown()
    root = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    cluster = RayNodes(root, env=PACED)
    try:
        cluster.start("head", cpus=1, gpus=0, head=True)
        ray.init(address=cluster.address)  # the sweep's driver joins this connection
        for name in ("a", "b"):
            cluster.start(name, cpus=WORKER_CPUS, gpus=WORKER_GPUS)
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_simulated_gpu_cluster_packs_trials_per_node_and_survives_a_dead_worker(
    nodes, tmp_path, sqlite_uri, capfd
):
    ids = nodes.node_ids()
    uri = sqlite_uri
    storage = tmp_path / "ray"  # one file system for every node: the shared-storage check passes
    done = threading.Event()
    # A trial's checkpoints are pruned to its latest, and deleted once it ends (MlflowWriter): four at once
    # means four trials running, two of them on b (a holds two at most, the head none).
    running = 2 * AT_ONCE
    killer = when(
        lambda: len(list(storage.glob("smoke-*/*/checkpoint_*"))) >= running, lambda: nodes.kill("b"), done
    )
    try:
        code = main(
            [
                *SWEEP,
                f"tracking.uri={uri}",
                f"cluster.storage={storage}",
                f"cluster.address={nodes.address}",
                "cluster.pack=seeds",
                f"cluster.cpus_per_trial={CPUS_PER_TRIAL}",
                f"cluster.gpus_per_trial={GPUS_PER_TRIAL}",
                "train.device=cpu",  # the GPUs are declared, not present: auto would refuse to train
                "cluster.max_failures=3",
            ]
        )
    finally:
        done.set()
        killer.join()
    out = capfd.readouterr().out
    assert code == 0, out[-3000:]
    assert nodes.nodes["b"].proc.poll() is not None, "the worker node was never killed"
    retries = int(out.split(" retries;")[0].rsplit(";", 1)[1])
    assert retries >= 1, "no trial was running on the killed node"

    spans = trial_spans(nodes.dashboard)
    peaks = {name: peak_overlap(spans.get(node_id, [])) for name, node_id in ids.items()}
    assert peaks == {"head": 0, "a": AT_ONCE, "b": AT_ONCE}, peaks

    trials = sweep_jobs(SWEEP)
    by_key = assert_every_job_once(uri, "leaner-clustering", trials)  # check_histories: every point once
    print(
        f"simulated GPU cluster: {len(trials) // 2} trials of 2 models on 3 nodes (head 0 GPUs, 2 workers "
        f"of {WORKER_GPUS} GPU, {WORKER_CPUS} CPUs); "
        f"peak trials at once per node {peaks} (allowed {AT_ONCE}); "
        f"worker b killed, {retries} retries; runs {len(by_key)}, duplicates 0, lost 0"
    )
    for t in trials:
        assert (by_key[t.key].data.tags[OUTCOME], by_key[t.key].info.status) == (FINISHED, "FINISHED")
    check_histories(MlflowClient(tracking_uri=uri), by_key, trials, BASE, packed=True)


def test_a_driver_joining_a_cluster_hands_its_workers_the_test_faults(ray_cluster, monkeypatch):
    import ray

    ray.shutdown()
    monkeypatch.setenv(STEP_PAUSE, "0.05")  # the session's head was started without it (support.ray_nodes)
    try:
        cluster.connect(compose([ray_cluster]).cluster)
        seen = ray.get(ray.remote(num_cpus=0)(lambda: os.environ.get(STEP_PAUSE)).remote())
    finally:
        ray.shutdown()
    assert seen == "0.05"
