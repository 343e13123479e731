"""Can the sweep driver carry the paper grid's 3,000 trials and its reports? `python -m sweeper.scale_probe`.

    python -m sweeper.scale_probe                          # 300, 1,000, 3,000 trials, then 300 packs of ten
    python -m sweeper.scale_probe --trials 20 --packs 0    # 20 trials only
    python -m sweeper.scale_probe --trials '' --packs 20 --intervals 20 --auth off,basic,cached \
        --report-every 1,10                                # 2 packs of ten, 20 evaluation intervals a model,
                                                           # with and without the tracking server's login

Each measurement runs in a fresh process through the sweep's production wiring (drive, as
`python -m sweeper.sweep` runs it: the sweep's ledger read once, its parent run locked, the Tuner with its
resources, the session as Tune callback with its writing thread and patient client, the stopper), against an
`mlflow server` on 127.0.0.1 (sweeper.scale_server: on PostgreSQL when the `pgserver` wheel is importable,
else SQLite; with each --auth mode in turn, and each --report-every). Trials train nothing: each model
reports what a paper model reports over INTERVALS evaluation intervals (every metric point, a checkpoint;
one report in cluster.report_every intervals, as a trial sends them) and then its outcome, so what is
measured is the driver: scheduling, Tune's bookkeeping and MLflow writing.

Per measurement it prints JSON, then a table: driver wall and CPU seconds per trial, the driver's peak
resident memory, metric points written per second, the server's requests per model-report, seconds per
model-report, the writing thread's requests per second and seconds per model-report while it writes (what
it can carry), runs stored with an outcome (none lost), and each figure's ratio to the first measurement of
its packing. Exit code 1 when a run is missing or the sweep did not end every trial.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import psutil

from cli.entry import ArgumentParser, command
from config.help import composed_config
from sweeper.scale_server import AUTH_MODES, Server, database, tracking_server
from tracking.names import FINISHED, METRICS, OUTCOME, SYSTEM_METRICS, TRAIN_LOSS

if TYPE_CHECKING:
    from config.grid import Sweep
    from sweeper.session import Summary
    from sweeper.trial import Point
    from sweeper.work import Work

INTERVALS = 2  # evaluation intervals each model reports before its outcome (--intervals; the paper's: 200)
EVAL_EVERY = 50  # the paper's train.eval_every and train.log_every: 5 train_loss points and
LOG_EVERY = 10  # one point of each evaluation metric per interval, as a real trial sends
CONFIGURATIONS = 300  # the paper grid: 300 configurations x 10 seeds
PACK = 10


def interval_points(step: int) -> list[Point]:
    """The metric points a paper trial reports for the interval ending at `step`, its system metrics
    included (training.system_metrics)."""
    from sweeper.trial import Point

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

    from sweeper.trial import PAYLOAD, STEP, Recorded, RunStart

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

    summary: Summary  # the sweep's (sweeper.timeline.drive)
    wall_s: float
    cpu_s: float  # user and system
    start_rss: int  # bytes, before the drive
    peak_rss: int  # bytes, sampled every 0.2 s (PeakRss)
    requests: list[int]  # the server's during the drive: all, then log-batch (Server.requests)


def probe_sweep(models: int, pack: str, server: Server, overrides: list[str]) -> Sweep:
    """The paper grid cut to its first `models` jobs (packed by `pack`), tracked on `server`; Ray's storage
    beside the server's log."""
    from sweeper.sweep import load

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

    from sweeper.timeline import drive

    ray.init(address="local", dashboard_host=sweep.cfg.cluster.dashboard_host, include_dashboard=False)
    me = psutil.Process()
    rss = PeakRss()
    rss.start()
    requests = server.requests()
    start_rss, start_cpu, start = me.memory_info().rss, me.cpu_times(), time.perf_counter()
    summary = drive(sweep, ["python", "-m", "sweeper.sweep"], trainable=trainable)
    wall, end_cpu = time.perf_counter() - start, me.cpu_times()
    requests = [after - before for after, before in zip(server.requests(), requests)]
    rss.stop.set()
    ray.shutdown()
    cpu = (end_cpu.user - start_cpu.user) + (end_cpu.system - start_cpu.system)
    return Drive(summary, wall, cpu, start_rss, rss.peak, requests)


def measure(models: int, pack: str, server: Server, intervals: int, overrides: list[str]) -> dict:
    """Run `models` jobs of the paper grid (packed by `pack`) on `server`; the driver's figures."""
    from sweeper import ledger
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


def table(rows: list[dict], intervals: int, points_per_interval: int) -> str:
    """One line per measurement; ratios to the first of the same packing."""
    head = (
        f"{'models':>6} {'trials':>6} {'pack':>5} {'auth':>6} {'every':>5} {'s/trial':>8} "
        f"{'cpu s/trial':>11} {'peak MiB':>8} {'points/s':>8} {'req/report':>10} {'s/report':>8} "
        f"{'writer req/s':>12} {'writer s/report':>15} {'runs':>5} {'lost':>4} | ratios to the first: "
        "s/trial, cpu, MiB, points/s, s/report, writer s/report"
    )
    lines = [f"scale probe, {intervals} intervals of {points_per_interval} points per model", head]
    first: dict[str, dict] = {}
    for r in rows:
        base = first.setdefault(r["pack"], r)
        keys = ("s_per_trial", "cpu_s_per_trial", "driver_rss_peak_mib", "points_per_s", "s_per_report")
        keys += ("writer_s_per_report",)
        ratios = [r[k] / base[k] if base[k] else float("nan") for k in keys]
        lines.append(
            f"{r['models']:>6} {r['trials']:>6} {r['pack']:>5} {r['auth']:>6} {r['report_every']:>5} "
            f"{r['s_per_trial']:>8.3f} {r['cpu_s_per_trial']:>11.3f} {r['driver_rss_peak_mib']:>8} "
            f"{r['points_per_s']:>8.0f} {r['requests_per_report']:>10.2f} {r['s_per_report']:>8.4f} "
            f"{r['writer_requests_per_s']:>12.1f} {r['writer_s_per_report']:>15.4f} {r['runs_stored']:>5} "
            f"{r['lost']:>4} | " + ", ".join(f"{x:.2f}x" for x in ratios)
        )
    return "\n".join(lines)


