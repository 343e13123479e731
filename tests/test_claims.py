"""The 14 claims of docs/science.md section 7.1 judged on synthetic frames: no store, no training, no
evaluation.

Runs frames are built from the paper grid (claims.paper_grid), one run per
configuration and seed, with final values chosen so that a claim holds; then
broken at one configuration (FAIL), thinned out (UNTESTED), or padded with
runs outside the claim's scope that would flip it if they were counted.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis import claims
from analysis.claims import EMB, FAIL, FAMILY, LR, PASS, REG, TAU, UNTESTED, D, K
from analysis.context import eval_curves
from analysis.plot import CURVE_COLUMNS
from analysis.style import LLOYD
from tasks.sampler import FAMILIES
from tracking.names import DIVERGED, FINISHED, SEED, SUBGRIDS, TRAIN_LOSS, VAL_KMEANS, VAL_REL_LLOYD

GRID = claims.paper_grid()
T = 20


def runs_of(grid: pd.DataFrame, value, seeds=(1, 2), outcome: str = FINISHED, start: int = 0) -> pd.DataFrame:
    """A run per configuration of `grid` and seed; every final metric = value(configuration)."""
    rows = []
    for _, c in grid.iterrows():
        for seed in seeds:
            v = value(c)
            rows.append(
                {
                    "run_id": f"r{start + len(rows)}",
                    "run_name": "synthetic",
                    "status": "FINISHED",
                    "outcome": outcome,
                    SEED: seed,
                    SUBGRIDS: c[SUBGRIDS],
                    **{k: c[k] for k in claims.AXES},
                    "task.n": 512,
                    TRAIN_LOSS: v,
                    VAL_REL_LLOYD: v,
                    VAL_KMEANS: v,
                }
            )
    return pd.DataFrame(rows)


def matching(grid: pd.DataFrame, where: dict) -> pd.DataFrame:
    return grid[np.logical_and.reduce([grid[k] == v for k, v in where.items()])]


# claim -> (final value making it hold, one in-scope configuration, the value there that breaks it,
#           a change of slice that puts that configuration out of scope, or None when the claim takes a whole
# sub-grid)
RUN_CASES = {
    "tau01_beats_lloyd": (
        lambda c: 0.9 if c[EMB] != "none" else 1.1,
        {TAU: 0.1, EMB: "binary", REG: "ne", D: 32},
        1.05,
        {TAU: 0.5},
    ),
    "l2_lower_train_loss": (
        lambda c: 1.0 if c[REG] == "l2" else 2.0,
        {TAU: 0.25, EMB: "onehot", REG: "l2", D: 4},
        3.0,
        None,
    ),
    "l2_better_val_tau1_d4": (
        lambda c: 0.9 if c[REG] == "l2" else 1.1,
        {TAU: 1.0, D: 4, EMB: "binary", REG: "l2"},
        1.2,
        {D: 32},
    ),
    "families_generalise": (
        lambda c: 0.9,
        {TAU: 0.1, EMB: "onehot", REG: "ne", FAMILY: "gumbel"},
        1.1,
        {FAMILY: "cauchy"},
    ),
    "ne_fails_gumbel_laplace_tau1": (
        lambda c: 0.95 if c[REG] == "l2" else 1.1,
        {TAU: 1.0, FAMILY: "laplace", REG: "ne", EMB: "binary"},
        0.9,
        {TAU: 0.1},
    ),
    "clusters_d4_tau1": (
        lambda c: (1.05 if c[REG] == "l2" else 1.5) + (0.01 if c[EMB] == "binary" else 0.001) * c[K],
        {D: 4, TAU: 1.0, REG: "l2", EMB: "none", K: 10},
        0.9,
        {D: 32},
    ),
    "large_lr_worse": (lambda c: 1.0 + c[LR], {LR: 1.0, D: 4, REG: "ne", EMB: "binary", TAU: 0.1}, 0.5, None),
}


def holding(name: str, **kw) -> pd.DataFrame:
    return runs_of(GRID, RUN_CASES[name][0], **kw)


def broken(name: str, **kw) -> pd.DataFrame:
    good, where, bad, _ = RUN_CASES[name]
    return runs_of(GRID, lambda c: bad if all(c[k] == v for k, v in where.items()) else good(c), **kw)


def poison(name: str, how: str) -> pd.DataFrame:
    """Three more seeds of the breaking value, outside the scope: tagged with another sub-grid, or in another
    slice."""
    _, where, bad, outside = RUN_CASES[name]
    configs = matching(claims.scope(GRID, *claims.SCOPES[name]), where).copy()
    assert len(configs) == 1
    if how == "tag":
        configs[SUBGRIDS] = "elsewhere"
    else:
        for key, value in outside.items():
            configs[key] = value
    return runs_of(configs, lambda c: bad, seeds=(3, 4, 5), start=10_000)


@pytest.mark.parametrize("name", RUN_CASES)
def test_run_claims_pass_fail_untested(name: str) -> None:
    passed = claims.judge_runs(name, holding(name), GRID)
    assert passed.status == PASS, passed.numbers
    assert (
        passed.paper == claims.PAPER[name]
        and "of " in passed.numbers
        and "in the paper grid" in passed.numbers
    )
    failed = claims.judge_runs(name, broken(name), GRID)
    assert failed.status == FAIL and "fails:" in failed.numbers, failed.numbers
    one_seed = claims.judge_runs(name, holding(name, seeds=(1,)), GRID)
    assert (
        one_seed.status == UNTESTED
        and "with fewer left out" in one_seed.numbers
        and "no case" in one_seed.numbers
    )
    unfinished = claims.judge_runs(name, holding(name, outcome="other"), GRID)
    assert unfinished.status == UNTESTED and "unfinished" in unfinished.numbers
    empty = holding(name).assign(**{SUBGRIDS: "demo"})
    assert claims.judge_runs(name, empty, GRID).status == UNTESTED


@pytest.mark.parametrize(
    "name,how",
    [
        (n, how)
        for n, case in RUN_CASES.items()
        for how in ("tag", "slice")
        if how == "tag" or case[3] is not None
    ],
)
def test_runs_outside_the_scope_never_change_a_verdict(name: str, how: str) -> None:
    extra = poison(name, how)
    counted = claims.judge_runs(
        name, pd.concat([holding(name), extra.assign(**{SUBGRIDS: claims.SCOPES[name][0]})])
    )
    if how == "tag":
        assert counted.status == FAIL  # the extra runs would flip the verdict if they were counted ...
    claim = claims.judge_runs(name, pd.concat([holding(name), extra]), GRID)
    assert claim.status == PASS, claim.numbers  # ... but they are outside the scope


def test_slice_poison_would_flip_an_unscoped_judgment() -> None:
    """The slice changes above matter: tau01 counting every tau of the `tau` sub-grid would FAIL."""
    runs = pd.concat([holding("tau01_beats_lloyd"), poison("tau01_beats_lloyd", "slice")])
    table = claims.per_configuration(claims.tagged(runs, "tau"), VAL_REL_LLOYD)
    _, judge = claims.RUN_CLAIMS["tau01_beats_lloyd"]
    assert claims.verdict(judge(table)) == FAIL
    assert claims.judge_runs("tau01_beats_lloyd", runs, GRID).status == PASS


def test_never_pass_on_zero_cases() -> None:
    """tau01 with OH/BN configurations all below 1 but no NA configuration: UNTESTED, saying what is
    missing."""
    runs = holding("tau01_beats_lloyd")
    claim = claims.judge_runs("tau01_beats_lloyd", runs[runs[EMB] != "none"], GRID)
    assert claim.status == UNTESTED
    assert "NA val_rel_lloyd >= 1: untested, no case of 4 in the paper grid" in claim.numbers
    assert claims.verdict([]) == UNTESTED


def test_partial_coverage_is_judged_and_reported() -> None:
    runs = holding("tau01_beats_lloyd")
    runs = runs[runs[D] == 4]
    claim = claims.judge_runs("tau01_beats_lloyd", runs, GRID)
    assert claim.status == PASS
    assert "6/12 configurations" in claim.numbers and "4/4 cases of 8 in the paper grid" in claim.numbers


def test_diverged_and_unfinished_runs_are_counted_and_diverged_ones_beat_nothing() -> None:
    runs = holding("tau01_beats_lloyd", seeds=(1, 2, 3))
    scoped = (runs[TAU] == 0.1) & (runs[EMB] == "onehot") & (runs[REG] == "l2") & (runs[D] == 4)
    runs.loc[scoped & (runs[SEED] == 3), "outcome"] = DIVERGED
    runs.loc[(runs[TAU] == 0.1) & (runs[EMB] == "none") & (runs[SEED] == 3), "outcome"] = "other"
    claim = claims.judge_runs("tau01_beats_lloyd", runs, GRID)
    assert claim.status == PASS  # one diverged seed of three: the median still beats Lloyd
    assert "diverged 1, unfinished 4 of 36 runs" in claim.numbers
    runs.loc[scoped, "outcome"] = DIVERGED
    claim = claims.judge_runs("tau01_beats_lloyd", runs, GRID)
    assert claim.status == FAIL and "L2-OH-d=4 diverged" in claim.numbers and "diverged 3" in claim.numbers


# ---- probe claims: curves as eval_curves returns them ----


def curves_of(series: dict[tuple[str, str], tuple[float, float]], n_seeds: int = 2) -> pd.DataFrame:
    """(panel, series) -> (median at t=1, median at T); t=0 as t=1."""
    rows = [
        {"panel": p, "series": s, "x": x, "median": v, "q25": v, "q75": v, "n_seeds": n_seeds, "diverged": ""}
        for (p, s), (first, last) in series.items()
        for x, v in ((0, first), (1, first), (T, last))
    ]
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def with_lloyd(panels: list[str], models: dict[str, tuple[float, float]], lloyd=(1.0, 0.8)) -> dict:
    return {(p, s): v for p in panels for s, v in {**models, LLOYD: lloyd}.items()}


INITS = ["init=random", "init=gonzalez"]
SHIFTS = [f"shift={s}" for s in ("train", "unequal_weights", "anisotropic", "scale_0.05", "scale_0.2")]
LENGTHS = [f"n={n}" for n in (128, 256, 1024, 2048)]
# claim -> (holding curves, failing curves, curves it cannot judge)
PROBE_CASES = {
    "reembed_beats_lloyd": (
        with_lloyd(INITS, {"L2-OH reembed": (1.0, 0.5), "L2-OH naive": (1.0, 2.0)}),
        with_lloyd(INITS, {"L2-OH reembed": (1.0, 0.9), "L2-OH naive": (1.0, 2.0)}),
        with_lloyd(INITS, {"L2-OH naive": (1.0, 2.0)}),
    ),  # no re-embedded series
    "noembed_reembed_trails_lloyd": (
        with_lloyd(INITS, {"L2": (1.2, 1.0)}),
        with_lloyd(INITS, {"L2": (1.2, 0.7)}),
        with_lloyd([], {}),
    ),
    "length_generalises": (
        with_lloyd(LENGTHS, {"L2-OH": (1.0, 0.5), "L2-BN": (1.0, 0.6)}),
        {**with_lloyd(LENGTHS, {"L2-OH": (1.0, 0.5)}), ("n=2048", "L2-OH"): (1.0, 0.85)},
        with_lloyd([], {}),
    ),
    "shift_generalises": (
        with_lloyd(SHIFTS, {"L2-OH": (1.0, 0.5)}),
        {**with_lloyd(SHIFTS, {"L2-OH": (1.0, 0.5)}), ("shift=scale_0.2", "L2-OH"): (1.0, 0.81)},
        with_lloyd(SHIFTS[:-1], {"L2-OH": (1.0, 0.5)}),
    ),  # scale 0.2 never evaluated
}


@pytest.mark.parametrize("name", PROBE_CASES)
def test_probe_claims_pass_fail_untested(name: str) -> None:
    good, bad, partial = PROBE_CASES[name]
    runs = holding("tau01_beats_lloyd")
    passed = claims.judge_probe(name, runs, curves_of(good), T, GRID)
    assert passed.status == PASS and passed.paper == claims.PAPER[name], passed.numbers
    assert "configurations with >= 2 seeds" in passed.numbers
    failed = claims.judge_probe(name, runs, curves_of(bad), T, GRID)
    assert failed.status == FAIL and "fails:" in failed.numbers, failed.numbers
    assert claims.judge_probe(name, runs, curves_of(partial), T, GRID).status == UNTESTED
    one_seed = claims.judge_probe(name, runs, curves_of(good, n_seeds=1), T, GRID)
    assert one_seed.status == UNTESTED
    missing = claims.judge_probe(name, runs, curves_of({}), T, GRID, missing="no finished run to evaluate")
    assert missing.status == UNTESTED and "not evaluated: no finished run to evaluate" in missing.numbers


@pytest.mark.parametrize("name", [*PROBE_CASES, "cauchy_transfer"])
def test_probe_scopes_take_only_their_slice(name: str) -> None:
    subgrid, where = claims.CAUCHY_TRANSFER if name == "cauchy_transfer" else claims.SCOPES[name]
    everything = runs_of(GRID, lambda c: 1.0)
    runs = claims.scope(pd.concat([everything, everything.assign(**{SUBGRIDS: "elsewhere"})]), subgrid, where)
    assert len(runs) == 2 * len(claims.scope(GRID, subgrid, where)) > 0
    assert runs[SUBGRIDS].str.split(",").map(lambda tags: subgrid in tags).all()
    for key, allowed in where.items():
        assert runs[key].isin(allowed if isinstance(allowed, tuple) else (allowed,)).all()


# ---- cauchy_fails: both halves ----


def cauchy_runs(value: float = 1.2, outcome: str = FINISHED) -> pd.DataFrame:
    family = GRID[GRID[SUBGRIDS].str.contains("family")]
    cauchy = runs_of(family[family[FAMILY] == "cauchy"], lambda c: value, outcome=outcome)
    return pd.concat([runs_of(family[family[FAMILY] != "cauchy"], lambda c: 0.9), cauchy])


TRANSFER = curves_of(
    {
        **{("test_family=cauchy", f"L2-OH-family={f}"): (1.0, 0.9) for f in FAMILIES[2:]},
        ("test_family=cauchy", LLOYD): (1.0, 0.8),
        ("test_family=normal", LLOYD): (1.0, 0.8),
        ("test_family=normal", "L2-OH-family=gumbel"): (1.0, 0.5),
    }
)


def test_cauchy_fails_needs_both_halves() -> None:
    passed = claims.judge_cauchy(cauchy_runs(), TRANSFER, T, GRID)
    assert passed.status == PASS and "3/3 cases" in passed.numbers and "12/12 cases" in passed.numbers, (
        passed.numbers
    )
    diverged = claims.judge_cauchy(cauchy_runs(outcome=DIVERGED), TRANSFER, T, GRID)
    assert diverged.status == PASS and "diverged 24" in diverged.numbers
    assert claims.judge_cauchy(cauchy_runs(value=0.95), TRANSFER, T, GRID).status == FAIL
    transfers = TRANSFER.copy()
    transfers.loc[(transfers["series"] == "L2-OH-family=laplace") & (transfers["x"] == T), "median"] = 0.7
    assert claims.judge_cauchy(cauchy_runs(), transfers, T, GRID).status == FAIL
    untransferred = claims.judge_cauchy(
        cauchy_runs(), curves_of({}), T, GRID, missing="no finished run to evaluate"
    )
    assert untransferred.status == UNTESTED and "family_transfer not evaluated" in untransferred.numbers
    unfinished = claims.judge_cauchy(cauchy_runs(outcome="other"), TRANSFER, T, GRID)
    assert unfinished.status == UNTESTED and "unfinished 24" in unfinished.numbers
    extra = cauchy_runs(value=0.5).assign(**{SUBGRIDS: "elsewhere", SEED: 7})
    assert claims.judge_cauchy(pd.concat([cauchy_runs(), extra]), TRANSFER, T, GRID).status == PASS


# ---- binary_faster_leaner and cauchy_dissimilar ----


def speed_rows(ks=(8, 64, 256), slow_at: int | None = None) -> list[dict]:
    def measured(e: str, d: int, k: int) -> dict:
        width = d + (k if e == "onehot" else math.ceil(math.log2(k)))
        slower = 100 if (e == "binary" and d == slow_at and k == max(ks)) else 1
        return {
            "d_emb": width,
            "forward_seconds": 1e-4 * width * slower,
            "backward_seconds": 2e-4 * width,
            "peak_memory_bytes": 1000 * width,
        }

    return [
        {"d": d, "k": k, "onehot": measured("onehot", d, k), "binary": measured("binary", d, k)}
        for d in (4, 16)
        for k in ks
    ]


def test_binary_faster_leaner() -> None:
    claim = claims.judge_speed(speed_rows())
    assert claim.status == PASS and "forward 21.7x (paper up to 12x)" in claim.numbers, (
        claim.numbers
    )  # 260 / 12
    assert (
        "backward 21.7x (paper up to 9x)" in claim.numbers and "95% lower (paper almost 70%)" in claim.numbers
    )
    assert claims.judge_speed(speed_rows(slow_at=16)).status == FAIL
    assert claims.judge_speed(speed_rows(ks=(256,))).status == UNTESTED  # growth with k needs two k
    absent = claims.judge_speed(None, "reports/speed_memory.json")
    assert absent.status == UNTESTED and "reports/speed_memory.json" in absent.numbers


def blocks(cauchy_to_others: float = 5.0, normal_lognormal: float = 1.0, families=FAMILIES) -> pd.DataFrame:
    matrix = pd.DataFrame(1.0, index=list(families), columns=list(families))
    for f in families:
        matrix.loc[f, f] = 0.2
        if "cauchy" in families and f != "cauchy":
            matrix.loc["cauchy", f] = matrix.loc[f, "cauchy"] = cauchy_to_others
    if "lognormal" in families:
        matrix.loc["normal", "lognormal"] = matrix.loc["lognormal", "normal"] = normal_lognormal
    return matrix.rename_axis("family_i").reset_index()


def test_cauchy_dissimilar() -> None:
    passed = claims.judge_dissimilarity(blocks())
    assert passed.status == PASS and "cauchy-to-others 5" in passed.numbers and "6/6 cases" in passed.numbers
    assert claims.judge_dissimilarity(blocks(normal_lognormal=6.0)).status == FAIL
    untested = claims.judge_dissimilarity(blocks(families=("normal", "gumbel", "laplace")))
    assert untested.status == UNTESTED and "needs the distances of cauchy" in untested.numbers


def test_the_fourteen_claims_in_the_specs_order() -> None:
    assert list(claims.PAPER) == [
        "tau01_beats_lloyd",
        "l2_lower_train_loss",
        "l2_better_val_tau1_d4",
        "reembed_beats_lloyd",
        "noembed_reembed_trails_lloyd",
        "length_generalises",
        "shift_generalises",
        "cauchy_fails",
        "families_generalise",
        "ne_fails_gumbel_laplace_tau1",
        "clusters_d4_tau1",
        "large_lr_worse",
        "binary_faster_leaner",
        "cauchy_dissimilar",
    ]
    judged = {
        *claims.RUN_CLAIMS,
        *claims.PROBE_CLAIMS,
        "cauchy_fails",
        "binary_faster_leaner",
        "cauchy_dissimilar",
    }
    assert judged == set(claims.PAPER)
    table = claims.claims_table([claims.judge_speed(None)])
    assert list(table.columns) == ["name", "status", "numbers", "paper"]


# ---- evaluation curves: every model counts, Lloyd's once per set of tasks ----


def transfer_store(
    families=FAMILIES[:1] + FAMILIES[2:], seeds=(1, 2)
) -> tuple[pd.DataFrame, SimpleNamespace]:
    """Onehot models trained on four families; a fake evaluator: a model's value is its training family's
    index, Lloyd's depends on the seed and test family only (the same tasks for every model of a seed)."""
    runs = pd.DataFrame(
        [
            {
                "run_id": f"{f}-{s}",
                "outcome": FINISHED,
                SEED: s,
                SUBGRIDS: "family",
                FAMILY: f,
                EMB: "onehot",
                REG: "l2",
                TAU: 0.1,
                D: 32,
                K: 10,
                "task.n": 512,
            }
            for f in families
            for s in seeds
        ]
    )

    def evaluator(name: str, run: pd.Series) -> pd.DataFrame:
        model = float(FAMILIES.index(run[FAMILY]))
        return pd.DataFrame(
            [
                {
                    "test_family": test,
                    "method": method,
                    "step": step,
                    "value": model + step if method == "reembed" else 10.0 * run[SEED] + step,
                }
                for test in FAMILIES
                for method in ("reembed", "lloyd")
                for step in range(3)
            ]
        )

    return runs, SimpleNamespace(evaluator=evaluator)


