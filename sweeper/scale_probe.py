"""Can the sweep driver carry the paper grid's 3,000 trials and its reports? `python -m sweeper.scale_probe`.

    python -m sweeper.scale_probe                          # 300, 1,000, 3,000 trials, then 300 packs of ten
    python -m sweeper.scale_probe --trials 20 --packs 0    # 20 trials only
    python -m sweeper.scale_probe --trials '' --packs 20 --intervals 20 --auth off,basic,cached \
        --report-every 1,10                                # 2 packs of ten, 20 evaluation intervals a model,
                                                           # with and without the tracking server's login

Each measurement runs in a fresh process through the sweep's production wiring (drive, as
`python -m sweeper.sweep` runs it: the sweep's ledger read once, its parent run locked, the Tuner with its
resources, the session as Tune callback with its writing thread and patient client, the stopper), against an
`mlflow server` on 127.0.0.1 (sweeper.scale.server: on PostgreSQL when the `pgserver` wheel is importable,
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
import itertools
import json
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from cli.entry import ArgumentParser, command
from config.help import composed_config
from sweeper.scale.probe import EVAL_EVERY, INTERVALS, interval_points, measured
from sweeper.scale.server import AUTH_MODES, database, tracking_server


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
    sys.exit(main())
