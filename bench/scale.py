"""Can the driver carry 3,000 trials? `python -m bench scale [TRIALS] [overrides]`.

Runs TRIALS no-op trials (default 300) through the sweep's real machinery —
Tuner, resources, the MlflowWriter into a fresh SQLite store — where each
trial only reports what a finished training run reports (its start, one eval's
points, its outcome). Prints JSON: wall seconds per trial (Tune scheduling and
MLflow writing, no training) and the driver's peak resident memory.

    python -m bench scale 300 cluster.cpus_per_trial=0.5
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time

import psutil

from sweeper import grid
from sweeper.metrics import FINISHED, METRICS, OUTCOME
from sweeper.sweep import jobs_of, load, packs_of


def noop_trial(config: dict, *, jobs: dict, packs: dict, base: list) -> None:
    """Reports like a finished run of train.steps=0: start, one evaluation, outcome; trains nothing."""
    from ray import tune

    from sweeper.trial import PAYLOAD, STEP

    payload = {"start": {"name": jobs[config["key"]]["name"], "params": {"probe": "1"}, "tags": {}},
               "points": [[key, 1.0, 0, int(time.time() * 1000)] for key in METRICS],
               "tags": {OUTCOME: FINISHED}, "status": "FINISHED"}
    tune.report({STEP: 0, PAYLOAD: {config["key"]: payload}})


class PeakRss(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stop = 0, threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, me.memory_info().rss)


def parse(argv: list[str]) -> tuple[int, list[str]]:
    """TRIALS (default 300) and config overrides."""
    count = int(argv[0]) if argv and argv[0].isdigit() else 300
    return count, [a for a in argv if not a.isdigit()]


def main(argv: list[str] | None = None) -> int:
    count, overrides = parse(sys.argv[1:] if argv is None else argv)
    tmp = tempfile.mkdtemp(prefix="scale-probe-")
    uri = f"sqlite:///{tmp}/mlflow.db"
    seeds = ", ".join(str(s) for s in range(-(-count // 300)))  # 300 configurations per seed
    cfg, plan = load(["sweep=paper", f"sweep.seeds=[{seeds}]", f"tracking.uri={uri}", f"cluster.storage={tmp}/ray",
                      *overrides])
    trials = grid.trials(cfg, plan)[:count]

    import ray

    from sweeper import store
    from sweeper.mlflow_callback import Ledger, MlflowWriter
    from sweeper.sweep import tune_fit

    client = store.connect(uri)
    experiment = store.experiment_id(client, "scale-probe")
    parent = client.create_run(experiment, run_name="probe").info.run_id
    jobs = jobs_of(trials)
    packs = packs_of(trials, set(jobs), "none")
    ray.init(address="local", dashboard_host=cfg.cluster.dashboard_host)
    writer = MlflowWriter(uri, experiment, "probe", parent, jobs, packs, Ledger())
    rss = PeakRss()
    rss.start()
    start_rss, start = psutil.Process().memory_info().rss, time.perf_counter()
    errors = tune_fit(cfg, plan, [], jobs, packs, f"{tmp}/ray", writer, trainable=noop_trial)
    wall = time.perf_counter() - start
    rss.stop.set()
    print(json.dumps({"trials": len(trials), "errors": errors, "runs_written": len(writer.outcomes),
                      "wall_s": round(wall, 1), "s_per_trial": round(wall / len(trials), 4),
                      "driver_rss_start_mib": round(start_rss / 2**20), "driver_rss_peak_mib": round(rss.peak / 2**20),
                      "cpus_per_trial": cfg.cluster.cpus_per_trial, "store": uri}))
    return 0 if errors == 0 else 1

