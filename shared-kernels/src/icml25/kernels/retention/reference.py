"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: the PyTorch retention reference.

Multi-scale retention (RetNet, Sun et al. 2023) in the block-by-timestep layout of Sable (Mahjoub et al.,
ICML 2025; official JAX code ``instadeepai/Mava``, ``mava/networks/retention.py``). Plain PyTorch, the
executable specification of the Triton kernel in ``triton.py`` and its test oracle; runs on any device.

Shapes: ``q, k [B, H, N, Dk]``, ``v [B, H, N, Dv]``, ``state [B, H, Dk, Dv]``, ``kappa [H]`` (one decay per
head), ``dones [B, T]`` bool at the timestep level, with ``N = T * n_agents``.

*Layout.* Token ``n`` is agent ``n % n_agents`` of timestep ``t(n) = n // n_agents`` (ordered by timestep,
then agent). Plain RetNet is ``n_agents = 1``.

*Decay.* ``D[n, m] = κ_h^(t(n) - t(m))`` if ``t(m) <= t(n)`` and no reset lies in ``(t(m), t(n)]``, else 0:
all agents of one timestep share the exponent (0 within a timestep), so the encoder sees every agent of its
own and earlier timesteps. ``dones[b, t]`` true means timestep ``t`` starts a new episode (Mava's
convention: the decay matrix restarts at ``(t, t)``), so nothing before ``t`` reaches ``t`` or later.
``causal_agents=True`` (the decoder, Mava's ``masked=True``) multiplies ``D`` by the lower-triangular mask
over the flattened sequence: agent ``i`` sees agents ``<= i`` of its own timestep.

*State.* ``S_t = Σ_{m: t(m) <= t} D_t[m] k_mᵀ v_m`` (the row of the last token of timestep ``t``), so that
``S_t = δ_t κ S_{t-1} + K_tᵀ V_t`` with ``δ_t = 0`` when timestep ``t`` resets. A call with an incoming
``state`` treats it as ``S_{-1}``: it reaches timestep ``t`` with weight ``κ^(t+1)`` until the first reset.

Three equivalent forms (the tests check that they agree):

* :func:`retention_parallel_reference` — ``(Q Kᵀ ⊙ D) V`` plus the incoming state's term; O(N²) memory.
* :func:`retention_recurrent_reference` — one timestep at a time (:func:`retention_step_reference`).
* :func:`retention_chunkwise_reference` — Mava's chunkwise form over chunks of ``chunk_size`` timesteps
  (the last chunk may be shorter): ``inner_i = (Q_i K_iᵀ ⊙ D_i) V_i``, ``cross_i = (Q_i R_{i-1}) ⊙ ξ`` with
  ``ξ_j = κ^(j+1)`` before the chunk's first reset and 0 from it on, and
  ``R_i = K_iᵀ (V_i ⊙ ζ) + δ_i κ^(T_c) R_{i-1}`` with ``ζ`` the last row of ``D_i`` (``κ^(T_c-1-j)``,
  zero before the chunk's last reset) and ``δ_i = 0`` if any timestep of the chunk resets.

Not here (the caller's part of a retention layer): the projections, the group norm and swish gate, and
what one Mava version (commit 018a433) adds and another (commit 6ab5197) lacks: the ``d^-1/2`` key
scaling (scale ``k`` before the call) and the decay-row-sum / |QK| clipping normalisation (omitted).
Arguments are not validated here; the public ops in :mod:`icml25.kernels.retention` validate.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "chunk_decay_matrix",
    "default_kappas",
    "retention_chunkwise_reference",
    "retention_parallel_reference",
    "retention_recurrent_reference",
    "retention_step_reference",
]


def default_kappas(n_head: int, decay_scaling_factor: float = 1.0) -> torch.Tensor:
    """Sable's per-head decays ``κ_h = (1 - exp(linspace(log 1/32, log 1/512, n_head))) · factor`` (float64 [H]).

    One head gives ``1 - 1/32``; Mava's ``rec_retention.yaml`` uses ``decay_scaling_factor = 0.8``.
    """
    lin = torch.linspace(math.log(1 / 32), math.log(1 / 512), n_head, dtype=torch.float64)
    return (1.0 - torch.exp(lin)) * decay_scaling_factor


def _timestep_decay(log_kappa: torch.Tensor, T: int) -> torch.Tensor:
    """``κ_h^(i - j)`` for ``j <= i`` and 0 above the diagonal: [H, T, T] (before any reset mask)."""
    t = torch.arange(T, device=log_kappa.device)
    diff = t[:, None] - t[None, :]
    dec = torch.exp(log_kappa[:, None, None] * diff.clamp(min=0).to(log_kappa.dtype))
    return dec * (diff >= 0)


def _to_tokens(x: torch.Tensor, n_agents: int) -> torch.Tensor:
    """Repeat the last two (timestep) axes ``n_agents`` times: [..., T, T] -> [..., T·A, T·A]."""
    return x.repeat_interleave(n_agents, dim=-2).repeat_interleave(n_agents, dim=-1)


def _causal(D: torch.Tensor, causal_agents: bool) -> torch.Tensor:
    return D.tril() if causal_agents else D


def retention_parallel_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kappa: torch.Tensor,
    *,
    n_agents: int = 1,
    dones: torch.Tensor | None = None,
    causal_agents: bool = False,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Parallel form ``out = (Q Kᵀ ⊙ D) V + (Q S) ⊙ ξ`` over the whole sequence.

    The reset structure comes from episode ids: ``seg[t] = Σ_{t' <= t} dones[t']``; ``D[n, m] > 0`` needs
    ``seg[t(n)] == seg[t(m)]``, and the incoming state reaches only timesteps with ``seg == 0``.

    Args:
        q, k: [B, H, N, Dk]; v: [B, H, N, Dv]; kappa: [H] in (0, 1]; dones: [B, T] bool or None;
        state: [B, H, Dk, Dv] or None (zeros).

    Returns:
        ``(out [B, H, N, Dv], new_state [B, H, Dk, Dv])``.
    """
    B, _, N, _ = q.shape
    T = N // n_agents
    log_k = torch.log(kappa.to(q.dtype))
    seg = torch.zeros(B, T, dtype=torch.long, device=q.device)
    if dones is not None:
        seg = torch.cumsum(dones.long(), dim=1)
    same = seg[:, :, None] == seg[:, None, :]  # [B, T, T]
    Dt = _timestep_decay(log_k, T)[None] * same[:, None]  # [B, H, T, T]
    D = _causal(_to_tokens(Dt, n_agents), causal_agents)
    out = ((q @ k.transpose(-1, -2)) * D) @ v
    # zeta: weight of token m in the state after the last timestep = the last timestep's row of D.
    zeta = Dt[..., -1, :].repeat_interleave(n_agents, dim=-1) if T else Dt[..., 0, :0]
    new_state = k.transpose(-1, -2) @ (v * zeta[..., None])
    if state is not None:
        t = torch.arange(T, device=q.device, dtype=q.dtype)
        xi = torch.exp(log_k[:, None] * (t + 1))[None] * (seg == 0)[:, None]  # [B, H, T]
        out = out + (q @ state) * xi.repeat_interleave(n_agents, dim=-1)[..., None]
        reach = seg[:, -1] == 0 if T else torch.ones(B, dtype=torch.bool, device=q.device)
        carry = torch.exp(log_k * T)[None] * reach[:, None]  # [B, H]
        new_state = new_state + state * carry[..., None, None]
    return out, new_state


def retention_step_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kappa: torch.Tensor,
    state: torch.Tensor | None = None,
    *,
    done: torch.Tensor | None = None,
    causal_agents: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recurrent form, one timestep: ``S_t = δ_t κ S_{t-1} + K_tᵀ V_t`` and ``out_t = Q_t S_t``.

    With ``causal_agents`` the current timestep's part is causal over agents:
    ``out_t = Q_t (δ_t κ S_{t-1}) + tril(Q_t K_tᵀ) V_t``.

    Args:
        q, k: [B, H, A, Dk] (the A agents of one timestep); v: [B, H, A, Dv]; kappa: [H];
        state: [B, H, Dk, Dv] or None (zeros); done: [B] bool (timestep starts a new episode) or None.

    Returns:
        ``(out [B, H, A, Dv], new_state [B, H, Dk, Dv])``.
    """
    B, H, _, Dk = q.shape
    if state is None:
        state = q.new_zeros(B, H, Dk, v.shape[-1])
    decay = kappa.to(q.dtype)[None, :].expand(B, H)
    if done is not None:
        decay = decay * (~done.bool())[:, None]
    prev = state * decay[..., None, None]
    qk = q @ k.transpose(-1, -2)
    out = q @ prev + _causal(qk, causal_agents) @ v
    return out, prev + k.transpose(-1, -2) @ v


def retention_recurrent_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kappa: torch.Tensor,
    *,
    n_agents: int = 1,
    dones: torch.Tensor | None = None,
    causal_agents: bool = False,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recurrent form over the sequence: :func:`retention_step_reference` once per timestep (arguments as
    :func:`retention_parallel_reference`)."""
    B, H, N, Dk = q.shape
    A = n_agents
    s = state if state is not None else q.new_zeros(B, H, Dk, v.shape[-1])
    outs = []
    for t in range(N // A):
        sl = slice(t * A, (t + 1) * A)
        done = dones[:, t] if dones is not None else None
        o, s = retention_step_reference(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], kappa, s, done=done, causal_agents=causal_agents
        )
        outs.append(o)
    out = torch.cat(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])
    return out, s


def chunk_decay_matrix(
    dones: torch.Tensor, kappa: torch.Tensor, n_agents: int, causal_agents: bool
) -> torch.Tensor:
    """Mava's per-chunk decay matrix ``D_i`` [B, H, C, C] (``C = T_c · n_agents``) from chunk dones [B, T_c].

    ``κ^(i - j)`` on and below the timestep diagonal; a reset at timestep ``r`` zeroes rows ``>= r`` at
    columns ``< r`` (the decay restarts at ``(r, r)``); repeated over agents; ``tril`` if ``causal_agents``.
    """
    dec = _timestep_decay(torch.log(kappa), dones.shape[1])  # [H, Tc, Tc]
    # Row i loses column j < i iff a reset r lies in (j, i]: the resets counted up to i exceed those up to j.
    c = torch.cumsum(dones.long(), dim=1)
    cut = c[:, :, None] > c[:, None, :]
    return _causal(_to_tokens(dec[None] * (~cut)[:, None], n_agents), causal_agents)


def _chunk_xi(dones: torch.Tensor, kappa: torch.Tensor, n_agents: int) -> torch.Tensor:
    """``ξ`` [B, H, C]: ``κ^(j+1)`` for timesteps ``j`` before the chunk's first reset, 0 from it on."""
    B, Tc = dones.shape
    d = dones.long()
    first = torch.where(d.any(dim=1), d.argmax(dim=1), torch.full((B,), Tc, device=dones.device))
    j = torch.arange(Tc, device=dones.device)
    pw = torch.exp(torch.log(kappa)[:, None] * (j + 1).to(kappa.dtype))  # [H, Tc]
    xi = pw[None] * (j[None, :] < first[:, None])[:, None]
    return xi.repeat_interleave(n_agents, dim=-1)


def retention_chunkwise_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kappa: torch.Tensor,
    *,
    n_agents: int = 1,
    dones: torch.Tensor | None = None,
    causal_agents: bool = False,
    state: torch.Tensor | None = None,
    chunk_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunkwise form over chunks of ``chunk_size`` timesteps, state carried across chunks (Mava's update).

    Memory is O(B·H·C²) for chunks of ``C = chunk_size · n_agents`` tokens instead of the parallel form's
    O(B·H·N²). Arguments as :func:`retention_parallel_reference`; ``chunk_size`` need not divide ``T``.
    """
    B, H, N, Dk = q.shape
    A = n_agents
    T = N // A
    kap = kappa.to(q.dtype)
    log_k = torch.log(kap)
    R = state if state is not None else q.new_zeros(B, H, Dk, v.shape[-1])
    if dones is None:
        dones = torch.zeros(B, T, dtype=torch.bool, device=q.device)
    outs = []
    for t0 in range(0, T, chunk_size):
        t1 = min(t0 + chunk_size, T)
        sl = slice(t0 * A, t1 * A)
        qc, kc, vc, dc = q[:, :, sl], k[:, :, sl], v[:, :, sl], dones[:, t0:t1]
        D = chunk_decay_matrix(dc, kap, A, causal_agents)  # [B, H, C, C]
        inner = ((qc @ kc.transpose(-1, -2)) * D) @ vc
        cross = (qc @ R) * _chunk_xi(dc, kap, A)[..., None]
        outs.append(inner + cross)
        delta = (~dc.any(dim=1)).to(q.dtype)  # [B]
        carry = torch.exp(log_k * (t1 - t0))[None] * delta[:, None]  # [B, H]
        R = kc.transpose(-1, -2) @ (vc * D[..., -1, :, None]) + R * carry[..., None, None]
    out = torch.cat(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])
    return out, R
