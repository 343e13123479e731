"""TrackingError: the tracking store cannot be used (exit code 4). Raised by tracking.store and by the SQLite
guard beneath it (tracking.sqlite_guard); importable from tracking.store too."""

from __future__ import annotations

from cli import exit_codes


class TrackingError(RuntimeError, exit_codes.CommandError):
    """The tracking store cannot be used; the message names its URI."""

    exit_code = exit_codes.TRACKING
