"""The task families (docs/science.md section 1): one record each, in the one table every part reads.

A family's points are a component's mean plus the scale times standard (location 0, scale 1) noise, then
the family's post-transform. Its record says how the sampler draws that noise (torch's normal draws, or
uniform draws mapped through an inverse CDF), the post-transform, and the torch distribution that the
reference sampler (models.reference) draws the same points from. Adding a family is adding a record:
config validation, the sampler, the reference, the figures and the claims' scopes read FAMILY_RECORDS. No
torch at import (config validates a task before any process pays for importing it): a record's functions
work on tensors through their methods, and the reference is given torch.distributions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributions import Distribution

DRAWS = ("normal", "uniform")  # torch's normal_ draws, or U(0, 1) draws through `inverse_cdf`


@dataclass(frozen=True)
class Family:
    """One task family: its standard noise (`draws`, through `inverse_cdf` in place where uniform), the
    post-transform of its points (in place; None: none) and its reference component: `component(D, loc,
    scale)`, given torch.distributions as D, one component's distribution of the transformed points."""

    name: str
    draws: str
    component: Callable[[ModuleType, Tensor, Tensor], Distribution]
    inverse_cdf: Callable[[Tensor], Tensor] | None = None
    post: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        if self.draws not in DRAWS:
            raise ValueError(
                f"task family {self.name!r}: draws={self.draws!r}, choose one of {', '.join(DRAWS)}"
            )
        if (self.draws == "uniform") != (self.inverse_cdf is not None):
            raise ValueError(
                f"task family {self.name!r}: uniform draws need an inverse_cdf (mapping U(0, 1) to its "
                "standard noise), normal draws take none"
            )


def _cauchy(u: Tensor) -> Tensor:
    return u.sub_(0.5).mul_(math.pi).tan_()


def _gumbel(u: Tensor) -> Tensor:
    return u.log_().neg_().log_().neg_()


def _laplace(u: Tensor) -> Tensor:
    c = u.sub_(0.5)
    sign = c.sign()
    return c.abs_().mul_(-2.0).log1p_().mul_(sign).neg_()


def _exp(points: Tensor) -> Tensor:
    return points.exp_()


FAMILY_RECORDS: dict[str, Family] = {
    f.name: f
    for f in (
        Family("normal", "normal", lambda D, loc, scale: D.Normal(loc, scale)),
        Family("cauchy", "uniform", lambda D, loc, scale: D.Cauchy(loc, scale), _cauchy),
        Family("gumbel", "uniform", lambda D, loc, scale: D.Gumbel(loc, scale), _gumbel),
        Family("laplace", "uniform", lambda D, loc, scale: D.Laplace(loc, scale), _laplace),
        Family("lognormal", "normal", lambda D, loc, scale: D.LogNormal(loc, scale), post=_exp),
    )
}


def family(name: str) -> Family:
    """The record of task family `name`; ValueError naming the allowed ones for any other."""
    if name not in FAMILY_RECORDS:
        raise ValueError(f"task.family={name!r} is not allowed: choose one of {', '.join(FAMILY_RECORDS)}")
    return FAMILY_RECORDS[name]
