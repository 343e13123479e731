"""Packed training: several models that share shapes take one vectorised step.

A pack is, e.g., the ten seeds of one configuration, or configurations that
differ only in loss (tau, regularizer), learning rate or task distribution
(family, scale, ...). Each model keeps everything sweeper.train gives a solo
run: the same loop (training.loop.train_models) with its own weights and
initialisation, Adam state, ReduceLROnPlateau, task stream (its own
generator, the same draws as alone), validation set, divergence handling,
checkpoints and recorder (MLflow) run. Only the forward/backward pass is
shared: the weights of the P models are stacked (P, out, in) so each
projection is one batched matmul over all models' tokens, and attention runs
once over the P * batch tasks.

Packed equals solo (tests/test_packed.py, to 1e-5) with model.dropout=0.
With dropout > 0 the dropout draws of a pack come from the global RNG in
one piece, so they differ from the same model's solo draws (same
distribution; the pack itself is deterministic).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf

from config.identity import config_hash
from models.attention import distance_attention
from models.embedding import embed
from models.transformer import ClusteringTransformer, layer_equation
from tracking.recorder import Recorder
from training.loop import OnRound, Trainer, TrainResult, compiled, solo_step, train_models, update

# Keys every model of a pack must share: they fix tensor shapes, the attention kernel and the step schedule.
SHARED_KEYS = (
    "task.n",
    "task.d",
    "task.k",
    "model.embedding",
    "model.gamma",
    "model.dropout",
    "model.qkv_mult",
    "train.steps",
    "train.batch",
    "train.eval_every",
    "train.log_every",
    "train.val_batches",
    "train.device",
    "train.compile",
)


def check_packable(cfgs: list[DictConfig]) -> None:
    """ValueError naming the first key on which the models of a pack differ."""
    if not cfgs:
        raise ValueError("a pack needs at least one configuration")
    for key in SHARED_KEYS:
        values = [OmegaConf.select(cfg, key) for cfg in cfgs]
        if any(v != values[0] for v in values):
            raise ValueError(
                f"{key} differs within the pack ({', '.join(map(repr, values))}): packed models "
                f"must share {', '.join(SHARED_KEYS)}"
            )
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


def _attend(
    models: list[ClusteringTransformer], name: str, queries: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """Attention module `name` of every model: queries (P, B, Lq, e), keys (P, B, Lk, e)."""
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
    _, C1 = layer_equation(partial(_attend, models), Xt, Ct)
    return C1[..., : models[0].d]


_COMPILED: dict[
    str, Callable
] = {}  # train.compile mode -> packed_forward through it, compiled once per process


def packed_step(trainers: list[Trainer]) -> list[tuple[float, float]]:
    """One optimizer step of every trainer at once; each gets (loss, sum of its parameters), as Trainer.step."""
    draws = [t.draw() for t in trainers]  # each from its own stream
    X = torch.stack([x for x, _ in draws])
    C0 = torch.stack([c for _, c in draws])
    mode = trainers[0].cfg.train.compile
    if mode not in _COMPILED:
        _COMPILED[mode] = compiled(packed_forward, mode)
    C1 = _COMPILED[mode]([t.model for t in trainers], X, C0)
    return update(trainers, [t.loss(X[i], C1[i]) for i, t in enumerate(trainers)])


def train_pack(
    cfgs: list[DictConfig], recorders: list[Recorder], workdirs: list[Path], on_eval: OnRound | None = None
) -> list[TrainResult]:
    """Train the models of a pack together; result i is what train(cfgs[i], recorders[i], workdirs[i]) returns.

    A pack of one is trained alone (exactly train()'s numbers). The loop and
    on_eval(step, {workdir: metrics}) as training.loop.train_models.
    """
    if not len(cfgs) == len(recorders) == len(workdirs):
        raise ValueError(
            f"a pack needs one recorder and one workdir per configuration, got {len(cfgs)} "
            f"configurations, {len(recorders)} recorders, {len(workdirs)} workdirs"
        )
    check_packable(cfgs)
    step = packed_step if len(cfgs) > 1 else solo_step
    return train_models(cfgs, recorders, [Path(w) for w in workdirs], step, on_eval)
