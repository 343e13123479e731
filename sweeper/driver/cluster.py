"""The Ray cluster a sweep runs on: a new local instance, or one joined at cluster.address; its storage.

A local instance is this machine: a trial reserving more than it has is refused before any trial starts.
A cluster is checked before the sweep relies on it: its address answers, and on several nodes
cluster.storage is one file system every node sees (trials resume from checkpoints written elsewhere).
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from omegaconf import DictConfig

from config.schema import ConfigError
from sweeper.errors import ClusterError
from training import faults


def join(cluster: DictConfig, storage: str | None) -> str | None:
    """Start or join Ray (cluster.address) and check the sweep's storage (sweeper.driver.home.storage), which
    Tune writes to; that storage."""
    connect(cluster)
    check_shared(storage)
    return storage


def identity() -> tuple[str, str]:
    """The joined Ray cluster's GCS address (HOST:PORT), which answers while the cluster lives, and its id,
    which a new cluster at that address does not share (a private attribute of Ray's: one pinned version)."""
    import ray

    return ray.get_runtime_context().gcs_address, ray._private.worker.global_worker.node.cluster_id.hex()


def reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the address, when nothing listens there (ray.init would retry for a minute)."""
    if address == "auto":
        return  # ray.init finds the local cluster's address file or says there is none
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    port = parts.port or (10001 if address.startswith("ray://") else 6379)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as err:
        raise ClusterError(
            f"Ray cluster cluster.address={address} is unreachable ({err}); start one with "
            "`ray start --head`, fix the address, or leave cluster.address unset for a local "
            "instance"
        ) from None


def dashboard_installed(host: str | None) -> bool:
    """Whether a local Ray can serve its dashboard at `host` (cluster.dashboard_host; null: none wanted).

    `pip install leaner-clustering` brings ray[tune] without the dashboard's packages (the `cluster` extra,
    ray[default], has them), and Ray refuses to start a dashboard it cannot run: the sweep then starts
    without one and says so once, rather than failing on the default configuration.
    """
    if host is None:
        return False
    try:
        import ray.dashboard.optional_deps  # noqa: F401 - what Ray itself imports to decide the same
    except ImportError as err:
        print(
            f"Ray's dashboard is off: its packages are missing ({err.name or err}); "
            "pip install 'ray[default]' brings them; cluster.dashboard_host=null silences this"
        )
        return False
    return True


# Ray 2.60 leaves CUDA_VISIBLE_DEVICES as the node has it for a task that reserves no GPU: a trial at
# cluster.gpus_per_trial=0 would see every GPU of its node and train there with train.device=auto, on GPUs
# other trials reserved. This restores Ray's hiding of them, in every worker of the sweep's job.
HIDE_UNRESERVED_GPUS = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}


def connect(cluster: DictConfig) -> None:
    import ray

    if ray.is_initialized():  # a caller (a notebook, the tests) already chose the Ray instance
        return
    # The job's workers, on whatever node and however Ray was started there, get these through its
    # runtime_env; the test-only faults set here too (none outside tests).
    runtime_env = {"env_vars": {**HIDE_UNRESERVED_GPUS, **(faults.environment() or {})}}
    if cluster.address is None:  # "local": a new instance, never another sweep's that happens to run here
        host = cluster.dashboard_host if dashboard_installed(cluster.dashboard_host) else None  # null: none
        # Ray raises a bare Exception or RuntimeError when its own processes do not come up in its time.
        try:
            ray.init(
                address="local",
                include_dashboard=host is not None,
                dashboard_host=host,
                runtime_env=runtime_env,
            )
        except Exception as err:
            raise ClusterError(did_not_start(err)) from None
        return
    reachable(cluster.address)
    try:
        ray.init(address=cluster.address, runtime_env=runtime_env)
    except ConnectionError as err:
        raise ClusterError(
            f"cannot join the Ray cluster at cluster.address={cluster.address}: {str(err).splitlines()[0]}"
        ) from None


def did_not_start(err: Exception) -> str:
    """What a sweep whose new local Ray instance failed to start says: Ray's own first line, and that nothing
    was started or recorded. Ray waits 30 s (a constant of its own) for its node to register: on a machine
    whose cores another process group holds, the node can miss that, and the same command later succeeds."""
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (
        f"a new local Ray instance did not start ({reason}); no trial was started and nothing recorded: run "
        "the same command again once the machine's cores are not all taken, or join a running instance "
        "with cluster.address"
    )


def check(cfg: DictConfig) -> None:
    """Refuse, before the store is touched (nothing to undo), a sweep this driver cannot run: on a cluster's
    head node (cluster.address=ray://) the driver, the MLflow writer, needs a store it reaches over HTTP; on a
    local instance every trial must fit this machine (check_this_machine)."""
    uri, address = cfg.tracking.uri, cfg.cluster.address or ""
    if address.startswith("ray://") and not uri.startswith(("http://", "https://")):
        raise ConfigError(
            f"cluster.address={address} runs the sweep driver, the MLflow writer, on the "
            f"cluster's head node: tracking.uri={uri} must be a server it reaches (http://HOST:PORT)"
        )
    check_this_machine(cfg.cluster)


def check_this_machine(cluster: DictConfig) -> None:
    """Refuse, before Ray starts or the store is opened, a trial that a new local Ray instance could never
    place (fits_this_machine), counting this machine's CPUs and GPUs as that instance will."""
    import ray

    if cluster.address is None and not ray.is_initialized():  # else: a cluster, or the caller's instance
        fits_this_machine(cluster, local_resources())


def local_resources() -> dict[str, float]:
    """The CPUs and GPUs a local Ray instance started here would have, counted by Ray's own code before it
    starts (cgroup limits, CUDA_VISIBLE_DEVICES, RAY_OVERRIDE_RESOURCES: as ray.init counts them). A private
    class of Ray's: pyproject.toml pins Ray's one version, and the sweep tests run this on it."""
    from ray._private.resource_and_label_spec import ResourceAndLabelSpec

    spec = ResourceAndLabelSpec().resolve(is_head=True, node_ip_address="127.0.0.1")
    return {"CPU": spec.num_cpus, "GPU": spec.num_gpus}


def fits_this_machine(cluster: DictConfig, resources: dict[str, float]) -> None:
    """A local Ray instance is this machine and grows no nodes: a trial reserving more CPUs or GPUs than it
    has would wait forever (Tune only warns), so the sweep is refused before any trial starts. A cluster's
    nodes may join later (an autoscaler): not checked there."""
    for resource, key in (("CPU", "cpus_per_trial"), ("GPU", "gpus_per_trial")):
        have, want = resources.get(resource, 0), cluster[key]
        if want > have:
            raise ConfigError(
                f"cluster.{key}={want:g} is not allowed with a local Ray instance (cluster.address=null): "
                f"this machine has {have:g} {resource}s; reserve at most that, or join a cluster that has "
                "more (cluster.address)"
            )


def check_shared(storage: str | None) -> None:
    """Storage every trial can resume from: on several nodes a local path must be one shared file system, and
    a URI (s3://, gs://) one the driver writes and every node reads, with its own credentials: tried from
    every node."""
    import ray
    from pyarrow import fs
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"]]
    if storage is None:
        if len(nodes) > 1:
            raise ClusterError(
                f"the Ray cluster has {len(nodes)} nodes: set cluster.storage to shared storage "
                "(a path mounted alike on every node, or s3://, gs://) so trials resume anywhere"
            )
        return
    if len(nodes) < 2 and "://" not in storage:
        return  # this machine's own disk
    marker = joined(storage, f".shared-{uuid.uuid4().hex}")
    try:
        filesystem, path = fs.FileSystem.from_uri(marker)
        filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        filesystem.open_output_stream(path).close()
    except (OSError, ValueError) as err:  # no credentials, no such bucket, an endpoint that does not answer
        raise ClusterError(
            f"cluster.storage={storage} cannot be written from the driver ({type(err).__name__}: {err}); "
            "for s3:// or gs://, give the driver and every node credentials (docs/cluster.md)"
        ) from None
    sees = ray.remote(num_cpus=0)(unseen)
    try:
        refs = [
            sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                marker
            )
            for n in nodes
        ]
        blind = [f"{node_name(n)} ({why})" for n, why in zip(nodes, ray.get(refs, timeout=120)) if why]
    finally:
        filesystem.delete_file(path)
    if blind:
        raise ClusterError(
            f"cluster.storage={storage} is not shared storage: nodes {', '.join(blind)} do not "
            "see it; on a multi-node cluster use a path mounted alike on every node, or s3://, gs:// with "
            "credentials on every node"
        )


def node_name(node: dict) -> str:
    """A node as messages name it: its address and the start of its Ray id (nodes may share a host)."""
    return f"{node['NodeManagerAddress']} {node['NodeID'][:8]}"


def joined(storage: str, name: str) -> str:
    """storage/name, a URI's query (endpoint_override=...) kept at its end."""
    if "://" not in storage:
        return str(Path(storage) / name)
    parts = urlsplit(storage)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}"))


def unseen(location: str) -> str | None:
    """On a node: None when it finds the file at `location` (a path or URI), else why not."""
    from pyarrow import fs

    try:
        filesystem, path = fs.FileSystem.from_uri(location)
        found = filesystem.get_file_info(path).type != fs.FileType.NotFound
    except (OSError, ValueError) as err:  # no credentials here, an endpoint this node does not reach
        return f"{type(err).__name__}: {err}"
    return None if found else "not found"
