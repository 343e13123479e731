"""A real `mlflow ui` seen through headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium).

Used by tests/test_mlflow_ui.py, and run as a script to retake the README's screenshots:

    PYTHONPATH=. python tests/browser.py sqlite:///PATH/mlflow.db docs/   # a store written by sweep=demo

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


def open_page(driver, address: str, shows: str) -> None:
    """Load address, wait until the page shows the text `shows`, and close the assistant side panel."""
    from selenium.webdriver.common.by import By

    driver.get(address)
    wait_for(driver, lambda: shows in text(driver), repr(shows))
    for button in driver.find_elements(By.XPATH, "//button[@aria-label='Close']"):
        if button.is_displayed():
            button.click()


def group_by(driver, tag: str) -> None:
    """The runs table's "Group by" menu, then the tag."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, "//button[contains(., 'Group by')]").click()
    item = f"//*[@role='menuitemcheckbox'][normalize-space(.)='{tag}']"
    wait_for(driver, lambda: driver.find_elements(By.XPATH, item), f"{tag} in the Group by menu")
    driver.find_element(By.XPATH, item).click()
    wait_for(driver, lambda: "Group: " in text(driver), "grouped rows")


def widen(driver, column: str, pixels: int) -> None:
    """Drag the right edge of a column header of the runs table."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    header = driver.find_element(
        By.XPATH, f"//*[contains(@class, 'ag-header-cell')][contains(., '{column}')]"
    )
    handle = header.find_element(By.XPATH, ".//*[contains(@class, 'ag-header-cell-resize')]")
    ActionChains(driver).click_and_hold(handle).move_by_offset(pixels, 0).release().perform()


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


def screenshots(store_uri: str, folder: Path) -> None:
    """docs/mlflow-runs-grouped.png (the runs table grouped by configuration) and
    docs/mlflow-run-metrics.png."""
    from mlflow.tracking import MlflowClient

    from tracking import ui
    from tracking.names import CONFIGURATION, SWEEP

    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("leaner-clustering").experiment_id
    best = client.search_runs(
        [experiment],
        f"tags.{SWEEP} = 'demo' and tags.{CONFIGURATION} LIKE '%'",
        order_by=["metrics.best_val_rel_lloyd ASC"],
    )[0]
    with mlflow_ui(store_uri, folder / "mlflow-ui.log") as address, chromium(1500, 900) as driver:
        open_page(driver, ui.runs_table(address, experiment), "sweep-demo")
        group_by(driver, CONFIGURATION)
        widen(driver, "Run Name", 330)
        driver.save_screenshot(str(folder / "mlflow-runs-grouped.png"))
        open_page(
            driver, ui.run_page(address, experiment, best.info.run_id, "model-metrics"), "best_val_rel_lloyd"
        )
        wait_for(driver, lambda: text(driver).count("Step") >= 3, "the charts drawn")
        time.sleep(3)  # the charts' last frames
        driver.save_screenshot(str(folder / "mlflow-run-metrics.png"))
    (folder / "mlflow-ui.log").unlink()


if __name__ == "__main__":
    screenshots(sys.argv[1], Path(sys.argv[2]))
