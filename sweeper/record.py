"""A sweep's record in MLflow: the one object that reads it, owns its parent run and writes its jobs' runs.

    record = SweepRecord(uri, experiment, sweep, jobs, outage_s)  # reads the store once
    record.adopt(); record.pending()                               # what is left to run
    with record.locked():                                          # one driver per sweep
        record.start(cfg, plan, argv, work, packs)                 # the parent run opened
        tune.Tuner(..., callbacks=[record]).fit()                  # every trial's report written
        record.close(); record.finish(complete)

- Reads the store once at its start: one search of the experiment (tracking.store.search) gives the
  ledger (sweeper.ledger): the jobs done anywhere in the experiment, this sweep's unfinished runs and their
  checkpoints, its parent run, and the outcomes the parent's counts start from.
- Owns the parent run (tracking.parent_run): found by one rule or created, locked against a second driver
  (sweeper.lock), the plan and the command line recorded on it, its counts kept current, finished or
  killed at the end.
- Is the Tune callback: each of Tune's events goes to one writing thread, always on, that applies them in
  order through the MlflowWriter (sweeper.writer) with a client that waits out a server outage
  (sweeper.outage), so the Tune loop never waits on the store and trials keep training. The queue holds
  at most BUFFER events (bounded memory); when it is full the Tune loop waits, which pauses the trials.
  Tune keeps nothing of it (sweeper.driver_only).

Between the read and the lock another driver could have run the sweep: the parent run then has another end
time, or is not the one the read found nor the one this driver made, and the record reads the store again.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import Counter
from typing import Callable, Iterator

from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig
from ray import tune

from config.grid import Job, Plan
from sweeper import ledger
from sweeper.driver_only import DriverOnly
from sweeper.lock import DriverLock
from sweeper.outage import PatientClient
from sweeper.trial import PAYLOAD, pack_key
from sweeper.writer import MlflowWriter
from tracking import parent_run, store
from tracking.names import SWEEP

BUFFER = 10_000  # events (a trial's report, checkpoint, end) waiting for the store at most


class SweepRecord(DriverOnly, tune.Callback):
    """A sweep's record in MLflow (see the module docstring)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        sweep: str,
        jobs: list[Job],
        outage_s: float,
        client: MlflowClient | None = None,
    ) -> None:
        self.uri, self.sweep, self.jobs, self.outage_s = uri, sweep, jobs, outage_s
        self.client = client or store.connect(uri)  # probes the store first: unreachable fails here, fast
        self.experiment = store.ensure_experiment(self.client, experiment)
        self.ledger = self._read()
        self.parent_id: str | None = None  # the parent run this driver locked
        self.writer: MlflowWriter | None = None
        self.events: queue.Queue = queue.Queue(maxsize=BUFFER)
        self.error: Exception | None = None
        self.thread: threading.Thread | None = None
        self.earlier = Counter()  # the outcomes the parent's counts start from, as the lock's ledger has them
        self.shown: Counter | None = None  # the parent's counts as last written

    def _read(self) -> ledger.Ledger:
        found = ledger.read(store.search(self.client, [self.experiment]), self.sweep)
        for run_id, status in found.unclosed.items():
            self.client.set_terminated(run_id, status)
        return found

    def adopt(self) -> int:
        """Tag the finished runs this sweep skips as its own too (sweeper.ledger.adopt); how many changed."""
        return ledger.adopt(
            self.client, self.ledger, self.sweep, {j.key: j.configuration.subgrids for j in self.jobs}
        )

    def pending(self) -> list[Job]:
        return [j for j in self.jobs if j.key not in self.ledger.done]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """This driver alone on the sweep, its parent run found or made; else sweeper.lock.SweepLocked."""
        seen = self.ledger.parent
        parent_id, created = self._parent()
        lock = DriverLock(self.client, parent_id, self.sweep)
        lock.take()
        self.parent_id = parent_id
        try:
            if not created and (seen is None or _ended(self.client.get_run(parent_id)) != _ended(seen)):
                self.ledger = self._read()  # another driver made the parent, or ran the sweep, after the read
            yield
        finally:
            lock.release()

    def _parent(self) -> tuple[str, bool]:
        """The parent run's id, and whether this driver created it.

        The one the read found, else a new one; of two made at once, both drivers keep the oldest.
        """
        if self.ledger.parent is not None:
            return self.ledger.parent.info.run_id, False
        name = parent_run.name_of(self.sweep)
        mine = self.client.create_run(self.experiment, run_name=name, tags={SWEEP: self.sweep}).info.run_id
        oldest = parent_run.find_parent(self.client, self.experiment, self.sweep)
        if oldest != mine:
            self.client.delete_run(mine)
        return oldest, oldest == mine

    def start(
        self,
        cfg: DictConfig,
        plan: Plan,
        argv: list[str],
        work: dict[str, dict],
        packs: dict[str, list[str]],
    ) -> None:
        """Open the parent run (plan, command line, counts) and the writing thread for the jobs of `work`."""
        parent_run.open_parent(self.client, self.parent_id, cfg, plan, self.jobs, argv)
        patient = PatientClient(self.client, self.uri, self.outage_s, waiting=self.events.qsize)
        self.earlier = self.ledger.earlier({j.key for j in self.jobs})
        self.writer = MlflowWriter(
            patient, self.experiment, self.sweep, self.parent_id, work, packs, self.ledger
        )
        self._count()
        self.thread = threading.Thread(target=self._apply, name="mlflow-writer", daemon=True)
        self.thread.start()

    def _apply(self) -> None:
        while (event := self.events.get()) is not None:
            if self.error is None:
                try:
                    event()
                    self._count()
                except Exception as err:  # the Tune loop sees it (failed) and stops the sweep
                    self.error = err

    def _count(self) -> None:
        """The parent's trial counts, written when a job has ended since they were last written."""
        ended = self.earlier + Counter(self.writer.outcomes.values())
        if ended != self.shown:
            parent_run.log_counts(self.writer.client, self.parent_id, ended, len(self.jobs))
            self.shown = ended

    def _put(self, event: Callable[[], None]) -> None:
        self.events.put(event)

    def failed(self) -> bool:
        return self.error is not None

    def close(self, timeout: float | None = None) -> bool:
        """Apply every waiting event (for at most `timeout` s); True when all were applied."""
        self.events.put(None)
        self.thread.join(timeout)
        return not self.thread.is_alive() and self.error is None

    def finish(self, complete: bool) -> None:
        self.writer.client.set_terminated(self.parent_id, "FINISHED" if complete else "FAILED")

    def kill(self) -> list[str]:
        """After a signal: the runs still training and the parent KILLED, without an outcome; their ids."""
        interrupted = self.writer.interrupted()
        for run_id in [*interrupted, self.parent_id]:
            self.writer.client.set_terminated(run_id, "KILLED")
        return interrupted

    # Tune's events, in the order Tune sends them: a report's points before the checkpoint they lead up to.

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        recorded = result.pop(PAYLOAD, None) or {}  # popped: Tune need not keep points and bytes in its state
        self._put(lambda: self.writer.result(recorded))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        pack = pack_key(trial.config)
        self._put(lambda: self.writer.checkpoint(pack, checkpoint))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        pack = pack_key(trial.config)
        self._put(lambda: self.writer.complete(pack))

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        pack = pack_key(trial.config)
        self._put(lambda: self.writer.recovered(pack))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        pack = pack_key(trial.config)
        self._put(lambda: self.writer.failed(pack))


def _ended(run: Run) -> tuple:
    """What a driver that ran the sweep changed on its parent run: it finished it, or stopped it."""
    return run.info.status, run.info.end_time