def test_family_transfer_counts_models_trained_on_every_family() -> None:
    runs, ctx = transfer_store()
    curves = eval_curves(
        ctx,
        runs,
        "family_transfer",
        lambda t, r: t["test_family"],
        pd.Series("OH", index=runs.index),
        ("reembed",),
    )
    on_cauchy = curves[(curves["panel"] == "cauchy") & (curves["x"] == 2)].set_index("series")
    assert on_cauchy.loc["OH", "n_seeds"] == 8  # 4 training families x 2 seeds, none collapsed
    assert on_cauchy.loc["OH", "median"] == np.median([0, 2, 3, 4] * 2) + 2
    assert on_cauchy.loc[LLOYD, "n_seeds"] == 2  # Lloyd's once per seed
    assert on_cauchy.loc[LLOYD, "median"] == 17.0


def test_probe_curves_count_a_diverged_model_as_beating_nothing() -> None:
    runs, ctx = transfer_store(families=("normal", "gumbel"), seeds=(1, 2, 3))
    runs.loc[(runs[FAMILY] == "gumbel") & (runs[SEED] > 1), "outcome"] = DIVERGED
    curves = claims.probe_curves(ctx, runs, "family_transfer", "test_family", ("reembed",))
    at = curves[(curves["panel"] == "test_family=cauchy") & (curves["x"] == 2)].set_index("series")
    assert at.loc["family=normal", "median"] == 2.0 and at.loc["family=normal", "n_seeds"] == 3
    assert at.loc["family=gumbel", "median"] == math.inf and at.loc["family=gumbel", "n_seeds"] == 3
    assert at.loc["family=gumbel", "diverged"] == "2/3 diverged"
    assert at.loc[LLOYD, "n_seeds"] == 3
