"""Hadamard-rotation + grid vector quantization: fused Triton encode / decode kernels.

Imported lazily, only when the Triton backend is selected. One program handles ``BLOCK`` groups (rows of
``G`` values). The rotation is a ``tl.dot`` with a column-permuted Hadamard matrix ``P`` whose column
``k*M + m`` is Hadamard column ``m*d + k`` (``M = G // d``): after a reshape to ``(BLOCK, d, M)`` the
``d`` coordinates of sub-vector ``m`` sit on axis 1, so the nearest-grid search is a loop over the ``n``
grid points with elementwise work only. Decoding gathers the grid points into the same layout and
multiplies by ``P^T`` (the Hadamard matrix is symmetric). The dot products use ``input_precision="ieee"``
(no TF32), so results match the reference up to float32 summation order.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from icml25.kernels.hadamard_grid.reference import hadamard_matrix

BLOCK = 16  # groups per program; tl.dot needs >= 16 rows


@functools.lru_cache(maxsize=16)
def _permuted_hadamard(group: int, d: int, device: str) -> torch.Tensor:
    h = hadamard_matrix(group, device=device)
    m = group // d
    cols = torch.arange(group, device=device)
    # column k*M + m of P is column m*d + k of H
    src = (cols % m) * d + cols // m
    return h[:, src].contiguous()


@triton.jit
def _encode_kernel(
    x_ptr, p_ptr, grid_ptr, gnorm_ptr, idx_ptr, scale_ptr, n_rows, n_grid,
    D: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    M: tl.constexpr = G // D
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n_rows
    cols = tl.arange(0, G)
    x = tl.load(x_ptr + rows[:, None] * G + cols[None, :], mask=ok[:, None], other=0.0).to(tl.float32)

    # Scale = group norm, rounded to its float16 storage value before it is used (as the decoder sees it).
    s = tl.sqrt(tl.sum(x * x, axis=1)).to(tl.float16)
    tl.store(scale_ptr + rows, s, mask=ok)
    s32 = s.to(tl.float32)
    safe = tl.where(s32 > 0, s32, 1.0)

    p = tl.load(p_ptr + cols[:, None] * G + cols[None, :])  # (G, G) permuted Hadamard
    z = tl.dot(x, p, input_precision="ieee") / safe[:, None]
    z = tl.where(s32[:, None] > 0, z, 0.0)
    z3 = tl.reshape(z, (BLOCK, D, M))  # z3[:, k, m] = coordinate k of sub-vector m

    kk = tl.arange(0, D)
    best = tl.full((BLOCK, M), float("-inf"), tl.float32)
    best_idx = tl.zeros((BLOCK, M), tl.int32)
    for j in range(0, n_grid):
        g = tl.load(grid_ptr + j * D + kk)  # (D,)
        score = 2.0 * tl.sum(z3 * g[None, :, None], axis=1) - tl.load(gnorm_ptr + j)
        better = score > best  # strict: ties keep the lowest index, like torch.argmax
        best = tl.where(better, score, best)
        best_idx = tl.where(better, j, best_idx)
    mm = tl.arange(0, M)
    tl.store(idx_ptr + rows[:, None] * M + mm[None, :], best_idx, mask=ok[:, None])


@triton.jit
def _decode_kernel(
    idx_ptr, scale_ptr, p_ptr, grid_ptr, out_ptr, n_rows,
    D: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr, OUT_DTYPE: tl.constexpr,
):  # fmt: skip
    M: tl.constexpr = G // D
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n_rows
    mm = tl.arange(0, M)
    kk = tl.arange(0, D)
    cols = tl.arange(0, G)
    idx = tl.load(idx_ptr + rows[:, None] * M + mm[None, :], mask=ok[:, None], other=0)  # (BLOCK, M)
    zhat = tl.load(grid_ptr + idx[:, None, :] * D + kk[None, :, None])  # (BLOCK, D, M)
    zhat = tl.reshape(zhat, (BLOCK, G))
    # x = zhat_in_hadamard_order @ H = zhat_permuted @ P^T; load P transposed.
    pt = tl.load(p_ptr + cols[None, :] * G + cols[:, None])
    s = tl.load(scale_ptr + rows, mask=ok, other=0.0).to(tl.float32)
    x = tl.dot(zhat, pt, input_precision="ieee") * (s / G)[:, None]
    tl.store(out_ptr + rows[:, None] * G + cols[None, :], x.to(OUT_DTYPE), mask=ok[:, None])


_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def encode(x: torch.Tensor, grid: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`icml25.kernels.hadamard_grid.reference.encode` (same outputs)."""
    *lead, c = x.shape
    d = grid.shape[1]
    rows = x.reshape(-1, group).contiguous()
    n_rows = rows.shape[0]
    grid32 = grid.to(device=x.device, dtype=torch.float32).contiguous()
    gnorm = (grid32 * grid32).sum(-1).contiguous()
    idx = torch.empty(n_rows, group // d, dtype=torch.int32, device=x.device)
    scale = torch.empty(n_rows, dtype=torch.float16, device=x.device)
    p = _permuted_hadamard(group, d, str(x.device))
    if n_rows:
        _encode_kernel[(triton.cdiv(n_rows, BLOCK),)](
            rows, p, grid32, gnorm, idx, scale, n_rows, grid32.shape[0], D=d, G=group, BLOCK=BLOCK
        )
    return idx.reshape(*lead, c // group, group // d), scale.reshape(*lead, c // group)


def decode(
    idx: torch.Tensor, scale: torch.Tensor, grid: torch.Tensor, group: int, dtype: torch.dtype
) -> torch.Tensor:
    """Triton version of :func:`icml25.kernels.hadamard_grid.reference.decode` (same outputs)."""
    *lead, n_groups, m = idx.shape
    d = grid.shape[1]
    idx_rows = idx.reshape(-1, m).to(torch.int32).contiguous()
    n_rows = idx_rows.shape[0]
    out = torch.empty(n_rows, group, dtype=dtype, device=idx.device)
    grid32 = grid.to(device=idx.device, dtype=torch.float32).contiguous()
    p = _permuted_hadamard(group, d, str(idx.device))
    if n_rows:
        _decode_kernel[(triton.cdiv(n_rows, BLOCK),)](
            idx_rows, scale.reshape(-1).contiguous(), p, grid32, out, n_rows,
            D=d, G=group, BLOCK=BLOCK, OUT_DTYPE=_TL[dtype],
        )  # fmt: skip
    return out.reshape(*lead, n_groups * group)
