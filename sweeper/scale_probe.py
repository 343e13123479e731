"""The child process of `python -m bench scale`: one measurement of the sweep driver, in a fresh process.

    python -m sweeper.scale_probe MODELS PACK URI [key=value overrides]

Runs MODELS jobs of the paper grid (cluster.pack=PACK) through the sweep's production wiring (drive, as
`python -m sweeper.sweep` runs it) against the MLflow tracking server at URI, with trials that train
nothing: each reports what a paper trial reports over REPORTS evaluation intervals (its start, every metric
point of the interval, a checkpoint) and then its outcome. Its last line of output is JSON: the driver's
figures ("figures") and the shape of a trial ("reports", "points_per_report"), for bench scale's table.
It lives here, not in bench/, because it calls the driver's internals; bench/ imports nothing of sweeper/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from cli.entry import ArgumentParser, command
from config.help import composed_config
from tracking.names import FINISHED, METRICS, OUTCOME, SYSTEM_METRICS, TRAIN_LOSS

if TYPE_CHECKING:
    from sweeper.trial import Point
    from sweeper.work import Work

REPORTS = 2  # evaluation intervals each trial reports before its outcome
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


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = ArgumentParser(
        prog="python -m sweeper.scale_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("models", type=int, help="jobs of the paper grid to run")
    parser.add_argument("pack", help="cluster.pack: none (one model a trial) or seeds (ten)")
    parser.add_argument("uri", help="the MLflow tracking server")
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unknown option(s) {' '.join(unknown)}; config overrides are key=value")
    return args, overrides


# Answered as leaner-bench answers (cli.entry): this process is part of its `scale` command, and is as quiet
# (cli.console) as the sweep it measures.
@command("leaner-bench", show_config=composed_config, own_options=True)
def main(argv: list[str]) -> int:
    args, overrides = parse(argv)
    figures = measure(args.models, args.pack, args.uri, overrides)
    shape = {"reports": REPORTS, "points_per_report": len(interval_points(EVAL_EVERY))}
    print(json.dumps({"figures": figures, **shape}))
    return 0


if __name__ == "__main__":
    # As the imported module, not __main__: Tune's workers then import noop_trial by reference, as they do a
    # sweep's trainable, instead of receiving it (and what it refers to) pickled by value.
    from sweeper import scale_probe

    sys.exit(scale_probe.main())
