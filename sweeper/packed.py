"""Packed training: several models that share shapes take one vectorised step.

A pack is, e.g., the ten seeds of one configuration, or configurations that
differ only in loss (tau, regularizer), learning rate or task distribution
(family, scale, ...). Each model keeps everything sweeper.train gives a solo
run: its own weights and initialisation, Adam state, ReduceLROnPlateau,
task stream (its own generator, the same draws as alone), validation set,
divergence handling, checkpoints and recorder (MLflow) run. Only the
forward/backward pass is shared: the weights of the P models are stacked
(P, out, in) so each projection is one batched matmul over all models'
tokens, and attention runs once over the P * batch tasks.

Packed equals solo (tests/test_packed.py, to 1e-5) with model.dropout=0.
With dropout > 0 the dropout draws of a pack come from the global RNG in
one piece, so they differ from the same model's solo draws (same
distribution; the pack itself is deterministic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf

from models.attention import distance_attention
from models.embedding import embed
from models.losses import smoothed_objective
from models.transformer import ClusteringTransformer
from sweeper.config import config_hash
from sweeper.metrics import DIVERGED, DIVERGED_AT, FINISHED, OUTCOME, TRAIN_LOSS
from sweeper.tracking import Recorder
from sweeper.train import Trainer, TrainResult, Validation, close, compiled, evaluate, open_run
from tasks.sampler import sample_tasks

# Keys every model of a pack must share: they fix tensor shapes, the attention kernel and the step schedule.
SHARED_KEYS = ("task.n", "task.d", "task.k", "model.embedding", "model.gamma", "model.dropout", "model.qkv_mult",
               "train.steps", "train.batch", "train.eval_every", "train.log_every", "train.val_batches",
               "train.device", "train.compile")
MODULES = ("cax", "sax", "cac", "sac")

# Called after each round of evaluations with the step and {workdir: metrics} of the models that evaluated.
OnPackEval = Callable[[int, dict[Path, dict]], None]


def check_packable(cfgs: list[DictConfig]) -> None:
    """ValueError naming the first key on which the models of a pack differ."""
    if not cfgs:
        raise ValueError("a pack needs at least one configuration")
    for key in SHARED_KEYS:
        values = [OmegaConf.select(cfg, key) for cfg in cfgs]
        if any(v != values[0] for v in values):
            raise ValueError(f"{key} differs within the pack ({', '.join(map(repr, values))}): packed models "
                             f"must share {', '.join(SHARED_KEYS)}")
    hashes = [config_hash(cfg) for cfg in cfgs]
    if len(set(hashes)) < len(hashes):
        raise ValueError("the pack holds the same configuration and seed twice")


def _linear(x: torch.Tensor, layers: list[torch.nn.Linear]) -> torch.Tensor:
    """x (P, ..., in) through P linear maps at once: one batched matmul."""
    P, shape = x.shape[0], x.shape[1:-1]
    weight = torch.stack([layer.weight for layer in layers])  # (P, out, in); gradients flow to each model
    bias = torch.stack([layer.bias for layer in layers]).unsqueeze(1)  # (P, 1, out)
    out = torch.baddbmm(bias, x.reshape(P, -1, x.shape[-1]), weight.transpose(1, 2))
    return out.view(P, *shape, -1)


def _attend(models: list[ClusteringTransformer], name: str, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """One attention module of every model: queries (P, B, Lq, e), keys (P, B, Lk, e)."""
    mods = [getattr(m.layer, name) for m in models]
    first = mods[0]
    q = _linear(queries, [m.q for m in mods])
    k = _linear(keys, [m.k for m in mods])
    v = _linear(keys, [m.v for m in mods])
    p = first.dropout if first.training else 0.0
    h = distance_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), first.gamma, first.d_emb, p)
    h = h.view(*q.shape[:2], *h.shape[1:])
    return _linear(h, [m.out for m in mods]) if first.out is not None else h


def packed_forward(models: list[ClusteringTransformer], X: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """X (P, B, n, d), C (P, B, k, d) -> every model's new centers (P, B, k, d); model p sees X[p], C[p]."""
    P, B = X.shape[:2]
    Xt, Ct = embed(X.flatten(0, 1), C.flatten(0, 1), models[0].embedding)
    Xt, Ct = Xt.view(P, B, *Xt.shape[1:]), Ct.view(P, B, *Ct.shape[1:])
    X1 = Xt + _attend(models, "cax", Xt, Ct) + _attend(models, "sax", Xt, Xt)
    C1 = Ct + _attend(models, "cac", Ct, X1) + _attend(models, "sac", Ct, Ct)
    return C1[..., : models[0].d]


_COMPILED: dict[str, Callable] = {}  # train.compile mode -> packed_forward through it, compiled once per process


