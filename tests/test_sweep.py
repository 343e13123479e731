"""Sweeps on a real local Ray instance into real MLflow stores (SQLite file, `mlflow server`).

One Ray instance serves the whole module (sweeper.driver.cluster.connect reuses an
initialised one). Trials are tiny (the smoke grid): what is tested is the
plumbing — one writer, exactly-once, equality with a local run.
"""

from __future__ import annotations

import getpass
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from support import ray_local
from support.histories import check_histories, histories
from support.once import assert_every_job_once, assert_every_job_once_every_point_once
from support.repo import REPO
from support.sweeps import children, most_at_once, sweep_jobs

from analysis.runs import load_runs, outcome_of
from sweeper.driver import session
from sweeper.rerun import main as rerun_main
from sweeper.sweep import main
from tracking import ui
from tracking.names import (
    BEST_VAL_REL_LLOYD,
    COMMAND,
    CONFIG_HASH,
    CONFIGURATION,
    DIVERGED,
    DIVERGED_AT,
    FINISHED,
    GIT_COMMIT,
    MLFLOW_GIT_COMMIT,
    MLFLOW_PARENT_RUN_ID,
    MLFLOW_RUN_NOTE,
    MLFLOW_SOURCE_NAME,
    MLFLOW_USER,
    OUTCOME,
    PACK,
    PENDING,
    PLAN_ARTIFACT,
    PLAN_TAGS,
    PLAN_TRIALS_ARTIFACT,
    PRUNED,
    RERUN_OF,
    SEED,
    SUBGRIDS,
    SWEEP_ARTIFACT,
    TRIAL_COUNTS,
    TUNE_CHECKPOINT,
    VAL_REL_LLOYD,
)
from training.faults import NAN_AT_STEP

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    """Ray's workers inherit the environment of ray.init: with it, the `bad` sub-grid's trials diverge at
    step 7."""
    bad = [
        t.key for sweep in (MIXED, PACKED) for t in sweep_jobs(sweep) if t.configuration.subgrids == ("bad",)
    ]
    with ray_local.own(num_cpus=2, env={NAN_AT_STEP: f"7@{','.join(bad)}"}):
        yield


# 3 smoke configurations and 1 of its own (lr 0.02, so its own config hashes) that diverges at step 7 (the
# test-only NaN fault, set by ray_session), x 3 seeds = 12 trials.
MIXED = [
    "sweep=smoke",
    "sweep.seeds=[1, 2, 3]",
    "train.steps=60",
    "sweep.subgrids=[{name: smoke, embedding: [onehot, binary, none]}, {name: bad, lr: [0.02]}]",
]
PACKED = [
    *MIXED,
    "model.dropout=0.0",
    "cluster.pack=seeds",
]  # dropout 0: packed equals solo (training.packed)
# Half a CPU a trial: 4 at once on 2 CPUs. Trials write nothing to the store themselves (the driver is its one
# writer), so more slots would only start more Ray workers, each importing the training code.
CONCURRENT = ["cluster.cpus_per_trial=0.5", "cluster.max_failures=3"]


