"""Packed training (training.packed, training.fused) equals each model trained alone (training.loop.train).

model.dropout=0: with dropout the pack draws its dropout masks in one piece
from the global RNG, so they cannot equal the solo draws (see training/packed.py).

Weights are compared as whole tensors, to 1e-5 of their norm: a batched matmul
rounds its batch entries 1 and up differently from a lone matmul at some odd
widths (measured with MKL at width 7: ~1e-7 relative in a weight gradient), and
Adam's steps carry that into near-zero weights at up to 4e-5 of their value
after 12 steps, while every metric still agrees to 1e-5.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support.configs import PACKABLE as TINY

from config.compose import compose
from config.identity import config_hash
from config.run import RunSpec
from models.stacked import StackedTransformer
from models.transformer import ClusteringTransformer
from tracking.names import DIVERGED, DIVERGED_AT, FINISHED, LR, OUTCOME, TRAIN_LOSS, VAL_KMEANS, VAL_REL_LLOYD
from tracking.recorder import MemoryRecorder
from training.adam import AdamState, PackedAdam
from training.checkpoint import last_path, load
from training.faults import Fault, Faults
from training.fused import Pack
from training.loop import train
from training.packed import check_packable, train_pack
from training.plateau import Plateau
from training.trainer import Trainer, Validation

# Two seeds of one configuration, and configurations differing in tau, regularizer, lr, family;
# the last one diverges (the test-only NaN fault, training.faults) at step 5 and must leave the others
# untouched.
MEMBERS = [
    ["seed=153476998"],
    ["seed=235510766"],
    ["seed=153476998", "loss.tau=0.1", "loss.regularizer=ne", "optim.lr=0.05", "task.family=laplace"],
    ["seed=205084180"],
]


def assert_weights_close(actual: dict, expected: dict) -> None:
    for name, tensor in expected.items():
        error = torch.linalg.vector_norm(actual[name] - tensor)
        assert error <= 1e-5 * torch.linalg.vector_norm(tensor) + 1e-7, name


@pytest.mark.parametrize("embedding", ["onehot", "binary", "none"])
def test_packed_models_equal_solo_models(tmp_path: Path, embedding: str) -> None:
    cfgs = [compose(TINY + extra + [f"model.embedding={embedding}"]) for extra in MEMBERS]
    faults = Faults(nan=Fault(5, frozenset({config_hash(cfgs[3])})))
    solo = [MemoryRecorder() for _ in cfgs]
    solo_results = [
        train(cfg, rec, tmp_path / f"solo{i}", hook=faults) for i, (cfg, rec) in enumerate(zip(cfgs, solo))
    ]
    packed = [MemoryRecorder() for _ in cfgs]
    packed_results = train_pack(cfgs, packed, [tmp_path / f"pack{i}" for i in range(len(cfgs))], hook=faults)

    assert [r.outcome for r in packed_results] == [FINISHED, FINISHED, FINISHED, DIVERGED]
    for i, (s, p, rs, rp) in enumerate(zip(solo, packed, solo_results, packed_results)):
        assert (rp.outcome, rp.step, rp.diverged_at) == (rs.outcome, rs.step, rs.diverged_at), i
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
        assert_weights_close(pack_state["model"], solo_state["model"])
    # The NaN at step 5 is read back at step 6 (log_every 2): recorded at 5, nothing logged from 5 on.
    assert packed[3].tags[OUTCOME] == DIVERGED and packed[3].tags[DIVERGED_AT] == "5"
    assert max(step for step, _ in packed[3].metrics[TRAIN_LOSS]) == 4
    # The schedule acted (patience 0), per model as alone (above); onehot's models plateau within 12 steps.
    if embedding == "onehot":
        assert any(v < cfgs[0].optim.lr for _, v in packed[0].metrics[LR])


def test_a_solo_run_is_a_pack_of_one(tmp_path: Path) -> None:
    cfg = compose(TINY + MEMBERS[2])
    alone, pack = MemoryRecorder(), MemoryRecorder()
    train(cfg, alone, tmp_path / "alone")
    train_pack([cfg], [pack], [tmp_path / "pack"])
    assert pack.metrics == alone.metrics


def test_packed_adam_equals_torch_adam() -> None:
    """training.adam against one torch.optim.Adam per model (its own lr), on the same gradients: to 1e-6."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (5,), (2, 4)]
    lrs = [0.01, 0.05, 0.001]
    models = [[torch.randn(s, generator=generator).requires_grad_() for s in shapes] for _ in lrs]
    torch_adams = [torch.optim.Adam(params, lr=lr) for params, lr in zip(models, lrs)]
    flat = torch.stack([torch.cat([p.detach().flatten() for p in params]) for params in models])
    adam = PackedAdam(flat, lrs)
    for step in range(30):
        grads = [[torch.randn(s, generator=generator) * 10.0 ** (step % 3 - 1) for s in shapes] for _ in lrs]
        for params, opt, gs in zip(models, torch_adams, grads):
            for p, g in zip(params, gs):
                p.grad = g
            opt.step()
        grad = torch.stack([torch.cat([g.flatten() for g in gs]) for gs in grads])
        adam.commit(flat, adam.propose(flat, grad), torch.ones(len(lrs), dtype=torch.bool))
        expected = torch.stack([torch.cat([p.detach().flatten() for p in params]) for params in models])
        torch.testing.assert_close(flat, expected, rtol=1e-6, atol=1e-6)
        if step == 9:  # a learning rate changes (its scheduler), and the state round-trips through torch's
            for opt in torch_adams:
                opt.param_groups[0]["lr"] /= 2
            adam.set_lrs([opt.param_groups[0]["lr"] for opt in torch_adams])
            # Its state in torch's format: equal to torch's own, and loadable by torch.optim.Adam.
            mine = AdamState([torch.Size(s) for s in shapes], lr=torch_adams[1].param_groups[0]["lr"])
            adam.store(1, mine)
            theirs = torch_adams[1].state_dict()
            assert mine.state_dict()["param_groups"] == theirs["param_groups"]
            for a, b in zip(mine.state_dict()["state"].values(), theirs["state"].values()):
                assert a.keys() == b.keys() and a["step"] == b["step"]
                torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=1e-6, atol=1e-12)
            torch.optim.Adam([torch.zeros(s) for s in shapes]).load_state_dict(mine.state_dict())
            back = AdamState(mine.shapes, lr=1.0)
            back.load_state_dict(theirs)  # torch's state (an older checkpoint's) loads into the pack
            adam.load(1, back)
    # A model not taken keeps its weights, moments and step count.
    before = flat.clone(), adam.exp_avg.clone(), adam.steps.clone()
    adam.commit(flat, adam.propose(flat, torch.ones_like(flat)), torch.tensor([True, False, True]))
    assert torch.equal(flat[1], before[0][1]) and torch.equal(adam.exp_avg[1], before[1][1])
    assert adam.steps[:, 0].tolist() == [31, 30, 31]


