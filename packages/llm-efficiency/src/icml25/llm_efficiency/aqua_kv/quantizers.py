"""AQUA-KV: Cache Me If You Must: Adaptive Key-Value Quantization for Large Language Models — ICML 2025, P36: the quantizers (HIGGS: Hadamard + Gaussian grid; uniform baseline; passthrough).

Every quantizer maps a float matrix ``(N, c)`` (one row per token: heads concatenated) to a stored object
and back, and reports its nominal ``bits_per_value``; :func:`stored_bits` counts the bits the stored
object actually occupies (packed code words, scales), which is what the cache reports.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from dataclasses import dataclass

import torch

from icml25.kernels.hadamard_grid import grid_decode, grid_encode
from icml25.kernels.quantization import QuantizedTensor, pack_codes, quantize, unpack_codes

__all__ = [
    "HiggsCodes",
    "HiggsQuantizer",
    "PassthroughQuantizer",
    "UniformQuantizer",
    "make_gaussian_grid",
    "stored_bits",
]

_PLANE_WIDTHS = (8, 4, 3, 2)  # code widths icml25.kernels.quantization.pack_codes stores exactly


def _int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _check_matrix(x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a float torch.Tensor (N, c), got {getattr(x, 'dtype', type(x))}")
    if x.dim() != 2:
        raise ValueError(f"x must have shape (N, c) (one row per token), got {tuple(x.shape)}")
    return x


@functools.lru_cache(maxsize=32)
def _cached_grid(d: int, n: int, n_samples: int, iters: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    samples = torch.randn(n_samples, d, generator=gen)
    # k-means++-free init: n distinct random samples (deterministic under the seed) — Lloyd fixes the rest.
    centers = samples[torch.randperm(n_samples, generator=gen)[:n]].clone()
    prev_assign = None
    for _ in range(iters):
        norms = (centers * centers).sum(-1)
        assign = torch.cat(
            [(2 * s @ centers.T - norms).argmax(-1) for s in samples.split(max(1, (1 << 22) // n))]
        )
        if prev_assign is not None and torch.equal(assign, prev_assign):
            break  # Lloyd has converged: the next update would not move any center
        prev_assign = assign
        sums = torch.zeros_like(centers).index_add_(0, assign, samples)
        counts = torch.bincount(assign, minlength=n).unsqueeze(-1)
        # An empty cell keeps its old center (rare with n << n_samples).
        centers = torch.where(counts > 0, sums / counts.clamp_min(1), centers)
    return centers


def make_gaussian_grid(
    d: int, n: int, n_samples: int = 200_000, iters: int = 50, seed: int = 0
) -> torch.Tensor:
    """An ``(n, d)`` grid optimised for N(0, I_d): Lloyd's k-means on ``n_samples`` Gaussian draws.

    Deterministic given the arguments (built in memory, cached per argument tuple); the distortion
    ``E|z - G[nearest(z)]|^2 / d`` is ~0.117 for d=2, n=16 (2 bits per coordinate).
    """
    d, n = _int("d", d), _int("n", n)
    n_samples, iters, seed = _int("n_samples", n_samples), _int("iters", iters), _int("seed", seed)
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    if n < 2 or n_samples < n:
        raise ValueError(f"n must be in [2, n_samples={n_samples}], got n={n}")
    if iters < 0:
        raise ValueError(f"iters must be >= 0, got {iters}")
    return _cached_grid(d, n, n_samples, iters, seed).clone()


def _planes(bits: int) -> tuple[int, ...]:
    """Split a ``bits``-wide index into planes of widths the packer stores exactly (e.g. 6 -> (4, 2))."""
    out: list[int] = []
    while bits:
        w = next(w for w in _PLANE_WIDTHS if w <= bits and bits - w != 1)
        out.append(w)
        bits -= w
    return tuple(out)


@dataclass(frozen=True, eq=False)
class HiggsCodes:
    """HIGGS-encoded rows: grid indices packed in bit planes, one float16 norm per group.

    Attributes:
        planes: int32 packed code words, one tensor ``(N, words)`` per bit plane (low bits first).
        plane_bits: width of each plane.
        scale: float16 ``(N, n_groups)`` group norms.
        shape: ``(N, c)`` of the original matrix (before padding to a multiple of the group).
        dtype: dtype of the original matrix.
    """

    planes: tuple[torch.Tensor, ...]
    plane_bits: tuple[int, ...]
    scale: torch.Tensor
    shape: tuple[int, int]
    dtype: torch.dtype

    @property
    def nbits(self) -> int:
        """Bits actually stored: every packed int32 word plus every float16 scale."""
        return 32 * sum(p.numel() for p in self.planes) + 16 * self.scale.numel()

    @property
    def bits_per_value(self) -> float:
        """Stored bits per original element."""
        return self.nbits / max(1, math.prod(self.shape))


class HiggsQuantizer:
    """HIGGS: per-group Hadamard rotation + nearest point of a Gaussian-optimal ``(n, d)`` grid.

    Bits per value ``log2(n) / d + 16 / group`` (float16 group norm), e.g. 2.125 for d=2, n=16, group=128.
    Rows whose length ``c`` is not a multiple of ``group`` are zero-padded (the padding is stored and counted):
    the KV cache and the calibration (:meth:`check_width`) reject ``group > c`` and warn about the overhead
    when ``c % group != 0``.

    Args:
        d: grid dimension (divides ``group``).
        n: grid size, a power of two in [4, 65536].
        group: Hadamard group size, a power of two (official 1024; use <= c on small models).
        seed: seed of the grid's k-means.
        backend: kernel backend for encode/decode (``None``: automatic).
    """

    def __init__(
        self,
        d: int = 2,
        n: int = 16,
        group: int = 1024,
        seed: int = 0,
        *,
        grid_samples: int = 200_000,
        grid_iters: int = 50,
        backend: str | None = None,
    ) -> None:
        d, n, group = _int("d", d), _int("n", n), _int("group", group)
        if group < 1 or group & (group - 1):
            raise ValueError(f"group must be a power of two, got {group}")
        if d < 1 or group % d:
            raise ValueError(f"d must be >= 1 and divide group={group}, got d={d}")
        if n < 4 or n > 65536 or n & (n - 1):
            raise ValueError(f"n must be a power of two in [4, 65536], got {n}")
        self.d, self.n, self.group, self.seed, self.backend = d, n, group, _int("seed", seed), backend
        self.grid = make_gaussian_grid(d, n, grid_samples, grid_iters, seed)
        self.index_bits = int(math.log2(n))
        self.plane_bits = _planes(self.index_bits)

    @property
    def bits_per_value(self) -> float:
        """Nominal bits per value: index bits per coordinate plus the float16 norm per group."""
        return self.index_bits / self.d + 16 / self.group

    def __repr__(self) -> str:
        return f"HiggsQuantizer(d={self.d}, n={self.n}, group={self.group}, seed={self.seed})"

    def padded_bits_per_value(self, c: int) -> float:
        """Bits per value :meth:`quantize` actually stores for rows of length ``c``: the row is zero-padded
        to a multiple of ``group``, and each bit plane packs its codes 32 to a chunk (the last chunk padded)."""
        c = _int("c", c)
        if c < 1:
            raise ValueError(f"c must be >= 1, got {c}")
        n_groups = -(-c // self.group)
        chunks = -(-(n_groups * self.group // self.d) // 32)
        return (32 * chunks * sum(self.plane_bits) + 16 * n_groups) / c

    def check_width(self, c: int, name: str = "quantizer") -> None:
        """Check ``group`` against the KV width ``c`` (``num_key_value_heads * head_dim``) of a model.

        Raises ``ValueError`` when ``group > c``: every row would be zero-padded to ``group`` values, storing
        :meth:`padded_bits_per_value` instead of :attr:`bits_per_value`, and a power-of-two ``group <= c``
        always exists. Warns when ``c % group != 0`` (the last group of each row is partly padding).
        """
        c = _int("c", c)
        if self.group > c:
            fit = 1 << (c.bit_length() - 1)
            raise ValueError(
                f"{name}.group={self.group} exceeds the KV width c={c} (num_key_value_heads * head_dim): every "
                f"row would be zero-padded to {self.group} values, {self.padded_bits_per_value(c):.4g} bits per "
                f"value instead of {self.bits_per_value:.4g}; use group <= {fit}, e.g. "
                f"HiggsQuantizer(d={self.d}, n={self.n}, group={fit})"
            )
        if c % self.group:
            warnings.warn(
                f"{name}.group={self.group} does not divide the KV width c={c}: rows are zero-padded to "
                f"{-(-c // self.group) * self.group} values, {self.padded_bits_per_value(c):.4g} bits per value "
                f"instead of {self.bits_per_value:.4g}",
                stacklevel=3,
            )

    def quantize(self, x: torch.Tensor) -> HiggsCodes:
        """Encode ``x`` ``(N, c)`` into :class:`HiggsCodes`."""
        x = _check_matrix(x)
        pad = -x.shape[1] % self.group
        xp = torch.nn.functional.pad(x.float(), (0, pad)) if pad else x.float()
        idx, scale = grid_encode(xp, self.grid.to(x.device), self.group, backend=self.backend)
        idx = idx.reshape(x.shape[0], -1)  # (N, c_padded / d), in [0, n)
        planes, shift = [], 0
        for w in self.plane_bits:
            planes.append(pack_codes((idx >> shift) & ((1 << w) - 1), w))
            shift += w
        return HiggsCodes(tuple(planes), self.plane_bits, scale, (x.shape[0], x.shape[1]), x.dtype)

    def dequantize(self, q: HiggsCodes) -> torch.Tensor:
        """Decode :class:`HiggsCodes` back to ``(N, c)`` in the original dtype."""
        if not isinstance(q, HiggsCodes):
            raise TypeError(f"q must be HiggsCodes, got {type(q).__name__}")
        n_rows, c = q.shape
        n_groups = q.scale.shape[1]
        n_codes = n_groups * self.group // self.d
        idx = torch.zeros(n_rows, n_codes, dtype=torch.int32, device=q.scale.device)
        shift = 0
        for packed, w in zip(q.planes, q.plane_bits):
            idx |= unpack_codes(packed, w, n_codes).to(torch.int32) << shift
            shift += w
        idx = idx.reshape(n_rows, n_groups, self.group // self.d)
        x = grid_decode(idx, q.scale, self.grid.to(q.scale.device), self.group, backend=self.backend)
        return x[:, :c].to(q.dtype)

    def quantize_dequantize(self, x: torch.Tensor) -> torch.Tensor:
        """``dequantize(quantize(x))``."""
        return self.dequantize(self.quantize(x))


class UniformQuantizer:
    """Per-token asymmetric min-max group quantization (KIVI/Quanto-style baseline) from ``icml25.kernels``.

    Values are cast to float16 first (the storage dtype of a KV cache) so scale and zero cost 16 bits
    each: ``bits + 32 / group`` bits per value.

    Args:
        bits: 2, 3, 4 or 8.
        group: 32, 64 or 128 consecutive channels of a token per (scale, zero).
    """

    def __init__(self, bits: int = 2, group: int = 64, *, backend: str | None = None) -> None:
        self.bits, self.group, self.backend = _int("bits", bits), _int("group", group), backend
        if self.bits not in (2, 3, 4, 8):
            raise ValueError(f"bits must be one of (2, 3, 4, 8), got {self.bits}")
        if self.group not in (32, 64, 128):
            raise ValueError(f"group must be one of (32, 64, 128), got {self.group}")

    @property
    def bits_per_value(self) -> float:
        """Nominal bits per value: code bits plus a float16 scale and zero per group."""
        return self.bits + 32 / self.group

    def __repr__(self) -> str:
        return f"UniformQuantizer(bits={self.bits}, group={self.group})"

    def check_width(self, c: int, name: str = "quantizer") -> None:
        """Raise ``ValueError`` unless ``group`` divides the KV width ``c`` (no padding in this quantizer)."""
        c = _int("c", c)
        if c % self.group:
            raise ValueError(
                f"{name}.group={self.group} must divide the KV width c={c} (num_key_value_heads * head_dim)"
                + (" and not exceed it" if self.group > c else "")
            )

    def quantize(self, x: torch.Tensor) -> tuple[QuantizedTensor, torch.dtype]:
        """Quantize ``x`` ``(N, c)`` (``c % group == 0``); returns the kernel's QuantizedTensor and x's dtype."""
        x = _check_matrix(x)
        if x.shape[1] % self.group:
            raise ValueError(f"x's row length must be divisible by group={self.group}, got {tuple(x.shape)}")
        return quantize(x.to(torch.float16), self.bits, self.group, backend=self.backend), x.dtype

    def dequantize(self, q: tuple[QuantizedTensor, torch.dtype]) -> torch.Tensor:
        """Inverse of :meth:`quantize`, in the original dtype."""
        qt, dtype = q
        return qt.dequantize(backend=self.backend).to(dtype)

    def quantize_dequantize(self, x: torch.Tensor) -> torch.Tensor:
        """``dequantize(quantize(x))``."""
        return self.dequantize(self.quantize(x))


class PassthroughQuantizer:
    """No quantization: stores the rows cast to ``dtype`` (16-bit by default; ``None`` keeps the input dtype).

    With ``dtype=None`` on a float32 model the AQUA-KV cache is exactly the uncompressed cache (tests use
    this to check RoPE undo/redo and head reshapes). Values are not inspected: NaN/Inf pass through, and
    magnitudes beyond the 16-bit range become Inf, exactly as in an uncompressed 16-bit cache.
    """

    def __init__(self, dtype: torch.dtype | None = torch.float16) -> None:
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise TypeError(f"dtype must be a float torch.dtype or None, got {dtype!r}")
        self.dtype = dtype

    @property
    def bits_per_value(self) -> float:
        """Bits of the storage dtype (16 when ``dtype`` is None: the usual model dtype)."""
        return 16.0 if self.dtype is None else 8.0 * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"PassthroughQuantizer(dtype={self.dtype})"

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        x = _check_matrix(x)
        return (x.clone() if self.dtype is None else x.to(self.dtype)), x.dtype

    def dequantize(self, q: tuple[torch.Tensor, torch.dtype]) -> torch.Tensor:
        return q[0].to(q[1])

    def quantize_dequantize(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequantize(self.quantize(x))


def stored_bits(q: object) -> int:
    """Bits actually occupied by a quantizer's stored object (packed words, scales, raw tensors)."""
    if isinstance(q, HiggsCodes):
        return q.nbits
    if isinstance(q, tuple) and len(q) == 2 and isinstance(q[1], torch.dtype):
        q = q[0]
    if isinstance(q, QuantizedTensor):
        return 8 * q.nbytes
    if isinstance(q, torch.Tensor):
        return 8 * q.numel() * q.element_size()
    raise TypeError(f"q must be a stored quantizer object, got {type(q).__name__}")
