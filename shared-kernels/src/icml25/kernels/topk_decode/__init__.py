"""Sparse top-k decode for sparse autoencoders (used by P22 Matryoshka SAE and P19 SAeUron).

Public ops:

* :func:`topk_decode` — ``out[..., :] = Σ_j values[..., j] · W_dec[idx[..., j]]``, the decode of a top-k
  SAE in O(k·d) per sample instead of the dense O(n·d) ``z @ W_dec``;
* :func:`topk_decode_prefix` — all nested prefix decodes ``ks[0] < ... < ks[-1]`` from one (sorted) top-k,
  for nested-k SAEs, in one pass.

Both are differentiable w.r.t. ``values`` and ``W_dec`` (indices are discrete). The reference path is
``F.embedding_bag`` (autograd built in); the Triton path is a ``torch.autograd.Function`` whose backward is
a Triton kernel (``dvalues`` as row dot products, ``dW_dec`` as an atomic scatter-add).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.topk_decode.reference import (
    dense_decode,
    topk_decode_prefix_reference,
    topk_decode_reference,
)

__all__ = [
    "dense_decode",
    "topk_decode",
    "topk_decode_prefix",
    "topk_decode_prefix_reference",
    "topk_decode_reference",
]


class _TritonPrefixDecode(torch.autograd.Function):
    """Autograd wrapper of the Triton prefix decode: inputs [B, K], [B, K], [n, d] -> [L, B, d]."""

    @staticmethod
    def forward(ctx, values, idx, W_dec, ks):  # type: ignore[override]
        from icml25.kernels.topk_decode import triton as tri

        ctx.save_for_backward(values, idx, W_dec)
        ctx.ks = ks
        return tri.prefix_decode_fwd(values, idx, W_dec, ks)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        from icml25.kernels.topk_decode import triton as tri

        values, idx, W_dec = ctx.saved_tensors
        dvalues, dw = tri.prefix_decode_bwd(grad_out, values, idx, W_dec, ctx.ks)
        return (
            dvalues if ctx.needs_input_grad[0] else None,
            None,
            dw if ctx.needs_input_grad[2] else None,
            None,
        )


def _check_args(values: torch.Tensor, idx: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """Validate the (values, idx, W_dec) triple; return idx as int64."""
    for name, t in (("values", values), ("idx", idx), ("W_dec", W_dec)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not values.is_floating_point():
        raise TypeError(f"values must be a floating-point tensor [..., k], got dtype {values.dtype}")
    if idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
        raise TypeError(f"idx must be an integer tensor [..., k] of latent indices, got dtype {idx.dtype}")
    if W_dec.ndim != 2 or not W_dec.is_floating_point():
        raise ValueError(
            f"W_dec must be a floating-point matrix [n, d], got shape {tuple(W_dec.shape)} dtype {W_dec.dtype}"
        )
    if values.ndim < 1 or values.shape != idx.shape:
        raise ValueError(
            f"values and idx must have the same shape [..., k], got {tuple(values.shape)} and {tuple(idx.shape)}"
        )
    if idx.numel() > 0:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= W_dec.shape[0]:
            raise ValueError(
                f"idx must lie in [0, n={W_dec.shape[0]}) (rows of W_dec), got range [{lo}, {hi}]"
            )
    return idx.long()


def _check_ks(ks: Sequence[int], k: int) -> tuple[int, ...]:
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Sequence) or len(ks) == 0:
        raise TypeError(f"ks must be a non-empty sequence of ints, got {ks!r}")
    out = []
    for v in ks:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"ks must contain ints, got {v!r} ({type(v).__name__}) in {list(ks)}")
        out.append(int(v))
    if any(b <= a for a, b in itertools.pairwise(out)):
        raise ValueError(f"ks must be strictly increasing, got {out}")
    if out[0] < 1 or out[-1] > k:
        raise ValueError(f"ks must lie in [1, k={k}] (k = values.shape[-1]), got {out}")
    return tuple(out)


def topk_decode(
    values: torch.Tensor, idx: torch.Tensor, W_dec: torch.Tensor, *, backend: str | None = None
) -> torch.Tensor:
    """Decode sparse codes: ``out[..., :] = Σ_j values[..., j] · W_dec[idx[..., j], :]``.

    Equal to scattering ``values`` into a dense ``z`` [..., n] and computing ``z @ W_dec`` (repeated indices
    add up), in O(k·d) per row. Add the decoder bias yourself. NaN/Inf in ``values`` or ``W_dec`` propagate
    to the rows that use them, as in a matmul (the values are not inspected: no host sync on the hot path).

    Args:
        values: [..., k] activations (differentiable).
        idx: [..., k] integer latent indices in ``[0, n)``.
        W_dec: [n, d] decoder rows (differentiable).
        backend: ``"auto"``/``"reference"``/``"triton"``; see :func:`icml25.kernels.select_backend`.

    Returns:
        [..., d] in the dtype of ``W_dec``.
    """
    idx = _check_args(values, idx, W_dec)
    k = values.shape[-1]
    out = topk_decode_prefix(values, idx, W_dec, [k], backend=backend) if k > 0 else None
    if out is None:
        return W_dec.new_zeros(*values.shape[:-1], W_dec.shape[1])
    return out[0]


def topk_decode_prefix(
    values: torch.Tensor,
    idx: torch.Tensor,
    W_dec: torch.Tensor,
    ks: Sequence[int],
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Nested decodes of the first ``ks[l]`` entries: ``out[l, ...] = Σ_{j < ks[l]} values[..., j] · W_dec[idx[..., j]]``.

    With ``values, idx = torch.topk(pre, k_max, sorted=True)`` this returns the reconstructions of every
    top-``ks[l]`` level at the cost of one ``k_max`` decode; ``out[l]`` equals ``topk_decode`` of the
    first ``ks[l]`` columns.

    Args:
        values: [..., K] activations, ordered so that each prefix is a level.
        idx: [..., K] integer latent indices in ``[0, n)``.
        W_dec: [n, d] decoder rows.
        ks: L strictly increasing prefix lengths in ``[1, K]``.
        backend: ``"auto"``/``"reference"``/``"triton"``.

    Returns:
        [L, ..., d] in the dtype of ``W_dec``.
    """
    idx = _check_args(values, idx, W_dec)
    ks_t = _check_ks(ks, values.shape[-1])
    lead = values.shape[:-1]
    v2 = values.reshape(-1, values.shape[-1])
    i2 = idx.reshape(-1, idx.shape[-1])
    if W_dec.shape[1] == 0 or v2.shape[0] == 0:  # d = 0 or no rows: an empty (exact) result
        return W_dec.new_zeros(len(ks_t), *lead, W_dec.shape[1])
    if select_backend(values, idx, W_dec, backend=backend) == "triton":
        out = _TritonPrefixDecode.apply(v2, i2, W_dec, ks_t)
    else:
        out = topk_decode_prefix_reference(v2, i2, W_dec, ks_t)
    return out.reshape(len(ks_t), *lead, W_dec.shape[1])
