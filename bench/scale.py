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
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from bench.common import exit_codes_help
from cli.entry import ArgumentParser

REPO = Path(__file__).resolve().parent.parent
# The child that measures one size: it calls the driver's internals, so it lives in sweeper/ and runs as a
# process (bench/ imports nothing of sweeper/). Its last line is JSON: the figures and the trial's shape.
PROBE = "sweeper.scale_probe"


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


def table(rows: list[dict], store: str, reports: int, points_per_report: int) -> str:
    """One line per size; ratios to the first size of the same packing."""
    head = (
        f"{'models':>6} {'trials':>6} {'pack':>5} {'s/trial':>8} {'cpu s/trial':>11} {'peak MiB':>8} "
        f"{'points/s':>8} {'runs':>5} {'lost':>4} | ratios to the smallest: s/trial, cpu, MiB, points/s"
    )
    lines = [
        f"scale probe, MLflow server on {store}, {reports} reports of {points_per_report} points per model",
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


def probe(models: int, pack: str, uri: str, overrides: list[str]) -> dict | None:
    """One size measured by its own process (PROBE); None when it failed, its stderr printed."""
    done = subprocess.run(
        [sys.executable, "-m", PROBE, str(models), pack, uri, *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse(sys.argv[1:] if argv is None else argv)
    runs = [(n, "none") for n in args.sizes] + ([(args.packs, "seeds")] if args.packs else [])
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="scale-probe-") as tmp,
        tracking_server(Path(tmp), args.store, args.workers) as (uri, store),
    ):
        for models, pack in runs:
            print(f"scale: {models} models, cluster.pack={pack}", file=sys.stderr, flush=True)
            measured = probe(models, pack, uri, overrides)
            if measured is None:
                return 1
            rows.append(measured["figures"])
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows, store, measured["reports"], measured["points_per_report"]))
    return 0 if all(r["exit_code"] == 0 and r["lost"] == 0 for r in rows) else 1
