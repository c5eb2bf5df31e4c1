"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: the PyTorch reference.

Plain-PyTorch reference of the two-stage SpargeAttn op; the executable specification of the Triton kernels
in ``triton.py`` and their test oracle. Runs on any device (CPU included).

Shapes (HND layout): ``q [B, H, Lq, d]``, ``k, v [B, Hkv, Lk, d]`` with ``H % Hkv == 0`` (GQA: query head
``h`` reads key/value head ``h // (H // Hkv)``). Query blocks have ``block_q`` rows, key blocks ``block_k``
rows; ``nq = ceil(Lq / block_q)``, ``nk = ceil(Lk / block_k)``; the last block of each may be partial
(ragged lengths are handled by zero padding plus masking, never by requiring multiples).

The pipeline:

1. :func:`block_stats` — per block (a :class:`BlockStats`): pooled mean, self-similarity ``‖Σ x̂_i‖² / n²`` (the mean pairwise
   cosine of its rows), and optionally the INT8 values with fp32 scales (SageAttention quantization: K has
   its per-head token mean subtracted first, which softmax ignores, and one scale per K block; Q has one
   scale per *warp* of rows — the rows one warp of the official CUDA kernel owns — or per block, see
   :func:`q_quant_group`).
2. :func:`select_blocks` — stage 1: the block mask from the pooled scores (cumulative-mass or top-k
   selection on a row-softmax over K blocks), the self-similarity judge (non-similar blocks are forced
   dense), causal block validity (plus, under ``is_causal``, the diagonal K blocks of each Q block — a
   deviation from the official code that guarantees every query sees at least itself) and an optional
   attention sink.
3. :func:`mask_to_lut` — the active K-block indices of each Q block, ascending (what the kernel loops over).
4. :func:`sparse_flash_forward` — stage 2: flash attention over the LUT only, exp2 online softmax, with the
   per-program λ skip of the PV product. It is written "one LUT step at a time for every program at once":
   step ``t`` processes the ``t``-th active K block of every Q block that has one, exactly the order the
   Triton kernel visits them, so the λ decisions of both implementations coincide.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

LOG2E = 1.4426950408889634
_NEG_INF = float("-inf")


def num_blocks(length: int, block: int) -> int:
    """``ceil(length / block)``."""
    return (length + block - 1) // block


def pad_to_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """Zero-pad dim -2 of ``x [..., L, d]`` to a multiple of ``block``."""
    pad = num_blocks(x.shape[-2], block) * block - x.shape[-2]
    return F.pad(x, (0, 0, 0, pad)) if pad else x


QUANT_GRANULARITIES = ("per_warp", "per_block")


def q_quant_group(granularity: str, block_q: int, d: int) -> int:
    """Rows of Q that share one INT8 scale.

    ``"per_block"``: the whole Q block (what the official SpargeAttn ``core.py`` launches, ``qk_quant_gran=1``).
    ``"per_warp"``: the rows one warp of the official CUDA kernel owns (SageAttention's ``per_warp_int8``,
    ``WARP_Q = 32`` for ``d <= 64`` and ``16`` otherwise); taken as ``gcd(block_q, WARP_Q)`` so the groups
    always tile a block. K keeps one scale per K block in both cases (as officially).
    """
    if granularity not in QUANT_GRANULARITIES:
        raise ValueError(f"qk_quant_gran must be one of {QUANT_GRANULARITIES}, got {granularity!r}")
    if granularity == "per_block":
        return block_q
    return math.gcd(block_q, 32 if d <= 64 else 16)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 quantization of each block ``x [..., n, d]`` with one scale for the whole block.

    ``scale = max|x| / 127`` (1 for an all-zero block), values rounded half away from zero.

    Returns:
        ``(x_int8 [..., n, d] int8, scale [...] float32)`` with ``x ≈ x_int8 * scale``.
    """
    x = x.float()
    scale = x.abs().amax(dim=(-2, -1)) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = x / scale[..., None, None]
    # Round half away from zero (as the official kernels do), not torch.round's half-to-even:
    # trunc(y ± 0.5) is floor(y + 0.5) for y >= 0 and ceil(y - 0.5) below, in three passes instead of six.
    r = y.add_(torch.copysign(torch.tensor(0.5, device=y.device), y)).trunc_()
    return r.clamp_(-127, 127).to(torch.int8), scale


class BlockStats(NamedTuple):
    """Per-block statistics of one tensor (Q or K), as :func:`block_stats` and the Triton stats kernels give them.

    A named tuple, so ``pooled, selfsim, x_int8, scale = block_stats(...)`` unpacks it.
    """

    pooled: torch.Tensor
    """``[B, H, n, d]`` fp32: the mean of each block's real rows (after subtracting ``mean``)."""
    selfsim: torch.Tensor
    """``[B, H, n]`` fp32: the mean pairwise cosine of each block's rows; ``-inf`` for a partial last block,
    which is therefore never *similar* (the official kernel's zero-filled rows give it a NaN similarity)."""
    x_int8: torch.Tensor | None
    """``[B, H, n*block, d]`` int8 values (padded rows are 0), or ``None`` without quantization."""
    scale: torch.Tensor | None
    """``[B, H, n*block/quant_group]`` fp32 dequantization scales, or ``None`` without quantization."""


def block_stats(
    x: torch.Tensor,
    block: int,
    *,
    mean: torch.Tensor | None = None,
    quant_scale: float | None = None,
    quant_group: int | None = None,
) -> BlockStats:
    """Per-block statistics of ``x [B, H, L, d]`` (the reference of the Triton stats kernels).

    Args:
        x: the tensor to cut into blocks of ``block`` tokens along dim -2.
        block: block length; the last block may be partial: its pooled mean uses its real length, and it
            is never similar (official).
        mean: ``[B, H, d]`` subtracted from every token first (K smoothing), or ``None``.
        quant_scale: when not ``None``, also quantize ``quant_scale * (x - mean)`` to INT8 per block
            (for Q this is ``softmax_scale * log2(e)``, so the kernel works in log2 units).
        quant_group: rows sharing one INT8 scale (a divisor of ``block``; default ``block``: per block).

    Returns:
        :class:`BlockStats`: ``pooled [B, H, n, d]`` (mean of the block's real rows), ``selfsim [B, H, n]``
        (mean pairwise cosine of the rows; ``-inf`` for a partial last block), and ``x_int8 [B, H, n*block, d]`` int8,
        ``scale [B, H, n*block/quant_group]`` float32 (both ``None`` without ``quant_scale``).
    """
    B, H, L, d = x.shape
    n = num_blocks(L, block)
    xf = x.float()
    if mean is not None:
        xf = xf - mean.float()[:, :, None, :]
    xb = pad_to_blocks(xf, block).view(B, H, n, block, d)
    counts = torch.full((n,), float(block), device=x.device)
    counts[-1] = L - (n - 1) * block  # real length of the (possibly partial) last block
    pooled = xb.sum(dim=-2) / counts[:, None]
    norms = xb.norm(dim=-1, keepdim=True)
    unit = xb / torch.where(norms > 0, norms, torch.ones_like(norms))  # padded rows stay zero
    # Mean of all n² pairwise cosines = ‖Σ x̂_i‖² / n²: O(n d) instead of the n×n Gram matrix.
    selfsim = unit.sum(dim=-2).pow(2).sum(dim=-1) / counts**2
    if L % block:  # a partial last block is always judged non-similar (computed densely), as officially
        selfsim[..., -1] = -math.inf
    if quant_scale is None:
        return BlockStats(pooled, selfsim, None, None)
    group = block if quant_group is None else quant_group
    if block % group:
        raise ValueError(f"quant_group must divide block={block}, got {group}")
    x_int8, scale = quantize_int8((xb * quant_scale).view(B, H, n * block // group, group, d))
    return BlockStats(pooled, selfsim, x_int8.view(B, H, n * block, d), scale)


def per_head(value: float | torch.Tensor, num_heads: int, device: torch.device | str) -> torch.Tensor:
    """Broadcast a per-head hyper-parameter (float, 0-d or ``[H]`` tensor) to a float32 ``[H]`` tensor."""
    t = torch.as_tensor(value, dtype=torch.float32, device=device)
    return t.expand(num_heads).clone() if t.dim() == 0 else t.reshape(num_heads).clone()


def causal_block_valid(
    nq: int, nk: int, block_q: int, block_k: int, device: torch.device | str
) -> torch.Tensor:
    """``[nq, nk]`` bool: block (i, j) holds at least one (row, col) with col <= row (top-left causal)."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j * block_k < (i + 1) * block_q


def diagonal_blocks(nq: int, nk: int, block_q: int, block_k: int, device: torch.device | str) -> torch.Tensor:
    """``[nq, nk]`` bool: K block j overlaps the positions of Q block i (holds the key ``col == row``)."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return (j * block_k < (i + 1) * block_q) & ((j + 1) * block_k > i * block_q)


def select_blocks(
    pooled_q: torch.Tensor,
    selfsim_q: torch.Tensor,
    pooled_k: torch.Tensor,
    selfsim_k: torch.Tensor,
    *,
    scale: float,
    sim_threshold: torch.Tensor,
    cdf_threshold: torch.Tensor | None,
    topk: torch.Tensor | None,
    is_causal: bool,
    attention_sink: bool,
    block_q: int,
    block_k: int,
) -> torch.Tensor:
    """Stage 1: the block mask from block statistics (paper §3.2: pooled scores, selection, judge).

    Args:
        pooled_q, selfsim_q: ``[B, H, nq, d]``, ``[B, H, nq]`` from :func:`block_stats` of q.
        pooled_k, selfsim_k: ``[B, Hkv, nk, d]``, ``[B, Hkv, nk]`` from :func:`block_stats` of k.
        scale: softmax scale applied to the pooled scores.
        sim_threshold: ``[H]`` θ; a block is *similar* iff its self-similarity exceeds θ.
        cdf_threshold: ``[H]`` τ (cumulative-mass mode) or ``None``.
        topk: ``[H]`` fraction of K blocks kept per Q block (top-k mode) or ``None``.

    Returns:
        ``[B, H, nq, nk]`` bool block mask (True = compute the tile).
    """
    B, H, nq, _ = pooled_q.shape
    nk = pooled_k.shape[2]
    group = H // pooled_k.shape[1]
    pooled_k = pooled_k.repeat_interleave(group, dim=1)
    selfsim_k = selfsim_k.repeat_interleave(group, dim=1)
    theta = sim_threshold.view(1, H, 1)
    sim_q = selfsim_q > theta  # [B, H, nq]
    sim_k = selfsim_k > theta  # [B, H, nk]
    valid = torch.ones(nq, nk, dtype=torch.bool, device=pooled_q.device)
    if is_causal:
        valid = causal_block_valid(nq, nk, block_q, block_k, pooled_q.device)
    # Only similar, causally valid K blocks compete for the budget; the others are decided below.
    candidate = sim_k[:, :, None, :] & valid
    score = (pooled_q.float() @ pooled_k.float().transpose(-1, -2)) * scale
    score = score.masked_fill(~candidate, _NEG_INF)
    # A row without any candidate is all -inf: its softmax is NaN; it selects nothing (probabilities 0).
    prob = torch.nan_to_num(score.softmax(dim=-1), nan=0.0)
    # Stable: equal probabilities rank by block index (the Triton stage-1 kernel breaks ties the same way).
    sorted_prob, order = prob.sort(dim=-1, descending=True, stable=True)
    if cdf_threshold is not None:
        tau = cdf_threshold.view(1, H, 1)
        # searchsorted(cdf, τ, right=True) == #(cdf <= τ) since the cdf is non-decreasing.
        num = (sorted_prob.cumsum(dim=-1) <= tau[..., None]).sum(dim=-1)
        num = torch.where(tau >= 1.0, torch.full_like(num, nk), num)  # τ=1 keeps all despite rounding
    else:
        assert topk is not None
        num = (topk.view(1, H, 1) * nk).floor().long().expand(B, H, nq)
    num = num.clamp(min=1)
    keep_sorted = torch.arange(nk, device=prob.device) < num[..., None]
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted) & candidate
    # Pooling is unreliable for non-similar blocks: they are computed densely.
    mask = keep | ~sim_k[:, :, None, :] | ~sim_q[..., None]
    if is_causal:
        # Deviation from the official code: the K blocks overlapping the Q block's own rows are always kept.
        # Pooling ignores that early rows of a Q block cannot see later K blocks; without this, a row whose
        # only visible blocks were not selected has no key at all (the official kernel outputs 0 there).
        mask = (mask | diagonal_blocks(nq, nk, block_q, block_k, mask.device)) & valid
    if attention_sink:
        mask[..., 0] = True
    return mask


def mask_to_lut(block_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Active K-block indices per Q block.

    Args:
        block_mask: ``[B, H, nq, nk]`` bool.

    Returns:
        ``lut [B, H, nq, nk]`` int32 whose first ``count`` entries are the active block indices in
        ascending order (the rest is padding), and ``count [B, H, nq]`` int32.
    """
    # A stable sort of "inactive" flags puts the active indices first, in ascending order.
    lut = torch.sort((~block_mask).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
    return lut.contiguous(), block_mask.sum(dim=-1, dtype=torch.int32)


def sparse_flash_forward(
    q_op: torch.Tensor,
    q_scale: torch.Tensor | None,
    k_op: torch.Tensor,
    k_scale: torch.Tensor | None,
    v: torch.Tensor,
    lut: torch.Tensor,
    count: torch.Tensor,
    *,
    lq: int,
    lk: int,
    is_causal: bool,
    pv_threshold: torch.Tensor,
    block_q: int,
    block_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2: block-sparse flash attention over the LUT with the λ skip (reference of ``sparge_fwd``).

    Args:
        q_op: ``[B, H, nq*block_q, d]`` Q already multiplied by ``softmax_scale * log2(e)`` — INT8 values
            when ``q_scale`` is given, else floats.
        q_scale: ``[B, H, nq*block_q/g]`` dequantization scales of groups of ``g`` consecutive rows (``g``
            inferred from the shape: ``block_q`` per block, the warp rows per warp), or ``None``.
        k_op: ``[B, Hkv, nk*block_k, d]`` (smoothed) K, INT8 when ``k_scale`` is given.
        k_scale: ``[B, Hkv, nk]`` or ``None``.
        v: ``[B, Hkv, Lk, d]``; P is cast to ``v.dtype`` before the PV product (fp32 accumulation).
        lut, count: from :func:`mask_to_lut`.
        lq, lk: real sequence lengths (rows/cols beyond them are padding).
        pv_threshold: ``[H]`` λ in log2 units; ``inf`` disables the skip.

    Returns:
        ``o [B, H, lq, d]`` (dtype of ``v``) and ``skipped [B, H, nq]`` int32: visited tiles whose PV
        product was skipped.
    """
    B, H, lq_pad, d = q_op.shape
    hkv, nk = k_op.shape[1], lut.shape[-1]
    nq, group, device = lq_pad // block_q, H // hkv, q_op.device
    n_prog = B * H * nq
    # Flatten programs: program p = (b, h, i). Its K/V head is h // group.
    qb = q_op.float().reshape(n_prog, block_q, d)
    qs = torch.ones(n_prog, block_q, device=device)
    if q_scale is not None:  # one scale per group of rows -> one per row
        qs = q_scale.repeat_interleave(lq_pad // q_scale.shape[-1], dim=-1).reshape(n_prog, block_q)
    kb = k_op.float().reshape(B * hkv * nk, block_k, d)
    ks = k_scale.reshape(-1) if k_scale is not None else torch.ones(B * hkv * nk, device=device)
    vb = pad_to_blocks(v, block_k).float().reshape(B * hkv * nk, block_k, d)
    b_idx = torch.arange(B, device=device).view(B, 1, 1).expand(B, H, nq).reshape(-1)
    h_idx = torch.arange(H, device=device).view(1, H, 1).expand(B, H, nq).reshape(-1)
    i_idx = torch.arange(nq, device=device).view(1, 1, nq).expand(B, H, nq).reshape(-1)
    kv_base = (b_idx * hkv + h_idx // group) * nk
    lam = pv_threshold.float().to(device)[h_idx]
    lut_f, count_f = lut.reshape(n_prog, nk).long(), count.reshape(n_prog)
    rows = i_idx[:, None] * block_q + torch.arange(block_q, device=device)  # [P, block_q] global row
    row_real = rows < lq

    m = torch.full((n_prog, block_q), _NEG_INF, device=device)
    row_sum = torch.zeros(n_prog, block_q, device=device)
    acc = torch.zeros(n_prog, block_q, d, device=device)
    skipped = torch.zeros(n_prog, dtype=torch.int32, device=device)
    every = torch.arange(n_prog, device=device)
    for t in range(int(count_f.max().item()) if n_prog else 0):
        active = count_f > t  # programs that still have a t-th active block
        p = None if bool(active.all()) else every[active]
        j = _take(lut_f[:, t], p)
        tile = _take(kv_base, p) + j
        k_t, v_t = kb.index_select(0, tile), vb.index_select(0, tile)
        s = torch.bmm(_take(qb, p), k_t.transpose(-1, -2))
        s.mul_(_take(qs, p)[:, :, None] * ks[tile][:, None, None])  # dequantize: scores in log2 units
        cols = j[:, None] * block_k + torch.arange(block_k, device=device)  # [p, block_k]
        allowed = (cols < lk)[:, None, :]
        if is_causal:  # only the diagonal tiles have any disallowed entry
            allowed = allowed & (cols[:, None, :] <= _take(rows, p)[:, :, None])
        if not bool(allowed.all()):
            s.masked_fill_(~allowed, _NEG_INF)
        m_old = _take(m, p)
        m_loc = s.amax(dim=-1)
        # λ skip: the tile cannot move any real row's maximum to within 2^-λ of the running one.
        diff = torch.where(m_loc == _NEG_INF, _NEG_INF, m_loc - m_old)  # m_old=-inf -> +inf: compute
        diff.masked_fill_(~_take(row_real, p), _NEG_INF)
        compute = ~(diff.amax(dim=-1) < -_take(lam, p))
        if not bool(compute.all()):
            keep = torch.nonzero(compute).squeeze(1)
            p = every if p is None else p
            skipped.index_add_(0, p[~compute], torch.ones_like(p[~compute], dtype=torch.int32))
            p, s, m_old, m_loc, v_t = p[keep], s[keep], m_old[keep], m_loc[keep], v_t[keep]
        m_new = torch.maximum(m_old, m_loc)
        m_safe = torch.where(m_new == _NEG_INF, 0.0, m_new)  # rows with nothing seen yet
        alpha = torch.exp2(m_old - m_safe)
        prob = torch.exp2(s.sub_(m_safe[..., None]))
        _put(row_sum, p, torch.addcmul(prob.sum(dim=-1), _take(row_sum, p), alpha))
        pv = torch.bmm(prob.to(v.dtype).float(), v_t)  # P in V's precision, fp32 accumulation
        _put(acc, p, torch.addcmul(pv, _take(acc, p), alpha[..., None]))
        _put(m, p, m_new)
    # A row that saw no allowed key (degenerate sparse mask) outputs 0 instead of NaN.
    o = torch.where(row_sum[..., None] > 0, acc / row_sum.clamp_min(1e-30)[..., None], 0.0)
    o = o.view(B, H, nq * block_q, d)[:, :, :lq]
    return o.to(v.dtype), skipped.view(B, H, nq)


def _take(x: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    """Rows ``idx`` of ``x`` (all rows when ``idx`` is None: the common every-program-active step)."""
    return x if idx is None else x.index_select(0, idx)


def _put(x: torch.Tensor, idx: torch.Tensor | None, value: torch.Tensor) -> None:
    if idx is None:
        x.copy_(value)
    else:
        x.index_copy_(0, idx, value)


def quantize_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float,
    smooth_k: bool,
    quantize: bool,
    block_q: int,
    block_k: int,
    q_group: int | None = None,
    k_mean: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """The kernel operands: Q pre-scaled by ``scale·log2(e)``, K smoothed; INT8 or floats.

    ``q_group`` rows of Q share one scale (default: per block); K has one scale per block. ``k_mean``
    (``[B, Hkv, d]``) reuses an already computed token mean of K for the smoothing.

    Returns:
        ``(q_op [B,H,nq*block_q,d], q_scale [B,H,nq*block_q/q_group] | None, k_op [B,Hkv,nk*block_k,d],
        k_scale [B,Hkv,nk] | None)``.
    """
    if smooth_k and k_mean is None:
        k_mean = k.mean(dim=-2, dtype=torch.float32)
    k_mean = k_mean if smooth_k else None
    c = scale * LOG2E
    if quantize:
        q_stats = block_stats(q, block_q, quant_scale=c, quant_group=q_group)
        k_stats = block_stats(k, block_k, mean=k_mean, quant_scale=1.0)
        return q_stats.x_int8, q_stats.scale, k_stats.x_int8, k_stats.scale
    q_op = pad_to_blocks(q.float() * c, block_q)
    k_f = k.float() - k_mean[:, :, None, :] if k_mean is not None else k.float()
    return q_op, None, pad_to_blocks(k_f, block_k), None


def dense_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool, scale: float
) -> torch.Tensor:
    """Plain softmax attention with GQA (the dense oracle), fp32, ``[B, H, Lq, d]``."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    s = (q.float() @ k.transpose(-1, -2)) * scale
    if is_causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool, device=s.device).triu(1), _NEG_INF)
    return s.softmax(dim=-1) @ v


def relative_l1(o: torch.Tensor, o_ref: torch.Tensor) -> float:
    """``Σ|o − o_ref| / Σ|o_ref|`` (the paper's error metric)."""
    o, o_ref = o.float(), o_ref.float()
    return float((o - o_ref).abs().sum() / o_ref.abs().sum().clamp_min(1e-30))


def default_scale(d: int) -> float:
    """``1/√d``."""
    return 1.0 / math.sqrt(d)
