"""The host's reads of tensor values, counted (python -m bench gpu, tests/test_host_syncs.py).

On a GPU every read of a device value by the host waits for all the work queued before it, so a
training step that reads nothing keeps the GPU fed. The CPU has no such wait to observe; what can be
counted anywhere is the reads themselves, two ways:

- the Python methods that hand a tensor's values to the host (`Tensor.__bool__`, `item`, `tolist`,
  `__float__`, `__int__`, `__index__`, `cpu`, `numpy`), wrapped with counters while the block runs;
- the ATen ops that read values to the host within their kernel on CUDA (`multinomial` of one draw or
  without replacement checks its weights with `.item()`) or size their output by the values
  (`nonzero`, `masked_select`, ...), and `_local_scalar_dense` (`.item()` from C++), seen by a
  TorchDispatchMode outside the wrapped methods (so a read is counted once). A kernel's own nested
  calls are not dispatched to the mode: the ops that read inside are listed by name.

On CUDA, bench gpu also counts what torch.cuda.set_sync_debug_mode sees.
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from training.fused import Pack

READS = ("__bool__", "__float__", "__int__", "__index__", "item", "tolist", "cpu", "numpy")
# ATen ops that read values to the host on CUDA (a sync), with when: always, or for some arguments.
READING_OPS: dict[str, Callable[[tuple, dict], bool]] = {
    "_local_scalar_dense": lambda args, kwargs: True,
    "nonzero": lambda args, kwargs: True,
    "masked_select": lambda args, kwargs: True,
    "_unique2": lambda args, kwargs: True,
    "unique_consecutive": lambda args, kwargs: True,
    "unique_dim": lambda args, kwargs: True,
    "repeat_interleave": lambda args, kwargs: "output_size" not in kwargs,
    # ATen's path for one draw or none replaced checks the weights with .item() (twice).
    "multinomial": lambda args, kwargs: args[1] == 1 or not (args[2:3] or [kwargs.get("replacement")])[0],
}


class _ReadingOps(TorchDispatchMode):
    def __init__(self, counts: Counter, inside: list[int]) -> None:
        super().__init__()
        self.counts, self.inside = counts, inside

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        kwargs = kwargs or {}
        if not self.inside[0] and name in READING_OPS and READING_OPS[name](args, kwargs):
            self.counts[f"aten.{name}"] += 1
        return func(*args, **kwargs)


def _counting(method: Callable, name: str, counts: Counter, inside: list[int]) -> Callable:
    @functools.wraps(method)
    def read(self, *args, **kwargs):
        if not inside[0]:
            counts[name] += 1
        inside[0] += 1  # what the method does inside is this one read
        try:
            return method(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    return read


@contextmanager
def count_host_reads() -> Iterator[Counter]:
    """Counts, by method or op, the host's reads of tensor values while the block runs (in this thread)."""
    counts: Counter = Counter()
    inside = [0]
    originals = {name: getattr(torch.Tensor, name) for name in READS}
    for name, method in originals.items():
        setattr(torch.Tensor, name, _counting(method, name, counts, inside))
    try:
        with _ReadingOps(counts, inside):
            yield counts
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


@contextmanager
def cuda_syncs(on: bool) -> Iterator[list]:
    """The synchronizing CUDA calls torch.cuda.set_sync_debug_mode reports while the block runs, as caught
    warnings (inside ATen ops too); an empty list when `on` is False (no CUDA)."""
    if not on:
        yield []
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode("default")


def pack_reads(pack: Pack, steps: int, cuda: bool = False) -> dict:
    """Step `pack` as training does (Pack.read when due) and count: the host reads of its steps and of each
    read-back (count_host_reads), and on CUDA the synchronizing calls of its steps (cuda_syncs)."""
    out = {"steps": steps, "draw_steps": 0, "reads_in_steps": 0, "read_backs": 0, "reads_per_read_back": 0}
    out["cuda_syncs_in_steps"] = 0 if cuda else None
    for _ in range(steps):
        out["draw_steps"] += pack.taken % pack.chunk == 0
        with count_host_reads() as reads, cuda_syncs(cuda) as syncs:
            pack.step()
        out["reads_in_steps"] += sum(reads.values())
        if cuda:
            out["cuda_syncs_in_steps"] += sum("synchroniz" in str(w.message) for w in syncs)
        if pack.due():
            with count_host_reads() as reads:
                pack.read()
            out["read_backs"] += 1
            out["reads_per_read_back"] = max(out["reads_per_read_back"], sum(reads.values()))
    return out
