"""Distributions of clustering tasks (docs/science.md section 1)."""

from tasks.init import INITS, choose_centers
from tasks.sampler import FAMILIES, TaskSpec, sample_tasks, to_unit_cube, validation_tasks

__all__ = [
    "FAMILIES",
    "INITS",
    "TaskSpec",
    "choose_centers",
    "sample_tasks",
    "to_unit_cube",
    "validation_tasks",
]
