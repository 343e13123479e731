"""A folder's own config.py or models/ in place of this project's packages: one line, not an ImportError.

The install adds top-level packages with generic names (config, models, tasks, ...). `python -m MODULE`
puts the current folder first on the import path, so in a folder that holds a config.py (or a models/
package, ...) of its own, `from config import grid` finds that one and fails in a traceback that names
neither. The packages a `python -m` command starts from (sweeper, analysis, bench) run `check` first, from
their __init__: loaded by this file's path (runpy.run_path), for `cli` may be the shadowed name. The
console scripts (leaner-sweep, ...) start from their own folder, where nothing shadows the packages.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# The project's importable packages (pyproject.toml's [tool.setuptools.packages.find]; conf/ is read as
# files beside config/, never imported).
PACKAGES = ("cli", "tasks", "models", "config", "training", "tracking", "sweeper", "analysis", "bench")
ROOT = Path(__file__).resolve().parent.parent  # where this install's packages are
CONFIG_EXIT = 2  # cli.exit_codes.CONFIG, not imported: cli itself may be what is shadowed


def shadows() -> list[tuple[str, str]]:
    """(package, what the import path finds in its place) for each package found elsewhere than ROOT."""
    found = []
    for name in PACKAGES:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None) if module else _origin(name)
        if where and Path(where).resolve().parent != ROOT / name:
            found.append((name, f"{Path(where).parent}/" if Path(where).name == "__init__.py" else where))
    return found


def _origin(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    return spec.origin if spec is not None else None


def check() -> None:
    """Stop, naming what shadows which package, when one is shadowed: under `python -m` (sys.argv[0] is
    '-m' while its module is located) as a command, `error: ...` and exit code 2; else an ImportError."""
    found = shadows()
    if not found:
        return
    named = ", ".join(f"{where} shadows the package {name} of {ROOT}" for name, where in found)
    message = (
        f"{named}: `python -m` puts the current folder first on the import path; run it from another "
        "folder, or use the leaner-* commands (leaner-sweep, leaner-train, leaner-report, ...), which it "
        "does not affect"
    )
    if sys.argv[:1] == ["-m"]:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(CONFIG_EXIT)
    raise ImportError(message)
