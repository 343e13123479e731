"""Several models' tasks drawn as one batch (tasks.sampler: fill_each, draw_each; issue 42).

A pack draws each model's tasks from that model's own generator, so its numbers must be, bit for bit,
those the model draws alone (packed equals solo; a run drawn again draws what it recorded); what is
computed from the draws runs once for the pack, so its operator calls must not grow with the pack beyond
each model's own random draws.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tasks.sampler import OK, TaskSpec, draw_each, draw_tasks
from tasks.spec import FAMILIES, INITS

# Odd sizes: every model's rows start and end off the vector width, where a kernel's tail would show.
BASE = TaskSpec(n=37, d=3, k=5, scale=0.3)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits, so that NaNs (of a draw that overflowed) compare too."""
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_each_is_solo(
    specs: list[TaskSpec], seeds: list[int], max_values: int | None = None, draws: int = 2
) -> None:
    """Consecutive draw_each calls (3 steps of 2 tasks) equal each model's consecutive draw_tasks calls (of
    6 tasks) on its own stream."""
    packed, solo = [gen(s) for s in seeds], [gen(s) for s in seeds]
    for _ in range(draws):
        X, C0, codes = draw_each(specs, 3, 2, packed, max_values)
        assert X.shape == (3, len(specs), 2, BASE.n, BASE.d) and C0.shape == (
            3,
            len(specs),
            2,
            BASE.k,
            BASE.d,
        )
        for i, (spec, generator) in enumerate(zip(specs, solo)):
            X1, C1, code = draw_tasks(spec, 6, generator)
            assert torch.equal(bits(X[:, i].flatten(0, 1)), bits(X1))
            assert torch.equal(bits(C0[:, i].flatten(0, 1)), bits(C1))
            assert torch.equal(codes[i], code)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("init", INITS)
def test_a_pack_draws_each_models_solo_tasks_bit_for_bit(family: str, init: str) -> None:
    for equal in (True, False):
        spec = replace(BASE, family=family, init=init, equal_weights=equal, equal_scales=not equal)
        assert_each_is_solo([spec] * 4, [11, 12, 13, 14])


MIXED = [
    replace(BASE, init="kmeans++"),
    replace(BASE, family="cauchy", init="gonzalez"),
    replace(BASE, init="kmeans++"),
    replace(BASE, scale=2e38),
    replace(BASE, equal_weights=False, init="kmeans++"),
    replace(BASE, init="kmeans++"),
    replace(BASE, init="kmeans++"),
]


def test_a_pack_of_mixed_task_distributions_draws_each_models_solo_tasks() -> None:
    """Models of one shape whose family, init, scale or weights differ: drawn by spec, put in the pack's
    order, including a model whose draws overflow (its code says so, not its neighbours')."""
    assert_each_is_solo(MIXED, [5, 6, 7, 8, 9, 10, 11])
    codes = draw_each(MIXED, 3, 2, [gen(s) for s in range(7)])[2].tolist()
    assert [code == OK for code in codes] == [True, True, True, False, True, True, True]


@pytest.mark.parametrize("models_at_once", [1, 2, 3])
def test_a_pack_drawn_a_few_models_at_a_time_draws_the_same_tasks(models_at_once: int) -> None:
    """max_values (a CPU's cache): the kmeans++ models of MIXED, 4 of them, in batches of 1, 2 or 3."""
    assert_each_is_solo(MIXED, [5, 6, 7, 8, 9, 10, 11], max_values=models_at_once * 6 * BASE.n * BASE.d)


class Calls(TorchDispatchMode):
    """ATen operator calls, split into draws (a call given a generator) and the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: Counter[str] = Counter()
        self.rest: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        drawing = any(isinstance(a, torch.Generator) for a in (*args, *kwargs.values()))
        (self.draws if drawing else self.rest)[str(func)] += 1
        return func(*args, **kwargs)


def calls_of_a_draw(spec: TaskSpec, models: int) -> Calls:
    generators = [gen(s) for s in range(models)]
    with Calls() as calls:
        draw_each([spec] * models, 2, 2, generators)
    return calls


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("family", ["normal", "laplace"])
def test_a_pack_draws_operator_calls_grow_only_by_each_models_random_draws(family: str, init: str) -> None:
    spec = replace(BASE, family=family, init=init, equal_weights=False, equal_scales=False)
    one, ten = calls_of_a_draw(spec, 1), calls_of_a_draw(spec, 10)
    assert ten.rest == one.rest  # the noise, mixture, unit-cube map, checks and center choice: once
    assert ten.draws == Counter({op: 10 * count for op, count in one.draws.items()})
    # Power: the draws are seen (kmeans++ draws one Exp(1) race per further center).
    assert one.draws["aten.exponential_.default"] == (spec.k - 1 if init == "kmeans++" else 0)
    assert sum(one.rest.values()) > 10
