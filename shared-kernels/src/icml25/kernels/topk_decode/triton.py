"""Triton kernels for the sparse top-k (prefix) decode and its backward.

Both kernels work on the prefix form (a plain decode is the one-level case ``ks = [k]``). One program owns
one sample ``b`` and one block of ``BLOCK_D`` output features, walks the level segments
``[bounds[l], bounds[l+1])`` in order and gathers ``BLOCK_K`` decoder rows at a time:

* forward: ``acc += Σ_j values[b, j] · W_dec[idx[b, j], dblock]``; ``acc`` is stored after each level, so all
  L reconstructions cost one pass over the ``k_max`` rows;
* backward: position ``j`` of level segment ``l`` feeds every level ``>= l``, so its upstream gradient is the
  suffix sum ``G[l] = Σ_{l' >= l} grad_out[l']`` (computed by the wrapper). Then
  ``dvalues[b, j] = <G[l, b], W_dec[idx[b, j]]>`` (partial dot products of the feature blocks are combined
  with atomics) and ``dW_dec[idx[b, j]] += values[b, j] · G[l, b]`` is a scatter-add (atomics, since
  different samples select the same latent).

Accumulation is in float32 whatever the storage dtype. Imported lazily by ``icml25.kernels.topk_decode``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl


@triton.jit
def _prefix_decode_fwd_kernel(
    values_ptr,  # [B, K]
    idx_ptr,  # [B, K] int64
    w_ptr,  # [n, d]
    bounds_ptr,  # [L + 1] int32: 0, ks[0], ..., ks[L-1]
    out_ptr,  # [L, B, d]
    B,
    K,
    d,
    L,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < d
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for level in range(L):
        start = tl.load(bounds_ptr + level)
        end = tl.load(bounds_ptr + level + 1)
        for j0 in range(start, end, BLOCK_K):
            offs_k = j0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < end
            rows = tl.load(idx_ptr + b * K + offs_k, mask=mask_k, other=0)
            vals = tl.load(values_ptr + b * K + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            w = tl.load(
                w_ptr + rows[:, None] * d + offs_d[None, :],
                mask=mask_k[:, None] & mask_d[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += tl.sum(vals[:, None] * w, axis=0)
        tl.store(out_ptr + (level * B + b) * d + offs_d, acc.to(out_ptr.dtype.element_ty), mask=mask_d)


@triton.jit
def _prefix_decode_bwd_kernel(
    gsuf_ptr,  # [L, B, d] float32 suffix-summed upstream gradient
    values_ptr,  # [B, K]
    idx_ptr,  # [B, K] int64
    w_ptr,  # [n, d]
    bounds_ptr,  # [L + 1] int32
    dvalues_ptr,  # [B, K] float32, zero-initialised
    dw_ptr,  # [n, d] float32, zero-initialised
    B,
    K,
    d,
    L,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < d
    for level in range(L):
        start = tl.load(bounds_ptr + level)
        end = tl.load(bounds_ptr + level + 1)
        g = tl.load(gsuf_ptr + (level * B + b) * d + offs_d, mask=mask_d, other=0.0)
        for j0 in range(start, end, BLOCK_K):
            offs_k = j0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < end
            mask_kd = mask_k[:, None] & mask_d[None, :]
            rows = tl.load(idx_ptr + b * K + offs_k, mask=mask_k, other=0)
            vals = tl.load(values_ptr + b * K + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rows[:, None] * d + offs_d[None, :], mask=mask_kd, other=0.0).to(tl.float32)
            # Partial <G, W_dec row> over this feature block; the blocks of one sample add up atomically.
            tl.atomic_add(dvalues_ptr + b * K + offs_k, tl.sum(w * g[None, :], axis=1), mask=mask_k)
            tl.atomic_add(
                dw_ptr + rows[:, None] * d + offs_d[None, :], vals[:, None] * g[None, :], mask=mask_kd
            )


def _launch_params(d: int) -> tuple[int, int]:
    block_d = min(128, triton.next_power_of_2(max(d, 16)))
    return 16, block_d


def _bounds(ks: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *ks], dtype=torch.int32, device=device)


def prefix_decode_fwd(
    values: torch.Tensor, idx: torch.Tensor, W_dec: torch.Tensor, ks: Sequence[int]
) -> torch.Tensor:
    """[L, B, d] prefix decodes (see :func:`icml25.kernels.topk_decode.topk_decode_prefix`)."""
    B, K = values.shape
    _n, d = W_dec.shape
    L = len(ks)
    out = torch.empty(L, B, d, dtype=W_dec.dtype, device=W_dec.device)
    if B == 0 or d == 0:
        return out.zero_()
    block_k, block_d = _launch_params(d)
    grid = (B, triton.cdiv(d, block_d))
    _prefix_decode_fwd_kernel[grid](
        values.contiguous(),
        idx.contiguous(),
        W_dec.contiguous(),
        _bounds(ks, W_dec.device),
        out,
        B,
        K,
        d,
        L,
        BLOCK_K=block_k,
        BLOCK_D=block_d,
    )
    return out


def prefix_decode_bwd(
    grad_out: torch.Tensor, values: torch.Tensor, idx: torch.Tensor, W_dec: torch.Tensor, ks: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients ``(dvalues [B, K], dW_dec [n, d])`` of the prefix decode for upstream ``grad_out`` [L, B, d]."""
    B, K = values.shape
    n, d = W_dec.shape
    L = len(ks)
    dvalues = torch.zeros(B, K, dtype=torch.float32, device=values.device)
    dw = torch.zeros(n, d, dtype=torch.float32, device=W_dec.device)
    if B > 0 and d > 0:
        # Entry j of level segment l contributes to levels l..L-1: its gradient is the suffix sum over levels.
        gsuf = grad_out.float().flip(0).cumsum(0).flip(0).contiguous()
        block_k, block_d = _launch_params(d)
        grid = (B, triton.cdiv(d, block_d))
        _prefix_decode_bwd_kernel[grid](
            gsuf,
            values.contiguous(),
            idx.contiguous(),
            W_dec.contiguous(),
            _bounds(ks, W_dec.device),
            dvalues,
            dw,
            B,
            K,
            d,
            L,
            BLOCK_K=block_k,
            BLOCK_D=block_d,
        )
    return dvalues.to(values.dtype), dw.to(W_dec.dtype)
