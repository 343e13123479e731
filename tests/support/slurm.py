"""A real SLURM on this machine: munged, slurmctld and two slurmd (nodes n1 and n2), from Debian's packages.

Nothing is installed here: `apt-get install slurm-wlm munge` (.ci/run does it) puts the daemons on PATH. The
cluster lives in one temporary folder (its slurm.conf, munge key and socket, state, spool, logs and pid
files), listens on free ports of 127.0.0.1 and runs its jobs as this user (root, as SlurmUser). Debian's
slurmd is built with multiple-slurmd support (`slurmd -N NAME`): both nodes are daemons of this host, each
on its own port, so a job of two nodes runs its batch script on n1 and its `srun` steps on n2 here.

Accounting without slurmdbd: the job completion log (JobCompType=jobcomp/filetxt), which slurmctld appends
to at every end of a job's run, a requeue included, and which `sacct --completion` reads (SLURM 22.05; later
releases dropped that option); `scontrol show job` counts the restarts (Restarts=).

A node without the shared folder: n2's slurmd runs in a mount namespace of its own (`unshare --mount`) in
which a tmpfs covers the cluster's folder `blind` (`Slurm.blind`), so every step SLURM starts on n2 finds
another, empty file system at that path, as on a node where the shared file system is not mounted. Every
other path is this machine's disk on both nodes.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from support.repo import REPO
from support.servers import free_port

NODES = ("n1", "n2")
BLIND_NODE = "n2"  # the node on which the folder `blind` is not the shared one
CPUS = 2  # per node: this machine's two cores, each node told it has both
MEMORY_MB = 4000  # per node (RealMemory), what a job's --mem may ask for
CRED_EXPIRE_S = 30  # how long a requeued job waits before it may start again (SLURM's default: 120 s)
DAEMONS = ("munged", "slurmctld", "slurmd")


def installed() -> bool:
    """Whether this machine has SLURM's and munge's daemons and commands."""
    return all(shutil.which(name) for name in (*DAEMONS, "sbatch", "scontrol", "sacct"))


def conf(root: Path, ports: dict[str, int], host: str, first_job: int) -> str:
    """slurm.conf of a two-node cluster on this host (`host`: its name, which multiple slurmd must match)."""
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[name]} CPUs={CPUS} "
        f"RealMemory={MEMORY_MB} State=UNKNOWN"
        for name in NODES
    )
    return f"""\
ClusterName=leaner
FirstJobId={first_job}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports["slurmctld"]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket,cred_expire={CRED_EXPIRE_S}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
KillWait=5
OverTimeLimit=0
InactiveLimit=0
MinJobAge=3600
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
{nodes}
PartitionName=test Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def port_block() -> tuple[int, int, int]:
    """(first, blocks, size) of docker/slurm/sweep.sbatch's `port0=$((first + SLURM_JOB_ID % blocks * size))`:
    a job's Ray ports are `size` ports from first + size x (job id mod blocks)."""
    text = (REPO / "docker" / "slurm" / "sweep.sbatch").read_text()
    found = re.search(r"^port0=\$\(\((\d+) \+ SLURM_JOB_ID % (\d+) \* (\d+)\)\)", text, re.M)
    assert found, "docker/slurm/sweep.sbatch sets no port0"
    first, blocks, size = map(int, found.groups())
    return first, blocks, size


def job_port(job: int) -> int:
    """The first of a job's Ray ports (its head's GCS port), as the script derives it."""
    first, blocks, size = port_block()
    return first + job % blocks * size


def first_job_id() -> int:
    """A job id whose block of Ray ports (docker/slurm/sweep.sbatch, port_block) is free now:
    two clusters of the tests on this machine at once (pytest's workers) would otherwise both number their
    first job 1, and their jobs' Ray ports would collide, as two real jobs' never do on one node."""
    while True:
        job = random.randrange(1000, 1_000_000)
        base, size = job_port(job), port_block()[2]
        if all(port_free(base + offset) for offset in range(0, size, 10)):
            return job


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Slurm:
    """A running cluster: `env` is what SLURM's commands need to reach it (SLURM_CONF)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blind = root / "blind"  # on n2: a tmpfs of its own (the module's docstring)
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        for folder in ("munge", "state", "blind", *(f"spool/{n}" for n in NODES)):
            (self.root / folder).mkdir(parents=True)
        ports = {name: free_port() for name in ("slurmctld", *NODES)}
        self.conf.write_text(conf(self.root, ports, os.uname().nodename, first_job_id()))
        self._munge()
        self._daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        # `sh -c SCRIPT BLIND slurmd ...`: a tmpfs over $0, then become slurmd (its process group is the one
        # stopped)
        hide = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
        hide += ['mount -t tmpfs slurm-blind "$0" && exec "$@"', str(self.blind)]
        for name in NODES:
            slurmd = ["slurmd", "-D", "-N", name, "-f", str(self.conf)]
            self._daemon(hide + slurmd if name == BLIND_NODE else slurmd, f"slurmd-{name}")
        self.wait_idle()

    def _munge(self) -> None:
        key = self.root / "munge" / "key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self.root.chmod(0o755)  # munged refuses a socket folder others may write to
        (self.root / "munge").chmod(0o700)
        munge = self.root / "munge"
        self._daemon(
            ["munged", "-F", "--force", f"--key-file={key}", f"--socket={munge}/socket",
             f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed"],
            "munged",
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not (munge / "socket").exists():
            assert time.monotonic() < deadline, (munge / "log").read_text()
            time.sleep(0.1)

    def _daemon(self, cmd: list[str], name: str) -> None:
        with open(self.root / f"{name}.out", "ab") as out:
            self.procs.append(
                subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
                )
            )

    def run(
        self, *cmd: str, check: bool = True, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> str:
        """A SLURM command's output (sbatch, scontrol, squeue, sacct); env: its whole environment (sbatch
        passes it on to the job), else this cluster's."""
        done = subprocess.run(cmd, env=env or self.env, cwd=cwd, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr}{self.logs()}")
        return done.stdout

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every node is up and idle: the cluster takes jobs."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            if sorted(out.split()) == sorted([*NODES, *["idle"] * len(NODES)]):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"SLURM's nodes did not come up: {out!r}{self.logs()}")
            time.sleep(0.5)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, Restarts, RunTime, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def logs(self) -> str:
        """The tails of the daemons' logs, for a failure's message."""
        tails = []
        for log in sorted(self.root.glob("*.log")):
            tails.append(
                f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            )
        return "".join(tails)

    def stop(self) -> None:
        """Every daemon stopped (slurmd first, munged last), with what jobs they still ran."""
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
