"""A graceful stop of the sweep driver: SIGINT (Ctrl-C) or SIGTERM (a Kubernetes pod eviction).

Halt is the sweep's Tune stopper. On the first signal it ends the Tune run:
Tune stops the running trials without completing them, so their runs keep no
outcome and their last recorded checkpoint (one per report, at most
train.eval_every x cluster.report_every steps back). The driver then writes what the trials reported
(for at most STOP_DRAIN_S), marks those runs KILLED and prints the command that
resumes them: the same one. A second signal kills the driver at once. Halt
also ends the run when the sweep's record failed to write (sweeper.record).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import threading

from ray.tune.stopper import Stopper

from sweeper.driver_only import DriverOnly
from sweeper.record import SweepRecord

STOP_DRAIN_S = 60.0  # after a signal, how long the driver still writes what the trials reported
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Halt(DriverOnly, Stopper):
    def __init__(self, record: SweepRecord) -> None:
        self.record = record  # its writing thread's error stops the sweep too
        self.signal: int | None = None

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False  # trials end when their training does

    def stop_all(self) -> bool:
        return self.signal is not None or self.record.failed()

    def _caught(self, signum: int, frame) -> None:
        self.signal = signum
        print(
            f"sweep: {signal.Signals(signum).name} received: stopping the trials at their last checkpoint "
            "(another signal kills the driver now)",
            flush=True,
        )
        signal.signal(signum, signal.SIG_DFL)

    @contextlib.contextmanager
    def on_signals(self):
        """Catch SIGINT and SIGTERM while the sweep runs (only the main thread can; a caller's thread keeps
        its own)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._caught) for s in SIGNALS}
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # Tune's own handler would replace this one
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def stopped(sweep: str, overrides: list[str], record: SweepRecord, applied: bool, signum: int) -> int:
    """After a signal: the runs still training are KILLED, without an outcome; returns the exit code
    128 + signum."""
    interrupted = record.kill() if applied else record.writer.interrupted()
    command = " ".join(shlex.quote(word) for word in ["python", "-m", "sweeper.sweep", *overrides])
    late = "" if applied else f" (writes the store did not take within {STOP_DRAIN_S:g} s are replayed)"
    print(
        f"sweep {sweep} stopped by {signal.Signals(signum).name}: {len(record.writer.outcomes)} trials "
        f"ended here, {len(interrupted)} interrupted at their last checkpoint{late}. Resume with the same "
        "command:\n"
        f"  {command}",
        flush=True,
    )
    return 128 + signum
