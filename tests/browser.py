"""A real `mlflow ui` seen through headless Chromium (Debian's chromium and chromium-driver, via Selenium).

Used by tests/test_mlflow_ui.py, and run as a script to retake the screenshots of docs/mlflow-ui.md:

    PYTHONPATH=.:tests python tests/browser.py sqlite:///PATH/mlflow.db docs/   # sweep=demo, then its report

Pages are read as a user sees them: the visible text, and the controls by their labels.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from support.servers import SERVER_ENV, free_port, stop_group, wait_until_up

CHROMIUM = Path("/usr/lib/chromium/chromium")  # the binary behind Debian's /usr/bin/chromium launcher
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 120  # a cold UI on two busy cores takes a while to fetch and draw


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    return f"{' and '.join(absent)} missing: apt-get install chromium chromium-driver" if absent else None


@contextmanager
def mlflow_ui(store_uri: str, log: Path) -> Iterator[str]:
    """`mlflow ui` on a free port of 127.0.0.1 serving store_uri; yields its address."""
    port = free_port()
    address = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        store_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with open(log, "wb") as out:  # its own process group: the UI forks workers, all stopped together
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=SERVER_ENV
        )
    try:
        wait_until_up(address, proc, log, WAIT_S)
        yield address
    finally:
        stop_group(proc, timeout=20)


@contextmanager
def chromium(width: int = 1600, height: int = 1000):
    """A headless Chromium session (a Selenium WebDriver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def wait_for(driver, condition, what: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S, poll_frequency=0.5).until(
        lambda d: condition(), message=f"waiting for {what}"
    )


def assistant_open(driver) -> bool:
    """Whether MLflow's Assistant panel shows. MLflow 3.17's UI opens it by itself on the first page a browser
    loads from a loopback address (its local storage then remembers whether it is open)."""
    return "MLflow Assistant" in text(driver)


def open_page(driver, address: str, shows: str) -> None:
    """Load address, wait until the page shows the text `shows`, and close the assistant side panel."""
    from selenium.webdriver.common.by import By

    driver.get(address)
    wait_for(driver, lambda: shows in text(driver), repr(shows))
    for button in driver.find_elements(By.XPATH, "//button[@aria-label='Close']"):
        if button.is_displayed():
            button.click()


def column_headers(driver) -> list[str]:
    """The runs table's column headers as shown (the grid draws the columns in view)."""
    from selenium.webdriver.common.by import By

    headers = [h.text.strip() for h in driver.find_elements(By.CSS_SELECTOR, ".ag-header-cell")]
    return [h for h in headers if h]


# The runs table's cells in view, by row index and column id, and its headers by column id.
CELLS_IN_VIEW = """
const rows = {}, headers = {};
for (const row of document.querySelectorAll('.ag-row'))
  for (const cell of row.querySelectorAll('.ag-cell[col-id]'))
    (rows[row.getAttribute('row-index')] ||= {})[cell.getAttribute('col-id')] = cell.innerText;
for (const header of document.querySelectorAll('.ag-header-cell[col-id]'))
  headers[header.getAttribute('col-id')] = header.innerText.trim();
return [headers, rows];
"""
SIDEWAYS = ".ag-body-horizontal-scroll-viewport"  # the grid's horizontal scroll bar


def runs_table(driver) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The runs table as shown, scrolled through sideways as a user does (the grid draws only the columns in
    view): each column's header by its id (e.g. params.`model.gamma`), and the rows top to bottom, each its
    cells' text by column id."""
    headers: dict[str, str] = {}
    rows: dict[int, dict[str, str]] = {}
    width, step = driver.execute_script(
        f"const v = document.querySelector('{SIDEWAYS}'); return [v.scrollWidth, v.clientWidth];"
    )
    for left in range(0, width, step):
        driver.execute_script(f"document.querySelector('{SIDEWAYS}').scrollLeft = arguments[0];", left)
        time.sleep(1)  # the grid draws the columns scrolled in on its next frames
        shown, cells = driver.execute_script(CELLS_IN_VIEW)
        headers.update(shown)
        for index, row in cells.items():
            rows.setdefault(int(index), {}).update(row)
    driver.execute_script(f"document.querySelector('{SIDEWAYS}').scrollLeft = 0;")
    return headers, [rows[i] for i in sorted(rows)]


def cut_headers(driver) -> list[str]:
    """The column headers the grid shows cut (an ellipsis: their text is wider than its cell)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('.ag-header-cell-text')]"
        ".filter(e => e.scrollWidth > e.clientWidth).map(e => e.textContent.trim());"
    )


def html_artifact(driver) -> dict:
    """The HTML artifact MLflow's artifact viewer shows (in its frame): the page's text, the sources of its
    images, and its tables (each a list of rows of cell texts, the header row first)."""
    from selenium.webdriver.common.by import By

    frame = "iframe.mlflow-html-iframe"
    wait_for(driver, lambda: driver.find_elements(By.CSS_SELECTOR, frame), "the HTML artifact's frame")
    driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, frame))
    try:
        wait_for(driver, lambda: text(driver).strip(), "the HTML artifact's text")
        images = [i.get_attribute("src") for i in driver.find_elements(By.TAG_NAME, "img")]
        tables = [
            [
                [c.text for c in r.find_elements(By.XPATH, "./th|./td")]
                for r in t.find_elements(By.TAG_NAME, "tr")
            ]
            for t in driver.find_elements(By.TAG_NAME, "table")
        ]
        return {"text": text(driver), "images": images, "tables": tables}
    finally:
        driver.switch_to.default_content()


def groups(driver) -> dict[str, list[str]]:
    """The grouped runs table as shown: group label -> the lines of its rows (run names among them)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text(driver).splitlines():
        if line.startswith("Group: "):
            current = out.setdefault(line.removeprefix("Group: "), [])
        elif line == "Additional runs" or line.endswith("matching runs"):
            current = None
        elif current is not None:
            current.append(line)
    return out


def show_charts(driver) -> None:
    """The runs page's chart view (the second of its view buttons), drawn."""
    from selenium.webdriver.common.by import By

    button = driver.find_element(By.CSS_SELECTOR, "input[value='CHART']")
    driver.execute_script("arguments[0].click();", button)  # the radio input sits under its icon
    wait_for(driver, lambda: "Model metrics" in text(driver), "the charts")
    time.sleep(5)  # the charts' last frames


def screenshots(store_uri: str, folder: Path) -> None:
    """The pictures of docs/mlflow-ui.md, of a store with a sweep `demo` that analysis.report has run on: the
    page the sweep's link opens in a new browser, MLflow's Assistant panel open over it
    (docs/mlflow-first-visit.png), the runs view once it is closed (docs/mlflow-runs-grouped.png), its charts
    (docs/mlflow-runs-charts.png) and the report on the parent run (docs/mlflow-report.png)."""
    from mlflow.tracking import MlflowClient

    from tracking import store, ui, view
    from tracking.names import REPORT_DIR, REPORT_HTML

    client = MlflowClient(store_uri)
    experiment = store.ensure_experiment(client, "leaner-clustering")
    view.install(client, experiment)  # where it is missing
    parent = client.search_runs([experiment], "attributes.run_name = 'sweep-demo'")[0].info.run_id
    with mlflow_ui(store_uri, folder / "mlflow-ui.log") as address, chromium(1700, 900) as driver:
        driver.get(ui.runs_table(address, experiment))
        wait_for(
            driver, lambda: "Group: " in text(driver) and assistant_open(driver), "the Assistant's panel"
        )
        time.sleep(3)
        driver.save_screenshot(str(folder / "mlflow-first-visit.png"))
        open_page(driver, ui.runs_table(address, experiment), "Group: ")  # the panel closed
        time.sleep(3)
        driver.save_screenshot(str(folder / "mlflow-runs-grouped.png"))
        show_charts(driver)
        driver.save_screenshot(str(folder / "mlflow-runs-charts.png"))
        page = ui.run_page(address, experiment, parent, f"artifactPath/{REPORT_DIR}/{REPORT_HTML}")
        open_page(driver, page, f"{REPORT_DIR}/{REPORT_HTML}")
        html_artifact(driver)  # drawn; shown from its top, the headline, as it opens
        driver.save_screenshot(str(folder / "mlflow-report.png"))
    (folder / "mlflow-ui.log").unlink()


if __name__ == "__main__":
    screenshots(sys.argv[1], Path(sys.argv[2]))
