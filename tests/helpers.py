"""Plain helpers shared by the tests (fixtures live in conftest.py): `from helpers import ...`."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from config import grid
from config.compose import compose
from config.identity import run_overrides
from sweeper.sweep import load
from tracking.names import CONFIG_HASH, METRICS, OUTCOME, SWEEP, TRAIN_LOSS, TUNE_CHECKPOINT

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def subprocess_env() -> dict[str, str]:
    """Environment for `python -m sweeper...` subprocesses run outside the repository root."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# MLflow 3's server also starts a job runner (huey consumers, outside its process group) that these tests
# never
# use: off, so stopping a server stops all of it.
SERVER_ENV = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM a process started with start_new_session=True and its children; SIGKILL after `timeout` s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 at a fixed free port over `backend` (any store URI), artifacts in `root`.

    stop() and start() again on the same port: a tracking-server outage, as clients see one.
    """

    START_TIMEOUT_S = 180  # a cold `mlflow server` on two busy cores takes a while

    def __init__(self, backend: str, root: Path) -> None:
        self.backend, self.root, self.port = backend, root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--backend-store-uri",
            self.backend,
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--workers",
            "1",
        ]
        with open(self.log, "ab") as out:  # its own process group: the server forks workers, stopped together
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=SERVER_ENV,
                start_new_session=True,
            )
        wait_until_up(self.uri, self.proc, self.log, self.START_TIMEOUT_S)

    def stop(self) -> None:
        try:
            stop_group(self.proc, timeout=20)
        except ProcessLookupError:  # already stopped
            pass


def wait_until_up(uri: str, proc: subprocess.Popen, log: Path, seconds: float) -> None:
    """Wait until the MLflow server `proc` at `uri` answers /health; its `log` is in the error if it does not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(
        f"mlflow server at {uri} did not answer within {seconds} s:\n{log.read_text()[-3000:]}"
    )


# README's code blocks (tests/test_docs.py explains the `<!-- runnable -->` markers).
@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    text: str
    runnable: bool
    smoke: list[str]


def blocks(lang: str = "bash") -> list[Block]:
    lines = README.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{lang}":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            marker = lines[i - 1].strip() if i else ""
            runnable = re.fullmatch(r"<!-- runnable( smoke=\"[^\"]*\")? -->", marker) is not None
            smoke = re.search(r'smoke="([^"]*)"', marker)
            out.append(
                Block(i + 1, "\n".join(lines[i + 1 : end]), runnable, smoke.group(1).split() if smoke else [])
            )
            i = end
        i += 1
    return out


def commands(text: str) -> list[list[str]]:
    """Shell commands of a block: continuation lines joined, comments and heredoc bodies dropped."""
    text = re.sub(r"<<'EOF'\n.*?\nEOF", "", text, flags=re.S).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            words = shlex.split(line)
            cuts = [-1] + [i for i, w in enumerate(words) if w == "&&"] + [len(words)]
            out += [words[a + 1 : b] for a, b in zip(cuts, cuts[1:])]
            # a command quoted inside another (`ray exec CLUSTER "cd /app && python -m ..."`)
            out += [c for w in words if " " in w and "python -m" in w for c in commands(w)]
            # the entrypoint of a Ray job (`ray job submit --address URL -- python -m ...`)
            if words[:3] == ["ray", "job", "submit"] and "--" in words:
                out.append(words[words.index("--") + 1 :])
    return out


# ---- sweep stores: the runs of a sweep and their metric points against local training ----


def children(uri: str, sweep: str, experiment: str = "leaner-clustering") -> list:
    """The runs of a sweep (its parent run left out)."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(experiment)
    runs = client.search_runs([experiment.experiment_id], f"tags.{SWEEP} LIKE '%{sweep}%'", max_results=5000)
    return [r for r in runs if CONFIG_HASH in r.data.tags and sweep in r.data.tags[SWEEP].split(",")]


def most_at_once(runs: list) -> int:
    """Most runs open at once, from their start and end times: the trials that really ran concurrently."""
    spans = [(r.info.start_time, r.info.end_time) for r in runs]
    return max(sum(a <= start < b for a, b in spans) for start, _ in spans)


def wait_for(predicate, proc: subprocess.Popen | None, timeout: float, what: str) -> None:
    """Poll `predicate` until true; fail when `proc` (the sweep) ended first or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc is None or proc.poll() is None, f"the sweep ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def point_counts(client: MlflowClient, runs: list, overrides: list[str]) -> tuple[int, int, int]:
    """(points stored, duplicated, lost) over `runs`, each against the points its configuration logs once.

    overrides: the sweep's base overrides; a run's own configuration comes from its params.
    """
    stored = duplicated = lost = 0
    for run in runs:
        want = expected_counts(compose([*overrides, *run_overrides(run.data.params)]))
        for key, points in histories(client, run.info.run_id).items():
            steps = [s for s, _ in points]
            stored += len(steps)
            duplicated += len(steps) - len(set(steps))
            lost += max(want[key] - len(set(steps)), 0)
    return stored, duplicated, lost


def histories(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in METRICS}


