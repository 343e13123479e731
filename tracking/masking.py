"""Credentials that a store's runs recorded before they were masked (cli.credentials), masked in place.

Runs written before this project masked what it records hold a store's password in their tags (the sweep's
`command`, its note, the `tracking.uri` tag) and in their text artifacts (config.yaml, sweep.yaml, a
report's index.md). `mask_recorded` rewrites each tag and text artifact whose masked text differs, through
the store's own client (an SQLite file, PostgreSQL or a server alike), and counts them. Params need no
rewriting: they hold only the values that determine a run's numbers (config.identity.flat_params), never an
address.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mlflow.entities import Run, ViewType
from mlflow.tracking import MlflowClient

from cli.credentials import mask
from tracking.store import search

TEXT_ARTIFACTS = (".yaml", ".yml", ".txt", ".md", ".csv", ".json", ".html", ".log")


def mask_recorded(client: MlflowClient) -> int:
    """Mask every credential the store's runs (of every experiment, deleted ones too) recorded; how many tags
    and artifacts changed."""
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    changed = 0
    for run in _every_run(client, experiments):
        changed += _mask_tags(client, run) + _mask_artifacts(client, run.info.run_id)
    return changed


def _every_run(client: MlflowClient, experiments: list[str]) -> list[Run]:
    return search(client, experiments) + client.search_runs(experiments, "", ViewType.DELETED_ONLY)


def _mask_tags(client: MlflowClient, run: Run) -> int:
    changed = {k: mask(v) for k, v in run.data.tags.items() if mask(v) != v}
    for key, value in changed.items():
        client.set_tag(run.info.run_id, key, value)
    return len(changed)


def _mask_artifacts(client: MlflowClient, run_id: str, folder: str | None = None) -> int:
    """The run's text artifacts under `folder` (all of them: the root's and its folders'), each downloaded,
    masked and logged again in its place when the mask changed it."""
    changed = 0
    for item in client.list_artifacts(run_id, folder):
        if item.is_dir:
            changed += _mask_artifacts(client, run_id, item.path)
        elif item.path.endswith(TEXT_ARTIFACTS):
            changed += _mask_artifact(client, run_id, item.path)
    return changed


def _mask_artifact(client: MlflowClient, run_id: str, path: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(client.download_artifacts(run_id, path, tmp))
        text = local.read_text(errors="replace")
        if mask(text) == text:
            return 0
        local.write_text(mask(text))
        client.log_artifact(run_id, str(local), str(Path(path).parent) if "/" in path else None)
    return 1
