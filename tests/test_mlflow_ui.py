"""The MLflow UI in a real browser: `mlflow ui` on the smoke sweep's store, read by headless Chromium.

The address the sweep prints opens the runs view of tracking.view (a view state the pinned MLflow's UI reads
from an experiment tag): rows grouped by configuration without a click, the val_rel_lloyd column, the runs'
short names. The report that analysis.report attaches to the sweep's parent run shows in MLflow's artifact
viewer as one page, its figures inline and the claims table in it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import browser
import pytest
from mlflow.tracking import MlflowClient
from support.configs import SMALL_EVAL
from support.repo import REPO
from support.sweeps import children

from analysis.claims.records import CLAIMS
from tracking import ui
from tracking.names import (
    CONFIGURATION,
    MLFLOW_PARENT_RUN_ID,
    REPORT_DIR,
    REPORT_HTML,
    SYSTEM_METRICS,
    SYSTEM_PREFIX,
    VAL_REL_LLOYD,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ui_on_smoke_store(smoke_store, tmp_path_factory):
    """(address, driver): one `mlflow ui` on the smoke store and one headless Chromium for the file's tests
    (the UI reads the store live: a report attached meanwhile shows)."""
    if reason := browser.missing():
        pytest.skip(f"no browser: {reason}")
    log = tmp_path_factory.mktemp("mlflow-ui") / "ui.log"
    with browser.mlflow_ui(smoke_store, log) as address, browser.chromium() as driver:
        yield address, driver


def test_printed_link_opens_the_runs_grouped_by_configuration(smoke_store, ui_on_smoke_store):
    address, driver = ui_on_smoke_store
    runs = children(smoke_store, "smoke")
    experiment = runs[0].info.experiment_id
    seeds_of: dict[str, set[str]] = {}  # configuration -> its runs' names, from MlflowClient
    for run in runs:
        seeds_of.setdefault(run.data.tags[CONFIGURATION], set()).add(run.info.run_name)
    assert len(seeds_of) == 4 and all(len(names) == 2 for names in seeds_of.values())
    names = {run.info.run_name for run in runs}
    assert all(len(name) <= 40 and " s" in name for name in names), names  # short, e.g. OH-L2 tau1 ... s1
    # A new browser, as a newcomer's: MLflow opens its Assistant panel over the table (docs/mlflow-ui.md).
    driver.get(ui.runs_table(address, experiment))
    browser.wait_for(driver, lambda: browser.assistant_open(driver), "the Assistant's panel on a first visit")
    browser.open_page(driver, ui.runs_table(address, experiment), "Group: ")  # grouped with no click
    driver.get("about:blank")  # closed once, the panel stays closed: the page loaded anew
    driver.get(ui.runs_table(address, experiment))
    browser.wait_for(driver, lambda: "Group: " in browser.text(driver), "the grouped runs")
    time.sleep(2)  # the UI opens the panel, when it does, as it loads: give it the time
    assert not browser.assistant_open(driver)
    page = browser.text(driver)
    assert "Group by: configuration" in page and "matching runs" in page
    assert VAL_REL_LLOYD in browser.column_headers(driver)
    assert browser.cut_headers(driver) == []  # tracking.view sets each column's width to its header
    shown = browser.groups(driver)
    assert set(seeds_of) <= set(shown), (sorted(seeds_of), sorted(shown))
    for configuration, wanted in seeds_of.items():
        assert names & set(shown[configuration]) == wanted, configuration  # its seeds, and no other run


def test_the_parent_run_shows_the_report_in_one_page(smoke_store, ui_on_smoke_store, tmp_path):
    address, driver = ui_on_smoke_store
    report = [sys.executable, "-m", "analysis.report", f"tracking.uri={smoke_store}", f"out={tmp_path}"]
    done = subprocess.run(
        [*report, "select.sweep=smoke", *SMALL_EVAL], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a figure failed, the report still written
    client = MlflowClient(smoke_store)
    parent = client.get_run(children(smoke_store, "smoke")[0].data.tags[MLFLOW_PARENT_RUN_ID])
    assert {f"claims_{s}" for s in ("passed", "partial", "failed", "untested")} <= set(parent.data.metrics)
    address_of = [line for line in done.stdout.splitlines() if f"{REPORT_DIR}/{REPORT_HTML}" in line]
    assert address_of, done.stdout[-2000:]
    tab = f"artifactPath/{REPORT_DIR}/{REPORT_HTML}"  # the artifact viewer, opened on the page
    page = ui.run_page(address, parent.info.experiment_id, parent.info.run_id, tab)
    assert page.removeprefix(address) in address_of[-1]  # the address the report printed
    browser.open_page(driver, page, f"{REPORT_DIR}/{REPORT_HTML}")
    shown = browser.html_artifact(driver)
    assert shown["images"] and all(src.startswith("data:image/png;base64,") for src in shown["images"])
    assert "convergence" in shown["text"] and "claims" in shown["text"]
    claims = [t for t in shown["tables"] if t[0][:2] == ["status", "name"]]
    assert claims and len(claims[0]) == 1 + len(CLAIMS), claims  # the header, the 18 claims and those beyond
    assert {row[0] for row in claims[0][1:]} <= {"PASS", "PARTIAL", "FAIL", "UNTESTED"}


def test_a_sweep_runs_system_metrics_tab_shows_what_its_trial_sampled(smoke_store, ui_on_smoke_store):
    """Each trial's CPU and memory samples (training.system_metrics), written by the driver under MLflow's
    system/ names: served by the REST API at the run's evaluation steps, and charted in the run page's System
    metrics tab, one chart each."""
    address, driver = ui_on_smoke_store
    run = children(smoke_store, "smoke")[0]
    for key in SYSTEM_METRICS:
        query = urllib.parse.urlencode({"run_id": run.info.run_id, "metric_key": key})
        with urllib.request.urlopen(f"{address}/api/2.0/mlflow/metrics/get-history?{query}", timeout=30) as r:
            points = json.load(r)["metrics"]
        assert len(points) >= 2 and all(p["value"] >= 0 for p in points), (key, points)
    page = ui.run_page(address, run.info.experiment_id, run.info.run_id, "system-metrics")
    charts = [key.removeprefix(SYSTEM_PREFIX) for key in SYSTEM_METRICS]  # a chart's title: the name
    browser.open_page(driver, page, charts[-1])
    shown = browser.text(driver)
    assert f"System metrics\n({len(SYSTEM_METRICS)})" in shown, shown[:2000]  # the section: five charts
    assert all(title in shown for title in charts), shown[:2000]
