"""A sweep's session in MLflow: the parent run opened, every trial's report written, the parent run ended.

    with recording(hold, sweep, argv, work, halt) as session:  # the parent run open, the writing thread on
        sweeper.driver.tune.fit(sweep, work, storage, session)             # Tune's callback; halt its stopper
    session.summary                                            # what the session did, and the exit code

- Opens the sweep's parent run that the driver's hold found or made and locked (sweeper.driver.hold): the
  plan, the command line (tracking.parent_run), its counts kept current.
- Is the Tune callback: each of Tune's events goes to one writing thread, always on, that applies them in
  order through the MlflowWriter (sweeper.driver.writer) with a client that waits out a server outage
  (sweeper.driver.outage), so the Tune loop never waits on the store and trials keep training. The queue holds
  at most BUFFER events (bounded memory); when it is full the Tune loop waits, which pauses the trials.
  Tune keeps nothing of it (sweeper.driver.driver_only).
- Prints a progress line at a steady pace (progress), and is stopped by the driver's Halt
  (sweeper.driver.stop) on SIGINT/SIGTERM, its time budget spent, or a failed write. At its end it writes what
  is left (for at most STOP_DRAIN_S after a stop), raises a write's error, records the rate of this allocation
  on the parent run (rate_line: the next allocation's outlook, sweeper.driver.budget.outlook), and finishes
  the parent run, or, after a stop, marks the runs still training KILLED and prints the sweep's account
  (sweeper.driver.stop.stopped). A second signal ends it at once (end_now): the runs still open and the parent
  KILLED, the events not yet written dropped (a resume replays them from the last recorded checkpoint).
"""

from __future__ import annotations

import contextlib
import queue
import shlex
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ray import tune
from ray.tune.experiment import Trial

from cli import exit_codes
from config.grid import Sweep
from sweeper.driver.budget import Account, duration
from sweeper.driver.driver_only import DriverOnly
from sweeper.driver.hold import Hold
from sweeper.driver.outage import PatientClient
from sweeper.driver.stop import END_NOW_S, STOP_DRAIN_S, Halt, stopped
from sweeper.driver.trial import PAYLOAD
from sweeper.driver.work import TrialId, Work
from sweeper.driver.writer import MlflowWriter
from tracking import parent_run
from tracking.names import STEP_RATE

BUFFER = 10_000  # events (a trial's report, checkpoint, end) waiting for the store at most
# The progress line (progress) every this many seconds: on a terminal, into a log file.
PROGRESS_S = {True: 15.0, False: 60.0}


@dataclass(frozen=True)
class Summary:
    """What a sweep driver did: its last line, its exit code, the figures the scale probe reads
    (sweeper.scale.probe)."""

    sweep: str
    experiment: str  # the experiment's id
    jobs: int = 0  # the jobs it had to run
    trials: int = 0  # the Tune trials they were packed into
    outcomes: Counter = field(default_factory=Counter)  # outcome -> jobs that ended here with it
    retries: int = 0  # trials Tune restarted after a failure
    failed: int = 0  # trials that failed after their retries
    points_written: int = 0
    stopped_by: int | None = None  # the signal that stopped the sweep
    out_of_time: bool = False  # its time budget stopped it (cluster.time_budget_s)
    writer_busy_s: float = 0.0  # seconds the writing thread spent writing (the rest it waited for events)

    @property
    def stopped(self) -> bool:
        """Stopped by a signal or its time budget: the same command goes on."""
        return self.stopped_by is not None or self.out_of_time

    @property
    def complete(self) -> bool:
        return self.failed == 0 and self.outcomes.total() == self.jobs

    @property
    def exit_code(self) -> int:
        if self.stopped_by is not None:
            return 128 + self.stopped_by
        if self.out_of_time:
            return exit_codes.BUDGET_STOP
        return 0 if self.complete else exit_codes.FAILED

    def __str__(self) -> str:
        again = " (start the same command again to retry them)" if self.failed else ""
        return (
            f"sweep {self.sweep}: {self.outcomes.total()} of {self.jobs} trials ended "
            f"{dict(sorted(self.outcomes.items()))}; {self.retries} retries; {self.failed} failed after "
            f"retries{again}; {self.points_written} metric points written"
        )


def rate_line(account: Account, since: Account, seconds: float) -> tuple[str, float | None]:
    """What this allocation trained (model-steps since `since`, in `seconds`) and the time the rest needs at
    that rate; the rate (None when nothing was trained)."""
    trained = account.done - since.done
    if trained <= 0 or seconds <= 0:
        return "no model-steps trained in this allocation", None
    rate = trained / seconds
    left = account.total - account.done
    return (
        f"{trained:,} in this allocation at {rate:,.1f} model-steps/s; the {left:,} left need about "
        f"{duration(left / rate)} at that rate",
        rate,
    )


