"""Addresses in the MLflow UI that open on runs: the Model-training view, not MLflow 3's GenAI one.

An experiment page opens on traces and evaluations unless its address asks for
the runs table (query workflowType=machine_learning); run pages too, or their
breadcrumbs lead to "Evaluations". Every address the project prints comes from here.
"""

from __future__ import annotations

from pathlib import Path

from cli.credentials import mask
from tracking import view

LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` listens by default
MODEL_TRAINING = "workflowType=machine_learning"


def base_url(uri: str) -> str:
    """The UI of a tracking URI: the server itself, or `mlflow ui` on this machine for a SQLite file."""
    return mask(uri.rstrip("/")) if uri.startswith(("http://", "https://")) else LOCAL_UI


def runs_table(uri: str, experiment_id: str) -> str:
    """The runs table opened on the view tracking.view installs: seeds grouped by configuration, the columns
    that matter. A search filter in the address would make the UI ignore the view, so there is none."""
    return f"{base_url(uri)}/#/experiments/{experiment_id}/runs?viewStateShareKey={view.KEY}&{MODEL_TRAINING}"


def run_page(uri: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """A run's page; tab: "" (overview), "model-metrics" (its charts), "system-metrics", "artifacts"."""
    path = f"/{tab}" if tab else ""
    return f"{base_url(uri)}/#/experiments/{experiment_id}/runs/{run_id}{path}?{MODEL_TRAINING}"


# MLflow 3.17's UI opens its Assistant panel over the page the first time a browser opens a UI on a loopback
# address, and no server setting or view state closes it (docs/mlflow-ui.md): said where the address is.
ASSISTANT = "(MLflow's Assistant panel opens over the runs at first: close it with its X, it stays closed)"


def how_to_open(uri: str, address: str) -> str:
    """The command that serves a SQLite store, then the address; a server's address alone."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///")).resolve()
        serve = f"mlflow ui --backend-store-uri sqlite:///{db}"
        return f"browse it with:\n  {serve}\n  then open {address}\n  {ASSISTANT}"
    return f"open {address}\n  {ASSISTANT}"


def where_to_look(uri: str, experiment: str, experiment_id: str) -> str:
    """A sweep's last line: its experiment's runs table, and how to open it."""
    return (
        f"MLflow: experiment {experiment} in {mask(uri)}; {how_to_open(uri, runs_table(uri, experiment_id))}"
    )
