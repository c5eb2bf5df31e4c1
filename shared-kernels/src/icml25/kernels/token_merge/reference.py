"""ToMA: Token Merge with Attention for Diffusion Models — ICML 2025, P26: the PyTorch token-merge reference.

Lu, Zheng, Xia & Wang, "ToMA: Token Merge with Attention for Diffusion Models", ICML 2025 (arXiv
2509.10918; official code ``WenboLuu/ToMA``, ``toma/facility_location.py`` and ``toma/merge_methods.py``).
Plain PyTorch, the executable specification of the Triton kernels in ``triton.py`` and their test oracle;
arguments are not validated here (the public ops in :mod:`icml25.kernels.token_merge` validate).

Shapes: tokens ``x [G, n, C]`` (``G`` independent groups, e.g. tiles × batch), destinations
``dst_idx [G, d]`` (token indices within the group), values ``v [G, n, Cv]``.

*Similarity.* ``sim = X̂ X̂ᵀ`` with ``X̂`` the L2-normalised rows (cosine similarity). Rows are first divided by
their largest absolute entry, so that 1e30-scaled tokens do not overflow ``‖x‖²`` (the cosine is unchanged);
an all-zero row normalises to zero (cosine 0 with everything).

*Greedy facility location* (:func:`facility_location_greedy_reference`). ``F(S) = Σ_i max_{j∈S} sim(i, j)``.
First pick ``argmax_j Σ_i sim(i, j)``; then, with ``m_i = max_{j∈S} sim(i, j)``, pick
``argmax_{v∉S} Σ_i relu(sim(i, v) − m_i)`` and update ``m ← max(m, sim(:, v))`` until ``|S| = k``. Ties go to
the lowest index (``torch.argmax``); already chosen tokens are never picked again.

*Soft merge* (:func:`tile_soft_merge_reference`). ``A = softmax_over_destinations(τ · X̂[S] X̂ᵀ)`` ``[G, d, n]``
(every column sums to 1), merge matrix ``M = A / rowsum(A)`` (each destination is the weighted mean of its
soft members), merged values ``M v`` ``[G, d, Cv]``; unmerge is ``U = Aᵀ`` (``[G, n, d]``, rows sum to 1).
The softmax runs in float32 whatever the input dtype.

*ToMeSD-style baseline* (:func:`bipartite_soft_matching_2d_reference`): one random destination per
``sy × sx`` cell, every other token's most similar destination, the ``r`` most similar sources merged by
mean (``scatter_reduce``), unmerge by copying (Bolya & Hoffman, "Token Merging for Fast Stable Diffusion",
2023; ``dbolya/tomesd``, ``tomesd/merge.py``). It relies on argsort, gather and scatter, the data-dependent
ops that ToMA replaces by dense matmuls.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

__all__ = [
    "bipartite_soft_matching_2d_reference",
    "facility_location_bruteforce",
    "facility_location_greedy_reference",
    "facility_location_objective_reference",
    "normalize_rows",
    "tile_soft_merge_reference",
]


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """Row-wise L2-normalised float32 copy of ``x [..., C]`` (rows pre-divided by their max |entry|)."""
    x = x.float()
    x = x / x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-12)


def cosine_similarity_matrix(x: torch.Tensor) -> torch.Tensor:
    """``sim [G, n, n]`` of ``x [G, n, C]`` (float32)."""
    xn = normalize_rows(x)
    return xn @ xn.transpose(-1, -2)


def facility_location_objective_reference(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``F(S) = Σ_i max_{j∈S} sim(i, j)`` per group: ``x [G, n, C]``, ``idx [G, k]`` -> float32 ``[G]``."""
    sim = cosine_similarity_matrix(x)
    cols = sim.gather(2, idx[:, None, :].expand(-1, sim.shape[1], -1))  # [G, n, k]
    return cols.amax(dim=2).sum(dim=1)


def facility_location_greedy_reference(x: torch.Tensor, k: int) -> torch.Tensor:
    """Greedy facility-location selection of ``k`` tokens per group: ``x [G, n, C]`` -> int64 ``[G, k]``.

    Batched dense ops only (one matmul, then per step a ReLU, a sum, an argmax, a gather and a max; no
    sort, scatter or index_put); the indices are in selection order.
    """
    sim = cosine_similarity_matrix(x)
    G, n, _ = sim.shape
    tokens = torch.arange(n, device=x.device)

    def column(j: torch.Tensor) -> torch.Tensor:  # sim[g, :, j_g] -> [G, n] (sim is symmetric)
        return sim.gather(2, j[:, None, None].expand(G, n, 1))[..., 0]

    j = sim.sum(dim=1).argmax(dim=1)  # column sums Σ_i sim(i, j)
    picks, m, chosen = [j], column(j), tokens[None, :] == j[:, None]
    for _ in range(1, k):
        gain = torch.relu(sim - m[:, :, None]).sum(dim=1)  # [G, n]: Σ_i relu(sim(i, v) − m_i)
        j = gain.masked_fill(chosen, float("-inf")).argmax(dim=1)
        picks.append(j)
        chosen = chosen | (tokens[None, :] == j[:, None])
        m = torch.maximum(m, column(j))
    out = torch.stack(picks, dim=1) if picks else torch.empty(G, 0, dtype=torch.int64, device=x.device)
    return out


