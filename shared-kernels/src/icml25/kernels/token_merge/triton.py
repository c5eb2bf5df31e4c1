"""ToMA: Token Merge with Attention for Diffusion Models — ICML 2025, P26: Triton token-merge kernels.

Two kernels, one program per group (tile) of ``n <= 256`` tokens, everything in float32:

* ``_facility_location_kernel``: the cosine-similarity matrix of the tile (``tl.dot`` over blocks of
  ``BLOCK_C`` features, rows pre-divided by their max |entry| and normalised with the Gram diagonal) stays
  on-chip and all ``k`` greedy iterations run in the same program (the torch reference launches ~4 kernels
  per iteration, so it is launch-bound for small tiles);
* ``_tile_soft_merge_kernel``: logits ``τ · X̂[S] X̂ᵀ``, the softmax over destinations, the row
  normalisation and ``M · V`` fused; ``A`` is written once (the unmerge ``Aᵀ y`` is a plain ``bmm``).

The matmuls use IEEE float32 (no TF32). Semantics, tie-breaking (lowest index) and the normalisation are
those of :mod:`icml25.kernels.token_merge.reference`. Imported lazily by ``icml25.kernels.token_merge``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _facility_location_kernel(
    x_ptr,  # [G, n, C] any float dtype, contiguous
    out_ptr,  # [G, k] int64
    n,
    C,
    k,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_N)
    valid = rows < n
    base = x_ptr + g * n * C
    # pass 1: the max |entry| of each row (overflow-safe normalisation, as the reference)
    amax = tl.zeros((BLOCK_N,), tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        msk = valid[:, None] & (cols[None, :] < C)
        xb = tl.load(base + rows[:, None] * C + cols[None, :], mask=msk, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(xb), axis=1))
    inv_amax = 1.0 / tl.maximum(amax, 1e-30)
    # pass 2: the Gram matrix of the rescaled rows
    gram = tl.zeros((BLOCK_N, BLOCK_N), tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        msk = valid[:, None] & (cols[None, :] < C)
        xb = tl.load(base + rows[:, None] * C + cols[None, :], mask=msk, other=0.0).to(tl.float32)
        xb = xb * inv_amax[:, None]
        gram += tl.dot(xb, tl.trans(xb), input_precision="ieee")
    eye = rows[:, None] == rows[None, :]
    sq = tl.sum(tl.where(eye, gram, 0.0), axis=1)
    inv = 1.0 / tl.maximum(tl.sqrt(sq), 1e-12)
    sim = gram * inv[:, None] * inv[None, :]
    sim = tl.where(valid[:, None] & valid[None, :], sim, 0.0)

    colsum = tl.sum(sim, axis=0)
    colsum = tl.where(valid, colsum, float("-inf"))
    j = tl.argmax(colsum, axis=0)
    tl.store(out_ptr + g * k, j.to(tl.int64))
    m = tl.sum(tl.where(rows[None, :] == j, sim, 0.0), axis=1)  # sim[:, j]
    chosen = rows == j
    for t in range(1, k):
        gain = tl.sum(tl.where(valid[:, None], tl.maximum(sim - m[:, None], 0.0), 0.0), axis=0)
        gain = tl.where(valid & (chosen == 0), gain, float("-inf"))
        v = tl.argmax(gain, axis=0)
        tl.store(out_ptr + g * k + t, v.to(tl.int64))
        m = tl.maximum(m, tl.sum(tl.where(rows[None, :] == v, sim, 0.0), axis=1))
        chosen = chosen | (rows == v)


@triton.jit
def _tile_soft_merge_kernel(
    x_ptr,  # [G, n, C]
    v_ptr,  # [G, n, Cv]
    dst_ptr,  # [G, d] int64
    merged_ptr,  # [G, d, Cv] float32
    a_ptr,  # [G, d, n] float32
    n,
    d,
    C,
    Cv,
    scale,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_N)
    rv = rows < n
    ds = tl.arange(0, BLOCK_D)
    dv = ds < d
    didx = tl.load(dst_ptr + g * d + ds, mask=dv, other=0)
    xbase = x_ptr + g * n * C
    # pass 1: the max |entry| of every token row and destination row
    ax = tl.zeros((BLOCK_N,), tl.float32)
    ay = tl.zeros((BLOCK_D,), tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        cm = cols[None, :] < C
        xb = tl.load(xbase + rows[:, None] * C + cols[None, :], mask=rv[:, None] & cm, other=0.0)
        yb = tl.load(xbase + didx[:, None] * C + cols[None, :], mask=dv[:, None] & cm, other=0.0)
        ax = tl.maximum(ax, tl.max(tl.abs(xb.to(tl.float32)), axis=1))
        ay = tl.maximum(ay, tl.max(tl.abs(yb.to(tl.float32)), axis=1))
    iax = 1.0 / tl.maximum(ax, 1e-30)
    iay = 1.0 / tl.maximum(ay, 1e-30)
    # pass 2: raw dot products and squared norms of the rescaled rows
    acc = tl.zeros((BLOCK_D, BLOCK_N), tl.float32)
    nx = tl.zeros((BLOCK_N,), tl.float32)
    ny = tl.zeros((BLOCK_D,), tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        cm = cols[None, :] < C
        xb = tl.load(xbase + rows[:, None] * C + cols[None, :], mask=rv[:, None] & cm, other=0.0)
        yb = tl.load(xbase + didx[:, None] * C + cols[None, :], mask=dv[:, None] & cm, other=0.0)
        xb = xb.to(tl.float32) * iax[:, None]
        yb = yb.to(tl.float32) * iay[:, None]
        acc += tl.dot(yb, tl.trans(xb), input_precision="ieee")
        nx += tl.sum(xb * xb, axis=1)
        ny += tl.sum(yb * yb, axis=1)
    inx = 1.0 / tl.maximum(tl.sqrt(nx), 1e-12)
    iny = 1.0 / tl.maximum(tl.sqrt(ny), 1e-12)
    logits = acc * iny[:, None] * inx[None, :] * scale
    logits = tl.where(dv[:, None], logits, float("-inf"))
    mx = tl.max(logits, axis=0)
    mx = tl.where(rv, mx, 0.0)
    p = tl.exp(logits - mx[None, :])
    p = tl.where(dv[:, None] & rv[None, :], p, 0.0)
    den = tl.sum(p, axis=0)
    A = p / tl.where(rv, den, 1.0)[None, :]
    tl.store(a_ptr + g * d * n + ds[:, None] * n + rows[None, :], A, mask=dv[:, None] & rv[None, :])
    rs = tl.sum(A, axis=1)
    M = A / tl.where(dv, rs, 1.0)[:, None]
    vbase = v_ptr + g * n * Cv
    for c0 in range(0, Cv, BLOCK_CV):
        cols = c0 + tl.arange(0, BLOCK_CV)
        cm = cols[None, :] < Cv
        vb = tl.load(vbase + rows[:, None] * Cv + cols[None, :], mask=rv[:, None] & cm, other=0.0)
        out = tl.dot(M, vb.to(tl.float32), input_precision="ieee")
        tl.store(merged_ptr + g * d * Cv + ds[:, None] * Cv + cols[None, :], out, mask=dv[:, None] & cm)


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _warps(block_n: int) -> int:
    return 4 if block_n <= 64 else 8


def facility_location_fwd(x: torch.Tensor, k: int) -> torch.Tensor:
    """Launch wrapper: ``x [G, n, C]`` (n <= 256) -> int64 ``[G, k]`` greedy facility-location picks."""
    G, n, C = x.shape
    x = x.contiguous()
    out = torch.empty(G, k, dtype=torch.int64, device=x.device)
    if G == 0:
        return out
    bn = _block(n)
    bc = min(64, _block(C)) if bn <= 128 else 32
    _facility_location_kernel[(G,)](x, out, n, C, k, BLOCK_N=bn, BLOCK_C=bc, num_warps=_warps(bn))
    return out


def tile_soft_merge_fwd(
    x: torch.Tensor, dst_idx: torch.Tensor, values: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch wrapper: ``(merged [G, d, Cv] float32, A [G, d, n] float32)`` (see the reference)."""
    G, n, C = x.shape
    d, Cv = dst_idx.shape[1], values.shape[2]
    x, values = x.contiguous(), values.contiguous()
    dst = dst_idx.to(torch.int64).contiguous()
    merged = torch.empty(G, d, Cv, dtype=torch.float32, device=x.device)
    A = torch.empty(G, d, n, dtype=torch.float32, device=x.device)
    if G == 0:
        return merged, A
    bn, bd = _block(n), _block(d)
    small = bn * bd <= 64 * 64
    bc = min(64 if small else 32, _block(C))
    bcv = min(64 if small else 32, _block(Cv))
    _tile_soft_merge_kernel[(G,)](
        x, values, dst, merged, A, n, d, C, Cv, float(scale),
        BLOCK_N=bn, BLOCK_D=bd, BLOCK_C=bc, BLOCK_CV=bcv, num_warps=_warps(max(bn, bd)),
    )  # fmt: skip
    return merged, A
