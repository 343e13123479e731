"""Several experiments judged as one (docs/science.md section 7.3): each configuration of the paper grid at
the setting nearest the paper's that has runs to judge (the paper's n first, then its steps), and at lite
scale the farthest; the verdicts at lite scale beside those that differ. The oracle is the rule written out by
hand for each frame: which experiment's runs a configuration keeps."""

from __future__ import annotations

import pandas as pd

from analysis.claims.settings import chosen, distance
from analysis.claims.table import Claim, beside, markdown
from tracking.names import DIVERGED, FINISHED, OUTCOME, SEED

SEEDS = (1, 2, 3)
OH_L2 = {"model.embedding": "onehot", "loss.regularizer": "l2", "loss.tau": 0.1, "task.d": 4, "task.k": 6}


def runs_of(experiment: str, n: int, steps: int, outcome: str = FINISHED, seeds=SEEDS, **config) -> list:
    return [
        {
            **OH_L2,
            **config,
            "experiment": experiment,
            "task.n": n,
            "train.steps": steps,
            SEED: seed,
            OUTCOME: outcome,
            "run_id": f"{experiment}-{n}-{steps}-{seed}-{sorted(config.items())}",
        }
        for seed in seeds
    ]


def kept(runs: list[dict], nearest: bool = True) -> set[str]:
    """The experiments whose runs a choice keeps."""
    return set(chosen(pd.DataFrame(runs), nearest)["experiment"])


def test_the_papers_n_comes_before_its_steps_and_nearer_before_farther() -> None:
    assert distance(512, 10_000) == (0, 0)
    assert distance(256, 4_000) < distance(128, 10_000)  # n first: 256 is nearer 512 than 128 is
    assert distance(128, 10_000) < distance(128, 4_000)
    assert distance(1024, 10_000) == distance(256, 10_000)  # as far above as below, on a log scale


def test_each_configuration_keeps_the_runs_of_one_setting() -> None:
    lite = runs_of("lite", 128, 10_000) + runs_of("lite", 128, 4_000, **{"loss.tau": 1.0})
    plus = runs_of("plus", 512, 10_000) + runs_of("plus", 128, 10_000, **{"loss.tau": 1.0})
    frame = pd.DataFrame(lite + plus)
    nearest = chosen(frame)
    assert set(zip(nearest["loss.tau"], nearest["experiment"])) == {(0.1, "plus"), (1.0, "plus")}
    assert len(nearest) == 6
    farthest = chosen(frame, nearest=False)
    assert set(zip(farthest["loss.tau"], farthest["experiment"])) == {(0.1, "lite"), (1.0, "lite")}
    # A configuration only one experiment trains keeps its runs either way.
    alone = runs_of("lite32", 128, 10_000, **{"task.d": 32, "task.k": 10})
    assert kept(lite + plus + alone) == {"plus", "lite32"}
    assert kept(lite + plus + alone, nearest=False) == {"lite", "lite32"}


def test_a_setting_without_two_ended_seeds_is_not_chosen() -> None:
    lite = runs_of("lite", 128, 10_000)
    assert kept(lite + runs_of("plus", 512, 10_000, outcome="RUNNING")) == {"lite"}
    assert kept(lite + runs_of("plus", 512, 10_000, seeds=(1,))) == {"lite"}
    assert kept(lite + runs_of("plus", 512, 10_000, outcome=DIVERGED)) == {"plus"}  # diverged is judged
    # None to judge anywhere: every run stays, so the scope's summary counts them.
    unfinished = runs_of("lite", 128, 10_000, outcome="RUNNING") + runs_of("plus", 512, 10_000, seeds=(1,))
    assert kept(unfinished) == {"lite", "plus"}


def test_the_same_setting_in_two_experiments_is_kept_whole() -> None:
    assert kept(runs_of("lite32", 128, 10_000) + runs_of("plus", 128, 10_000)) == {"lite32", "plus"}


def test_the_verdict_at_lite_scale_is_printed_where_it_differs() -> None:
    claims = [Claim("a", "PASS", "n", "words"), Claim("b", "FAIL", "n", "words")]
    at_lite = [Claim("a", "FAIL", "n", "words"), Claim("b", "FAIL", "n", "words")]
    both = beside(claims, at_lite)
    assert [c.at_lite_scale for c in both] == ["FAIL", ""]
    assert both[0].mark() == " (FAIL at lite scale)" and both[1].mark() == ""
    text = markdown(both)
    assert "## Verdicts that changed with the setting" in text
    assert "| `a` | FAIL | PASS |" in text and "| `b` |" not in text.split("changed with the setting")[1]
    assert "changed with the setting" not in markdown(claims)  # one experiment: no such section
