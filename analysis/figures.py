"""Every figure of docs/science.md section 7 by name, in the order the report shows them: convergence, the
headline's curves, first."""

from __future__ import annotations

from functools import partial
from typing import Callable

from analysis import eval_figures, training_figures
from analysis.context import Context, Want
from analysis.plot import Figure

FIGURES: dict[str, Callable[[Context], Figure]] = {
    "convergence": training_figures.convergence,
    "loss_surface": eval_figures.loss_surface,
    "multistep": eval_figures.multistep,
    "mixture_shift": eval_figures.mixture_shift,
    "length": eval_figures.length,
    "family_transfer": eval_figures.family_transfer,
    "task_dissimilarity": eval_figures.task_dissimilarity,
    "ablation_lr": partial(training_figures.ablation, subgrid="lr"),
    "ablation_lr_curves": training_figures.lr_curves,
    "ablation_points": partial(training_figures.ablation, subgrid="points"),
    "ablation_dim": partial(training_figures.ablation, subgrid="dim"),
    "ablation_clusters": partial(training_figures.ablation, subgrid="clusters"),
    "ablation_family": partial(training_figures.ablation, subgrid="family"),
    "time_to_quality": training_figures.time_to_quality,
    "speed_memory": training_figures.speed_memory,
}


def reads(names: list[str], ctx: Context) -> list[Want]:
    """The evaluations the figures `names` draw, to read before drawing them."""
    return [want for name in names for want in eval_figures.reads(name, ctx)]
