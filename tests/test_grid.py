"""The sweep grids: the paper's 300 configurations, the plan, and bad input before Ray starts."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
from support.repo import REPO

from analysis.runs import typed
from config import grid
from config.compose import compose
from config.identity import config_hash, run_name
from config.schema import ConfigError
from sweeper.sweep import load, main

PAPER_GRID = REPO / "tests" / "data" / "paper_grid.csv"  # a copy of the published list (shared/)
CSV_KEYS = {
    "tau": "loss.tau",
    "regularizer": "loss.regularizer",
    "embedding": "model.embedding",
    "d": "task.d",
    "k": "task.k",
    "family": "task.family",
    "lr": "optim.lr",
}


@pytest.fixture(scope="module")
def paper() -> grid.Sweep:
    return load(["sweep=paper"])


def test_paper_grid_equals_the_published_list(paper):
    with PAPER_GRID.open() as f:
        rows = list(csv.DictReader(f))
    expected = {tuple(typed(row[c]) for c in CSV_KEYS): row["subgrids"] for row in rows}
    plan = paper.plan
    got = {
        tuple(c.overrides[key] for key in CSV_KEYS.values()): ",".join(c.subgrids)
        for c in plan.configurations
    }
    assert len(plan.configurations) == len(got)  # no configuration twice
    assert got == expected
    # each sub-grid's size in the plan is the number of listed configurations naming it
    for sub in plan.subgrids:
        assert sub.size == sum(sub.name in row["subgrids"].split(",") for row in rows), sub.name


def test_paper_trials_are_config_hashes_of_composed_runs(paper):
    plan, trials = paper.plan, paper.jobs
    assert len(trials) == len(plan.configurations) * len(plan.seeds) == plan.job_count
    assert (
        len({t.key for t in trials}) == len({t.name for t in trials}) == len(trials)
    )  # run names unique too
    assert len(set(plan.seeds)) == len(plan.seeds)
    for t in trials[::997]:  # the command a trial runs, composed independently by Hydra
        run = compose([*t.configuration.override_strings(), f"seed={t.seed}"])
        assert config_hash(run) == t.key
        assert run_name(run, "paper") == t.name


def test_dry_run_prints_the_plan_without_ray_or_mlflow():
    code = (
        "import sys; from sweeper.sweep import main; rc = main(['sweep=paper', 'sweep.dry_run=true']); "
        "assert 'ray' not in sys.modules and 'mlflow' not in sys.modules, 'dry run imported ray/mlflow'; "
        "sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "300 configurations x 10 seeds = 3000 trials"
    table = "\n".join(lines)
    for name in ("tau", "lr", "dim", "clusters", "family", "compute"):
        assert f"\n{name} " in table


def test_packed_dry_run_says_how_many_ray_trials(capsys):
    assert main(["sweep=paper", "sweep.dry_run=true", "cluster.pack=seeds"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == [
        "cluster.pack=seeds: 300 Ray Tune trials, each training the 10 seeds of one configuration together",
        "300 configurations x 10 seeds = 3000 trials",
    ]


@pytest.mark.parametrize(
    "sweep, configurations, seeds",
    [("points", 4, 10), ("demo", 3, 2), ("lite", 27, 3), ("lite32", 18, 3), ("smoke", 3, 2)],
)
def test_other_sweeps_expand_and_validate(sweep, configurations, seeds):
    loaded = load([f"sweep={sweep}"])
    plan, trials = loaded.plan, loaded.jobs
    assert (
        plan.summary() == f"{configurations} configurations x {seeds} seeds = {configurations * seeds} trials"
    )
    assert len(trials) == len({t.name for t in trials}) == configurations * seeds  # one run name per trial
    assert all(t.name.endswith(f" s{t.seed}") for t in trials)  # the sweep is a tag, not part of the name


def test_points_sweeps_n_at_the_paper_baseline(paper):
    plan = load(["sweep=points"]).plan
    paper_plan = paper.plan
    baseline = [c for c in paper_plan.configurations if c.subgrids == ("tau", "lr", "dim", "clusters")][0]
    assert sorted(c.overrides["task.n"] for c in plan.configurations) == [128, 256, 512, 1024]
    for c in plan.configurations:
        assert {k: v for k, v in c.overrides.items() if k != "task.n"} == baseline.overrides


# What a scaled sweep changes beyond n and steps, per sub-grid: sweep=lite (conf/sweep/lite.yaml) the d and k
# of `family`; sweep=lite32 (conf/sweep/lite32.yaml) the k of `lr` (10 where the paper's lr sub-grid has 6).
SCALE = {"lite": {"family": {"task.d": 32, "task.k": 10}}, "lite32": {"lr": {"task.k": 6}}}
LENGTHS = {"lite": (4000, 10000), "demo": (4000, 10000), "lite32": (10000,)}
POINTS = {"lite": (128,), "demo": (128,), "lite32": (128, 256)}


@pytest.mark.parametrize("sweep", ["lite", "demo", "lite32"])
def test_scaled_sweeps_are_slices_of_the_paper_subgrids_they_are_named_after(paper, sweep):
    """Every configuration of sweep=lite / demo, scaled back, is a configuration of the paper's sub-grid of
    that name."""
    plan = load([f"sweep={sweep}"]).plan
    paper_plan = paper.plan
    named = {
        (name, tuple(sorted(c.overrides.items()))) for c in paper_plan.configurations for name in c.subgrids
    }
    for c in plan.configurations:
        # lite trains its probed slice the paper's 10,000 steps and the rest 4,000 (conf/sweep/lite.yaml)
        assert c.overrides["task.n"] in POINTS[sweep]
        assert c.overrides.get("train.steps", 10000) in LENGTHS[sweep]
        for name in c.subgrids:
            scaled = {k: v for k, v in c.overrides.items() if k not in ("task.n", "train.steps")}
            scaled.update(SCALE.get(sweep, {}).get(name, {}))
            assert (name, tuple(sorted(scaled.items()))) in named, (name, c.overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["sweep=nope"],
            r"sweep=nope is not a sweep: choose sweep=NAME with NAME one of "
            r"demo, lite, lite-plus, lite32, paper, points, smoke",
        ),
        ([], r"no sweep chosen"),
        (
            ["sweep=smoke", "sweep.subgrids=[{name: bad, tau: [1.0, -1.0]}]"],
            r"sub-grid 'bad'.*loss\.tau=-1\.0",
        ),
        (
            ["sweep=smoke", "sweep.subgrids=[{name: bad, embedding: [onehot, fancy]}]"],
            r"sub-grid 'bad'.*model\.embedding='fancy'.*onehot",
        ),
        (["sweep=smoke", "sweep.subgrids=[{name: bad, d: [4, four]}]"], r"sub-grid 'bad'.*task\.d"),
        (
            ["sweep=smoke", "sweep.subgrids=[{name: bad, width: [1, 2]}]"],
            r"unknown axis 'width'; allowed axes: tau",
        ),
        (["sweep=smoke", "sweep.subgrids=[]"], r"the grid is empty"),
        (  # lite32's own axis n: fewer points than its k 10 clusters
            ["sweep=lite32", "sweep.subgrids=[{name: bad, n: [128, 8]}]"],
            r"sweep 'lite32', sub-grid 'bad': task\.n=8 is not allowed: an integer >= k \(k=10\)",
        ),
        (["sweep=smoke", "sweep.subgrids=[{name: bad, tau: []}]"], r"axis 'tau'.*non-empty list"),
        (["sweep=smoke", "sweep.seeds=[7, 8, 7]"], r"duplicate seeds \[7\]"),
        (["sweep=smoke", "sweep.scheduler=hyperband"], r"sweep.scheduler.*'hyperband'.*none, asha"),
        (["sweep=smoke", "+sweep.fixed.task.width=3"], r"'task.width' is not a config key"),
    ],
)
def test_bad_sweeps_are_rejected_before_ray(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(overrides)


def test_cli_rejects_with_exit_code_and_one_line(capsys):
    assert main(["sweep=smoke", "sweep.seeds=[1, 1]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: sweep 'smoke', sweep.seeds: duplicate seeds [1]")


def test_command_line_beats_the_sweeps_fixed_values():
    loaded = load(["sweep=smoke", "train.steps=7"])
    plan = loaded.plan
    assert all("train.steps" not in c.overrides for c in plan.configurations)
    assert sorted(c.overrides["model.embedding"] for c in plan.configurations) == ["binary", "none", "onehot"]
    t = loaded.jobs[0]
    assert (
        config_hash(compose(["train.steps=7", *t.configuration.override_strings(), f"seed={t.seed}"]))
        == t.key
    )
