"""Search beyond a grid (issue 59 point 5): a random search over declared ranges (sweep.search, config.search)
drawn before launch and run as the grid's configurations (packs, the ledger and resume unchanged); ASHA's
settings (sweep.asha) reaching Ray Tune's scheduler; bad declarations refused in one line before any job.
ASHA's pruned runs on a real sweep: tests/test_sweep.py (test_asha_stops_packs_and_every_model_ends_once)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from support.sweeps import children

from config.grid import load
from sweeper.driver.budget import Budget
from sweeper.driver.stop import Halt
from sweeper.driver.tune import scheduler_of
from sweeper.sweep import main
from tracking.names import CONFIG_HASH, FINISHED, OUTCOME, PACK

LR = "+sweep.search.space.lr={loguniform: [0.0001, 0.1]}"
GAMMA = ["+sweep.axes.gamma=model.gamma", "+sweep.search.space.gamma={uniform: [0.5, 2.0]}"]
K = "+sweep.search.space.k={randint: [4, 8]}"
FAMILY = "+sweep.search.space.family={choice: [normal, laplace]}"
GRID = "sweep.subgrids=[{name: mine, embedding: [onehot, binary]}]"


def drawn(*words: str) -> list[dict]:
    return [c.overrides for c in load(["sweep=smoke", GRID, *words]).plan.configurations]


def test_a_random_search_draws_its_samples_in_their_ranges_the_same_every_time():
    """Each grid configuration drawn `samples` times, every drawn value inside its declared range, each other
    value as the grid sets it; the same sweep draws the same configurations; more samples keep the draws made
    and add to them; another search seed draws others."""
    words = ["sweep.search.samples=5", LR, *GAMMA, K, FAMILY]
    first = drawn(*words)
    assert first == drawn(*words)  # a second launch plans the very configurations the first ran
    assert len(first) == 10 and sorted(c["model.embedding"] for c in first) == ["binary"] * 5 + ["onehot"] * 5
    for c in first:
        assert 0.0001 <= c["optim.lr"] <= 0.1 and 0.5 <= c["model.gamma"] <= 2.0
        assert isinstance(c["task.k"], int) and 4 <= c["task.k"] < 8  # randint excludes hi, as Ray Tune's
        assert c["task.family"] in ("normal", "laplace")
        assert (c["train.steps"], c["task.n"]) == (20, 16)  # smoke's fixed values kept
    assert len({c["optim.lr"] for c in first}) == 10  # each configuration its own draw
    lrs = [math.log10(c["optim.lr"]) for c in drawn("sweep.search.samples=40", LR)]
    below = sum(lr < -2.5 for lr in lrs) / len(lrs)  # log-uniform: half below 10^-2.5 (uniform: 0.3%)
    assert 0.3 < below < 0.7, below
    more = drawn("sweep.search.samples=7", LR, *GAMMA, K, FAMILY)
    assert all(c in more for c in first) and len(more) == 14
    assert not any(c in first for c in drawn("sweep.search.seed=1", *words))


def test_the_plan_shows_the_search_and_its_jobs_name_the_drawn_values(capsys):
    assert main(["sweep=smoke", GRID, "sweep.search.samples=3", LR, "sweep.dry_run=true"]) == 0
    out = capsys.readouterr().out
    (row,) = [line.split() for line in out.splitlines() if line.startswith("search ")]
    assert row == ["search", "lr", "loguniform[0.0001,", "0.1]", "x3"]
    assert out.rstrip().endswith("6 configurations x 2 seeds = 12 trials")
    jobs = load(["sweep=smoke", GRID, "sweep.search.samples=3", LR]).jobs
    assert all(f"lr{j.configuration.overrides['optim.lr']:g} " in j.name for j in jobs)


NO_BUDGET = Halt(Budget(None, 0.0))


def test_asha_takes_its_settings():
    """sweep.asha reaches Ray Tune's ASHAScheduler: rungs at grace_period x reduction_factor^i below max_t
    (train.steps and one evaluation more), one bracket each; by default ten evaluations, factor 4."""
    sweep = load(["sweep=smoke", "sweep.scheduler=asha", "train.steps=60"])
    default = scheduler_of(sweep.cfg, sweep.plan, NO_BUDGET)
    assert [[m for m, _ in b._rungs] for b in default._brackets] == [[50]]  # ten evaluations of 5 steps
    assert default._reduction_factor == 4
    words = ["sweep.asha.grace_period=10", "sweep.asha.reduction_factor=2", "sweep.asha.brackets=2"]
    sweep = load(["sweep=smoke", "sweep.scheduler=asha", "train.steps=60", *words])
    asha = scheduler_of(sweep.cfg, sweep.plan, NO_BUDGET)
    assert asha._max_t == 65 and asha._reduction_factor == 2
    assert [[m for m, _ in b._rungs] for b in asha._brackets] == [[40, 20, 10], [40, 20]]


# Each bad declaration, answered by the console script in one line (exit 2) before Ray or the store.
BAD_SEARCHES = [
    (
        ["sweep.search.samples=4"],
        "error: sweep 'smoke', sweep.search.space: a search needs both sweep.search.samples >= 1 and an axis "
        "in sweep.search.space (docs/configuration.md, 'A random search')",
    ),
    (
        ["sweep.search.samples=4", "+sweep.search.space.lr={normal: [0, 1]}"],
        "error: sweep 'smoke', sweep.search.space.lr={'normal': [0, 1]} is not allowed: one of "
        "{uniform: [lo, hi]}, {loguniform: [lo, hi]} (0 < lo), {randint: [lo, hi]} (integers, hi excluded) "
        "or {choice: [a, b, ...]}, lo < hi",
    ),
    (
        ["sweep.search.samples=4", "+sweep.search.space.embedding={choice: [onehot, none]}"],
        "error: sweep 'smoke', sweep.search.space.embedding: model.embedding is also set by sub-grid "
        "'smoke'; an axis is drawn or set, not both",
    ),
    (
        ["sweep.search.samples=4", "sweep.search.space.lr={uniform: [0.001, 0.1]}"],
        "error: unknown key 'sweep.search.space.lr': sweep.search.space holds keys of your own; add one "
        "with +sweep.search.space.lr=...",
    ),
    (["sweep.search.samples=-1"], "error: sweep.search.samples=-1 is not allowed: an integer >= 0"),
    (
        ["sweep.asha.reduction_factor=1"],
        "error: sweep.asha.reduction_factor=1.0 is not allowed: a number > 1, finite",
    ),
]


@pytest.mark.slow  # six interpreters importing Hydra and the config tree
def test_bad_searches_are_refused_in_one_line_before_any_job(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "leaner-sweep")
    store = f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"
    for words, line in BAD_SEARCHES:
        done = subprocess.run(
            [script, "sweep=smoke", store, f"cluster.storage={tmp_path / 'ray'}", *words],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stderr.splitlines()) == (2, [line]), done.stderr[-2000:]
    assert sorted(tmp_path.iterdir()) == []  # no store, no Ray storage: nothing started


@pytest.mark.slow  # a real sweep of 6 tiny models on the worker's local Ray, then its resume
def test_a_random_search_runs_its_draws_in_packs_once_and_resumes_with_nothing_to_run(
    tmp_path, sqlite_uri, local_ray, capfd
):
    """sweep.search.samples=3 over lr on one grid point, the seeds of each draw packed in one trial: one run
    per drawn configuration and seed, with the drawn value, all finished; launched again, the same draws are
    found done and nothing runs or is recorded twice."""
    line = [
        "sweep=smoke",
        "sweep.subgrids=[{name: mine}]",
        "sweep.search.samples=3",
        LR,
        "cluster.pack=seeds",
        f"tracking.uri={sqlite_uri}",
        f"cluster.storage={tmp_path / 'ray'}",
    ]
    assert main(line) == 0
    plan = load(line).plan
    assert "3 configurations x 2 seeds = 6 trials" in capfd.readouterr().out
    runs = children(sqlite_uri, "smoke")
    wanted = sorted((j.key, j.configuration.overrides["optim.lr"]) for j in load(line).jobs)
    assert sorted((r.data.tags[CONFIG_HASH], float(r.data.params["optim.lr"])) for r in runs) == wanted
    assert all(r.data.tags[OUTCOME] == FINISHED and r.info.status == "FINISHED" for r in runs)
    packs = {r.data.tags[PACK] for r in runs}
    assert len(packs) == len(plan.configurations) == 3  # a draw's two seeds trained together
    assert all(0.0001 <= c.overrides["optim.lr"] <= 0.1 for c in plan.configurations)
    assert main(line) == 0
    assert "6 of 6 trials already in MLflow; 0 to run" in capfd.readouterr().out
    again = MlflowClient(tracking_uri=sqlite_uri).search_runs([runs[0].info.experiment_id])
    assert len([r for r in again if CONFIG_HASH in r.data.tags]) == 6
