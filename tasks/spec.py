"""What a distribution of clustering tasks is (docs/science.md section 1): its fields and their checks.

Without torch, so that configuration (config.validate) checks a task before any
process pays for importing it; tasks.sampler draws the tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tasks.families import FAMILY_RECORDS

INITS = ("random", "kmeans++", "gonzalez")  # how tasks.sampler chooses the k initial centers
FAMILIES = tuple(FAMILY_RECORDS)  # the task families, one record each (tasks.families)


@dataclass(frozen=True)
class TaskSpec:
    """What a distribution of clustering tasks is; defaults are the paper's."""

    family: str = "normal"
    n: int = 512
    d: int = 4
    k: int = 6
    scale: float = 0.1
    equal_weights: bool = True
    equal_scales: bool = True
    init: str = "random"

    def __post_init__(self) -> None:
        validate_task_spec(self)


def _bad(field: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"task.{field}={value!r} is not allowed: {allowed}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_task_spec(spec: TaskSpec) -> None:
    """Raise ValueError naming the field, its value and what is allowed."""
    if spec.family not in FAMILIES:
        raise _bad("family", spec.family, f"choose one of {', '.join(FAMILIES)}")
    if spec.init not in INITS:
        raise _bad("init", spec.init, f"choose one of {', '.join(INITS)}")
    if not is_int(spec.d) or spec.d < 1:
        raise _bad("d", spec.d, "an integer >= 1")
    if not is_int(spec.k) or spec.k < 2:
        raise _bad("k", spec.k, "an integer >= 2")
    if not is_int(spec.n) or spec.n < spec.k:
        raise _bad("n", spec.n, f"an integer >= k (k={spec.k})")
    if (
        isinstance(spec.scale, bool)
        or not isinstance(spec.scale, (int, float))
        or not (math.isfinite(spec.scale) and spec.scale > 0)
    ):
        raise _bad("scale", spec.scale, "a finite number > 0")
    for field in ("equal_weights", "equal_scales"):
        if not isinstance(getattr(spec, field), bool):
            raise _bad(field, getattr(spec, field), "true or false")
