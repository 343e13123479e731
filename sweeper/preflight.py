"""The preflight: the cluster a sweep will use, checked before its first trial.

    python -m sweeper.preflight sweep=paper cluster.address=HOST:6379 tracking.uri=http://HOST:5000 \\
        cluster.storage=/shared/ray_results cluster.time_budget_s=6600 cluster.step_seconds=steps.json

It takes the sweep's own overrides (leaner-preflight is the same command) and prints one table, a row per
check (per node where a node is its subject), FAIL where the sweep would fail there, `!` where it would run
worse than planned:

  tracking  the store answers with the credentials given, as the driver opens it (sweeper.driver.hold), and
            what it holds of the sweep
  nodes     each node's CPUs and GPUs against a trial's (cluster.cpus_per_trial, .gpus_per_trial): the trials
            it fits at once; FAIL when no node fits one (Tune would wait for ever; the sweep's own preflight
            waits JOIN_WAIT_S for one to join first; an autoscaler that starts workers only on demand, from
            none, fails here); `!` where a node declares more CPUs than its processes may run on (a SLURM
            step that did not get --cpus-per-task)
  cuda      when the trials train on CUDA (a GPU reserved, train.device cuda or auto): on each GPU node a task
            holding a trial's share of a GPU starts CUDA and runs a kernel (a driver older than the installed
            torch needs, a GPU its wheel has no kernels for: training/gpu_share.py's refusal, ahead of time)
  storage   Ray Tune's storage (sweeper.driver.home.storage): the driver's file read on every node
            (sweeper.driver.cluster.check_shared), then a file written by each node read by the driver
  locks     a SQLite store's folder takes the locks SQLite and the store's creation use (POSIX fcntl, flock):
            a file system mounted without them (Lustre's noflock) is refused as the store opens
            (tracking.sqlite_guard.locks_refused), the tracking row naming it
  budget    cluster.time_budget_s against the estimated time: FAIL when what is left of it cannot reach the
            first checkpoint of the quickest trial at the measured step times (cluster.step_seconds): every
            allocation would stop with nothing saved; else the time the rest needs, at the sweep's last
            allocation's rate (sweeper.driver.budget.outlook) or at the step times
            (the plan's estimate, sweeper.driver.cost)
  cost      the cost preview (sweeper.driver.cost)

Exit 0 without a FAIL, 10 (PreflightFailed) with one, 2 for a configuration the sweep refuses. A sweep on a
cluster (cluster.address set) runs the same checks (before_trials) once it joined the cluster and before it
locks the sweep: a FAIL ends it there with exit 10, no trial started, no parent run opened.
"""

from __future__ import annotations

import math
import os
import sys
import time
import uuid
from dataclasses import dataclass

from omegaconf import DictConfig

from cli.credentials import mask
from cli.entry import command, one_line
from config.grid import Sweep, load
from config.help import composed_config, config_groups
from sweeper.driver import cluster, cost, home
from sweeper.driver.budget import Account, Budget, duration, outlook
from sweeper.driver.hold import Hold
from sweeper.errors import ClusterError, PreflightFailed
from tracking.errors import TrackingError

OK, WARN, FAIL = "ok", "!", "FAIL"
ANSWER_S = 180.0  # how long a node's task may take: a cold worker importing torch on a busy node
# How long the sweep's own preflight waits for a node that fits a trial: workers still joining the cluster
# (a Kubernetes pod pulling the image) are waited for; the command reports the cluster as it finds it.
JOIN_WAIT_S = 120.0


@dataclass(frozen=True)
class Row:
    check: str
    where: str  # the node it is about, or nothing
    text: str
    status: str = OK


@command("leaner-preflight", show_config=composed_config, options=config_groups)
def main(argv: list[str]) -> int:
    sweep = load(argv)  # as the sweep's command line is: every refusal of it too (exit 2)
    cfg = sweep.cfg
    cluster.check(cfg)
    plan_cost = cost.reckon(cfg, sweep.plan)  # a step-times file the sweep refuses is refused here too
    rows, hold, nodes = _reach(sweep)
    storage = home.storage(cfg.cluster, cfg.tracking.uri)
    rows += survey(sweep, hold, nodes, storage, Budget.since_start(cfg.cluster.time_budget_s), plan_cost)
    print(table(sweep, rows), flush=True)
    return PreflightFailed.exit_code if faults(rows) else 0


