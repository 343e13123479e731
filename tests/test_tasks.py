"""Clustering tasks (docs/science.md section 1): sampler, unit-cube map, initial centers, validation set.

Oracles are NumPy/SciPy computations and closed-form distributions; random
tests use fixed seeds, so each assertion is deterministic.
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats
from torch import distributions as D

from models.lloyd import lloyd_step
from tasks.families import FAMILY_RECORDS, Family
from tasks.sampler import (
    TaskSpec,
    choose_center_indices,
    choose_centers,
    sample_points,
    sample_tasks,
    standard_noise,
    to_unit_cube,
    validation_tasks,
)
from tasks.spec import FAMILIES, INITS


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("init", INITS)
def test_shapes_range_and_centers_are_distinct_points(family: str, init: str) -> None:
    spec = TaskSpec(family=family, n=64, d=3, k=5, init=init, equal_weights=False, equal_scales=False)
    X, C0 = sample_tasks(spec, 6, gen(1))
    assert X.shape == (6, 64, 3) and C0.shape == (6, 5, 3)
    assert X.dtype == C0.dtype == torch.float32
    assert X.min() >= 0 and X.max() <= 1
    # The map touches 0 in every dimension and 1 in (at least) one.
    assert torch.all(X.amin(dim=1) == 0)
    assert torch.all(X.amax(dim=(1, 2)) == 1)
    for b in range(6):
        # Each center is a row of X, and the k rows are distinct points.
        hits = (C0[b, :, None, :] == X[b, None, :, :]).all(-1)  # (k, n)
        assert torch.all(hits.any(-1))
        assert len({tuple(c.tolist()) for c in C0[b]}) == 5


@pytest.mark.parametrize("init", INITS)
def test_center_indices_distinct_even_with_duplicate_points(init: str) -> None:
    # Only 3 distinct locations among 12 points: distances to chosen points are
    # often 0, and the k chosen indices must still be distinct.
    X = torch.tensor([[0.0], [1.0], [0.5]]).repeat(4, 1).expand(8, 12, 1).contiguous()
    idx = choose_center_indices(X, 6, init, gen(3))
    assert idx.shape == (8, 6)
    assert all(len(set(row.tolist())) == 6 for row in idx)


def test_same_seed_same_tasks_other_seed_other_tasks() -> None:
    for init in INITS:
        spec = TaskSpec(family="laplace", n=40, d=2, k=4, init=init, equal_weights=False, equal_scales=False)
        a, b, c = (sample_tasks(spec, 3, gen(s)) for s in (11, 11, 12))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[0], c[0])
        assert not torch.equal(a[1], c[1])


def test_unit_cube_map_is_the_spec_formula_and_keeps_lloyd_assignments() -> None:
    spec = TaskSpec(n=300, d=4, k=6, scale=0.3)
    raw, _ = sample_points(spec, 4, gen(5))
    raw = raw.double() * 7.0 - 3.0  # any scale and offset: the map must undo both
    mapped = to_unit_cube(raw)
    # Oracle: the formula of docs/science.md in NumPy, task by task.
    for b in range(4):
        x = raw[b].numpy()
        shifted = x - x.min(axis=0)
        np.testing.assert_allclose(mapped[b].numpy(), shifted / shifted.max(), rtol=0, atol=1e-15)
    # Same initial points (by index), then Lloyd on both: identical assignments at every step.
    idx = choose_center_indices(raw, spec.k, "random", gen(6))
    pick = lambda X: X.gather(1, idx.unsqueeze(-1).expand(-1, -1, X.shape[-1]))  # noqa: E731
    C_raw, C_map = pick(raw), pick(mapped)
    for _ in range(8):
        a_raw = torch.cdist(raw, C_raw).argmin(-1)
        a_map = torch.cdist(mapped, C_map).argmin(-1)
        assert torch.equal(a_raw, a_map)
        C_raw, C_map = lloyd_step(raw, C_raw), lloyd_step(mapped, C_map)
    # The centers themselves map by the same affine map.
    lo = raw.amin(dim=1, keepdim=True)
    top = (raw - lo).amax(dim=(1, 2), keepdim=True)
    torch.testing.assert_close(C_map, (C_raw - lo) / top, rtol=0, atol=1e-12)


def test_unit_cube_keeps_an_all_zero_task_zero_and_constant_dims_at_zero() -> None:
    X = torch.zeros(2, 5, 3)
    assert torch.equal(to_unit_cube(X), X)
    X = torch.tensor([[[2.0, 5.0], [4.0, 5.0], [3.0, 5.0]]])
    torch.testing.assert_close(to_unit_cube(X), torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.5, 0.0]]]))


def test_gonzalez_picks_the_farthest_point_each_time() -> None:
    spec = TaskSpec(family="gumbel", n=50, d=3, k=7, init="gonzalez")
    X, _ = sample_points(spec, 10, gen(8))
    X = to_unit_cube(X).double()
    idx = choose_center_indices(X, spec.k, "gonzalez", gen(9))
    for b in range(10):
        x = X[b].numpy()
        chosen = [int(idx[b, 0])]
        for j in range(1, spec.k):
            # Oracle: distance of every point to its nearest chosen center, by a NumPy loop.
            d2 = np.array([min(((x[i] - x[c]) ** 2).sum() for c in chosen) for i in range(len(x))])
            nxt = int(idx[b, j])
            assert nxt not in chosen
            assert d2[nxt] == pytest.approx(d2.max(), rel=0, abs=1e-12)
            chosen.append(nxt)


def test_kmeans_plus_plus_follows_d2_weights() -> None:
    # One small task (5 points on a line) copied into many batches; the first center
    # is uniform and the second is drawn with probability D(x, first)^2 / sum D^2.
    pts = torch.tensor([0.0, 0.1, 0.3, 0.6, 1.0], dtype=torch.float64)
    X = pts.view(1, 5, 1).expand(20000, 5, 1).contiguous()
    idx = choose_center_indices(X, 2, "kmeans++", gen(2024)).numpy()
    first, second = idx[:, 0], idx[:, 1]
    counts_first = np.bincount(first, minlength=5)
    assert stats.chisquare(counts_first).pvalue > 1e-3
    d2 = (pts.numpy()[:, None] - pts.numpy()[None, :]) ** 2  # d2[f, s]
    observed, expected = [], []
    for f in range(5):
        p = d2[f] / d2[f].sum()
        obs = np.bincount(second[first == f], minlength=5)
        assert obs[f] == 0  # never the first center again (its weight is 0)
        keep = p > 0
        observed.extend(obs[keep])
        expected.extend(p[keep] * counts_first[f])
    # Dof: 5 groups x 4 free cells - 5 fixed group totals.
    chi2 = float(((np.array(observed) - np.array(expected)) ** 2 / np.array(expected)).sum())
    pvalue = stats.chi2.sf(chi2, df=len(observed) - 5)
    assert pvalue > 1e-3, (chi2, pvalue)
    # A uniform second draw would be rejected by the same test: it has power here.
    uniform = np.full(4, counts_first[0] / 4)
    assert stats.chisquare(np.bincount(second[first == 0], minlength=5)[1:], uniform).pvalue < 1e-6


def test_kmeans_plus_plus_takes_torch_multinomials_draws_from_the_same_stream() -> None:
    """The draws no longer read the weights back (tests/test_host_syncs.py) and are still those of
    torch.multinomial(weights, 1), the implementation before: a seed draws the centers it drew then."""
    X, _ = sample_points(TaskSpec(family="laplace", n=40, d=2, k=6), 50, gen(4))
    X = to_unit_cube(X).double()
    got = choose_center_indices(X, 6, "kmeans++", gen(5))
    g = gen(5)  # the loop as it was, with torch.multinomial
    chosen = [torch.randint(40, (50, 1), generator=g)]
    for _ in range(5):
        nearest = torch.stack(
            [((X - X.gather(1, c.expand(-1, 2).unsqueeze(1))) ** 2).sum(-1) for c in chosen]
        )
        weights = nearest.amin(0).scatter(1, torch.cat(chosen, 1), 0.0)
        chosen.append(torch.multinomial(weights, 1, generator=g))
    assert torch.equal(got, torch.cat(chosen, 1))


# Each family's standard noise in scipy.stats, the independent reference: a family added to tasks.families
# without its twin here fails the test below. lognormal's noise is normal (its points are exp'd after).
_SCIPY = {
    "normal": stats.norm,
    "cauchy": stats.cauchy,
    "gumbel": stats.gumbel_r,
    "laplace": stats.laplace,
    "lognormal": stats.norm,
}


@pytest.mark.parametrize("family", FAMILIES)
def test_standard_noise_matches_the_reference_distribution(family: str) -> None:
    assert family in _SCIPY, f"task family {family!r} has no scipy.stats reference in this test"
    z = standard_noise(family, (40000,), gen(17)).double().numpy()
    assert stats.kstest(z, _SCIPY[family].cdf).pvalue > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reference_sampler_draws_each_family_from_its_records_distribution(family: str) -> None:
    """models.reference draws a task from the record's torch distribution (MixtureSameFamily): its raw
    points, one component at scale 0.1, standardised, match scipy's twin of the family's noise (after log,
    for lognormal), as the fast sampler's do."""
    torch.manual_seed(3)
    means, scale = torch.zeros(1, 1), torch.full((1, 1), 0.1)
    points = FAMILY_RECORDS[family].component(D, means, scale).sample((20000,)).double().reshape(-1)
    z = (points.log() if family == "lognormal" else points) / 0.1
    assert stats.kstest(z.numpy(), _SCIPY[family].cdf).pvalue > 1e-3


