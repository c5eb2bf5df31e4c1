"""AsymRnR: Video DiT Acceleration with Asymmetric Reduction and Restoration — ICML 2025, P21: NN kernel.
The Triton nearest-neighbour kernel (tiled running argmax).

One program per (group, block of ``BLOCK_S`` sources). It streams over blocks of ``BLOCK_D`` destinations,
computes the score tile ``2⟨x, y⟩ − ‖y‖²`` (euclidean; ``⟨x, y⟩`` for dot and for cosine on pre-normalised
rows) with ``tl.dot`` over ``BLOCK_C`` feature slices in IEEE float32, takes the tile's max and first argmax
and replaces the running best only when strictly better, so ties keep the lowest destination index, as the
reference. The ``Ns × Nd`` matrix is never written. ``−‖x‖²`` (euclidean) is added by the launch wrapper.
Imported lazily by :mod:`icml25.kernels.nn_match`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _nn_kernel(
    x_ptr,  # [G, Ns, C] contiguous
    y_ptr,  # [G, Nd, C] contiguous
    ysq_ptr,  # [G, Nd] float32 (zeros for dot products)
    val_ptr,  # [G, Ns] float32
    idx_ptr,  # [G, Ns] int64
    ns,
    nd,
    C,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    s0 = tl.program_id(1) * BLOCK_S
    rows = s0 + tl.arange(0, BLOCK_S)
    rv = rows < ns
    xbase = x_ptr + g * ns * C
    ybase = y_ptr + g * nd * C
    best = tl.full((BLOCK_S,), float("-inf"), tl.float32)
    arg = tl.zeros((BLOCK_S,), tl.int64)
    for d0 in range(0, nd, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        dv = cols < nd
        acc = tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
        for c0 in range(0, C, BLOCK_C):
            cs = c0 + tl.arange(0, BLOCK_C)
            cm = cs < C
            xb = tl.load(xbase + rows[:, None] * C + cs[None, :], mask=rv[:, None] & cm[None, :], other=0.0)
            yb = tl.load(ybase + cols[:, None] * C + cs[None, :], mask=dv[:, None] & cm[None, :], other=0.0)
            acc += tl.dot(xb.to(tl.float32), tl.trans(yb.to(tl.float32)), input_precision="ieee")
        ysq = tl.load(ysq_ptr + g * nd + cols, mask=dv, other=0.0)
        score = 2.0 * acc - ysq[None, :]
        score = tl.where(dv[None, :], score, float("-inf"))
        tmax = tl.max(score, axis=1)
        targ = tl.argmax(score, axis=1, tie_break_left=True).to(tl.int64) + d0
        better = tmax > best
        best = tl.where(better, tmax, best)
        arg = tl.where(better, targ, arg)
    tl.store(val_ptr + g * ns + rows, best, mask=rv)
    tl.store(idx_ptr + g * ns + rows, arg, mask=rv)


def _block(n: int, lo: int = 16, hi: int = 64) -> int:
    return min(hi, max(lo, triton.next_power_of_2(max(n, 1))))


def nearest_neighbor_fwd(
    x: torch.Tensor, y: torch.Tensor, ysq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch wrapper: ``x [G, Ns, C]``, ``y [G, Nd, C]``, ``ysq [G, Nd]`` -> ``(max score, argmax)`` ``[G, Ns]``.

    The score is ``2⟨x, y⟩ − ysq``; pass ``ysq = ‖y‖²`` for euclidean matching (then subtract ``‖x‖²``) and
    zeros for dot products.
    """
    G, ns, C = x.shape
    nd = y.shape[1]
    x, y, ysq = x.contiguous(), y.contiguous(), ysq.float().contiguous()
    val = torch.empty(G, ns, dtype=torch.float32, device=x.device)
    idx = torch.empty(G, ns, dtype=torch.int64, device=x.device)
    if G == 0 or ns == 0:
        return val, idx
    bs, bd, bc = _block(ns), _block(nd), _block(C, hi=32)
    grid = (G, triton.cdiv(ns, bs))
    _nn_kernel[grid](x, y, ysq, val, idx, ns, nd, C, BLOCK_S=bs, BLOCK_D=bd, BLOCK_C=bc, num_warps=4)
    return val, idx
