"""Batched sampling of clustering tasks (docs/science.md section 1): every draw a task is made of.

A task is n points X (n x d) drawn from a mixture of k components and k initial centers C0 (k x d) chosen
among those points. Everything here is vectorised over the batch and driven by an explicit
torch.Generator, so a seed fixes the whole stream of tasks.

Several models draw at once (draw_each), each from its own generator, call by call with the shapes it uses
alone, so its tasks never depend on the models drawn beside it (packed equals solo, and a run drawn again
draws what it drew). Each draw lands in the model's rows of one tensor of all models' tasks (fill_each:
model i's rows after model i - 1's), so what is computed from the draws (the families' noise, the mixture,
the unit-cube map, the initial centers) runs once over every model's tasks, not once per model.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from tasks.families import family as family_record
from tasks.spec import INITS, TaskSpec, is_int


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


def _uniform(rows: torch.Tensor, generator: torch.Generator) -> None:
    """U(0, 1) draws into rows: what torch.rand draws into a fresh tensor."""
    rows.uniform_(generator=generator)


def standard_noise(family: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Standard (loc 0, scale 1) draws of a family (tasks.families), matching torch.distributions."""
    return _standard_noise(family, shape, [generator])


def _standard_noise(
    family: str, shape: tuple[int, ...], generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """standard_noise of each generator, stacked along dim 0 (fill_each).

    In-place ops: this runs on P * B * n * d values every chunk of training steps.
    """
    record = family_record(family)
    out = torch.empty((len(generators) * shape[0], *shape[1:]), device=generators[0].device)
    if record.inverse_cdf is None:  # normal draws
        return fill_each(out, generators, lambda rows, g: rows.normal_(generator=g))  # torch.randn's draws
    # Uniform draws in the open interval (0, 1), so inverse CDFs stay finite.
    tiny = torch.finfo(out.dtype).eps
    return record.inverse_cdf(fill_each(out, generators, _uniform).clamp_(tiny, 1.0 - tiny))


def sample_points(
    spec: TaskSpec, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw mixture samples (B, n, d) and the component means (B, k, d), before mapping.

    FloatingPointError if a draw is not finite (which reads the draws' check back to the host).
    """
    X, means = _mixture(spec, batch, [generator])
    raise_if_bad(torch.where(_finite(X, 1), OK, NON_FINITE), spec)
    return X, means


def _mixture(
    spec: TaskSpec, batch: int, generators: Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_points of each generator without the check, stacked along dim 0 (fill_each): drawn on
    the generators' device, where a CUDA generator keeps sampling off the host (a training step on a GPU
    would otherwise wait on it)."""
    if not is_int(batch) or batch < 1:
        raise ValueError(f"batch={batch!r} is not allowed: an integer >= 1")
    B, n, d, k = batch, spec.n, spec.d, spec.k
    R, device = len(generators) * B, generators[0].device  # R tasks in all
    means = fill_each(torch.empty((R, k, d), device=device), generators, _uniform)
    scales = None
    if not spec.equal_scales:
        scales = spec.scale * fill_each(torch.empty((R, k, d), device=device), generators, _uniform)
    ones = torch.ones(B, k, device=device) if spec.equal_weights else None

    def components(rows: torch.Tensor, g: torch.Generator) -> None:  # (B, n); weights need not sum to 1
        weights = torch.rand((B, k), generator=g, device=device) if ones is None else ones
        torch.multinomial(weights, n, replacement=True, generator=g, out=rows)

    comp = fill_each(torch.empty((R, n), dtype=torch.int64, device=device), generators, components)
    # Row of each point's component in the flattened (R * k, d) parameters:
    # one index_select is much cheaper than a gather with an expanded index.
    rows = (comp + k * torch.arange(R, device=device).unsqueeze(-1)).reshape(-1)
    loc = means.reshape(R * k, d).index_select(0, rows).view(R, n, d)
    noise = _standard_noise(spec.family, (B, n, d), generators)
    if scales is None:
        X = loc.add_(noise, alpha=float(spec.scale))
    else:
        X = loc.addcmul_(scales.reshape(R * k, d).index_select(0, rows).view(R, n, d), noise)
    post = family_record(spec.family).post
    return (post(X) if post else X), means


# What a draw went through, as a code in a device tensor (draw_tasks): the host reads it when it reads
# anyway (training.fused.Pack.read), not at every draw.
OK, NON_FINITE, OVERFLOW = 0, 1, 2


def _finite(X: torch.Tensor, models: int) -> torch.Tensor:
    """Whether every value of each model's tasks (X's rows, stacked model by model) is finite, as a device
    bool (models,): min and max carry any inf or nan, and cost far less than isfinite(X).all() (amin and
    amax: aminmax along a dimension took 16 times as long on CPU)."""
    rows = X.reshape(models, -1)
    return torch.isfinite(rows.amin(dim=1)) & torch.isfinite(rows.amax(dim=1))


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


def _gather_points(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """X (B, n, d), idx (B, m) -> (B, m, d)."""
    return X.gather(1, idx.unsqueeze(-1).expand(-1, -1, X.shape[-1]))


def _sq_dist_to(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Squared distances (B, n) of every point to the point idx (B, 1) of its task.

    From differences, not the dot-product expansion: a chosen point is at
    distance exactly 0 from itself, and gonzalez compares distances exactly.
    """
    return (X - _gather_points(X, idx)).square_().sum(-1)


def _draw_one(weights: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One index (B, 1) per row with probability proportional to its weight: torch.multinomial(weights, 1)'s
    own method (the largest weight / Exp(1) draw), so the same draws from the same stream, without its
    checks of the weights, which read them back to the host (a wait per center on a GPU). Non-finite
    weights (of a non-finite task, whose code draw_tasks reports with the step's read-backs) still give
    an index in range."""
    race = fill_each(torch.empty_like(weights), generators, lambda rows, g: rows.exponential_(generator=g))
    return torch.div(weights, race, out=race).argmax(dim=-1, keepdim=True)


def center_indices_each(
    X: torch.Tensor, k: int, init: str, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """Indices (P * B, k) of the initial centers among the n points of each task of X (P * B, n, d): the
    B tasks of model i, rows i * B on, from generators[i] (on the device of every generator).

    k distinct points, chosen three ways: `random` picks them uniformly; `kmeans++` (D^2 sampling) and
    `gonzalez` (farthest-first) start from one uniformly chosen point. The loop runs over the k centers
    only, never over tasks, points or models.
    """
    R, n, _ = X.shape
    device = generators[0].device
    if init == "random":
        keys = fill_each(torch.empty((R, n), device=device), generators, _uniform)
        return keys.argsort(dim=-1)[:, :k].to(X.device)
    if init not in INITS:
        raise ValueError(f"task.init={init!r} is not allowed: choose one of {', '.join(INITS)}")
    first = torch.empty((R, 1), dtype=torch.int64, device=device)
    first = fill_each(first, generators, lambda rows, g: rows.random_(0, n, generator=g)).to(X.device)
    chosen = [first]
    taken = torch.zeros((R, n), dtype=torch.bool, device=X.device).scatter_(1, first, True)
    nearest = _sq_dist_to(X, first)  # to the nearest chosen center so far
    for _ in range(1, k):
        if init == "gonzalez":
            nxt = nearest.masked_fill(taken, -1.0).argmax(dim=-1, keepdim=True)
        else:  # kmeans++: D^2 weights; uniform over untaken points if all are zero (duplicates)
            weights = nearest.masked_fill(taken, 0.0)
            degenerate = weights.sum(-1, keepdim=True) <= 0
            weights = torch.where(degenerate, (~taken).to(weights.dtype), weights)
            # On the generators' device (the task streams'); double keeps tiny weights.
            nxt = _draw_one(weights.to(device, torch.float64), generators).to(X.device)
        chosen.append(nxt)
        taken.scatter_(1, nxt, True)
        nearest = torch.minimum(nearest, _sq_dist_to(X, nxt))
    return torch.cat(chosen, dim=1)


def choose_center_indices(X: torch.Tensor, k: int, init: str, generator: torch.Generator) -> torch.Tensor:
    """Indices (B, k) of the initial centers among the n points of each task."""
    return center_indices_each(X, k, init, [generator])


def choose_centers_each(
    X: torch.Tensor, k: int, init: str, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """Initial centers (P * B, k, d): k distinct data points of each task, as center_indices_each."""
    return _gather_points(X, center_indices_each(X, k, init, generators))


def choose_centers(X: torch.Tensor, k: int, init: str, generator: torch.Generator) -> torch.Tensor:
    """Initial centers (B, k, d): k distinct data points of each task."""
    return choose_centers_each(X, k, init, [generator])


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
    X, C0, codes = _draw(spec, batch, [generator])
    return X[0], C0[0], codes[0]


def draw_each(
    specs: Sequence[TaskSpec],
    steps: int,
    batch: int,
    generators: Sequence[torch.Generator],
    max_values: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`steps` batches of tasks of every model i (specs of one n, d and k; a generator each), by step:
    X (steps, P, batch, n, d), C0 (steps, P, batch, k, d) and codes (P,), model i's being
    draw_tasks(specs[i], steps * batch, generators[i])'s.

    The work on the draws runs once for all models of a spec (fill_each) rather than once per model;
    with max_values, once per as many of them as hold at most max_values task coordinates (at least one).
    """
    groups: dict[TaskSpec, list[int]] = {}
    for model, spec in enumerate(specs):
        groups.setdefault(spec, []).append(model)
    P, tasks = len(specs), steps * batch
    size = P if max_values is None else max(1, max_values // (tasks * specs[0].n * specs[0].d))
    # X, C0 and codes by step, made once the first models are drawn (not beside _draw's peak memory).
    out: tuple[torch.Tensor, ...] = ()
    for spec, models in groups.items():
        for start in range(0, len(models), size):
            some = models[start : start + size]
            X, C0, codes = _draw(spec, tasks, [generators[m] for m in some])
            # By step: (models, steps * batch, ...) -> (steps, models, batch, ...).
            X, C0 = (x.view(len(some), steps, batch, *x.shape[2:]).transpose(0, 1) for x in (X, C0))
            if not out:
                out = (
                    X.new_empty((steps, P, *X.shape[2:])),
                    C0.new_empty((steps, P, *C0.shape[2:])),
                    codes.new_empty(P),
                )
            for a, b in _runs(some):  # into the pack's order, a slice per run of consecutive models
                at = slice(some[a], some[a] + b - a)
                out[0][:, at] = X[:, a:b]
                out[1][:, at] = C0[:, a:b]
                out[2][at] = codes[a:b]
    return out


def _runs(models: list[int]) -> list[tuple[int, int]]:
    """The runs of consecutive models, as (start, stop) positions in models: [3, 4, 7] -> [(0, 2), (2, 3)]."""
    starts = [i for i in range(len(models)) if i == 0 or models[i] != models[i - 1] + 1]
    return list(zip(starts, [*starts[1:], len(models)]))


def _draw(
    spec: TaskSpec, batch: int, generators: Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each model's draw_tasks(spec, batch, its generator), stacked: X (P, B, n, d), C0 (P, B, k, d),
    codes (P,)."""
    P = len(generators)
    X, _ = _mixture(spec, batch, generators)
    raw_ok = _finite(X, P)
    X = to_unit_cube(X)
    # Finite draws can still span more than the float32 range (extreme scale).
    codes = torch.where(raw_ok, torch.where(_finite(X, P), OK, OVERFLOW), NON_FINITE)
    C0 = choose_centers_each(X, spec.k, spec.init, generators)
    return X.view(P, batch, *X.shape[1:]), C0.view(P, batch, *C0.shape[1:]), codes


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
