"""Several models' random draws, each from its own stream, into one batch (docs/science.md section 1).

A model draws its tasks' random numbers from its own torch.Generator, call by call with the shapes it
uses alone, so its tasks never depend on the models drawn beside it (packed equals solo, and a run drawn
again draws what it drew). Each draw lands in the model's rows of one tensor of all models' tasks
(model i's rows after model i - 1's), so what is computed from the draws (the families' noise, the
mixture, the unit-cube map, the initial centers) runs once over every model's tasks, not once per model.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def fill_each(
    out: torch.Tensor,
    generators: Sequence[torch.Generator],
    fill: Callable[[torch.Tensor, torch.Generator], object],
) -> torch.Tensor:
    """out, with fill(rows, g) run on each model's rows of out and its generator g, in the models' order.

    The rows of a model are a contiguous block of out, as a fresh tensor of their shape is: fill draws
    what torch.rand and its kin (which fill a fresh tensor in place the same way) would have drawn.
    """
    for rows, generator in zip(out.split(out.shape[0] // len(generators)), generators, strict=True):
        fill(rows, generator)
    return out
