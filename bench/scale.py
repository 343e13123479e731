"""Can the sweep driver carry the paper grid's 3,000 trials? `python -m bench scale [options] [overrides]`.

    python -m bench scale                          # 300, 1,000 and 3,000 trials, then 300 packs of ten
    python -m bench scale --trials 20 --packs 0    # 20 trials only
    python -m bench scale --trials '' --packs 3000 # the 300 packs of ten only

Each size runs in a fresh process through the sweep's production wiring
(sweeper.sweep.drive, as `python -m sweeper.sweep` runs it: the sweep's
ledger read once, its parent run locked, the Tuner with its resources, the
session as Tune callback with its writing thread and patient client, the
stopper), against one MLflow tracking server (`mlflow server`, a
subprocess) on PostgreSQL when the `pgserver` wheel is importable, else on
SQLite. Trials train nothing: each reports what a paper trial reports over
REPORTS evaluation intervals (its start, every metric point of the interval,
a checkpoint) and then its outcome, so what is measured is the driver:
scheduling, Tune's bookkeeping and MLflow writing.

Per size it prints JSON, then a table: driver wall and CPU seconds per trial,
the driver's peak resident memory, metric points written per second, runs
stored with an outcome (none lost), and each figure's ratio to the smallest
size's. Exit code 1 when a run is missing or the sweep did not end every trial.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import psutil

from bench.common import exit_codes_help
from cli.entry import ArgumentParser
from tracking.names import FINISHED, METRICS, OUTCOME, SYSTEM_METRICS, TRAIN_LOSS

if TYPE_CHECKING:
    from sweeper.work import Work

REPO = Path(__file__).resolve().parent.parent
REPORTS = 2  # evaluation intervals each trial reports before its outcome
EVAL_EVERY = 50  # the paper's train.eval_every and train.log_every: 5 train_loss points and
LOG_EVERY = 10  # one point of each evaluation metric per interval, as a real trial sends
CONFIGURATIONS = 300  # the paper grid: 300 configurations x 10 seeds
PACK = 10


def interval_points(step: int) -> list:
    """The metric points (sweeper.trial.Point) a paper trial reports for the interval ending at `step`, its
    system metrics included (training.system_metrics)."""
    from sweeper.trial import Point

    now = int(time.time() * 1000)
    points = [
        Point(TRAIN_LOSS, 1.0, s, now) for s in range(step - EVAL_EVERY + LOG_EVERY, step + 1, LOG_EVERY)
    ]
    points += [Point(key, 1.0, step, now) for key in METRICS if key != TRAIN_LOSS]
    return points + [Point(key, 1.0, step, now) for key in SYSTEM_METRICS]  # the trial's sample (a CPU's)


def noop_trial(config: dict, *, work: Work) -> None:
    """Reports like a trial of the paper grid (every job of its pack) and trains nothing."""
    from ray import tune

    from sweeper.trial import PAYLOAD, STEP, Recorded, RunStart

    members = work.trial_of(config).members
    folder = Path(tune.get_context().get_trial_dir()) / "work"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, REPORTS + 1):
        recorded = {m.key: Recorded(points=interval_points(i * EVAL_EVERY)) for m in members}
        if i == 1:
            for m in members:
                recorded[m.key].start = RunStart(m.name, {"probe": "1"}, {})
        (folder / "state").write_text(
            str(i)
        )  # a checkpoint per report, as training writes one per evaluation
        tune.report(
            {STEP: i * EVAL_EVERY, PAYLOAD: recorded}, checkpoint=tune.Checkpoint.from_directory(str(folder))
        )
    outcome = {m.key: Recorded(tags={OUTCOME: FINISHED}, status="FINISHED") for m in members}
    tune.report({STEP: REPORTS * EVAL_EVERY, PAYLOAD: outcome})


class PeakRss(threading.Thread):
    """The process' peak resident memory, sampled every 0.2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stop = 0, threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, me.memory_info().rss)


