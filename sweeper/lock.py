"""Deprecated, gone in the next release: `sweeper.lock.SweepLocked`, exit code 8's class, is
sweeper.errors.SweepLocked (the driver's lock itself is sweeper.driver.lock)."""

import warnings

from sweeper.errors import SweepLocked

__all__ = ["SweepLocked"]

warnings.warn(
    "sweeper.lock is deprecated and goes in the next release: import SweepLocked from sweeper.errors",
    DeprecationWarning,
    stacklevel=2,
)
