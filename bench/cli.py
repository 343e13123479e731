"""Deprecated, gone in the next release: `bench.cli`, the benchmarks' command until it moved to
bench/__main__.py (`python -m bench`, `leaner-bench`)."""

import warnings

from bench.__main__ import COMMANDS, main

__all__ = ["COMMANDS", "main"]

warnings.warn(
    "bench.cli is deprecated and goes in the next release: the command is bench.__main__ (python -m bench)",
    DeprecationWarning,
    stacklevel=2,
)
