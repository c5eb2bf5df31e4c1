"""Tests of the sparse top-k decode op family (reference vs dense oracle, Triton vs reference)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels import triton_available
from icml25.kernels.topk_decode import (
    dense_decode,
    topk_decode,
    topk_decode_prefix,
    topk_decode_prefix_reference,
    topk_decode_reference,
)

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton not installed")


# Triton runs on CUDA tensors when a GPU is present, else in the interpreter (TRITON_INTERPRET=1) on CPU.
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(B=6, K=10, n=33, d=40, dtype=torch.float32, seed=0, dup=True, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, K, generator=g, dtype=dtype)
    idx = torch.randint(0, n, (B, K), generator=g)
    if dup and K >= 3:
        idx[0, :3] = 5  # repeated latents in one row must add up
    W = torch.randn(n, d, generator=g, dtype=dtype)
    return values.to(device), idx.to(device), W.to(device)


def test_reference_equals_dense_scatter_matmul_forward_and_backward():
    values, idx, W = _inputs(dtype=torch.float64)
    values.requires_grad_(True)
    W.requires_grad_(True)
    out = topk_decode(values, idx, W, backend="reference")
    ref = dense_decode(values, idx, W)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    g = torch.randn_like(out)
    ga = torch.autograd.grad(out, (values, W), g)
    gb = torch.autograd.grad(ref, (values, W), g)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_reference_gradcheck_float64():
    values, idx, W = _inputs(B=3, K=5, n=7, d=4, dtype=torch.float64)
    values.requires_grad_(True)
    W.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v, w: topk_decode_reference(v, idx, w), (values, W))
    assert torch.autograd.gradcheck(
        lambda v, w: topk_decode_prefix_reference(v, idx, w, [1, 3, 5]), (values, W)
    )


def test_prefix_equals_separate_decodes_and_leading_dims():
    values, idx, W = _inputs(B=8, K=16)
    ks = [1, 4, 9, 16]
    out = topk_decode_prefix(values, idx, W, ks, backend="reference")
    assert out.shape == (4, 8, 40)
    for level, k in enumerate(ks):
        torch.testing.assert_close(
            out[level], dense_decode(values[:, :k], idx[:, :k], W), rtol=1e-5, atol=1e-5
        )
    # [..., k] inputs keep their leading dims.
    out3 = topk_decode(values.reshape(2, 4, 16), idx.reshape(2, 4, 16), W)
    torch.testing.assert_close(out3.reshape(8, 40), out[-1], rtol=1e-6, atol=1e-6)


def test_decode_of_topk_equals_dense_sae_decode():
    torch.manual_seed(0)
    pre = torch.randn(16, 64)
    W = torch.randn(64, 24)
    vals, idx = torch.topk(pre, 8, dim=-1)
    z = torch.zeros_like(pre).scatter(-1, idx, vals.relu())
    torch.testing.assert_close(topk_decode(vals.relu(), idx, W), z @ W, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 5),
    K=st.integers(1, 9),
    n=st.integers(1, 12),
    d=st.integers(1, 9),
    seed=st.integers(0, 10_000),
)
def test_property_reference_matches_dense(B, K, n, d, seed):
    values, idx, W = _inputs(B, K, n, d, dtype=torch.float64, seed=seed, dup=False)
    torch.testing.assert_close(
        topk_decode(values, idx, W), dense_decode(values, idx, W), rtol=1e-10, atol=1e-10
    )
    ks = sorted({1, (K + 1) // 2, K})
    out = topk_decode_prefix(values, idx, W, ks)
    # Linearity: the last level is the sum of the decodes of the disjoint segments.
    segs = [0, *ks]
    total = sum(dense_decode(values[:, a:b], idx[:, a:b], W) for a, b in itertools.pairwise(segs))
    torch.testing.assert_close(out[-1], total, rtol=1e-10, atol=1e-10)


@needs_triton
@pytest.mark.parametrize("shape", [(6, 10, 33, 40), (3, 37, 50, 130), (1, 1, 1, 1)])
def test_triton_forward_and_backward_match_reference(shape):
    B, K, n, d = shape
    values, idx, W = _inputs(B, K, n, d, device=TRITON_DEVICE)
    v1, W1 = values.clone().requires_grad_(True), W.clone().requires_grad_(True)
    v2, W2 = values.clone().requires_grad_(True), W.clone().requires_grad_(True)
    ref = topk_decode(v1, idx, W1, backend="reference")
    tri = topk_decode(v2, idx, W2, backend="triton")
    torch.testing.assert_close(tri, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    ref.backward(g)
    tri.backward(g)
    torch.testing.assert_close(v2.grad, v1.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(W2.grad, W1.grad, rtol=1e-5, atol=1e-4)


@needs_triton
def test_triton_prefix_forward_and_backward_match_reference():
    values, idx, W = _inputs(B=5, K=40, n=64, d=48, seed=3, device=TRITON_DEVICE)
    ks = [2, 3, 17, 33]  # K > ks[-1]: the tail gets zero gradient
    v1, W1 = values.clone().requires_grad_(True), W.clone().requires_grad_(True)
    v2, W2 = values.clone().requires_grad_(True), W.clone().requires_grad_(True)
    ref = topk_decode_prefix(v1, idx, W1, ks, backend="reference")
    tri = topk_decode_prefix(v2, idx, W2, ks, backend="triton")
    torch.testing.assert_close(tri, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    ref.backward(g)
    tri.backward(g)
    torch.testing.assert_close(v2.grad, v1.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(W2.grad, W1.grad, rtol=1e-5, atol=1e-4)
    assert torch.all(v2.grad[:, 33:] == 0)


@needs_triton
def test_triton_gradcheck_style_finite_difference_float32():
    # Triton accumulates in float32: check its gradient against central differences of the reference.
    values, idx, W = _inputs(B=2, K=4, n=6, d=5, seed=1, device=TRITON_DEVICE)
    v = values.clone().requires_grad_(True)
    out = topk_decode(v, idx, W, backend="triton")
    g = torch.randn_like(out)
    (grad_v,) = torch.autograd.grad(out, v, g)
    eps = 1e-3
    fd = torch.zeros_like(values)
    for b in range(2):
        for j in range(4):
            vp, vm = values.clone().double(), values.clone().double()
            vp[b, j] += eps
            vm[b, j] -= eps
            Wd = W.double()
            fd[b, j] = ((dense_decode(vp, idx, Wd) - dense_decode(vm, idx, Wd)) * g.double()).sum() / (
                2 * eps
            )
    torch.testing.assert_close(grad_v, fd, rtol=1e-3, atol=1e-3)


def test_bad_inputs_raise_clear_errors():
    values, idx, W = _inputs()
    with pytest.raises(ValueError, match="same shape"):
        topk_decode(values[:, :3], idx, W)
    with pytest.raises(ValueError, match=r"idx must lie in \[0, n=33\)"):
        topk_decode(values, idx + 40, W)
    with pytest.raises(TypeError, match="idx must be an integer"):
        topk_decode(values, idx.float(), W)
    with pytest.raises(TypeError, match="values must be a floating-point"):
        topk_decode(idx, idx, W)
    with pytest.raises(ValueError, match="W_dec must be a floating-point matrix"):
        topk_decode(values, idx, W[0])
    with pytest.raises(ValueError, match="strictly increasing"):
        topk_decode_prefix(values, idx, W, [4, 2])
    with pytest.raises(ValueError, match=r"ks must lie in \[1, k=10\]"):
        topk_decode_prefix(values, idx, W, [2, 11])
    with pytest.raises(TypeError, match="ks must contain ints"):
        topk_decode_prefix(values, idx, W, [2.0, 4])
    with pytest.raises(ValueError, match="backend must be one of"):
        topk_decode(values, idx, W, backend="cuda")


def test_empty_k_returns_zeros():
    W = torch.randn(5, 3)
    out = topk_decode(torch.zeros(4, 0), torch.zeros(4, 0, dtype=torch.long), W)
    assert out.shape == (4, 3)
    assert torch.all(out == 0)
