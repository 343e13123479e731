"""docker/slurm/sweep.sbatch under a real SLURM on this machine (support.slurm: munged, slurmctld and the
two slurmd of nodes n1 and n2, Debian's SLURM 22.05): `sbatch` runs it as a job of two nodes (the script's
head and driver on n1, its `srun` Ray worker on n2), whose wall time (--time=3) ends mid-sweep, through a real
MLflow server (TRACKING_URI=http://...). SLURM's own warning (--signal=B:USR1@70) stops the first run's
driver (143 if it finds it training; on a busy machine it may find it still starting, which then exits as
Ray's signal handler has it), the script requeues the job and SLURM starts it again; the second run's time
limit is raised
once its budget is set (as an administrator may), so that run stops at its budget instead (75) and is requeued
too; the third finishes the sweep. Every model has one run, every point once; `scontrol` counts two restarts
and `sacct --completion` lists the job's three ends.

No stand-in for SLURM is left. What one host cannot show: the nodes are two slurmd of this machine, so the
"shared" file system is this machine's disk, the worker reaches the head on 127.0.0.1, and both nodes' CPUs
are this machine's two cores. No image: RUN="" runs the commands in this environment (the script's option for
a virtual environment on the shared file system), as the nodes have no Apptainer. Debian's srun of 22.05.8
inherits --cpus-per-task from the job (measured: a step without it is bound to both CPUs), so the break of
the SLURM releases whose srun does not (the worker bound to one core) is checked statically, below.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
from support import slurm as slurm_support
from support.configs import FOUR_TRIALS
from support.once import assert_every_job_once_every_point_once
from support.repo import REPO, subprocess_env
from support.sweeps import sweep_jobs
from test_tracking_auth import TOKEN, token_server  # noqa: F401 - the fixture, reused

from cli import exit_codes
from sweeper import preflight
from tracking.names import FINISHED, OUTCOME
from training.faults import STEP_PAUSE

SCRIPT = REPO / "docker" / "slurm" / "sweep.sbatch"
# Each training step sleeps 1 s first: the steps' own CPU, which a busy machine slows, is then a small part of
# their time, and the model-steps the job's first two runs train vary less with the load (their wall times are
# SLURM's). 4 trials of 140 steps (140 s each at least, two at a time): more than those two runs train on an
# idle machine (about 240 s of training), so that a third run ends the sweep.
PACE = {STEP_PAUSE: "1"}
SWEEP = [
    *FOUR_TRIALS,
    "train.steps=140",
    "train.eval_every=20",
    "cluster.cpus_per_trial=1",
    "cluster.max_concurrent=2",
]
# sbatch's options over the script's #SBATCH lines: two nodes of this machine's size, no GPU, three minutes,
# the warning 70 s before their end (measured: SLURM sends it up to 30 s early or late; Ray and the driver,
# whose session takes the signal, start within the 80 s before it), the budget MARGIN_S before it, after the
# warning.
JOB = ["--nodes=2", "--cpus-per-task=2", "--mem=1000", "--gpus-per-node=0", "--time=3", "--signal=B:USR1@70"]
MARGIN_S = 30


@pytest.fixture
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A real SLURM cluster of two nodes on this machine for one test (support.slurm), stopped after it."""
    if not slurm_support.installed():
        pytest.skip("no SLURM: apt-get install slurm-wlm munge (.ci/run does)")
    cluster = slurm_support.Slurm(Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp")))  # short socket paths
    try:
        cluster.start()
        yield cluster
    finally:
        for job in cluster.run("squeue", "-h", "-o", "%i", check=False).split():
            cluster.run("scancel", "--full", job, check=False)
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def job_env(slurm: slurm_support.Slurm, home: Path, uri: str) -> dict[str, str]:
    """The environment `sbatch` passes on to the job: this venv first on PATH, the paced steps, the script's
    options; Ray's token mode as the script chooses it (the tests' RAY_AUTH_MODE=disabled left out)."""
    env = {**subprocess_env(), **slurm.env, **PACE}
    env.pop("RAY_AUTH_MODE", None)
    return {
        **env,
        "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",
        "SWEEP_HOME": str(home),
        "TRACKING_URI": uri,
        "RUN": "",  # this environment, not an image
        "MARGIN_S": str(MARGIN_S),
        "RAY_HEAD_ARGS": "--include-dashboard=false --object-store-memory=80000000",
        "RAY_WORKER_ARGS": "--object-store-memory=80000000",
    }


def wait_job(slurm: slurm_support.Slurm, job: str, until, timeout: float, log: Path) -> dict[str, str]:
    """scontrol's view of the job once `until(view)` holds; fails after `timeout` s with the job's output."""
    deadline = time.monotonic() + timeout
    while True:
        view = slurm.job(job)
        if until(view):
            return view
        assert view["JobState"] not in ("FAILED", "CANCELLED", "TIMEOUT"), (
            f"{view}\n{tail(log)}{slurm.logs()}"
        )
        assert time.monotonic() < deadline, (
            f"job {job} at {view['JobState']}, restarts {view['Restarts']}\n{tail(log)}"
        )
        time.sleep(1)


WARNED, REQUEUED = "SLURM's warning", "requeueing job"


def job_runs(out: str) -> list[str]:
    """The job's output, a piece per run (the script names each run as it starts)."""
    return re.split(r"^sweep\.sbatch: job \d+ \(run \d+\)", out, flags=re.M)[1:]


def driver_exit(run: str) -> str | None:
    """The sweep driver's exit code in a run's output, as the script says it; None without a driver."""
    found = re.search(r"the sweep driver exited (\d+)", run)
    return found and found.group(1)


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-6000:] if log.exists() else "(no output yet)"


