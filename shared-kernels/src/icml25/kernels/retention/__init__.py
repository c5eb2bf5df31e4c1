"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: chunkwise retention ops.

Multi-scale retention (RetNet / Sable) with per-head decay, episode resets and agent blocks, used by P45
(Sable, Mahjoub et al., ICML 2025; official JAX code ``instadeepai/Mava``, ``mava/networks/retention.py``). The semantics (layout, decay, resets, state) are in
:mod:`icml25.kernels.retention.reference`. Public ops:

* :func:`retention` — chunkwise retention over a sequence of ``T`` timesteps of ``n_agents`` tokens each,
  with an incoming and an outgoing state; training and chunked rollouts. Reference (any device) or Triton
  (CUDA). Differentiable w.r.t. ``q``, ``k``, ``v`` and ``state``.
* :func:`retention_parallel` — the same result from the parallel form ``(Q Kᵀ ⊙ D) V`` (O(N²) memory);
  a readable baseline, torch ops only.
* :func:`retention_step` — the recurrent form for one timestep (acting with carried hidden states); two
  small matmuls, torch ops only.
* :func:`default_kappas` — Sable's per-head decays.

``kappa`` is a constant of the layer (Sable fixes it): it is not differentiated. The Triton path is a
``torch.autograd.Function`` whose forward is the Triton kernel and whose backward **recomputes the chunkwise
reference under autograd** (no Triton backward kernel yet), so its gradients are the reference's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.checks import check_int
from icml25.kernels.retention.reference import (
    default_kappas as _default_kappas,
)
from icml25.kernels.retention.reference import (
    retention_chunkwise_reference,
    retention_parallel_reference,
    retention_recurrent_reference,
    retention_step_reference,
)

__all__ = [
    "MAX_TRITON_CHUNK_TOKENS",
    "default_chunk_size",
    "default_kappas",
    "retention",
    "retention_chunkwise_reference",
    "retention_parallel",
    "retention_parallel_reference",
    "retention_recurrent_reference",
    "retention_step",
    "retention_step_reference",
]

MAX_TRITON_CHUNK_TOKENS = 64
"""Largest chunk (``chunk_size · n_agents`` tokens) the Triton kernel takes in one tile."""
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_TRITON_HEAD_DIM = 64


def default_kappas(n_head: int, decay_scaling_factor: float = 1.0) -> torch.Tensor:
    """Sable's per-head decays: ``κ_h = (1 - exp(linspace(log 1/32, log 1/512, n_head))) · decay_scaling_factor``.

    Args:
        n_head: number of heads H ≥ 1.
        decay_scaling_factor: Mava's multiplier (1.0 in ``MultiScaleRetention``, 0.8 in ``rec_retention.yaml``);
            every κ_h must stay in (0, 1].

    Returns:
        float64 [H], from ``1 - 1/32`` (head 0) to ``1 - 1/512`` (last head), times the factor.
    """
    n_head = check_int(n_head, "n_head", low=1)
    if isinstance(decay_scaling_factor, bool) or not isinstance(decay_scaling_factor, (int, float)):
        raise TypeError(
            f"decay_scaling_factor must be a float, got {decay_scaling_factor!r} "
            f"({type(decay_scaling_factor).__name__})"
        )
    top = 1.0 - 1.0 / 512
    if not (math.isfinite(decay_scaling_factor) and 0.0 < decay_scaling_factor <= 1.0 / top):
        raise ValueError(
            f"decay_scaling_factor must lie in (0, {1.0 / top:.6f}] so that every kappa is in (0, 1], "
            f"got {decay_scaling_factor}"
        )
    return _default_kappas(n_head, float(decay_scaling_factor)).clamp(max=1.0)