def test_sqlite_sweep_concurrent_diverging_and_equal_to_the_cli(tmp_path, sqlite_uri, capfd):
    uri = sqlite_uri
    overrides = [*MIXED, *CONCURRENT, f"tracking.uri={uri}", f"cluster.storage={tmp_path}/ray"]
    assert main(overrides) == 0
    out = capfd.readouterr()
    assert "database is locked" not in out.out + out.err
    client = MlflowClient(tracking_uri=uri)
    trials = sweep_jobs(MIXED)
    by_key = assert_every_job_once(uri, "leaner-clustering", trials)  # the diverged ones log fewer points
    runs = list(by_key.values())
    assert len({r.data.tags[MLFLOW_PARENT_RUN_ID] for r in runs}) == 1
    good = []
    for t in trials:
        run = by_key[t.key]
        assert run.data.tags[SEED] == str(t.seed) and run.data.tags[SUBGRIDS] == ",".join(
            t.configuration.subgrids
        )
        if t.configuration.subgrids == ("bad",):  # diverged, ended, not retried; the others carried on
            assert (run.data.tags[OUTCOME], run.info.status, run.data.tags[DIVERGED_AT]) == (
                DIVERGED,
                "FAILED",
                "7",
            )
            assert all(
                step < 7 for points in histories(client, run.info.run_id).values() for step, _ in points
            )
        else:
            assert (run.data.tags[OUTCOME], run.info.status) == (FINISHED, "FINISHED")
            good.append(t)
    check_histories(client, by_key, good, ["train.steps=60"])
    at_once = most_at_once(runs)
    print(
        f"trials {len(trials)}, runs {len(runs)}, duplicates 0, lost 0; "
        f"most trials training at once: {at_once} (4 slots)"
    )
    assert at_once >= 2, "the concurrent sweep ran its trials one at a time"
    check_ui_story(client, runs, trials, overrides, out.out)
    # The same command again: every trial has an outcome, nothing runs, no run is added.
    assert main(overrides) == 0
    assert "12 of 12 trials already in MLflow; 0 to run" in capfd.readouterr().out
    assert len(children(uri, "smoke")) == 12
    # One trial against `python -m sweeper.train` with the same config and seed, in another store.
    t = trials[1]
    cli_uri = f"sqlite:///{tmp_path}/cli.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a trial's thread count (cluster.cpus_per_trial <= 1)
    cmd = [
        sys.executable,
        "-m",
        "sweeper.train",
        "train.steps=60",
        *t.configuration.override_strings(),
        f"seed={t.seed}",
        f"tracking.uri={cli_uri}",
        f"train.workdir={tmp_path}/runs",
    ]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cli = MlflowClient(tracking_uri=cli_uri)
    (cli_run,) = cli.search_runs([cli.get_experiment_by_name("leaner-clustering").experiment_id])
    assert cli_run.data.tags[CONFIG_HASH] == t.key
    assert histories(cli, cli_run.info.run_id) == histories(client, by_key[t.key].info.run_id)
    where = (
        "tracking.",
        "cluster.",
        "train.workdir",
    )  # where a run executes and records, not what it computes
    assert {k: v for k, v in cli_run.data.params.items() if not k.startswith(where)} == {
        k: v for k, v in by_key[t.key].data.params.items() if not k.startswith(where)
    }


def check_ui_story(client: MlflowClient, runs: list, trials: list, argv: list[str], printed: str) -> None:
    """What the MLflow UI shows of a sweep: unique run names, seeds grouped by the configuration tag, the
    standard columns, best_val_rel_lloyd, no operational params, and a parent run with plan, command and
    counts."""
    by_key = {r.data.tags[CONFIG_HASH]: r for r in runs}
    assert sorted(r.info.run_name for r in runs) == sorted(t.name for t in trials)  # one name per trial
    assert all(by_key[t.key].info.run_name == t.name == t.name.split(" s")[0] + f" s{t.seed}" for t in trials)
    seeds_of: dict[str, set[int]] = {}  # configuration tag -> seeds, as MLflow's "Group by" shows them
    for t in trials:
        seeds_of.setdefault(by_key[t.key].data.tags[CONFIGURATION], set()).add(t.seed)
    assert len(seeds_of) == len({tuple(t.configuration.override_strings()) for t in trials}) == 4
    assert all(seeds == {1, 2, 3} for seeds in seeds_of.values())
    for run in runs:
        tags, run_id = run.data.tags, run.info.run_id
        assert tags[MLFLOW_SOURCE_NAME] and tags[MLFLOW_USER] == getpass.getuser()
        assert (
            tags[MLFLOW_GIT_COMMIT] == tags[GIT_COMMIT]
            and tags[CONFIGURATION].split(" #")[0] == run.info.run_name.rsplit(" s", 1)[0]
        )
        assert f"**{run.data.params['model.embedding']}** token embedding" in tags[MLFLOW_RUN_NOTE]
        assert not [
            k
            for k in run.data.params
            if k.startswith(("cluster.", "tracking.", "train.workdir", "train.device", "train.resume"))
        ]
        assert (
            tags["cluster.max_failures"] == "3" and tags["train.device"] == "auto"
        )  # on the run as tags instead
        vals = [v for _, v in histories(client, run_id)[VAL_REL_LLOYD]]
        assert [v for _, v in histories(client, run_id)[BEST_VAL_REL_LLOYD]] == list(
            itertools.accumulate(vals, min)
        )
    parent = client.get_run(runs[0].data.tags[MLFLOW_PARENT_RUN_ID])
    tags = parent.data.tags
    assert tags[COMMAND] == shlex.join(["python", "-m", "sweeper.sweep", *argv])
    assert [tags[key] for key in PLAN_TAGS] == ["4", "3", "12"] and "sweep **smoke**" in tags[
        MLFLOW_RUN_NOTE
    ].lower()
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {PLAN_ARTIFACT, PLAN_TRIALS_ARTIFACT, SWEEP_ARTIFACT} <= artifacts
    plan = client.download_artifacts(parent.info.run_id, PLAN_TRIALS_ARTIFACT)
    assert sorted(line.split(",")[0] for line in Path(plan).read_text().splitlines()[1:]) == sorted(
        t.name for t in trials
    )
    counts = {outcome: parent.data.metrics[name] for outcome, name in TRIAL_COUNTS.items()}
    assert counts == {FINISHED: 9, DIVERGED: 3, PRUNED: 0, PENDING: 0}
    pending = [
        m.value
        for m in sorted(
            client.get_metric_history(parent.info.run_id, TRIAL_COUNTS[PENDING]), key=lambda m: m.step
        )
    ]
    assert pending[0] == 12 and pending[-1] == 0 and len(pending) > 2  # counted down while trials ended
    assert (
        ui.runs_table(client.tracking_uri, parent.info.experiment_id) in printed
    )  # opens the runs view (tracking.view)


