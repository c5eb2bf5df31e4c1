"""Stochastic Layer-Wise Shuffle for Vision Mamba — ICML 2025, P13: the Mamba selective-scan (S6) ops.

The selective state-space scan of Mamba (Gu & Dao, 2023; ``selective_scan_fn`` of ``state-spaces/mamba``):
a diagonal state matrix ``A``, an input-dependent step ``Δ`` and input-dependent ``B``/``C``, the ``D``
skip and the optional ``z`` gate. Used by the bidirectional Vision Mamba of P13 (SLWS, Huang et al.,
ICML 2025; official code ``huangzizheng01/ShuffleMamba``, which calls ``mamba-ssm``'s CUDA kernel) and
useful to any SSM paper. The semantics are in :mod:`icml25.kernels.selective_scan.reference`. Public ops:

* :func:`selective_scan` — reference (any device; sequential, or chunked with ``chunk_size``) or Triton
  (CUDA, or the interpreter); differentiable w.r.t. every tensor argument. The Triton path is a
  ``torch.autograd.Function`` with a Triton forward and a Triton backward kernel for the recurrence; the
  ``Δ`` bias/softplus, the ``D`` skip and the ``z`` gate are torch ops around it (autograd handles them).
* :func:`selective_scan_chunked` — the chunked closed form (:func:`selective_scan_chunked_reference`),
  torch ops only.

NaN/Inf in the inputs propagate to the outputs that depend on them (values are not inspected: no host
sync on the hot path). ``A`` is Mamba's ``-exp(A_log)``; positive entries are accepted but make the state
grow like ``exp(Δ·A·L)`` and may overflow.
"""

from __future__ import annotations

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.selective_scan.reference import (
    effective_delta,
    selective_scan_chunked_reference,
    selective_scan_reference,
    skip_and_gate,
)

__all__ = [
    "MAX_TRITON_STATE",
    "selective_scan",
    "selective_scan_chunked",
    "selective_scan_chunked_reference",
    "selective_scan_reference",
]