def default_chunk_size(n_agents: int) -> int:
    """The default chunk: ``max(1, 64 // n_agents)`` timesteps (about 64 tokens)."""
    return max(1, 64 // check_int(n_agents, "n_agents", low=1))


# ----------------------------------------------------------------------------------------- validation
def _check_qkv(q: object, k: object, v: object, what: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor {what}, got dtype {t.dtype}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D {what}, got shape {tuple(t.shape)}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have the leading dims [B, H, N] = {tuple(q.shape[:3])} of q, got shape {tuple(v.shape)}"
        )


def _check_kappa(kappa: object, H: int, like: torch.Tensor) -> torch.Tensor:
    """kappa (a float, a sequence of H floats, a 0-d or [H] tensor) -> [H] in like's dtype and device."""
    if isinstance(kappa, bool):
        raise TypeError(f"kappa must be a float or a [H] float tensor, got {kappa!r}")
    if isinstance(kappa, (int, float)):
        kap = torch.full((H,), float(kappa), dtype=torch.float64)
    elif isinstance(kappa, torch.Tensor):
        if not kappa.is_floating_point():
            raise TypeError(f"kappa must be a floating-point tensor [H], got dtype {kappa.dtype}")
        if kappa.ndim == 0:
            kap = kappa.detach().double().cpu().expand(H)
        elif kappa.ndim == 1 and kappa.shape[0] == H:
            kap = kappa.detach().double().cpu()
        else:
            raise ValueError(f"kappa must have shape [H] = [{H}] (or be 0-d), got shape {tuple(kappa.shape)}")
    elif isinstance(kappa, Sequence) and not isinstance(kappa, (str, bytes)):
        if len(kappa) != H or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in kappa):
            raise TypeError(f"kappa as a sequence must hold H = {H} floats, got {kappa!r}")
        kap = torch.tensor([float(x) for x in kappa], dtype=torch.float64)
    else:
        raise TypeError(
            f"kappa must be a float, a sequence of floats or a [H] tensor, got {type(kappa).__name__}"
        )
    if kap.numel() and not bool(((kap > 0) & (kap <= 1)).all()):
        raise ValueError(f"kappa must lie in (0, 1] (finite), got {kap.tolist()}")
    return kap.to(dtype=like.dtype, device=like.device)


def _check_dones(dones: object, B: int, T: int, n_agents: int, device: torch.device) -> torch.Tensor | None:
    """dones [B, T] (per timestep) or [B, N] (per token, equal across a timestep's agents) -> [B, T] bool."""
    if dones is None:
        return None
    if not isinstance(dones, torch.Tensor):
        raise TypeError(f"dones must be a torch.Tensor [B, T] or None, got {type(dones).__name__}")
    if dones.is_complex():
        raise TypeError(f"dones must be bool (or 0/1 numbers) [B, T], got dtype {dones.dtype}")
    N = T * n_agents
    if dones.ndim != 2 or dones.shape[0] != B or dones.shape[1] not in (T, N):
        raise ValueError(
            f"dones must have shape [B, T] = [{B}, {T}] (per timestep) or [B, N] = [{B}, {N}] (per token), "
            f"got {tuple(dones.shape)}"
        )
    if dones.dtype != torch.bool:
        if dones.numel() and not bool(((dones == 0) | (dones == 1)).all()):
            raise ValueError(f"dones must hold only 0/1 (or bool) values, got dtype {dones.dtype}")
        dones = dones != 0
    dones = dones.to(device)
    if dones.shape[1] == N and n_agents > 1:
        per_t = dones.reshape(B, T, n_agents)
        if not bool((per_t == per_t[..., :1]).all()):
            raise ValueError(
                f"dones must be equal across the {n_agents} agents of each timestep (Sable assumes "
                "team-level termination); pass dones [B, T] per timestep"
            )
        dones = per_t[..., 0]
    return dones


def _check_state(state: object, q: torch.Tensor, v: torch.Tensor) -> None:
    if state is None:
        return
    B, H, _, Dk = q.shape
    want = (B, H, Dk, v.shape[-1])
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state must be a torch.Tensor {list(want)} or None, got {type(state).__name__}")
    if state.dtype != q.dtype:
        raise TypeError(f"state must have the dtype of q ({q.dtype}), got {state.dtype}")
    if tuple(state.shape) != want:
        raise ValueError(f"state must have shape [B, H, Dk, Dv] = {list(want)}, got {tuple(state.shape)}")
    if state.device != q.device:
        raise ValueError(f"state must be on the device of q ({q.device}), got {state.device}")


