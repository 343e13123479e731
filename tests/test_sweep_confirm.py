"""The guard before a large sweep (sweeper.driver.confirm) and the second Ctrl-C (sweeper.driver.stop.Halt).

Above sweep.confirm_trials trials or sweep.confirm_hours device-hours the sweep command asks before it
launches: y/N on a terminal (a pty here), one line and exit 11 without one, nothing started and nothing
recorded either way unless confirmed; `--yes` and sweep.confirm=false launch it unasked, and so does a resume
of a sweep launched before at its size. A second SIGINT ends a real sweep at once and leaves no run of it
RUNNING in its SQLite store: its trials' runs and its parent are KILLED."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support.configs import FOUR_TRIALS, NO_DASHBOARD, ONE_TRIAL, PACED
from support.repo import REPO, subprocess_env
from support.sweeps import children, interrupted_runs, kill_group, left_behind, start_sweep, wait_for

from cli import exit_codes
from config.grid import Sweep
from sweeper.driver import confirm, cost
from sweeper.errors import NotConfirmed
from sweeper.sweep import load, main
from tracking.names import COMMAND

SCRIPT = os.path.join(os.path.dirname(sys.executable), "leaner-sweep")
SMOKE = ["sweep=smoke", "train.device=cpu"]  # 3 configurations x 2 seeds = 6 trials
REFUSED = (
    "error: sweep smoke is above what launches unasked (6 trials > sweep.confirm_trials=5) and there is no "
    "terminal to ask: launch it with --yes or sweep.confirm=false"
)


def guard(sweep: Sweep) -> None:
    """The guard as the sweep command calls it, unconfirmed: with its thresholds and its plan's estimate."""
    priced = cost.reckon(sweep.cfg, sweep.plan).priced
    confirm.check(sweep, confirm.thresholds(sweep.cfg.sweep), priced, yes=False)


def step_seconds(folder: Path, seconds_per_step: float) -> Path:
    """A step-times file as `python -m bench step_seconds --out FILE` writes it, one row for every shape."""
    path = folder / "step_seconds.json"
    row = {"config": {"train.device": "cpu"}, "seconds_per_step": seconds_per_step}
    path.write_text(json.dumps({"command": "step_seconds", "device": "cpu", "threads": 1, "rows": [row]}))
    return path