def progress(sweep: str, account: Account, since: Account, seconds: float) -> str:
    """The sweep's progress line while it runs: models and model-steps done of its total, this session's
    rate and the time the rest needs at it."""
    trained, left = account.done - since.done, account.total - account.done
    pace = ""
    if trained > 0 and seconds > 0:
        rate = trained / seconds
        pace = f", {rate:,.1f} model-steps/s, about {duration(left / rate)} left"
    ended = f"{len(account.ended)} of {len(account.steps)} models ended"
    return f"sweep {sweep}: {ended}; {account.steps_line()}{pace}"


class Session(DriverOnly, tune.Callback):
    """A sweep's session in MLflow (see the module docstring): Tune's callback, writing through one thread."""

    def __init__(
        self,
        hold: Hold,
        work: Work,
        halt: Halt,
        argv: list[str],
        outage_s: float,
        storage: str | None = None,
    ) -> None:
        """halt: Tune's stopper, which a failed write sets too; the held ledger's account
        (sweeper.driver.budget) is where the stop's starts; argv: the command as typed, which a stop prints
        as the one that resumes the sweep; storage: cluster.storage (the writer records checkpoints' URIs
        with its query)."""
        self.sweep, self.experiment, self.parent_id = hold.name, hold.experiment_id, hold.parent_id
        self.argv = argv
        self.jobs, self.trials = len(hold.jobs), len(work.trials)
        self.events: queue.Queue = queue.Queue(maxsize=BUFFER)
        self.error: Exception | None = None
        self.thread: threading.Thread | None = None
        self.applying = threading.Lock()  # held by the writing thread while it applies an event
        self.cut = threading.Event()  # a second signal: no more events applied (end_now)
        self.client = hold.client  # the store's own, which waits out no outage: end_now's
        patient = PatientClient(hold.client, hold.uri, outage_s, waiting=self.events.qsize)
        self.writer = MlflowWriter(
            patient,
            hold.experiment_id,
            hold.name,
            hold.parent_id,
            work,
            hold.ledger.unfinished,
            hold.uri,
            storage,
        )
        self.halt = halt
        self.account, self.started = hold.account, time.monotonic()
        self.ended = threading.Event()  # Tune ended: no more progress lines
        self.earlier = hold.earlier  # the parent's counts start there
        self.shown = self.earlier  # the parent's counts as last written (by tracking.parent_run.open_parent)
        self.failed = 0  # trials that ended in error, once Tune ended
        self.busy_s = 0.0  # the writing thread's time in events
        self.summary: Summary | None = None  # once the session ended

    def start(self) -> None:
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._apply, name="mlflow-writer", daemon=True)
        self.thread.start()
        threading.Thread(target=self._show_progress, name="progress", daemon=True).start()

    def _show_progress(self) -> None:
        """A progress line at a steady pace until Tune ended (the status table comes once a minute)."""
        every = PROGRESS_S[sys.stdout.isatty()]
        while not self.ended.wait(every):
            try:
                now = self.account_now()
            except RuntimeError:  # the writing thread added a job's figures meanwhile: at the next line
                continue
            print(progress(self.sweep, now, self.account, time.monotonic() - self.started), flush=True)

    def _apply(self) -> None:
        while (event := self.events.get()) is not None:
            self._try(event)
        self._try(self.writer.flush)  # points whose checkpoint never came (a stop, a trial's error)

    def _try(self, event: Callable[[], None]) -> None:
        with self.applying:
            if self.error is not None or self.cut.is_set():
                return
            start = time.perf_counter()
            try:
                event()
                self._count()
            except Exception as err:  # the Tune loop sees it (the stopper) and stops the sweep
                self.error = err
                self.halt.write_failed.set()
            self.busy_s += time.perf_counter() - start

    def _count(self) -> None:
        """The parent's trial counts, written when a job has ended since they were last written."""
        ended = self.earlier + Counter(self.writer.outcomes.values())
        if ended != self.shown:
            parent_run.log_counts(self.writer.client, self.parent_id, ended, self.jobs)
            self.shown = ended

    def _put(self, event: Callable[[], None]) -> None:
        self.events.put(event)

    def close(self, timeout: float | None = None) -> bool:
        """Apply every waiting event (for at most `timeout` s); True when all were applied."""
        self.ended.set()
        self.events.put(None)
        self.thread.join(timeout)
        return not self.thread.is_alive() and self.error is None

    def end(self, applied: bool) -> None:
        """After the events were applied (`applied`: all of them): the parent run finished, or after a stop
        (a signal, the budget) the runs still training and the parent KILLED, without an outcome, the
        allocation's rate on the parent and the sweep's account printed; the summary."""
        if self.error is not None:
            raise self.error
        writer, halt = self.writer, self.halt
        self.summary = Summary(
            self.sweep,
            self.experiment,
            len(writer.members),
            self.trials,
            Counter(writer.outcomes.values()),
            writer.retries,
            self.failed,
            writer.points_written,
            halt.signal,
            halt.stopped and halt.signal is None,  # at the budget or in its drain
            self.busy_s,
        )
        account = self.account_now()
        line, rate = rate_line(account, self.account, time.monotonic() - self.started)
        if rate is not None and applied:  # the next allocation's outlook (sweeper.driver.budget.outlook)
            writer.client.log_metric(self.parent_id, STEP_RATE, rate)
        if not halt.stopped:
            writer.client.set_terminated(self.parent_id, "FINISHED" if self.summary.complete else "FAILED")
            return
        interrupted = writer.interrupted()
        summary = f"{account.models()}; {account.steps_line()}, {line}"
        text = stopped(
            self.sweep, self.argv, len(writer.outcomes), len(interrupted), applied, halt.reason, summary
        )
        if applied:  # the hint on the run page too: the driver's output may have no reader left
            parent_run.note_stop(writer.client, self.parent_id, f"{time.strftime('%Y-%m-%d %H:%M')}: {text}")
            for run_id in [*interrupted, self.parent_id]:
                writer.client.set_terminated(run_id, "KILLED")

    def end_now(self) -> None:
        """At a second signal (sweeper.driver.stop.Halt): no event applied after the one in hand, then the
        runs still open and the parent marked KILLED through the store's own client, and the command that
        resumes the sweep printed."""
        self.cut.set()  # every event after the one in hand is dropped (_try)
        waited = self.applying.acquire(timeout=END_NOW_S / 2)  # the one in hand: a run it opens is ended too
        try:
            runs = [*self.writer.interrupted(), self.parent_id]
        finally:
            if waited:  # else the event in hand still runs, and keeps the lock it took
                self.applying.release()
        marked = 0
        for run_id in runs:
            try:
                self.client.set_terminated(run_id, "KILLED")
                marked += 1
            except Exception:  # noqa: BLE001 - whatever the store answers, the driver ends now
                pass
        print(
            f"sweep {self.sweep} ended by a second signal: {marked} of its {len(runs)} open runs (the "
            "parent's included) marked KILLED; trials resume from their last recorded checkpoint.\nResume "
            f"with the same command:\n  {shlex.join(self.argv)}",
            flush=True,
        )

    def account_now(self) -> Account:
        """The sweep's account now: the ledger's, with what ended and checkpointed in this session."""
        a, w = self.account, self.writer
        return Account(a.steps, a.ended | frozenset(w.outcomes), {**a.resumable, **w.resumable})

    # Tune's events, in the order Tune sends them: a report's points before the checkpoint they lead up to.

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        recorded = result.pop(PAYLOAD, None) or {}  # popped: Tune need not keep points and bytes in its state
        self._put(lambda: self.writer.result(recorded))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        key = TrialId.decode(trial.config).key
        self._put(lambda: self.writer.checkpoint(key, checkpoint))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        key = TrialId.decode(trial.config).key
        self._put(lambda: self.writer.complete(key))

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        key = TrialId.decode(trial.config).key
        self._put(lambda: self.writer.recovered(key))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        key = TrialId.decode(trial.config).key
        self._put(lambda: self.writer.failed(key))

    def on_experiment_end(self, trials: list[Trial], **info) -> None:
        """Tune ended: every trial ended, each in error (after its retries) or not (ResultGrid.errors)."""
        self.failed = sum(t.status == Trial.ERROR for t in trials)


@contextlib.contextmanager
def recording(hold: Hold, sweep: Sweep, argv: list[str], work: Work, halt: Halt) -> Iterator[Session]:
    """A session on the held sweep for `work`: the parent run opened, the writing thread on, SIGINT and
    SIGTERM caught while Tune runs, stopped by `halt`; at the end the session's summary (Session.end)."""
    cfg = sweep.cfg
    session = Session(hold, work, halt, argv, cfg.tracking.outage_s, cfg.cluster.storage)
    parent_run.open_parent(hold.client, hold.parent_id, sweep, argv, session.earlier)
    with halt.on_signals(session.end_now):  # from the session's start on; a second signal during end() too
        session.start()
        yield session
        applied = session.close(STOP_DRAIN_S if halt.stopped else None)
        session.end(applied)
