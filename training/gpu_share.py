"""A trial's share of its GPU: Ray schedules cluster.gpus_per_trial of a GPU, and the trial keeps to it.

A trial that reserved a GPU trains on it (trial_device): with train.device auto or cuda it fails at its start,
in one line naming why, where CUDA does not initialise (a driver too old for the image's torch, no GPU
visible), instead of training on the CPU while it holds the GPU.

Ray's fractions only schedule: ten trials at 0.1 GPU each share one device with nothing between them, and one
large pack could take the memory the others need. Each trial therefore caps its CUDA caching allocator at
its share of the device's memory less its own CUDA context (torch.cuda.set_per_process_memory_fraction): an
allocation beyond it raises torch.OutOfMemoryError in that trial alone, which Ray retries. The context (CUDA's
own state, cuBLAS' and cuDNN's kernels) lives outside the allocator and its cap, so caps of the whole share
would add up, with ten contexts, to more than the device has.
"""

from __future__ import annotations

import torch

from training.device import cuda_index, pick_device


def trial_device(name: str, share: float) -> torch.device:
    """The device of a trial that reserved `share` of a GPU (cluster.gpus_per_trial) with train.device=`name`:
    pick_device's, except that with a GPU reserved auto and cuda must find CUDA (RuntimeError, one line,
    torch's reason, otherwise). An explicit cpu is taken as asked: a cluster whose GPUs are declared but
    absent (tests/test_sweep_cluster.py) trains there."""
    if share > 0 and name in ("auto", "cuda") and not torch.cuda.is_available():
        raise RuntimeError(
            f"this trial reserved cluster.gpus_per_trial={share:g} of a GPU, but CUDA is unavailable on its "
            f"node (train.device={name} would train on the CPU): {why_no_cuda()}"
        )
    return pick_device(name)


def why_no_cuda() -> str:
    """Torch's reason, on one line, for CUDA being unavailable: initialising it raises with it."""
    try:
        torch.cuda.init()
    except Exception as err:  # AssertionError on a CPU build, RuntimeError from the driver
        return " ".join(str(err).split())
    return "torch.cuda.is_available() is False"


# Room for one process's CUDA context beside its allocator's cap: an estimate (a few hundred MiB with CUDA
# 12's lazy module loading, more once cuBLAS and cuDNN load their kernels), not yet measured on a GPU here.
CONTEXT_BYTES = 768 * 2**20


def memory_fraction(device: torch.device, share: float, total: int) -> float | None:
    """The fraction of `device`'s memory (`total` bytes) a trial reserving `share` of a GPU may allocate: its
    share less CONTEXT_BYTES, so that the 1/share trials of a GPU fit with their contexts; None: no cap (not
    CUDA, or a whole GPU). RuntimeError, one line, when the share has no room beside a context."""
    if device.type != "cuda" or not 0 < share < 1:
        return None
    fraction = share - CONTEXT_BYTES / total
    if fraction <= 0:
        raise RuntimeError(
            f"cluster.gpus_per_trial={share:g} of this GPU's {total / 2**30:.1f} GiB leaves no memory beside "
            f"a process's CUDA context ({CONTEXT_BYTES // 2**20} MiB): reserve more than "
            f"{CONTEXT_BYTES / total:.3f} of it"
        )
    return fraction


def cap_memory(device: torch.device, share: float) -> float | None:
    """Cap this process's CUDA allocations on `device` at its share (memory_fraction): the cap, or None."""
    if device.type != "cuda":
        return None
    index = cuda_index(device)
    fraction = memory_fraction(device, share, torch.cuda.get_device_properties(index).total_memory)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction
