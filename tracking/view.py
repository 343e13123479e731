"""The runs view that the link a sweep prints opens: seeds grouped by configuration, the columns that matter.

MLflow's UI keeps shareable view states as experiment tags `mlflow.sharedViewState.<key>` and opens one from
`#/experiments/<id>/runs?viewStateShareKey=<key>` (tracking.ui.runs_table). The tag's value is the UI's own
envelope, {name, createdAt, updatedAt, state}, whose `state` is JSON text of the UI's view state; the UI
also lists it among the experiment's saved views. The format is the UI's, not a public API: it was read
from MLflow 3.17.2's web app and tests/test_mlflow_ui.py checks in Chromium that this MLflow loads it
(without it the address still opens the plain runs table, with an error note on the view).

The view: rows grouped by the `configuration` tag (one group per configuration, its seeds under it), every
run shown in the charts (the UI's default draws the first 10), columns for the final and best
val_rel_lloyd, train_loss, embedding, regularizer, tau, seed and outcome, and one for each key a sweep in the
experiment sweeps (its axes: model.gamma, optim.lr, ...), rows sorted by val_rel_lloyd (best first), and
log-scale line charts:
val_rel_lloyd runs from about 60 for the untrained model of step 0 down to about 1, and only a log axis
keeps 0.9 apart from 1 and 1.4. The parent run's metrics (trial counters, claims, the sweep's model-steps a
second) get no chart.

Colours: a view state holds none. MLflow 3.17's UI colours a run by its `mlflow.runColor` tag (read when runs
load), so every training run carries its embedding's colour (tracking.run_tags), the colours the report's
figures use too (analysis.style). A group of seeds is coloured from the browser's local storage
(`experimentRunColors`) or a colour derived from the group's id, which no server-side state can set: the
grouped charts of this view keep MLflow's colours; with Group by set to none each run is drawn in its
embedding's colour.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # the sweep's dry run imports this module and must not load MLflow
    from mlflow.tracking import MlflowClient

from models.options import EMBEDDINGS
from tracking.names import (
    BEST_VAL_REL_LLOYD,
    CLAIM_COUNTS,
    CONFIGURATION,
    LR,
    MEDIAN_FINAL,
    OUTCOME,
    SEED,
    STEP_RATE,
    TRAIN_LOSS,
    TRIAL_COUNTS,
    VAL_KMEANS,
    VAL_REL_LLOYD,
)

# One colour per embedding, in the report's figures and the MLflow UI (matplotlib's tab:blue, tab:orange and
# tab:green, as hex: the UI takes CSS colours).
EMBEDDING_COLORS = {"onehot": "#1f77b4", "binary": "#ff7f0e", "none": "#2ca02c"}
KEY = "by-configuration"  # the share key in the address
TAG = f"mlflow.sharedViewState.{KEY}"
NAME = "Seeds by configuration"  # as the UI's view menu lists it
RUN_NAME_COLUMN = "attributes.`Run Name`"
RUN_NAME_WIDTH = 360  # pixels: a run name, e.g. "BN-L2 tau0.1 d32 k10 n512 s153476998", in full
MODEL_SECTION, SYSTEM_SECTION = "Model metrics", "System metrics"  # the UI's chart sections
LOG_CHARTS = (VAL_REL_LLOYD, BEST_VAL_REL_LLOYD, TRAIN_LOSS, VAL_KMEANS, LR)
# The parent run's metrics: no chart among the trials' curves.
HIDDEN_CHARTS = (
    *TRIAL_COUNTS.values(),
    *CLAIM_COUNTS.values(),
    *(MEDIAN_FINAL + e for e in EMBEDDINGS),
    STEP_RATE,
)


def column(kind: str, key: str) -> str:
    """The UI's id of a runs-table column: kind attributes, params, metrics or tags."""
    return f"{kind}.`{key}`"


COLUMNS = [
    column("metrics", VAL_REL_LLOYD),
    column("metrics", BEST_VAL_REL_LLOYD),
    column("metrics", TRAIN_LOSS),
    column("params", "model.embedding"),
    column("params", "loss.regularizer"),
    column("params", "loss.tau"),
    column("tags", SEED),
    column("tags", OUTCOME),
]


def header_width(column_id: str) -> int:
    """Pixels that show a column's header in full (the default cuts "loss.regularizer" to "loss.reg...")."""
    key = column_id.split("`")[1]
    return max(100, 8 * len(key) + 40)


def chart(metric: str, deleted: bool = False) -> dict:
    """A line chart of one metric against step, log y-axis, in the model metrics section."""
    return {
        "uuid": f"chart-{metric}",
        "type": "LINE",
        "runsCountToCompare": 10,
        "metricSectionId": "section-model",
        "deleted": deleted,
        "isGenerated": False,
        "displayName": metric,
        "metricKey": metric,
        "selectedMetricKeys": [metric],
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "log",
        "range": {},
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": True,
        "useGlobalLineSmoothing": True,
    }


def state(swept: Sequence[str] = ()) -> dict:
    """The UI's view state (keys of MLflow's experiment-page UI state and search facets): COLUMNS and a
    column for each swept config key (`swept`) they leave out, rows by the headline metric, best first."""
    columns = [*COLUMNS, *(c for c in dict.fromkeys(column("params", k) for k in swept) if c not in COLUMNS)]
    return {
        "orderByKey": column("metrics", VAL_REL_LLOYD),
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, *columns],
        "columnWidths": {RUN_NAME_COLUMN: RUN_NAME_WIDTH, **{c: header_width(c) for c in columns}},
        "runsHiddenMode": "SHOW_ALL",
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": CONFIGURATION}],
        },
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "isAccordionReordered": False,
        # Sections whose charts keep this order (isReordered): the UI appends other metrics' charts after.
        "compareRunSections": [
            {"uuid": "section-model", "name": MODEL_SECTION, "display": True, "isReordered": True},
            {"uuid": "section-system", "name": SYSTEM_SECTION, "display": True, "isReordered": False},
        ],
        "compareRunCharts": [chart(m) for m in LOG_CHARTS] + [chart(m, deleted=True) for m in HIDDEN_CHARTS],
    }


def envelope(view: dict, now_ms: int) -> str:
    """The tag's value: the UI's saved-view envelope around the state's JSON text."""
    return json.dumps(
        {"name": NAME, "createdAt": now_ms, "updatedAt": now_ms, "state": json.dumps(view, sort_keys=True)}
    )


def install(client: MlflowClient, experiment_id: str, swept: Sequence[str] = ()) -> None:
    """Tag the experiment with the view the printed link opens, unless it already holds this state.
    `swept`: a sweep's swept config keys, whose columns join those the view holds (sweeps of other axes in
    one experiment keep theirs). tracking.store.ensure_experiment runs it so that two processes installing
    at once both succeed, the later keeping the earlier's columns."""
    tags = client.get_experiment(experiment_id).tags
    try:
        held = json.loads(tags.get(TAG, "{}")).get("state")
        kept = [
            c.split("`")[1]
            for c in json.loads(held or "{}").get("selectedColumns", [])
            if c.startswith("params.")
        ]
    except (ValueError, AttributeError, IndexError):
        held, kept = None, []  # someone else's value under our key: replaced
    view = state([*kept, *swept])
    if held != json.dumps(view, sort_keys=True):
        client.set_experiment_tag(experiment_id, TAG, envelope(view, int(time.time() * 1000)))
