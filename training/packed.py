"""Packed training: several models that share shapes take one fused step (training.fused).

A pack is, e.g., the ten seeds of one configuration, or configurations that
differ only in loss (tau, regularizer), learning rate or task distribution
(family, scale, ...). Each model keeps everything sweeper.train gives a solo
run: the same loop (training.loop.train_models; a solo run is a pack of one)
with its own weights and initialisation, Adam state, ReduceLROnPlateau, task
stream (its own generator, the same draws as alone), validation set,
divergence handling, checkpoints and recorder (MLflow) run. The work is
shared: the weights of the P models are held stacked, so each projection is
one batched matmul over all models' tokens, attention runs once over the
P * batch tasks, and one loss and one Adam update cover the pack.

Packed equals solo (tests/test_packed.py, to 1e-5) with model.dropout=0.
With dropout > 0 the dropout draws of a pack come from the global RNG in
one piece, so they differ from the same model's solo draws (same
distribution; the pack itself is deterministic).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from config.identity import config_hash
from config.schema import SHARED_KEYS
from tracking.recorder import Recorder
from training.fused import StepHook
from training.loop import OnRound, TrainResult, train_models


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


def train_pack(
    cfgs: list[DictConfig],
    recorders: list[Recorder],
    workdirs: list[Path],
    on_eval: OnRound | None = None,
    hook: StepHook | None = None,
) -> list[TrainResult]:
    """Train the models of a pack together; result i is train(cfgs[i], recorders[i], workdirs[i])'s (to 1e-5).

    A pack of one is a solo run (exactly train()'s numbers). The loop,
    on_eval(step, {workdir: metrics}) and hook as training.loop.train_models.
    """
    if not len(cfgs) == len(recorders) == len(workdirs):
        raise ValueError(
            f"a pack needs one recorder and one workdir per configuration, got {len(cfgs)} "
            f"configurations, {len(recorders)} recorders, {len(workdirs)} workdirs"
        )
    check_packable(cfgs)
    return train_models(cfgs, recorders, [Path(w) for w in workdirs], on_eval, hook)