def probe_parser() -> ArgumentParser:
    """The probe's own options; whatever else the command line holds is config overrides (parse)."""
    parser = ArgumentParser(
        prog="python -m sweeper.scale_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--trials", default="300,1000,3000", help="models per measurement, one trial each ('' skips them)"
    )
    parser.add_argument(
        "--packs",
        type=int,
        default=3000,
        help="models of the cluster.pack=seeds measurement (ten per trial; 0 skips it)",
    )
    parser.add_argument(
        "--intervals",
        type=int,
        default=INTERVALS,
        help=f"evaluation intervals each model reports ({INTERVALS}; the paper's 10,000 steps are 200)",
    )
    parser.add_argument(
        "--auth",
        default="off",
        help="the tracking server's login, comma-separated, each measured in turn: off, basic (MLflow's "
        "basic-auth app as it comes), cached (with the recipes' credential cache, "
        "docker/mlflow/basic_auth.ini)",
    )
    parser.add_argument(
        "--report-every",
        default="1",
        help="cluster.report_every, comma-separated, each measured in turn (1: a report per interval)",
    )
    parser.add_argument(
        "--store",
        choices=("auto", "postgres", "sqlite"),
        default="auto",
        help="the tracking server's database (auto: PostgreSQL when pgserver is importable)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=4,
        help="the tracking server's worker processes (MLflow's default; a small probe needs one)",
    )
    return parser


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, each checked (parser.error, cli.entry's answer, on the first bad one), and the config
    overrides, key=value; --trials, --report-every and --auth as lists (args.sizes, .report_every, .auth)."""
    parser = probe_parser()
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unknown option(s) {' '.join(unknown)}; config overrides are key=value")
    try:
        args.sizes = [int(t) for t in args.trials.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--trials={args.trials} is not allowed: comma-separated integers >= 1")
    try:
        args.report_every = [int(e) for e in args.report_every.split(",")]
    except ValueError:
        args.report_every = [0]
    if min(args.report_every) < 1:
        parser.error(f"--report-every={args.report_every} is not allowed: comma-separated integers >= 1")
    args.auth = args.auth.split(",")
    if not set(args.auth) <= set(AUTH_MODES):
        parser.error(
            f"--auth={','.join(args.auth)} is not allowed: comma-separated of {', '.join(AUTH_MODES)}"
        )
    if args.workers < 1 or args.intervals < 1:
        parser.error("--workers and --intervals must be integers >= 1")
    if min(args.sizes, default=1) < 1 or args.packs < 0 or not (args.sizes or args.packs):
        parser.error("--trials must be integers >= 1 and --packs an integer >= 0, not both empty")
    return args, overrides


# Answered as the other commands answer (cli.entry), and as quiet (cli.console) as the sweep it measures.
@command("leaner-scale-probe", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    args, overrides = parse(argv)
    sizes = [(n, "none") for n in args.sizes] + ([(args.packs, "seeds")] if args.packs else [])
    rows = []
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="scale-probe-") as tmp:
        backend = database(Path(tmp), args.store)
        for auth in args.auth:
            with tracking_server(Path(tmp), backend, auth, args.workers) as server:
                for (models, pack), every in itertools.product(sizes, args.report_every):
                    print(
                        f"scale: {models} models, cluster.pack={pack}, auth {auth}, report_every {every}",
                        file=sys.stderr,
                        flush=True,
                    )
                    log = Path(tmp) / f"probe-{len(rows)}.log"
                    more = [*overrides, f"cluster.report_every={every}"]
                    # A fresh process per measurement: its peak memory and Ray's state are its own.
                    with ProcessPoolExecutor(1, mp_context=spawn) as child:
                        try:
                            rows.append(
                                child.submit(
                                    measured, models, pack, server, args.intervals, more, log
                                ).result()
                            )
                        except Exception as err:
                            print(f"{log.read_text()[-3000:]}\n{type(err).__name__}: {err}", file=sys.stderr)
                            return 1
                    print(json.dumps(rows[-1]), flush=True)
    print(table(rows, args.intervals, len(interval_points(EVAL_EVERY))))
    print(f"tracking server on {backend.split(':', 1)[0]}")
    return 0 if all(r["exit_code"] == 0 and r["lost"] == 0 for r in rows) else 1


if __name__ == "__main__":
    # As the imported module, not __main__: Tune's workers then import noop_trial by reference, as they do a
    # sweep's trainable, and the measuring process finds measured(), instead of receiving them pickled by
    # value.
    from sweeper import scale_probe

    sys.exit(scale_probe.main())
