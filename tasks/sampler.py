"""Batched sampling of clustering tasks (docs/science.md section 1).

A task is n points X (n x d) drawn from a mixture of k components and k
initial centers C0 (k x d) chosen among those points. Everything here is
vectorised over the batch and driven by an explicit torch.Generator, so a
seed fixes the whole stream of tasks.
"""

from __future__ import annotations

import math

import torch

from tasks.init import choose_centers
from tasks.spec import FAMILIES, TaskSpec, is_int


def _open_uniform(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Uniform draws in the open interval (0, 1), so inverse CDFs stay finite."""
    u = torch.rand(shape, generator=generator, device=generator.device)
    tiny = torch.finfo(u.dtype).eps
    return u.clamp_(tiny, 1.0 - tiny)


def standard_noise(family: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Standard (loc 0, scale 1) draws by inverse CDF, matching torch.distributions.

    In-place ops: this runs on B * n * d values every training step.
    """
    if family in ("normal", "lognormal"):
        return torch.randn(shape, generator=generator, device=generator.device)
    u = _open_uniform(shape, generator)
    if family == "cauchy":
        return u.sub_(0.5).mul_(math.pi).tan_()
    if family == "gumbel":
        return u.log_().neg_().log_().neg_()
    if family == "laplace":
        c = u.sub_(0.5)
        sign = c.sign()
        return c.abs_().mul_(-2.0).log1p_().mul_(sign).neg_()
    raise ValueError(f"task.family={family!r} is not allowed: choose one of {', '.join(FAMILIES)}")


def sample_points(
    spec: TaskSpec, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw mixture samples (B, n, d) and the component means (B, k, d), before mapping.

    FloatingPointError if a draw is not finite (which reads the draws' check back to the host).
    """
    X, means = _mixture(spec, batch, generator)
    raise_if_bad(torch.where(_finite(X), OK, NON_FINITE), spec)
    return X, means


def _mixture(spec: TaskSpec, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_points without the check: drawn on the generator's device, where a CUDA generator keeps
    sampling off the host (a training step on a GPU would otherwise wait on it)."""
    if not is_int(batch) or batch < 1:
        raise ValueError(f"batch={batch!r} is not allowed: an integer >= 1")
    B, n, d, k = batch, spec.n, spec.d, spec.k
    device = generator.device
    means = torch.rand((B, k, d), generator=generator, device=device)
    scales = (
        None if spec.equal_scales else spec.scale * torch.rand((B, k, d), generator=generator, device=device)
    )
    weights = (
        torch.ones(B, k, device=device)
        if spec.equal_weights
        else torch.rand((B, k), generator=generator, device=device)
    )
    comp = torch.multinomial(
        weights, n, replacement=True, generator=generator
    )  # (B, n); rows need not sum to 1
    # Row of each point's component in the flattened (B * k, d) parameters:
    # one index_select is much cheaper than a gather with an expanded index.
    rows = (comp + k * torch.arange(B, device=device).unsqueeze(-1)).reshape(-1)
    loc = means.reshape(B * k, d).index_select(0, rows).view(B, n, d)
    noise = standard_noise(spec.family, (B, n, d), generator)
    if scales is None:
        X = loc.add_(noise, alpha=float(spec.scale))
    else:
        X = loc.addcmul_(scales.reshape(B * k, d).index_select(0, rows).view(B, n, d), noise)
    if spec.family == "lognormal":
        X = X.exp_()
    return X, means


# What a draw went through, as a code in a device tensor (draw_tasks): the host reads it when it reads
# anyway (training.fused.Pack.read), not at every draw.
OK, NON_FINITE, OVERFLOW = 0, 1, 2


def _finite(X: torch.Tensor) -> torch.Tensor:
    """Whether every value of X is finite, as a device bool: min and max carry any inf or nan, and cost far
    less than isfinite(X).all()."""
    lo, hi = X.aminmax()
    return torch.isfinite(lo) & torch.isfinite(hi)


def raise_if_bad(code: torch.Tensor | int, spec: TaskSpec) -> None:
    """FloatingPointError naming the family and scale if a draw's code (draw_tasks) is not OK; a tensor
    is read back to the host."""
    code = int(code)
    if code == NON_FINITE:
        raise FloatingPointError(f"the {spec.family} sampler drew non-finite points (scale={spec.scale})")
    if code == OVERFLOW:
        raise FloatingPointError(
            f"the {spec.family} task overflowed float32 when mapped to the unit cube (scale={spec.scale})"
        )


def to_unit_cube(X: torch.Tensor) -> torch.Tensor:
    """Shift by the per-dimension minimum, then divide by one scalar per task.

    One scalar keeps the geometry (and so the k-means problem) unchanged;
    an all-zero task stays zero.
    """
    shifted = X - X.amin(dim=-2, keepdim=True)
    top = shifted.amax(dim=(-2, -1), keepdim=True)
    return shifted.div_(torch.where(top > 0, top, torch.ones_like(top)))


def sample_tasks(spec: TaskSpec, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of tasks: points X (B, n, d) in [0, 1] and initial centers C0 (B, k, d).

    FloatingPointError if the draws are not finite (read back at once; training reads draw_tasks' code
    with its regular read-backs instead).
    """
    X, C0, code = draw_tasks(spec, batch, generator)
    raise_if_bad(code, spec)
    return X, C0


def draw_tasks(
    spec: TaskSpec, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sample_tasks without reading anything back: X, C0 and a 0-d int64 code on the device (OK,
    NON_FINITE, OVERFLOW) for raise_if_bad. Tasks drawn with a code other than OK are not valid tasks."""
    X, _ = _mixture(spec, batch, generator)
    raw_ok = _finite(X)
    X = to_unit_cube(X)
    # Finite draws can still span more than the float32 range (extreme scale).
    code = torch.where(raw_ok, torch.where(_finite(X), OK, OVERFLOW), NON_FINITE)
    return X, choose_centers(X, spec.k, spec.init, generator), code


def validation_tasks(
    spec: TaskSpec, seed: int, batches: int, batch: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fixed validation set of a run: `batches` batches from a seed-derived generator."""
    if not is_int(batches) or batches < 1:
        raise ValueError(f"val_batches={batches!r} is not allowed: an integer >= 1")
    generator = torch.Generator().manual_seed(validation_seed(seed))
    return [sample_tasks(spec, batch, generator) for _ in range(batches)]


def validation_seed(seed: int) -> int:
    """A stream disjoint from training's (which uses `seed` itself)."""
    return (seed * 1_000_003 + 7919) % (2**63 - 1)
