"""Triton kernel for chunkwise multi-scale retention (Sable / RetNet), forward pass.

One program owns one ``(batch, head)`` pair and one block of ``BLOCK_DV`` (≤ 32) value features, keeps the
state ``S [Dk, BLOCK_DV]`` in registers (float32) and walks the chunks of ``chunk_t`` timesteps in order
(``C = chunk_t · n_agents`` tokens, zero-padded to ``BLOCK_C``, a power of two ≥ 16). Per chunk:

* decay: ``D[n, m] = exp(log κ · (t(n) - t(m)))`` where ``t(m) <= t(n)`` (``m <= n`` if ``CAUSAL``) and both
  tokens lie in the same episode (``seg``: the number of resets up to each timestep, from the wrapper);
* ``out = (Q Kᵀ ⊙ D) V + (Q S) ⊙ ξ`` with ``ξ = κ^(j+1)`` for timesteps still in the episode the chunk
  started in, 0 after a reset;
* ``S ← δ κ^(T_c) S + Kᵀ (V ⊙ ζ)``, ``ζ = κ^(T_c - 1 - j)`` for tokens in the chunk's last episode, ``δ = 0``
  when the chunk contains a reset.

The matmuls run on float32 operands in IEEE precision (no TF32), accumulation in float32 whatever the
storage dtype. Compiled ahead of time for sm_90 without a GPU (Triton 3.9): the 16-token/16-dim tile uses
8 KB of shared memory; the largest tile the op launches (64 tokens, Dk 64, 32 value features, causal)
108 KB, with register spills (529 STL; FFMA dots, untuned). Larger tiles were not verified, so the public
op caps chunks and head dims at 64. The backward pass is not a Triton kernel:
:mod:`icml25.kernels.retention` recomputes the chunkwise reference under autograd. Imported lazily by ``icml25.kernels.retention``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _retention_chunk_fwd_kernel(
    q_ptr,  # [B, H, N, Dk]
    k_ptr,  # [B, H, N, Dk]
    v_ptr,  # [B, H, N, Dv]
    logk_ptr,  # [H] float32 log κ
    seg_ptr,  # [B, T] int32 episode index of each timestep (cumulative resets)
    s0_ptr,  # [B, H, Dk, Dv] float32 incoming state
    out_ptr,  # [B, H, N, Dv] float32
    sn_ptr,  # [B, H, Dk, Dv] float32 outgoing state
    H,
    N,
    T,
    Dk,
    Dv,
    n_agents,
    chunk_t,
    n_chunks,
    CAUSAL: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs_c = tl.arange(0, BLOCK_C)
    mask_dk = offs_dk < Dk
    mask_dv = offs_dv < Dv
    mask_s = mask_dk[:, None] & mask_dv[None, :]
    lk = tl.load(logk_ptr + h)

    q_base = q_ptr + bh * N * Dk
    k_base = k_ptr + bh * N * Dk
    v_base = v_ptr + bh * N * Dv
    o_base = out_ptr + bh * N * Dv
    s_off = bh * Dk * Dv + offs_dk[:, None] * Dv + offs_dv[None, :]
    S = tl.load(s0_ptr + s_off, mask=mask_s, other=0.0)
    seg_prev = tl.load(seg_ptr + b * T) * 0  # episode 0 holds the incoming state

    for c in range(n_chunks):
        t0 = c * chunk_t
        t1 = tl.minimum(t0 + chunk_t, T)
        offs_n = t0 * n_agents + offs_c
        mask_n = offs_n < t1 * n_agents
        ts = offs_n // n_agents
        seg_n = tl.load(seg_ptr + b * T + ts, mask=mask_n, other=-1)
        seg_last = tl.load(seg_ptr + b * T + t1 - 1)

        q = tl.load(
            q_base + offs_n[:, None] * Dk + offs_dk[None, :],
            mask=mask_n[:, None] & mask_dk[None, :],
            other=0.0,
        )
        k = tl.load(
            k_base + offs_n[:, None] * Dk + offs_dk[None, :],
            mask=mask_n[:, None] & mask_dk[None, :],
            other=0.0,
        )
        v = tl.load(
            v_base + offs_n[:, None] * Dv + offs_dv[None, :],
            mask=mask_n[:, None] & mask_dv[None, :],
            other=0.0,
        )
        q = q.to(tl.float32)
        k = k.to(tl.float32)
        v = v.to(tl.float32)

        # inner-chunk decay D [BLOCK_C, BLOCK_C]
        diff = ts[:, None] - ts[None, :]
        vis = (seg_n[:, None] == seg_n[None, :]) & mask_n[:, None] & mask_n[None, :]
        if CAUSAL:
            vis = vis & (offs_n[None, :] <= offs_n[:, None])
        else:
            vis = vis & (diff >= 0)
        dec = tl.where(vis, tl.exp(lk * tl.maximum(diff, 0).to(tl.float32)), 0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * dec
        acc = tl.dot(qk, v, input_precision="ieee")

        # cross-chunk term from the carried state
        lt = (ts - t0).to(tl.float32)
        xi = tl.where(mask_n & (seg_n == seg_prev), tl.exp(lk * (lt + 1.0)), 0.0)
        acc += tl.dot(q, S, input_precision="ieee") * xi[:, None]
        tl.store(
            o_base + offs_n[:, None] * Dv + offs_dv[None, :], acc, mask=mask_n[:, None] & mask_dv[None, :]
        )

        # state update
        t_span = (t1 - t0).to(tl.float32)
        zeta = tl.where(mask_n & (seg_n == seg_last), tl.exp(lk * (t_span - 1.0 - lt)), 0.0)
        carry = tl.where(seg_last == seg_prev, tl.exp(lk * t_span), 0.0)
        S = S * carry + tl.dot(tl.trans(k * zeta[:, None]), v, input_precision="ieee")
        seg_prev = seg_last

    tl.store(sn_ptr + s_off, S, mask=mask_s)


def chunk_tokens_block(chunk_t: int, n_agents: int) -> int:
    """The padded token tile ``BLOCK_C`` of a chunk of ``chunk_t`` timesteps of ``n_agents`` tokens."""
    return max(16, triton.next_power_of_2(chunk_t * n_agents))


def retention_chunkwise_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_kappa: torch.Tensor,
    seg: torch.Tensor,
    state: torch.Tensor,
    *,
    n_agents: int,
    causal_agents: bool,
    chunk_t: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, H, N, Dv], new_state [B, H, Dk, Dv])`` in float32 (see the module docstring).

    ``log_kappa`` [H] float32, ``seg`` [B, T] int32, ``state`` [B, H, Dk, Dv] float32; shapes are validated
    by the public op.
    """
    B, H, N, Dk = q.shape
    Dv = v.shape[-1]
    T = N // n_agents
    out = torch.empty(B, H, N, Dv, dtype=torch.float32, device=q.device)
    new_state = torch.empty(B, H, Dk, Dv, dtype=torch.float32, device=q.device)
    block_dk = max(16, triton.next_power_of_2(Dk))
    block_dv = min(32, max(16, triton.next_power_of_2(Dv)))
    block_c = chunk_tokens_block(chunk_t, n_agents)
    grid = (B * H, triton.cdiv(Dv, block_dv))
    _retention_chunk_fwd_kernel[grid](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        log_kappa.contiguous(),
        seg.contiguous(),
        state.contiguous(),
        out,
        new_state,
        H,
        N,
        T,
        Dk,
        Dv,
        n_agents,
        chunk_t,
        triton.cdiv(T, chunk_t),
        CAUSAL=causal_agents,
        BLOCK_C=block_c,
        BLOCK_DK=block_dk,
        BLOCK_DV=block_dv,
        num_warps=4 if block_c * block_dk <= 64 * 64 else 8,
    )
    return out, new_state
