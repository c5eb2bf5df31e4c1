"""Triton kernels for the Mamba selective scan (S6), forward and backward.

The core recurrence only (``Δ`` already includes the bias and softplus; the ``D`` skip and the ``z`` gate
are elementwise torch ops in :mod:`icml25.kernels.selective_scan`)::

    x_t = exp(Δ_t A) ⊙ x_{t-1} + (Δ_t u_t) B_t,      y_t = Σ_n C_t[n] x_t[:, n]

One program owns one batch row and a block of ``BLOCK_D`` (≤ 32) channels, keeps the state
``x [BLOCK_D, BLOCK_N]`` in float32 registers and walks the sequence in order (a sequential scan over L,
parallel over batch × channels, as ``mamba-ssm``'s kernel is within a chunk). The forward stores every
state ``x_t`` (float32, ``[B, D, L, N]``) when a gradient is needed; the backward walks the sequence in
reverse with the adjoint ``h_t = C_t gy_t + exp(Δ_{t+1} A) ⊙ h_{t+1}`` and gives

* ``du_t = Δ_t Σ_n h_t B_t``, ``dΔ_t = Σ_n h_t ⊙ (A e^{Δ_t A} ⊙ x_{t-1} + B_t u_t)``,
* ``dA = Σ_t h_t ⊙ e^{Δ_t A} ⊙ x_{t-1} Δ_t`` (per batch row, summed by the wrapper),
* ``dB_t = Σ_d h_t Δ_t u_t`` and ``dC_t = Σ_d gy_t x_t`` (per channel block, summed by the wrapper),

so the reductions over channels and batch are deterministic (no atomics). Saving all states costs
``4·B·D·L·N`` bytes (``mamba-ssm`` recomputes them per chunk instead; not done here). Any strides are
accepted. Imported lazily by ``icml25.kernels.selective_scan``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _selective_scan_fwd_kernel(
    u_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, y_ptr, xs_ptr, last_ptr,
    Dch, L, N,
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an, s_bb, s_bn, s_bl, s_cb, s_cn, s_cl,
    SAVE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    md = offs_d < Dch
    mn = offs_n < N
    m2 = md[:, None] & mn[None, :]
    a = tl.load(a_ptr + offs_d[:, None] * s_ad + offs_n[None, :] * s_an, mask=m2, other=0.0).to(tl.float32)
    x = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    for t in range(L):
        u = tl.load(u_ptr + b * s_ub + offs_d * s_ud + t * s_ul, mask=md, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + b * s_db + offs_d * s_dd + t * s_dl, mask=md, other=0.0).to(tl.float32)
        bt = tl.load(b_ptr + b * s_bb + offs_n * s_bn + t * s_bl, mask=mn, other=0.0).to(tl.float32)
        ct = tl.load(c_ptr + b * s_cb + offs_n * s_cn + t * s_cl, mask=mn, other=0.0).to(tl.float32)
        x = tl.exp(dt[:, None] * a) * x + (dt * u)[:, None] * bt[None, :]
        y = tl.sum(x * ct[None, :], axis=1)
        tl.store(y_ptr + (b * Dch + offs_d) * L + t, y, mask=md)
        if SAVE:
            tl.store(xs_ptr + ((b * Dch + offs_d[:, None]) * L + t) * N + offs_n[None, :], x, mask=m2)
    tl.store(last_ptr + (b * Dch + offs_d[:, None]) * N + offs_n[None, :], x, mask=m2)


@triton.jit
def _selective_scan_bwd_kernel(
    u_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, xs_ptr, gy_ptr, glast_ptr,
    du_ptr, ddt_ptr, da_ptr, db_ptr, dc_ptr,
    Dch, L, N, n_dblk,
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an, s_bb, s_bn, s_bl, s_cb, s_cn, s_cl,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    offs_d = blk * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    md = offs_d < Dch
    mn = offs_n < N
    m2 = md[:, None] & mn[None, :]
    a = tl.load(a_ptr + offs_d[:, None] * s_ad + offs_n[None, :] * s_an, mask=m2, other=0.0).to(tl.float32)
    state = (b * Dch + offs_d[:, None]) * N + offs_n[None, :]
    h = tl.load(glast_ptr + state, mask=m2, other=0.0)  # adjoint of x_{L-1} from the last-state output
    da = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    part = ((b * n_dblk + blk) * N + offs_n) * L  # [B, n_dblk, N, L] partial sums over this channel block
    for i in range(L):
        t = L - 1 - i
        u = tl.load(u_ptr + b * s_ub + offs_d * s_ud + t * s_ul, mask=md, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + b * s_db + offs_d * s_dd + t * s_dl, mask=md, other=0.0).to(tl.float32)
        bt = tl.load(b_ptr + b * s_bb + offs_n * s_bn + t * s_bl, mask=mn, other=0.0).to(tl.float32)
        ct = tl.load(c_ptr + b * s_cb + offs_n * s_cn + t * s_cl, mask=mn, other=0.0).to(tl.float32)
        gy = tl.load(gy_ptr + (b * Dch + offs_d) * L + t, mask=md, other=0.0).to(tl.float32)
        xt = tl.load(xs_ptr + ((b * Dch + offs_d[:, None]) * L + t) * N + offs_n[None, :], mask=m2, other=0.0)
        tp = offs_d * 0 + t - 1  # a tensor (the interpreter's loop index is a Python int)
        has_prev = (tp >= 0)[:, None] & m2  # x_{-1} = 0
        xp = tl.load(
            xs_ptr + ((b * Dch + offs_d[:, None]) * L + tl.maximum(tp, 0)[:, None]) * N + offs_n[None, :],
            mask=has_prev,
            other=0.0,
        )
        tl.store(dc_ptr + part + t, tl.sum(gy[:, None] * xt, axis=0), mask=mn)
        h += gy[:, None] * ct[None, :]
        ea = tl.exp(dt[:, None] * a)
        g_decay = h * ea * xp  # d loss / d (Δ_t A) through exp(Δ_t A) ⊙ x_{t-1}
        hb = tl.sum(h * bt[None, :], axis=1)
        ddt = tl.sum(g_decay * a, axis=1) + hb * u
        da += g_decay * dt[:, None]
        tl.store(du_ptr + (b * Dch + offs_d) * L + t, hb * dt, mask=md)
        tl.store(ddt_ptr + (b * Dch + offs_d) * L + t, ddt, mask=md)
        tl.store(db_ptr + part + t, tl.sum(h * (dt * u)[:, None], axis=0), mask=mn)
        h = h * ea
    tl.store(da_ptr + state, da, mask=m2)


def _blocks(Dch: int, N: int) -> tuple[int, int]:
    return min(32, max(2, triton.next_power_of_2(Dch))), max(2, triton.next_power_of_2(N))


def _strides(u, dt, A, B, C) -> list[int]:
    return [*u.stride(), *dt.stride(), *A.stride(), *B.stride(), *C.stride()]


def selective_scan_fwd(
    u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, *, save_states: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(y [B, D, L], last_state [B, D, N], states [B, D, L, N] or None)`` in float32.

    ``u, dt [B, D, L]``, ``A [D, N]``, ``B, C [B, N, L]`` on one CUDA device (or the interpreter), any
    strides; ``dt`` is the effective step Δ (bias and softplus applied). Validated by the public op.
    """
    Bsz, Dch, L = u.shape
    N = A.shape[1]
    y = torch.empty(Bsz, Dch, L, dtype=torch.float32, device=u.device)
    last = torch.empty(Bsz, Dch, N, dtype=torch.float32, device=u.device)
    xs = torch.empty(Bsz, Dch, L, N, dtype=torch.float32, device=u.device) if save_states else y
    block_d, block_n = _blocks(Dch, N)
    grid = (Bsz, triton.cdiv(Dch, block_d))
    _selective_scan_fwd_kernel[grid](
        u, dt, A, B, C, y, xs, last, Dch, L, N, *_strides(u, dt, A, B, C),
        SAVE=save_states, BLOCK_D=block_d, BLOCK_N=block_n,
    )  # fmt: skip
    return y, last, xs if save_states else None


def selective_scan_bwd(
    u: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    states: torch.Tensor,
    grad_y: torch.Tensor,
    grad_last: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(du, ddt, dA, dB, dC)`` (float32, shapes of the inputs) of the core scan, from the saved
    ``states [B, D, L, N]``, ``grad_y [B, D, L]`` and ``grad_last [B, D, N]`` (None: zero)."""
    Bsz, Dch, L = u.shape
    N = A.shape[1]
    block_d, block_n = _blocks(Dch, N)
    n_dblk = triton.cdiv(Dch, block_d)
    f32 = {"dtype": torch.float32, "device": u.device}
    du = torch.empty(Bsz, Dch, L, **f32)
    ddt = torch.empty(Bsz, Dch, L, **f32)
    da = torch.empty(Bsz, Dch, N, **f32)
    db = torch.empty(Bsz, n_dblk, N, L, **f32)
    dc = torch.empty(Bsz, n_dblk, N, L, **f32)
    glast = grad_last.float().contiguous() if grad_last is not None else torch.zeros(Bsz, Dch, N, **f32)
    _selective_scan_bwd_kernel[(Bsz, n_dblk)](
        u, dt, A, B, C, states, grad_y.float().contiguous(), glast, du, ddt, da, db, dc,
        Dch, L, N, n_dblk, *_strides(u, dt, A, B, C), BLOCK_D=block_d, BLOCK_N=block_n,
    )  # fmt: skip
    return du, ddt, da.sum(0), db.sum(1), dc.sum(1)
