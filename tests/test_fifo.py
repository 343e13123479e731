"""sweeper.driver.fifo.LiveFifo on a real Ray instance: trials start in the order Tune's own FIFOScheduler
starts them, a failed trial's retry included (Tune puts it at the end of its queue)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ray_local

from sweeper.driver.fifo import LiveFifo

pytestmark = pytest.mark.slow


def start_order(scheduler, tmp: Path) -> list[int]:
    from ray import tune

    started: list[int] = []

    def once_failing(config: dict) -> None:  # nested: pickled by value, as the workers cannot import tests/
        """Fails its first attempt when config["fail"] (a marker file says it did), then reports once."""
        marker = Path(config["fail"]) if config["fail"] else None
        if marker is not None and not marker.exists():
            marker.touch()
            raise RuntimeError("first attempt fails")
        tune.report({"x": config["i"]})

    class Starts(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info) -> None:
            started.append(trial.config["i"])

    tuner = tune.Tuner(
        tune.with_resources(once_failing, {"cpu": 1}),
        param_space={
            "i": tune.grid_search(list(range(6))),
            "fail": tune.sample_from(lambda spec: str(tmp / "failed") if spec.config.i == 2 else ""),
        },
        # reuse_actors, as the sweep runs them: a trial's worker starts once, not once per trial.
        tune_config=tune.TuneConfig(scheduler=scheduler, max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(
            storage_path=str(tmp / "ray"),
            callbacks=[Starts()],
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=1),
        ),
    )
    results = tuner.fit()
    assert not results.errors and sorted(r.metrics["x"] for r in results) == list(range(6))
    return started


def test_live_fifo_starts_trials_as_tunes_fifo_does(tmp_path: Path) -> None:
    from ray.tune.schedulers import FIFOScheduler

    with ray_local.own(num_cpus=1):  # one trial at a time: the start order is the scheduler's alone
        tunes = start_order(FIFOScheduler(), tmp_path / "tune")
        ours = start_order(LiveFifo(), tmp_path / "ours")
    assert ours == tunes
    assert ours.count(2) == 2 and sorted(set(ours)) == list(
        range(6)
    )  # trial 2 started twice: failed, retried
