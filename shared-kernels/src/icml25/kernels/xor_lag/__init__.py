"""All-pairs × all-lags XOR patch matching over packed bit streams (used by P54 ARROW).

Public ops:

* :func:`pack_bits` / :func:`unpack_bits` — ``[n, n_bits]`` bool <-> ``[n, ceil(n_bits/32)]`` int64 words
  (32 bits per word, little-endian bit order);
* :func:`xor_lag_counts` — for every ordered pair of streams ``(effect, cause)`` and every lag
  ``τ = 0 … L-1``, the number of patch pairs (effect patch ``p+τ``, cause patch ``p``) that are identical
  (XOR all zeros) and that are mirrored (XOR all ones). ARROW's lag score is
  ``max(same, opp) / (n_patches - τ)``.

The reference is vectorised PyTorch (shift / XOR / AND / SWAR popcount on packed words, no loop over pairs
or lags); the Triton kernel runs one program per (effect, lag, cause block). Integer counts: both backends
agree exactly.
"""

from __future__ import annotations

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.checks import check_int
from icml25.kernels.xor_lag import reference as _ref
from icml25.kernels.xor_lag.reference import (
    WORD_BITS,
    n_patches,
    xor_lag_counts_bruteforce,
    xor_lag_counts_reference,
)


def _is_int(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack ``[n, n_bits]`` bool (or 0/1 integer) streams 32 bits per word -> ``[n, ceil(n_bits / 32)]`` int64.

    Validated wrapper of :func:`icml25.kernels.xor_lag.reference.pack_bits` (layout there); empty axes give
    an empty result.
    """
    if not isinstance(bits, torch.Tensor):
        raise TypeError(f"bits must be a torch.Tensor [n, n_bits], got {type(bits).__name__}")
    if bits.dtype != torch.bool and not _is_int(bits):
        raise TypeError(f"bits must be a bool or 0/1 integer tensor [n, n_bits], got dtype {bits.dtype}")
    if bits.dim() != 2:
        raise ValueError(f"bits must be 2-D [n, n_bits], got shape {tuple(bits.shape)}")
    if bits.dtype != torch.bool and bits.numel() and (int(bits.min()) < 0 or int(bits.max()) > 1):
        raise ValueError(f"bits must hold only 0 and 1, got range [{int(bits.min())}, {int(bits.max())}]")
    return _ref.pack_bits(bits)


def unpack_bits(words: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``[n, n_words]`` integer words -> ``[n, n_bits]`` bool."""
    if not isinstance(words, torch.Tensor) or not _is_int(words):
        got = words.dtype if isinstance(words, torch.Tensor) else type(words).__name__
        raise TypeError(f"words must be an integer torch.Tensor [n, n_words], got {got}")
    if words.dim() != 2:
        raise ValueError(f"words must be 2-D [n, n_words], got shape {tuple(words.shape)}")
    n_bits = check_int(n_bits, "n_bits")
    if not 0 <= n_bits <= WORD_BITS * words.shape[1]:
        raise ValueError(
            f"n_bits must be an int in [0, 32 * n_words = {WORD_BITS * words.shape[1]}] for words of shape "
            f"{tuple(words.shape)}, got {n_bits!r}"
        )
    if words.numel() == 0:
        return torch.zeros(words.shape[0], n_bits, dtype=torch.bool, device=words.device)
    return _ref.unpack_bits(words.to(torch.int64), n_bits)


def popcount32(v: torch.Tensor) -> torch.Tensor:
    """Number of set bits of each integer element holding a value in ``[0, 2**32)`` (int64, shape of ``v``)."""
    if not isinstance(v, torch.Tensor) or not _is_int(v):
        got = v.dtype if isinstance(v, torch.Tensor) else type(v).__name__
        raise TypeError(f"v must be an integer torch.Tensor of 32-bit words, got {got}")
    return _ref.popcount32(v.to(torch.int64))


__all__ = [
    "WORD_BITS",
    "n_patches",
    "pack_bits",
    "popcount32",
    "unpack_bits",
    "xor_lag_counts",
    "xor_lag_counts_bruteforce",
    "xor_lag_counts_reference",
]


def xor_lag_counts(
    words: torch.Tensor,
    n_bits: int,
    lag_max: int,
    patch_bits: int = 2,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of identical and mirrored patch pairs for all ordered stream pairs and lags ``0 … L-1``.

    Args:
        words: ``[n, n_words]`` int64 packed streams from :func:`pack_bits` (``n_words >= ceil(n_bits/32)``).
        n_bits: number of valid bits per stream.
        lag_max: ``L``, the number of lags (``0 … L-1``); needs at least one patch pair at lag ``L-1``.
        patch_bits: bits per patch ``P >= 1`` (2 for ARROW's 3-point patches).
        backend: ``"auto"``, ``"reference"`` or ``"triton"`` (see :func:`icml25.kernels.select_backend`).

    Returns:
        ``(same, opp)``: ``[n, n, L]`` int64, indexed ``[effect, cause, τ]``, out of ``n_bits - P + 1 - τ``
        patch pairs each.

    Raises:
        TypeError: ``words`` is not an integer tensor.
        ValueError: bad shapes or sizes.
    """
    if not isinstance(words, torch.Tensor):
        raise TypeError(f"words must be a torch.Tensor [n, n_words] of int64, got {type(words).__name__}")
    if words.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"words must be an int64 tensor from pack_bits, got dtype {words.dtype}")
    if words.ndim != 2:
        raise ValueError(f"words must be 2-D [n, n_words], got shape {tuple(words.shape)}")
    for name, value, low in (("n_bits", n_bits, 1), ("lag_max", lag_max, 1), ("patch_bits", patch_bits, 1)):
        check_int(value, name, low=low)
    if words.shape[1] * WORD_BITS < n_bits:
        raise ValueError(
            f"words holds {words.shape[1] * WORD_BITS} bits per stream but n_bits={n_bits}; "
            "pack the streams with pack_bits"
        )
    if n_patches(n_bits, patch_bits) - (lag_max - 1) < 1:
        raise ValueError(
            f"lag_max={lag_max} leaves no patch pair at lag {lag_max - 1}: need "
            f"n_bits >= lag_max + patch_bits - 1 = {lag_max + patch_bits - 1}, got n_bits={n_bits}"
        )
    if select_backend(words, backend=backend) == "triton":
        from icml25.kernels.xor_lag.triton import xor_lag_counts_triton

        return xor_lag_counts_triton(words, n_bits, lag_max, patch_bits)
    return xor_lag_counts_reference(words, n_bits, lag_max, patch_bits)