def test_plateau_schedule_equals_torchs_reduce_lr_on_plateau() -> None:
    """training.plateau against torch.optim.lr_scheduler.ReduceLROnPlateau on the same metrics (plateaus,
    improvements below and above the 1e-4 threshold, NaN, inf): the same rates, exactly, and state_dicts
    that load into each other."""
    generator = torch.Generator().manual_seed(0)
    metrics = torch.rand(120, generator=generator).tolist()
    metrics[40:70] = [0.5] * 30  # a long plateau: rates fall one after the other
    metrics[70:75] = [0.5 * (1 - 0.5e-4) ** i for i in range(5)]  # improvements within the threshold
    metrics[80], metrics[81] = math.nan, math.inf
    for factor, patience in ((0.5, 3), (0.1, 0), (0.9, 10)):
        reference = torch.optim.Adam([torch.zeros(1)], lr=0.01)
        torch_plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            reference, mode="min", factor=factor, patience=patience
        )
        adam = AdamState([torch.Size([1])], lr=0.01)
        plateau = Plateau(adam, factor, patience)
        for i, metric in enumerate(metrics):
            torch_plateau.step(metric)
            plateau.step(metric)
            assert adam.lr == reference.param_groups[0]["lr"], (factor, patience, i)
            assert plateau.state_dict() == torch_plateau.state_dict(), (factor, patience, i)
            if i == 60:  # checkpoints round-trip both ways mid-plateau
                twin = Plateau(AdamState(adam.shapes, adam.lr), factor, patience)
                twin.load_state_dict(torch_plateau.state_dict())
                torch_plateau.load_state_dict(plateau.state_dict())
                assert twin.state_dict() == plateau.state_dict()


