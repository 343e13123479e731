"""Fused CPU attention with dropout on the attention weights.

PyTorch's CPU flash-attention kernel has no dropout, so SDPA with
dropout_p > 0 falls back to the unfused math path (score matrix, softmax,
a dense Bernoulli mask: several times slower at n = 512). At the paper's
dropout (0.01) only 1% of the weights are dropped, so this computes

    Y = (A V - sum over dropped (i, j) of a_ij v_j) / (1 - p)

with A V from the flash kernel and the correction over the dropped pairs
only, and the backward pass likewise: the flash backward, given the
post-dropout output, yields every gradient term but those of the dropped
pairs, which are subtracted sparsely. The dropped pairs are a Bernoulli(p)
process over the weights drawn from the global generator (geometric gaps),
the same distribution as torch's dense dropout mask, not the same draws.

The two flash kernels are private aten ops, not a stable API: a torch build
may lack them or change what they compute. So models.attention takes this
path only when `flash_dropout_usable()` says so: the ops exist and a
self-check on tiny tensors agrees with dense attention, in values and
gradients. Otherwise it falls back to the public
F.scaled_dot_product_attention with dropout_p. The decision is taken once per
process, logged in one line, and depends only on the torch build (the check
uses fixed inputs and its own generator), so a configuration and seed give
the same numbers in every process of that build.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from typing import Callable

import torch

log = logging.getLogger(__name__)
PRIVATE_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
)
# float32 values and gradients of order 1: rounding is ~1e-6, a kernel computing something else is off by far
# more.
SELF_CHECK_TOL = 1e-4
_usable: bool | None = None  # flash_dropout_usable()'s answer, once decided in this process


@functools.cache
def flash_ops() -> tuple[Callable, Callable]:
    """The CPU flash forward and backward; AttributeError where this torch build lacks one."""
    return tuple(getattr(torch.ops.aten, name).default for name in PRIVATE_OPS)


def dropped_positions(total: int, p: float) -> torch.Tensor:
    """Flat indices in [0, total) of a Bernoulli(p) process: cumulative geometric gaps."""
    expected = total * p
    chunk = int(expected + 6 * math.sqrt(expected) + 16)  # almost always one chunk suffices
    parts, end = [], 0
    while end < total:
        gaps = torch.empty(chunk, dtype=torch.float64).geometric_(p).to(torch.int64)
        positions = gaps.cumsum(0) + (end - 1)
        parts.append(positions)
        end = int(positions[-1]) + 1
    positions = torch.cat(parts)
    return positions[positions < total]


def _csr(
    rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """The sparse matrix with `values` at (rows, cols), rows sorted, in CSR form.

    CSR products (sparse @ dense, and dense @ dense sampled at the pattern) are
    far faster on CPU than gathering rows (index_select, then a reduction over a
    short last axis) and scattering them back (index_add_).
    """
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.bincount(rows, minlength=shape[0]).cumsum(0)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the two products used here are stable
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, values, shape, check_invariants=False)


def _sampled_dots(pattern: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a_r . b_c at each (r, c) of the pattern, in its order."""
    return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0).values()


class FlashDropout(torch.autograd.Function):
    """q (N, 1, L, E), k and v (N, 1, S, E), flat dropped pair indices (sorted) into (N, L, S).

    The dropped pairs form a sparse (N L) x (N S) matrix over the flattened
    query and key rows; its products with dense rows are the corrections.
    """

    @staticmethod
    def forward(ctx, q, k, v, scale: float, p: float, dropped: torch.Tensor):
        out, lse = flash_ops()[0](q, k, v, scale=scale)
        N, _, L, E = q.shape
        S = k.shape[2]
        rows_q = dropped // S  # row b * L + i of the flattened queries (sorted, as `dropped` is)
        rows_k = dropped // (L * S) * S + dropped % S  # row b * S + j of the flattened keys
        qf, kf, vf = q.reshape(N * L, E), k.reshape(N * S, E), v.reshape(N * S, E)
        pattern = _csr(rows_q, rows_k, torch.zeros_like(rows_q, dtype=q.dtype), (N * L, N * S))
        a = torch.exp(scale * _sampled_dots(pattern, qf, kf) - lse.reshape(N * L)[rows_q])  # dropped weights
        # In place (addmm_) on fresh kernel outputs: faster than a product and a subtraction, same bits.
        kept = (
            out.reshape(N * L, E).addmm_(_csr(rows_q, rows_k, a, (N * L, N * S)), vf, alpha=-1).view_as(out)
        )
        ctx.save_for_backward(q, k, v, kept, lse, rows_q, rows_k, a)
        ctx.scale, ctx.p = scale, p
        return kept / (1 - p)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, kept, lse, rows_q, rows_k, a = ctx.saved_tensors
        scale = ctx.scale
        g = (grad / (1 - ctx.p)).contiguous()
        # Given the post-dropout output, the flash backward's row terms (g_i . out_i) are already right.
        dq, dk, dv = flash_ops()[1](g, q, k, v, kept, lse, 0.0, False, scale=scale)
        N, _, L, E = q.shape
        S = k.shape[2]
        qf, kf, vf, gf = q.reshape(N * L, E), k.reshape(N * S, E), v.reshape(N * S, E), g.reshape(N * L, E)
        shape, shape_t = (N * L, N * S), (N * S, N * L)
        # Minus the score gradient the dropped pairs got from the flash backward.
        ds = a * _sampled_dots(_csr(rows_q, rows_k, torch.zeros_like(a), shape), gf, vf) * -scale
        order = torch.argsort(rows_k, stable=True)  # the transposed pattern, rows sorted
        t_rows, t_cols = rows_k[order], rows_q[order]
        dq = dq.reshape(N * L, E).addmm_(_csr(rows_q, rows_k, ds, shape), kf)
        dk = dk.reshape(N * S, E).addmm_(_csr(t_rows, t_cols, ds[order], shape_t), qf)
        dv = dv.reshape(N * S, E).addmm_(_csr(t_rows, t_cols, a[order], shape_t), gf, alpha=-1)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None, None, None


