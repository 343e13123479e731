"""Keep freed host memory for reuse instead of handing it back to the OS at every step.

A training step on CPU allocates and frees tensors of a few MB each (activations,
the attention kernel's gradient buffers). glibc's malloc serves blocks that large
from fresh mappings and returns them when freed (it also trims the top of its
heap), so every step faults zeroed pages in again: a pack of 12 at n 128 took
1,500-6,000 minor page faults and 4-10 ms of system time a step. With mmap's
threshold at glibc's maximum (32 MB) and trimming off, freed blocks are reused:
about 200 faults and 0.6 ms a step (tests/test_host_memory.py counts them), and
two such packs side by side step 7% faster.

Memory stays with the process at its peak (what one step needs, not more), and
the numbers computed do not change: tensors are placed elsewhere, and torch aligns
every CPU tensor to 64 bytes either way (`make demo`'s medians are the same to
the last digit).
"""

from __future__ import annotations

import ctypes
import functools
import sys

# mallopt's parameters (glibc's malloc.h) and the values set.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit; larger blocks are still mapped
TRIM_THRESHOLD = 1 << 30  # never trim in practice


@functools.cache  # once per process: the setting is the process's
def keep_freed_memory() -> bool:
    """Have glibc's malloc reuse freed blocks up to 32 MB; False where the C library is not glibc (macOS,
    musl), which keeps its own behaviour."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
