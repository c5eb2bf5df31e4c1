"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: the Triton kernels.

Triton kernels of the SpargeAttn op (imported only when the Triton backend is selected). One
``sparge_attention`` call on this path is **four launches and no host↔device synchronisation**:

1. ``k.mean(dim=-2)`` (torch) — the per-head token mean of K (smoothing needs it before any K block).
2. ``_qk_stats_kernel`` — grid ``(B*H*nq + B*Hkv*nk,)``: one program per Q block *or* K block writes the
   block's pooled mean, self-similarity and INT8 values + fp32 scales (Q pre-scaled by
   ``softmax_scale·log2(e)``, one scale per warp of rows; K mean-subtracted, one scale per block).
3. ``_select_lut_kernel`` — grid ``(nq, B*H)``: stage 1 for one Q block (pooled scores, softmax, rank /
   cumulative-mass or top-k cut, self-similarity judge, causal validity, sink) and the block mask → LUT
   compaction, so the mask never leaves the device and no shape depends on data (the LUT has ``nk`` slots).
4. ``_sparge_fwd_kernel`` — grid ``(nq, B*H)``: one program per Q block loops over the active K blocks of
   its LUT row only (no loads for skipped tiles), ``tl.dot(int8, int8) -> int32`` for QKᵀ, exp2 online
   softmax, the per-program λ skip of the PV product, element masking on causal-diagonal and ragged tiles,
   GQA by ``h // group``.

``block_sparse_attention`` (a given mask) replaces launch 3 by ``_mask_to_lut_kernel``. Hyper-parameters
given as floats travel as kernel scalars (no fill kernels, no host→device copies); per-head ``[H]`` tensors
as pointers. The math is specified by ``reference.py``; tests compare both under ``TRITON_INTERPRET=1`` and
check, by recording the aten ops of a call (``_inspect.record_launches``), that nothing here reads a device
value back to the host. ``_inspect.compile_for_target`` compiles the kernels for a GPU without one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from icml25.kernels.sparse_attention.reference import BlockStats, num_blocks

# ------------------------------------------------------------------------------------- block statistics