MAX_TRITON_STATE = 256
"""Largest state size ``N`` the Triton kernels hold in registers (``mamba-ssm`` has the same limit)."""
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------------------- validation
def _tensor(name: str, t: object, ndim: int, form: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {form}, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor {form}, got dtype {t.dtype}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {form}, got shape {tuple(t.shape)}")
    return t


def _check(
    u: object, delta: object, A: object, B: object, C: object, D: object, z: object, delta_bias: object,
    delta_softplus: object,
) -> None:  # fmt: skip
    u = _tensor("u", u, 3, "[B, D, L]")
    Bsz, Dch, L = u.shape
    want = {"delta": (delta, (Bsz, Dch, L), "[B, D, L]"), "z": (z, (Bsz, Dch, L), "[B, D, L]")}
    for name, (t, shape, form) in want.items():
        if t is None and name == "z":
            continue
        t = _tensor(name, t, 3, form)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have the shape of u {list(shape)} {form}, got {tuple(t.shape)}")
        if t.dtype != u.dtype:
            raise TypeError(f"{name} must have the dtype of u ({u.dtype}), got {t.dtype}")
    A = _tensor("A", A, 2, "[D, N]")
    if A.shape[0] != Dch:
        raise ValueError(f"A must have shape [D, N] with D = {Dch} (u.shape[1]), got {tuple(A.shape)}")
    N = A.shape[1]
    for name, t in (("B", B), ("C", C)):
        t = _tensor(name, t, 3, "[B, N, L]")
        if tuple(t.shape) != (Bsz, N, L):
            raise ValueError(
                f"{name} must have shape [B, N, L] = {[Bsz, N, L]} (N = A.shape[1]), got {tuple(t.shape)}"
            )
        if t.dtype != u.dtype:
            raise TypeError(f"{name} must have the dtype of u ({u.dtype}), got {t.dtype}")
    for name, t in (("D", D), ("delta_bias", delta_bias)):
        if t is None:
            continue
        t = _tensor(name, t, 1, "[D]")
        if t.shape[0] != Dch:
            raise ValueError(f"{name} must have shape [D] = [{Dch}], got {tuple(t.shape)}")
    devices = {t.device for t in (u, delta, A, B, C, D, z, delta_bias) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"every tensor must be on one device, got {sorted(map(str, devices))}")
    if not isinstance(delta_softplus, bool):
        raise TypeError(f"delta_softplus must be a bool, got {delta_softplus!r}")


# ---------------------------------------------------------------------------------------- autograd
class _TritonScan(torch.autograd.Function):
    """The core recurrence ``(y, last_state)`` from ``(u, Δ, A, B, C)``: Triton forward and backward."""

    @staticmethod
    def forward(ctx, u, dt, A, B, C):  # type: ignore[override]
        from icml25.kernels.selective_scan import triton as tri

        need = any(ctx.needs_input_grad)
        y, last, xs = tri.selective_scan_fwd(u, dt, A, B, C, save_states=need)
        if need:
            ctx.save_for_backward(u, dt, A, B, C, xs)
        return y.to(u.dtype), last.to(u.dtype)

    @staticmethod
    def backward(ctx, grad_y, grad_last):  # type: ignore[override]
        from icml25.kernels.selective_scan import triton as tri

        u, dt, A, B, C, xs = ctx.saved_tensors
        if grad_y is None:
            grad_y = torch.zeros_like(u)
        du, ddt, dA, dB, dC = tri.selective_scan_bwd(u, dt, A, B, C, xs, grad_y, grad_last)
        return du.to(u.dtype), ddt.to(dt.dtype), dA.to(A.dtype), dB.to(B.dtype), dC.to(C.dtype)


# -------------------------------------------------------------------------------------------- ops
def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    *,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    chunk_size: int | None = None,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba's selective scan: ``x_t = e^{Δ_t A} x_{t-1} + Δ_t B_t u_t``, ``out_t = (C_t x_t + D u_t) · silu(z_t)``.

    Argument order and layout of ``mamba_ssm.ops.selective_scan_interface.selective_scan_fn``.

    Args:
        u: [B, D, L] input (channels × sequence). delta: [B, D, L] step before bias/softplus.
        A: [D, N] diagonal state matrix (Mamba: ``-exp(A_log)``; any float dtype, cast to u's).
        B, C: [B, N, L] input-dependent input and output maps (dtype of u).
        D: [D] skip, or None. z: [B, D, L] gate (``silu(z)`` multiplies the output), or None.
        delta_bias: [D] added to ``delta`` before the softplus, or None.
        delta_softplus: ``Δ = softplus(delta + delta_bias)`` (Mamba's ``delta_softplus=True``).
        return_last_state: also return the final state ``x_{L-1}`` [B, D, N].
        chunk_size: reference path only: None runs the sequential recurrence, an int ≥ 1 the chunked closed
            form (:func:`selective_scan_chunked`). Ignored by Triton.
        backend: ``"auto"``/``"reference"``/``"triton"``; see :func:`icml25.kernels.select_backend`. Triton
            takes float32/float16/bfloat16 (float32 state and accumulation) and ``N <= 256``.

    Returns:
        ``out [B, D, L]`` in u's dtype, and ``last_state [B, D, N]`` when ``return_last_state``.
        ``L = 0`` gives an empty output and a zero state.
    """
    _check(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    if not isinstance(return_last_state, bool):
        raise TypeError(f"return_last_state must be a bool, got {return_last_state!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)):
        raise TypeError(f"chunk_size must be an int >= 1 or None, got {chunk_size!r}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    tensors = [t for t in (u, delta, A, B, C, D, z, delta_bias) if t is not None]
    which = select_backend(*tensors, backend=backend)
    if which == "triton" and u.numel() and A.numel():
        if u.dtype not in _TRITON_DTYPES:
            raise TypeError(
                f"u must be float32, float16 or bfloat16 on the Triton path (float32 state), got {u.dtype}; "
                f"use backend='reference' for {u.dtype}"
            )
        if A.shape[1] > MAX_TRITON_STATE:
            raise ValueError(
                f"the state size N = {A.shape[1]} (A.shape[1]) exceeds MAX_TRITON_STATE = {MAX_TRITON_STATE} "
                "on the Triton path; use backend='reference'"
            )
        dt = effective_delta(delta, delta_bias, delta_softplus)
        y, last = _TritonScan.apply(u, dt, A.to(torch.float32), B, C)
        y = skip_and_gate(y, u, D, z)
        return (y, last) if return_last_state else y
    if chunk_size is None:
        out, last = selective_scan_reference(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    else:
        out, last = selective_scan_chunked_reference(
            u, delta, A, B, C, D, z, delta_bias, delta_softplus, chunk_size
        )
    return (out, last) if return_last_state else out


def selective_scan_chunked(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    *,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    chunk_size: int = 16,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The selective scan in the chunked closed form (torch ops only, O(B·D·T²·N) memory per chunk of
    ``T = chunk_size`` timesteps); the result of :func:`selective_scan` up to rounding. Arguments and
    returns as there."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    return selective_scan(
        u, delta, A, B, C, D, z, delta_bias, delta_softplus=delta_softplus,
        return_last_state=return_last_state, chunk_size=chunk_size, backend="reference",
    )  # fmt: skip
