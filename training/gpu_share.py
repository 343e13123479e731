"""A trial's share of its GPU: Ray schedules cluster.gpus_per_trial of a GPU, and the trial keeps to it.

Ray's fractions only schedule: ten trials at 0.1 GPU each share one device with nothing between them, and one
large pack could take the memory the others need. Each trial therefore caps its CUDA caching allocator at
its share of the device's memory (torch.cuda.set_per_process_memory_fraction): an allocation beyond it raises
torch.OutOfMemoryError in that trial alone, which Ray retries.
"""

from __future__ import annotations

import torch

from training.loop import cuda_index


def memory_fraction(device: torch.device, share: float) -> float | None:
    """The fraction of `device`'s memory a trial reserving `share` of a GPU may use; None: no cap (not CUDA,
    or a whole GPU or more)."""
    if device.type != "cuda" or not 0 < share < 1:
        return None
    return share


def cap_memory(device: torch.device, share: float) -> float | None:
    """Cap this process's CUDA allocations on `device` at its share (memory_fraction): the cap, or None."""
    fraction = memory_fraction(device, share)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, cuda_index(device))
    return fraction
