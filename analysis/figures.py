"""Every figure of SPEC 7 by name, in the order the report shows them."""

from __future__ import annotations

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
    "ablations": curves.ablations,
    "time_to_quality": curves.time_to_quality,
}
