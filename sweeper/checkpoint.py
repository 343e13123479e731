"""Checkpoints of a training run: atomic writes, safe loads, the resume decision.

A run's workdir holds last.pt (written at every evaluation) and best.pt (the
evaluation with the lowest val_rel_lloyd so far). A checkpoint is a plain dict
of tensors and Python values (see sweeper.train.checkpoint_state), so it loads
with torch.load(weights_only=True).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sweeper.metrics import BEST_CHECKPOINT, LAST_CHECKPOINT


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says how to proceed."""


def save(state: dict, path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous file intact."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a damaged file
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
            "to discard it and start from scratch, run again with train.resume=never") from None
    if not isinstance(state, dict) or "step" not in state or "model" not in state:
        raise CheckpointError(f"checkpoint {path} is not a training checkpoint; "
                              "to start from scratch, run again with train.resume=never")
    return state


def last_path(workdir: Path) -> Path:
    return workdir / LAST_CHECKPOINT


def best_path(workdir: Path) -> Path:
    return workdir / BEST_CHECKPOINT


def resume_state(workdir: Path, mode: str, config: dict) -> dict | None:
    """The checkpoint to continue from, or None to start from scratch.

    mode auto: continue an unfinished run found in workdir (a finished one is
    not continued: running the same command again starts a new run);
    never: always start over; must: fail unless there is a run to continue.
    """
    path = last_path(workdir)
    if mode == "never":
        return None
    if not path.exists():
        if mode == "must":
            raise CheckpointError(f"train.resume=must but there is no checkpoint {path}")
        return None
    state = load(path)
    if state.get("config") != config:
        raise CheckpointError(f"checkpoint {path} belongs to a different configuration; use another "
                              "workdir, or train.resume=never to overwrite it")
    if state["step"] >= config["train"]["steps"]:
        if mode == "must":
            raise CheckpointError(f"train.resume=must but the run in {path} has already finished")
        return None
    return state