def _check_common(
    q: object, k: object, v: object, kappa: object, n_agents: object, dones: object,
    causal_agents: object, state: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    _check_qkv(q, k, v, "[B, H, N, Dk] ([B, H, N, Dv] for v)")
    assert isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor)
    A = check_int(n_agents, "n_agents", low=1)
    B, H, N, _ = q.shape
    if N % A:
        raise ValueError(
            f"the sequence length N = {N} (q.shape[2]) must be divisible by n_agents = {A} "
            "(tokens are ordered by timestep, then agent)"
        )
    if not isinstance(causal_agents, bool):
        raise TypeError(f"causal_agents must be a bool, got {causal_agents!r}")
    kap = _check_kappa(kappa, H, q)
    dt = _check_dones(dones, B, N // A, A, q.device)
    _check_state(state, q, v)
    return kap, dt


# ---------------------------------------------------------------------------------------- autograd
class _TritonRetention(torch.autograd.Function):
    """Forward: the Triton chunkwise kernel; backward: the chunkwise reference recomputed under autograd."""

    @staticmethod
    def forward(ctx, q, k, v, state, kappa, dones, n_agents, causal_agents, chunk_t):  # type: ignore[override]
        from icml25.kernels.retention import triton as tri

        B, _, N, _ = q.shape
        T = N // n_agents
        seg = (
            torch.cumsum(dones.int(), dim=1).to(torch.int32)
            if dones is not None
            else torch.zeros(B, T, dtype=torch.int32, device=q.device)
        )
        s0 = (
            state.float() if state is not None else q.new_zeros(B, q.shape[1], q.shape[3], v.shape[3]).float()
        )
        out, new_state = tri.retention_chunkwise_fwd(
            q, k, v, torch.log(kappa.float()), seg, s0,
            n_agents=n_agents, causal_agents=causal_agents, chunk_t=chunk_t,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, state if state is not None else torch.empty(0), kappa)
        ctx.has_state = state is not None
        ctx.dones = dones
        ctx.args = (n_agents, causal_agents, chunk_t)
        return out.to(q.dtype), new_state.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out, grad_state):  # type: ignore[override]
        q, k, v, state, kappa = ctx.saved_tensors
        n_agents, causal_agents, chunk_t = ctx.args
        inputs = [q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_()]
        if ctx.has_state:
            inputs.append(state.detach().requires_grad_())
        with torch.enable_grad():
            out, new_state = retention_chunkwise_reference(
                *inputs[:3], kappa, n_agents=n_agents, dones=ctx.dones, causal_agents=causal_agents,
                state=inputs[3] if ctx.has_state else None, chunk_size=chunk_t,
            )  # fmt: skip
            outs, grads = [out], [grad_out]
            if grad_state is not None:
                outs.append(new_state)
                grads.append(grad_state)
            got = torch.autograd.grad(outs, inputs, grads, allow_unused=True)
        gq, gk, gv = got[:3]
        gs = got[3] if ctx.has_state else None
        return gq, gk, gv, gs, None, None, None, None, None


