"""The tags that make a run readable in the MLflow UI, beside the ones the code relies on.

A seed-free `configuration` tag (MLflow's "Group by" puts the seeds of a
configuration together), the run's colour (its embedding's, tracking.view), a
description in words (the run page's Description, tag mlflow.note.content), the
GPU's model (gpu_model: a deterministic run repeats on one model), and
MLflow's own source tags (the runs table's Source and User columns, the run
page's git commit).
"""

from __future__ import annotations

import getpass
import sys

from omegaconf import DictConfig

from config.run import RunSpec
from tracking.names import (
    CONFIGURATION,
    EVALUATION_LINK,
    GPU_MODEL,
    MLFLOW_GIT_COMMIT,
    MLFLOW_RUN_NOTE,
    MLFLOW_SOURCE_NAME,
    MLFLOW_SOURCE_TYPE,
    MLFLOW_USER,
    UI_RUN_COLOR,
)
from tracking.recorder import git_commit
from tracking.view import EMBEDDING_COLORS


def training_tags(run: RunSpec, gpu_model: str | None) -> dict[str, str]:
    """The configuration (seed-free), the run's description, where it comes from and where and how it ran
    (train.device, tracking.uri, cluster.*: every config value that is no param; the GPU's model when it
    trains on one, `gpu_model`, None on a CPU).

    In a sweep the driver, which opens the trials' runs, overrides the source tags with its own.
    """
    return {
        CONFIGURATION: run.configuration,
        MLFLOW_RUN_NOTE: description(run.cfg),
        UI_RUN_COLOR: EMBEDDING_COLORS[run.cfg.model.embedding],
        **source_tags(),
        **run.operational,
        **({GPU_MODEL: gpu_model} if gpu_model else {}),
    }


def description(cfg: DictConfig) -> str:
    """The configuration in words (Markdown, shown on the run page)."""
    t, m, loss, opt, tr = cfg.task, cfg.model, cfg.loss, cfg.optim, cfg.train
    weights = "equal" if t.equal_weights else "unequal"
    scales = "equal (isotropic)" if t.equal_scales else "unequal (anisotropic)"
    return (
        f"One-layer clustering transformer, **{m.embedding}** token embedding (gamma {m.gamma:g}, dropout "
        f"{m.dropout:g}), trained on the **{loss.regularizer}**-regularised min at **tau {loss.tau:g}**: "
        f"{tr.steps} Adam steps at lr {opt.lr:g}, batches of {tr.batch} tasks. Tasks: {t.n} points from "
        f"mixtures of **k={t.k} {t.family}** components in **d={t.d}** (scale {t.scale:g}, {weights} "
        f"weights, {scales} scales), {t.init} initial centers. Seed {cfg.seed}."
    )


def source_tags() -> dict[str, str]:
    """Who ran what, from which code: this process's entry point, user and git commit (a git call: the sweep's
    writer asks once, not once per run it opens)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    entry = spec.name if spec else getattr(main, "__file__", None) or "python"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = "unknown"
    return {
        MLFLOW_SOURCE_NAME: entry,
        MLFLOW_SOURCE_TYPE: "LOCAL",
        MLFLOW_USER: user,
        MLFLOW_GIT_COMMIT: git_commit(),
    }


def evaluation_link(name: str, evaluation_run_id: str) -> tuple[str, str]:
    """The tag (key, value) a training run gets for its evaluation `name` (analysis.checkpoint_eval): the way
    from the run to the evaluation, which links back with its eval_of tag."""
    return EVALUATION_LINK + name, evaluation_run_id