def test_packed_forward_is_each_model_forward() -> None:
    torch.manual_seed(0)
    models = [ClusteringTransformer(3, 5, "binary", dropout=0.0, qkv_mult=2) for _ in range(3)]
    X, C = torch.rand(3, 2, 17, 3), torch.rand(3, 2, 5, 3)
    out = StackedTransformer(models).forward(X, C)
    for p, model in enumerate(models):
        torch.testing.assert_close(out[p], model(X[p], C[p]), rtol=1e-5, atol=1e-6)


def test_pack_validation_is_each_model_validation() -> None:
    """Pack.validate (all models in one pass) against each model's training.trainer.Validation, 3 steps in."""
    cfgs = [compose(TINY + extra) for extra in MEMBERS[:3]]
    device = torch.device("cpu")
    trainers = [Trainer(RunSpec.of(cfg), device) for cfg in cfgs]
    validations = [Validation(cfg, device) for cfg in cfgs]
    pack = Pack(trainers, validations)
    for _ in range(3):
        pack.step()
    for row in range(len(trainers)):
        pack.store(row)
    for metrics, trainer, validation in zip(pack.validate(), trainers, validations):
        expected = validation(trainer.model)
        assert metrics.keys() == expected.keys()
        for key, value in expected.items():
            assert metrics[key] == pytest.approx(value, rel=1e-5), key


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
        expected, got = load(last_path(tmp_path / f"whole{i}")), load(last_path(parts[i]))
        for name, tensor in got["model"].items():
            assert torch.equal(tensor, expected["model"][name]), name
        assert got["optimizer"]["state"].keys() == expected["optimizer"]["state"].keys()
        for mine, theirs in zip(got["optimizer"]["state"].values(), expected["optimizer"]["state"].values()):
            assert all(torch.equal(mine[key], theirs[key]) for key in ("step", "exp_avg", "exp_avg_sq"))


@pytest.mark.slow  # torch.compile
def test_compiled_training_equals_eager(tmp_path: Path) -> None:
    """train.compile (aot_eager: torch.compile's graph capture and autograd tracing, no code generation)
    changes no number, solo or packed: to 1e-6 (measured: equal)."""
    # A fresh compile: after this process compiled the step at other shapes (tests/test_gpu_check.py's check
    # does, in-process), torch.compile would trace these ones with dynamic shapes, 40 s instead of 8.
    torch._dynamo.reset()
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


@pytest.mark.slow  # torch.compile with code generation: a C++ compiler (g++), about 12 CPU-s warm
def test_inductor_training_equals_eager(tmp_path: Path) -> None:
    """train.compile=inductor (code generation: a GPU node's image has a compiler for it, docker/Dockerfile)
    trains the numbers eager trains, solo on the CPU: to 1e-5, the tolerance of other float32 reorderings
    (packed against solo; inductor fuses and reorders sums: measured 1.1e-7 after 6 steps)."""
    torch._dynamo.reset()  # a fresh compile at these shapes (see above)
    runs = {}
    for mode in ("off", "inductor"):
        runs[mode] = MemoryRecorder()
        cfg = compose(TINY + MEMBERS[0] + ["train.steps=6", f"train.compile={mode}"])
        train(cfg, runs[mode], tmp_path / mode)
    assert runs["inductor"].metrics.keys() == runs["off"].metrics.keys()
    for key, points in runs["off"].metrics.items():
        torch.testing.assert_close(runs["inductor"].metrics[key], points, rtol=1e-5, atol=1e-7)
