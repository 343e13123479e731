"""The ledger's decisions (sweeper.driver.ledger, and the driver's hold on it: sweeper.driver.hold), each
tested where it is made: resuming a sweep after a stop or a move rests on them, and the slow sweep tests meet
them only in rare timings.

  the parent run a sweep keeps when several exist    read(); Hold._parent, after a race (find_parent)
  which unfinished run of a job is continued         read(): the latest, by (start_time, run_id)
  the outcome a job counts with in the parent's counts   Ledger.earlier: once a job, the first of ENDED
  a run left RUNNING that carries an outcome         read(): done, and closed by Hold._read with its status
  a finished job is never resumed                    read() and Hold.pending, even with a later run open

read() takes runs as the store returns them (newest first); each test of read() gives them in both orders,
so that what it keeps follows from the runs, not from their order.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from mlflow.entities import Run, RunData, RunInfo, RunTag
from mlflow.tracking import MlflowClient

from analysis.runs import load_runs
from config.grid import Sweep
from sweeper.archive import ended_runs
from sweeper.driver.hold import Hold
from sweeper.driver.ledger import read
from sweeper.sweep import load
from tracking import store
from tracking.names import (
    CHECKPOINT_STEP,
    CONFIG_HASH,
    DIVERGED,
    FINISHED,
    OUTCOME,
    PRUNED,
    SWEEP,
    TUNE_CHECKPOINT,
)
from tracking.parent_run import find_parent, name_of

SWEEP_NAME = "smoke"
EXPERIMENT = "ledger"


def run(run_id: str, start: int, *, status: str = "RUNNING", name: str = "a job", **tags: str) -> Run:
    info = RunInfo(
        run_id=run_id,
        experiment_id="1",
        user_id="me",
        status=status,
        start_time=start,
        end_time=None,
        lifecycle_stage="active",
        run_name=name,
    )
    return Run(info, RunData(tags=[RunTag(k, v) for k, v in tags.items()]))


def parent(run_id: str, start: int) -> Run:
    return run(run_id, start, name=name_of(SWEEP_NAME), **{SWEEP: SWEEP_NAME})


def job_run(run_id: str, start: int, key: str, status: str = "RUNNING", **tags: str) -> Run:
    """A run of job `key` in this sweep."""
    return run(run_id, start, status=status, **{SWEEP: SWEEP_NAME, CONFIG_HASH: key}, **tags)


def both_orders(runs: list[Run]):
    for order in (runs, runs[::-1]):
        yield read(order, SWEEP_NAME)


def test_read_keeps_the_oldest_parent_run():
    """Two drivers that started at once made a parent run each: both keep the oldest, by (start_time,
    run_id)."""
    runs = [parent("p-late", 2000), parent("p-b", 1000), parent("p-a", 1000), job_run("j", 500, "k")]
    for ledger in both_orders(runs):
        assert ledger.parent.info.run_id == "p-a"


def test_read_continues_a_jobs_latest_unfinished_run():
    """Of a job's runs without an outcome, the latest (by start_time, then run_id) is continued, from the
    Tune checkpoint it recorded."""
    runs = [
        job_run("old", 1000, "k", **{TUNE_CHECKPOINT: "/ckpt/old"}),
        job_run("new", 2000, "k", **{TUNE_CHECKPOINT: "/ckpt/new"}),
        job_run("t-1", 3000, "t", **{TUNE_CHECKPOINT: "/ckpt/t-1"}),
        job_run("t-2", 3000, "t", **{TUNE_CHECKPOINT: "/ckpt/t-2"}),
    ]
    for ledger in both_orders(runs):
        assert ledger.unfinished == {"k": "new", "t": "t-2"}
        assert ledger.resume_from == {"k": "/ckpt/new", "t": "/ckpt/t-2"}


def test_earlier_counts_each_job_once_with_its_first_outcome_in_ended():
    """A job run twice (a rerun carries its config_hash too) counts once in the parent's trial counts, with
    the first of its outcomes in ENDED's order (finished, diverged, pruned); jobs not asked about, and jobs
    without an outcome, not at all."""
    runs = [
        job_run("a-1", 1000, "a", "FAILED", **{OUTCOME: DIVERGED}),
        job_run("a-2", 2000, "a", "FINISHED", **{OUTCOME: FINISHED}),
        job_run("b-1", 1000, "b", "FINISHED", **{OUTCOME: PRUNED}),
        job_run("b-2", 2000, "b", "FAILED", **{OUTCOME: DIVERGED}),
        job_run("c-1", 1000, "c", "FINISHED", **{OUTCOME: FINISHED}),  # not one of the keys asked about
        job_run("d-1", 1000, "d"),  # unfinished
    ]
    for ledger in both_orders(runs):
        assert ledger.earlier({"a", "b", "d"}) == Counter({FINISHED: 1, DIVERGED: 1})


def test_read_counts_a_run_left_running_with_an_outcome_as_done_and_closes_it():
    """A driver that died between a run's outcome tag and closing the run left it RUNNING: its job is done,
    not continued, and the run is to be closed with its outcome's status (tracking.names.STATUS)."""
    runs = [
        job_run("div", 1000, "d", **{OUTCOME: DIVERGED}),
        job_run("pruned", 1000, "s", **{OUTCOME: PRUNED}),
        job_run("fin", 1000, "f", "FINISHED", **{OUTCOME: FINISHED}),  # closed: nothing to do
    ]
    for ledger in both_orders(runs):
        assert ledger.done == {"d", "s", "f"} and ledger.unfinished == {}
        assert ledger.unclosed == {"div": "FAILED", "pruned": "FINISHED"}  # pruned: not a failure