def test_the_plan_shows_its_eta_at_the_measured_step_times_or_says_it_has_none(tmp_path, capsys):
    assert main([*SMOKE, "sweep.dry_run=true"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "eta: no estimate before launch: no step times (cluster.step_seconds=FILE)" in out[-2]
    path = step_seconds(tmp_path, 0.5)  # smoke: 6 models x 20 steps = 60 s on one core
    assert main([*SMOKE, "sweep.dry_run=true", f"cluster.step_seconds={path}"]) == 0
    cores = len(os.sched_getaffinity(0))
    assert f"eta: at most about {60 / cores:.0f} s on this machine's {cores} cores" in capsys.readouterr().out


def test_above_either_threshold_without_a_terminal_nothing_starts(tmp_path, sqlite_uri, capsys):
    """In-process (pytest's stdin is no terminal): refused with exit 11 before the store is opened, by the
    trials or by the device-hours at the measured step times; at the threshold it goes on (and stops at a
    trial this machine cannot place, a check that comes after the guard, before Ray)."""
    store = Path(sqlite_uri.removeprefix("sqlite:///"))
    before = store.read_bytes()
    unplaceable = "cluster.cpus_per_trial=100000"  # refused by sweeper.driver.cluster.check, after the guard
    line = [*SMOKE, f"tracking.uri={sqlite_uri}", unplaceable]
    assert main([*line, "sweep.confirm_trials=5"]) == exit_codes.NOT_CONFIRMED
    assert capsys.readouterr().err.splitlines() == [REFUSED]
    assert main([*line, "sweep.confirm_trials=6"]) == exit_codes.CONFIG
    assert "cluster.cpus_per_trial=100000 is not allowed" in capsys.readouterr().err
    hours = [f"cluster.step_seconds={step_seconds(tmp_path, 36.0)}", "sweep.confirm_trials=null"]  # 1.2 h
    assert main([*line, *hours, "sweep.confirm_hours=1"]) == exit_codes.NOT_CONFIRMED
    assert "(1.2 core-hours > sweep.confirm_hours=1) and there is no terminal" in capsys.readouterr().err
    assert main([*line, *hours, "sweep.confirm_hours=1.2"]) == exit_codes.CONFIG
    assert store.read_bytes() == before  # nothing recorded


def test_yes_is_the_sweeps_flag_alone(capsys):
    from sweeper.train import main as train_main

    assert train_main(["--yes"]) == exit_codes.CONFIG
    assert capsys.readouterr().err.startswith("error: not supported: --yes: the arguments are key=value")


def test_a_bad_threshold_is_refused_in_one_line_naming_it(capsys):
    assert main([*SMOKE, "sweep.dry_run=true", "sweep.confirm_hours=-1"]) == exit_codes.CONFIG
    assert capsys.readouterr().err.splitlines() == [
        "error: sweep.confirm_hours=-1.0 is not allowed: a finite number >= 0 (ask above this many "
        "device-hours) or null"
    ]


@pytest.mark.slow  # make -n and five sweeps composed: 8 s
def test_the_makefiles_sweeps_and_the_unattended_recipes_pass_the_guard():
    """No make target stalls on the question or is refused (their sweeps, as `make -n` spells them, stay
    below the default thresholds), and every recipe that runs without a terminal (the SLURM script, the
    KubeRay RayJob, the launcher's `ray job submit`) says sweep.confirm=false for its 3,000 trials. Checked
    by the guard itself, here without a terminal: a sweep it would refuse raises NotConfirmed."""
    targets = ["demo", "reproduce", "reproduce-d32", "reproduce-plus"]
    dry = subprocess.run(["make", "-n", *targets], cwd=REPO, capture_output=True, text=True, check=True)
    lines = [line.split(" || ")[0] for line in dry.stdout.splitlines() if " -m sweeper.sweep " in line]
    assert len(lines) == len(targets), dry.stdout
    for line in lines:
        words = shlex.split(line)
        guard(load(words[words.index("sweeper.sweep") + 1 :]))
    docker = REPO / "docker"  # each recipe wherever docker/ keeps it
    (rayjob,) = [p.read_text() for p in docker.rglob("*.yaml") if "\nkind: RayJob\n" in p.read_text()]
    (submit,) = [p.read_text() for p in docker.rglob("ray-cluster.yaml")]
    (sbatch,) = [p.read_text() for p in docker.rglob("sweep.sbatch")]
    entry = re.search(r"^  entrypoint: python -m sweeper.sweep (.*)$", rayjob, flags=re.M).group(1)
    job = re.search(r"^#   ray job submit .* -- python -m sweeper.sweep (.*)$", submit, flags=re.M).group(1)
    default = re.search(r"^    set -- (sweep=.*)$", sbatch, flags=re.M).group(1)  # the script's own sweep
    script = re.search(r'^\$RUN python -m sweeper.sweep "\$@" (sweep\.confirm=false) ', sbatch, flags=re.M)
    assert script, "sweep.sbatch runs the sweep without a terminal"
    for words in (entry.split(), job.split(), [*default.split(), script.group(1)]):
        sweep = load(words)
        assert sweep.plan.job_count > sweep.cfg.sweep.confirm_trials  # the paper's 3,000: it would ask
        guard(sweep)
        with pytest.raises(NotConfirmed):  # the same sweep without the opt-out is refused
            guard(load([w for w in words if w != "sweep.confirm=false"]))


@pytest.mark.slow  # four interpreters importing Hydra, the config tree and Ray's resource count
def test_the_console_script_refuses_without_a_terminal_and_yes_or_confirm_false_go_on(tmp_path):
    """The console script and `python -m` with no terminal (stdin /dev/null, as sbatch or a RayJob): one line,
    exit 11, no store created; `--yes` and sweep.confirm=false pass the guard to the next check."""
    line = [
        *SMOKE,
        "sweep.confirm_trials=5",
        "tracking.uri=sqlite:///mlflow.db",
        "cluster.cpus_per_trial=1e5",
    ]
    commands = {
        "script": ([SCRIPT, *line], exit_codes.NOT_CONFIRMED),
        "module": ([sys.executable, "-m", "sweeper.sweep", *line], exit_codes.NOT_CONFIRMED),
        "--yes": ([SCRIPT, "--yes", *line], exit_codes.CONFIG),
        "confirm=false": ([SCRIPT, *line, "sweep.confirm=false"], exit_codes.CONFIG),
    }
    for name, (command, code) in commands.items():
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == code, (name, done.stderr[-2000:])
        if code == exit_codes.NOT_CONFIRMED:
            assert done.stderr.splitlines() == [REFUSED], name
        else:
            assert "cluster.cpus_per_trial=100000 is not allowed" in done.stderr, name
    assert list(tmp_path.iterdir()) == []  # no store, no Ray folder


def on_a_terminal(command: list[str], answer: str, cwd: Path, timeout: float = 600) -> tuple[int, str]:
    """Run `command` with a pty as its terminal; answer its question with `answer`; its exit code and all it
    printed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=subprocess_env(),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    out, answered, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end closed: the command ended
                break
            if not chunk:
                break
            out += chunk
            if not answered and b"[y/N] " in out:
                os.write(master, answer.encode() + b"\n")
                answered = True
        return proc.wait(timeout=60), out.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            kill_group(proc)


@pytest.mark.slow  # three interpreters, one of them a real sweep of one tiny trial on a local Ray instance
def test_on_a_terminal_it_asks_no_starts_nothing_yes_launches_and_a_resume_asks_no_more(tmp_path):
    line = [
        *ONE_TRIAL,
        "train.steps=10",
        NO_DASHBOARD,
        "sweep.confirm_trials=0",
        "tracking.uri=sqlite:///mlflow.db",
    ]
    code, out = on_a_terminal([SCRIPT, *line], "n", tmp_path)
    assert code == exit_codes.NOT_CONFIRMED, out[-2000:]
    assert "sweep smoke is above what launches unasked (1 trials > sweep.confirm_trials=0)" in out
    assert "eta: no estimate before launch" in out  # the plan, its cost and ETA came before the question
    assert "error: sweep smoke not confirmed: nothing started" in out
    assert list(tmp_path.iterdir()) == []  # nothing recorded, no Ray
    code, out = on_a_terminal([SCRIPT, *line], "y", tmp_path)
    assert code == 0, out[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (run,) = children(uri, "smoke")
    assert run.info.status == "FINISHED"
    parent = MlflowClient(tracking_uri=uri).get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags[COMMAND] == shlex.join(["leaner-sweep", *line])
    # The same command again, without a terminal: launched before at this size, not asked (nothing to run).
    again = subprocess.run(
        [SCRIPT, *line], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "sweep smoke: launched before at this size: not asked again" in again.stdout
    bigger = [*line, "sweep.seeds=[1, 2]"]  # the sweep grew: asked again
    grown = subprocess.run(
        [SCRIPT, *bigger], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    assert grown.returncode == exit_codes.NOT_CONFIRMED, grown.stderr[-2000:]


@pytest.mark.slow  # a real sweep of 4 paced trials on a local Ray instance, stopped by two SIGINTs
def test_a_second_ctrl_c_ends_the_sweep_at_once_and_leaves_no_run_running(tmp_path):
    """Ctrl-C twice in a terminal (SIGINT to the driver's process group) once a trial has checkpointed: the
    driver ends at once with exit 130, its trials' open runs and its parent KILLED in the store, no process of
    its local Ray left."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    line = [*FOUR_TRIALS, "train.steps=400", "cluster.cpus_per_trial=1", f"tracking.uri={uri}"]
    log = tmp_path / "driver.log"
    driver = start_sweep(line, log, env={**subprocess_env(), **PACED})
    try:
        wait_for(lambda: interrupted_runs(uri, "smoke"), driver, 300, "a trial checkpointed")
        os.killpg(driver.pid, signal.SIGINT)
        wait_for(lambda: b"SIGINT received" in log.read_bytes(), driver, 30, "the first SIGINT taken")
        os.killpg(driver.pid, signal.SIGINT)
        code = driver.wait(timeout=60)
        left = left_behind(driver)
    finally:
        kill_group(driver)
    out = log.read_text()
    assert code == exit_codes.SIGINT_STOP, out[-3000:]
    assert "ended by a second signal" in out and "Resume with the same command:" in out, out[-3000:]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("leaner-clustering").experiment_id
    statuses = {r.info.run_name: r.info.status for r in client.search_runs([experiment])}
    assert "RUNNING" not in statuses.values(), statuses
    trials = [status for name, status in statuses.items() if name != "sweep-smoke"]
    assert statuses["sweep-smoke"] == "KILLED" and "KILLED" in trials, statuses
    assert left == [], left