def budgets(log: Path) -> int:
    """The job's runs that set their time budget (the script says so once in each)."""
    return log.read_text(errors="replace").count("sweep.sbatch: time budget") if log.exists() else 0


def ray_processes(job: str) -> list[psutil.Process]:
    """The job's raylets (one per node), found by the job id SLURM puts in its steps' environments."""
    found = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == "raylet" and p.environ().get("SLURM_JOB_ID") == job:
                found.append(p)
        except psutil.Error:
            pass
    return found


def check_running_job(job: str, home: Path) -> None:
    """What a running job's Ray shows: a raylet on each node, with all the CPUs of its step; the token of its
    own, readable by its user alone; Ray's ports and folder its own (from the job id)."""
    raylets = ray_processes(job)
    nodes = sorted(p.environ()["SLURMD_NODENAME"] for p in raylets)
    assert nodes == ["n1", "n2"], nodes
    assert all(len(p.cpu_affinity()) == slurm_support.CPUS for p in raylets)
    token = home / f".ray-token-{job}"
    assert token.stat().st_mode & 0o777 == 0o600
    for p in raylets:
        env = p.environ()
        assert (env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN_PATH"]) == ("token", str(token)), env
        assert f"/tmp/ray-{job}/" in " ".join(p.cmdline()), p.cmdline()
    port = slurm_support.job_port(int(job))
    listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert port in listening, (port, sorted(listening))


def run_to_the_end(slurm: slurm_support.Slurm, job: str, log: Path, home: Path) -> dict[str, str]:
    """The job's three runs, each as SLURM ends it; scontrol's view of the completed job."""
    # Run 1: SLURM's warning (70 s before its three minutes) stops the driver; the script requeues the job.
    wait_job(slurm, job, lambda v: v["JobState"] == "RUNNING" and budgets(log) == 1, 300, log)
    check_running_job(job, home)
    wait_job(slurm, job, lambda v: v["Restarts"] == "1", 300, log)
    # Run 2, started by SLURM: its time limit raised once its budget is set; the budget's end stops it.
    wait_job(slurm, job, lambda v: v["JobState"] == "RUNNING" and budgets(log) == 2, 300, log)
    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=15")
    wait_job(slurm, job, lambda v: v["Restarts"] == "2", 300, log)
    # Run 3 finishes the sweep.
    return wait_job(slurm, job, lambda v: v["JobState"] == "COMPLETED", 900, log)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 11 min measured on the 2 cores at a load of 10; SLURM's times are most of it
def test_the_slurm_script_runs_the_sweep_in_allocations_requeued_until_it_ends(
    slurm, tmp_path, mlflow_server
):
    home, log = tmp_path / "sweep", tmp_path / "job.out"
    experiment = f"slurm-{uuid.uuid4().hex[:8]}"
    submit = [
        "sbatch",
        "--parsable",
        *JOB,
        f"--output={log}",
        str(SCRIPT),
        *SWEEP,
        f"tracking.experiment={experiment}",
    ]
    started = time.monotonic()
    job = slurm.run(*submit, env=job_env(slurm, home, mlflow_server), cwd=tmp_path).strip()
    try:
        view = run_to_the_end(slurm, job, log, home)
    finally:
        shutil.rmtree(f"/tmp/ray-{job}", ignore_errors=True)  # Ray's folder: its sessions' logs
    wall = time.monotonic() - started
    out = log.read_text(errors="replace")
    first, second, third = job_runs(out)
    exits = [driver_exit(run) for run in (first, second, third)]
    # 143: the driver's own stop; a driver the warning finds still starting exits as Ray's handler has it, and
    # a warning before the driver started leaves none (the script requeues at once).
    assert "preflight: 0 faults" in first, first  # the sweep's own, on the job's Ray cluster
    assert WARNED in first and exits[0] != "0" and REQUEUED in first, first
    assert WARNED not in second and exits[1] == "75" and REQUEUED in second, second
    assert exits[2] == "0" and REQUEUED not in third, third
    assert (view["Restarts"], view["ExitCode"]) == ("2", "0:0"), view
    ends = slurm.run("sacct", "--completion", "-j", job, "-n", "-o", "jobid,state,exitcode").splitlines()
    assert [line.split()[1] for line in ends] == ["PENDING", "PENDING", "COMPLETED"], ends  # requeued twice
    assert not (home / f".ray-token-{job}").exists()
    assert any((home / "ray").iterdir())  # the checkpoints under the sweep's home: TRACKING_URI is a server
    once = assert_every_job_once_every_point_once(mlflow_server, experiment, sweep_jobs(SWEEP))
    assert all((r.data.tags[OUTCOME], r.info.status) == (FINISHED, "FINISHED") for r in once.runs.values())
    print(
        f"slurm: job {job} in {wall:.0f} s, exits {exits}, restarts {view['Restarts']}, sacct {ends}; "
        f"runs {len(once.runs)}, points {once.points}, duplicates 0, lost 0"
    )


def ended(slurm: slurm_support.Slurm, job: str, log: Path, timeout: float = 600) -> dict[str, str]:
    """scontrol's view of a job once it ended (completed or failed); fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (view := slurm.job(job))["JobState"] not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        assert time.monotonic() < deadline, f"job {job} at {view['JobState']}\n{tail(log)}"
        time.sleep(1)
    return view


def preflight_rows(log: Path) -> list[list[str]]:
    """The rows of the preflight's table in a job's output: status, check and the rest, split on blanks."""
    return [line.split() for line in log.read_text().splitlines() if line.startswith("  ")]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_preflight_of_a_slurm_job_passes_and_names_each_planted_fault(slurm, tmp_path, token_server):  # noqa: F811
    """`PREFLIGHT=only sbatch docker/slurm/sweep.sbatch`, twice at once under the real SLURM, through a
    tracking server that takes MLflow's bearer tokens: a job as the sweep would run passes (exit 0); a job
    with three planted faults fails (exit 10) with each named in one FAIL line: a wrong MLFLOW_TRACKING_TOKEN,
    storage in the folder that node n2 sees as another file system (support.slurm: its slurmd's own mount),
    and a time budget (the job's --time) too short for a trial's first checkpoint at the step times given."""
    steps = tmp_path / "steps.json"  # 100 s a step: a first checkpoint (train.eval_every=10) needs 1,000 s
    rows = [{"config": {}, "seconds_per_step": 100.0}]
    steps.write_text(json.dumps({"command": "step_seconds", "device": "cpu", "threads": 1, "rows": rows}))
    job = ["--nodes=2", "--cpus-per-task=1", "--mem=1000", "--gpus-per-node=0", "--time=5"]
    sweep = [*FOUR_TRIALS, "cluster.cpus_per_trial=1"]
    jobs = {}
    for name, token, more in [
        ("good", TOKEN, []),
        ("faults", "not-the-token", [f"cluster.storage={slurm.blind}", f"cluster.step_seconds={steps}"]),
    ]:
        env = {**job_env(slurm, tmp_path / name, token_server.uri), "PREFLIGHT": "only"}
        env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_TRACKING_")}
        env["MLFLOW_TRACKING_TOKEN"] = token
        log = tmp_path / f"{name}.out"
        submit = ["sbatch", "--parsable", *job, f"--output={log}", str(SCRIPT), *sweep, *more]
        jobs[name] = slurm.run(*submit, env=env, cwd=tmp_path).strip(), log
    try:
        views = {name: ended(slurm, job_id, log) for name, (job_id, log) in jobs.items()}
    finally:
        for job_id, _ in jobs.values():
            shutil.rmtree(f"/tmp/ray-{job_id}", ignore_errors=True)
    good, faults = (preflight_rows(jobs[name][1]) for name in ("good", "faults"))
    good_out, faults_out = (tail(jobs[name][1]) for name in ("good", "faults"))
    assert (views["good"]["ExitCode"], [r for r in good if r[0] != preflight.OK]) == ("0:0", []), good_out
    assert [r[1] for r in good].count("nodes") == 2 and "preflight: 0 faults" in good_out, good_out
    assert any(
        r[1] == "storage" and "shared: each of 2 nodes reads and writes it" in " ".join(r) for r in good
    )
    assert views["faults"]["ExitCode"] == f"{exit_codes.PREFLIGHT}:0", faults_out
    failed = {r[1]: " ".join(r) for r in faults if r[0] == preflight.FAIL}
    assert sorted(failed) == ["budget", "storage", "tracking"], faults_out
    assert "refused access (401) to the token in MLFLOW_TRACKING_TOKEN" in failed["tracking"]
    assert "not-the-token" not in faults_out  # a credential is never printed
    # one node named: the driver, on n1, wrote the file; n2 alone does not find it
    assert str(slurm.blind) in failed["storage"] and "not found" in failed["storage"], failed["storage"]
    assert "first checkpoint needs (1,000 s: 10 steps at 100 s" in failed["budget"], failed["budget"]
    assert "preflight: 3 faults: budget, storage, tracking" in faults_out
    print("\n".join(" ".join(r) for r in faults))
    assert "requeue" not in good_out + faults_out  # a preflight's job ends with its own exit code
    # the two jobs ran at once on the same two nodes: Ray's ports and folders, the job's own, did not collide
    assert max(v["StartTime"] for v in views.values()) < min(v["EndTime"] for v in views.values()), views


def test_the_jobs_ray_ports_lie_between_rays_defaults_and_the_ephemeral_ports():
    """Every job's block of Ray ports lies above Ray's default ports (6379, 8265, 10001) and below the ports
    the kernel hands outgoing connections (this machine's ip_local_port_range, Linux's default 32768-60999):
    a port there can be taken by any connection before Ray binds it, and the job's head would fail to
    start."""
    first, blocks, size = slurm_support.port_block()
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert 10001 < first and first + blocks * size - 1 < min(ephemeral, 32768), (first, blocks, size)


def test_the_slurm_script_gives_each_worker_its_cpus_gpus_and_memory():
    """What the real SLURM here cannot show (its srun inherits --cpus-per-task): the worker's srun asks for
    the job's CPUs per task itself, and every `ray start` is told its node's CPUs and GPUs; the job asks for
    its memory (a site's default per CPU may be far less than the trials and Ray's object store need)."""
    script = SCRIPT.read_text()
    header = [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert any(option.startswith("--mem=") for option in header), header
    srun = script[script.index("    srun ") :]
    srun = srun[: srun.index("&\n")]
    assert '--cpus-per-task="${SLURM_CPUS_PER_TASK' in srun, srun
    starts = re.findall(r"ray start .*?&\n", script, re.S)
    assert len(starts) == 2, starts
    for start in starts:
        assert "--num-cpus=" in start and "--num-gpus=" in start, start
