"""How much the commands print: quiet by default, everything with `--verbose` (cli.entry reads the flag).

Quiet leaves Tune's own trial table and one progress bar per command, and drops what a user cannot act on:
a line per trial checkpoint from Ray Train's storage ("Checkpoint successfully created at"), Tune's
TensorBoard hint (its automatic CSV/JSON/TensorBoard result loggers, which nothing here reads: MLflow
holds the results), Ray's notice that token authentication is on, MLflow's schema-creation lines and the
tracebacks it logs before an SQL error the command then names in one line, and
Tune's per-trial configuration and result boxes (the sweep driver sets Tune's reporter from `verbose()`:
sweeper.driver.tune.verbosity). Where stderr is not a terminal (a log file), commands print a line per step of
progress instead of redrawing a bar.

The choice travels as $LEANER_VERBOSE, so the workers of a local Ray instance (started by this process)
see it too; on a cluster started elsewhere, trials are quiet.
"""

from __future__ import annotations

import logging
import os
import sys

VERBOSE = "LEANER_VERBOSE"
FLAG = "--verbose"
# Loggers whose INFO (or, for Ray's token notice, WARNING) lines quiet mode drops.
QUIET_LOGGERS = {
    "ray.train": logging.WARNING,  # "Checkpoint successfully created at: ..." once per trial report
    "ray.tune": logging.WARNING,  # Tune's INFO notes about its result files and syncing
    # Its result grid, which the sweep does not read, warns that the result loggers turned off wrote nothing.
    "ray.tune.analysis.experiment_analysis": logging.ERROR,
    "ray._private.authentication.authentication_token_setup": logging.ERROR,  # "Token authentication is on"
    # "Creating initial MLflow database tables...", and the traceback it logs before raising an SQL error
    # (a store locked past its timeout), which the command then says in one line (tracking.sqlite_guard).
    "mlflow.store.db.utils": logging.CRITICAL,
}


def configure(verbose: bool) -> None:
    """Set this process (and the Ray workers it starts) to verbose or quiet; called once per command."""
    os.environ[VERBOSE] = "1" if verbose else "0"
    if not verbose:
        quiet()


def verbose() -> bool:
    return os.environ.get(VERBOSE) == "1"


def quiet() -> None:
    """Drop the lines listed above in this process (the driver, or a trial's worker)."""
    if verbose():
        return
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # read when the Tuner starts
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)


def lines_not_bars() -> bool:
    """True when stderr is not a terminal: progress as one line per step, not a bar redrawn in a log file."""
    return not sys.stderr.isatty()


class _Outliving:
    """A text stream whose reader may leave (a pipe into `tee` ended by the same Ctrl-C as the driver): its
    first failed write points its file descriptor at /dev/null, so no later write, nor the exit's flush,
    fails; that text and what follows go to `other` (stderr, while its reader is there) or nowhere."""

    def __init__(self, stream, other: _Outliving | None = None) -> None:
        self.stream, self.other, self.gone = stream, other, False

    def _left(self) -> None:
        self.gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._left()
        if self.other is not None:
            self.other.write(text)
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._left()
        if self.other is not None:
            self.other.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)


def outlive_readers() -> None:
    """Keep this process's output from failing it when its reader leaves (a sweep driver's stop must finish:
    runs marked, the resume hint written): stdout falls back to stderr, stderr to nothing."""
    if not isinstance(sys.stderr, _Outliving):
        sys.stderr = _Outliving(sys.stderr)
    if not isinstance(sys.stdout, _Outliving):
        sys.stdout = _Outliving(sys.stdout, sys.stderr)