def flash_dropout_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, p: float
) -> torch.Tensor:
    """softmax(scale q k^T) with dropout p, times v; q, k, v of equal width, any batch dims, CPU."""
    batch = q.shape[:-2]
    L, S = q.shape[-2], k.shape[-2]
    q4, k4, v4 = (t.reshape(-1, 1, *t.shape[-2:]).contiguous() for t in (q, k, v))
    dropped = dropped_positions(q4.shape[0] * L * S, p)
    return FlashDropout.apply(q4, k4, v4, scale, p, dropped).view(*batch, L, v.shape[-1])


def self_check_error() -> float:
    """Largest gap between the fused path and dense attention with the same mask, over values and gradients.

    Fixed sizes, dropped pairs and a private generator: the answer depends on the torch build only, and the
    global RNG (model initialisation, dropout draws) is left as it was.
    """
    gen = torch.Generator().manual_seed(0)
    N, L, S, E, p, scale = 2, 5, 7, 4, 0.3, 0.8
    with torch.inference_mode(False), torch.enable_grad():  # whatever mode the first caller is in
        dropped = torch.tensor([0, 3, 11, 12, 30, 36, 47, 55, 69])  # sorted flat indices into (N, L, S)
        mask = torch.ones(N * L * S).index_fill_(0, dropped, 0.0).view(N, 1, L, S)
        q, k, v = (torch.randn(N, 1, n, E, generator=gen, requires_grad=True) for n in (L, S, S))
        dense = (torch.softmax(scale * q @ k.transpose(-1, -2), -1) * mask) @ v / (1 - p)
        fused = FlashDropout.apply(q, k, v, scale, p, dropped)
        w = torch.randn(dense.shape, generator=gen)
        # The gradients of sum(out * w) are the vector-Jacobian products with w; a scalar output spares
        # autograd's check of given output gradients, whose first use imports sympy (0.6 CPU-s a process).
        grads = zip(*(torch.autograd.grad((out * w).sum(), (q, k, v)) for out in (fused, dense)))
        return max((a - b).abs().max().item() for a, b in [(fused, dense), *grads])


def _decide() -> bool:
    """Whether the private ops exist and pass the self-check; logs the path taken and why, in one line."""
    try:
        flash_ops()
        error = self_check_error()
    except Exception as err:  # a private API may be missing or break in any way: each means "not usable"
        first_line = str(err).partition("\n")[0]
        why = f"its private aten ops are missing or fail ({type(err).__name__}: {first_line})"
    else:
        if error <= SELF_CHECK_TOL:
            log.info(
                f"attention dropout: the fused CPU flash path, because its private aten ops exist in torch "
                f"{torch.__version__} and its self-check is within {SELF_CHECK_TOL:g} of dense attention"
            )
            return True
        why = (
            f"its self-check is off dense attention by {error:.3g} > {SELF_CHECK_TOL:g}"  # NaN lands here too
        )
    log.warning(
        f"attention dropout: public scaled_dot_product_attention (on CPU its slower math path), not the "
        f"fused CPU flash path, because in torch {torch.__version__} {why}"
    )
    return False


def flash_dropout_usable() -> bool:
    """Whether CPU attention dropout may take the fused path; decided (and logged) once per process."""
    global _usable
    if _usable is None:
        _usable = _decide()
    return _usable


@functools.cache  # once per process: marking the marked versions again would wrap them twice
def keep_eager_under_compile() -> None:
    """Have torch.compile (train.compile) call dropped_positions (a data-dependent loop) and
    flash_dropout_usable (a Python-side decision) as they are, not trace them.

    Done when a compile is asked for (training.fused.compiled), not with a decorator at import:
    torch.compiler.disable imports torch._dynamo (seconds of CPU: `python -X importtime -c 'import
    torch._dynamo'`) in every process that imports the models: each sweep trial, the report and the
    claims, none of which compiles (training keeps no torch Optimizer for the same reason: training.adam).
    Callers reach both through this module's attributes, so the marked versions are the ones they call.
    """
    global dropped_positions, flash_dropout_usable
    dropped_positions = torch.compiler.disable(dropped_positions)
    flash_dropout_usable = torch.compiler.disable(flash_dropout_usable)