def test_packed_sweep_one_run_per_model_equal_to_solo(tmp_path, sqlite_uri, capfd, monkeypatch):
    """cluster.pack=seeds: 4 Ray Tune trials train the 3 seeds of a configuration together (one pack
    diverges); a progress line comes at a steady pace (here every half second) and moves."""
    uri = sqlite_uri
    monkeypatch.setitem(session.PROGRESS_S, False, 0.5)
    assert main([*PACKED, f"tracking.uri={uri}", f"cluster.storage={tmp_path}/ray"]) == 0
    out = capfd.readouterr().out
    assert "cluster.pack=seeds: 4 Ray Tune trials, each training the 3 seeds" in out
    done = [
        int(d.replace(",", "")) for d in re.findall(r"sweep smoke: \d+ of 12 models ended; ([\d,]+) of", out)
    ]
    assert len(done) >= 2 and done == sorted(done) and done[-1] > 0, out[-3000:]
    client = MlflowClient(tracking_uri=uri)
    trials = sweep_jobs(PACKED)
    by_key = assert_every_job_once(uri, "leaner-clustering", trials)  # one run per model
    packs: dict[str, set[str]] = {}
    for t in trials:
        packs.setdefault(by_key[t.key].data.tags[PACK], set()).add(
            " ".join(t.configuration.override_strings())
        )
        assert TUNE_CHECKPOINT not in by_key[t.key].data.tags  # ended: its checkpoint is deleted
    assert len(packs) == 4 and all(len(configurations) == 1 for configurations in packs.values())
    bad = [t for t in trials if t.configuration.subgrids == ("bad",)]
    assert {(by_key[t.key].data.tags[OUTCOME], by_key[t.key].data.tags[DIVERGED_AT]) for t in bad} == {
        (DIVERGED, "7")
    }
    good = [t for t in trials if t not in bad]
    assert all(by_key[t.key].data.tags[OUTCOME] == FINISHED for t in good)
    assert not list((tmp_path / "ray").glob("smoke-*/*/checkpoint_*"))  # every trial's checkpoints deleted
    check_histories(client, by_key, good, ["train.steps=60", "model.dropout=0.0"], packed=True)
    # Re-run from the MLflow record: trained alone, to 1e-5, and the rerun says why not bit for bit.
    original = by_key[good[0].key]
    assert rerun_main([original.info.run_id, f"tracking.uri={uri}"]) == 0
    out = capfd.readouterr().out
    assert f"trained in pack {original.data.tags[PACK]}" in out
    (again,) = client.search_runs(
        [original.info.experiment_id], f"tags.{RERUN_OF} = '{original.info.run_id}'"
    )
    assert again.data.metrics[VAL_REL_LLOYD] == pytest.approx(original.data.metrics[VAL_REL_LLOYD], rel=1e-5)


