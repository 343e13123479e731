"""A driver's hold on its sweep: the store read once, and, once its Ray cluster has accepted the sweep, the
lock that keeps every other driver off it.

A driver takes hold of the sweep (take_hold): it reads the store once (one search of the experiment) into the
ledger (sweeper.driver.ledger) and adopts the finished runs it skips. The hold hands the driver's later steps
what they take from the ledger as last read, so that none of them goes back to the store or the ledger: the
jobs left to run, where each unfinished one resumes (sweeper.driver.home), the sweep's account
(sweeper.driver.budget), the outcomes its jobs ended with before, the rate of its last allocation, and where
Tune writes. When anything is left to run, and once its Ray cluster has accepted the sweep (a refusal leaves
no parent run behind), it locks the sweep's parent run against a second driver (Hold.locked,
sweeper.driver.lock). Between the read and the lock another driver could have run the sweep: the parent run
then has another end time, or is not the one the read found nor the one this driver made, and the store is
read again.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Iterator

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from config.grid import Job, Sweep
from sweeper.driver import home
from sweeper.driver.budget import Account
from sweeper.driver.ledger import adopt, read
from sweeper.driver.lock import DriverLock
from tracking import parent_run, store
from tracking.names import STEP_RATE, SWEEP


class Hold:
    """A sweep as one driver holds it (the module docstring): its store, its ledger as last read and what the
    driver takes from it, and once locked its parent run and lock."""

    def __init__(self, sweep: Sweep, client: MlflowClient | None = None) -> None:
        cfg = sweep.cfg
        self.uri, self.name, self.jobs = cfg.tracking.uri, sweep.plan.name, sweep.jobs
        self.swept = sweep.plan.swept  # the keys the runs view shows as columns
        self.steps = cfg.train.steps  # of a job whose configuration does not set its own
        self.client = client or store.connect(self.uri)  # probes the store: unreachable fails here, fast
        self.experiment = cfg.tracking.experiment  # its name; experiment_id once read
        self.parent_id: str | None = None  # the parent run this driver locked
        self.lock: DriverLock | None = None  # its lock, while held
        self._read()
        self.storage = home.storage(cfg.cluster, self.uri)  # where Tune writes: the home, or elsewhere

    def _read(self) -> None:
        """Read the store: the experiment (got, or created with its runs view), one search of its runs into
        the ledger (sweeper.driver.ledger); close the runs a driver left RUNNING with an outcome."""
        self.experiment_id = store.ensure_experiment(self.client, self.experiment, self.swept)
        runs = store.search(self.client, [self.experiment_id])
        self.ledger = read(runs, self.name)
        for run_id, status in self.ledger.unclosed.items():
            self.client.set_terminated(run_id, status)

    # What the driver's later steps take from the ledger as last read.

    @property
    def pending(self) -> list[Job]:
        """The jobs left to run, in the plan's order."""
        return [j for j in self.jobs if j.key not in self.ledger.done]

    @property
    def resume_from(self) -> dict[str, str]:
        """Job -> the Tune checkpoint its unfinished run recorded, as a location here
        (sweeper.driver.home)."""
        return {key: home.resolved(where, self.uri) for key, where in self.ledger.resume_from.items()}

    @property
    def account(self) -> Account:
        """The sweep's account (sweeper.driver.budget): its models by state and its model-steps."""
        return Account.of(self.jobs, self.steps, self.ledger.done, self.ledger.resume_step)

    @property
    def earlier(self) -> Counter:
        """Outcome -> the jobs that ended with it before this driver: the parent run's counts start there."""
        return self.ledger.earlier({j.key for j in self.jobs})

    @property
    def rate(self) -> float | None:
        """The model-steps per second of the sweep's last allocation, when it measured one."""
        parent = self.ledger.parent
        return parent.data.metrics.get(STEP_RATE) if parent else None

    @property
    def held(self) -> str:
        """How much of the sweep the store holds: the line the driver prints after each read that matters."""
        done = len(self.jobs) - len(self.pending)
        return f"{done} of {len(self.jobs)} trials already in MLflow; {len(self.pending)} to run"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """This driver alone on the sweep, its parent run found or made; else sweeper.errors.SweepLocked. A
        read again that leaves nothing to run says so."""
        seen = self.ledger.parent
        parent_id, created = self._parent()
        lock = DriverLock(self.client, parent_id, self.name)
        lock.take()
        self.parent_id, self.lock = parent_id, lock
        try:
            if not created and (seen is None or _ended(self.client.get_run(parent_id)) != _ended(seen)):
                self._read()  # another driver made the parent, or ran the sweep, after the read
                if not self.pending:
                    print(self.held)
            yield
        finally:
            lock.release()

    def _parent(self) -> tuple[str, bool]:
        """The parent run's id, and whether this driver created it.

        The one the read found, else a new one; of two made at once, both drivers keep the oldest.
        """
        if self.ledger.parent is not None:
            return self.ledger.parent.info.run_id, False
        name = parent_run.name_of(self.name)
        tags = {SWEEP: self.name}
        mine = self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id
        oldest = parent_run.find_parent(self.client, self.experiment_id, self.name)
        if oldest != mine:
            self.client.delete_run(mine)
        return oldest, oldest == mine


def take_hold(sweep: Sweep) -> Hold:
    """The sweep's store read once and the finished runs it skips adopted, what it holds printed; not locked
    yet (Hold.locked)."""
    hold = Hold(sweep)
    subgrids = {j.key: j.configuration.subgrids for j in hold.jobs}
    adopted = adopt(hold.client, hold.ledger, hold.name, subgrids)
    if adopted:
        print(f"{adopted} runs finished outside this sweep now carry sweep={hold.name} too")
    print(hold.held)
    return hold


def _ended(run: Run) -> tuple:
    """What a driver that ran the sweep changed on its parent run: it finished it, or stopped it."""
    return run.info.status, run.info.end_time
