"""Low-bit group quantization: asymmetric min-max quantization in groups along the last dim, packed codes.

A float tensor ``x`` of shape ``(..., d)`` is split into groups of ``group_size`` (32, 64 or 128)
consecutive elements of its last dim; each group gets a ``scale`` and a ``zero`` (the value of code 0)
and its elements become ``bits``-bit codes (2, 3, 4 or 8), packed 32 codes per ``bits`` int32 words.
The exact arithmetic and the bit layout are specified in :mod:`icml25.kernels.quantization.reference`.

Storage choice: ``scale`` and ``zero`` are kept in the input dtype (fp32/fp16/bf16), as KV-cache
quantizers do; the codes are computed against these rounded values, so the round-trip error bound
``|x - dequantize(quantize(x))| <= scale / 2`` holds for the scale actually stored.

Ops dispatch through :func:`icml25.kernels.select_backend`: the fused Triton kernels for CUDA tensors,
the PyTorch reference otherwise (``backend=`` or ``ICML25_KERNELS_BACKEND`` forces one). The ops are not
differentiable (codes are integers); inputs must be finite.

Example::

    >>> import torch
    >>> from icml25.kernels.quantization import quantize
    >>> x = torch.randn(2, 8, 128, dtype=torch.float16)
    >>> q = quantize(x, bits=4, group_size=64)
    >>> q.bits_per_value, tuple(q.packed.shape)
    (4.5, (2, 8, 2, 8))
    >>> bool(((q.dequantize() - x).abs().float() <= q.scale.float().repeat_interleave(64, -1) / 2 + 1e-3).all())
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.checks import check_choice, check_int, check_tensor
from icml25.kernels.quantization import reference as _reference
from icml25.kernels.quantization.reference import SUPPORTED_BITS, SUPPORTED_DTYPES, SUPPORTED_GROUP_SIZES

__all__ = [
    "MAX_ABS",
    "SUPPORTED_BITS",
    "SUPPORTED_DTYPES",
    "SUPPORTED_GROUP_SIZES",
    "QuantizedTensor",
    "dequantize",
    "pack_codes",
    "quantize",
    "quantize_dequantize",
    "unpack_codes",
]


def _check_float_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must have dtype float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (quantized along the last), got a scalar")
    return x


# Largest |x| that quantize accepts: a group's range max - min (computed in float32) then stays <= half the
# float32 range, so scale, the codes and the dequantized values code * scale + zero are all finite.
MAX_ABS = torch.finfo(torch.float32).max / 4


@dataclass(frozen=True, eq=False)  # eq on tensors is ambiguous; compare fields explicitly
class QuantizedTensor:
    """A group-quantized tensor: packed codes plus per-group scale and zero.

    The constructor checks shapes, dtypes and devices but not values (no host sync): a hand-built
    ``scale``/``zero`` holding NaN/Inf dequantizes to NaN/Inf in its groups. :func:`quantize` never
    produces one.

    Attributes:
        packed: int32 ``(*shape[:-1], shape[-1] // group_size, bits * group_size // 32)`` packed codes.
        scale: ``(*shape[:-1], shape[-1] // group_size)`` in ``dtype``; code step of each group.
        zero: same shape and dtype as ``scale``; the value code 0 decodes to (the group minimum).
        bits: code width, 2, 3, 4 or 8.
        group_size: elements per group along the last dim, 32, 64 or 128.
        shape: shape of the original tensor.
        dtype: dtype of the original tensor (and of the dequantized one).
    """

    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    bits: int
    group_size: int
    shape: torch.Size
    dtype: torch.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", check_choice(check_int(self.bits, "bits"), "bits", SUPPORTED_BITS))
        object.__setattr__(
            self,
            "group_size",
            check_choice(check_int(self.group_size, "group_size"), "group_size", SUPPORTED_GROUP_SIZES),
        )
        if self.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {self.dtype!r}"
            )
        object.__setattr__(self, "shape", torch.Size(self.shape))
        if len(self.shape) == 0 or self.shape[-1] % self.group_size:
            raise ValueError(
                f"shape must have a last dim divisible by group_size={self.group_size}, got {tuple(self.shape)}"
            )
        groups = (*self.shape[:-1], self.shape[-1] // self.group_size)
        words = (*groups, self.bits * self.group_size // 32)
        for name, t, want_shape in (
            ("packed", self.packed, words),
            ("scale", self.scale, groups),
            ("zero", self.zero, groups),
        ):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != want_shape:
                raise ValueError(
                    f"{name} must have shape {want_shape} for shape={tuple(self.shape)}, got {tuple(t.shape)}"
                )
        if not (self.packed.device == self.scale.device == self.zero.device):
            raise ValueError(
                f"packed, scale and zero must be on one device, got {self.packed.device}, "
                f"{self.scale.device} and {self.zero.device}"
            )
        if self.packed.dtype != torch.int32:
            raise TypeError(f"packed must be int32, got {self.packed.dtype}")
        if self.scale.dtype != self.zero.dtype or not self.scale.is_floating_point():
            raise TypeError(
                f"scale and zero must share one float dtype, got {self.scale.dtype} and {self.zero.dtype}"
            )

    @property
    def device(self) -> torch.device:
        """Device of the packed codes."""
        return self.packed.device

    @property
    def numel(self) -> int:
        """Number of elements of the original tensor."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of storage: code words plus scale and zero in their stored dtype."""
        return self.packed.numel() * 4 + self.scale.numel() * self.scale.element_size() * 2

    @property
    def bits_per_value(self) -> float:
        """Exact storage bits per original element (codes + scale + zero), e.g. 4.5 for 4 bits, group 64, fp16.

        Measured from the stored tensors; for an empty tensor, the same ratio from its per-group layout.
        """
        if self.numel == 0:
            return self.bits + 2 * 8 * self.scale.element_size() / self.group_size
        return 8.0 * self.nbytes / self.numel

    def dequantize(self, *, backend: str | None = None) -> torch.Tensor:
        """Decode to a ``dtype`` tensor of ``shape``; see :func:`dequantize`."""
        return dequantize(self, backend=backend)

    def codes(self) -> torch.Tensor:
        """The unpacked codes, uint8 of ``shape`` (reference path, for inspection and tests)."""
        return _reference.unpack_codes(self.packed, self.bits, self.group_size).reshape(self.shape)

    def to(self, device: torch.device | str) -> QuantizedTensor:
        """A copy with every tensor moved to ``device``."""
        return QuantizedTensor(
            self.packed.to(device), self.scale.to(device), self.zero.to(device),
            self.bits, self.group_size, self.shape, self.dtype,
        )  # fmt: skip


def quantize(
    x: torch.Tensor,
    bits: int,
    group_size: int = 64,
    *,
    backend: str | None = None,
    check_finite: bool = True,
) -> QuantizedTensor:
    """Asymmetric min-max group quantization of ``x`` along its last dim, codes packed into int32.

    Args:
        x: float32/float16/bfloat16 tensor ``(..., d)``, finite, ``|x| <= MAX_ABS`` (a quarter of the
            float32 range), ``d`` divisible by ``group_size``. An empty ``x`` gives an empty result.
        bits: code width, 2, 3, 4 or 8.
        group_size: 32, 64 or 128 consecutive elements of the last dim per (scale, zero) pair.
        backend: ``"auto"``, ``"reference"`` or ``"triton"``; ``None`` reads ``ICML25_KERNELS_BACKEND``.
        check_finite: raise ``ValueError`` on NaN/Inf or ``|x| > MAX_ABS`` (a NaN/Inf would silently
            turn its whole group into NaN). The check is one reduction plus a host-device sync; pass
            ``False`` on a hot CUDA path when ``x`` is known to be finite (like ``scipy``'s
            ``check_finite``); the result for an unchecked non-finite ``x`` is then undefined.

    Returns:
        :class:`QuantizedTensor` with ``packed`` ``(..., d // group_size, bits * group_size // 32)`` and
        ``scale``/``zero`` ``(..., d // group_size)`` in ``x.dtype``.
    """
    _check_float_tensor("x", x)
    bits = check_choice(check_int(bits, "bits"), "bits", SUPPORTED_BITS)
    group_size = check_choice(check_int(group_size, "group_size"), "group_size", SUPPORTED_GROUP_SIZES)
    if x.shape[-1] % group_size:
        raise ValueError(
            f"x's last dim must be divisible by group_size={group_size}, got shape {tuple(x.shape)}"
        )
    if check_finite:  # a non-finite value would turn its whole group into NaN; one reduction, one host sync
        check_tensor(x, "x", dtype=None, max_abs=MAX_ABS)
    if select_backend(x, backend=backend) == "triton":
        from icml25.kernels.quantization import triton as _triton

        packed, scale, zero = _triton.quantize(x.detach(), bits, group_size)
    else:
        packed, scale, zero = _reference.quantize(x.detach(), bits, group_size)
    return QuantizedTensor(packed, scale, zero, bits, group_size, x.shape, x.dtype)


def dequantize(q: QuantizedTensor, *, backend: str | None = None) -> torch.Tensor:
    """Unpack and dequantize: ``code * scale + zero`` per group, in ``q.dtype`` with shape ``q.shape``.

    Args:
        q: the output of :func:`quantize`.
        backend: ``"auto"``, ``"reference"`` or ``"triton"``; ``None`` reads ``ICML25_KERNELS_BACKEND``.
    """
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"q must be a QuantizedTensor, got {type(q).__name__}")
    if select_backend(q.packed, q.scale, q.zero, backend=backend) == "triton":
        from icml25.kernels.quantization import triton as _triton

        out = _triton.dequantize(q.packed, q.scale, q.zero, q.bits, q.group_size, q.dtype)
    else:
        out = _reference.dequantize(q.packed, q.scale, q.zero, q.bits, q.group_size, q.dtype)
    return out.reshape(q.shape)


def quantize_dequantize(
    x: torch.Tensor,
    bits: int,
    group_size: int = 64,
    *,
    backend: str | None = None,
    check_finite: bool = True,
) -> torch.Tensor:
    """Fake quantization: ``dequantize(quantize(x, bits, group_size))``, same shape and dtype as ``x``."""
    q = quantize(x, bits, group_size, backend=backend, check_finite=check_finite)
    return dequantize(q, backend=backend)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes along the last dim: 32 codes -> ``bits`` int32 words (layout in ``reference``).

    Args:
        codes: integer tensor ``(..., n)`` with values in ``[0, 2**bits - 1]``.
        bits: 2, 3, 4 or 8.

    Returns:
        int32 tensor ``(..., bits * ceil(n / 32))`` (the last chunk is zero-padded).
    """
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise TypeError(f"codes must have an integer dtype, got {codes.dtype}")
    bits = check_choice(check_int(bits, "bits"), "bits", SUPPORTED_BITS)
    if codes.dim() == 0:
        raise ValueError("codes must have at least one dimension (packed along the last), got a scalar")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 2**bits - 1):
        raise ValueError(
            f"codes must lie in [0, {2**bits - 1}] for bits={bits}, got range [{int(codes.min())}, {int(codes.max())}]"
        )
    return _reference.pack_codes(codes, bits)


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Unpack the first ``n`` codes per row: int32 ``(..., bits * ceil(n / 32))`` -> uint8 ``(..., n)``."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"packed must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype != torch.int32:
        raise TypeError(f"packed must be an int32 tensor, got {packed.dtype}")
    bits = check_choice(check_int(bits, "bits"), "bits", SUPPORTED_BITS)
    n = check_int(n, "n", low=0)
    if packed.dim() == 0 or packed.shape[-1] != _reference.num_words(n, bits):
        raise ValueError(
            f"packed must have last dim bits * ceil(n / 32) = {_reference.num_words(n, bits)} for bits={bits}, "
            f"n={n}, got shape {tuple(packed.shape)}"
        )
    return _reference.unpack_codes(packed, bits, n)
