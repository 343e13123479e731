"""Checkpoints of a training run: atomic writes, safe loads, the resume decision.

A run's workdir holds last.pt (written at every evaluation), best.pt (the
evaluation with the lowest val_rel_lloyd so far) and run_id (its tracking
run). A checkpoint is a plain dict of tensors and Python values
(training.trainer.Trainer.state), so it loads with torch.load(weights_only=True).

A damaged last.pt (truncated, overwritten, not a checkpoint) is an error
only when the user asked to continue it strictly (train.resume=must; exit 5
on the command line). Otherwise (auto, the default, and every sweep trial)
the error is logged naming the file, and training restarts in the same
tracking run from best.pt when it is good, else from step 0, with the tag
metrics.BAD_CHECKPOINT. Training is deterministic, so the replayed steps
give the numbers they gave before (recorders skip the points already
stored), and a retried trial cannot loop on a file it cannot read.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from cli import exit_codes
from tracking.names import BEST_CHECKPOINT, LAST_CHECKPOINT

RUN_ID_FILE = "run_id"
log = logging.getLogger(__name__)


class CheckpointError(RuntimeError, exit_codes.CommandError):
    """A checkpoint that cannot be used; the message says how to proceed."""

    exit_code = exit_codes.CHECKPOINT


@dataclass
class Resume:
    """Where a run continues: from `state` (None: step 0) in the tracking run `run_id` (None: a new run)."""

    state: dict | None = None
    run_id: str | None = None
    damaged: str | None = (
        None  # what was damaged and where training restarts (the tag metrics.BAD_CHECKPOINT)
    )


def save(state: dict, path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous file intact."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path) -> dict:
    """The checkpoint at path; CheckpointError naming the file when it is missing, damaged or something
    else."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a damaged file
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({type(err).__name__}: "
            f"{str(err).splitlines()[0].split('. ')[0][:200]})"
        ) from None
    if not isinstance(state, dict) or "step" not in state or "model" not in state:
        raise CheckpointError(f"checkpoint {path} is not a training checkpoint")
    return state


def cuda_rng_states(saved: list, saved_device: int | None, visible: int, device: int | None) -> dict:
    """Which CUDA RNG state of a checkpoint goes on which GPU of this process: {visible index: state}.

    saved: the per-GPU states at the checkpoint (torch.cuda.get_rng_state_all(), by the visible index then);
    saved_device: the index that trained then, device the one that trains now (None: not CUDA, or a
    checkpoint that did not record it); visible: how many GPUs this process sees. The training GPU's state
    follows training, from saved_device to device: it draws the dropout masks, so the numbers depend on it.
    Every other state returns to the GPU of its index where that exists, and is dropped where it does not
    (a node with fewer GPUs, or Ray's CUDA_VISIBLE_DEVICES): those GPUs draw nothing for this run.
    """
    states = dict(enumerate(saved[:visible]))
    if device is not None and saved_device is not None and saved_device < len(saved) and device < visible:
        states[device] = saved[saved_device]
    return states


def last_path(workdir: Path) -> Path:
    return workdir / LAST_CHECKPOINT


def best_path(workdir: Path) -> Path:
    return workdir / BEST_CHECKPOINT


def remember_run(workdir: Path, run_id: str) -> None:
    """Keep the run id beside the checkpoints: a run whose checkpoints are all damaged is still continued."""
    (workdir / RUN_ID_FILE).write_text(run_id)


def resume_state(workdir: Path, mode: str, config: dict) -> Resume:
    """Where to continue from (see the module docstring).

    mode auto: continue an unfinished run found in workdir (a finished one is
    not continued: running the same command again starts a new run);
    never: always start over; must: fail unless there is a run to continue.
    """
    path = last_path(workdir)
    if mode == "never":
        return Resume()
    if not path.exists():
        if mode == "must":
            raise CheckpointError(f"train.resume=must but there is no checkpoint {path}")
        return Resume()
    try:
        state = load(path)
    except CheckpointError as err:
        if mode == "must":
            raise CheckpointError(
                f"{err}; train.resume=auto continues from the last good checkpoint, "
                "train.resume=never starts from scratch"
            ) from None
        log.error(f"{err}: not used")
        return fall_back(workdir, config)
    return continued(path, state, config, mode)


def continued(path: Path, state: dict, config: dict, mode: str) -> Resume:
    """Continue state (read from path) unless its run finished; an error if it is another configuration's."""
    if state.get("config") != config:
        raise CheckpointError(
            f"checkpoint {path} belongs to a different configuration; use another "
            "workdir, or train.resume=never to overwrite it"
        )
    if state["step"] >= config["train"]["steps"]:
        if mode == "must":
            raise CheckpointError(f"train.resume=must but the run in {path} has already finished")
        return Resume()
    return Resume(state, state["run_id"])


def fall_back(workdir: Path, config: dict) -> Resume:
    """last.pt is damaged: the same run from best.pt when it is good, else from step 0."""
    best = best_path(workdir)
    try:
        resume = continued(best, load(best), config, "auto")
    except CheckpointError as err:
        log.error(f"{err}: not used")
        run_file = workdir / RUN_ID_FILE
        resume = Resume(None, run_file.read_text() if run_file.exists() else None)
        resume.damaged = f"{LAST_CHECKPOINT} damaged, no good {BEST_CHECKPOINT}; restarted from step 0"
    else:
        if resume.state is None:  # its run had finished: started again as a new run, as after a good last.pt
            return resume
        resume.damaged = (
            f"{LAST_CHECKPOINT} damaged; restarted from {BEST_CHECKPOINT} at step {resume.state['step']}"
        )
    log.error(f"{workdir}: {resume.damaged}")
    return resume
