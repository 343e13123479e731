"""Packed training (training.packed) equals each model trained alone (training.loop.train).

model.dropout=0: with dropout the pack draws its dropout masks in one piece
from the global RNG, so they cannot equal the solo draws (see training/packed.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.configs import PACKABLE as TINY

from config.compose import compose
from config.identity import config_hash
from models.transformer import ClusteringTransformer
from tracking.names import DIVERGED, DIVERGED_AT, FINISHED, LR, OUTCOME, TRAIN_LOSS, VAL_KMEANS, VAL_REL_LLOYD
from tracking.recorder import MemoryRecorder
from training.checkpoint import last_path, load
from training.faults import NAN_AT_STEP
from training.loop import train
from training.packed import check_packable, packed_forward, train_pack

# Two seeds of one configuration, and configurations differing in tau, regularizer, lr, family;
# the last one diverges (the test-only NaN fault, training.faults) at step 5 and must leave the others
# untouched.
MEMBERS = [
    ["seed=153476998"],
    ["seed=235510766"],
    ["seed=153476998", "loss.tau=0.1", "loss.regularizer=ne", "optim.lr=0.05", "task.family=laplace"],
    ["seed=205084180"],
]


def test_packed_models_equal_solo_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfgs = [compose(TINY + extra) for extra in MEMBERS]
    monkeypatch.setenv(NAN_AT_STEP, f"5@{config_hash(cfgs[3])}")
    solo = [MemoryRecorder() for _ in cfgs]
    solo_results = [train(cfg, rec, tmp_path / f"solo{i}") for i, (cfg, rec) in enumerate(zip(cfgs, solo))]
    packed = [MemoryRecorder() for _ in cfgs]
    packed_results = train_pack(cfgs, packed, [tmp_path / f"pack{i}" for i in range(len(cfgs))])

    assert [r.outcome for r in packed_results] == [FINISHED, FINISHED, FINISHED, DIVERGED]
    for i, (s, p, rs, rp) in enumerate(zip(solo, packed, solo_results, packed_results)):
        assert (rp.outcome, rp.step, rp.diverged_at) == (rs.outcome, rs.step, rs.diverged_at), i
        # Every tag alike but the run name, which ends in the run's start time (unique names,
        # config.identity.run_name).
        assert p.tags.pop("name").rsplit("/", 1)[0] == s.tags.pop("name").rsplit("/", 1)[0]
        assert p.tags == s.tags and p.params == s.params and p.status == s.status
        assert sorted(p.artifacts) == sorted(s.artifacts)
        assert set(p.metrics) == set(s.metrics) >= {TRAIN_LOSS, VAL_KMEANS, VAL_REL_LLOYD, LR}
        for key, points in s.metrics.items():
            assert [step for step, _ in p.metrics[key]] == [step for step, _ in points], (i, key)
            torch.testing.assert_close(
                [v for _, v in p.metrics[key]], [v for _, v in points], rtol=1e-5, atol=1e-6
            )
        torch.testing.assert_close(rp.best_val, rs.best_val, rtol=1e-5, atol=1e-6)
        solo_state, pack_state = (
            load(last_path(tmp_path / f"solo{i}")),
            load(last_path(tmp_path / f"pack{i}")),
        )
        assert pack_state["step"] == solo_state["step"]
        for name, tensor in solo_state["model"].items():
            torch.testing.assert_close(pack_state["model"][name], tensor, rtol=1e-5, atol=1e-6)
    assert packed[3].tags[OUTCOME] == DIVERGED and packed[3].tags[DIVERGED_AT] == "5"
    # The learning rate was halved at least once (patience 0), per model on its own schedule.
    assert any(v < cfgs[0].optim.lr for _, v in packed[0].metrics[LR])


def test_packed_forward_is_each_model_forward() -> None:
    torch.manual_seed(0)
    models = [ClusteringTransformer(3, 5, "binary", dropout=0.0, qkv_mult=2) for _ in range(3)]
    X, C = torch.rand(3, 2, 17, 3), torch.rand(3, 2, 5, 3)
    out = packed_forward(models, X, C)
    for p, model in enumerate(models):
        torch.testing.assert_close(out[p], model(X[p], C[p]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "override, key",
    [("task.k=5", "task.k"), ("model.embedding=binary", "model.embedding"), ("train.steps=7", "train.steps")],
)
def test_pack_rejects_models_of_different_shapes(override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        check_packable([compose(TINY), compose(TINY + [override, "seed=1"])])
    with pytest.raises(ValueError, match="twice"):
        check_packable([compose(TINY), compose(TINY)])


class Interrupt(Exception):
    pass


def test_an_interrupted_pack_resumes_to_the_same_weights(tmp_path: Path) -> None:
    cfgs = [compose(TINY + extra) for extra in MEMBERS[:2]]
    whole = train_pack(cfgs, [MemoryRecorder() for _ in cfgs], [tmp_path / f"whole{i}" for i in range(2)])

    rounds = []

    def crash(step: int, evaluated: dict[Path, dict]) -> None:
        rounds.append((step, sorted(evaluated)))  # every model's checkpoint is on disk by now
        assert all(load(last_path(workdir))["step"] == step for workdir in evaluated)
        if step == 6:
            raise Interrupt

    parts = [tmp_path / f"part{i}" for i in range(2)]
    first = [MemoryRecorder() for _ in cfgs]
    with pytest.raises(Interrupt):
        train_pack(cfgs, first, parts, on_eval=crash)
    assert rounds == [(step, parts) for step in (0, 3, 6)]  # one call per round of evaluations
    assert all(rec.status == "FAILED" for rec in first)
    again = [MemoryRecorder() for _ in cfgs]
    resumed = train_pack(cfgs, again, parts)
    assert [r.outcome for r in resumed] == [FINISHED, FINISHED]
    assert min(step for step, _ in again[0].metrics[VAL_REL_LLOYD]) > 3  # continued, not restarted
    for i, (w, r) in enumerate(zip(whole, resumed)):
        assert r.metrics == w.metrics and r.best_val == w.best_val
        expected = load(last_path(tmp_path / f"whole{i}"))["model"]
        for name, tensor in load(last_path(parts[i]))["model"].items():
            assert torch.equal(tensor, expected[name]), name


@pytest.mark.slow  # torch.compile
def test_compiled_training_equals_eager(tmp_path: Path) -> None:
    """train.compile (aot_eager: torch.compile's graph capture and autograd tracing, no code generation)
    changes no number, solo or packed: to 1e-6 (measured: equal)."""
    base = TINY + ["train.steps=6"]
    runs = {}
    for mode in ("off", "aot_eager"):
        cfgs = [compose(base + extra + [f"train.compile={mode}"]) for extra in MEMBERS[:2]]
        solo = MemoryRecorder()
        train(cfgs[0], solo, tmp_path / f"solo-{mode}")
        pack = [MemoryRecorder() for _ in cfgs]
        train_pack(cfgs, pack, [tmp_path / f"pack-{mode}-{i}" for i in range(2)])
        runs[mode] = [solo, *pack]
    for eager, compiled in zip(runs["off"], runs["aot_eager"]):
        for key, points in eager.metrics.items():
            torch.testing.assert_close(compiled.metrics[key], points, rtol=1e-6, atol=1e-7)
