"""The checkout under test, and the environment of the subprocesses the tests start in it."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def subprocess_env() -> dict[str, str]:
    """Environment for `python -m sweeper...` subprocesses run outside the repository root."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env
