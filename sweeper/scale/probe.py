"""One measurement of the scale probe (`python -m sweeper.scale_probe`, whose help says what it measures).

A sweep of the paper grid cut to its first models (probe_sweep) is driven by the sweep's own timeline
(sweeper.driver.timeline.drive) with trials that report as a paper trial does and train nothing (noop_trial),
against a tracking server of sweeper.scale.server; measure returns what it cost the driver, measured runs it
in the fresh process the command starts for each measurement.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import psutil

from config.grid import Sweep, load
from sweeper.scale.server import Server
from tracking.names import FINISHED, METRICS, OUTCOME, SYSTEM_METRICS, TRAIN_LOSS

if TYPE_CHECKING:
    from sweeper.driver.session import Summary
    from sweeper.driver.trial import Point
    from sweeper.driver.work import Work

INTERVALS = 2  # evaluation intervals each model reports before its outcome (--intervals; the paper's: 200)
EVAL_EVERY = 50  # the paper's train.eval_every and train.log_every: 5 train_loss points and
LOG_EVERY = 10  # one point of each evaluation metric per interval, as a real trial sends
CONFIGURATIONS = 300  # the paper grid: 300 configurations x 10 seeds
PACK = 10


def interval_points(step: int) -> list[Point]:
    """The metric points a paper trial reports for the interval ending at `step`, its system metrics
    included (training.system_metrics)."""
    from sweeper.driver.trial import Point

    now = int(time.time() * 1000)
    points = [
        Point(TRAIN_LOSS, 1.0, s, now) for s in range(step - EVAL_EVERY + LOG_EVERY, step + 1, LOG_EVERY)
    ]
    points += [Point(key, 1.0, step, now) for key in METRICS if key != TRAIN_LOSS]
    return points + [Point(key, 1.0, step, now) for key in SYSTEM_METRICS]  # the trial's sample (a CPU's)


def noop_trial(config: dict, *, work: Work, intervals: int, every: int) -> None:
    """Reports like a trial of the paper grid (every job of its pack) over `intervals` evaluation intervals,
    one report in `every` (cluster.report_every) and the last, and trains nothing."""
    from ray import tune

    from sweeper.driver.trial import PAYLOAD, STEP, Recorded, RunStart

    members = work.trial_of(config).members
    folder = Path(tune.get_context().get_trial_dir()) / "work"
    folder.mkdir(parents=True, exist_ok=True)
    recorded = {m.key: Recorded(start=RunStart(m.name, {"probe": "1"}, {})) for m in members}
    for i in range(1, intervals + 1):
        for m in members:
            recorded[m.key].points += interval_points(i * EVAL_EVERY)
        if i % every and i < intervals:
            continue
        (folder / "state").write_text(str(i))  # a checkpoint per report, as training writes one
        tune.report(
            {STEP: i * EVAL_EVERY, PAYLOAD: recorded}, checkpoint=tune.Checkpoint.from_directory(str(folder))
        )
        recorded = {m.key: Recorded() for m in members}
    outcome = {m.key: Recorded(tags={OUTCOME: FINISHED}, status="FINISHED") for m in members}
    tune.report({STEP: intervals * EVAL_EVERY, PAYLOAD: outcome})


class PeakRss(threading.Thread):
    """The process' peak resident memory, sampled every 0.2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stop = 0, threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, me.memory_info().rss)


@dataclass
class Drive:
    """What one drive of a sweep cost the driver process (timed_drive), and the server's requests in it."""

    summary: Summary  # the sweep's (sweeper.driver.timeline.drive)
    wall_s: float
    cpu_s: float  # user and system
    start_rss: int  # bytes, before the drive
    peak_rss: int  # bytes, sampled every 0.2 s (PeakRss)
    requests: list[int]  # the server's during the drive: all, then log-batch (Server.requests)


