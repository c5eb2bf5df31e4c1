"""Low-bit group quantization: exact examples, property tests, Triton (interpreted on CPU) vs reference."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import icml25.kernels.quantization as quant
from icml25.kernels import triton_available
from icml25.kernels.quantization import (
    QuantizedTensor,
    dequantize,
    pack_codes,
    quantize,
    quantize_dequantize,
    unpack_codes,
)
from icml25.kernels.quantization import reference as ref

BITS = (2, 3, 4, 8)
GROUPS = (32, 64, 128)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")
# Triton runs on CUDA tensors when a GPU is present, otherwise in the interpreter (set by conftest.py).
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FAST = settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------------------------------
# An independent oracle for the packing layout, written from the docstring with Python ints.
# ----------------------------------------------------------------------------------------------------
def py_pack(codes: list[int], bits: int) -> list[int]:
    codes = codes + [0] * (-len(codes) % 32)
    out: list[int] = []
    for start in range(0, len(codes), 32):
        words = [0] * bits
        for k, code in enumerate(codes[start : start + 32]):
            if bits == 3:
                words[k // 16] |= (code & 3) << (2 * (k % 16))
                words[2] |= (code >> 2) << k
            else:
                per_word = 32 // bits
                words[k // per_word] |= code << ((k % per_word) * bits)
        out += [w - 2**32 if w >= 2**31 else w for w in words]
    return out


def error_bound(x: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """Per-element bound on |x - x_hat|: scale/2 plus float slack.

    Slack: float32 rounding of ``(x - zero) / scale`` (<= 2 * 2**-24 * qmax code units, < 1e-4 scale), the
    final cast to ``x.dtype`` (half an ulp of x_hat), and stored scales that are subnormal in their dtype.
    """
    scale = q.scale.double().repeat_interleave(q.group_size, dim=-1).reshape(x.shape)
    out_eps = torch.finfo(x.dtype).eps
    tiny = torch.finfo(q.scale.dtype).smallest_normal * torch.finfo(q.scale.dtype).eps  # subnormal ulp
    qmax = 2**q.bits - 1
    return scale * (0.5 + 1e-4) + (x.double().abs() + scale) * out_eps + qmax * tiny


# ----------------------------------------------------------------------------------------------------
# Exact hand examples
# ----------------------------------------------------------------------------------------------------
def test_known_group_gives_known_codes_and_values() -> None:
    # min -2, max 4, 2 bits -> scale 2, zero -2; ties round half up.
    vals = [-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0] + [4.0] * 25
    x = torch.tensor(vals).reshape(1, 32)
    q = quantize(x, bits=2, group_size=32)
    assert q.scale.item() == 2.0 and q.zero.item() == -2.0
    assert q.codes()[0, :7].tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert q.dequantize()[0, :7].tolist() == [-2.0, 0.0, 0.0, 2.0, 2.0, 4.0, 4.0]


@pytest.mark.parametrize("bits", BITS)
def test_values_on_the_grid_are_exact(bits: int) -> None:
    # Integers 0..qmax in every group: scale 1, zero 0, codes equal the values, round trip exact.
    qmax = 2**bits - 1
    codes = torch.arange(4 * 64) % (qmax + 1)
    codes[::64] = 0
    codes[1::64] = qmax
    x = codes.to(torch.float16).reshape(2, 128)
    q = quantize(x, bits=bits, group_size=64)
    assert torch.equal(q.scale, torch.ones(2, 2, dtype=torch.float16))
    assert torch.equal(q.codes().long(), codes.reshape(2, 128))
    assert torch.equal(q.dequantize(), x)


def test_constant_group_has_zero_scale_and_decodes_exactly() -> None:
    x = torch.full((3, 64), -7.25)
    x[1, 32:] = torch.linspace(0, 1, 32)
    q = quantize(x, bits=4, group_size=32)
    assert q.scale[0].tolist() == [0.0, 0.0] and q.scale[1, 0].item() == 0.0
    assert int(q.codes()[0].max()) == 0
    out = q.dequantize()
    assert torch.isfinite(out).all()
    assert torch.equal(out[0], x[0]) and torch.equal(out[1, :32], x[1, :32])


def test_known_packed_words() -> None:
    assert pack_codes(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), 4).tolist() == [0x87654321 - 2**32, 0, 0, 0]
    assert pack_codes(torch.tensor([1, 2, 3, 4] + [0] * 28), 8)[0].item() == 0x04030201
    # Bit 31 set: the word is stored as a negative int32 and unpacks unchanged.
    words = pack_codes(torch.full((32,), 3), 2)
    assert words.tolist() == [-1, -1]
    # 3 bits: two 2-bit words (low bits), then the high-bit plane.
    words = pack_codes(torch.tensor([5] + [0] * 15 + [6] + [0] * 15), 3)
    assert words.tolist() == [0b01, 0b10, (1 << 0) | (1 << 16)]


@pytest.mark.parametrize(
    ("bits", "group", "dtype", "expected"),
    [
        (4, 64, torch.float16, 4.5),
        (2, 32, torch.bfloat16, 3.0),
        (3, 128, torch.float32, 3.5),
        (3, 64, torch.float16, 3.5),
        (8, 128, torch.float16, 8.25),
        (2, 128, torch.float16, 2.25),
    ],
)
def test_bits_per_value_is_exact(bits: int, group: int, dtype: torch.dtype, expected: float) -> None:
    x = torch.randn(3, 5, 256).to(dtype)
    q = quantize(x, bits, group)
    assert q.bits_per_value == expected
    stored = (
        q.packed.numel() * 4
        + q.scale.numel() * q.scale.element_size()
        + q.zero.numel() * q.zero.element_size()
    )
    assert q.nbytes == stored == x.numel() * expected / 8
    assert q.packed.shape == (3, 5, 256 // group, bits * group // 32)
    assert q.scale.shape == q.zero.shape == (3, 5, 256 // group) and q.scale.dtype == dtype


# ----------------------------------------------------------------------------------------------------
# Property tests (hypothesis)
# ----------------------------------------------------------------------------------------------------
@FAST
@given(
    bits=st.sampled_from(BITS),
    data=st.data(),
    lead=st.lists(st.integers(1, 3), max_size=2),
    n=st.integers(1, 200),
)
def test_pack_unpack_lossless_and_matches_python_oracle(
    bits: int, data: st.DataObject, lead: list[int], n: int
) -> None:
    size = math.prod(lead) * n
    flat = data.draw(st.lists(st.integers(0, 2**bits - 1), min_size=size, max_size=size))
    codes = torch.tensor(flat, dtype=torch.uint8).reshape(*lead, n)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.int32 and packed.shape == (*lead, bits * math.ceil(n / 32))
    assert torch.equal(unpack_codes(packed, bits, n), codes)
    rows = codes.reshape(-1, n).tolist()
    assert packed.reshape(len(rows), -1).tolist() == [py_pack(r, bits) for r in rows]


@FAST
@given(bits=st.sampled_from(BITS), words=hnp.arrays(np.int32, (2, 24)))
def test_unpack_pack_lossless_for_every_word(bits: int, words: np.ndarray) -> None:
    packed = torch.from_numpy(words)  # 24 words: whole chunks for every bits value
    n = 24 // bits * 32
    assert torch.equal(pack_codes(unpack_codes(packed, bits, n), bits), packed)


def _float_arrays(dtype: torch.dtype, group: int) -> st.SearchStrategy[np.ndarray]:
    width, bound = {torch.float16: (16, 6e4), torch.float32: (32, 1e6), torch.bfloat16: (32, 1e6)}[dtype]
    shape = st.tuples(st.integers(1, 3), st.integers(1, 3)).map(lambda s: (s[0], s[1] * group))
    elements = st.floats(-bound, bound, width=width, allow_nan=False, allow_infinity=False)
    return hnp.arrays(np.float16 if width == 16 else np.float32, shape, elements=elements)


@FAST
@given(
    bits=st.sampled_from(BITS),
    group=st.sampled_from(GROUPS),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
    spread=st.sampled_from([1e-3, 1.0, 1e3]),
)
def test_round_trip_error_at_most_half_a_step(
    bits: int, group: int, dtype: torch.dtype, data: st.DataObject, spread: float
) -> None:
    arr = data.draw(_float_arrays(dtype, group))
    x = torch.from_numpy(arr).to(dtype)
    if data.draw(
        st.booleans()
    ):  # also dense random values at a given spread, not just hypothesis' edge cases
        x = (torch.randn(x.shape, generator=torch.Generator().manual_seed(len(arr))) * spread).to(dtype)
    q = quantize(x, bits, group)
    codes = q.codes()
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 2**bits - 1
    x_hat = q.dequantize()
    assert x_hat.shape == x.shape and x_hat.dtype == dtype
    err = (x_hat.double() - x.double()).abs()
    assert (err <= error_bound(x, q)).all()
    assert torch.equal(quantize_dequantize(x, bits, group), x_hat)


@FAST
@given(bits=st.sampled_from(BITS), group=st.sampled_from(GROUPS), seed=st.integers(0, 2**16))
def test_codes_are_the_nearest_grid_point(bits: int, group: int, seed: int) -> None:
    # Brute force over all 2**bits grid points: no code is closer than the chosen one (ties aside).
    x = torch.randn(2, group, generator=torch.Generator().manual_seed(seed))
    q = quantize(x, bits, group)
    grid = torch.arange(2**bits, dtype=torch.float64)
    points = grid * q.scale.double()[..., None] + q.zero.double()[..., None]  # (2, 1, 2**bits)
    dist = (x.double().reshape(2, 1, group, 1) - points[..., None, :]).abs()  # (2, 1, group, 2**bits)
    chosen = dist.gather(-1, q.codes().long().reshape(2, 1, group, 1)).squeeze(-1)
    assert (chosen <= dist.min(-1).values + 1e-6 * q.scale.double()[..., None]).all()


@FAST
@given(
    bits=st.sampled_from(BITS),
    group=st.sampled_from(GROUPS),
    seed=st.integers(0, 2**16),
    k=st.integers(-8, 8),
)
def test_power_of_two_rescaling_is_exact(bits: int, group: int, seed: int, k: int) -> None:
    # Multiplying by 2**k is exact in floating point, so codes are unchanged and scale/zero scale exactly.
    x = torch.randn(3, 2 * group, generator=torch.Generator().manual_seed(seed))
    q, q2 = quantize(x, bits, group), quantize(x * 2.0**k, bits, group)
    assert torch.equal(q.packed, q2.packed)
    assert torch.equal(q2.scale, q.scale * 2.0**k) and torch.equal(q2.zero, q.zero * 2.0**k)


def test_leading_shape_and_layout_do_not_matter() -> None:
    x = torch.randn(4, 6, 128)
    q = quantize(x, 3, 64)
    flat = quantize(x.reshape(-1, 128), 3, 64)
    assert torch.equal(q.packed.reshape(flat.packed.shape), flat.packed)
    xt = torch.randn(128, 4).t()  # non-contiguous
    assert torch.equal(quantize(xt, 4, 32).packed, quantize(xt.contiguous(), 4, 32).packed)
    empty = quantize(torch.zeros(0, 64), 4, 64)
    assert empty.packed.shape == (0, 1, 8) and empty.dequantize().shape == (0, 64)


def test_error_decreases_with_bits_and_smaller_groups() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=g) * torch.exp(torch.randn(256, generator=g))  # channel outliers

    def rel_mse(bits: int, group: int) -> float:
        return float(((quantize_dequantize(x, bits, group) - x) ** 2).sum() / (x**2).sum())

    for group in GROUPS:
        errs = [rel_mse(b, group) for b in BITS]
        assert errs == sorted(errs, reverse=True)
        # Uniform step s -> MSE ~ s^2/12: one more bit divides the error by ~4 (measured 3.6-4.4 for 2->3->4).
        assert 3.0 < errs[0] / errs[1] < 6.0 and 3.0 < errs[1] / errs[2] < 6.0
    for bits in BITS:
        assert rel_mse(bits, 32) < rel_mse(bits, 64) < rel_mse(bits, 128)


def test_module_docstring_example() -> None:
    assert doctest.testmod(quant, raise_on_error=False).failed == 0


# ----------------------------------------------------------------------------------------------------
# Triton kernels (interpreted on CPU) against the reference
# ----------------------------------------------------------------------------------------------------
def _triton_vs_reference(x: torch.Tensor, bits: int, group: int) -> None:
    x = x.to(TRITON_DEVICE)
    qr = quantize(x, bits, group, backend="reference")
    qt = quantize(x, bits, group, backend="triton")
    assert torch.equal(qt.packed, qr.packed), "packed words differ"
    assert torch.equal(qt.scale, qr.scale) and torch.equal(qt.zero, qr.zero)
    # Same float32 operations in the same order (no FMA): dequantized values are bit-identical.
    assert torch.equal(dequantize(qr, backend="triton"), dequantize(qr, backend="reference"))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_triton_matches_reference(dtype: torch.dtype, bits: int, group: int) -> None:
    g = torch.Generator().manual_seed(bits * group)
    x = (torch.randn(3, 5, 2 * group, generator=g) * 4).to(dtype)  # 30 groups: a partial last block
    x[0, 0, :group] = 0.375  # a constant group
    x[1, 2, group:] *= 1e-3
    _triton_vs_reference(x, bits, group)


@needs_triton
@settings(deadline=None, max_examples=12)
@given(
    bits=st.sampled_from(BITS),
    group=st.sampled_from(GROUPS),
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    spread=st.sampled_from([1e-6, 1.0, 1e4]),
)
def test_triton_matches_reference_property(
    bits: int, group: int, dtype: torch.dtype, rows: int, seed: int, spread: float
) -> None:
    x = (torch.randn(rows, group, generator=torch.Generator().manual_seed(seed)) * spread).to(dtype)
    _triton_vs_reference(x, bits, group)


@needs_triton
@pytest.mark.parametrize("bits", BITS)
def test_triton_dequantize_arbitrary_words(bits: int) -> None:
    # Every bit pattern (sign bit included) decodes identically.
    g = torch.Generator().manual_seed(bits)
    packed = torch.randint(-(2**31), 2**31, (7, 2, bits * 2), dtype=torch.int32, generator=g)
    scale, zero = torch.rand(7, 2, generator=g), torch.randn(7, 2, generator=g)
    q = QuantizedTensor(packed, scale, zero, bits, 64, torch.Size([7, 128]), torch.float32).to(TRITON_DEVICE)
    assert torch.equal(dequantize(q, backend="triton"), dequantize(q, backend="reference"))


# ----------------------------------------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------------------------------------
def _spy(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[str]:
    calls: list[str] = []
    original = getattr(module, name)

    def wrapper(*args: object, **kwargs: object) -> object:
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_env_reference_forces_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICML25_KERNELS_BACKEND", "reference")
    calls = _spy(monkeypatch, ref, "quantize")
    quantize(torch.randn(2, 64), 4)
    assert calls == ["quantize"]


def test_auto_on_cpu_uses_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ICML25_KERNELS_BACKEND", raising=False)
    calls = _spy(monkeypatch, ref, "dequantize")
    quantize(torch.randn(2, 64), 4).dequantize()
    assert calls == ["dequantize"]


@needs_triton
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="with a GPU, triton was imported without the interpreter"
)
def test_env_triton_runs_triton_in_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    import icml25.kernels.quantization.triton as tri

    monkeypatch.setenv("ICML25_KERNELS_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = _spy(monkeypatch, tri, "quantize")
    quantize(torch.randn(2, 64), 4)
    assert calls == ["quantize"]
    # The per-call argument wins over the environment.
    ref_calls = _spy(monkeypatch, ref, "quantize")
    quantize(torch.randn(2, 64), 4, backend="reference")
    assert ref_calls == ["quantize"] and calls == ["quantize"]


@needs_triton
def test_forcing_triton_on_cpu_without_interpreter_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        quantize(torch.randn(2, 64), 4, backend="triton")
    monkeypatch.setenv("ICML25_KERNELS_BACKEND", "triton")
    q = quantize(torch.randn(2, 64), 4, backend="reference")
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        q.dequantize()


def test_unknown_backend_raises() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        quantize(torch.randn(2, 64), 4, backend="cuda")


# ----------------------------------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: quantize([1.0] * 64, 4), TypeError, "x must be a torch.Tensor, got list"),
        (
            lambda: quantize(torch.zeros(2, 64, dtype=torch.float64), 4),
            TypeError,
            "float32, float16 or bfloat16, got torch.float64",
        ),
        (lambda: quantize(torch.zeros(2, 64, dtype=torch.int32), 4), TypeError, "got torch.int32"),
        (lambda: quantize(torch.tensor(1.0), 4), ValueError, "at least one dimension"),
        (
            lambda: quantize(torch.zeros(2, 100), 4, 64),
            ValueError,
            r"divisible by group_size=64, got shape \(2, 100\)",
        ),
        (lambda: quantize(torch.zeros(2, 64), 5), ValueError, r"bits must be one of \[2, 3, 4, 8\], got 5"),
        (lambda: quantize(torch.zeros(2, 64), 4.0), TypeError, "bits must be an int"),
        (lambda: quantize(torch.zeros(2, 64), True), TypeError, "bits must be an int"),
        (
            lambda: quantize(torch.zeros(2, 96), 4, 48),
            ValueError,
            r"group_size must be one of \[32, 64, 128\], got 48",
        ),
        (
            lambda: pack_codes(torch.tensor([0, 4]), 2),
            ValueError,
            r"codes must lie in \[0, 3\] for bits=2, got range \[0, 4\]",
        ),
        (lambda: pack_codes(torch.tensor([-1, 0]), 8), ValueError, r"codes must lie in \[0, 255\]"),
        (lambda: pack_codes(torch.tensor([0.0, 1.0]), 4), TypeError, "integer dtype, got torch.float32"),
        (
            lambda: pack_codes(np.zeros(4, dtype=np.int64), 4),
            TypeError,
            "codes must be a torch.Tensor, got ndarray",
        ),
        (
            lambda: unpack_codes(torch.zeros(3, dtype=torch.int32), 4, 32),
            ValueError,
            r"last dim bits \* ceil\(n / 32\) = 4",
        ),
        (
            lambda: unpack_codes(torch.zeros(4, dtype=torch.int64), 4, 32),
            TypeError,
            "packed must be an int32 tensor",
        ),
        (
            lambda: unpack_codes(torch.zeros(4, dtype=torch.int32), 4, -1),
            ValueError,
            "n must be an int >= 0, got -1",
        ),
        (lambda: unpack_codes(torch.zeros(4, dtype=torch.int32), 4, 32.0), TypeError, "n must be an int"),
        (lambda: dequantize(torch.zeros(2, 64)), TypeError, "q must be a QuantizedTensor, got Tensor"),
    ],
)
def test_bad_inputs(call: object, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call()  # type: ignore[operator]


def test_inconsistent_quantized_tensor_is_rejected() -> None:
    q = quantize(torch.randn(2, 128), 4, 64)
    with pytest.raises(ValueError, match=r"packed must have shape \(2, 2, 8\)"):
        QuantizedTensor(q.packed[:, :1], q.scale, q.zero, 4, 64, q.shape, q.dtype)
    with pytest.raises(
        ValueError, match=r"scale must have shape \(2, 2\) for shape=\(2, 128\), got \(2, 1\)"
    ):
        QuantizedTensor(q.packed, q.scale[:, :1], q.zero, 4, 64, q.shape, q.dtype)
    with pytest.raises(TypeError, match="packed must be int32"):
        QuantizedTensor(q.packed.long(), q.scale, q.zero, 4, 64, q.shape, q.dtype)
    with pytest.raises(TypeError, match=r"dtype must be torch\.float32, torch\.float16 or torch\.bfloat16"):
        QuantizedTensor(q.packed, q.scale, q.zero, 4, 64, q.shape, torch.float64)


def test_numpy_integer_arguments_and_empty_tensors() -> None:
    q = quantize(torch.randn(2, 64), np.int64(4), np.int32(32))
    assert q.bits == 4 and type(q.bits) is int and q.group_size == 32
    empty = quantize(torch.zeros(0, 128, dtype=torch.float16), 4, 64)
    assert empty.bits_per_value == 4.5 and empty.nbytes == 0
