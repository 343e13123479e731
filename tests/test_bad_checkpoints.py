"""A truncated or corrupted checkpoint found on resume: the error names the file, and training restarts in the
same run from the last good checkpoint (best.pt) or from step 0, tagged bad_checkpoint; never a crash loop.

Real files are damaged (half of a real checkpoint, or garbage bytes). Training is deterministic, so a restart
gives exactly the numbers of an uninterrupted run, and the recorders skip the points already stored.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from support import ray_local
from support.configs import ONE_TRIAL, PACKABLE
from support.histories import check_histories, expected_counts
from support.sweeps import children, recorded_checkpoint, sweep_jobs

from cli import exit_codes
from config.compose import compose
from sweeper.train import main
from tracking.mlflow_recorder import MlflowRecorder
from tracking.names import BAD_CHECKPOINT, FINISHED, METRICS, OUTCOME
from tracking.recorder import MemoryRecorder
from training.checkpoint import best_path, last_path, load
from training.faults import CRASH_AT_STEP
from training.loop import default_workdir, train
from training.packed import train_pack

EXPERIMENT = "leaner-clustering"


class Crash(Exception):
    pass


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    path.write_bytes(b"\x80\x02 not a checkpoint " * 64)


def stored(uri: str, run_ids: list[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every metric point of each run as MLflow holds it (duplicates included), sorted."""
    client = MlflowClient(tracking_uri=uri)
    return {
        run_id: {
            key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in METRICS
        }
        for run_id in run_ids
    }


def figure(label: str, trials: int, runs: int, points: dict, cfg) -> str:
    """The one-line figure: trials, runs, metric points stored twice and points missing."""
    want = expected_counts(cfg)
    duplicates = sum(len(p) - len({s for s, _ in p}) for h in points.values() for p in h.values())
    lost = sum(max(0, want[key] - len({s for s, _ in p})) for h in points.values() for key, p in h.items())
    line = f"{label}: trials {trials}, runs {runs}, duplicates {duplicates}, lost {lost}"
    print(line)
    return line


def test_a_solo_run_restarts_from_its_last_good_checkpoint(
    tiny, tmp_path, sqlite_uri, monkeypatch, caplog, capsys
):
    monkeypatch.chdir(tmp_path)
    overrides = tiny + [f"tracking.uri={sqlite_uri}", f"train.workdir={tmp_path / 'runs'}"]
    cfg = compose(overrides)
    workdir = default_workdir(cfg)
    uninterrupted = MemoryRecorder()
    train(compose(tiny), uninterrupted, tmp_path / "whole")
    client = MlflowClient(tracking_uri=sqlite_uri)

    # Damaged last.pt only (best.pt good), then both: restart from best.pt, then from step 0.
    for damage, restart in (([last_path], "from best.pt at step"), ([last_path, best_path], "from step 0")):

        def crash(step: int, metrics: dict, path: Path) -> None:
            if step == 30:
                raise Crash

        with pytest.raises(Crash):
            train(cfg, MlflowRecorder(sqlite_uri, EXPERIMENT), workdir, crash)
        truncate(last_path(workdir))
        if best_path in damage:
            garbage(best_path(workdir))
        assert (
            main(overrides + ["train.resume=must"]) == exit_codes.CHECKPOINT
        )  # strict: an error naming the file
        assert f"{last_path(workdir)} is unreadable" in capsys.readouterr().err
        caplog.clear()
        assert main(overrides) == 0  # the same command again
        assert f"checkpoint {last_path(workdir)} is unreadable" in caplog.text

        (run,) = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])  # continued
        assert (run.info.status, run.data.tags[OUTCOME]) == ("FINISHED", FINISHED)
        assert restart in run.data.tags[BAD_CHECKPOINT]
        points = stored(sqlite_uri, [run.info.run_id])
        assert points[run.info.run_id] == uninterrupted.metrics  # exact, no step twice, none lost
        figure(f"solo, damaged {' and '.join(p(workdir).name for p in damage)}", 1, 1, points, cfg)
        client.delete_run(run.info.run_id)  # the next round starts a new run