def packed_step(trainers: list[Trainer]) -> list[tuple[float, float]]:
    """One optimizer step of every trainer at once; each gets (loss, sum of its parameters), as Trainer.step."""
    for t in trainers:
        t.progress.step += 1
    draws = [sample_tasks(t.spec, t.cfg.train.batch, t.generator) for t in trainers]  # each its own stream
    device = trainers[0].device
    X = torch.stack([x for x, _ in draws]).to(device)
    C0 = torch.stack([c for _, c in draws]).to(device)
    mode = trainers[0].cfg.train.compile
    if mode not in _COMPILED:
        _COMPILED[mode] = compiled(packed_forward, mode)
    C1 = _COMPILED[mode]([t.model for t in trainers], X, C0)
    losses = []
    for i, t in enumerate(trainers):
        loss = smoothed_objective(X[i], C1[i], t.cfg.loss.tau, t.cfg.loss.regularizer).mean()
        if t.progress.step == t.nan_at_step:
            loss = loss * math.nan  # the test-only fault of Trainer.step
        losses.append(loss)
    for t in trainers:
        t.optimizer.zero_grad(set_to_none=True)
    # The models are independent, so the gradient of the sum is each model's own gradient.
    torch.stack(losses).sum().backward()
    for t in trainers:
        t.optimizer.step()
    totals = [torch.stack([p.detach().sum() for p in t.model.parameters()]).sum() for t in trainers]
    return [tuple(pair) for pair in torch.stack([torch.stack(losses).detach(), torch.stack(totals)], 1).tolist()]


@dataclass
class _Run:
    """One model of the pack with its tracking: what train() holds in local variables."""

    trainer: Trainer
    validation: Validation
    recorder: Recorder
    workdir: Path
    run_id: str
    result: TrainResult | None = None


def _open(cfg: DictConfig, recorder: Recorder, workdir: Path) -> _Run:
    """As sweeper.train.train before its loop: resume or start, open the recorder run."""
    workdir = Path(workdir)
    trainer, run_id = open_run(cfg, recorder, workdir)
    return _Run(trainer, Validation(cfg, trainer.device), recorder, workdir, run_id)


def _after_step(run: _Run, loss: float, total: float) -> bool:
    """Per model, what sweeper.train._loop does after each step (same order, same records); True if it evaluated."""
    t, p = run.trainer.cfg.train, run.trainer.progress
    if not (math.isfinite(loss) and math.isfinite(total)):
        close(run.trainer, run.recorder, run.workdir, {OUTCOME: DIVERGED, DIVERGED_AT: str(p.step)}, "FAILED")
        run.result = TrainResult(DIVERGED, p.step, p.metrics, p.best_val, run.run_id, diverged_at=p.step)
        return False
    p.window.append(loss)
    if p.step % t.log_every == 0:
        mean = sum(p.window) / len(p.window)
        run.recorder.log_metrics(p.step, {TRAIN_LOSS: mean})
        p.history.setdefault(TRAIN_LOSS, []).append([p.step, mean])
        p.window = []
    evaluated = p.step % t.eval_every == 0 or p.step == t.steps
    if evaluated:
        evaluate(run.trainer, run.validation, run.recorder, run.workdir, run.run_id)
    if p.step >= t.steps:
        close(run.trainer, run.recorder, run.workdir, {OUTCOME: FINISHED}, "FINISHED")
        run.result = TrainResult(FINISHED, p.step, p.metrics, p.best_val, run.run_id)
    return evaluated


def _tell(on_eval: OnPackEval | None, runs: list[_Run]) -> None:
    if on_eval is not None and runs:
        on_eval(min(run.trainer.progress.step for run in runs), {run.workdir: run.trainer.progress.metrics
                                                                 for run in runs})


def train_pack(cfgs: list[DictConfig], recorders: list[Recorder], workdirs: list[Path],
               on_eval: OnPackEval | None = None) -> list[TrainResult]:
    """Train the models of a pack together; result i is what train(cfgs[i], recorders[i], workdirs[i]) returns.

    A model that diverges is closed and leaves the pack; the others go on.
    on_eval(step, {workdir: metrics}) is called once after each round of
    evaluations (the models step together, so they evaluate together), when
    every evaluated model's checkpoint is written.
    """
    if not len(cfgs) == len(recorders) == len(workdirs):
        raise ValueError(f"a pack needs one recorder and one workdir per configuration, got {len(cfgs)} "
                         f"configurations, {len(recorders)} recorders, {len(workdirs)} workdirs")
    check_packable(cfgs)
    runs: list[_Run] = []
    try:
        for cfg, recorder, workdir in zip(cfgs, recorders, workdirs):
            runs.append(_open(cfg, recorder, workdir))
        fresh = [run for run in runs if run.trainer.progress.step == 0]
        for run in fresh:
            evaluate(run.trainer, run.validation, run.recorder, run.workdir, run.run_id)
        _tell(on_eval, fresh)
        active = [run for run in runs if run.trainer.progress.step < run.trainer.cfg.train.steps]
        while active:
            steps = packed_step([run.trainer for run in active])
            _tell(on_eval, [run for run, (loss, total) in zip(active, steps) if _after_step(run, loss, total)])
            active = [run for run in active if run.result is None]
    except BaseException as err:  # a crash or Ctrl-C: every unfinished run stays resumable
        for run in runs:
            if run.result is None:
                run.recorder.finish("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    return [run.result for run in runs]
