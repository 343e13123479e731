"""The time budget's drain (cluster.drain_s): in the budget's last seconds no trial starts.

A scheduler with the drain (DrainingFifo, DrainingAsha: Tune's own two, as the sweep chooses them) chooses
no trial to start once the budget is in its drain (sweeper.driver.budget.Budget.draining), and stops the
pending trials that have not started (Halt.withhold): Tune's controller asks a pending trial's actor of Ray
whatever the scheduler chooses, and starts the trial when Ray places it, so a trial left pending would start
as soon as a running one ended. The trials that run go on to their end, or to the budget's; then the sweep
stops as at the budget: exit 75, the same command goes on (when none runs and trials are still to come, the
drain tells the sweep's stopper at once: Halt.drained). So an allocation ends where its trials end and
leaves no checkpoint to carry, which is what a run whose archives are committed to git wants (docs/faults.md,
"A sweep in allocations").
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
        live = list(tune_controller.get_live_trials())
        for trial in live:
            # Never started here: stopped, nothing of it is recorded (sweeper.driver.writer.Writer.complete
            # ends only runs this session opened); its run and checkpoint wait for the next allocation. A
            # trial Tune restarts after a failure (num_failures) has run here: it goes on.
            if trial.status == Trial.PENDING and trial.num_failures == 0:
                self.halt.withhold()
                trial.init_local_path()  # as Tune does when it asks for an actor: its reporter reads the path
                tune_controller.stop_trial(trial)
        if not any(t.status == Trial.RUNNING for t in live):
            self.halt.withhold()
            self.halt.drained.set()  # nothing runs and nothing may start: the stopper ends the sweep
        return None


class DrainingFifo(Drain, LiveFifo):
    """First in, first out (sweeper.driver.fifo), no trial started in the drain."""


class DrainingAsha(Drain, ASHAScheduler):
    """Tune's ASHA, no trial started in the drain."""