def test_asha_stops_packs_and_every_model_ends_once(tmp_path, sqlite_uri, capfd):
    """sweep.scheduler=asha with packs, one trial at a time (so its decisions are deterministic): a pack ASHA
    stops marks each of its models pruned, its run FINISHED (not FAILED or KILLED, which read as failures),
    the others finish; the parent run and the report's reading of the runs count them as pruned; started
    again, nothing runs."""
    uri = sqlite_uri
    # Rungs at step 50 (ten evaluations: sweeper.driver.tune.scheduler_of) of 60; 3 configurations x 2 seeds.
    overrides = [
        "sweep=smoke",
        "sweep.seeds=[1, 2]",
        "sweep.scheduler=asha",
        "train.steps=60",
        "cluster.pack=seeds",
        "cluster.max_concurrent=1",
        f"tracking.uri={uri}",
        f"cluster.storage={tmp_path}/ray",
    ]
    assert main(overrides) == 0
    runs = children(uri, "smoke")
    assert len(runs) == 6
    outcomes: dict[str, set] = {}
    for run in runs:
        outcome = run.data.tags[OUTCOME]
        assert run.info.status == "FINISHED", (outcome, run.info.status)
        outcomes.setdefault(run.data.tags[PACK], set()).add(outcome)
    assert all(len(o) == 1 for o in outcomes.values()), outcomes  # a pack ends as one
    assert sorted(o for (o,) in outcomes.values()) == [FINISHED, PRUNED, PRUNED], outcomes
    (parent,) = [
        r
        for r in MlflowClient(tracking_uri=uri).search_runs([runs[0].info.experiment_id])
        if r.info.run_id == runs[0].data.tags[MLFLOW_PARENT_RUN_ID]
    ]
    assert parent.data.metrics[TRIAL_COUNTS[PRUNED]] == 4 and parent.data.metrics[TRIAL_COUNTS[FINISHED]] == 2
    read = load_runs(uri, "leaner-clustering", sweep="smoke")
    assert outcome_of(read).value_counts().to_dict() == {PRUNED: 4, FINISHED: 2}  # as analysis.context reads
    capfd.readouterr()
    assert main(overrides) == 0
    assert "6 of 6 trials already in MLflow; 0 to run" in capfd.readouterr().out


def test_a_sweep_adopts_the_finished_runs_it_skips(tmp_path, sqlite_uri, capfd):
    """`points` at n 512 is `paper`'s baseline: run by paper first, points skips it, and adds itself to the
    run's sweep and subgrids tags (lists), so select.sweep=points finds both of its configurations."""
    uri = sqlite_uri
    tiny = [
        "sweep.seeds=[1]",
        "train.steps=10",
        "train.eval_every=5",
        "train.batch=4",
        "train.val_batches=1",
        f"tracking.uri={uri}",
        f"cluster.storage={tmp_path}/ray",
    ]
    assert main(["sweep=paper", "sweep.subgrids=[{name: tau, tau: [1.0]}]", *tiny]) == 0
    points = ["sweep=points", "sweep.subgrids=[{name: points, n: [256, 512]}]", *tiny]
    capfd.readouterr()
    assert main(points) == 0
    out = capfd.readouterr().out
    assert "1 runs finished outside this sweep now carry sweep=points too" in out
    assert "1 of 2 trials already in MLflow; 1 to run" in out
    assert main(points) == 0  # again: nothing runs, nothing is tagged twice
    assert "2 of 2 trials already in MLflow; 0 to run" in capfd.readouterr().out
    selected = load_runs(uri, "leaner-clustering", sweep="points")
    assert sorted(selected["task.n"]) == [256, 512]
    shared = selected[selected["task.n"] == 512].iloc[0]
    assert (shared["sweep"], shared["subgrids"]) == ("paper,points", "tau,points")
    assert list(load_runs(uri, "leaner-clustering", sweep="paper")["run_id"]) == [shared["run_id"]]
    assert sorted(load_runs(uri, "leaner-clustering", subgrid="points")["task.n"]) == [256, 512]
    stored = assert_every_job_once_every_point_once(
        uri, "leaner-clustering", sweep_jobs(points), sweep="points"
    )
    print(f"trials 2, runs {len(stored.runs)} (1 adopted), points {stored.points}, duplicates 0, lost 0")
    assert len(stored.runs) == 2
