"""Low-bit group quantization: fused Triton kernels (quantize+pack, unpack+dequantize).

Imported lazily, only when the Triton backend is selected. The arithmetic and the packing layout follow
:mod:`icml25.kernels.quantization.reference` operation for operation (float32, correctly rounded
divisions via ``tl.div_rn``, half-up rounding), so codes and packed words are bit-identical to the
reference. One program handles ``BLOCK_GROUPS`` groups; each group is viewed as a
``(group_size // 32, 32)`` tile of 32-code chunks, and chunk ``c`` owns words ``c*bits ... c*bits+bits-1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _round_to_bf16(x):
    """Round float32 ``x`` to the nearest bfloat16 (ties to even), returned as float32.

    Done with integer ops because the Triton CPU interpreter truncates on a plain ``.to(tl.bfloat16)``
    while GPUs round to nearest; after this the cast is exact on both, so codes match the reference.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _quantize_pack_kernel(
    x_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    n_groups,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_GROUPS: tl.constexpr,
    STORE_DTYPE: tl.constexpr,
):
    N_CHUNKS: tl.constexpr = GROUP // 32
    WORDS: tl.constexpr = BITS * N_CHUNKS  # int32 words per group
    QMAX: tl.constexpr = (1 << BITS) - 1
    PER_WORD: tl.constexpr = 32 // BITS  # codes per word for 2/4/8 bits (3 bits uses bit planes)

    pid = tl.program_id(0).to(tl.int64)  # int64 offsets: tensors may exceed 2**31 elements
    g = pid * BLOCK_GROUPS + tl.arange(0, BLOCK_GROUPS)  # (G,) group index
    c = tl.arange(0, N_CHUNKS)  # (C,) chunk within a group
    k = tl.arange(0, 32)  # (32,) code within a chunk
    g_ok = g < n_groups
    offs = g[:, None, None] * GROUP + c[None, :, None] * 32 + k[None, None, :]  # (G, C, 32)
    mask = g_ok[:, None, None]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)

    # Per-group min/max, then scale/zero rounded to the storage dtype *before* the codes are computed.
    lo = tl.min(tl.min(x, axis=2), axis=1)
    hi = tl.max(tl.max(x, axis=2), axis=1)
    scale = tl.div_rn(hi - lo, tl.full(lo.shape, QMAX, tl.float32))
    if STORE_DTYPE == tl.bfloat16:
        scale = _round_to_bf16(scale)
    scale = scale.to(STORE_DTYPE)
    zero = lo.to(STORE_DTYPE)  # exact: lo is one of the input values
    tl.store(scale_ptr + g, scale, mask=g_ok)
    tl.store(zero_ptr + g, zero, mask=g_ok)

    scale_f = scale.to(tl.float32)
    nonzero = scale_f > 0
    safe = tl.where(nonzero, scale_f, 1.0)[:, None, None]
    v = tl.div_rn(x - zero.to(tl.float32)[:, None, None], safe + tl.zeros_like(x))
    v = tl.where(nonzero[:, None, None], v, 0.0)
    q = tl.minimum(tl.maximum(tl.floor(v + 0.5), 0.0), QMAX).to(tl.uint32)  # (G, C, 32)

    # Pack: word j of a chunk is the OR (= sum, fields are disjoint) of its codes shifted into place.
    word_base = packed_ptr + g[:, None] * WORDS + c[None, :] * BITS  # (G, C)
    for j in tl.static_range(BITS):
        if BITS == 3:
            if j < 2:  # low 2 bits of codes 16*j ... 16*j + 15
                sel = (k // 16) == j
                field = (q & 3) << ((k % 16) * 2).to(tl.uint32)
            else:  # high bit of all 32 codes
                sel = k >= 0
                field = (q >> 2) << k.to(tl.uint32)
        else:
            sel = (k // PER_WORD) == j
            field = q << ((k % PER_WORD) * BITS).to(tl.uint32)
        word = tl.sum(tl.where(sel[None, None, :], field, 0), axis=2).to(tl.uint32)
        tl.store(word_base + j, word.to(tl.int32, bitcast=True), mask=g_ok[:, None])


@triton.jit
def _unpack_dequantize_kernel(
    packed_ptr,
    scale_ptr,
    zero_ptr,
    out_ptr,
    n_groups,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_GROUPS: tl.constexpr,
):
    N_CHUNKS: tl.constexpr = GROUP // 32
    WORDS: tl.constexpr = BITS * N_CHUNKS
    PER_WORD: tl.constexpr = 32 // BITS  # codes per word for 2/4/8 bits (3 bits uses bit planes)

    pid = tl.program_id(0).to(tl.int64)  # int64 offsets: tensors may exceed 2**31 elements
    g = pid * BLOCK_GROUPS + tl.arange(0, BLOCK_GROUPS)
    c = tl.arange(0, N_CHUNKS)
    k = tl.arange(0, 32)
    g_ok = g < n_groups
    mask = g_ok[:, None, None]
    word_base = packed_ptr + g[:, None, None] * WORDS + c[None, :, None] * BITS  # (G, C, 1)

    if BITS == 3:
        # Low 2 bits from word k // 16, high bit from word 2 (the bit plane).
        low = tl.load(word_base + (k // 16)[None, None, :], mask=mask, other=0).to(tl.uint32, bitcast=True)
        high = tl.load(word_base + 2 + 0 * k[None, None, :], mask=mask, other=0).to(tl.uint32, bitcast=True)
        q = ((low >> ((k % 16) * 2).to(tl.uint32)) & 3) | (((high >> k.to(tl.uint32)) & 1) << 2)
    else:
        w = tl.load(word_base + (k // PER_WORD)[None, None, :], mask=mask, other=0).to(
            tl.uint32, bitcast=True
        )
        q = (w >> ((k % PER_WORD) * BITS).to(tl.uint32)) & ((1 << BITS) - 1)

    scale = tl.load(scale_ptr + g, mask=g_ok, other=0.0).to(tl.float32)[:, None, None]
    zero = tl.load(zero_ptr + g, mask=g_ok, other=0.0).to(tl.float32)[:, None, None]
    x = q.to(tl.float32) * scale + zero
    offs = g[:, None, None] * GROUP + c[None, :, None] * 32 + k[None, None, :]
    if out_ptr.dtype.element_ty == tl.bfloat16:
        x = _round_to_bf16(x)
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)


def _block_groups(n_groups: int, group_size: int) -> int:
    """Groups per program: about 4096 elements per program, fewer for tiny inputs."""
    target = max(1, 4096 // group_size)
    return min(target, triton.next_power_of_2(max(n_groups, 1)))


def quantize(x: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused quantize+pack; same contract as :func:`icml25.kernels.quantization.reference.quantize`."""
    *lead, d = x.shape
    n_groups_row = d // group_size
    x2 = x.contiguous()
    n_groups = x2.numel() // group_size
    packed = torch.empty((*lead, n_groups_row, bits * group_size // 32), dtype=torch.int32, device=x.device)
    scale = torch.empty((*lead, n_groups_row), dtype=x.dtype, device=x.device)
    zero = torch.empty_like(scale)
    if n_groups == 0:
        return packed, scale, zero
    block = _block_groups(n_groups, group_size)
    _quantize_pack_kernel[(triton.cdiv(n_groups, block),)](
        x2, packed, scale, zero, n_groups,
        BITS=bits, GROUP=group_size, BLOCK_GROUPS=block, STORE_DTYPE=_TL_DTYPES[x.dtype],
        enable_fp_fusion=False,  # no FMA contraction: bit-identical to the reference on GPUs too
    )  # fmt: skip
    return packed, scale, zero


def dequantize(
    packed: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    bits: int,
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Fused unpack+dequantize; same contract as :func:`icml25.kernels.quantization.reference.dequantize`."""
    *lead, n_groups_row = scale.shape
    out = torch.empty((*lead, n_groups_row * group_size), dtype=dtype, device=packed.device)
    n_groups = scale.numel()
    if n_groups == 0:
        return out
    block = _block_groups(n_groups, group_size)
    _unpack_dequantize_kernel[(triton.cdiv(n_groups, block),)](
        packed.contiguous(), scale.contiguous(), zero.contiguous(), out, n_groups,
        BITS=bits, GROUP=group_size, BLOCK_GROUPS=block,
        enable_fp_fusion=False,  # code * scale + zero must not become an FMA (the reference rounds twice)
    )  # fmt: skip
    return out
