"""The errors the sweeper's commands end with, each with its exit code (cli.exit_codes's table), in one module
that no command runs as `__main__`.

`python -m sweeper.sweep` runs sweeper/sweep.py as the module `__main__`: a class defined there would be
`__main__.ClusterError`, another class than the `sweeper.sweep.ClusterError` that anything importing
sweeper.sweep sees (and catches). Defined here, one class serves both forms of a command
(tests/test_exit_codes.py checks that no error of cli.exit_codes's table lives in a module run as a script).
"""

from __future__ import annotations

from cli import exit_codes


class SweepLocked(RuntimeError, exit_codes.CommandError):
    """Another driver runs this sweep (sweeper.driver.lock); the message names it."""

    exit_code = exit_codes.LOCKED


class ClusterError(RuntimeError, exit_codes.CommandError):
    """The Ray cluster cannot be used; the message says which address or path and why."""

    exit_code = exit_codes.CLUSTER


class NoSuchRun(LookupError, exit_codes.CommandError):
    """The run id is not in a store that answers: a typo or another store, not a broken one."""

    exit_code = exit_codes.NO_SUCH_RUN


class PreflightFailed(RuntimeError, exit_codes.CommandError):
    """The preflight (sweeper.preflight) found faults on the sweep's cluster; its table named each one."""

    exit_code = exit_codes.PREFLIGHT


class NotConfirmed(RuntimeError, exit_codes.CommandError):
    """A sweep above its confirmation thresholds (sweeper.driver.confirm) that was not confirmed: nothing
    started."""

    exit_code = exit_codes.NOT_CONFIRMED
