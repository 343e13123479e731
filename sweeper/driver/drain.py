"""The time budget's drain (cluster.drain_s): in the budget's last seconds no trial starts.

A scheduler with the drain (DrainingFifo, DrainingAsha: Tune's own two, as the sweep chooses them) chooses
no trial to start once the budget is in its drain (sweeper.driver.budget.Budget.draining); the trials that
run go on to their end, or to the budget's. Once none runs it tells the sweep's stopper (Halt.drained),
which ends the sweep as at the budget: exit 75, the same command goes on. So an allocation ends where its
trials end and leaves no checkpoint to carry, which is what a run whose archives are committed to git wants
(docs/faults.md, "A sweep in allocations").
"""

from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler

from sweeper.driver.fifo import LiveFifo
from sweeper.driver.stop import Halt


class Drain:
    """A Tune scheduler's choice of the next trial to start, none in the drain (put before the scheduler's
    class: class Draining(Drain, Scheduler))."""

    def __init__(self, halt: Halt, **scheduler) -> None:
        super().__init__(**scheduler)
        self.halt = halt

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        if not self.halt.budget.draining():
            return super().choose_trial_to_run(tune_controller)
        if not any(t.status == Trial.RUNNING for t in tune_controller.get_live_trials()):
            self.halt.drained.set()  # nothing runs and nothing may start: the stopper ends the sweep
        return None


class DrainingFifo(Drain, LiveFifo):
    """First in, first out (sweeper.driver.fifo), no trial started in the drain."""


class DrainingAsha(Drain, ASHAScheduler):
    """Tune's ASHA, no trial started in the drain."""
