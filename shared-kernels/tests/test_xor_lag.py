"""Tests of icml25.kernels.xor_lag: packed all-pairs × all-lags XOR patch matching (P54 ARROW)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels import triton_available
from icml25.kernels.xor_lag import (
    pack_bits,
    popcount32,
    unpack_bits,
    xor_lag_counts,
    xor_lag_counts_bruteforce,
)


def python_counts(bits: list[list[int]], lag_max: int, patch_bits: int) -> tuple[list, list]:
    """Plain-Python loops over pairs, lags and patches (the definition, no vectorisation)."""
    n, n_bits = len(bits), len(bits[0])
    n_p0 = n_bits - patch_bits + 1
    same = [[[0] * lag_max for _ in range(n)] for _ in range(n)]
    opp = [[[0] * lag_max for _ in range(n)] for _ in range(n)]
    for e in range(n):
        for c in range(n):
            for tau in range(lag_max):
                for p in range(n_p0 - tau):
                    x = [bits[e][p + tau + m] ^ bits[c][p + m] for m in range(patch_bits)]
                    same[e][c][tau] += all(v == 0 for v in x)
                    opp[e][c][tau] += all(v == 1 for v in x)
    return same, opp


def test_hand_example() -> None:
    # effect = cause delayed by one step: at lag 1 every patch pair matches.
    cause = [1, 0, 0, 1, 1, 0]
    effect = [0, *cause[:-1]]
    words = pack_bits(torch.tensor([effect, cause], dtype=torch.bool))
    same, opp = xor_lag_counts(words, 6, 3, backend="reference")
    n_pairs_lag1 = 6 - 2 + 1 - 1
    assert same[0, 1, 1].item() == n_pairs_lag1
    assert opp[0, 1, 1].item() == 0
    # a stream against its own complement is mirrored everywhere at lag 0
    words = pack_bits(torch.tensor([cause, [1 - b for b in cause]], dtype=torch.bool))
    same, opp = xor_lag_counts(words, 6, 1, backend="reference")
    assert opp[1, 0, 0].item() == 5 and same[1, 0, 0].item() == 0


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3),
    n_bits=st.integers(2, 100),
    patch_bits=st.integers(1, 3),
    data=st.data(),
)
def test_reference_equals_python_loops(n: int, n_bits: int, patch_bits: int, data: st.DataObject) -> None:
    if n_bits < patch_bits:
        n_bits = patch_bits
    lag_max = data.draw(st.integers(1, min(8, n_bits - patch_bits + 1)))
    bits = data.draw(
        st.lists(st.lists(st.integers(0, 1), min_size=n_bits, max_size=n_bits), min_size=n, max_size=n)
    )
    words = pack_bits(torch.tensor(bits, dtype=torch.bool))
    same, opp = xor_lag_counts(words, n_bits, lag_max, patch_bits, backend="reference")
    ps, po = python_counts(bits, lag_max, patch_bits)
    assert same.tolist() == ps
    assert opp.tolist() == po


@settings(max_examples=25, deadline=None)
@given(n_bits=st.integers(1, 300), n=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_pack_roundtrip(n_bits: int, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    bits = torch.rand(n, n_bits, generator=g) < 0.5
    words = pack_bits(bits)
    assert words.shape == (n, -(-n_bits // 32))
    assert int(words.min()) >= 0 and int(words.max()) < 2**32
    assert torch.equal(unpack_bits(words, n_bits), bits)


def test_popcount_exact() -> None:
    v = torch.tensor([0, 1, 2**32 - 1, 0x80000000, 0x0F0F1234, 123456789])
    assert popcount32(v).tolist() == [bin(x).count("1") for x in v.tolist()]


def test_reference_matches_bruteforce_odd_lengths() -> None:
    g = torch.Generator().manual_seed(0)
    for n_bits in (33, 63, 65, 97, 191):
        bits = torch.rand(5, n_bits, generator=g) < 0.5
        words = pack_bits(bits)
        ref = xor_lag_counts(words, n_bits, 30, backend="reference")
        brute = xor_lag_counts_bruteforce(bits, 30)
        assert torch.equal(ref[0], brute[0]) and torch.equal(ref[1], brute[1])


@pytest.mark.skipif(not triton_available(), reason="triton not installed")
@pytest.mark.parametrize(
    ("n", "n_bits", "lag_max", "patch_bits"), [(2, 40, 3, 2), (3, 70, 2, 3), (2, 97, 2, 1)]
)
def test_triton_matches_reference_exactly(n: int, n_bits: int, lag_max: int, patch_bits: int) -> None:
    g = torch.Generator().manual_seed(n_bits)
    bits = torch.rand(n, n_bits, generator=g) < 0.5
    words = pack_bits(bits)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = xor_lag_counts(words, n_bits, lag_max, patch_bits, backend="reference")
    tri = xor_lag_counts(words.to(device), n_bits, lag_max, patch_bits, backend="triton")
    assert torch.equal(tri[0].cpu(), ref[0]) and torch.equal(tri[1].cpu(), ref[1])


def test_bad_inputs() -> None:
    words = pack_bits(torch.ones(2, 10, dtype=torch.bool))
    with pytest.raises(TypeError, match="words"):
        xor_lag_counts(words.float(), 10, 2)
    with pytest.raises(ValueError, match="2-D"):
        xor_lag_counts(words[0], 10, 2)
    with pytest.raises(ValueError, match="lag_max"):
        xor_lag_counts(words, 10, 10)
    with pytest.raises(ValueError, match="n_bits"):
        xor_lag_counts(words, 64, 2)
    with pytest.raises(TypeError, match="lag_max"):
        xor_lag_counts(words, 10, 2.0)  # type: ignore[arg-type]
