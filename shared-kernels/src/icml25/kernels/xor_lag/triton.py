"""Triton kernel of the all-pairs × all-lags XOR patch matching (see :mod:`.reference` for the definition).

One program handles one (effect, lag) and a block of causes, streaming over the packed words: for each
block of output words it reads the effect's words at bit offsets ``τ + m`` and the causes' words at bit
offsets ``m`` (``m < P``), ANDs the XORs (all-ones: mirrored patch) and their complements (all-zeros:
identical patch), masks the positions past the last valid patch and accumulates popcounts. Words are
int64 holding 32 bits so the shifts never touch the sign bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from icml25.kernels.xor_lag.reference import WORD_BITS, n_patches

_MASK = (1 << 32) - 1


@triton.jit
def _popcount32(v):
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) & 0xFFFFFFFF) >> 24


@triton.jit
def _read_shifted(row_ptr, k, offset, n_words):
    """Words ``k`` (a block) of a stream read from bit ``offset`` on; ``row_ptr`` may be a block of rows."""
    q = offset // 32
    r = (offset % 32).to(tl.int64)
    lo = tl.load(row_ptr + k + q, mask=(k + q) < n_words, other=0)
    hi = tl.load(row_ptr + k + q + 1, mask=(k + q + 1) < n_words, other=0)
    return ((lo >> r) | (hi << (32 - r))) & 0xFFFFFFFF


@triton.jit
def _xor_lag_kernel(
    words_ptr,
    same_ptr,
    opp_ptr,
    n,
    n_words,
    n_out,
    n_patches0,
    lag_max,
    stride_row,
    PATCH_BITS: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    e = tl.program_id(0)
    tau = tl.program_id(1)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < n
    n_valid = n_patches0 - tau  # patch pairs at this lag
    eff_row = words_ptr + e * stride_row
    cau_rows = words_ptr + c[:, None].to(tl.int64) * stride_row
    acc_same = tl.zeros([BLOCK_C], dtype=tl.int64)
    acc_opp = tl.zeros([BLOCK_C], dtype=tl.int64)
    for w0 in range(0, n_out, BLOCK_W):
        k = w0 + tl.arange(0, BLOCK_W)
        # valid patch positions of word k: the low `rem` bits, rem = clamp(n_valid - 32k, 0, 32)
        rem = tl.minimum(tl.maximum(n_valid - 32 * k, 0), 32).to(tl.int64)
        valid = (tl.full([BLOCK_W], 1, tl.int64) << rem) - 1
        all_diff = tl.broadcast_to(valid[None, :], [BLOCK_C, BLOCK_W])
        all_same = all_diff
        for m in tl.static_range(PATCH_BITS):
            ew = _read_shifted(eff_row, k, tau + m, n_words)  # [BLOCK_W]
            # `tau * 0 + m` turns the compile-time m into a tensor offset like the effect's one
            cw = _read_shifted(cau_rows, k[None, :], tau * 0 + m, n_words)  # [BLOCK_C, BLOCK_W]
            x = ew[None, :] ^ cw
            all_diff = all_diff & x
            all_same = all_same & ~x
        acc_same += tl.sum(_popcount32(all_same), axis=1)
        acc_opp += tl.sum(_popcount32(all_diff), axis=1)
    out = (e * n + c).to(tl.int64) * lag_max + tau
    tl.store(same_ptr + out, acc_same, mask=c_ok)
    tl.store(opp_ptr + out, acc_opp, mask=c_ok)


def xor_lag_counts_triton(
    words: torch.Tensor, n_bits: int, lag_max: int, patch_bits: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`icml25.kernels.xor_lag.reference.xor_lag_counts_reference` (same contract)."""
    words = words.to(torch.int64).contiguous()
    n, n_words = words.shape
    n_p0 = n_patches(n_bits, patch_bits)
    n_out = -(-n_p0 // WORD_BITS)
    same = torch.empty(n, n, lag_max, dtype=torch.int64, device=words.device)
    opp = torch.empty_like(same)
    block_c = min(32, triton.next_power_of_2(max(n, 1)))
    block_w = min(64, triton.next_power_of_2(max(n_out, 1)))
    grid = (n, lag_max, triton.cdiv(n, block_c))
    _xor_lag_kernel[grid](
        words,
        same,
        opp,
        n,
        n_words,
        n_out,
        n_p0,
        lag_max,
        words.stride(0),
        PATCH_BITS=patch_bits,
        BLOCK_C=block_c,
        BLOCK_W=block_w,
    )
    return same, opp