def test_a_family_missing_a_part_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError) as uniform:
        Family("logistic", "uniform", lambda D, loc, scale: D.Normal(loc, scale))
    assert "task family 'logistic': uniform draws need an inverse_cdf" in str(uniform.value)
    with pytest.raises(ValueError) as draws:
        Family("logistic", "poisson", lambda D, loc, scale: D.Normal(loc, scale))
    assert str(draws.value) == "task family 'logistic': draws='poisson', choose one of normal, uniform"
    with pytest.raises(ValueError, match=r"task.family='logistic' is not allowed: choose one of normal, "):
        TaskSpec(family="logistic")
    assert "\n" not in str(uniform.value) + str(draws.value)


# A family added as a record alone, before the rest of the platform is imported (as an edit of
# tasks/families.py would): validated, sampled by the sampler, drawn by the reference, in the claims' family
# scope and the family-transfer figure's test families.
_ADD_LOGISTIC = """
import math, sys
import tasks.families as families
families.FAMILY_RECORDS["logistic"] = families.Family(
    "logistic", "uniform",
    lambda D, loc, scale: D.TransformedDistribution(
        D.Uniform(loc * 0, loc * 0 + 1),
        [D.transforms.SigmoidTransform().inv, D.transforms.AffineTransform(loc, scale)],
    ),
    lambda u: u.div_(1 - u).log_(),
)
import torch
from scipy import stats
from analysis.claims.records import RECORDS
from analysis.claims.scopes import FAMILY
from config.compose import compose
from models.reference import sample_task
from tasks.sampler import TaskSpec, sample_tasks, standard_noise
compose(["task.family=logistic"])
z = standard_noise("logistic", (40000,), torch.Generator().manual_seed(5)).double().numpy()
assert stats.kstest(z, stats.logistic.cdf).pvalue > 1e-3
X, C0 = sample_tasks(TaskSpec(family="logistic", n=64, d=2, k=3), 4, torch.Generator().manual_seed(1))
assert X.shape == (4, 64, 2) and 0 <= float(X.min()) and float(X.max()) <= 1
X, C0 = sample_task(TaskSpec(family="logistic", n=64, d=2, k=3), torch.Generator().manual_seed(1))
assert X.shape == (64, 2)
assert "logistic" in RECORDS["families_generalise"].scope[1][FAMILY]
print("logistic added")
"""