@triton.jit
def _stats_block(
    X,  # [BH, L, D] contiguous
    MEAN,  # [BH, D] fp32 (read only when HAS_MEAN)
    POOLED,  # [BH, NB, D] fp32
    SIM,  # [BH, NB] fp32
    XQ,  # [BH, NB*BS, D] int8 (written only when QUANT)
    SCALE,  # [BH, NB*BS/QG] fp32
    quant_scale,
    bh,
    nb,
    L,
    D,
    NB,
    BS: tl.constexpr,
    QG: tl.constexpr,
    D_PAD: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Statistics of block ``nb`` of head ``bh``: pooled mean, self-similarity, INT8 + scales."""
    offs_r = nb * BS + tl.arange(0, BS)
    offs_d = tl.arange(0, D_PAD)
    rmask = offs_r < L
    dmask = offs_d < D
    x = tl.load(
        X + bh * L * D + offs_r[:, None] * D + offs_d[None, :],
        mask=rmask[:, None] & dmask[None, :],
        other=0.0,
    ).to(tl.float32)
    if HAS_MEAN:
        mu = tl.load(MEAN + bh * D + offs_d, mask=dmask, other=0.0)
        # Re-zero the padded rows so they stay out of the pooled mean, the similarity and the scale.
        x = tl.where(rmask[:, None], x - mu[None, :], 0.0)
    n = tl.minimum(L - nb * BS, BS).to(tl.float32)  # real rows of a possibly partial last block
    tl.store(POOLED + (bh * NB + nb) * D + offs_d, tl.sum(x, axis=0) / n, mask=dmask)
    # Mean pairwise cosine = |sum of unit rows|^2 / n^2 (no n x n Gram matrix needed).
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    unit = x / tl.where(norm > 0, norm, 1.0)[:, None]
    s = tl.sum(unit, axis=0)
    # A partial last block is never similar (the official kernel's zero-filled rows make its similarity NaN).
    sim = tl.where(n < BS, float("-inf"), tl.sum(s * s, axis=0) / (n * n))
    tl.store(SIM + bh * NB + nb, sim)
    if QUANT:
        xs = x * quant_scale
        # One scale per group of QG consecutive rows (QG = BS: per block; QG = warp rows: per warp).
        group_max = tl.max(tl.reshape(tl.max(tl.abs(xs), axis=1), [BS // QG, QG]), axis=1)
        group_scale = tl.where(group_max > 0, group_max / 127.0, 1.0)
        row_scale = tl.reshape(tl.broadcast_to(group_scale[:, None], [BS // QG, QG]), [BS])
        y = xs / row_scale[:, None]
        r = tl.where(y >= 0, tl.floor(y + 0.5), tl.ceil(y - 0.5))  # round half away from zero
        r = tl.minimum(tl.maximum(r, -127.0), 127.0)
        # Padded rows are written too (as zeros), so the forward kernel may load whole blocks unmasked.
        tl.store(
            XQ + bh * NB * BS * D + offs_r[:, None] * D + offs_d[None, :], r.to(tl.int8), mask=dmask[None, :]
        )
        tl.store(SCALE + bh * (NB * (BS // QG)) + nb * (BS // QG) + tl.arange(0, BS // QG), group_scale)


@triton.jit
def _block_stats_kernel(X, MEAN, POOLED, SIM, XQ, SCALE, quant_scale, L, D, NB, BS: tl.constexpr,
                        QG: tl.constexpr, D_PAD: tl.constexpr, HAS_MEAN: tl.constexpr, QUANT: tl.constexpr):  # fmt: skip
    """Grid ``(BH, NB)``: the statistics of one tensor (used by :func:`block_stats`)."""
    _stats_block(X, MEAN, POOLED, SIM, XQ, SCALE, quant_scale, tl.program_id(0).to(tl.int64), tl.program_id(1),
                 L, D, NB, BS, QG, D_PAD, HAS_MEAN, QUANT)  # fmt: skip


@triton.jit
def _qk_stats_kernel(
    Q, KMEAN, QPOOL, QSIM, QQ, QSCALE,
    K, KPOOL, KSIM, KQ, KSCALE,
    q_mult, LQ, LK, D, NQ, NK, NQ_PROGRAMS,
    BQ: tl.constexpr, BK: tl.constexpr, QG: tl.constexpr, D_PAD: tl.constexpr,
    SMOOTH: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    """Grid ``(B*H*NQ + B*Hkv*NK,)``: the first programs do the Q blocks, the rest the K blocks (one launch)."""
    pid = tl.program_id(0).to(tl.int64)
    if pid < NQ_PROGRAMS:
        _stats_block(Q, KMEAN, QPOOL, QSIM, QQ, QSCALE, q_mult, pid // NQ, pid % NQ, LQ, D, NQ,
                     BQ, QG, D_PAD, False, QUANT)  # fmt: skip
    else:
        p = pid - NQ_PROGRAMS
        _stats_block(K, KMEAN, KPOOL, KSIM, KQ, KSCALE, 1.0, p // NK, p % NK, LK, D, NK,
                     BK, BK, D_PAD, SMOOTH, QUANT)  # fmt: skip


def _d_pad(d: int) -> int:
    # tl.dot needs power-of-two tiles of at least 16 (32 for the int8 MMA's k dimension); padding d with
    # zero columns changes no dot product, so head_dim 96 runs as 128.
    return max(32, triton.next_power_of_2(d))


def _warps(rows: int, d_pad: int) -> int:
    return 4 if rows * d_pad <= 8192 else 8


def block_stats(
    x: torch.Tensor,
    block: int,
    *,
    mean: torch.Tensor | None = None,
    quant_scale: float | None = None,
    quant_group: int | None = None,
) -> BlockStats:
    """Triton version of :func:`icml25.kernels.sparse_attention.reference.block_stats` (same signature)."""
    B, H, L, d = x.shape
    nb, group = num_blocks(L, block), block if quant_group is None else quant_group
    x, dev, quant = x.contiguous(), x.device, quant_scale is not None
    pooled = torch.empty(B, H, nb, d, device=dev, dtype=torch.float32)
    sim = torch.empty(B, H, nb, device=dev, dtype=torch.float32)
    xq = torch.empty(B, H, nb * block, d, device=dev, dtype=torch.int8) if quant else sim
    scale = torch.empty(B, H, nb * block // group, device=dev, dtype=torch.float32) if quant else sim
    mean_t = mean.float().contiguous() if mean is not None else sim
    _block_stats_kernel[(B * H, nb)](
        x, mean_t, pooled, sim, xq, scale, float(quant_scale or 1.0), L, d, nb,
        BS=block, QG=group, D_PAD=_d_pad(d), HAS_MEAN=mean is not None, QUANT=quant,
        num_warps=_warps(block, _d_pad(d)),
    )  # fmt: skip
    return BlockStats(pooled, sim, xq if quant else None, scale if quant else None)


def qk_block_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    k_mean: torch.Tensor | None,
    *,
    q_mult: float,
    quantize: bool,
    q_group: int,
    block_q: int,
    block_k: int,
) -> tuple[BlockStats, BlockStats]:
    """:func:`block_stats` of Q (``quant_scale=q_mult``, ``quant_group=q_group``) and of K (``mean=k_mean``,
    ``quant_scale=1``) in **one** launch; returns ``(q_stats, k_stats)`` as the reference pair would."""
    B, H, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    nq, nk, dev = num_blocks(lq, block_q), num_blocks(lk, block_k), q.device
    f32 = {"device": dev, "dtype": torch.float32}
    q_pool, q_sim = torch.empty(B, H, nq, d, **f32), torch.empty(B, H, nq, **f32)
    k_pool, k_sim = torch.empty(B, hkv, nk, d, **f32), torch.empty(B, hkv, nk, **f32)
    if quantize:
        q_int8 = torch.empty(B, H, nq * block_q, d, device=dev, dtype=torch.int8)
        k_int8 = torch.empty(B, hkv, nk * block_k, d, device=dev, dtype=torch.int8)
        q_scale, k_scale = torch.empty(B, H, nq * block_q // q_group, **f32), torch.empty(B, hkv, nk, **f32)
    else:
        q_int8 = k_int8 = q_scale = k_scale = q_sim  # placeholders, never touched
    mean = k_mean.contiguous() if k_mean is not None else q_sim
    d_pad, n_q_programs = _d_pad(d), B * H * nq
    _qk_stats_kernel[(n_q_programs + B * hkv * nk,)](
        q.contiguous(), mean, q_pool, q_sim, q_int8, q_scale, k.contiguous(), k_pool, k_sim, k_int8, k_scale,
        float(q_mult), lq, lk, d, nq, nk, n_q_programs,
        BQ=block_q, BK=block_k, QG=q_group, D_PAD=d_pad, SMOOTH=k_mean is not None, QUANT=quantize,
        num_warps=_warps(max(block_q, block_k), d_pad),
    )  # fmt: skip
    if not quantize:
        return BlockStats(q_pool, q_sim, None, None), BlockStats(k_pool, k_sim, None, None)
    return BlockStats(q_pool, q_sim, q_int8, q_scale), BlockStats(k_pool, k_sim, k_int8, k_scale)


# ------------------------------------------------------------------------------- stage 1 + mask -> LUT


@triton.jit
def _lut_from_mask_row(MASK, LUT, CNT, row, NK, CH: tl.constexpr):
    """Compact mask row ``row`` into its LUT row: active indices first (ascending), then the inactive ones.

    Stream compaction by prefix sums, ``CH`` blocks at a time: an active block's slot is the number of active
    blocks before it; an inactive block's slot is ``count`` + the number of inactive blocks before it.
    """
    count = tl.zeros([], tl.int32)
    for c in range(0, NK, CH):
        offs = c + tl.arange(0, CH)
        count += tl.sum((tl.load(MASK + row * NK + offs, mask=offs < NK, other=0) != 0).to(tl.int32), axis=0)
    n_on = tl.zeros([], tl.int32)
    n_off = tl.zeros([], tl.int32)
    for c in range(0, NK, CH):
        offs = c + tl.arange(0, CH)
        jm = offs < NK
        on = (tl.load(MASK + row * NK + offs, mask=jm, other=0) != 0) & jm
        off = ~on & jm
        slot = tl.where(on, n_on + tl.cumsum(on.to(tl.int32), axis=0) - 1,
                        count + n_off + tl.cumsum(off.to(tl.int32), axis=0) - 1)  # fmt: skip
        tl.store(LUT + row * NK + slot, offs, mask=jm)
        n_on += tl.sum(on.to(tl.int32), axis=0)
        n_off += tl.sum(off.to(tl.int32), axis=0)
    tl.store(CNT + row, count)


@triton.jit
def _rank_key(p, offs, valid, NK):
    """One int64 sort key per block: probability descending, then block index ascending (keys are unique).

    A non-negative float's bits order like the float; the low word breaks ties by the lower index.
    """
    key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (NK - 1 - offs).to(tl.int64)
    return tl.where(valid, key, -1)


@triton.jit
def _select_lut_kernel(
    QPOOL,  # [B, H, NQ, D] fp32
    QSIM,  # [B, H, NQ] fp32
    KPOOL,  # [B, HKV, NK, D] fp32
    KSIM,  # [B, HKV, NK] fp32
    THETA,  # [H] fp32 θ (read when THETA_PER_HEAD)
    SEL,  # [H] fp32 τ or topk (read when SEL_PER_HEAD)
    SCORE,  # [B, H, NQ, NK] fp32 scratch: pooled scores of the row
    MASK,  # [B, H, NQ, NK] int8 out
    LUT,  # [B, H, NQ, NK] int32 out
    CNT,  # [B, H, NQ] int32 out
    theta_s,
    sel_s,
    scale,
    H,
    GROUP,
    NQ,
    NK,
    D,
    BQ: tl.constexpr,
    BK: tl.constexpr,
    CH: tl.constexpr,
    D_PAD: tl.constexpr,
    THETA_PER_HEAD: tl.constexpr,
    SEL_PER_HEAD: tl.constexpr,
    CDF: tl.constexpr,
    CAUSAL: tl.constexpr,
    SINK: tl.constexpr,
):
    """Stage 1 (reference ``select_blocks``) and its LUT for Q block ``program_id(0)`` of head ``program_id(1)``.

    Instead of sorting the row, each block's rank and cumulative mass (the sum of the probabilities ranked
    at or above it) are counted against every other block, ``CH × CH`` at a time: O(nk²) tiny work per Q
    block, bounded registers for any ``nk``, and no data-dependent shapes.
    """
    i = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    h = bh % H
    kv = (bh // H) * (H // GROUP) + h // GROUP
    row = bh * NQ + i
    theta = theta_s
    if THETA_PER_HEAD:
        theta = tl.load(THETA + h)
    sel = sel_s
    if SEL_PER_HEAD:
        sel = tl.load(SEL + h)
    offs_d = tl.arange(0, D_PAD)
    q_bar = tl.load(QPOOL + row * D + offs_d, mask=offs_d < D, other=0.0)
    dense_q = tl.load(QSIM + row) <= theta  # the Q block is non-similar (never NaN: n >= 1)

    # Pass 1: pooled scores of the candidates (similar, causally valid K blocks; others -inf) and the
    # softmax normaliser, as an online max / rescaled sum.
    top = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    for c in range(0, NK, CH):
        offs = c + tl.arange(0, CH)
        jm = offs < NK
        k_bar = tl.load(KPOOL + (kv * NK + offs[:, None]) * D + offs_d[None, :],
                        mask=jm[:, None] & (offs_d < D)[None, :], other=0.0)  # fmt: skip
        cand = (tl.load(KSIM + kv * NK + offs, mask=jm, other=0.0) > theta) & jm
        if CAUSAL:
            cand = cand & (offs * BK < (i + 1) * BQ)
        score = tl.where(cand, tl.sum(q_bar[None, :] * k_bar, axis=1) * scale, float("-inf"))
        tl.store(SCORE + row * NK + offs, score, mask=jm)
        new_top = tl.maximum(top, tl.max(score, axis=0))
        safe = tl.where(new_top == float("-inf"), 0.0, new_top)
        total = total * tl.exp(top - safe) + tl.sum(tl.exp(score - safe), axis=0)
        top = new_top
    tl.debug_barrier()  # the scores written above are read back by other threads below
    safe_top = tl.where(top == float("-inf"), 0.0, top)
    inv_total = tl.where(
        total > 0, 1.0 / tl.where(total > 0, total, 1.0), 0.0
    )  # a row without candidates: probability 0 everywhere

    # Pass 2: keep decision per block: rank / cumulative mass against all blocks, then the forced blocks.
    for c in range(0, NK, CH):
        offs_j = c + tl.arange(0, CH)
        jm = offs_j < NK
        score_j = tl.load(SCORE + row * NK + offs_j, mask=jm, other=float("-inf"))
        key_j = _rank_key(tl.exp(score_j - safe_top) * inv_total, offs_j, jm, NK)
        cdf = tl.zeros([CH], tl.float32)
        rank = tl.zeros([CH], tl.int32)
        for c2 in range(0, NK, CH):
            offs_l = c2 + tl.arange(0, CH)
            lm = offs_l < NK
            p_l = (
                tl.exp(tl.load(SCORE + row * NK + offs_l, mask=lm, other=float("-inf")) - safe_top)
                * inv_total
            )
            key_l = _rank_key(p_l, offs_l, lm, NK)
            cdf += tl.sum(tl.where(key_l[None, :] >= key_j[:, None], p_l[None, :], 0.0), axis=1)
            rank += tl.sum((key_l[None, :] > key_j[:, None]).to(tl.int32), axis=1)
        if CDF:
            # #(cdf <= τ) over the ranking is a prefix of it; τ=1 keeps all despite rounding.
            keep = cdf <= tl.where(sel >= 1.0, float("inf"), sel)
        else:
            keep = rank < tl.floor(sel * NK).to(tl.int32)
        keep = (keep | (rank == 0)) & (score_j > float("-inf"))  # at least one; candidates only
        # Pooling is unreliable for non-similar blocks: they are computed densely.
        dense_k = tl.load(KSIM + kv * NK + offs_j, mask=jm, other=0.0) <= theta
        dense_row = (tl.zeros([CH], tl.int32) + dense_q.to(tl.int32)) != 0  # broadcast the scalar flag
        keep = (keep | dense_k | dense_row) & jm
        if CAUSAL:
            # K blocks overlapping the Q block's own rows are always kept (see reference.select_blocks).
            valid = offs_j * BK < (i + 1) * BQ
            keep = (keep | (valid & ((offs_j + 1) * BK > i * BQ))) & valid
        if SINK:
            keep = keep | (offs_j == 0)
        tl.store(MASK + row * NK + offs_j, keep.to(tl.int8), mask=jm)
    tl.debug_barrier()
    _lut_from_mask_row(MASK, LUT, CNT, row, NK, CH)


@triton.jit
def _mask_to_lut_kernel(MASK_IN, MASK, LUT, CNT, NQ, NK, BQ: tl.constexpr, BK: tl.constexpr,
                        CH: tl.constexpr, CAUSAL: tl.constexpr):  # fmt: skip
    """Grid ``(NQ, BH)``: LUT of a given mask, with the causally invalid blocks removed."""
    i = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64) * NQ + i
    for c in range(0, NK, CH):
        offs = c + tl.arange(0, CH)
        keep = tl.load(MASK_IN + row * NK + offs, mask=offs < NK, other=0) != 0
        if CAUSAL:
            keep = keep & (offs * BK < (i + 1) * BQ)
        tl.store(MASK + row * NK + offs, keep.to(tl.int8), mask=offs < NK)
    tl.debug_barrier()
    _lut_from_mask_row(MASK, LUT, CNT, row, NK, CH)


_CH = 16  # blocks per chunk in the stage-1 / LUT kernels


def _hyper(value: float | torch.Tensor, dev: torch.device) -> tuple[torch.Tensor | None, float, bool]:
    """A hyper-parameter as ``(pointer or None, scalar, per_head)`` kernel arguments."""
    if isinstance(value, torch.Tensor):
        return value.to(device=dev, dtype=torch.float32).contiguous(), 0.0, True
    return None, float(value), False


def select_lut(
    q_stats: BlockStats,
    k_stats: BlockStats,
    *,
    scale: float,
    sim_threshold: float | torch.Tensor,
    cdf_threshold: float | torch.Tensor | None,
    topk: float | torch.Tensor | None,
    is_causal: bool,
    attention_sink: bool,
    block_q: int,
    block_k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 1 and the LUT in one launch: ``(mask [B,H,nq,nk] bool, lut [B,H,nq,nk] int32, count [B,H,nq])``.

    Same result as ``reference.mask_to_lut(reference.select_blocks(...))``; θ/τ/topk are floats or ``[H]``.
    """
    q_pool, q_sim, k_pool, k_sim = q_stats.pooled, q_stats.selfsim, k_stats.pooled, k_stats.selfsim
    B, H, nq, d = q_pool.shape
    hkv, nk, dev = k_pool.shape[1], k_pool.shape[2], q_pool.device
    mask = torch.empty(B, H, nq, nk, device=dev, dtype=torch.int8)
    lut = torch.empty(B, H, nq, nk, device=dev, dtype=torch.int32)
    count = torch.empty(B, H, nq, device=dev, dtype=torch.int32)
    score = torch.empty(B, H, nq, nk, device=dev, dtype=torch.float32)
    theta_p, theta_s, theta_h = _hyper(sim_threshold, dev)
    sel = cdf_threshold if cdf_threshold is not None else topk
    sel_p, sel_s, sel_h = _hyper(sel, dev)
    _select_lut_kernel[(nq, B * H)](
        q_pool, q_sim, k_pool, k_sim, theta_p if theta_h else q_sim, sel_p if sel_h else q_sim,
        score, mask, lut, count, theta_s, sel_s, float(scale), H, H // hkv, nq, nk, d,
        BQ=block_q, BK=block_k, CH=_CH, D_PAD=_d_pad(d),
        THETA_PER_HEAD=theta_h, SEL_PER_HEAD=sel_h, CDF=cdf_threshold is not None, CAUSAL=is_causal,
        SINK=attention_sink, num_warps=4,
    )  # fmt: skip
    return mask.view(torch.bool), lut, count


