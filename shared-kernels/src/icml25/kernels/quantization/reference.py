"""Low-bit group quantization: the plain PyTorch reference (the specification and the test oracle).

Quantization (asymmetric min-max, round to nearest), per group of ``group_size`` consecutive elements of
the last dimension, all arithmetic in float32::

    zero  = cast(min(group))                                  # stored in the input dtype
    scale = cast(div_rn(max(group) - min(group), 2**bits - 1))  # stored in the input dtype
    code  = clamp(floor((x - zero) / scale + 0.5), 0, 2**bits - 1)    (code = 0 where scale == 0)
    x_hat = cast(code * scale + zero)                         # dequantization, back to the input dtype

``zero`` is therefore the value that code 0 decodes to (an offset, as in KIVI), not an integer zero point:
it always lies inside the data's range, so it cannot overflow a float16 the way ``-min / scale`` can.
Codes are computed from the *stored* (rounded) scale and zero, so quantization and dequantization agree
exactly and ``|x - x_hat| <= scale / 2`` holds with the scale that is actually stored (up to float32
rounding and the final cast to the input dtype). A constant group has ``scale == 0``, codes 0 and decodes
exactly. Rounding is half-up (``floor(v + 0.5)``) because it is the same one-liner in every backend.

Packing layout (little-endian bit order inside each int32 word): codes are packed in chunks of 32
consecutive codes into exactly ``bits`` int32 words, so storage is exactly ``bits`` bits per code.

* bits 2, 4, 8: word ``j`` of a chunk holds codes ``j*c ... j*c + c - 1`` with ``c = 32 // bits``; code
  ``k`` of the word sits at bit offset ``k * bits``.
* bits 3 (bit planes): words 0 and 1 hold the low 2 bits of codes 0-15 and 16-31 (2-bit layout above),
  word 2 holds the high bit of codes 0-31 (code ``k`` at bit ``k``). No code straddles a word.

A row of ``n`` codes is zero-padded to a multiple of 32 and packs into ``bits * ceil(n / 32)`` words; the
group sizes 32/64/128 are multiples of 32, so each group packs into ``bits * group_size // 32`` words.
"""

from __future__ import annotations

import torch

SUPPORTED_BITS = (2, 3, 4, 8)
SUPPORTED_GROUP_SIZES = (32, 64, 128)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CHUNK = 32  # codes per packing chunk; a chunk of b-bit codes fills exactly b int32 words


