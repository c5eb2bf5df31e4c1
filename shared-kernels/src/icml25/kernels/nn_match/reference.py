"""AsymRnR: Video DiT Acceleration with Asymmetric Reduction and Restoration — ICML 2025, P21: NN reference.
Nearest-neighbour matching, the PyTorch reference (the specification and test oracle).

For each source token ``x_i`` the most similar destination token ``y_j`` and its similarity:

* ``"euclidean"``: ``s(x, y) = −‖x − y‖²`` computed as ``−(‖x‖² − 2⟨x, y⟩ + ‖y‖²)`` (one augmented matmul,
  as AsymRnR's matcher), clamped at 0 from above;
* ``"cosine"``: ``⟨x̂, ŷ⟩`` of the rows divided by their max |entry| and then by their norm (an all-zero row has
  similarity 0 with everything);
* ``"dot"``: ``⟨x, y⟩``.

Ties go to the **lowest destination index** (``argmax`` returns the first maximum). Arguments are not
validated here; the public op :func:`icml25.kernels.nn_match.nearest_neighbor` validates them.
"""

from __future__ import annotations

import torch


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (float32) divided by their max |entry| and then by their norm (overflow-safe)."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    x = x / amax
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def similarity_matrix_reference(x: torch.Tensor, y: torch.Tensor, metric: str = "euclidean") -> torch.Tensor:
    """Dense ``[..., Ns, Nd]`` similarity of sources ``x [..., Ns, C]`` to destinations ``y [..., Nd, C]`` (float32)."""
    if metric == "cosine":
        return unit_rows(x) @ unit_rows(y).transpose(-1, -2)
    xf, yf = x.float(), y.float()
    dot = xf @ yf.transpose(-1, -2)
    if metric == "dot":
        return dot
    xsq = (xf * xf).sum(-1, keepdim=True)
    ysq = (yf * yf).sum(-1)[..., None, :]
    return (2.0 * dot - xsq - ysq).clamp_max(0.0)


def nearest_neighbor_reference(
    x: torch.Tensor, y: torch.Tensor, metric: str = "euclidean"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(similarity [..., Ns] float32, index [..., Ns] int64)`` of each source's most similar destination.

    Materialises the full ``Ns × Nd`` matrix (the readable definition); ties to the lowest index.
    """
    sim = similarity_matrix_reference(x, y, metric)
    if sim.shape[-1] == 0 or sim.shape[-2] == 0:
        shape = sim.shape[:-1]
        return torch.empty(shape, device=x.device), torch.empty(shape, dtype=torch.int64, device=x.device)
    idx = sim.argmax(dim=-1)  # torch documents argmax as returning the first maximal index
    return sim.gather(-1, idx[..., None])[..., 0], idx


def nearest_neighbor_chunked_reference(
    x: torch.Tensor, y: torch.Tensor, metric: str = "euclidean", chunk: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same result as :func:`nearest_neighbor_reference` without the full ``Ns × Nd`` matrix.

    Streams over blocks of ``chunk`` destinations (and of ``chunk`` sources), keeping a running max and
    argmax; a later block replaces the running best only when strictly better, so ties keep the lowest
    index. Peak extra memory ``chunk² `` floats per leading index.
    """
    lead, ns, nd = x.shape[:-2], x.shape[-2], y.shape[-2]
    best = torch.full((*lead, ns), float("-inf"), device=x.device)
    arg = torch.zeros((*lead, ns), dtype=torch.int64, device=x.device)
    if ns == 0 or nd == 0:
        return best, arg
    if metric == "cosine":
        x, y, metric = unit_rows(x), unit_rows(y), "dot"
    for s0 in range(0, ns, chunk):
        xs = x[..., s0 : s0 + chunk, :]
        b, a = best[..., s0 : s0 + chunk], arg[..., s0 : s0 + chunk]
        for d0 in range(0, nd, chunk):
            sim = similarity_matrix_reference(xs, y[..., d0 : d0 + chunk, :], metric)
            val = sim.amax(dim=-1)
            idx = sim.argmax(dim=-1) + d0
            better = val > b
            b.copy_(torch.where(better, val, b))
            a.copy_(torch.where(better, idx, a))
    return best, arg
