"""The MLflow UI in a real browser: `mlflow ui` on the smoke sweep's store, read by headless Chromium.

The address the project prints opens the Model-training runs table (not MLflow 3's GenAI view), and
"Group by" on the `configuration` tag puts each configuration's seeds together.
"""

from __future__ import annotations

import browser
import pytest
from support.sweeps import children

from tracking import ui
from tracking.names import CONFIGURATION

pytestmark = pytest.mark.slow


def test_runs_table_groups_each_configurations_seeds(smoke_store, tmp_path):
    if reason := browser.missing():
        pytest.skip(f"no browser: {reason}")
    runs = children(smoke_store, "smoke")
    experiment = runs[0].info.experiment_id
    seeds_of: dict[str, set[str]] = {}  # configuration -> its runs' names, from MlflowClient
    for run in runs:
        seeds_of.setdefault(run.data.tags[CONFIGURATION], set()).add(run.info.run_name)
    assert len(seeds_of) == 4 and all(len(names) == 2 for names in seeds_of.values())
    with browser.mlflow_ui(smoke_store, tmp_path / "ui.log") as address, browser.chromium() as driver:
        browser.open_page(driver, ui.runs_table(address, experiment), "sweep-smoke")  # the sweep's parent row
        page = browser.text(driver)
        assert "Run Name" in page and "Group by" in page and "matching runs" in page  # the runs table
        browser.group_by(driver, CONFIGURATION)
        shown = browser.groups(driver)
    assert set(seeds_of) <= set(shown), (sorted(seeds_of), sorted(shown))
    names = {run.info.run_name for run in runs}
    for configuration, wanted in seeds_of.items():
        assert names & set(shown[configuration]) == wanted, configuration  # its seeds, and no other run
