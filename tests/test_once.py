"""tests/support/once.py, the check the sweep tests end with, on a real SQLite MLflow store holding a sweep's
runs as its driver writes them (each with its config_hash, the sweep's tag, its params and every metric point
its configuration logs): as a sweep done once leaves them, it passes; with each fault planted (a job run
twice, a job without a run, a run of no job, a point stored twice, a point lost), it fails with a line that
names the run or point."""

from __future__ import annotations

import time
from typing import Callable

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from support.histories import expected_counts
from support.once import assert_every_job_once_every_point_once
from support.sweeps import sweep_jobs

from config.compose import compose
from config.grid import Job
from config.identity import flat_params
from tracking.names import CONFIG_HASH, SWEEP, TRAIN_LOSS, VAL_REL_LLOYD

EXPERIMENT = "once"
BASE = ["train.steps=20", "train.eval_every=10"]  # the sweep's own overrides: a few points a run
AT = 10  # the evaluation step a fault doubles or drops


def logged_steps(cfg) -> dict[str, list[int]]:
    """The steps at which a run of cfg logs each metric (train_loss every log_every steps; the rest at step 0,
    every eval_every and the end), written here apart from expected_counts, which only counts them."""
    t = cfg.train
    evals = sorted({0, t.steps} | set(range(t.eval_every, t.steps + 1, t.eval_every)))
    return {
        key: list(range(t.log_every, t.steps + 1, t.log_every)) if key == TRAIN_LOSS else evals
        for key in expected_counts(cfg)
    }


def log_run(client: MlflowClient, job: Job, lose: str | None = None) -> str:
    """A run of `job` as the sweep's driver records it, every point its configuration logs (but metric
    `lose`'s at step AT); its id."""
    cfg = configuration(job)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
    run = client.create_run(experiment_id, tags={CONFIG_HASH: job.key, SWEEP: "smoke"}, run_name=job.name)
    now = int(time.time() * 1000)
    points = [(key, s) for key, at in logged_steps(cfg).items() for s in at if (key, s) != (lose, AT)]
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(key, float(s), now, s) for key, s in points],
        params=[Param(k, v) for k, v in flat_params(cfg).items()],
    )
    return run.info.run_id


def configuration(job: Job):
    return compose([*BASE, *job.overrides, f"seed={job.seed}"])


@pytest.fixture(scope="module")
def jobs() -> list[Job]:
    return sweep_jobs(["sweep=smoke"])[:3]


def test_a_sweep_done_once_passes_and_hands_back_its_runs_and_points(sqlite_uri, jobs):
    client = MlflowClient(tracking_uri=sqlite_uri)
    ids = {job.key: log_run(client, job) for job in jobs}
    stored = assert_every_job_once_every_point_once(sqlite_uri, EXPERIMENT, jobs, BASE)
    assert {key: run.info.run_id for key, run in stored.runs.items()} == ids
    assert stored.points == sum(len(at) for job in jobs for at in logged_steps(configuration(job)).values())


# Each fault, planted in a store that holds every job's run once (`ids`: their run ids by config_hash): the
# jobs to check the store against, and the words the failure must hold.
Plant = Callable[[MlflowClient, list[Job], dict[str, str]], tuple[list[Job], list[str]]]


def job_run_twice(client: MlflowClient, jobs: list[Job], ids: dict[str, str]) -> tuple[list[Job], list[str]]:
    again = log_run(client, jobs[0])
    return jobs, [f"job {jobs[0].name!r} (config_hash {jobs[0].key}) has 2 runs: ", ids[jobs[0].key], again]


def job_without_a_run(
    client: MlflowClient, jobs: list[Job], ids: dict[str, str]
) -> tuple[list[Job], list[str]]:
    client.delete_run(ids[jobs[0].key])
    return jobs, [f"job {jobs[0].name!r} (config_hash {jobs[0].key}) has 0 runs"]


def run_of_no_job(client: MlflowClient, jobs: list[Job], ids: dict[str, str]) -> tuple[list[Job], list[str]]:
    return jobs[1:], [f"run {jobs[0].name!r} ({ids[jobs[0].key]}): config_hash {jobs[0].key} is no job"]


def point_stored_twice(
    client: MlflowClient, jobs: list[Job], ids: dict[str, str]
) -> tuple[list[Job], list[str]]:
    run_id = ids[jobs[1].key]
    client.log_metric(run_id, VAL_REL_LLOYD, 9.0, int(time.time() * 1000) + 1, step=AT)
    return jobs, [f"run {jobs[1].name!r} ({run_id}): {VAL_REL_LLOYD} at step {AT} stored 2 times"]


def point_lost(client: MlflowClient, jobs: list[Job], ids: dict[str, str]) -> tuple[list[Job], list[str]]:
    client.delete_run(ids[jobs[1].key])  # replaced by a run that lacks one point
    run_id = log_run(client, jobs[1], lose=VAL_REL_LLOYD)
    evals = len(logged_steps(configuration(jobs[1]))[VAL_REL_LLOYD])
    return jobs, [
        f"run {jobs[1].name!r} ({run_id}): {VAL_REL_LLOYD} has {evals - 1} of the {evals} steps it logs"
    ]


@pytest.mark.parametrize(
    "plant", [job_run_twice, job_without_a_run, run_of_no_job, point_stored_twice, point_lost]
)
def test_each_fault_fails_the_check_with_a_line_naming_it(sqlite_uri, jobs, plant: Plant):
    client = MlflowClient(tracking_uri=sqlite_uri)
    ids = {job.key: log_run(client, job) for job in jobs}
    checked, words = plant(client, jobs, ids)
    with pytest.raises(AssertionError) as failed:
        assert_every_job_once_every_point_once(sqlite_uri, EXPERIMENT, checked, BASE)
    message = str(failed.value)
    assert all(w in message for w in words), message
    assert message.splitlines()[0].endswith(": 1 faults"), message  # the planted one, no other