def facility_location_bruteforce(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact maximiser of ``F`` over all ``k``-subsets (tiny ``n`` only): ``(best value [G], best idx [G, k])``."""
    sim = cosine_similarity_matrix(x).double()
    G, n, _ = sim.shape
    best = torch.full((G,), float("-inf"), dtype=torch.float64)
    best_idx = torch.zeros(G, k, dtype=torch.int64)
    for subset in itertools.combinations(range(n), k):
        val = sim[:, :, list(subset)].amax(dim=2).sum(dim=1).cpu()
        better = val > best
        best = torch.where(better, val, best)
        best_idx[better] = torch.tensor(subset, dtype=torch.int64)
    return best, best_idx


def tile_soft_merge_reference(
    x: torch.Tensor, dst_idx: torch.Tensor, values: torch.Tensor | None = None, scale: float = 1000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft merge of ``values`` (default ``x``) onto the destinations ``dst_idx``.

    Args:
        x: [G, n, C] tokens whose cosine similarities define the assignment.
        dst_idx: [G, d] destination indices in ``[0, n)``.
        values: [G, n, Cv] states to merge (the reference merges the raw, un-normalised states); None: ``x``.
        scale: softmax temperature τ (> 0).

    Returns:
        ``(merged [G, d, Cv] in values' dtype, A [G, d, n] float32)`` with ``merged = (A / rowsum A) values``.
    """
    v = x if values is None else values
    xn = normalize_rows(x)
    y = xn.gather(1, dst_idx[:, :, None].expand(-1, -1, xn.shape[-1]))  # [G, d, C]
    A = torch.softmax(scale * (y @ xn.transpose(-1, -2)), dim=1)  # over destinations
    M = A / A.sum(dim=2, keepdim=True)
    return (M @ v.float()).to(v.dtype), A


def bipartite_soft_matching_2d_reference(
    metric: torch.Tensor,
    h: int,
    w: int,
    sx: int,
    sy: int,
    r: int,
    *,
    no_rand: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """ToMeSD's random 2-D bipartite soft matching: ``metric [B, N, C]`` on an ``h × w`` row-major grid.

    One destination per ``sy × sx`` cell (random, or the top-left one with ``no_rand``; one draw shared by the
    batch), each source's most similar destination (cosine), the ``r`` most similar sources merged.

    Returns:
        ``(merge, unmerge)``: ``merge(x [B, N, c], mode="mean") -> [B, N - r, c]`` (unmerged sources, then
        destinations with their merged sources reduced by ``mode``), ``unmerge(y [B, N - r, c]) -> [B, N, c]``
        (each merged source copies its destination).
    """
    B, N, _ = metric.shape
    dev = metric.device
    if r <= 0:
        return (lambda x, mode="mean": x), (lambda x: x)
    with torch.no_grad():
        hsy, wsx = h // sy, w // sx
        if no_rand:
            pick = torch.zeros(hsy, wsx, 1, dtype=torch.int64, device=dev)
        else:
            g_dev = generator.device if generator is not None else dev
            pick = torch.randint(sy * sx, size=(hsy, wsx, 1), device=g_dev, generator=generator).to(dev)
        cell = torch.zeros(hsy, wsx, sy * sx, dtype=torch.int64, device=dev)
        cell.scatter_(2, pick, -torch.ones_like(pick))  # -1 marks the destination of each cell
        grid_view = cell.view(hsy, wsx, sy, sx).transpose(1, 2).reshape(hsy * sy, wsx * sx)
        grid = torch.zeros(h, w, dtype=torch.int64, device=dev)
        grid[: hsy * sy, : wsx * sx] = grid_view
        order = grid.reshape(1, -1, 1).argsort(dim=1)  # destinations first, then sources
        n_dst = hsy * wsx
        a_idx, b_idx = order[:, n_dst:, :], order[:, :n_dst, :]

        def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            c = x.shape[-1]
            return (
                x.gather(1, a_idx.expand(x.shape[0], N - n_dst, c)),
                x.gather(1, b_idx.expand(x.shape[0], n_dst, c)),
            )

        nrm = metric.norm(dim=-1, keepdim=True)
        # ToMeSD's x / ‖x‖, with the overflow-safe normalisation where ‖x‖² overflows (1e30-scaled rows)
        unit = torch.where(
            torch.isfinite(nrm), metric / nrm.clamp_min(1e-12), normalize_rows(metric).to(metric.dtype)
        )
        a, b = split(unit)
        node_max, node_idx = (a @ b.transpose(-1, -2)).max(dim=-1)
        r = min(a.shape[1], r)
        edge_idx = node_max.argsort(dim=-1, descending=True)[..., None]
        unm_idx, src_idx = edge_idx[:, r:, :], edge_idx[:, :r, :]
        dst_of_src = node_idx[..., None].gather(1, src_idx)

    def merge(x: torch.Tensor, mode: str = "mean") -> torch.Tensor:
        src, dst = split(x)
        n, t1, c = src.shape
        unm = src.gather(1, unm_idx.expand(n, t1 - r, c))
        src = src.gather(1, src_idx.expand(n, r, c))
        dst = dst.scatter_reduce(1, dst_of_src.expand(n, r, c), src, reduce=mode)
        return torch.cat([unm, dst], dim=1)

    def unmerge(y: torch.Tensor) -> torch.Tensor:
        n_unm = unm_idx.shape[1]
        unm, dst = y[:, :n_unm, :], y[:, n_unm:, :]
        c = unm.shape[-1]
        src = dst.gather(1, dst_of_src.expand(B, r, c))
        out = torch.zeros(B, N, c, device=y.device, dtype=y.dtype)
        a_full = a_idx.expand(B, a_idx.shape[1], 1)
        out.scatter_(1, b_idx.expand(B, n_dst, c), dst)
        out.scatter_(1, a_full.gather(1, unm_idx).expand(B, n_unm, c), unm)
        out.scatter_(1, a_full.gather(1, src_idx).expand(B, r, c), src)
        return out

    return merge, unmerge