# -------------------------------------------------------------------------------------------- ops
def retention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kappa: float | Sequence[float] | torch.Tensor,
    *,
    n_agents: int = 1,
    dones: torch.Tensor | None = None,
    causal_agents: bool = False,
    chunk_size: int | None = None,
    state: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunkwise multi-scale retention: ``out = (Q Kᵀ ⊙ D) V + (Q S_in) ⊙ ξ`` computed chunk by chunk.

    Tokens are ordered by timestep, then agent (``N = T · n_agents``); all agents of a timestep share the
    decay exponent; ``dones[b, t]`` (timestep ``t`` starts a new episode) cuts every path across the reset;
    ``causal_agents`` adds the decoder's causal mask over agents of a timestep. ``n_agents = 1`` is plain
    RetNet retention. The result does not depend on ``chunk_size`` (up to rounding); it sets the memory
    (O(B·H·C²) per chunk of ``C = chunk_size · n_agents`` tokens) and the Triton tile. NaN/Inf in ``q``,
    ``k``, ``v`` or ``state`` propagate to the outputs that depend on them (values are not inspected).

    Args:
        q, k: [B, H, N, Dk]; v: [B, H, N, Dv] (one floating dtype, one device).
        kappa: per-head decay κ_h in (0, 1]: a float (all heads), a sequence of H floats, or a 0-d/[H]
            tensor (not differentiated). κ = 1 is undecayed retention (ff-Sable's D = 1).
        n_agents: tokens per timestep A; ``N % A == 0``.
        dones: [B, T] bool per timestep, or [B, N] per token (then equal across a timestep's agents);
            0/1 numbers are accepted. None: no resets.
        causal_agents: causal mask over the agents of a timestep (Sable's decoder, Mava's ``masked=True``).
        chunk_size: timesteps per chunk ≥ 1 (need not divide T); None: :func:`default_chunk_size`. The
            Triton path needs ``chunk_size · n_agents <= MAX_TRITON_CHUNK_TOKENS`` (64) and head dims <= 64.
        state: [B, H, Dk, Dv] incoming state ``S_{-1}`` (e.g. the previous call's ``new_state``); None: zeros.
        backend: ``"auto"``/``"reference"``/``"triton"``; see :func:`icml25.kernels.select_backend`.

    Returns:
        ``(out [B, H, N, Dv], new_state [B, H, Dk, Dv])`` in q's dtype; calling again with
        ``state=new_state`` on the next segment equals one call on the concatenation.
    """
    kap, dt = _check_common(q, k, v, kappa, n_agents, dones, causal_agents, state)
    A = n_agents
    chunk = default_chunk_size(A) if chunk_size is None else check_int(chunk_size, "chunk_size", low=1)
    tensors = [q, k, v] + ([state] if state is not None else [])
    which = select_backend(*tensors, backend=backend)
    if which == "triton" and q.numel() and v.numel():
        if q.dtype not in _TRITON_DTYPES:
            raise TypeError(
                f"q must be float32, float16 or bfloat16 on the Triton path (float32 accumulation), got "
                f"{q.dtype}; use backend='reference' for {q.dtype}"
            )
        if chunk * A > MAX_TRITON_CHUNK_TOKENS:
            raise ValueError(
                f"chunk_size · n_agents = {chunk} · {A} = {chunk * A} tokens exceeds the Triton tile limit "
                f"MAX_TRITON_CHUNK_TOKENS = {MAX_TRITON_CHUNK_TOKENS}; pass a smaller chunk_size "
                "or backend='reference'"
            )
        if max(q.shape[-1], v.shape[-1]) > _MAX_TRITON_HEAD_DIM:
            raise ValueError(
                f"q/v head dims ({q.shape[-1]}, {v.shape[-1]}) exceed {_MAX_TRITON_HEAD_DIM} on the Triton "
                "path; use backend='reference'"
            )
        return _TritonRetention.apply(q, k, v, state, kap, dt, A, causal_agents, chunk)
    return retention_chunkwise_reference(
        q, k, v, kap, n_agents=A, dones=dt, causal_agents=causal_agents, state=state, chunk_size=chunk
    )


def retention_parallel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kappa: float | Sequence[float] | torch.Tensor,
    *,
    n_agents: int = 1,
    dones: torch.Tensor | None = None,
    causal_agents: bool = False,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Parallel-form retention ``(Q Kᵀ ⊙ D) V`` (+ the incoming state's term): the result of :func:`retention`
    from the full N × N decay matrix, O(B·H·N²) memory. Arguments and returns as :func:`retention`."""
    kap, dt = _check_common(q, k, v, kappa, n_agents, dones, causal_agents, state)
    return retention_parallel_reference(
        q, k, v, kap, n_agents=n_agents, dones=dt, causal_agents=causal_agents, state=state
    )


def retention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kappa: float | Sequence[float] | torch.Tensor,
    state: torch.Tensor | None = None,
    *,
    done: torch.Tensor | None = None,
    causal_agents: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recurrent retention for one timestep of A agents: ``S_t = δ_t κ S_{t-1} + K_tᵀ V_t``, ``out = Q_t S_t``.

    Memory is constant in the episode length (acting). Running it over the timesteps of a sequence equals
    :func:`retention` on the sequence with ``n_agents = A``.

    Args:
        q, k: [B, H, A, Dk]; v: [B, H, A, Dv].
        kappa: as in :func:`retention`.
        state: [B, H, Dk, Dv] previous state; None: zeros.
        done: [B] bool (or 0/1): this timestep starts a new episode (the state is zeroed before the update).
        causal_agents: agent i sees agents <= i of this timestep (the decoder).

    Returns:
        ``(out [B, H, A, Dv], new_state [B, H, Dk, Dv])``.
    """
    _check_qkv(q, k, v, "[B, H, A, Dk] ([B, H, A, Dv] for v)")
    B, H, _, _ = q.shape
    if not isinstance(causal_agents, bool):
        raise TypeError(f"causal_agents must be a bool, got {causal_agents!r}")
    kap = _check_kappa(kappa, H, q)
    _check_state(state, q, v)
    dn = None
    if done is not None:
        if not isinstance(done, torch.Tensor):
            raise TypeError(f"done must be a torch.Tensor [B] or None, got {type(done).__name__}")
        if done.ndim != 1 or done.shape[0] != B:
            raise ValueError(f"done must have shape [B] = [{B}], got {tuple(done.shape)}")
        d2 = _check_dones(done[:, None], B, 1, 1, q.device)
        assert d2 is not None
        dn = d2[:, 0]
    return retention_step_reference(q, k, v, kap, state, done=dn, causal_agents=causal_agents)
