"""Sweep stores (the runs of a sweep, what they hold) and sweep drivers as subprocesses: started, signalled,
killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from config import grid
from support.repo import REPO
from sweeper.driver import home
from sweeper.sweep import load
from tracking.names import CONFIG_HASH, OUTCOME, SWEEP, TUNE_CHECKPOINT


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


POLL_S = 0.5  # a store question costs the test ~50 ms of CPU: asked every 0.2 s, a fifth of a core


def wait_for(predicate, proc: subprocess.Popen | None, timeout: float, what: str) -> None:
    """Poll `predicate` until true; fail when `proc` (the sweep) ended first or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc is None or proc.poll() is None, f"the sweep ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(POLL_S)


def recorded_checkpoint(uri: str, run) -> Path:
    """Where the Tune checkpoint a run recorded lies (relative to the store's folder when it lies there)."""
    return Path(home.resolved(run.data.tags[TUNE_CHECKPOINT], uri))


def sweep_jobs(overrides: list[str]) -> list[grid.Job]:
    return list(load(overrides).jobs)


# ---- sweep drivers as subprocesses: started, signalled, killed ----


def start_sweep(
    overrides: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    cwd: Path = REPO,
) -> subprocess.Popen:
    """`python -m sweeper.sweep` in its own session (the driver, its local Ray and trials form one group);
    prefix: a command that runs it (`unshare ...`); cwd: its working directory (outside the repository, pass
    env=subprocess_env())."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*prefix, sys.executable, "-m", "sweeper.sweep", *overrides],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def run_sweep(
    overrides: list[str], env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """`python -m sweeper.sweep` to its end, its output captured (the same command a stopped driver resumes
    with)."""
    return subprocess.run(
        [sys.executable, "-m", "sweeper.sweep", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a start_sweep driver, its process group and whatever else of its session is left (a local
    Ray's daemons)."""
    _kill_group(proc.pid)
    proc.wait()
    _kill_rest(proc.pid)


def kill_session(leader: int) -> None:
    """kill_group for a session whose leader is not this process's child (another process started it)."""
    _kill_group(leader)
    _kill_rest(leader)


def left_behind(proc: subprocess.Popen, timeout: float = 30) -> list[str]:
    """The command lines of what still runs of an ended start_sweep driver's session after up to `timeout`
    s: nothing once its local Ray's daemons and workers stopped with it."""
    import psutil

    _, alive = psutil.wait_procs(_of_session(proc.pid), timeout=timeout)
    return [" ".join(_cmdline(p)) for p in alive]


def _kill_group(leader: int) -> None:
    try:
        os.killpg(leader, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_rest(leader: int) -> None:
    import psutil

    left = _of_session(leader)
    for p in left:
        p.kill()
    psutil.wait_procs(left, timeout=30)


def _of_session(leader: int) -> list:
    """The processes of the session `leader` started, but zombies (dead, their parent yet to reap them)."""
    import psutil

    return [p for p in psutil.process_iter() if _session(p) == leader and _status(p) != psutil.STATUS_ZOMBIE]


def _cmdline(p) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except psutil.Error:
        return [f"pid {p.pid}"]


def kill_when(predicate, proc: subprocess.Popen, timeout: float, what: str) -> None:
    """SIGKILL a start_sweep driver's group at a moment `predicate` (a question to the store) holds.

    The driver is the store's only writer, so it is stopped (SIGSTOP) while the predicate is asked again:
    what holds then still holds at the kill (a trial that ended meanwhile would otherwise make the
    test's mid-sweep state vanish). If it no longer holds, the driver continues and the wait goes on.
    """
    deadline = time.monotonic() + timeout
    while True:
        wait_for(lambda: _asks(predicate), proc, deadline - time.monotonic(), what)
        os.kill(proc.pid, signal.SIGSTOP)
        if _asks(predicate):
            kill_group(proc)
            return
        os.kill(proc.pid, signal.SIGCONT)


def _asks(predicate) -> bool:
    """predicate(), False where the store cannot answer (a stopped writer may hold SQLite's lock)."""
    try:
        return bool(predicate())
    except Exception:
        return False


def _session(p) -> int | None:
    try:
        return os.getsid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


def _status(p) -> str | None:
    import psutil

    try:
        return p.status()
    except psutil.Error:
        return None


def interrupted_runs(uri: str, sweep: str = "smoke", experiment: str = "leaner-clustering") -> dict:
    """Config hash -> run, for the runs whose Tune checkpoint the driver recorded and that have no outcome
    yet."""
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
