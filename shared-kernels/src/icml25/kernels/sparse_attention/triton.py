"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025 — P01.

Triton kernels of the SpargeAttn op (imported only when the Triton backend is selected):

* ``_block_stats_kernel`` — grid ``(B*H, n_blocks)``: one pass over a block writes its pooled mean,
  self-similarity, and (optionally) INT8 values + fp32 scale of the smoothed / pre-scaled block.
* ``_sparge_fwd_kernel`` — grid ``(nq, B*H)``: one program per Q block loops over the active K blocks of its
  LUT row only (no loads for skipped tiles), ``tl.dot(int8, int8) -> int32`` for QKᵀ, exp2 online softmax,
  the per-program λ skip of the PV product, element masking on causal-diagonal and ragged tiles, GQA by
  ``h // group``.

The mask selection between the two (a small ``nq × nk`` softmax/sort/cumsum) and the mask→LUT conversion
stay in torch (``reference.select_blocks`` / ``reference.mask_to_lut``), as in the official code.
The math is specified by ``reference.py``; tests compare both under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from icml25.kernels.sparse_attention.reference import num_blocks


@triton.jit
def _block_stats_kernel(
    X,  # [B*H, L, D] contiguous
    MEAN,  # [B*H, D] (read only when HAS_MEAN)
    POOLED,  # [B*H, NB, D] fp32
    SIM,  # [B*H, NB] fp32
    XQ,  # [B*H, NB*BS, D] int8 (written only when QUANT)
    SCALE,  # [B*H, NB] fp32
    quant_scale,
    L,
    D,
    NB,
    BS: tl.constexpr,
    D_PAD: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    QUANT: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    nb = tl.program_id(1)
    offs_r = nb * BS + tl.arange(0, BS)
    offs_d = tl.arange(0, D_PAD)
    rmask = offs_r < L
    dmask = offs_d < D
    x = tl.load(
        X + bh * L * D + offs_r[:, None] * D + offs_d[None, :],
        mask=rmask[:, None] & dmask[None, :],
        other=0.0,
    )
    x = x.to(tl.float32)
    if HAS_MEAN:
        mu = tl.load(MEAN + bh * D + offs_d, mask=dmask, other=0.0).to(tl.float32)
        # Re-zero the padded rows so they stay out of the pooled mean, the similarity and the scale.
        x = tl.where(rmask[:, None], x - mu[None, :], 0.0)
    n = tl.minimum(L - nb * BS, BS).to(tl.float32)  # real rows of a possibly partial last block
    tl.store(POOLED + (bh * NB + nb) * D + offs_d, tl.sum(x, axis=0) / n, mask=dmask)
    # Mean pairwise cosine = |sum of unit rows|^2 / n^2 (no n x n Gram matrix needed).
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    unit = x / tl.where(norm > 0, norm, 1.0)[:, None]
    s = tl.sum(unit, axis=0)
    tl.store(SIM + bh * NB + nb, tl.sum(s * s, axis=0) / (n * n))
    if QUANT:
        xs = x * quant_scale
        scale = tl.max(tl.max(tl.abs(xs), axis=1), axis=0) / 127.0
        scale = tl.where(scale > 0, scale, 1.0)
        y = xs / scale
        r = tl.where(y >= 0, tl.floor(y + 0.5), tl.ceil(y - 0.5))  # round half away from zero
        r = tl.minimum(tl.maximum(r, -127.0), 127.0)
        tl.store(
            XQ + bh * NB * BS * D + offs_r[:, None] * D + offs_d[None, :], r.to(tl.int8), mask=dmask[None, :]
        )
        tl.store(SCALE + bh * NB + nb, scale)


def block_stats(
    x: torch.Tensor,
    block: int,
    *,
    mean: torch.Tensor | None = None,
    quant_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Triton version of :func:`icml25.kernels.sparse_attention.reference.block_stats` (same signature)."""
    B, H, L, d = x.shape
    nb = num_blocks(L, block)
    x = x.contiguous()
    dev = x.device
    pooled = torch.empty(B, H, nb, d, device=dev, dtype=torch.float32)
    sim = torch.empty(B, H, nb, device=dev, dtype=torch.float32)
    quant = quant_scale is not None
    # Padded rows of the INT8 tensor are written as zeros by the kernel (their x is 0).
    xq = torch.empty(B, H, nb * block, d, device=dev, dtype=torch.int8) if quant else sim
    scale = torch.empty(B, H, nb, device=dev, dtype=torch.float32) if quant else sim
    mean_t = mean.float().contiguous() if mean is not None else sim
    _block_stats_kernel[(B * H, nb)](
        x, mean_t, pooled, sim, xq, scale, float(quant_scale or 1.0), L, d, nb,
        BS=block, D_PAD=_d_pad(d), HAS_MEAN=mean is not None, QUANT=quant,
        num_warps=4 if block * _d_pad(d) <= 8192 else 8,
    )  # fmt: skip
    return pooled, sim, (xq if quant else None), (scale if quant else None)


@triton.jit
def _sparge_fwd_kernel(
    Q,  # [B, H, LQ_PAD, D] int8 (QUANT) or fp32, already times softmax_scale*log2(e)
    K,  # [B, HKV, LK_PAD, D] int8 (QUANT) or fp32, smoothed
    V,  # [B, HKV, LK, D]
    QS,  # [B, H, NQ] fp32 (QUANT)
    KS,  # [B, HKV, NK] fp32 (QUANT)
    LUT,  # [B, H, NQ, NK] int32 active K blocks, ascending
    CNT,  # [B, H, NQ] int32
    LAM,  # [H] fp32 λ (log2 units)
    OUT,  # [B, H, LQ, D]
    SKIP,  # [B, H, NQ] int32 PV products skipped
    H,
    GROUP,
    LQ,
    LK,
    NQ,
    NK,
    D,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_PAD: tl.constexpr,
    QUANT: tl.constexpr,
    CAUSAL: tl.constexpr,
    PV_SKIP: tl.constexpr,
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
    q_scale = 1.0
    if QUANT:
        q_scale = tl.load(QS + pid_bh * NQ + pid_m)
    k_base = K + (b * HKV + hkv) * lk_pad * D
    v_base = V + (b * HKV + hkv) * LK * D
    lut_row = LUT + (pid_bh * NQ + pid_m) * NK
    count = tl.load(CNT + pid_bh * NQ + pid_m)
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
            s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32) * (q_scale * k_scale)
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


def _d_pad(d: int) -> int:
    # tl.dot needs power-of-two tiles of at least 16 (32 for the int8 MMA's k dimension); padding d with
    # zero columns changes no dot product, so head_dim 96 runs as 128.
    return max(32, triton.next_power_of_2(d))


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
    """Triton version of :func:`icml25.kernels.sparse_attention.reference.sparse_flash_forward`."""
    B, H, lq_pad, d = q_op.shape
    hkv = k_op.shape[1]
    nq, nk = lq_pad // block_q, lut.shape[-1]
    quant = q_scale is not None
    o = torch.empty(B, H, lq, d, device=v.device, dtype=v.dtype)
    skip = torch.zeros(B, H, nq, device=v.device, dtype=torch.int32)
    lam = pv_threshold.float().to(v.device).contiguous()
    pv_skip = bool(torch.isfinite(lam).any())
    dummy = skip  # placeholder pointer for unused scale arguments
    d_pad = _d_pad(d)
    _sparge_fwd_kernel[(nq, B * H)](
        q_op.contiguous(), k_op.contiguous(), v.contiguous(),
        q_scale.contiguous() if quant else dummy, k_scale.contiguous() if quant else dummy,
        lut.contiguous(), count.contiguous(), lam, o, skip,
        H, H // hkv, lq, lk, nq, nk, d,
        BLOCK_M=block_q, BLOCK_N=block_k, D_PAD=d_pad, QUANT=quant, CAUSAL=is_causal, PV_SKIP=pv_skip,
        # fp32 operands: exact fp32 products (TF32 would break the SDPA equivalence); fp16/bf16 ignore it.
        PRECISION="ieee" if v.dtype == torch.float32 else "tf32",
        num_warps=4 if d_pad <= 64 else 8, num_stages=3,
    )  # fmt: skip
    return o, skip
