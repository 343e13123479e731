"""Every figure of SPEC 7 by name, in the order the report shows them."""

from __future__ import annotations

from functools import partial
from typing import Callable

from analysis import curves, probes
from analysis.context import Context
from analysis.plot import Figure

FIGURES: dict[str, Callable[[Context], Figure]] = {
    "speed_memory": curves.speed_memory,
    "convergence": curves.convergence,
    "loss_surface": probes.loss_surface,
    "multistep": probes.multistep,
    "mixture_shift": probes.mixture_shift,
    "length": probes.length,
    "family_transfer": probes.family_transfer,
    "task_dissimilarity": probes.task_dissimilarity,
    "ablation_lr": partial(curves.ablation, subgrid="lr"),
    "ablation_lr_curves": curves.lr_curves,
    "ablation_points": partial(curves.ablation, subgrid="points"),
    "ablation_dim": partial(curves.ablation, subgrid="dim"),
    "ablation_clusters": partial(curves.ablation, subgrid="clusters"),
    "ablation_family": partial(curves.ablation, subgrid="family"),
    "time_to_quality": curves.time_to_quality,
}
