"""The sweep's hold on its ledger (sweeper.driver.hold.Hold) and its session (sweeper.driver.session.Session)
on a real SQLite store: a sweep's start reads the store once, whatever it finds there; the lock reads it again
only when another driver ran the sweep since; Tune keeps nothing of the sweep's objects; and a second signal
ends the session at once."""

from __future__ import annotations

import copy
import pickle
from collections import Counter

from mlflow.tracking import MlflowClient
from ray import cloudpickle  # what Tune pickles its state with

from config.grid import Sweep
from sweeper.driver.budget import Budget
from sweeper.driver.hold import Hold
from sweeper.driver.session import Session
from sweeper.driver.stop import Halt
from sweeper.driver.tune import trial_dirname, trial_name
from sweeper.driver.work import TRIAL, TrialId, Work
from sweeper.sweep import load
from tracking.names import CONFIG_HASH, FINISHED, MLFLOW_PARENT_RUN_ID, OUTCOME, SWEEP, TUNE_CHECKPOINT

SWEEP_NAME = "smoke"
EXPERIMENT = "record"


class CountingClient(MlflowClient):
    """A real MlflowClient that counts its run searches (each page of tracking.store.search is one)."""

    def __init__(self, uri: str) -> None:
        super().__init__(tracking_uri=uri)
        self.searches: list[str] = []

    def search_runs(self, experiment_ids, filter_string="", *args, **kwargs):
        self.searches.append(filter_string)
        return super().search_runs(experiment_ids, filter_string, *args, **kwargs)


def sweep_of(uri: str) -> Sweep:
    return load(
        ["sweep=smoke", "sweep.seeds=[1, 2]", "sweep.subgrids=[{name: smoke}]", f"tracking.uri={uri}"]
        + [f"tracking.experiment={EXPERIMENT}"]
    )


def open_hold(uri: str) -> tuple[Hold, CountingClient]:
    client = CountingClient(uri)
    return Hold(sweep_of(uri), client=client), client


def test_a_sweep_start_reads_the_store_once(sqlite_uri):
    jobs = list(sweep_of(sqlite_uri).jobs)
    assert len(jobs) == 2
    record, client = open_hold(sqlite_uri)  # a new sweep: nothing stored yet
    assert client.searches == [""]  # one search of the whole experiment
    assert record.pending == jobs and record.ledger.parent is None
    with record.locked():
        parent = record.parent_id
    # A parent run made here: one more, narrow search for one that another driver made at the same moment.
    assert len(client.searches) == 2 and "run_name" in client.searches[1]

    # What an interrupted session leaves: one job finished, the other's run with a checkpoint, no outcome.
    done, resumed = jobs
    store = MlflowClient(sqlite_uri)
    experiment = record.experiment_id
    for job, tags in ((done, {OUTCOME: FINISHED}), (resumed, {TUNE_CHECKPOINT: "/ckpt/0001"})):
        tags = {SWEEP: SWEEP_NAME, CONFIG_HASH: job.key, MLFLOW_PARENT_RUN_ID: parent, **tags}
        run = store.create_run(experiment, run_name=job.name, tags=tags)
        if OUTCOME in tags:
            store.set_terminated(run.info.run_id, "FINISHED")
        else:
            unfinished = run.info.run_id
    store.set_terminated(parent, "KILLED")

    record, client = open_hold(sqlite_uri)  # the restart
    assert client.searches == [""]
    assert record.ledger.parent.info.run_id == parent
    assert record.ledger.done == {done.key} and record.pending == [resumed]
    assert record.ledger.unfinished == {resumed.key: unfinished}
    assert record.ledger.resume_from == {resumed.key: "/ckpt/0001"}
    assert record.earlier == Counter({FINISHED: 1})
    with record.locked():
        assert record.parent_id == parent
    assert client.searches == [""]  # the lock found the parent as the read did: no second read


def test_the_lock_reads_again_when_another_driver_ran_the_sweep_since_the_read(sqlite_uri):
    first, _ = open_hold(sqlite_uri)
    with first.locked():
        parent = first.parent_id
    record, client = open_hold(sqlite_uri)
    # Another driver, between this one's read and its lock, ran the last job and finished the sweep.
    job = record.jobs[0]
    tags = {SWEEP: SWEEP_NAME, CONFIG_HASH: job.key, OUTCOME: FINISHED, MLFLOW_PARENT_RUN_ID: parent}
    store = MlflowClient(sqlite_uri)
    store.create_run(record.experiment_id, run_name=job.name, tags=tags)
    store.set_terminated(parent, "FINISHED")
    assert job in record.pending
    with record.locked():
        assert job not in record.pending
    assert client.searches == ["", ""]


def test_tune_keeps_nothing_of_the_sweeps_objects(sqlite_uri):
    hold, _ = open_hold(sqlite_uri)
    session = Session(hold, Work({}, ()), Halt(Budget.since_start(60)), ["leaner-sweep"], 5)
    halt = session.halt
    for obj in (session, halt):
        assert len(cloudpickle.dumps(obj)) < 500  # not the jobs, the ledger, a client or a queue
        assert copy.deepcopy(obj) is obj  # Tune's copy of its experiment spec: the same live object
    # The name creators are functions of an importable module: pickled by reference, a few bytes.
    for creator in (trial_name, trial_dirname):
        assert pickle.loads(cloudpickle.dumps(creator)) is creator

    # What the creators read of Tune's trial: its config (sweeper.driver.tune.param_space), its id.
    class Trial:
        config = {TRIAL: TrialId("pack-1", "smoke/x/2seeds").encode()}
        trial_id = "abc"

    assert (trial_name(Trial), trial_dirname(Trial)) == ("smoke/x/2seeds", "pack-1-abc")


def test_a_second_signal_kills_the_parent_and_the_writing_thread_drops_the_rest(sqlite_uri, capsys):
    """Session.end_now, as a second signal calls it: the parent run KILLED, the command that resumes the sweep
    printed, and the writing thread, which end_now does not hold up, drops the events left and ends."""
    hold, client = open_hold(sqlite_uri)
    with hold.locked():
        argv = ["leaner-sweep", "sweep=smoke"]
        session = Session(hold, Work({}, ()), Halt(Budget.since_start(60)), argv, 5)
        session.start()
        session.end_now()
        applied = []
        session.events.put(lambda: applied.append("an event after the second signal"))
        assert session.close(timeout=10) and applied == []
        assert client.get_run(hold.parent_id).info.status == "KILLED"
    assert "Resume with the same command:\n  leaner-sweep sweep=smoke" in capsys.readouterr().out
