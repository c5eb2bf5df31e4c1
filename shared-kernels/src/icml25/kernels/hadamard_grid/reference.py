"""Hadamard-rotation + grid vector quantization (HIGGS-style): the plain PyTorch reference.

Each row of ``group`` values (``group`` a power of two) is encoded as

    s   = fp16(||x||)                                   # one scale per group, stored in float16
    z   = H x / s                                       # H: unnormalised +-1 Walsh-Hadamard (H H = group I)
    idx = argmax_j 2 <z_m, G_j> - ||G_j||^2             # each d-dim sub-vector z_m = z[m*d:(m+1)*d]

so ``z`` has coordinates of unit variance on average and each sub-vector is replaced by the index of the
nearest point of a grid ``G`` (``n`` points in ``d`` dims, optimised for N(0, I_d)). Decoding is the
inverse rotation: ``x_hat = H (G[idx] s) / group``. All arithmetic is float32; the scale is rounded to its
float16 storage value *before* ``z`` is computed, so encoder and decoder use the same number.
Ties in the argmax go to the lowest index (``torch.argmax``).
"""

from __future__ import annotations

import torch


def hadamard_matrix(size: int, *, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The unnormalised Sylvester Walsh-Hadamard matrix ``(size, size)`` with +-1 entries (symmetric)."""
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised fast Walsh-Hadamard transform along the last dim (a power of two): ``x @ H``.

    log2(size) butterfly stages of (a + b, a - b); ``fwht(fwht(x)) == size * x``.
    """
    size = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    y = x
    while h < size:
        # Pair element i with i + h inside blocks of 2h: (a, b) -> (a + b, a - b).
        y = y.reshape(*lead, size // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack([a + b, a - b], dim=-2)
        h *= 2
    return y.reshape(*lead, size)


def nearest(z: torch.Tensor, grid: torch.Tensor, chunk: int = 1 << 16) -> torch.Tensor:
    """Index of the nearest grid point of each d-dim row of ``z`` ``(r, d)`` -> int64 ``(r,)``.

    Uses ``argmax(2 z.G - |G|^2)`` (same ranking as the distance), in row chunks to bound memory.
    """
    gnorm = (grid * grid).sum(-1)
    out = []
    for start in range(0, z.shape[0], chunk):
        scores = 2.0 * z[start : start + chunk] @ grid.T - gnorm
        out.append(scores.argmax(-1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64, device=z.device)


@torch.no_grad()
def encode(x: torch.Tensor, grid: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode ``x`` ``(..., c)`` (``c % group == 0``) with grid ``(n, d)``.

    Returns:
        ``(idx, scale)``: int32 ``(..., c // group, group // d)`` grid indices and float16
        ``(..., c // group)`` group norms.
    """
    *lead, c = x.shape
    d = grid.shape[1]
    xg = x.reshape(*lead, c // group, group).to(torch.float32)
    scale = xg.norm(dim=-1).to(torch.float16)
    s = scale.to(torch.float32).unsqueeze(-1)
    z = fwht(xg) / torch.where(s > 0, s, torch.ones_like(s))
    z = torch.where(s > 0, z, torch.zeros_like(z))
    idx = nearest(z.reshape(-1, d), grid.to(torch.float32))
    return idx.reshape(*lead, c // group, group // d).to(torch.int32), scale


@torch.no_grad()
def decode(
    idx: torch.Tensor, scale: torch.Tensor, grid: torch.Tensor, group: int, dtype: torch.dtype
) -> torch.Tensor:
    """Inverse of :func:`encode`: int ``(..., n_groups, group // d)`` + ``(..., n_groups)`` -> ``(..., c)``."""
    *lead, n_groups, _ = idx.shape
    zhat = grid.to(torch.float32)[idx.long()].reshape(*lead, n_groups, group)
    x = fwht(zhat) * (scale.to(torch.float32).unsqueeze(-1) / group)
    return x.reshape(*lead, n_groups * group).to(dtype)
