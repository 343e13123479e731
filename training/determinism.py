"""train.deterministic: the same configuration and seed give the same numbers on CUDA too.

A CPU run is reproducible at a fixed thread count (train.threads) as it is. Some CUDA kernels are not:
cuBLAS may split a product's reduction differently between calls unless CUBLAS_WORKSPACE_CONFIG fixes its
workspace, the memory-efficient attention backward splits the keys of long sequences (the paper's n 512)
and adds the parts with atomics, flash attention's backward likewise, and cuDNN's attention has no
deterministic backward. torch.use_deterministic_algorithms(True) (warn_only=False) makes scaled-dot-product
attention skip cuDNN and run the efficient and flash backward unsplit, switches index_add_, scatter_add_,
index_put_ and cumsum to their deterministic kernels, and raises on any op without one, so nothing
non-deterministic runs silently. Off (train.deterministic=false) trades that for speed.
"""

from __future__ import annotations

import os
import sys

import torch

CUBLAS_WORKSPACE = ":4096:8"  # one of the two settings cuBLAS documents as reproducible


def set_deterministic(on: bool) -> None:
    """Deterministic kernels on or off for this process; call it before the run's first CUDA operation.

    CUBLAS_WORKSPACE_CONFIG is set either way (unless the user set it): torch sizes each cuBLAS
    workspace once per process, at its first product, so a later run of the same process that turns
    the mode on must find it already fixed. A user's own value is kept; torch rejects one that is not
    reproducible at the first product of a deterministic run.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    # torch.use_deterministic_algorithms(on) (warn_only=False) without its import of inductor's config, which
    # loads inductor and sympy (2-12 s of every trial's start, measured), for compiled runs only: inductor
    # takes the mode from the variable it reads when imported, or from its config once it is.
    torch.set_deterministic_debug_mode("error" if on else "default")
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1" if on else "0"
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = on
    # Filling every new tensor with NaN (the mode's default) only exposes reads of uninitialised memory,
    # which no step makes; it would cost a write of every buffer a step allocates.
    torch.utils.deterministic.fill_uninitialized_memory = False