def expected_counts(cfg) -> dict[str, int]:
    """Points a run of cfg logs: train_loss every log_every steps; the rest at step 0, every eval_every, the end."""
    t = cfg.train
    evals = len({0, t.steps} | set(range(t.eval_every, t.steps + 1, t.eval_every)))
    return {key: (t.steps // t.log_every if key == TRAIN_LOSS else evals) for key in METRICS}


LOCAL = """
import json, sys, tempfile, torch
from config.compose import compose
from tracking.recorder import MemoryRecorder
from training.loop import train
torch.set_num_threads(1)
out = []
for overrides in json.load(sys.stdin):
    recorder = MemoryRecorder()
    train(compose(overrides), recorder, tempfile.mkdtemp())
    out.append({key: sorted(points) for key, points in recorder.metrics.items()})
print(json.dumps(out))
"""


_TRAINED: dict[str, dict[str, list[tuple[int, float]]]] = {}  # overrides (JSON) -> histories, this session


def local_histories(runs: list[list[str]]) -> list[dict[str, list[tuple[int, float]]]]:
    """Each configuration trained locally in a fresh process with one thread, as a trial with
    cluster.cpus_per_trial <= 1 runs (torch's CPU results depend on the thread count).

    Training is deterministic, so a configuration another test of the session trained is not trained
    again (tests/test_sweep.py checks the smoke grid's nine models against a SQLite file and a server)."""
    missing = [r for r in runs if json.dumps(r) not in _TRAINED]
    if missing:
        done = subprocess.run(
            [sys.executable, "-c", LOCAL],
            cwd=REPO,
            input=json.dumps(missing),
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        for r, h in zip(missing, json.loads(done.stdout)):
            _TRAINED[json.dumps(r)] = {key: [tuple(p) for p in points] for key, points in h.items()}
    return [_TRAINED[json.dumps(r)] for r in runs]


def check_histories(
    client: MlflowClient, by_key: dict, jobs: list[grid.Job], base: list[str], packed: bool = False
) -> None:
    """Every metric point once (counted from the config) and equal to a local run of the same config and seed:
    exactly, or to 1e-5 for models trained in a pack (batched matmuls sum in another order)."""
    runs = [[*base, *t.configuration.override_strings(), f"seed={t.seed}"] for t in jobs]
    for t, overrides, want in zip(jobs, runs, local_histories(runs)):
        got = histories(client, by_key[t.key].info.run_id)
        assert {k: len(v) for k, v in got.items()} == expected_counts(compose(overrides)), t.name  # none lost
        if not packed:
            assert got == want, t.name  # none duplicated, the same numbers
            continue
        for key in METRICS:
            assert [s for s, _ in got[key]] == [s for s, _ in want[key]], (t.name, key)
            assert [v for _, v in got[key]] == pytest.approx([v for _, v in want[key]], rel=1e-5, abs=1e-6), (
                key
            )


def sweep_jobs(overrides: list[str]) -> list[grid.Job]:
    cfg, plan = load(overrides)
    return grid.jobs(cfg, plan)


# ---- sweep drivers as subprocesses: started, signalled, killed ----


def start_sweep(overrides: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m sweeper.sweep` in its own session (the driver, its local Ray and trials form one group)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sweeper.sweep", *overrides],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a start_sweep driver, its process group and whatever else of its session is left (Ray's daemons)."""
    import psutil

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    left = [p for p in psutil.process_iter() if _session(p) == proc.pid]
    for p in left:
        p.kill()
    psutil.wait_procs(left, timeout=30)


def _session(p) -> int | None:
    try:
        return os.getsid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


def interrupted_runs(uri: str, sweep: str = "smoke", experiment: str = "leaner-clustering") -> dict:
    """Config hash -> run, for the runs whose Tune checkpoint the driver recorded and that have no outcome yet."""
    try:
        runs = children(uri, sweep, experiment)
    except Exception:  # the store or its experiment does not exist yet
        return {}
    return {
        r.data.tags[CONFIG_HASH]: r
        for r in runs
        if OUTCOME not in r.data.tags and TUNE_CHECKPOINT in r.data.tags
    }


def ended_runs(uri: str, sweep: str = "smoke", experiment: str = "leaner-clustering") -> list:
    try:
        return [r for r in children(uri, sweep, experiment) if OUTCOME in r.data.tags]
    except Exception:
        return []


# ---- a Ray cluster of `ray start` nodes on this machine, and what Ray recorded of its trials ----
# (tests/test_sweep_cluster.py; helper block of the simulated GPU cluster)


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

    def __init__(self, root: Path) -> None:
        self.root = root  # keep it short: Ray's unix socket paths live under it (root/ray); node logs beside
        self.nodes: dict[str, RayNode] = {}
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{free_port()}"

    def start(self, name: str, cpus: float, gpus: int, head: bool = False) -> RayNode:
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
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}",
                f"--ray-client-server-port={free_port()}",
            ]
        else:
            args += [f"--address={self.address}"]
        log = open(self.root / f"{name}.log", "wb")
        ray = Path(sys.executable).parent / "ray"
        # No token authentication (a token in ~/.ray would switch it on): the test's driver connects as is.
        proc = subprocess.Popen(
            [str(ray), "start", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )
        self.nodes[name] = RayNode(name, proc, manager, cpus, gpus)
        if head:
            self._wait(lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close() or True)
        else:  # one node at a time: on two busy cores a second raylet starting alongside can time out
            self.node_ids()
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
            kill_group(node.proc)


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


def when(condition, action, done: threading.Event, every: float = 0.5) -> threading.Thread:
    """A thread that runs action() once condition() holds, checking every `every` s until `done` is set."""

    def run() -> None:
        while not done.wait(every):
            if condition():
                action()
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
