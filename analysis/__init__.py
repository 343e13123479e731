"""The report, the claims and the notebook API: what reads a store's runs."""

import runpy
from pathlib import Path

# First of all: `python -m` in a folder with a config.py or models/ of its own would import those in place of
# the project's packages (cli/shadowing.py says so in one line; loaded by its path: `cli` may be shadowed).
runpy.run_path(str(Path(__file__).resolve().parent.parent / "cli" / "shadowing.py"))["check"]()
