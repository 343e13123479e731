"""cluster.storage as a URI (s3://, gs://): tried before the sweep relies on it (the driver writes it, every
node reads it, each with its own credentials), and a checkpoint's recorded location keeps the storage's
query (a custom endpoint), so that a restarted sweep resumes from it instead of step 0. No object store
runs here: one that does not answer stands for one without credentials, file:// for one that works."""

from __future__ import annotations

import pytest
from pyarrow import fs
from ray import tune
from support.servers import free_port

from sweeper.driver import cluster, writer
from sweeper.errors import ClusterError


@pytest.mark.slow  # a local Ray instance and a sweep's start: 15 s
def test_a_storage_uri_the_driver_cannot_write_is_refused_before_the_sweep(local_ray, monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    storage = f"s3://bucket/sweep?endpoint_override=127.0.0.1:{free_port()}&scheme=http"  # nothing listens
    with pytest.raises(
        ClusterError, match=r"cluster\.storage=s3://bucket/sweep\?.* cannot be written from the driver"
    ):
        cluster.check_shared(storage)


def test_a_storage_uri_every_node_reads_passes_and_leaves_nothing(local_ray, tmp_path):
    cluster.check_shared(f"file://{tmp_path}/ray")  # written by the driver, read back on the node
    assert list((tmp_path / "ray").iterdir()) == []


def test_a_checkpoints_recorded_location_keeps_the_storages_endpoint():
    storage = "s3://bucket/sweep?endpoint_override=127.0.0.1:9000&scheme=http"
    filesystem, path = fs.FileSystem.from_uri(storage)
    checkpoint = tune.Checkpoint(f"{path}/trial/checkpoint_000001", filesystem=filesystem)
    recorded = writer.checkpoint_uri(checkpoint, storage)
    assert (
        recorded == "s3://bucket/sweep/trial/checkpoint_000001?endpoint_override=127.0.0.1:9000&scheme=http"
    )
    # What a restarted sweep's trial opens (sweeper.driver.trial.restore).
    reopened = tune.Checkpoint(recorded)
    assert reopened.filesystem.equals(filesystem) and reopened.path == checkpoint.path
