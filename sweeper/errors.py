"""The errors of the commands whose own module runs as `__main__` (sweep, rerun).

`python -m sweeper.sweep` runs sweeper/sweep.py as the module `__main__`: a class defined there would be
`__main__.ClusterError`, another class than the `sweeper.sweep.ClusterError` that anything importing
sweeper.sweep sees. Defined here, one class serves both forms of a command, and sweeper.exit_codes
matches it (tests/test_exit_codes.py checks that no error of the table lives in a module run as a script).
"""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The Ray cluster cannot be used; the message says which address or path and why."""


class NoSuchRun(LookupError):
    """The run id is not in a store that answers: a typo or another store, not a broken one."""