def num_words(n: int, bits: int) -> int:
    """Number of int32 words that ``n`` codes of ``bits`` bits pack into (``bits * ceil(n / 32)``)."""
    return bits * (-(-n // CHUNK))


def _pack_fields(fields: torch.Tensor, width: int) -> torch.Tensor:
    """OR ``fields`` (..., m, 32 // width) of ``width`` bits into (..., m) words, as int64 in [0, 2**32)."""
    per_word = fields.shape[-1]
    shifts = torch.arange(per_word, device=fields.device, dtype=torch.int64) * width
    # The fields do not overlap, so the sum is a bitwise OR; int64 avoids signed overflow at bit 31.
    return (fields.to(torch.int64) << shifts).sum(dim=-1)


def _unpack_fields(words: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of :func:`_pack_fields`: int32 words (..., m) -> fields (..., m, 32 // width) as int64."""
    per_word = 32 // width
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int64) * width
    # Widen first: an arithmetic right shift of a negative int32 would drag the sign bit into the field.
    unsigned = words.to(torch.int64) & 0xFFFFFFFF
    return (unsigned.unsqueeze(-1) >> shifts) & ((1 << width) - 1)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Reinterpret unsigned 32-bit values held in int64 as int32 (two's complement wrap)."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes along the last dim into int32 words (layout in the module docstring).

    Args:
        codes: integer tensor (..., n) with values in [0, 2**bits - 1] (not validated here).
        bits: 2, 3, 4 or 8.

    Returns:
        int32 tensor (..., bits * ceil(n / 32)).
    """
    n = codes.shape[-1]
    n_chunks = -(-n // CHUNK)
    codes = codes.to(torch.int64)
    if n_chunks * CHUNK != n:  # zero-pad the last chunk
        codes = torch.nn.functional.pad(codes, (0, n_chunks * CHUNK - n))
    chunks = codes.reshape(*codes.shape[:-1], n_chunks, CHUNK)
    if bits == 3:
        low = _pack_fields((chunks & 3).reshape(*chunks.shape[:-1], 2, 16), 2)  # (..., n_chunks, 2)
        high = _pack_fields((chunks >> 2).reshape(*chunks.shape[:-1], 1, 32), 1)  # (..., n_chunks, 1)
        words = torch.cat([low, high], dim=-1)
    else:
        words = _pack_fields(chunks.reshape(*chunks.shape[:-1], bits, 32 // bits), bits)
    return _to_int32(words.reshape(*codes.shape[:-1], n_chunks * bits))


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Unpack the first ``n`` codes of each row of ``packed`` (inverse of :func:`pack_codes`).

    Args:
        packed: int32 tensor (..., bits * ceil(n / 32)).
        bits: 2, 3, 4 or 8.
        n: number of codes per row.

    Returns:
        uint8 tensor (..., n).
    """
    n_chunks = packed.shape[-1] // bits
    chunks = packed.reshape(*packed.shape[:-1], n_chunks, bits)
    if bits == 3:
        low = _unpack_fields(chunks[..., :2], 2).flatten(-2)  # (..., n_chunks, 32)
        high = _unpack_fields(chunks[..., 2], 1)  # (..., n_chunks, 32)
        codes = low | (high << 2)
    else:
        codes = _unpack_fields(chunks, bits).flatten(-2)  # (..., n_chunks, 32)
    return codes.flatten(-2)[..., :n].to(torch.uint8)


def group_codes(xg: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Round-to-nearest codes of grouped values against the stored scale and zero.

    Args:
        xg: float32 (..., n_groups, group_size).
        scale, zero: float32 (..., n_groups), the stored values widened to float32.
        bits: code width.

    Returns:
        int64 codes (..., n_groups, group_size) in [0, 2**bits - 1].
    """
    qmax = 2**bits - 1
    nonzero = scale > 0
    safe_scale = torch.where(nonzero, scale, torch.ones_like(scale)).unsqueeze(-1)
    v = (xg - zero.unsqueeze(-1)) / safe_scale
    v = torch.where(nonzero.unsqueeze(-1), v, torch.zeros_like(v))  # constant group: every code is 0
    return torch.floor(v + 0.5).clamp_(0, qmax).to(torch.int64)


@torch.no_grad()
def quantize(x: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-quantize and pack ``x`` (arguments already validated).

    Args:
        x: float tensor (..., d) with ``d % group_size == 0``.

    Returns:
        ``(packed, scale, zero)``: int32 (..., d // group_size, bits * group_size // 32) and two tensors
        (..., d // group_size) in ``x.dtype``.
    """
    *lead, d = x.shape
    xg = x.reshape(*lead, d // group_size, group_size).to(torch.float32)
    lo, hi = xg.amin(dim=-1), xg.amax(dim=-1)
    # Round scale and zero to their storage dtype first, then compute codes against the stored values.
    # Divide by a tensor, not a Python number: CUDA torch turns division by a scalar into multiplication
    # by its reciprocal, which is not correctly rounded (and then differs from the Triton kernel's div_rn).
    scale = ((hi - lo) / torch.full_like(hi, 2**bits - 1)).to(x.dtype)
    zero = lo.to(x.dtype)
    codes = group_codes(xg, scale.to(torch.float32), zero.to(torch.float32), bits)
    return pack_codes(codes, bits), scale, zero


@torch.no_grad()
def dequantize(
    packed: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    bits: int,
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Unpack and dequantize (arguments already validated).

    Args:
        packed: int32 (..., n_groups, bits * group_size // 32).
        scale, zero: (..., n_groups).

    Returns:
        ``dtype`` tensor (..., n_groups * group_size).
    """
    codes = unpack_codes(packed, bits, group_size).to(torch.float32)  # (..., n_groups, group_size)
    x = codes * scale.to(torch.float32).unsqueeze(-1) + zero.to(torch.float32).unsqueeze(-1)
    return x.to(dtype).flatten(-2)