def mask_to_lut(
    block_mask: torch.Tensor, *, is_causal: bool, block_q: int, block_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mask & causal validity, lut, count)`` of a given ``[B, H, nq, nk]`` bool mask in one launch."""
    B, H, nq, nk = block_mask.shape
    dev = block_mask.device
    mask = torch.empty(B, H, nq, nk, device=dev, dtype=torch.int8)
    lut = torch.empty(B, H, nq, nk, device=dev, dtype=torch.int32)
    count = torch.empty(B, H, nq, device=dev, dtype=torch.int32)
    _mask_to_lut_kernel[(nq, B * H)](
        block_mask.contiguous().view(torch.int8), mask, lut, count, nq, nk, BQ=block_q, BK=block_k,
        CH=_CH, CAUSAL=is_causal, num_warps=4,
    )  # fmt: skip
    return mask.view(torch.bool), lut, count


# ---------------------------------------------------------------------------------------------- stage 2


@triton.jit
def _sparge_fwd_kernel(
    Q,  # [B, H, LQ_PAD, D] int8 (QUANT) or fp32, already times softmax_scale*log2(e)
    K,  # [B, HKV, LK_PAD, D] int8 (QUANT) or fp32, smoothed
    V,  # [B, HKV, LK, D]
    QS,  # [B, H, LQ_PAD / QG] fp32 (QUANT): one scale per QG rows
    KS,  # [B, HKV, NK] fp32 (QUANT)
    LUT,  # [B, H, NQ, NK] int32 active K blocks, ascending
    CNT,  # [B, H, NQ] int32
    LAM,  # [H] fp32 λ (log2 units; read when LAM_PER_HEAD)
    OUT,  # [B, H, LQ, D]
    SKIP,  # [B, H, NQ] int32 PV products skipped
    lam_s,
    H,
    GROUP,
    LQ,
    LK,
    NQ,
    NK,
    D,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    QG: tl.constexpr,
    D_PAD: tl.constexpr,
    QUANT: tl.constexpr,
    CAUSAL: tl.constexpr,
    PV_SKIP: tl.constexpr,
    LAM_PER_HEAD: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    hkv = h // GROUP
    HKV = H // GROUP
    lq_pad = NQ * BLOCK_M
    lk_pad = NK * BLOCK_N

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    dmask = offs_d < D
    row_real = offs_m < LQ

    q = tl.load(Q + pid_bh * lq_pad * D + offs_m[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0)
    q_scale = tl.full([BLOCK_M], 1.0, tl.float32)
    if QUANT:
        q_scale = tl.load(QS + pid_bh * (lq_pad // QG) + offs_m // QG)  # per-row view of the group scales
    k_base = K + (b * HKV + hkv) * lk_pad * D
    v_base = V + (b * HKV + hkv) * LK * D
    lut_row = LUT + (pid_bh * NQ + pid_m) * NK
    count = tl.load(CNT + pid_bh * NQ + pid_m)
    lam = lam_s
    if LAM_PER_HEAD:
        lam = tl.load(LAM + h)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    n_skip = tl.zeros([], tl.int32)
    for t in range(0, count):
        j = tl.load(lut_row + t)
        offs_k = j * BLOCK_N + offs_n
        k = tl.load(k_base + offs_k[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0)
        if QUANT:
            k_scale = tl.load(KS + (b * HKV + hkv) * NK + j)
            s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32) * (q_scale[:, None] * k_scale)
        else:
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        allowed = offs_k[None, :] < LK
        if CAUSAL:
            allowed = allowed & (offs_k[None, :] <= offs_m[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_loc = tl.max(s, axis=1)
        compute = True
        if PV_SKIP:
            # m_i = -inf (nothing seen yet) must compute; clamping avoids the NaN of -inf - -inf.
            diff = tl.where(m_loc == float("-inf"), float("-inf"), m_loc - tl.maximum(m_i, -3.0e38))
            diff = tl.where(row_real, diff, float("-inf"))
            compute = tl.max(diff, axis=0) >= -lam
            n_skip += tl.where(compute, 0, 1)
        if compute:
            m_new = tl.maximum(m_i, m_loc)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(
                v_base + offs_k[:, None] * D + offs_d[None, :],
                mask=(offs_k[:, None] < LK) & dmask[None, :],
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
    o = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
    tl.store(
        OUT + pid_bh * LQ * D + offs_m[:, None] * D + offs_d[None, :],
        o.to(OUT.dtype.element_ty),
        mask=row_real[:, None] & dmask[None, :],
    )
    tl.store(SKIP + pid_bh * NQ + pid_m, n_skip)


def _fwd_warps(d_pad: int, exact_fp32: bool) -> int:
    # 4 warps hold a 128 x 64 tile's accumulators in registers; wider heads, and the exact-fp32 path (no
    # tensor cores, fp32 operands), need 8 to keep register spills down (see _inspect.compile_for_target).
    return 8 if d_pad > 64 or exact_fp32 else 4


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
    pv_threshold: float | torch.Tensor | None,
    block_q: int,
    block_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`icml25.kernels.sparse_attention.reference.sparse_flash_forward`.

    ``pv_threshold`` may be a float, an ``[H]`` tensor or ``None`` (no skip: decided on the host, so the
    kernel is specialised without reading λ back from the device).
    """
    B, H, lq_pad, d = q_op.shape
    hkv = k_op.shape[1]
    nq, nk = lq_pad // block_q, lut.shape[-1]
    quant = q_scale is not None
    o = torch.empty(B, H, lq, d, device=v.device, dtype=v.dtype)
    skip = torch.empty(B, H, nq, device=v.device, dtype=torch.int32)  # every program writes its entry
    lam_p, lam_s, lam_h = _hyper(pv_threshold if pv_threshold is not None else float("inf"), v.device)
    exact_fp32 = v.dtype == torch.float32  # fp32 operands take IEEE products, which also need 8 warps
    d_pad = _d_pad(d)
    _sparge_fwd_kernel[(nq, B * H)](
        q_op.contiguous(), k_op.contiguous(), v.contiguous(),
        q_scale.contiguous() if quant else skip, k_scale.contiguous() if quant else skip,
        lut.contiguous(), count.contiguous(), lam_p if lam_h else skip, o, skip,
        lam_s, H, H // hkv, lq, lk, nq, nk, d,
        BLOCK_M=block_q, BLOCK_N=block_k, QG=lq_pad // q_scale.shape[-1] if quant else block_q, D_PAD=d_pad,
        QUANT=quant, CAUSAL=is_causal, PV_SKIP=pv_threshold is not None, LAM_PER_HEAD=lam_h,
        # fp32 operands: exact fp32 products (TF32 would break the SDPA equivalence); fp16/bf16 ignore it.
        PRECISION="ieee" if exact_fp32 else "tf32",
        num_warps=_fwd_warps(d_pad, exact_fp32), num_stages=3,
    )  # fmt: skip
    return o, skip
