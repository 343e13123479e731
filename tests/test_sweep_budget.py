"""A sweep run in allocations (cluster.time_budget_s), its folder moved, archived, deleted and unpacked
between them: the same command goes on, and no number changes.

One packed sweep (2 configurations x 2 seeds, the seeds of a configuration in one trial, dropout on, so the
packs draw their dropout masks together) runs as the same command in a working directory of its own, its
store at sqlite:///A/mlflow.db, relative, as a user types it. Allocation 0's budget is spent before Ray
starts; the next stop mid-trial with code 75 (training steps are paced by training.faults so that a trial
outlasts an allocation; pacing changes no number). Then the folder is moved (A -> B) and opened there,
archived with python -m sweeper.archive, deleted and unpacked as C with python -m sweeper.unpack, and the
last allocation, unpaced, ends the sweep. In the end: every run once (continued, not replaced), every
metric point once, each equal bit for bit to the same packs trained here without a stop; nothing in the
working directory but the sweep's folder, nothing in ~/ray_results.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support.configs import FOUR_TRIALS
from support.histories import histories
from support.once import Stored, assert_every_job_once_every_point_once
from support.repo import subprocess_env
from support.sweeps import children, sweep_jobs

from config.compose import compose
from tracking import store
from tracking.names import CONFIG_HASH, DIVERGED, FINISHED, OUTCOME, TUNE_CHECKPOINT
from tracking.recorder import MemoryRecorder
from training.faults import NAN_AT_STEP, STEP_PAUSE
from training.packed import train_pack

pytestmark = pytest.mark.slow

SWEEP = [*FOUR_TRIALS, "train.steps=240", "cluster.pack=seeds", "cluster.cpus_per_trial=1"]
BUDGET_S = 30  # an allocation: the driver's start (5-20 s here) and part of a paced trial
BUDGET_STEP_S = 10  # each next try's budget is longer: on a loaded machine the start alone outlasts 30 s
PAUSE_S = 0.2  # before every training step: a trial of 240 steps outlasts an allocation (48 s)
STOP_BOUND_S = 90  # a stopped driver is gone this soon after its budget
MOST_ALLOCATIONS = 6  # to stop one mid-trial: a start slower than the budget stops before any checkpoint


def allocation(
    home: Path, cwd: Path, budget: float, env: dict, *more: str, sweep: list[str] = SWEEP
) -> subprocess.CompletedProcess:
    uri = f"sqlite:///{home.name}/mlflow.db"  # relative to the working directory, as a user types it
    command = [sys.executable, "-m", "sweeper.sweep", *sweep, f"tracking.uri={uri}", *more]
    command.append(f"cluster.time_budget_s={budget}")
    started = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    assert done.returncode in (0, 75), done.stdout[-3000:] + done.stderr[-3000:]
    assert took < budget + STOP_BOUND_S, f"the driver took {took:.0f} s on a budget of {budget} s"
    return done


def archived_and_unpacked(home: Path, elsewhere: Path) -> Path:
    """Archive `home` (into `elsewhere`), delete it and unpack it as C beside it."""
    archive = elsewhere / "sweep.tar.gz"
    packing = subprocess.run(
        [sys.executable, "-m", "sweeper.archive", str(home), "--out", str(archive)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert packing.returncode == 0 and "MB" in packing.stdout, packing.stdout + packing.stderr
    shutil.rmtree(home)
    command = [sys.executable, "-m", "sweeper.unpack", str(archive), str(elsewhere / "unpacked")]
    unpacking = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True)
    assert unpacking.returncode == 0 and "point tracking.uri at" in unpacking.stdout, unpacking.stderr
    return (elsewhere / "unpacked" / home.name).rename(home.with_name("C"))


def children_of(home: Path) -> dict:
    return {r.data.tags[CONFIG_HASH]: r for r in children(f"sqlite:///{home}/mlflow.db", "smoke")}


def unstopped(jobs) -> dict[str, dict]:
    """Each job's metric points from its pack trained here without a stop, as the sweep's trials train it."""
    by_config: dict[tuple, list] = {}
    for job in jobs:
        by_config.setdefault(tuple(job.configuration.override_strings()), []).append(job)
    points = {}
    for pack in by_config.values():
        cfgs = [compose([*SWEEP, *j.configuration.override_strings(), f"seed={j.seed}"]) for j in pack]
        recorders = [MemoryRecorder() for _ in pack]
        with tempfile.TemporaryDirectory() as root:
            train_pack(cfgs, recorders, [Path(root) / j.key for j in pack])
        for job, recorder in zip(pack, recorders):
            points[job.key] = {k: sorted(v) for k, v in recorder.metrics.items()}
    return points


def workspace(tmp_path: Path) -> tuple[Path, Path, Path, dict]:
    """A working directory, a HOME of the test's own, the sweep's folder A in the first, the paced env."""
    cwd, fake_home = tmp_path / "work", tmp_path / "home"
    (cwd / "A").mkdir(parents=True)
    fake_home.mkdir()
    return cwd, fake_home, cwd / "A", {**subprocess_env(), STEP_PAUSE: str(PAUSE_S), "HOME": str(fake_home)}


def stopped_mid_trial(home: Path, cwd: Path, env: dict) -> dict:
    """Allocations until one stops a trial after its first checkpoint: the runs it stopped, by config_hash."""
    for attempt in range(MOST_ALLOCATIONS):
        budget = BUDGET_S + BUDGET_STEP_S * attempt
        stopped = allocation(home, cwd, budget, env)
        assert stopped.returncode == 75, "the sweep ended within one allocation: no stop mid-trial"
        assert f"stopped at its time budget ({budget} s)" in stopped.stdout, stopped.stdout[-3000:]
        assert "model-steps done" in stopped.stdout
        assert "Resume with the same command:" in stopped.stdout
        interrupted = {k: r for k, r in children_of(home).items() if TUNE_CHECKPOINT in r.data.tags}
        if interrupted:
            break  # else it stopped before a trial checkpointed: the next allocation starts it again
    assert interrupted, f"no allocation of {MOST_ALLOCATIONS} stopped a trial after its first checkpoint"
    assert all(r.info.status == "KILLED" and OUTCOME not in r.data.tags for r in interrupted.values())
    assert all(not Path(r.data.tags[TUNE_CHECKPOINT]).is_absolute() for r in interrupted.values())
    return interrupted


def ended_as_unstopped(uri: str, interrupted: dict) -> tuple[Stored, list]:
    """Every job's run once, finished, the stopped ones continued; every point once, bit for bit as the same
    packs trained here without a stop. The store (support.once.Stored) and its runs."""
    jobs = sweep_jobs(SWEEP)
    stored = assert_every_job_once_every_point_once(uri, "leaner-clustering", jobs, SWEEP)
    for key, run in interrupted.items():
        assert stored.runs[key].info.run_id == run.info.run_id  # continued, not replaced
    runs = list(stored.runs.values())
    assert all((r.data.tags[OUTCOME], r.info.status) == (FINISHED, "FINISHED") for r in runs)
    want, client = unstopped(jobs), MlflowClient(tracking_uri=uri)
    for job in jobs:
        assert histories(client, stored.runs[job.key].info.run_id) == want[job.key], job.name  # bit for bit
    return stored, runs


def test_a_sweep_in_allocations_moved_and_archived_between_them_goes_on_with_the_same_numbers(tmp_path):
    cwd, fake_home, home, env = workspace(tmp_path)

    first = allocation(home, cwd, 1, env)  # spent before Ray starts: nothing begun, exit 75
    assert first.returncode == 75, first.stdout
    assert "stopped at its time budget (1 s) before any trial started" in first.stdout
    assert "0 of 960 model-steps done" in first.stdout

    interrupted = stopped_mid_trial(home, cwd, env)
    home = home.rename(home.with_name("B"))
    store.connect(f"sqlite:///{home}/mlflow.db")  # opened where it moved: its artifact locations mended
    home = archived_and_unpacked(home, tmp_path)
    del env[STEP_PAUSE]  # the last allocation at full speed: pacing changes no number
    done = allocation(home, cwd, 600, env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"was moved from {tmp_path / 'work' / 'B'}" in done.stdout  # archived from B, opened as C

    uri = f"sqlite:///{home}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    stored, runs = ended_as_unstopped(uri, interrupted)
    for run in runs:  # the artifacts moved with the store: a finished run's checkpoints read here
        assert Path(client.download_artifacts(run.info.run_id, "checkpoints/last.pt", str(tmp_path))).exists()
    assert [p.name for p in cwd.iterdir()] == ["C"]  # the sweep's folder, and nothing else
    assert not (fake_home / "ray_results").exists()
    print(
        f"{len(interrupted)} runs stopped mid-trial and resumed after a move and an archive; "
        f"{stored.points} points"
    )


def test_a_sweep_whose_checkpoints_are_lost_starts_its_stopped_models_over(tmp_path):
    """An allocation stops trials mid-way; then their Ray storage is gone (a lean archive committed without
    its checkpoints, to fit a size limit, or a node's disk lost): the next allocation trains those models
    again from step 0, saying so, continues their runs, and stores every point once, the same numbers."""
    cwd, _, home, env = workspace(tmp_path)
    interrupted = stopped_mid_trial(home, cwd, env)
    shutil.rmtree(home / "ray")
    del env[STEP_PAUSE]
    done = allocation(home, cwd, 600, env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "starting from step 0" in done.stdout and "trial: resuming from" not in done.stdout, done.stdout
    ended_as_unstopped(f"sqlite:///{home}/mlflow.db", interrupted)


# Trials may start in the driver's first 60 s (after Ray's start, 5-20 s); two run at once, each model its own
# trial, paced to 96 s, the first diverging (a NaN loss) at step DIVERGE_AT, about a minute after its start.
DRAIN_BUDGET_S, DRAIN_S, DIVERGE_AT = 300, 240, 300
DRAIN_SWEEP = [
    *(a for a in SWEEP if not a.startswith(("train.steps=", "cluster.pack="))),
    "train.steps=480",
    "cluster.pack=none",
]


def test_a_drained_allocation_ends_where_its_trials_end(tmp_path):
    """cluster.drain_s: in the budget's last DRAIN_S seconds no trial starts, and the driver stops once none
    runs. Two trials run at once (Ray given 2 CPUs, one a trial) and two wait, their actors asked of Ray by
    Tune whatever the scheduler chooses: the first trial ends (diverged) in the drain while the second still
    runs, and the next must not start in its place (in allocation 7 of the extension two did). The second
    runs to its end (its run finished, no checkpoint left to carry), the last two never start, and the driver
    stops when the second ends (exit 75, about two minutes in), long before its budget, saying why. The same
    command without a drain then ends the sweep. First, a drain that holds from the driver's first seconds,
    before Tune has asked Ray for any trial (a crash once, exit 1: Tune's reporter read the path of trials it
    had never asked for): nothing starts, nothing is recorded, exit 75."""
    cwd, home = tmp_path, tmp_path / "A"
    home.mkdir()
    first = sweep_jobs(DRAIN_SWEEP)[0]  # the first trial (cluster.pack=none: a job each, in the plan order)
    env = {
        **subprocess_env(),
        STEP_PAUSE: str(PAUSE_S),
        NAN_AT_STEP: f"{DIVERGE_AT}@{first.key}",
        "HOME": str(tmp_path),
        "RAY_OVERRIDE_RESOURCES": '{"CPU": 2}',  # two trials at once, on any machine
    }
    at_once = allocation(
        home, cwd, DRAIN_BUDGET_S, env, f"cluster.drain_s={DRAIN_BUDGET_S - 1}", sweep=DRAIN_SWEEP
    )
    assert at_once.returncode == 75, at_once.stdout[-3000:]
    assert f"stopped in its time budget's drain (its last {DRAIN_BUDGET_S - 1} s" in at_once.stdout
    assert "models: 0 finished, 0 stopped at a checkpoint, 4 not started" in at_once.stdout
    assert not children_of(home)
    for _ in range(3):  # a start slower than the window (a loaded machine) starts nothing: again
        started = time.monotonic()
        drained = allocation(home, cwd, DRAIN_BUDGET_S, env, f"cluster.drain_s={DRAIN_S}", sweep=DRAIN_SWEEP)
        took = time.monotonic() - started
        assert drained.returncode == 75, drained.stdout[-3000:]
        reason = f"stopped in its time budget's drain (its last {DRAIN_S} s of {DRAIN_BUDGET_S} s)"
        assert reason in drained.stdout, drained.stdout[-3000:]
        if children_of(home):
            break
    outcomes = sorted(r.data.tags.get(OUTCOME) for r in children_of(home).values())
    assert outcomes == sorted([DIVERGED, FINISHED]), (outcomes, drained.stdout[-3000:])
    assert not any(TUNE_CHECKPOINT in r.data.tags for r in children_of(home).values())
    assert took < DRAIN_BUDGET_S - 60, f"the driver took {took:.0f} s: it waited for its budget"
    assert "models: 2 finished, 0 stopped at a checkpoint, 2 not started" in drained.stdout
    del env[STEP_PAUSE]
    done = allocation(home, cwd, 600, env, sweep=DRAIN_SWEEP)
    assert done.returncode == 0, done.stdout[-3000:]
    outcomes = sorted(r.data.tags.get(OUTCOME) for r in children_of(home).values())
    assert outcomes == sorted([DIVERGED, FINISHED, FINISHED, FINISHED])