def test_read_continues_a_run_from_its_own_checkpoint_only():
    """A job's latest unfinished run resumes from the checkpoint it recorded, never from an older run's (whose
    points up to it the latest run lacks): without one of its own, it starts over."""
    old = job_run("old", 1000, "k", **{TUNE_CHECKPOINT: "ray/old", CHECKPOINT_STEP: "40"})
    new = job_run("new", 2000, "k")
    for ledger in both_orders([old, new]):
        assert ledger.unfinished == {"k": "new"}
        assert ledger.resume_from == {} and ledger.resume_step == {}
    newer = job_run("newer", 3000, "k", **{TUNE_CHECKPOINT: "ray/newer", CHECKPOINT_STEP: "20"})
    for ledger in both_orders([old, new, newer]):
        assert (ledger.resume_from, ledger.resume_step) == ({"k": "ray/newer"}, {"k": 20})


def test_read_never_resumes_a_finished_job():
    """A job with an outcome is done, in whatever sweep or plain `sweeper.train` it ran: a later run of it
    without an outcome (a second driver's, say) is not continued."""
    trained = run("train", 1000, status="FINISHED", **{CONFIG_HASH: "k", OUTCOME: FINISHED})  # no sweep tag
    late = job_run("late", 2000, "k", **{TUNE_CHECKPOINT: "/ckpt/late"})
    for ledger in both_orders([trained, late]):
        assert ledger.done == {"k"}
        assert ledger.unfinished == {} and ledger.resume_from == {}


# ---- the same decisions where Hold makes them, on a real SQLite store ----


def new_hold(uri: str) -> Hold:
    return Hold(sweep_of(uri))


def sweep_of(uri: str) -> Sweep:
    return load(
        ["sweep=smoke", "sweep.seeds=[1, 2]", "sweep.subgrids=[{name: smoke}]", f"tracking.uri={uri}"]
        + [f"tracking.experiment={EXPERIMENT}"]
    )


def stored(client: MlflowClient, hold: Hold, start: int, name: str = "a job", **tags: str) -> str:
    """The id of a new run in the hold's experiment, started at `start` (ms since the epoch)."""
    return client.create_run(hold.experiment_id, start_time=start, run_name=name, tags=tags).info.run_id


