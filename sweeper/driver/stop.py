"""A graceful stop of the sweep driver: SIGINT (Ctrl-C), SIGTERM (a Kubernetes pod eviction, SLURM's end of
an allocation), its time budget spent (cluster.time_budget_s, sweeper.driver.budget) or its drain done (no
trial runs in the budget's last cluster.drain_s seconds, sweeper.driver.drain).

Halt is the sweep's Tune stopper. On the first signal, or once the budget is spent, it ends the Tune run:
Tune stops the running trials without completing them, so their runs keep no
outcome and their last recorded checkpoint (one per report, at most
train.eval_every x cluster.report_every steps back). The driver then writes what the trials reported
(for at most STOP_DRAIN_S), marks those runs KILLED and prints the command that
resumes them: the same one. A second signal ends the driver at once, within END_NOW_S: the session marks the
runs still open, the trials' and the parent, KILLED (what it had not yet written is lost; the next start
replays it from the last recorded checkpoint), and a third ends it without waiting for that. Halt
also ends the run when the sweep's session failed to write (sweeper.driver.session). The driver makes it
before Ray starts: a budget already spent then ends the sweep there (Halt.spent_before_start), nothing begun.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from typing import Callable

import psutil
from ray.tune.stopper import Stopper

from cli import exit_codes
from sweeper.driver.budget import Account, Budget
from sweeper.driver.driver_only import DriverOnly

STOP_DRAIN_S = 60.0  # after a signal or the budget, how long the driver still writes what the trials reported
END_NOW_S = 10.0  # after a second signal, how long the driver may take to mark its open runs KILLED
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Halt(DriverOnly, Stopper):
    def __init__(self, budget: Budget) -> None:
        self.write_failed = threading.Event()  # the session's writing thread failed: that stops it too
        self.drained = threading.Event()  # in the budget's drain no trial runs (sweeper.driver.drain)
        self.budget = budget
        self.signal: int | None = None
        self.out_of_time = False  # the budget was spent while the sweep ran
        self.in_drain = False  # its drain kept a trial from starting: it stops when the running ones end
        self.ending: Callable[[], None] | None = None  # at a second signal (on_signals): the runs ended
        self.ending_now = False  # a second signal came

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False  # trials end when their training does

    def stop_all(self) -> bool:
        if self.signal is None and not self.out_of_time and self.budget.spent():
            self.out_of_time = True
            print(
                f"sweep: its time budget of {self.budget.seconds:g} s (cluster.time_budget_s) is spent: "
                "stopping the trials at their last checkpoint",
                flush=True,
            )
        stop = self.signal is not None or self.out_of_time or self.drained.is_set()
        return stop or self.write_failed.is_set()

    def withhold(self) -> None:
        """The drain keeps a trial from starting (sweeper.driver.drain): the sweep stops, as at its budget,
        once the trials that run have ended."""
        if not self.in_drain:
            self.in_drain = True
            print(
                f"sweep: in its time budget's last {self.budget.drain:g} s (cluster.drain_s) no trial "
                "starts: the running ones go on to their end, then it stops",
                flush=True,
            )

    def spent_before_start(self, sweep: str, argv: list[str], account: Account) -> bool:
        """Whether the budget was spent before any trial started; if so the stop is printed with the sweep's
        account (nothing was begun: nothing to stop, no run to mark)."""
        if not self.budget.spent():
            return False
        reason = f"at its time budget ({self.budget.seconds:g} s) before any trial started"
        stopped(sweep, argv, 0, 0, True, reason, f"{account.models()}; {account.steps_line()}")
        return True

    @property
    def stopped(self) -> bool:
        """Stopped by a signal, by the budget or in its drain (not by a failed write)."""
        return self.signal is not None or self.out_of_time or self.in_drain

    @property
    def exit_code(self) -> int:
        """The code of the stop: 128 + the signal's number, or 75 (exit_codes.BUDGET_STOP)."""
        return 128 + self.signal if self.signal is not None else exit_codes.BUDGET_STOP

    @property
    def reason(self) -> str:
        if self.signal is not None:
            return f"by {signal.Signals(self.signal).name}"
        if self.in_drain and not self.out_of_time:
            b = self.budget
            return f"in its time budget's drain (its last {b.drain:g} s of {b.seconds:g} s)"
        return f"at its time budget ({self.budget.seconds:g} s)"

    def _caught(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.ending_now:  # a third: the driver ends without waiting for the store
            os._exit(128 + signum)
        if self.signal is not None:
            self.ending_now = True
            print(f"sweep: {name} again: ending the driver now, its open runs marked KILLED", flush=True)
            # Off the main thread, which a handler interrupts anywhere (in a write to the store, say).
            threading.Thread(target=self._end_now, args=(signum,), name="end-now", daemon=True).start()
            return
        self.signal = signum
        print(
            f"sweep: {name} received: stopping the trials at their last checkpoint (another signal ends the "
            "driver now)",
            flush=True,
        )

    def _end_now(self, signum: int) -> None:
        """After a second signal: the runs ended (Halt.ending, for at most END_NOW_S), then the process and
        its own children (a local Ray instance's daemons and workers, which ray.shutdown would have ended)."""
        marking = threading.Thread(target=self.ending or (lambda: None), name="end-runs", daemon=True)
        marking.start()
        marking.join(END_NOW_S)
        sys.stdout.flush()
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        os._exit(128 + signum)  # Tune's own stop of the trials is what a second signal cuts short

    @contextlib.contextmanager
    def on_signals(self, ending: Callable[[], None]):
        """Catch SIGINT and SIGTERM while the sweep runs (only the main thread can; a caller's thread keeps
        its own); `ending` marks the session's open runs KILLED at a second signal."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.ending = ending
        previous = {s: signal.signal(s, self._caught) for s in SIGNALS}
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # Tune's own handler would replace this one
        try:
            yield
        finally:
            if self.signal is None:  # else a stop is on: a later signal still ends the driver at once
                for s, handler in previous.items():
                    signal.signal(s, handler)


def stopped(
    sweep: str, argv: list[str], ended: int, interrupted: int, applied: bool, reason: str, account: str
) -> str:
    """After a stop (`reason`: by a signal, or at the budget): print what ended here, what was interrupted
    (its runs KILLED when every write was applied), the sweep's account (sweeper.driver.budget) and the
    command that resumes it; returns that text."""
    command = shlex.join(argv)  # the command as typed (cli.entry.as_typed)
    late = "" if applied else f" (writes the store did not take within {STOP_DRAIN_S:g} s are replayed)"
    text = (
        f"sweep {sweep} stopped {reason}: {ended} trials ended here, {interrupted} interrupted at their last "
        f"checkpoint{late}.\n{account}\nResume with the same command:\n  {command}"
    )
    print(text, flush=True)
    return text
