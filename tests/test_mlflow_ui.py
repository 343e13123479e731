"""The MLflow UI in a real browser: `mlflow ui` on the smoke sweep's store, read by headless Chromium.

The address the sweep prints opens the runs view of tracking.view (a view state the pinned MLflow's UI reads
from an experiment tag): rows grouped by configuration without a click, the val_rel_lloyd column, the runs'
short names. The report that analysis.report attaches to the sweep's parent run shows in MLflow's artifact
viewer as one page, its figures inline and the claims table in it. A user's own two-axis sweep (from their
--config-dir) opens, by the address it prints, on its axes as columns and its configurations best first.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import browser
import pytest
from mlflow.tracking import MlflowClient
from support.configs import GAMMA_LR, SMALL_EVAL
from support.repo import REPO
from support.sweeps import children

from analysis.claims.records import CLAIMS
from sweeper.sweep import main as sweep_main
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
from tracking.view import RUN_NAME_COLUMN, column

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def driver():
    """One headless Chromium for the file's tests."""
    if reason := browser.missing():
        pytest.skip(f"no browser: {reason}")
    with browser.chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def ui_on_smoke_store(smoke_store, driver, tmp_path_factory):
    """(address, driver): one `mlflow ui` on the smoke store for the file's tests (the UI reads the store
    live: a report attached meanwhile shows)."""
    log = tmp_path_factory.mktemp("mlflow-ui") / "ui.log"
    with browser.mlflow_ui(smoke_store, log) as address:
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


@pytest.fixture(scope="module")
def users_sweep(ray_cluster, _empty_store, tmp_path_factory) -> tuple[str, str]:
    """A user's gamma x lr sweep (support.configs.GAMMA_LR in their own --config-dir: 4 tiny models) on the
    session's Ray cluster: (its store's URI, the address it printed last)."""
    root = tmp_path_factory.mktemp("users-sweep")
    (root / "mine" / "sweep").mkdir(parents=True)
    (root / "mine" / "sweep" / "gamma-lr.yaml").write_text(GAMMA_LR)
    shutil.copyfile(_empty_store, root / "mlflow.db")  # skips MLflow's schema migrations
    uri = f"sqlite:///{root / 'mlflow.db'}"
    line = ["-cd", str(root / "mine"), "sweep=gamma-lr", f"tracking.uri={uri}", f"cluster.storage={root}/ray"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert sweep_main([*line, ray_cluster]) == 0
    (link,) = [s.split("then open ")[1] for s in printed.getvalue().splitlines() if "then open " in s]
    return uri, link


def test_a_users_sweep_opens_on_its_axes_best_first(users_sweep, driver, tmp_path):
    """What a user sees at the address their own sweep printed: a column for each swept key with each run's
    value, the configurations ordered by val_rel_lloyd (lowest first), each a group row over its run, and run
    names that spell the axes (the paper's lr where it is not 0.01, the user's gamma always)."""
    uri, link = users_sweep
    runs = sorted(children(uri, "gamma-lr"), key=lambda r: r.data.metrics[VAL_REL_LLOYD])  # best first
    assert sorted(r.info.run_name for r in runs) == [
        "OH-L2 tau1 d4 k6 n16 gamma0.5 s1",
        "OH-L2 tau1 d4 k6 n16 gamma1 s1",
        "OH-L2 tau1 d4 k6 n16 lr0.03 gamma0.5 s1",
        "OH-L2 tau1 d4 k6 n16 lr0.03 gamma1 s1",
    ]
    assert link.startswith(ui.LOCAL_UI)  # `mlflow ui`'s default address: this one listens on a free port
    with browser.mlflow_ui(uri, tmp_path / "ui.log") as address:
        browser.open_page(driver, address + link.removeprefix(ui.LOCAL_UI), "Group: ")
        headers, rows = browser.runs_table(driver)
    gamma, lr, metric = (
        column("params", "model.gamma"),
        column("params", "optim.lr"),
        column("metrics", VAL_REL_LLOYD),
    )
    assert (headers.get(gamma), headers.get(lr)) == ("model.gamma", "optim.lr"), headers
    # A group row's name cell reads "#colour", "Group: <configuration>" and its count, on three lines.
    names = [
        next((s for s in row[RUN_NAME_COLUMN].splitlines() if s.startswith("Group: ")), row[RUN_NAME_COLUMN])
        for row in rows
    ]
    assert names[: 2 * len(runs)] == [
        shown for r in runs for shown in (f"Group: {r.data.tags[CONFIGURATION]}", r.info.run_name)
    ], names
    seen = [
        (row[RUN_NAME_COLUMN], row[gamma], row[lr], float(row[metric])) for row in rows[1 : 2 * len(runs) : 2]
    ]
    assert seen == [
        (
            r.info.run_name,
            r.data.params["model.gamma"],
            r.data.params["optim.lr"],
            r.data.metrics[VAL_REL_LLOYD],
        )
        for r in runs
    ]