def before_trials(
    sweep: Sweep, hold: Hold, storage: str | None, budget: Budget, plan_cost: cost.Cost
) -> None:
    """The sweep driver's preflight on the cluster it joined, with what the driver holds by then (the store
    read, Tune's storage, the budget, the plan's cost): the table printed; PreflightFailed on a FAIL."""
    nodes = alive_nodes(sweep.cfg.cluster, JOIN_WAIT_S)
    rows = [_store_answers(hold), *survey(sweep, hold, nodes, storage, budget, plan_cost)]
    print(table(sweep, rows), flush=True)
    found = faults(rows)
    if found:
        raise PreflightFailed(
            f"the preflight found {len(found)} faults ({', '.join(sorted({r.check for r in found}))}), each "
            "named in a FAIL line above: no trial was started; `leaner-preflight` with the same overrides "
            "checks again"
        )


def survey(
    sweep: Sweep,
    hold: Hold | None,
    nodes: list[dict] | None,
    storage: str | None,
    budget: Budget,
    plan_cost: cost.Cost,
) -> list[Row]:
    """The rows of every check (the module docstring) after the store's and the cluster's own: on the Ray
    cluster's live `nodes` (None: it refused), with the `hold` on the store (None: it refused), Ray Tune's
    `storage` and the plan's cost (sweeper.driver.cost)."""
    cfg = sweep.cfg
    rows = []
    if nodes is not None:
        rows += _nodes(cfg.cluster, nodes) + _cuda(cfg, nodes) + _storage(storage, nodes)
    rows += _locks(cfg.tracking.uri, hold is not None)
    account = hold.account if hold else Account.of(list(sweep.jobs), cfg.train.steps, (), {})
    rows += _budget(cfg, budget, plan_cost.priced, account, hold.rate if hold else None, nodes or [])
    return rows + [Row("cost", "", line.removeprefix("cost: ")) for line in plan_cost.lines]


def _reach(sweep: Sweep) -> tuple[list[Row], Hold | None, list[dict] | None]:
    """The command's own reach of the store and of the Ray cluster of cluster.address, as the driver's (the
    driver's preflight comes once it holds both): the tracking row and, where Ray refused, the cluster's;
    the hold on the store and the live nodes, each None where it refused."""
    cfg = sweep.cfg
    try:
        hold = Hold(sweep)  # the store as the driver opens it: its probe sends the credentials
    except TrackingError as err:
        rows, hold = [Row("tracking", "", one_line(err), FAIL)], None
    else:
        rows = [_store_answers(hold)]
    try:
        cluster.connect(cfg.cluster)
    except ClusterError as err:  # no node to ask: the cluster's row is the fault
        return [*rows, Row("cluster", "", one_line(err), FAIL)], hold, None
    return rows, hold, alive_nodes(cfg.cluster, 0.0)


def _store_answers(hold: Hold) -> Row:
    return Row("tracking", "", f"the store answers: {hold.held}")


def alive_nodes(c: DictConfig, wait_s: float) -> list[dict]:
    """The cluster's live nodes, once one fits a trial or after `wait_s` (workers may still be joining)."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        if any(trials_at_once(n, c) for n in nodes) or time.monotonic() >= deadline:
            return nodes
        time.sleep(2.0)


def faults(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.status == FAIL]


def table(sweep: Sweep, rows: list[Row]) -> str:
    """The rows as one table under a header line, and a last line counting the faults."""
    address = sweep.cfg.cluster.address or "a local Ray instance"
    width = max(len(r.where) for r in rows)
    lines = [f"preflight: sweep {sweep.plan.name} on {address}"]
    lines += [f"  {r.status:<4}  {r.check:<8}  {r.where:<{width}}  {r.text}" for r in rows]
    found = faults(rows)
    named = f": {', '.join(sorted({r.check for r in found}))}" if found else ""
    lines.append(f"preflight: {len(found)} faults{named}")
    return mask("\n".join(lines))  # a storage URI's secret, a password an error quotes


def _pinned(function, node: dict, **resources):
    """`function` as a Ray task bound to `node` (none other may run it), reserving `resources`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    pin = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
    return ray.remote(function).options(scheduling_strategy=pin, num_cpus=0, **resources)


def _answers(refs: list, nodes: list[dict]) -> list:
    """Each node's answer, or the exception that stood for it (a node that died, a task that timed out)."""
    import ray

    out = []
    for ref in refs:
        try:
            out.append(ray.get(ref, timeout=ANSWER_S))
        except Exception as err:  # noqa: BLE001 - Ray's own errors: the node's row says which
            out.append(err)
    return out


