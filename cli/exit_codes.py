"""The exit codes of every command (train, sweep, rerun, report, claims, bench): one table.

An error a command reports as one line is a `CommandError`, whose class carries its exit code
(`exit_code`, one of the codes below): each package defines its own errors on this base
(config.schema.ConfigError, tracking.errors.TrackingError, ...), and `code_for` reads the code of the
error's class, matched by what the class is, never by its name. An error of another library (MLflow's,
SQLAlchemy's) ends a command alike when the layer that knows what it means attached a CommandError to it
(`attach`: tracking.sqlite_guard, for a store's SQLite error); `explained` finds it, so this package,
at the bottom, needs to know none of them. The table's `raised_as` names each class
for docs/commands.md; tests/test_exit_codes.py checks that every CommandError of the project is named
there with its code, and that none lives in a module run as `__main__` (`python -m sweeper.sweep` would
define a second class of the same name there, which no importer of sweeper.sweep sees: sweeper.errors
holds those commands' errors). The "Exit codes" table of docs/commands.md is `markdown()`, checked by
tests/test_docs.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterator


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str
    raised_as: str = ""  # "module.Class" of the CommandError that ends a command with this code (docs)


(
    OK,
    FAILED,
    CONFIG,
    DIVERGED,
    TRACKING,
    CHECKPOINT,
    CLUSTER,
    NO_RUNS,
    LOCKED,
    NO_SUCH_RUN,
    PREFLIGHT,
    NOT_CONFIRMED,
) = range(12)
# 75: EX_TEMPFAIL of sysexits.h, "try again later": what a batch system's requeue or a retry loop looks for.
BUDGET_STOP = 75
SIGINT_STOP, SIGPIPE_STOP, SIGTERM_STOP = 130, 141, 143  # 128 + the signal's number, as shells report it


class CommandError(Exception):
    """An error that ends a command with one line on stderr and `exit_code`; a subclass sets the code."""

    exit_code: ClassVar[int]


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
    ExitCode(
        DIVERGED,
        "the training run diverged: non-finite loss or parameters, or a final validation objective above "
        "n*d (train, rerun)",
    ),
    ExitCode(
        TRACKING,
        "the MLflow tracking store is unreachable or unusable: damaged, truncated, another schema, a "
        "folder, missing or empty for a command that reads it (report, claims, rerun: they create no "
        "store), or read-only for a command that writes (a sweep: at the start, or mid-sweep for longer "
        "than tracking.outage_s)",
        "tracking.errors.TrackingError",
    ),
    ExitCode(CHECKPOINT, "the checkpoint to resume from is unusable", "training.checkpoint.CheckpointError"),
    ExitCode(
        CLUSTER,
        "a new local Ray instance did not start, or the Ray cluster is unreachable or its storage is not "
        "shared",
        "sweeper.errors.ClusterError",
    ),
    ExitCode(
        NO_RUNS,
        "nothing to analyse: no training runs in the chosen experiment (report, claims)",
        "analysis.runs.NoRuns",
    ),
    ExitCode(
        LOCKED, "another driver runs this sweep (sweep; the message names it)", "sweeper.errors.SweepLocked"
    ),
    ExitCode(
        NO_SUCH_RUN,
        "the run id is not in the (healthy) tracking store (rerun; the message names the store)",
        "sweeper.errors.NoSuchRun",
    ),
    ExitCode(
        PREFLIGHT,
        "the preflight found faults that would fail the sweep on its cluster, each named in one line of its "
        "table (preflight; a sweep with cluster.address set, before any trial starts)",
        "sweeper.errors.PreflightFailed",
    ),
    ExitCode(
        NOT_CONFIRMED,
        "a sweep above sweep.confirm_trials or sweep.confirm_hours not confirmed: answered no, or no "
        "terminal to ask (--yes or sweep.confirm=false launches it); nothing started or recorded (sweep)",
        "sweeper.errors.NotConfirmed",
    ),
    ExitCode(
        BUDGET_STOP,
        "stopped at its time budget (cluster.time_budget_s): running trials keep their last checkpoint; "
        "the same command goes on (sweep)",
    ),
    ExitCode(
        SIGINT_STOP,
        "stopped by SIGINT (Ctrl-C): running trials keep their last checkpoint; the same command "
        "resumes them; a second Ctrl-C ends the driver at once, its open runs marked KILLED (sweep)",
    ),
    ExitCode(
        SIGPIPE_STOP,
        "the reader of the output left before its end (piped into head, say): nothing more is printed",
    ),
    ExitCode(SIGTERM_STOP, "stopped by SIGTERM (e.g. a pod eviction), as for SIGINT (sweep)"),
)


def code_for(err: BaseException) -> int | None:
    """The exit code of a CommandError (its class's), else None: any other error is a bug, re-raised."""
    return err.exit_code if isinstance(err, CommandError) else None


EXPLANATION = "command_error"  # the attribute attach sets on another library's error


def attach(err: BaseException, explanation: CommandError) -> None:
    """Let `err`, another library's error, carry the CommandError that explains it, where it happens."""
    setattr(err, EXPLANATION, explanation)


def explained(err: BaseException) -> CommandError | None:
    """The CommandError a command ends with on `err`: one attached to it or to an error of its chain of
    causes (the store's damage behind MLflow's error), else err itself if it is one; None for any other
    error (a bug: re-raised with its traceback)."""
    attached = (getattr(e, EXPLANATION, None) for e in _chain(err))
    found = next((e for e in attached if isinstance(e, CommandError)), None)
    return found or (err if isinstance(err, CommandError) else None)


def _chain(err: BaseException) -> Iterator[BaseException]:
    """err, then its cause (else its context), then that one's, ...: each once, for a chain can loop
    (`raise e from e`: Ray's missing-dashboard error is its own cause)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def markdown() -> str:
    """The table as docs/commands.md shows it."""
    rows = ["| code | meaning | raised as |", "|---|---|---|"]
    rows += [f"| {r.code} | {r.meaning} | {f'`{r.raised_as}`' if r.raised_as else ''} |" for r in TABLE]
    return "\n".join(rows)