@pytest.mark.parametrize("other_started", [1000, 2**42], ids=["before", "after"])  # 1970, 2109
def test_of_two_parent_runs_made_at_once_both_drivers_keep_the_older(sqlite_uri, other_started):
    """Between a driver's read (no parent run yet) and the parent run it makes, another driver made one: each
    keeps the older (find_parent); this driver deletes its own when it is the younger."""
    client, hold = MlflowClient(sqlite_uri), new_hold(sqlite_uri)
    assert hold.ledger.parent is None
    other = stored(client, hold, other_started, name_of(SWEEP_NAME), **{SWEEP: SWEEP_NAME})
    kept, created = hold._parent()
    active = {r.info.run_id for r in client.search_runs([hold.experiment_id])}
    if other_started == 1000:
        assert (kept, created) == (other, False) and active == {other}
    else:
        assert created and active == {kept, other}


def test_a_driver_that_made_a_parent_run_and_one_that_read_it_keep_the_same(sqlite_uri):
    """Of parent runs started at once, find_parent (a driver that made one) and read (a driver that found
    them) keep the same, the smallest run id: else two drivers would lock different parent runs."""
    client, hold = MlflowClient(sqlite_uri), new_hold(sqlite_uri)
    tied = [stored(client, hold, 1000, name_of(SWEEP_NAME), **{SWEEP: SWEEP_NAME}) for _ in range(3)]
    stored(client, hold, 2000, name_of(SWEEP_NAME), **{SWEEP: SWEEP_NAME})
    found = find_parent(client, hold.experiment_id, SWEEP_NAME)
    assert found == min(tied)
    assert read(store.search(client, [hold.experiment_id]), SWEEP_NAME).parent.info.run_id == found


def test_a_hold_closes_a_run_left_running_with_an_outcome_and_skips_its_job(sqlite_uri):
    """A run RUNNING with an outcome tag (its driver died before closing it): the hold closes it with the
    outcome's status, and its job is not run again."""
    client, hold = MlflowClient(sqlite_uri), new_hold(sqlite_uri)
    diverged, other = hold.jobs
    left = stored(client, hold, 1000, **{SWEEP: SWEEP_NAME, CONFIG_HASH: diverged.key, OUTCOME: DIVERGED})
    hold = new_hold(sqlite_uri)
    assert client.get_run(left).info.status == "FAILED"
    assert hold.pending == [other]


@pytest.mark.parametrize("outcome", [FINISHED, PRUNED])
def test_a_hold_never_resumes_a_finished_or_pruned_job(sqlite_uri, outcome):
    """A job a plain `sweeper.train` finished, or one ASHA stopped (pruned, its run FINISHED), with a later
    run of this sweep left open: the job is done, neither pending nor continued."""
    client, hold = MlflowClient(sqlite_uri), new_hold(sqlite_uri)
    done, other = hold.jobs
    trained = stored(client, hold, 1000, **{CONFIG_HASH: done.key, OUTCOME: outcome})
    client.set_terminated(trained, "FINISHED")
    stored(client, hold, 2000, **{SWEEP: SWEEP_NAME, CONFIG_HASH: done.key, TUNE_CHECKPOINT: "/ckpt/1"})
    hold = new_hold(sqlite_uri)
    assert hold.pending == [other]
    assert hold.ledger.unfinished == {} and hold.ledger.resume_from == {}


def test_an_older_stores_stopped_outcome_is_read_as_pruned(sqlite_uri):
    """ASHA's early stops were recorded as outcome "stopped" (their runs KILLED) until 2026-12-06, then as
    pruned (FINISHED): an older store's stopped model is done for a resumed sweep (never trained again),
    counted as pruned, pruned in the analysis' runs and ended for a lean archive."""
    client, hold = MlflowClient(sqlite_uri), new_hold(sqlite_uri)
    stopped, other = hold.jobs
    run_id = stored(client, hold, 1000, **{SWEEP: SWEEP_NAME, CONFIG_HASH: stopped.key, OUTCOME: "stopped"})
    client.set_terminated(run_id, "KILLED")
    hold = new_hold(sqlite_uri)
    assert hold.pending == [other] and hold.ledger.unfinished == {}
    assert hold.ledger.earlier({stopped.key}) == Counter({PRUNED: 1})
    assert load_runs(sqlite_uri, EXPERIMENT).set_index("run_id").loc[run_id, OUTCOME] == PRUNED
    assert run_id in ended_runs([Path(sqlite_uri.removeprefix("sqlite:///"))])
