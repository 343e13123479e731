"""train.deterministic: the same configuration and seed give the same numbers on CUDA too.

A CPU run is reproducible at a fixed thread count (train.threads) as it is. Some CUDA kernels are not:
cuBLAS may split a product's reduction differently between calls unless CUBLAS_WORKSPACE_CONFIG fixes its
workspace, the memory-efficient attention backward splits the keys of long sequences (the paper's n 512)
and adds the parts with atomics, flash attention's backward likewise, and cuDNN's attention has no
deterministic backward. torch.use_deterministic_algorithms(True) (warn_only=False) makes scaled-dot-product
attention skip cuDNN and run the efficient and flash backward unsplit, switches index_add_, scatter_add_,
index_put_ and cumsum to their deterministic kernels, and raises on any op without one, so nothing
non-deterministic runs silently. TF32 is set off for matrix products and cuDNN alike, whatever torch's
defaults or an earlier call set: whether a product rounds its inputs to TF32 would otherwise depend on them
(and on the GPU: Ampere and later have TF32). Off (train.deterministic=false) trades that for speed, and
puts TF32 back as this process found it.

The promise is the same numbers from the same GPU model, driver, CUDA and torch: kernels are chosen per GPU
architecture, so another model may round differently (each run's gpu_model tag says which it had).
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

CUBLAS_WORKSPACE = ":4096:8"  # one of the two settings cuBLAS documents as reproducible
# TF32 as this process found it (torch's defaults, unless TORCH_ALLOW_TF32_CUBLAS_OVERRIDE or a caller changed
# them): what a run with the mode off gets, whatever ran before it in the process.
_TF32_FOUND = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


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
    matmul, cudnn = (False, False) if on else _TF32_FOUND
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1" if on else "0"
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = on
    # Filling every new tensor with NaN (the mode's default) only exposes reads of uninitialised memory,
    # which no step makes; it would cost a write of every buffer a step allocates.
    torch.utils.deterministic.fill_uninitialized_memory = False


def warn_if_compiled(mode: str, on: bool, device: torch.device) -> None:
    """Warn that a deterministic CUDA run compiled with train.compile=`mode` repeats unchecked.

    A warning, not a refusal: inductor (cudagraphs is inductor plus CUDA graphs) has a deterministic mode of
    its own, which set_deterministic turns on, and aot_eager runs torch's own kernels, so the pair is meant to
    repeat; but python -m bench gpu shows only eager runs repeating bit for bit. Refusing would take compiling
    away from deterministic runs (the default), and a validation could not see where train.device=auto lands.
    """
    if on and mode != "off" and device.type == "cuda":
        warnings.warn(
            f"train.compile={mode} with train.deterministic=true on CUDA: python -m bench gpu checks that "
            "eager runs repeat bit for bit, not compiled ones; compare two runs before relying on it",
            stacklevel=2,
        )