def test_a_pack_restarts_each_model_from_its_last_good_checkpoint(tmp_path, sqlite_uri, caplog):
    cfgs = [compose(PACKABLE + [f"seed={seed}"]) for seed in (153476998, 235510766)]
    whole = [MemoryRecorder() for _ in cfgs]
    train_pack(cfgs, whole, [tmp_path / f"whole{i}" for i in range(2)])

    def crash(step: int, evaluated: dict) -> None:
        if step == 9:
            raise Crash

    parts = [tmp_path / f"part{i}" for i in range(2)]
    with pytest.raises(Crash):
        train_pack(cfgs, [MlflowRecorder(sqlite_uri, EXPERIMENT) for _ in cfgs], parts, on_eval=crash)
    truncate(last_path(parts[0]))  # model 0: from best.pt; model 1: nothing good left, from step 0
    garbage(last_path(parts[1]))
    truncate(best_path(parts[1]))
    results = train_pack(cfgs, [MlflowRecorder(sqlite_uri, EXPERIMENT) for _ in cfgs], parts)
    for part in parts:
        assert f"checkpoint {last_path(part)} is unreadable" in caplog.text
    assert [r.outcome for r in results] == [FINISHED, FINISHED]

    client = MlflowClient(tracking_uri=sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(r.run_id for r in results)  # one run per model
    by_id = {r.info.run_id: r for r in runs}
    tags = [by_id[r.run_id].data.tags for r in results]
    assert "from best.pt at step" in tags[0][BAD_CHECKPOINT] and "from step 0" in tags[1][BAD_CHECKPOINT]
    points = stored(sqlite_uri, [r.run_id for r in results])
    # Every step once and none lost; the values to 1e-5, as packed against solo: the models now step at
    # different steps, and model 1 finishes alone, so the batched sums run in another order.
    for i, result in enumerate(results):
        for key, want in whole[i].metrics.items():
            got = points[result.run_id][key]
            assert [s for s, _ in got] == [s for s, _ in want], (i, key)
            torch.testing.assert_close([v for _, v in got], [v for _, v in want], rtol=1e-5, atol=1e-6)
        expected = load(last_path(tmp_path / f"whole{i}"))["model"]
        for name, tensor in load(last_path(parts[i]))["model"].items():
            torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6)
    figure("packed, damaged last.pt / both", 1, len(runs), points, cfgs[0])


# ONE_TRIAL (20 steps, checkpoints every 5) crashes before step 13 (the test-only fault), with no retry, so
# the sweep stops with its run unfinished and its Tune checkpoint (step 10) recorded.
@pytest.mark.slow
def test_a_sweep_trial_whose_tune_checkpoint_is_damaged_restarts_from_step_0(tmp_path, sqlite_uri, capfd):

    from sweeper.sweep import main as sweep_main

    uri = sqlite_uri
    overrides = [
        *ONE_TRIAL,
        f"tracking.uri={uri}",
        f"cluster.storage={tmp_path}/ray",
        "cluster.max_failures=0",
    ]
    (trial,) = sweep_jobs(ONE_TRIAL)
    with ray_local.own(num_cpus=1, env={CRASH_AT_STEP: f"13@{trial.key}"}):
        assert sweep_main(overrides) == 1  # failed after its retries
    (run,) = children(uri, "smoke")
    assert OUTCOME not in run.data.tags
    member = recorded_checkpoint(uri, run) / trial.key
    assert load(last_path(member))["step"] == 10
    truncate(last_path(member))
    garbage(best_path(member))
    capfd.readouterr()

    ray_local.shared()  # no fault this time
    assert sweep_main(overrides) == 0  # once: no crash loop on the damaged files
    out = capfd.readouterr()
    assert f"{last_path(member).name}" in out.err and "is unreadable" in out.err
    runs = children(uri, "smoke")
    assert [r.info.run_id for r in runs] == [run.info.run_id]  # the same run, continued
    assert (runs[0].info.status, runs[0].data.tags[OUTCOME]) == ("FINISHED", FINISHED)
    assert "from step 0" in runs[0].data.tags[BAD_CHECKPOINT]
    check_histories(MlflowClient(tracking_uri=uri), {trial.key: runs[0]}, [trial], [])  # exact, none lost
    points = stored(uri, [run.info.run_id])
    figure(
        "sweep, damaged Tune checkpoint",
        1,
        len(runs),
        points,
        compose(trial.configuration.override_strings()),
    )
