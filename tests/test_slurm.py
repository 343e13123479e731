"""docker/slurm/sweep.sbatch run for real on this machine as SLURM would run it: its variables set, and
stand-ins for `srun`, `scontrol` and `squeue` on PATH that record their calls and do what SLURM would do
here (srun runs its command on this machine, in a process group that ends with it; scontrol names the
allocation's nodes; squeue tells the time left). A two-node Ray cluster (the script's head, and a worker by
srun) runs a paced sweep into a folder's SQLite store: the first run's budget (the time left less MARGIN_S,
read from squeue) is spent, the driver exits 75 and the script requeues the job; the requeued run (its end
from SLURM_JOB_END_TIME) gets SLURM's warning signal (USR1) mid-sweep, forwards it to the driver, which stops
(143), and requeues again; the third run finishes the sweep. Every model has one run, every point once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient
from support.configs import FOUR_TRIALS, PACED
from support.histories import point_counts
from support.repo import REPO, subprocess_env
from support.servers import free_port
from support.sweeps import children, sweep_jobs, wait_for

from tracking.names import CHECKPOINT_STEP, CONFIG_HASH, FINISHED, OUTCOME

pytestmark = pytest.mark.slow

SCRIPT = REPO / "docker" / "slurm" / "sweep.sbatch"
JOB = "4242"
MARGIN_S = 20
# 400 paced steps (20 s a trial, two at a time on the two nodes' four CPUs): longer than the first run's
# budget, whatever this machine's load makes of Ray's start.
SWEEP = [*FOUR_TRIALS, "train.steps=400", "cluster.cpus_per_trial=1", "cluster.max_concurrent=2"]

STANDIN = {
    "srun": """
