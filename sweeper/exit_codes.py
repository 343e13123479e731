"""The exit codes of every command (train, sweep, rerun, report, claims, bench): one table.

An error a command reports as one line is raised as one of the exception classes named here, and
`code_for` gives its code. Classes are named by their import path, so this module imports nothing
heavy (MLflow, torch, Ray) and a dry run stays fast; tests/test_exit_codes.py imports each one.
The README's "Exit codes" table is `markdown()`, checked by tests/test_docs.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str
    raised_as: str = ""  # "module.Class" of the exception that ends a command with this code


OK, FAILED, CONFIG, DIVERGED, TRACKING, CHECKPOINT, CLUSTER, NO_RUNS, LOCKED, NO_SUCH_RUN = range(10)
SIGINT_STOP, SIGTERM_STOP = 130, 143  # 128 + the signal's number, as shells report it

TABLE = (
    ExitCode(
        OK,
        "done: the run finished, every trial of a sweep ended (finished or diverged), the report, "
        "claims or benchmark were written",
    ),
    ExitCode(
        FAILED,
        "partly done: some trials failed after their retries (start the sweep again to retry "
        "them), or some figures of a report failed",
    ),
    ExitCode(CONFIG, "rejected command line or configuration, before any work", "config.schema.ConfigError"),
    ExitCode(DIVERGED, "the training run diverged: non-finite loss or parameters (train, rerun)"),
    ExitCode(
        TRACKING,
        "the MLflow tracking store is unreachable or unusable: damaged, truncated, another schema, or "
        "read-only for a command that writes (a sweep: at the start, or mid-sweep for longer than "
        "tracking.outage_s)",
        "tracking.store.TrackingError",
    ),
    ExitCode(CHECKPOINT, "the checkpoint to resume from is unusable", "training.checkpoint.CheckpointError"),
    ExitCode(
        CLUSTER, "the Ray cluster is unreachable or its storage is not shared", "sweeper.sweep.ClusterError"
    ),
    ExitCode(
        NO_RUNS,
        "nothing to analyse: no training runs in the chosen experiment (report, claims)",
        "analysis.runs.NoRuns",
    ),
    ExitCode(
        LOCKED, "another driver runs this sweep (sweep; the message names it)", "sweeper.lock.SweepLocked"
    ),
    ExitCode(
        NO_SUCH_RUN,
        "the run id is not in the (healthy) tracking store (rerun; the message names the store)",
        "sweeper.rerun.NoSuchRun",
    ),
    ExitCode(
        SIGINT_STOP,
        "stopped by SIGINT (Ctrl-C): running trials keep their last checkpoint; the same command "
        "resumes them (sweep)",
    ),
    ExitCode(SIGTERM_STOP, "stopped by SIGTERM (e.g. a pod eviction), as for SIGINT (sweep)"),
)


def code_for(err: BaseException) -> int | None:
    """The exit code of an error of the table (or of a subclass), else None."""
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in type(err).__mro__}
    return next((row.code for row in TABLE if row.raised_as in names), None)


def markdown() -> str:
    """The table as the README shows it."""
    rows = ["| code | meaning | raised as |", "|---|---|---|"]
    rows += [f"| {r.code} | {r.meaning} | {f'`{r.raised_as}`' if r.raised_as else ''} |" for r in TABLE]
    return "\n".join(rows)
