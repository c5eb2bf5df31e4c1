"""Hadamard-rotation + grid quantization: exact identities, properties, Triton (interpreted on CPU) vs reference."""

from __future__ import annotations

import doctest

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import icml25.kernels.hadamard_grid as hg
from icml25.kernels import triton_available
from icml25.kernels.hadamard_grid import fwht, grid_decode, grid_encode, hadamard_matrix
from icml25.kernels.hadamard_grid import reference as ref

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FAST = settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])


def test_doctest() -> None:
    assert doctest.testmod(hg).failed == 0


@FAST
@given(log_size=st.integers(0, 8), rows=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_fwht_is_matrix_product_and_involution(log_size: int, rows: int, seed: int) -> None:
    size = 2**log_size
    x = torch.randn(rows, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    h = hadamard_matrix(size, dtype=torch.float64)
    assert torch.equal(h, h.T) and torch.equal(h @ h, size * torch.eye(size, dtype=torch.float64))
    torch.testing.assert_close(fwht(x), x @ h, rtol=0, atol=1e-10)
    torch.testing.assert_close(fwht(fwht(x)) / size, x, rtol=0, atol=1e-10)


def test_encode_decode_exact_on_grid_points() -> None:
    # A vector whose rotated, normalised sub-vectors are grid points decodes exactly (up to fp16 scale).
    grid = torch.tensor([[-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [1.0, 1.0]])
    idx = torch.randint(0, 4, (3, 2, 8), generator=torch.Generator().manual_seed(0), dtype=torch.int64)
    z = grid[idx].reshape(3, 2, 16)  # |z| = sqrt(16) = 4, so x has norm 1
    x = (fwht(z) / 16 * 1.0).reshape(3, 32)  # H z / g: rotated back, norm sqrt(16)/4 = 1
    got_idx, scale = grid_encode(x, grid, 16, backend="reference")
    assert torch.equal(got_idx.long(), idx)
    torch.testing.assert_close(scale.float(), torch.ones(3, 2), atol=1e-3, rtol=0)
    torch.testing.assert_close(grid_decode(got_idx, scale, grid, 16), x, atol=1e-3, rtol=0)


def test_zero_group_decodes_to_zero() -> None:
    grid = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    x = torch.zeros(2, 64)
    idx, scale = grid_encode(x, grid, 32)
    assert torch.equal(scale, torch.zeros_like(scale))
    assert torch.equal(grid_decode(idx, scale, grid, 32), x)


def test_bad_inputs() -> None:
    grid = torch.randn(4, 2)
    with pytest.raises(ValueError, match="power of two"):
        grid_encode(torch.randn(2, 48), grid, 24)
    with pytest.raises(ValueError, match="divisible by group"):
        grid_encode(torch.randn(2, 48), grid, 32)
    with pytest.raises(ValueError, match="must divide group"):
        grid_encode(torch.randn(2, 64), torch.randn(4, 3), 32)
    with pytest.raises(TypeError, match="x must be"):
        grid_encode(torch.ones(2, 32, dtype=torch.int64), grid, 32)
    with pytest.raises(ValueError, match="idx must lie"):
        grid_decode(torch.full((1, 1, 16), 4), torch.ones(1, 1), grid, 32)
    with pytest.raises(ValueError, match="idx must have shape"):
        grid_decode(torch.zeros(1, 1, 8, dtype=torch.int32), torch.ones(1, 1), grid, 32)
    with pytest.raises(ValueError, match="x's last dim must be a power of two"):
        fwht(torch.randn(3, 6))


@needs_triton
def test_triton_forced_with_large_group_raises() -> None:
    with pytest.raises(ValueError, match="group in"):
        grid_encode(torch.randn(1, 512, device=DEVICE), torch.randn(4, 2), 512, backend="triton")


@needs_triton
@pytest.mark.parametrize(
    ("d", "n", "group", "dtype"),
    [
        (2, 16, 128, torch.float32),
        (1, 4, 16, torch.float16),
        (4, 256, 64, torch.bfloat16),
        (2, 64, 32, torch.float32),
    ],
)
def test_triton_matches_reference(d: int, n: int, group: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(d * 1000 + n + group)
    grid = torch.randn(n, d, generator=gen)
    x = (torch.randn(3, 7, 2 * group, generator=gen) * 3).to(dtype)
    x[0, 0, :group] = 0  # a zero group
    i_ref, s_ref = grid_encode(x, grid, group, backend="reference")
    i_tri, s_tri = grid_encode(x.to(DEVICE), grid.to(DEVICE), group, backend="triton")
    assert i_tri.dtype == torch.int32 and tuple(i_tri.shape) == tuple(i_ref.shape)
    assert torch.equal(s_tri.cpu(), s_ref)
    # Rotation sums run in a different order (tl.dot vs butterflies): only float ties may flip.
    assert (i_tri.cpu() != i_ref).float().mean().item() <= 0.005
    y_ref = grid_decode(i_ref, s_ref, grid, group, dtype, backend="reference")
    y_tri = grid_decode(i_ref.to(DEVICE), s_ref.to(DEVICE), grid.to(DEVICE), group, dtype, backend="triton")
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(
        y_tri.cpu().float(), y_ref.float(), atol=tol * float(s_ref.float().max()), rtol=tol
    )


def test_reference_nearest_is_brute_force() -> None:
    gen = torch.Generator().manual_seed(3)
    grid, z = torch.randn(16, 2, generator=gen), torch.randn(500, 2, generator=gen)
    brute = torch.cdist(z, grid).argmin(-1)
    assert torch.equal(ref.nearest(z, grid, chunk=64), brute)