def trials_at_once(node: dict, c: DictConfig) -> int:
    """The trials a node fits at once, by what it declares (as Ray schedules)."""
    have = node["Resources"]
    fits = [math.floor(have.get("CPU", 0) / c.cpus_per_trial + 1e-9)] if c.cpus_per_trial > 0 else []
    if c.gpus_per_trial > 0:
        fits.append(math.floor(have.get("GPU", 0) / c.gpus_per_trial + 1e-9))
    return min(fits) if fits else sys.maxsize


def cores() -> int:
    """On a node: the cores its processes may run on (a SLURM step's, a container's CPU set)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _nodes(c: DictConfig, nodes: list[dict]) -> list[Row]:
    """Each node's resources against a trial's; FAIL when none fits one."""
    if not nodes:
        return []
    usable = _answers([_pinned(cores, n).remote() for n in nodes], nodes)
    need = f"{c.cpus_per_trial:g} CPU, {c.gpus_per_trial:g} GPU each"
    rows = []
    for node, may in zip(nodes, usable):
        have = node["Resources"]
        cpus, gpus, fit = have.get("CPU", 0), have.get("GPU", 0), trials_at_once(node, c)
        text = f"{cpus:g} CPUs, {gpus:g} GPUs: {min(fit, 999)} trials at once ({need})"
        if isinstance(may, Exception):
            rows.append(
                Row("nodes", cluster.node_name(node), f"{text}; no answer ({type(may).__name__})", WARN)
            )
        elif may < cpus:
            text += f"; it declares {cpus:g} CPUs and its processes may run on {may} cores: trials share them"
            rows.append(Row("nodes", cluster.node_name(node), text, WARN))
        else:
            rows.append(Row("nodes", cluster.node_name(node), text))
    if not any(trials_at_once(n, c) for n in nodes):
        rows.append(
            Row("nodes", "", f"no node fits a trial ({need}): the sweep's trials would wait for ever", FAIL)
        )
    return rows


def cuda_starts() -> tuple[str | None, str]:
    """On a node, holding a trial's share of a GPU: (None, what runs) when CUDA starts and runs a kernel,
    else (why not, torch's version)."""
    import torch

    from training.gpu_share import why_no_cuda

    if not torch.cuda.is_available():
        return why_no_cuda(), f"torch {torch.__version__}"
    try:
        x = torch.ones(8, 8, device="cuda")
        float((x @ x).sum())  # a kernel: a GPU the wheel was not built for fails here, not at is_available
    except RuntimeError as err:
        return " ".join(str(err).split()), f"torch {torch.__version__}"
    major, minor = torch.cuda.get_device_capability()
    return None, (
        f"{torch.cuda.get_device_name()} (sm_{major}{minor}), torch {torch.__version__} with CUDA "
        f"{torch.version.cuda}"
    )


def _cuda(cfg: DictConfig, nodes: list[dict]) -> list[Row]:
    """CUDA started on every GPU node that fits a trial, when the trials train on CUDA."""
    share, device = cfg.cluster.gpus_per_trial, cfg.train.device
    if share <= 0 or device not in ("auto", "cuda"):
        why = "no GPU reserved" if share <= 0 else f"train.device={device}"
        return [Row("cuda", "", f"not needed: {why}")]
    gpu_nodes = [n for n in nodes if trials_at_once(n, cfg.cluster) > 0]
    answers = _answers([_pinned(cuda_starts, n, num_gpus=share).remote() for n in gpu_nodes], gpu_nodes)
    rows = []
    for node, answer in zip(gpu_nodes, answers):
        if isinstance(answer, Exception):
            answer = (f"no answer within {ANSWER_S:g} s ({type(answer).__name__})", "")
        why, runs = answer
        if why is None:
            rows.append(Row("cuda", cluster.node_name(node), f"CUDA starts: {runs}"))
        else:
            text = f"CUDA does not start ({runs}; train.device={device} would refuse every trial here): {why}"
            rows.append(Row("cuda", cluster.node_name(node), text, FAIL))
    return rows


def leave(location: str, node_id: str) -> str | None:
    """On a node: write `location` (a path or URI in the storage) holding this node's id; None, or why not."""
    from pyarrow import fs

    try:
        filesystem, path = fs.FileSystem.from_uri(location)
        with filesystem.open_output_stream(path) as out:
            out.write(node_id.encode())
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def _storage(storage: str | None, nodes: list[dict]) -> list[Row]:
    """The storage every trial resumes from: the driver's file seen by every node (cluster.check_shared),
    and each node's file seen by the driver."""
    where = f"cluster.storage {storage}" if storage else "Ray's default storage"
    try:
        cluster.check_shared(storage)
    except ClusterError as err:
        return [Row("storage", "", one_line(err), FAIL)]
    if storage is None or (len(nodes) < 2 and "://" not in storage):
        return [Row("storage", "", f"{where}: one node, whose own disk serves")]
    tokens = {n["NodeID"]: cluster.joined(storage, f".preflight-{uuid.uuid4().hex}") for n in nodes}
    wrote = _answers([_pinned(leave, n).remote(tokens[n["NodeID"]], n["NodeID"]) for n in nodes], nodes)
    rows = []
    for node, failed in zip(nodes, wrote):
        token = tokens[node["NodeID"]]
        if failed is None:
            failed = cluster.unseen(token)
            failed = failed and f"the driver does not find the file it wrote ({token}: {failed})"
        else:
            failed = f"cannot write there ({failed})"
        _remove(token)
        if failed:
            rows.append(Row("storage", cluster.node_name(node), f"{storage}: {failed}", FAIL))
    return rows or [Row("storage", "", f"{where} shared: each of {len(nodes)} nodes reads and writes it")]


def _remove(location: str) -> None:
    from pyarrow import fs

    try:
        filesystem, path = fs.FileSystem.from_uri(location)
        filesystem.delete_file(path)
    except (OSError, ValueError):
        pass  # never written, or written where the driver does not see it: nothing of ours to remove here


def _locks(uri: str, opened: bool) -> list[Row]:
    """A SQLite store's locks: the store's guard tried them as it opened the store for writing
    (tracking.sqlite_guard.locks_refused), and a refusal is the tracking row's fault."""
    folder = home.home(uri)
    if folder is None:
        return [Row("locks", "", "not needed: a tracking server's store")]
    if not opened:
        return []  # the tracking row says why, a file system without locks included
    return [Row("locks", "", f"{folder}: its file system takes SQLite's locks")]


def _budget(
    cfg: DictConfig,
    budget: Budget,
    priced: cost.Estimate | None,
    account: Account,
    rate: float | None,
    nodes: list[dict],
) -> list[Row]:
    """The budget's row: FAIL when no trial can reach its first checkpoint within what is left of it."""
    left = account.total - account.done
    need, how = _need(priced, account, rate, nodes, cfg.cluster)
    if budget.seconds is None:
        text = "no time budget (cluster.time_budget_s)"
        return [Row("budget", "", f"{text}; the {left:,} model-steps left need {how}" if need else text)]
    window, first = budget.left(), _first_checkpoint(priced)
    if first is not None and window < first[0] * first[1]:
        steps, per_step = first
        text = (
            f"cluster.time_budget_s={budget.seconds:g} leaves {window:,.0f} s, less than the quickest "
            f"trial's first checkpoint needs ({steps * per_step:,.0f} s: {steps} steps at {per_step:g} s, "
            "the measured step time): every allocation would stop with nothing saved"
        )
        return [Row("budget", "", text, FAIL)]
    if rate is not None or need is None:
        return [Row("budget", "", outlook(account, budget, rate))]
    runs = max(math.ceil(need / budget.seconds), 1)
    verdict = "should end within it" if need < window else f"about {runs} allocations of it"
    return [
        Row(
            "budget",
            "",
            f"cluster.time_budget_s={budget.seconds:g}: the {left:,} model-steps left need {how}: {verdict}",
        )
    ]


def _first_checkpoint(priced: cost.Estimate | None) -> tuple[int, float] | None:
    """The steps to the quickest trial's first checkpoint and its seconds per step (None: no step times)."""
    if priced is None or not priced.steps_to_report:
        return None
    return min(priced.steps_to_report, key=lambda pair: pair[0] * pair[1])


def _need(
    priced: cost.Estimate | None, account: Account, rate: float | None, nodes: list[dict], c: DictConfig
) -> tuple[float | None, str]:
    """The seconds what is left needs, and how it was estimated: at the sweep's last rate, else at the
    measured step times on the devices of the nodes that fit trials (one model at a time on each: an upper
    bound)."""
    left = account.total - account.done
    if rate:
        return (
            left / rate,
            f"about {duration(left / rate)} at {rate:,.1f} model-steps/s (the last allocation's)",
        )
    if priced is None or not account.total:
        return None, ""
    kind = "GPU" if priced.gpu else "CPU"
    devices = sum(n["Resources"].get(kind, 0) for n in nodes if trials_at_once(n, c) > 0)
    if not devices:
        return None, ""
    seconds = priced.hours * 3600 * left / account.total / devices
    return seconds, (
        f"at most about {duration(seconds)} on the cluster's {devices:g} {kind}s at the measured step times "
        "(one model at a time per device)"
    )


if __name__ == "__main__":
    sys.exit(main())
