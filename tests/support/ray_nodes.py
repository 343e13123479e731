"""A Ray cluster of `ray start` nodes on this machine (tests/test_sweep_cluster.py; docs/cluster.md's
simulated GPU cluster), the test session's one-node cluster, and what Ray recorded of a cluster's trials."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from support.servers import free_port
from training.faults import VARIABLES as FAULTS


@dataclass
class RayNode:
    name: str
    proc: subprocess.Popen
    node_manager_port: int
    cpus: float
    gpus: int


class RayNodes:
    """A head and workers, each `ray start --block` in its own process group with its own ports and its
    declared CPUs and GPUs (Ray schedules by what a node declares: GPUs need not exist). Only these
    processes are ever signalled."""

    def __init__(self, root: Path, env: dict[str, str] | None = None, dashboard: bool = True) -> None:
        self.root = root  # keep it short: Ray's unix socket paths live under it (root/ray); node logs beside
        # Every node's environment, which its workers inherit: this process's without the test-only faults
        # (training/faults.py), plus `env`.
        self.env = {**{k: v for k, v in os.environ.items() if k not in FAULTS}, **(env or {})}
        self.with_dashboard = dashboard
        self.nodes: dict[str, RayNode] = {}
        self._head_ports()

    def _head_ports(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{free_port()}" if self.with_dashboard else None

    def start(
        self, name: str, cpus: float, gpus: int, head: bool = False, wrap: tuple[str, ...] = ()
    ) -> RayNode:
        """Start node `name` and wait until it is up. A node whose `ray start` exits while starting is
        started once more on new free ports: between free_port() and the raylet's bind another process can
        take one (two pytest workers start Ray at once; seen as "Address already in use"). `wrap`: a command
        that runs `ray start` (its words follow), such as one giving the node a file system of its own."""
        node = self._launch(name, cpus, gpus, head, wrap)
        try:
            self._up(head)
        except AssertionError:
            if node.proc.poll() is None:  # not an exit: a node up too late, which a new start won't mend
                raise
            _kill(node)
            if head:
                self._head_ports()
            node = self._launch(name, cpus, gpus, head, wrap)
            self._up(head)
        return node

    def _up(self, head: bool) -> None:
        if head:
            self._wait(lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close() or True)
        else:  # one node at a time: on two busy cores a second raylet starting alongside can time out
            self.node_ids()

    def _launch(self, name: str, cpus: float, gpus: int, head: bool, wrap: tuple[str, ...] = ()) -> RayNode:
        manager = free_port()
        args = [
            "--block",
            f"--num-cpus={cpus}",
            f"--num-gpus={gpus}",
            f"--node-manager-port={manager}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--object-store-memory=80000000",
            "--disable-usage-stats",
        ]
        if head:
            args += [
                "--head",
                f"--port={self.port}",
                f"--temp-dir={self.root / 'ray'}",
                f"--ray-client-server-port={free_port()}",
                f"--include-dashboard={str(self.dashboard is not None).lower()}",
            ]
            if self.dashboard:
                args += ["--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}"]
        else:
            args += [f"--address={self.address}"]
        log = open(self.root / f"{name}.log", "wb")
        ray = Path(sys.executable).parent / "ray"
        # No token authentication (a token in ~/.ray would switch it on): the test's driver connects as is.
        proc = subprocess.Popen(
            [*wrap, str(ray), "start", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**self.env, "RAY_AUTH_MODE": "disabled"},
        )
        self.nodes[name] = RayNode(name, proc, manager, cpus, gpus)
        return self.nodes[name]

    def _wait(self, ready, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            dead = [n.name for n in self.nodes.values() if n.proc.poll() is not None]
            assert not dead, f"ray start exited: {dead}:\n" + "\n".join(
                (self.root / f"{name}.log").read_text()[-2000:] for name in dead
            )
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"Ray nodes not up within {seconds} s; logs in {self.root}")

    def node_ids(self) -> dict[str, str]:
        """Node name -> Ray's NodeID, once every started node is alive (the driver is connected first)."""
        import ray

        def alive() -> dict[int, str]:
            return {n["NodeManagerPort"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}

        self._wait(lambda: {n.node_manager_port for n in self.nodes.values()} <= set(alive()))
        by_port = alive()
        return {n.name: by_port[n.node_manager_port] for n in self.nodes.values()}

    def kill(self, name: str) -> None:
        """The node dies at once, as a machine that fails: SIGKILL to its raylet and everything it started."""
        os.killpg(self.nodes[name].proc.pid, signal.SIGKILL)
        self.nodes[name].proc.wait()

    def stop(self) -> None:
        """Every node killed as kill() does, with what is left of its session: a graceful `ray start`
        shutdown takes the whole half minute per node on two busy cores, and no test reads what it saves."""
        for node in self.nodes.values():
            _kill(node)


def _kill(node: RayNode) -> None:
    from support.sweeps import kill_group  # here: tests/conftest.py imports this module, sweeps MLflow

    kill_group(node.proc)


# The session cluster's head (tests/conftest.py, ray_cluster): CPUs for two sweeps at once, one from each of
# make test's two pytest workers, each taking at most two (cluster.max_concurrent), as on a local instance of
# this 2-core machine.
SESSION_CPUS = 4
SESSION_RECORD = "ray-head.json"  # in the session's shared folder: the head's address, process and folder


def session_head(shared: Path) -> str:
    """The address of the test session's one-node Ray cluster: a head node (no dashboard) started by the
    first process to ask, recorded in `shared`, the session's folder (a file lock there makes the others
    wait), for them and for stop_session_head. Its session is its own: no pytest worker's end stops it."""
    record = shared / SESSION_RECORD
    with FileLock(str(shared / "ray-head.lock")):
        if not record.exists():
            record.write_text(json.dumps(_start_head()))
        return json.loads(record.read_text())["address"]


def _start_head() -> dict:
    root = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    nodes = RayNodes(root, dashboard=False)
    try:
        head = nodes.start("head", cpus=SESSION_CPUS, gpus=0, head=True)
    except BaseException:
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    return {"address": nodes.address, "leader": head.proc.pid, "root": str(root)}


def stop_session_head(shared: Path) -> None:
    """The session's head node, if one was started, killed with everything of its session (its raylet's
    workers), and its folder removed."""
    record = shared / SESSION_RECORD
    if not record.exists():
        return
    from support.sweeps import kill_session  # here: tests/conftest.py imports this module, sweeps MLflow

    head = json.loads(record.read_text())
    kill_session(head["leader"])
    shutil.rmtree(head["root"], ignore_errors=True)
    record.unlink()


def trial_spans(dashboard: str) -> dict[str, list[tuple[float, float]]]:
    """From Ray's task records: per node id, each Tune trial actor's span from its first `train` call's
    start to its last one's end (an actor runs one trial at a time and holds its resources throughout)."""
    from ray.util.state import list_tasks

    spans: dict[tuple[str, str], list[float]] = {}
    now = time.time() * 1000
    for task in list_tasks(
        address=dashboard,
        filters=[("type", "=", "ACTOR_TASK")],
        detail=True,
        limit=10_000,
        raise_on_missing_output=False,
    ):
        if not task.func_or_class_name.endswith(".train") or task.start_time_ms is None:
            continue
        span = spans.setdefault((task.node_id, task.actor_id), [float("inf"), 0.0])
        span[0] = min(span[0], task.start_time_ms)
        span[1] = max(span[1], task.end_time_ms or now)  # no end: its node died under it
    out: dict[str, list[tuple[float, float]]] = {}
    for (node, _), (start, end) in spans.items():
        out.setdefault(node, []).append((start, end))
    return out


def peak_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (an end before a start at the same time)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    peak = running = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak
