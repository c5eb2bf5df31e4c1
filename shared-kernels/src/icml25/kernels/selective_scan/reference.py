"""Stochastic Layer-Wise Shuffle for Vision Mamba — ICML 2025, P13: the PyTorch selective-scan (S6) reference.

The selective state-space scan of Mamba (Gu & Dao, 2023; the ``selective_scan_ref`` semantics of
``state-spaces/mamba``), used by the Vision Mamba backbone of SLWS (Huang et al., "Stochastic Layer-Wise
Shuffle for Improving Vision Mamba Training", ICML 2025; official code ``huangzizheng01/ShuffleMamba``).
Plain PyTorch: the executable specification of the Triton kernels in ``triton.py`` and their test oracle;
runs on any device.

Layout (Mamba's): ``u, delta, z [B, D, L]`` (batch, channels, sequence), ``A [D, N]`` (a diagonal state
matrix per channel, ``N`` states), ``B, C [B, N, L]`` (input-dependent, shared by the channels), ``D [D]``
(skip), ``delta_bias [D]``. With ``Δ = softplus(delta + delta_bias)`` (or ``delta + delta_bias`` without
softplus), per channel ``d`` and state ``n``::

    x_t[d, n] = exp(Δ_t[d] · A[d, n]) · x_{t-1}[d, n] + Δ_t[d] · B_t[n] · u_t[d]      (x_{-1} = 0)
    y_t[d]    = Σ_n C_t[n] · x_t[d, n] + D[d] · u_t[d]
    out_t[d]  = y_t[d] · silu(z_t[d])                                                   (when z is given)

Two equivalent forms (the tests check that they agree):

* :func:`selective_scan_reference` — the recurrence, one timestep at a time (the specification);
* :func:`selective_scan_chunked_reference` — chunks of ``chunk_size`` timesteps: within a chunk the
  recurrence is unrolled in closed form, ``x_t = e^{S_t} x_{-1} + Σ_{s <= t} e^{S_t - S_s} Δ_s B_s u_s``
  with ``S_t = Σ_{r <= t} Δ_r A`` (a [T, T] decay matrix per channel and state), and the state is carried
  from chunk to chunk. O(B·D·T²·N) memory per chunk.

Both compute in the dtype of ``u`` (``A``, ``D``, ``delta_bias`` are cast to it) and return ``out`` in that
dtype and the last state ``x_{L-1} [B, D, N]``. Arguments are not validated here; the public ops in
:mod:`icml25.kernels.selective_scan` validate.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["effective_delta", "selective_scan_chunked_reference", "selective_scan_reference", "skip_and_gate"]


def effective_delta(
    delta: torch.Tensor, delta_bias: torch.Tensor | None, delta_softplus: bool
) -> torch.Tensor:
    """``Δ = softplus(delta + delta_bias[:, None])`` (or without softplus): [B, D, L]."""
    if delta_bias is not None:
        delta = delta + delta_bias.to(delta.dtype)[:, None]
    return F.softplus(delta) if delta_softplus else delta


def skip_and_gate(
    y: torch.Tensor, u: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None
) -> torch.Tensor:
    """``(y + D u) · silu(z)``: the skip and the gate, [B, D, L]."""
    if D is not None:
        y = y + u * D.to(u.dtype)[:, None]
    if z is not None:
        y = y * F.silu(z)
    return y


def selective_scan_reference(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selective scan as a sequential recurrence over ``L`` (see the module docstring).

    Args:
        u, delta: [B, D, L]; A: [D, N]; B, C: [B, N, L]; D, delta_bias: [D] or None; z: [B, D, L] or None.

    Returns:
        ``(out [B, D, L], last_state [B, D, N])`` in u's dtype.
    """
    dt = u.dtype
    delta = effective_delta(delta.to(dt), delta_bias, delta_softplus)
    A = A.to(dt)
    Bsz, Dch, _ = u.shape
    x = u.new_zeros(Bsz, Dch, A.shape[1])
    dA = torch.exp(delta[..., None] * A[:, None, :])  # [B, D, L, N]
    dBu = (delta * u)[..., None] * B.to(dt).transpose(1, 2)[:, None]  # [B, D, L, N]
    Ct = C.to(dt).transpose(1, 2)  # [B, L, N]
    # unbind (not dA[:, :, t]): its backward is one stack, where L selects would each fill a full-size grad
    xs = []
    for a_t, b_t in zip(dA.unbind(2), dBu.unbind(2)):
        x = a_t * x + b_t
        xs.append(x)
    y = torch.einsum("bdln,bln->bdl", torch.stack(xs, dim=2), Ct) if xs else u.new_zeros(Bsz, Dch, 0)
    return skip_and_gate(y, u, D, z), x


def selective_scan_chunked_reference(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    chunk_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selective scan chunk by chunk, each chunk in closed (parallel) form; equals
    :func:`selective_scan_reference` up to rounding. Arguments and returns as there, plus ``chunk_size``
    (timesteps per chunk ≥ 1; it need not divide ``L``)."""
    dt = u.dtype
    delta = effective_delta(delta.to(dt), delta_bias, delta_softplus)
    A = A.to(dt)
    Bt, Ct = B.to(dt).transpose(1, 2), C.to(dt).transpose(1, 2)  # [B, L, N]
    Bsz, Dch, L = u.shape
    x = u.new_zeros(Bsz, Dch, A.shape[1])
    ys = []
    for t0 in range(0, L, chunk_size):
        t1 = min(t0 + chunk_size, L)
        T = t1 - t0
        dl = delta[:, :, t0:t1]  # [B, D, T]
        S = torch.cumsum(dl[..., None] * A[:, None, :], dim=2)  # [B, D, T, N]: Σ_{r<=t} Δ_r A
        causal = torch.ones(T, T, dtype=torch.bool, device=u.device).tril()  # s <= t
        diff = S[:, :, :, None, :] - S[:, :, None, :, :]  # [B, D, T(t), T(s), N]
        # Mask before exp: for s > t the difference may be large and positive (overflow, then 0 · inf).
        decay = torch.exp(diff.masked_fill(~causal[None, None, :, :, None], float("-inf")))
        bu = (dl * u[:, :, t0:t1])[..., None] * Bt[:, None, t0:t1]  # [B, D, T(s), N]
        xs = torch.einsum("bdtsn,bdsn->bdtn", decay, bu) + torch.exp(S) * x[:, :, None]
        ys.append(torch.einsum("bdtn,btn->bdt", xs, Ct[:, t0:t1]))
        x = xs[:, :, -1]
    y = torch.cat(ys, dim=-1) if ys else u.new_zeros(Bsz, Dch, 0)
    return skip_and_gate(y, u, D, z), x