import os, signal, subprocess, sys
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
tasks = [
    subprocess.Popen(args, env={**os.environ, "SLURM_PROCID": str(i)}, start_new_session=True)
    for i in range(int(opts.get("--ntasks", 1)))
]
def end(signum, frame):  # as slurmstepd does: the step's processes end with its srun
    for task in tasks:
        try:
            os.killpg(task.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
signal.signal(signal.SIGTERM, end)
signal.signal(signal.SIGINT, end)
sys.exit(max(task.wait() for task in tasks))
""",
    "scontrol": """
import os, sys
if sys.argv[1:3] == ["show", "hostnames"]:
    print(*os.environ["STANDIN_HOSTS"].split(), sep="\\n")
elif sys.argv[1] != "requeue":
    sys.exit(f"scontrol stand-in: {sys.argv[1:]}")
""",
    "squeue": """
import os, time
left = int(os.environ["STANDIN_END_TIME"]) - int(time.time())
print(f"{left // 3600}:{left % 3600 // 60:02d}:{left % 60:02d}")
""",
}


def stand_ins(folder: Path, calls: Path) -> None:
    """The SLURM commands, each recording its name and arguments in `calls` (a JSON list a line) first."""
    folder.mkdir()
    for name, body in STANDIN.items():
        record = (
            f"import json, sys\nwith open({str(calls)!r}, 'a') as f:\n"
            f"    f.write(json.dumps([{name!r}, *sys.argv[1:]]) + '\\n')\n"
        )
        path = folder / name
        path.write_text(f"#!{sys.executable}\n{record}{body}")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def node_args() -> str:
    """A node's own ports (two nodes share this machine) and a small object store."""
    names = ["node-manager", "object-manager", "dashboard-agent-listen", "dashboard-agent-grpc"]
    names += ["runtime-env-agent", "metrics-export"]
    ports = " ".join(f"--{name}-port={free_port()}" for name in names)
    return f"{ports} --min-worker-port=0 --max-worker-port=0 --object-store-memory=80000000"


def job_env(tmp_path: Path, ray_temp: Path, uri: str, marker: str) -> dict[str, str]:
    """What SLURM sets (and the script's options) for the job's runs on this machine; ray_temp: Ray's
    folder, short (its socket paths must fit 107 bytes)."""
    return {
        **subprocess_env(),
        **PACED,
        "PATH": f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_ID": JOB,
        "SLURM_JOB_NODELIST": "n[1-2]",
        "STANDIN_HOSTS": "n1 n2",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_CPUS_ON_NODE": "2",
        "RUN": "",  # this environment, not an image
        "TRACKING_URI": uri,
        "MARGIN_S": str(MARGIN_S),
        "RAY_PORT": str(free_port()),
        "RAY_HEAD_IP": "127.0.0.1",
        "RAY_HEAD_ARGS": f"{node_args()} --temp-dir={ray_temp} --include-dashboard=false "
        f"--ray-client-server-port={free_port()}",
        "RAY_WORKER_ARGS": f"{node_args()} --node-ip-address=127.0.0.1",
        "RAY_AUTH_MODE": "disabled",
        "STANDIN_JOB_MARKER": marker,  # every process of the job inherits it: the test ends what is left
    }


def start_job(env: dict[str, str], log: Path, **more: str) -> subprocess.Popen:
    """One run of the batch script, as slurmstepd starts it (its own session)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            ["bash", str(SCRIPT), *SWEEP],
            env={**env, **more},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=env["SLURM_SUBMIT_DIR"],
            start_new_session=True,
        )


def end_job(marker: str) -> None:
    """What is left of the job's processes killed, as SLURM does at a job's end (its cgroup)."""
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("STANDIN_JOB_MARKER") == marker:
                left.append(p)
        except psutil.Error:
            pass
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=30)


def requeues(calls: Path) -> int:
    return sum(json.loads(line) == ["scontrol", "requeue", JOB] for line in calls.read_text().splitlines())


def trained(uri: str) -> int:
    """The model-steps the store records as done: a model's steps once ended, else its checkpoint's step."""
    try:
        runs = children(uri, "smoke")
    except Exception:  # not created yet
        return 0
    return sum(400 if OUTCOME in r.data.tags else int(r.data.tags.get(CHECKPOINT_STEP, 0)) for r in runs)


def test_the_slurm_script_runs_the_sweep_in_allocations_requeued_until_it_ends(tmp_path, sqlite_uri):
    uri, calls, log = sqlite_uri, tmp_path / "calls.jsonl", tmp_path / "job.log"
    stand_ins(tmp_path / "bin", calls)
    marker = uuid.uuid4().hex
    ray_temp = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    env = job_env(tmp_path, ray_temp, uri, marker)
    try:
        # Run 1: the time left from squeue; the budget is spent mid-sweep: exit 75, requeued.
        first = start_job(env, log, STANDIN_END_TIME=str(int(time.time()) + MARGIN_S + 60))
        assert first.wait(timeout=600) == 75, log.read_text()[-4000:]
        end_job(marker)
        assert requeues(calls) == 1, log.read_text()[-4000:]
        before = trained(uri)
        assert 0 < before < 4 * 400, before
        # Run 2: the end from SLURM_JOB_END_TIME; SLURM's warning (USR1) mid-sweep: stopped, requeued.
        end = str(int(time.time()) + MARGIN_S + 3600)
        second = start_job(env, log, SLURM_RESTART_COUNT="1", SLURM_JOB_END_TIME=end)
        wait_for(lambda: trained(uri) > before, second, 600, "training in the requeued run")
        os.kill(second.pid, signal.SIGUSR1)
        assert second.wait(timeout=300) == 143, log.read_text()[-4000:]
        end_job(marker)
        assert requeues(calls) == 2, log.read_text()[-4000:]
        # Run 3: the sweep ends: exit 0, no requeue.
        third = start_job(env, log, SLURM_RESTART_COUNT="2", SLURM_JOB_END_TIME=end)
        assert third.wait(timeout=600) == 0, log.read_text()[-4000:]
        assert requeues(calls) == 2
    finally:
        end_job(marker)
        shutil.rmtree(ray_temp, ignore_errors=True)
    out = log.read_text()
    assert "time budget" in out and "SIGTERM received" in out
    srun = [json.loads(line) for line in calls.read_text().splitlines() if line.startswith('["srun"')]
    assert len(srun) == 3 and all("--exclude=n1" in call and "ray" in call for call in srun), srun
    client = MlflowClient(tracking_uri=uri)
    runs = children(uri, "smoke")
    assert sorted(r.data.tags[CONFIG_HASH] for r in runs) == sorted(t.key for t in sweep_jobs(SWEEP))
    assert all((r.data.tags[OUTCOME], r.info.status) == (FINISHED, "FINISHED") for r in runs)
    points, duplicated, lost = point_counts(client, runs, [])
    print(
        f"slurm script: 3 runs (budget 75, USR1 143, done 0), 2 requeues; runs {len(runs)}, points {points}, "
        f"duplicates {duplicated}, lost {lost}"
    )
    assert (duplicated, lost) == (0, 0)