@pytest.mark.slow  # an interpreter importing torch, MLflow and the claims
def test_a_family_added_as_a_record_alone_is_sampled_referenced_and_in_the_family_scope() -> None:
    done = subprocess.run([sys.executable, "-c", _ADD_LOGISTIC], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "logistic added" in done.stdout, done.stderr[-3000:]


def test_lognormal_is_exp_of_a_normal_with_that_loc_and_scale() -> None:
    # Tiny scale: every point sits near exp(its component mean), then log recovers the
    # normal noise: (log x - mean) / scale must be standard normal.
    spec = TaskSpec(family="lognormal", n=4000, d=1, k=2, scale=0.01)
    X, means = sample_points(spec, 1, gen(5))
    logx = X[0, :, 0].double().log()
    m = means[0, :, 0].double()
    own = m[(logx[:, None] - m[None, :]).abs().argmin(-1)]
    assert (means[0, 0, 0] - means[0, 1, 0]).abs() > 0.2  # components far apart at this seed
    assert stats.kstest(((logx - own) / 0.01).numpy(), stats.norm.cdf).pvalue > 1e-3


def far_share(family: str) -> float:
    """Share of raw points farther than 5 scales from every mixture mean."""
    spec = TaskSpec(family=family, n=500, d=2, k=3, scale=0.1)
    X, means = sample_points(spec, 20, gen(21))
    dist = torch.cdist(X.double(), means.double())
    return (dist.amin(-1) > 0.5).double().mean().item()


def test_cauchy_tails_are_heavy() -> None:
    normal, cauchy = far_share("normal"), far_share("cauchy")
    # Normal: P(||z|| > 5) = exp(-12.5) ~ 4e-6 for d = 2. Cauchy: each coordinate exceeds 5 scales
    # with probability 2 * (0.5 - atan(5) / pi) ~ 0.126, so the share is several percent.
    assert normal <= 1e-3
    assert cauchy > 0.05
    assert cauchy > 50 * max(normal, 1e-4)


def components(spec: TaskSpec, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw points and, with a tiny scale, their component (the nearest mean) exactly."""
    X, means = sample_points(spec, batch, gen(seed))
    comp = torch.cdist(X.double(), means.double()).argmin(-1)
    return X.double() - means.double().gather(1, comp.unsqueeze(-1).expand(-1, -1, spec.d)), comp


def test_unequal_weights_give_unequal_component_sizes() -> None:
    spec = TaskSpec(n=3000, d=6, k=4, scale=1e-4)
    pvalues = {}
    for equal in (True, False):
        _, comp = components(replace(spec, equal_weights=equal), 8, 31)
        counts = torch.stack([torch.bincount(c, minlength=4) for c in comp]).numpy()
        pvalues[equal] = [stats.chisquare(c).pvalue for c in counts]  # against equal sizes
    # Equal weights: multinomial(n, 1/k) sizes, consistent with equal; unequal: U(0,1) weights
    # over 3000 points are far from equal in (nearly) every task.
    assert np.median(pvalues[True]) > 0.05 and min(pvalues[True]) > 1e-4
    assert sum(p < 1e-6 for p in pvalues[False]) >= 7


def test_anisotropic_scales_spread_the_per_dimension_std() -> None:
    spec = TaskSpec(n=3000, d=4, k=3, scale=1e-3)
    ratio = {}
    for equal in (True, False):
        resid, comp = components(replace(spec, equal_scales=equal), 4, 33)
        stds = torch.stack(
            [torch.stack([resid[b][comp[b] == j].std(0) for j in range(3)]) for b in range(4)]
        )  # (B, k, d)
        assert torch.all(stds < 1.1 * spec.scale)  # s * U(0, 1) never exceeds s (up to sampling noise)
        ratio[equal] = stds.amax(dim=(1, 2)) / stds.amin(dim=(1, 2))
        if equal:
            # About 1000 points per component: the sample std is within ~10% of s.
            torch.testing.assert_close(stds, torch.full_like(stds, spec.scale), rtol=0.1, atol=0)
    # With 12 U(0,1) factors per task, max / min is large (median ~ 20).
    assert torch.all(ratio[True] < 1.3) and torch.all(ratio[False] > 2.0)


@pytest.mark.parametrize(("family", "scale"), [("lognormal", 1e3), ("cauchy", 1e38), ("normal", 1e38)])
def test_non_finite_draws_raise(family: str, scale: float) -> None:
    with pytest.raises(FloatingPointError, match=family):
        sample_tasks(TaskSpec(family=family, n=512, d=8, k=3, scale=scale), 2, gen(0))


def test_finite_draws_whose_range_overflows_raise() -> None:
    # |noise| < 1.7 everywhere for this seed and size, so the draws are finite, but
    # their range (max - min) exceeds float32's largest value.
    spec = TaskSpec(family="normal", n=4, d=1, k=2, scale=2e38)
    X, _ = sample_points(spec, 1, gen(1))
    assert torch.isfinite(X).all() and X.max() - X.min() == math.inf
    with pytest.raises(FloatingPointError, match="overflowed"):
        sample_tasks(spec, 1, gen(1))


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("d", 0, ">= 1"),
        ("d", 2.5, "integer"),
        ("k", 1, ">= 2"),
        ("k", True, "integer"),
        ("n", 3, ">= k"),
        ("scale", 0.0, "> 0"),
        ("scale", -0.1, "> 0"),
        ("scale", math.nan, "> 0"),
        ("scale", math.inf, "finite"),
        ("family", "student", "normal, cauchy, gumbel, laplace, lognormal"),
        ("init", "kmeans", "random, kmeans++, gonzalez"),
        ("equal_weights", "yes", "true or false"),
    ],
)
def test_bad_task_fields_name_field_value_and_allowed(field: str, value: object, allowed: str) -> None:
    fields = {"n": 10, "k": 4, field: value}
    with pytest.raises(ValueError) as err:
        TaskSpec(**fields)
    message = str(err.value)
    assert f"task.{field}={value!r}" in message and allowed in message


@pytest.mark.parametrize("batch", [0, -1, 2.0])
def test_bad_batch_names_it(batch: object) -> None:
    with pytest.raises(ValueError, match=rf"batch={batch!r} is not allowed: an integer >= 1"):
        sample_tasks(TaskSpec(n=10, k=3), batch, gen(0))


def test_bad_init_in_choose_centers_names_it() -> None:
    with pytest.raises(
        ValueError, match=r"task.init='farthest' is not allowed: choose one of random, kmeans\+\+, gonzalez"
    ):
        choose_centers(torch.rand(1, 5, 2), 2, "farthest", gen(0))


def test_validation_set_is_derived_from_the_seed_and_differs_from_training() -> None:
    spec = TaskSpec(n=30, d=2, k=3)
    a, b = validation_tasks(spec, 153476998, 3, 4), validation_tasks(spec, 153476998, 3, 4)
    other = validation_tasks(spec, 235510766, 3, 4)
    assert len(a) == 3 and a[0][0].shape == (4, 30, 2)
    for (Xa, Ca), (Xb, Cb) in zip(a, b):
        assert torch.equal(Xa, Xb) and torch.equal(Ca, Cb)
    assert not any(torch.equal(Xa, Xo) for (Xa, _), (Xo, _) in zip(a, other))
    # Training draws from a generator seeded with the seed itself: no validation
    # batch appears among its first batches.
    train = gen(153476998)
    train_batches = [sample_tasks(spec, 4, train)[0] for _ in range(6)]
    assert not any(torch.equal(Xv, Xt) for Xv, _ in a for Xt in train_batches)
    with pytest.raises(ValueError, match="val_batches=0 is not allowed"):
        validation_tasks(spec, 1, 0, 4)
