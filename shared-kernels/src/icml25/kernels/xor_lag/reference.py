"""Reference (plain PyTorch) all-pairs × all-lags XOR patch matching over packed bit streams.

This is the specification and test oracle of :mod:`icml25.kernels.xor_lag` (used by P54 ARROW).

Setting. ``n`` binary streams ``b[s, t]`` (``t = 0 … n_bits-1``) are packed 32 bits per int64 word,
bit ``t`` at word ``t // 32``, bit position ``t % 32`` (little-endian within a word). A *patch* ``p`` of
width ``P = patch_bits`` is the run ``b[s, p : p+P]``; there are ``n_bits - P + 1`` patches. For an
effect stream ``e``, a cause stream ``c`` and a lag ``τ`` the patch pairs ``(e's patch p+τ, c's patch p)``,
``p = 0 … n_bits-P-τ``, are compared bit by bit:

* ``same[e, c, τ]`` counts the pairs whose XOR is all zeros (identical shape),
* ``opp[e, c, τ]``  counts the pairs whose XOR is all ones (mirrored shape).

With ``x_t = b[e, t+τ] XOR b[c, t]`` this is ``same = Σ_p Π_m (1 - x_{p+m})`` and
``opp = Σ_p Π_m x_{p+m}``; packed, ``Π_m`` is an AND of the XOR word stream shifted by ``m`` bits, and
``Σ_p`` a popcount over the valid bits. Cost O(n² · L · P · n_bits / 32) word operations.

Every temporary is shaped ``[n_effect_chunk, n, L, n_words]``: pairs and lags are vectorised, only the
effects are chunked to bound memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

WORD_BITS = 32
WORD_MASK = (1 << WORD_BITS) - 1
# Bound on the elements of one [chunk, n, L, words] temporary (int64): 2**23 elements = 64 MiB.
_MAX_CHUNK_ELEMS = 1 << 23


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack boolean streams 32 bits per word.

    Args:
        bits: ``[n, n_bits]`` bool (or 0/1 integer) tensor.

    Returns:
        ``[n, ceil(n_bits / 32)]`` int64 tensor; bit ``t`` of stream ``s`` is
        ``(out[s, t // 32] >> (t % 32)) & 1``. Every word is in ``[0, 2**32)``.
    """
    n, n_bits = bits.shape
    n_words = -(-n_bits // WORD_BITS)
    padded = F.pad(bits.to(torch.int64), (0, n_words * WORD_BITS - n_bits))
    weights = torch.bitwise_left_shift(
        torch.ones(WORD_BITS, dtype=torch.int64, device=bits.device),
        torch.arange(WORD_BITS, device=bits.device),
    )
    return (padded.view(n, n_words, WORD_BITS) * weights).sum(-1)


def unpack_bits(words: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``[n, n_words]`` int64 -> ``[n, n_bits]`` bool."""
    shifts = torch.arange(WORD_BITS, device=words.device)
    bits = (words[:, :, None] >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :n_bits].bool()


def popcount32(v: torch.Tensor) -> torch.Tensor:
    """Number of set bits of each int64 element holding a value in ``[0, 2**32)`` (SWAR, no lookup table).

    Works in place on a copy of ``v`` (this is the hot loop of the op on CPU; in-place ops halve its time).
    """
    v = v.clone()
    v -= (v >> 1) & 0x55555555  # 2-bit field counts
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)  # 4-bit field counts
    v += v >> 4
    v &= 0x0F0F0F0F  # byte counts
    v *= 0x01010101  # byte sum lands in bits 24..31
    v &= WORD_MASK
    return v >> 24


def n_patches(n_bits: int, patch_bits: int) -> int:
    """Number of patches of ``patch_bits`` consecutive bits in a stream of ``n_bits`` bits (lag 0)."""
    return n_bits - patch_bits + 1


def _shifted_words(padded: torch.Tensor, offsets: torch.Tensor, n_out: int) -> torch.Tensor:
    """Words of every stream read from bit ``offset`` on: ``[n, W_pad]`` -> ``[n, K, n_out]``.

    Word ``k`` of the result holds stream bits ``offset + 32k … offset + 32k + 31``: the high bits of
    word ``q + k`` (``q = offset // 32``) joined with the low bits of word ``q + k + 1``.
    """
    q = (offsets // WORD_BITS)[:, None]
    r = (offsets % WORD_BITS)[:, None]
    idx = q + torch.arange(n_out, device=padded.device)[None, :]  # [K, n_out]
    lo = padded[:, idx]  # [n, K, n_out]
    hi = padded[:, idx + 1]
    # For r = 0 the high part is shifted by 32 and masked away, which is what we want.
    return ((lo >> r) | (hi << (WORD_BITS - r))) & WORD_MASK


def valid_word_masks(n_patches0: int, lag_max: int, n_out: int, device: torch.device) -> torch.Tensor:
    """``[L, n_out]`` int64 masks of the patch positions ``p < n_patches0 - τ`` for ``τ = 0 … L-1``."""
    n_valid = n_patches0 - torch.arange(lag_max, device=device)[:, None]  # [L, 1]
    rem = (n_valid - WORD_BITS * torch.arange(n_out, device=device)[None, :]).clamp(0, WORD_BITS)
    return (torch.ones_like(rem) << rem) - 1  # rem low bits set; rem = 32 gives the full word


def xor_lag_counts_reference(
    words: torch.Tensor, n_bits: int, lag_max: int, patch_bits: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """All ordered pairs × lags ``0 … lag_max-1``: counts of identical and of mirrored patch pairs.

    Args:
        words: ``[n, n_words]`` int64 packed streams (:func:`pack_bits`), ``n_words >= ceil(n_bits/32)``.
        n_bits: valid bits per stream.
        lag_max: number of lags ``L``; lags ``0 … L-1`` are computed.
        patch_bits: bits per patch ``P`` (ARROW's 3-point patches have 2 bits).

    Returns:
        ``(same, opp)``, each ``[n, n, L]`` int64 indexed ``[effect, cause, τ]``: the number of patch pairs
        (effect patch ``p+τ``, cause patch ``p``) whose XOR is all zeros (``same``) or all ones (``opp``),
        out of ``n_bits - P + 1 - τ`` pairs.
    """
    n = words.shape[0]
    n_p0 = n_patches(n_bits, patch_bits)
    n_out = -(-n_p0 // WORD_BITS)
    device = words.device
    # Zero words on the right so every shifted read (offset up to L-1 + P-1, plus one word) is in range.
    need = n_out + (lag_max + patch_bits) // WORD_BITS + 2
    padded = F.pad(words.to(torch.int64), (0, max(0, need - words.shape[1])))

    lags = torch.arange(lag_max, device=device)
    ms = torch.arange(patch_bits, device=device)
    # eff[s, τ, m, k]: effect stream read from bit τ+m; cau[s, m, k]: cause stream read from bit m.
    eff = _shifted_words(padded, (lags[:, None] + ms[None, :]).reshape(-1), n_out)
    eff = eff.view(n, lag_max, patch_bits, n_out)
    cau = _shifted_words(padded, ms, n_out)  # [n, P, n_out]
    valid = valid_word_masks(n_p0, lag_max, n_out, device)  # [L, n_out]

    same = torch.empty(n, n, lag_max, dtype=torch.int64, device=device)
    opp = torch.empty_like(same)
    chunk = max(1, _MAX_CHUNK_ELEMS // max(1, n * lag_max * n_out))
    for e0 in range(0, n, chunk):  # effect chunks only bound memory; pairs × lags stay vectorised
        e1 = min(n, e0 + chunk)
        all_diff = valid.expand(e1 - e0, n, lag_max, n_out)
        all_same = all_diff
        for m in range(patch_bits):  # P is 2 for ARROW: the AND over the bits of a patch
            x = eff[e0:e1, None, :, m, :] ^ cau[None, :, m, None, :]  # [ce, n, L, n_out]
            all_diff = all_diff & x
            all_same = all_same & ~x
        same[e0:e1] = popcount32(all_same).sum(-1)
        opp[e0:e1] = popcount32(all_diff).sum(-1)
    return same, opp


def xor_lag_counts_bruteforce(
    bits: torch.Tensor, lag_max: int, patch_bits: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpacked oracle of :func:`xor_lag_counts_reference` from ``[n, n_bits]`` bool bits (slow, for tests).

    Loops over lags only; every (effect, cause) pair is compared with broadcasting on unpacked bits.
    """
    b = bits.bool()
    n, n_bits = b.shape
    n_p0 = n_patches(n_bits, patch_bits)
    same = torch.zeros(n, n, lag_max, dtype=torch.int64)
    opp = torch.zeros_like(same)
    for tau in range(lag_max):
        n_p = n_p0 - tau
        # patch bits of every stream: [n, n_p, P]
        e = torch.stack([b[:, tau + m : tau + m + n_p] for m in range(patch_bits)], -1)
        c = torch.stack([b[:, m : m + n_p] for m in range(patch_bits)], -1)
        x = e[:, None] ^ c[None, :]  # [n, n, n_p, P]
        same[:, :, tau] = (~x).all(-1).sum(-1)
        opp[:, :, tau] = x.all(-1).sum(-1)
    return same, opp