def measure(models: int, pack: str, uri: str, overrides: list[str]) -> dict:
    """Run `models` jobs of the paper grid (packed by `pack`) on the server at `uri`; the driver's figures."""
    import ray

    from config import grid
    from sweeper import ledger
    from sweeper.sweep import drive, load
    from tracking import store

    tmp = tempfile.mkdtemp(prefix="scale-probe-")
    # Unpacked: as many seeds as `models` needs; packed: the paper's ten seeds. Then the first configurations,
    # enough for `models` jobs (rounded up to whole configurations).
    seeds = range(PACK) if pack == "seeds" else range(-(-models // CONFIGURATIONS))
    name = f"scale-{models}-{pack}-{os.getpid()}"
    cfg, plan = load(
        [
            "sweep=paper",
            f"sweep.seeds=[{', '.join(map(str, seeds))}]",
            f"tracking.uri={uri}",
            f"tracking.experiment={name}",
            f"cluster.storage={tmp}/ray",
            f"cluster.pack={pack}",
            *overrides,
        ]
    )
    plan = dataclasses.replace(plan, configurations=plan.configurations[: -(-models // len(seeds))])
    ray.init(address="local", dashboard_host=cfg.cluster.dashboard_host, include_dashboard=False)
    me = psutil.Process()
    rss = PeakRss()
    rss.start()
    start_rss, start_cpu, start = me.memory_info().rss, me.cpu_times(), time.perf_counter()
    summary = drive(cfg, plan, [], trainable=noop_trial)
    wall, end_cpu = time.perf_counter() - start, me.cpu_times()
    rss.stop.set()
    ray.shutdown()
    cpu = (end_cpu.user - start_cpu.user) + (end_cpu.system - start_cpu.system)
    runs = store.search(store.connect(uri), [summary.experiment])
    jobs = {j.key for j in grid.jobs(cfg, plan)}
    stored = len(ledger.read(runs, plan.name).done & jobs)
    trials = summary.trials
    return {
        "models": len(jobs),
        "trials": trials,
        "pack": pack,
        "exit_code": summary.exit_code,  # the sweep's: 0 when every trial ended
        "runs_stored": stored,
        "lost": len(jobs) - stored,
        "wall_s": round(wall, 1),
        "s_per_trial": round(wall / trials, 4),
        "cpu_s_per_trial": round(cpu / trials, 4),
        "driver_rss_start_mib": round(start_rss / 2**20),
        "driver_rss_peak_mib": round(rss.peak / 2**20),
        "points_written": summary.points_written,
        "points_per_s": round(summary.points_written / wall, 1),
        "cpus_per_trial": cfg.cluster.cpus_per_trial,
    }


def postgres_uri(root: Path) -> str | None:
    """A PostgreSQL server of the `pgserver` wheel under root, or None without the wheel."""
    try:
        import pgserver
    except ImportError:
        return None
    server = pgserver.get_server(str(root / "pgdata"), cleanup_mode="stop")  # stopped when this process exits
    server.psql("CREATE DATABASE mlflow;")
    return server.get_uri("mlflow")


@contextmanager
def tracking_server(root: Path, store: str, workers: int = 4) -> Iterator[tuple[str, str]]:
    """An `mlflow server` on a free port over PostgreSQL (store auto or postgres, when possible) or SQLite,
    with `workers` worker processes (MLflow's default: 4)."""
    backend = postgres_uri(root) if store != "sqlite" else None
    if backend is None and store == "postgres":
        raise SystemExit(
            "error: --store=postgres needs the pgserver wheel (pip install pgserver 'psycopg[binary]')"
        )
    backend = backend or f"sqlite:///{root}/mlflow.db"
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = (root / "mlflow-server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            backend,
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # no job runner
    try:
        wait_healthy(uri, proc, root / "mlflow-server.log")
        yield uri, backend.split(":", 1)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        log.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(uri: str, proc: subprocess.Popen, log: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(
        f"mlflow server at {uri} did not answer within {seconds} s:\n{log.read_text()[-3000:]}"
    )


def table(rows: list[dict], store: str) -> str:
    """One line per size; ratios to the first size of the same packing."""
    head = (
        f"{'models':>6} {'trials':>6} {'pack':>5} {'s/trial':>8} {'cpu s/trial':>11} {'peak MiB':>8} "
        f"{'points/s':>8} {'runs':>5} {'lost':>4} | ratios to the smallest: s/trial, cpu, MiB, points/s"
    )
    lines = [
        f"scale probe, MLflow server on {store}, {REPORTS} reports of {len(interval_points(EVAL_EVERY))} "
        f"points per model",
        head,
    ]
    first: dict[str, dict] = {}
    for r in rows:
        base = first.setdefault(r["pack"], r)
        ratios = [
            r[k] / base[k] if base[k] else float("nan")
            for k in ("s_per_trial", "cpu_s_per_trial", "driver_rss_peak_mib", "points_per_s")
        ]
        lines.append(
            f"{r['models']:>6} {r['trials']:>6} {r['pack']:>5} {r['s_per_trial']:>8.3f} "
            f"{r['cpu_s_per_trial']:>11.3f} {r['driver_rss_peak_mib']:>8} {r['points_per_s']:>8.0f} "
            f"{r['runs_stored']:>5} {r['lost']:>4} | " + ", ".join(f"{x:.2f}x" for x in ratios)
        )
    return "\n".join(lines)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = ArgumentParser(
        prog="python -m bench scale",
        description=__doc__,
        epilog=exit_codes_help(),
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
    parser.add_argument("--one", nargs=3, metavar=("MODELS", "PACK", "URI"), help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unknown option(s) {' '.join(unknown)}; config overrides are key=value")
    try:
        args.sizes = [int(t) for t in args.trials.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--trials={args.trials} is not allowed: comma-separated integers >= 1")
    if args.workers < 1:
        parser.error(f"--workers={args.workers} is not allowed: an integer >= 1")
    if min(args.sizes, default=1) < 1 or args.packs < 0 or not (args.sizes or args.packs):
        parser.error("--trials must be integers >= 1 and --packs an integer >= 0, not both empty")
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse(sys.argv[1:] if argv is None else argv)
    if args.one:  # a child: one measurement in a fresh process, its JSON the last line
        models, pack, uri = args.one
        print(json.dumps(measure(int(models), pack, uri, overrides)))
        return 0
    runs = [(n, "none") for n in args.sizes] + ([(args.packs, "seeds")] if args.packs else [])
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="scale-probe-") as tmp,
        tracking_server(Path(tmp), args.store, args.workers) as (uri, store),
    ):
        for models, pack in runs:
            print(f"scale: {models} models, cluster.pack={pack}", file=sys.stderr, flush=True)
            done = subprocess.run(
                [sys.executable, "-m", "bench", "scale", "--one", str(models), pack, uri, *overrides],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows, store))
    return 0 if all(r["exit_code"] == 0 and r["lost"] == 0 for r in rows) else 1