def probe_sweep(models: int, pack: str, server: Server, overrides: list[str]) -> Sweep:
    """The paper grid cut to its first `models` jobs (packed by `pack`), tracked on `server`; Ray's storage
    beside the server's log."""
    tmp = tempfile.mkdtemp(prefix="ray-", dir=server.log.parent)  # removed with the command's folder
    # Unpacked: as many seeds as `models` needs; packed: the paper's ten seeds. Then the first configurations,
    # enough for `models` jobs (rounded up to whole configurations).
    seeds = range(PACK) if pack == "seeds" else range(-(-models // CONFIGURATIONS))
    name = f"scale-{models}-{pack}-{os.getpid()}"
    return load(
        [
            "sweep=paper",
            f"sweep.seeds=[{', '.join(map(str, seeds))}]",
            f"tracking.uri={server.uri}",
            f"tracking.experiment={name}",
            f"cluster.storage={tmp}/ray",
            f"cluster.pack={pack}",
            *overrides,
        ]
    ).first(-(-models // len(seeds)))


def timed_drive(sweep: Sweep, trainable: Callable, server: Server) -> Drive:
    """Drive `sweep` with `trainable` on a local Ray, as `python -m sweeper.sweep` would; what it cost."""
    import ray

    from sweeper.driver import cost
    from sweeper.driver.timeline import drive

    plan_cost = cost.reckon(sweep.cfg, sweep.plan)  # as the command reckons it, before the sweep and untimed
    ray.init(address="local", dashboard_host=sweep.cfg.cluster.dashboard_host, include_dashboard=False)
    me = psutil.Process()
    rss = PeakRss()
    rss.start()
    requests = server.requests()
    start_rss, start_cpu, start = me.memory_info().rss, me.cpu_times(), time.perf_counter()
    summary = drive(sweep, ["python", "-m", "sweeper.sweep"], plan_cost, trainable=trainable)
    wall, end_cpu = time.perf_counter() - start, me.cpu_times()
    requests = [after - before for after, before in zip(server.requests(), requests)]
    rss.stop.set()
    ray.shutdown()
    cpu = (end_cpu.user - start_cpu.user) + (end_cpu.system - start_cpu.system)
    return Drive(summary, wall, cpu, start_rss, rss.peak, requests)


def measure(models: int, pack: str, server: Server, intervals: int, overrides: list[str]) -> dict:
    """Run `models` jobs of the paper grid (packed by `pack`) on `server`; the driver's figures."""
    from sweeper.driver import ledger
    from tracking import store

    sweep = probe_sweep(models, pack, server, overrides)
    cfg = sweep.cfg
    every = cfg.cluster.report_every
    trial = functools.update_wrapper(
        functools.partial(noop_trial, intervals=intervals, every=every), noop_trial
    )  # Tune names a function trainable by its __name__
    driven = timed_drive(sweep, trial, server)
    summary, wall, requests = driven.summary, driven.wall_s, driven.requests
    runs = store.search(store.connect(server.uri), [summary.experiment])
    jobs = {j.key for j in sweep.jobs}
    stored = len(ledger.read(runs, sweep.plan.name).done & jobs)
    trials = summary.trials
    reports = len(jobs) * (math.ceil(intervals / every) + 1)  # the intervals' reports and the outcome's
    return {
        "models": len(jobs),
        "trials": trials,
        "pack": pack,
        "auth": server.auth,
        "report_every": every,
        "model_reports": reports,
        "exit_code": summary.exit_code,  # the sweep's: 0 when every trial ended
        "runs_stored": stored,
        "lost": len(jobs) - stored,
        "wall_s": round(wall, 1),
        "s_per_trial": round(wall / trials, 4),
        "cpu_s_per_trial": round(driven.cpu_s / trials, 4),
        "driver_rss_start_mib": round(driven.start_rss / 2**20),
        "driver_rss_peak_mib": round(driven.peak_rss / 2**20),
        "points_written": summary.points_written,
        "points_per_s": round(summary.points_written / wall, 1),
        "requests": requests[0],
        "log_batch_requests": requests[1],
        "requests_per_s": round(requests[0] / wall, 1),
        "requests_per_report": round(requests[0] / reports, 2),
        "s_per_report": round(wall / reports, 4),
        # The writing thread alone: its time in writes (the rest of the wall it waited for reports).
        "writer_busy_s": round(summary.writer_busy_s, 1),
        "writer_requests_per_s": round(requests[0] / summary.writer_busy_s, 1),
        "writer_s_per_report": round(summary.writer_busy_s / reports, 4),
        "cpus_per_trial": cfg.cluster.cpus_per_trial,
    }


def measured(models: int, pack: str, server: Server, intervals: int, overrides: list[str], log: Path) -> dict:
    """measure() in this fresh process, its output (Ray's, the driver's) into `log`, the server's login
    in its environment."""
    with log.open("a") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    os.environ.update(server.credentials)
    return measure(models, pack, server, intervals, overrides)
