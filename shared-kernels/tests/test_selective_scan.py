"""Tests of the selective-scan (Mamba S6) op family (P13 SLWS): the recurrence against a brute-force
definition and closed forms, sequential = chunked, gradients (gradcheck), Triton vs reference forward and
backward (TRITON_INTERPRET=1 on CPU), bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels import triton_available
from icml25.kernels.selective_scan import (
    MAX_TRITON_STATE,
    selective_scan,
    selective_scan_chunked,
    selective_scan_chunked_reference,
    selective_scan_reference,
)

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton not installed")
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F64 = {"rtol": 0.0, "atol": 1e-10}


def _inputs(Bs=2, D=3, L=5, N=4, seed=0, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    u, delta, z = r(Bs, D, L), r(Bs, D, L), r(Bs, D, L)
    A = -torch.exp(r(D, N) * 0.5)  # Mamba's A = -exp(A_log)
    B, C = r(Bs, N, L), r(Bs, N, L)
    Dskip, bias = r(D), r(D) * 0.5
    return [t.to(dtype=dtype, device=device) for t in (u, delta, A, B, C, Dskip, z, bias)]


def _brute_force(u, delta, A, B, C, D, z, bias):
    """Scalar loops over b, d, n, t of the definition x_t = e^{Δ A} x_{t-1} + Δ B u, y = C·x + D u, · silu(z)."""
    dl = F.softplus(delta + bias[:, None])
    Bs, Dch, L = u.shape
    N = A.shape[1]
    out = torch.zeros_like(u)
    last = torch.zeros(Bs, Dch, N, dtype=u.dtype)
    for b in range(Bs):
        for d in range(Dch):
            x = [0.0] * N
            for t in range(L):
                dt = float(dl[b, d, t])
                y = 0.0
                for n in range(N):
                    x[n] = math.exp(dt * float(A[d, n])) * x[n]
                    x[n] += dt * float(B[b, n, t]) * float(u[b, d, t])
                    y += float(C[b, n, t]) * x[n]
                y += float(D[d]) * float(u[b, d, t])
                out[b, d, t] = y * float(F.silu(z[b, d, t]))
            last[b, d] = torch.tensor(x, dtype=torch.float64)
    return out, last


# --------------------------------------------------------------------------------------------- semantics
def test_reference_equals_brute_force_definition():
    args = _inputs(Bs=2, D=2, L=4, N=3, seed=1)
    out, last = selective_scan(*args, delta_softplus=True, return_last_state=True)
    bo, bl = _brute_force(*args)
    torch.testing.assert_close(out, bo, **F64)
    torch.testing.assert_close(last, bl, **F64)


def test_closed_forms_zero_decay_is_a_cumsum_and_identity_gate():
    # A = 0: x_t = Σ_{s<=t} Δ_s B_s u_s, so with N = 1, B = C = 1: y = cumsum(Δ u); no D, no z.
    u, delta, _, _, _, _, _, _ = _inputs(Bs=2, D=3, L=6, N=1, seed=2)
    A = torch.zeros(3, 1, dtype=torch.float64)
    ones = torch.ones(2, 1, 6, dtype=torch.float64)
    out = selective_scan(u, delta, A, ones, ones)
    torch.testing.assert_close(out, torch.cumsum(delta * u, dim=-1), **F64)
    # Δ → large and A < 0: the state forgets everything but the current input, y_t = Δ_t u_t (B C)_t.
    big = torch.full_like(delta, 60.0)
    out = selective_scan(u, big, -torch.ones(3, 1, dtype=torch.float64), ones, ones)
    torch.testing.assert_close(out, 60.0 * u, **F64)


@settings(max_examples=30, deadline=None)
@given(
    Bs=st.integers(1, 2),
    D=st.integers(1, 3),
    L=st.integers(1, 11),
    N=st.integers(1, 4),
    chunk=st.integers(1, 12),
    softplus=st.booleans(),
    with_dz=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_property_sequential_equals_chunked(Bs, D, L, N, chunk, softplus, with_dz, seed):
    u, delta, A, B, C, Dskip, z, bias = _inputs(Bs, D, L, N, seed=seed)
    extra = (Dskip, z, bias) if with_dz else (None, None, None)
    a, sa = selective_scan_reference(u, delta, A, B, C, *extra, delta_softplus=softplus)
    b, sb = selective_scan_chunked_reference(u, delta, A, B, C, *extra, softplus, chunk_size=chunk)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sa, sb, rtol=1e-10, atol=1e-10)


def test_split_sequence_state_matches_prefix_and_chunked_op():
    args = _inputs(Bs=2, D=3, L=9, N=2, seed=3)
    full, last = selective_scan(*args, delta_softplus=True, return_last_state=True)
    u, delta, A, B, C, Dskip, z, bias = args
    pre, plast = selective_scan(
        u[..., :5], delta[..., :5], A, B[..., :5], C[..., :5], Dskip, z[..., :5], bias,
        delta_softplus=True, return_last_state=True,
    )  # fmt: skip
    torch.testing.assert_close(pre, full[..., :5], **F64)  # causal: the prefix does not see the future
    ch, clast = selective_scan_chunked(*args, delta_softplus=True, return_last_state=True, chunk_size=4)
    torch.testing.assert_close(ch, full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(clast, last, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(plast, last)


def test_empty_sequence_gives_empty_output_and_zero_state():
    u, delta, A, B, C, *_ = _inputs(Bs=2, D=3, L=4, N=2)
    out, last = selective_scan(u[..., :0], delta[..., :0], A, B[..., :0], C[..., :0], return_last_state=True)
    assert out.shape == (2, 3, 0) and torch.all(last == 0) and last.shape == (2, 3, 2)


# --------------------------------------------------------------------------------------------- gradients
def test_gradcheck_float64_reference_and_chunked():
    leaves = [t.requires_grad_() for t in _inputs(Bs=1, D=2, L=4, N=2, seed=4)]
    for chunk in (None, 3):
        assert torch.autograd.gradcheck(
            lambda *a, chunk=chunk: selective_scan(*a, delta_softplus=True, return_last_state=True, chunk_size=chunk),
            leaves,
        )  # fmt: skip


# ---------------------------------------------------------------------------------- Triton vs reference
@needs_triton
@pytest.mark.parametrize(("Bs", "D", "L", "N", "full"), [(2, 3, 5, 4, True), (1, 35, 4, 3, False)])
def test_triton_forward_and_backward_match_reference(Bs, D, L, N, full):
    args = _inputs(Bs, D, L, N, seed=5, dtype=torch.float32, device=TRITON_DEVICE)
    if not full:
        args[5:] = [None, None, None]  # no D, no z, no bias; D = 35 spans two channel blocks
    la = [t.clone().requires_grad_() if t is not None else None for t in args]
    lb = [t.clone().requires_grad_() if t is not None else None for t in args]
    kw = {"delta_softplus": full, "return_last_state": True}
    oa, sa = selective_scan(*la, backend="triton", **kw)
    ob, sb = selective_scan(*lb, backend="reference", **kw)
    torch.testing.assert_close(oa, ob, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(sa, sb, rtol=1e-4, atol=1e-4)
    g1, g2 = torch.randn_like(oa), torch.randn_like(sa)
    leaves_a = [t for t in la if t is not None]
    leaves_b = [t for t in lb if t is not None]
    ga = torch.autograd.grad((oa, sa), leaves_a, (g1, g2))
    gb = torch.autograd.grad((ob, sb), leaves_b, (g1, g2))
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


@needs_triton
def test_triton_output_only_gradient_and_half_precision():
    args = _inputs(1, 4, 6, 2, seed=6, dtype=torch.float32, device=TRITON_DEVICE)
    la = [t.clone().requires_grad_() for t in args]
    out = selective_scan(*la, delta_softplus=True, backend="triton")  # grad of the output only
    ref = selective_scan(*[t.double() for t in args], delta_softplus=True, backend="reference")
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    grads = torch.autograd.grad(out.sum(), la)
    lb = [t.double().requires_grad_() for t in args]
    ref_grads = torch.autograd.grad(selective_scan(*lb, delta_softplus=True).sum(), lb)
    for x, y in zip(grads, ref_grads):
        torch.testing.assert_close(x.double(), y, rtol=1e-4, atol=1e-4)
    half = selective_scan(*[t.half() for t in args], delta_softplus=True, backend="triton")
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.double(), ref, rtol=3e-2, atol=3e-2)


@needs_triton
def test_triton_limits_raise_clear_errors():
    args = _inputs(1, 2, 3, 2, dtype=torch.float64, device=TRITON_DEVICE)
    with pytest.raises(TypeError, match="u must be float32, float16 or bfloat16 on the Triton path"):
        selective_scan(*args, backend="triton")
    u, delta, _, B, C, *_ = _inputs(1, 2, 3, MAX_TRITON_STATE + 1, dtype=torch.float32, device=TRITON_DEVICE)
    A = -torch.ones(2, MAX_TRITON_STATE + 1, device=TRITON_DEVICE)
    with pytest.raises(ValueError, match="exceeds MAX_TRITON_STATE = 256"):
        selective_scan(u, delta, A, B, C, backend="triton")


def test_auto_dispatch_uses_the_reference_for_cpu_tensors(monkeypatch):
    args = _inputs(1, 2, 3, 2)
    out = selective_scan(*args)
    monkeypatch.setenv("ICML25_KERNELS_BACKEND", "reference")
    torch.testing.assert_close(selective_scan(*args), out, rtol=0, atol=0)


# -------------------------------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_clear_errors():
    u, delta, A, B, C, Dskip, z, bias = _inputs(Bs=2, D=3, L=4, N=2)
    with pytest.raises(ValueError, match=r"u must be 3-D \[B, D, L\]"):
        selective_scan(u[0], delta, A, B, C)
    with pytest.raises(ValueError, match=r"delta must have the shape of u \[2, 3, 4\]"):
        selective_scan(u, delta[..., :3], A, B, C)
    with pytest.raises(ValueError, match=r"A must have shape \[D, N\] with D = 3"):
        selective_scan(u, delta, A[:2], B, C)
    with pytest.raises(ValueError, match=r"B must have shape \[B, N, L\] = \[2, 2, 4\]"):
        selective_scan(u, delta, A, B[:, :1], C)
    with pytest.raises(TypeError, match="C must have the dtype of u"):
        selective_scan(u, delta, A, B, C.float())
    with pytest.raises(ValueError, match=r"D must have shape \[D\] = \[3\]"):
        selective_scan(u, delta, A, B, C, Dskip[:2])
    with pytest.raises(ValueError, match=r"z must have the shape of u"):
        selective_scan(u, delta, A, B, C, Dskip, z[:1])
    with pytest.raises(TypeError, match="delta_bias must be a floating-point tensor"):
        selective_scan(u, delta, A, B, C, Dskip, z, bias.long())
    with pytest.raises(TypeError, match="delta_softplus must be a bool"):
        selective_scan(u, delta, A, B, C, delta_softplus=1)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        selective_scan(u, delta, A, B, C, chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        selective_scan_chunked(u, delta, A, B, C, chunk_size=2.0)
    with pytest.raises(ValueError, match="backend must be one of"):
        selective_scan(u, delta, A, B, C, backend="cuda")
