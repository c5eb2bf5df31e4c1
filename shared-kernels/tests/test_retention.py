"""Tests of the chunkwise-retention op family (P45 Sable): parallel, recurrent and chunkwise forms agree,
state carried across calls, resets, gradients, Triton vs reference (TRITON_INTERPRET=1 on CPU), bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels import triton_available
from icml25.kernels.retention import (
    MAX_TRITON_CHUNK_TOKENS,
    default_chunk_size,
    default_kappas,
    retention,
    retention_chunkwise_reference,
    retention_parallel,
    retention_parallel_reference,
    retention_recurrent_reference,
    retention_step,
)

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton not installed")
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F64 = {"rtol": 0.0, "atol": 1e-10}


def _inputs(B=2, H=2, T=5, A=3, Dk=4, Dv=3, seed=0, dtype=torch.float64, p_done=0.3, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    N = T * A
    q = torch.randn(B, H, N, Dk, generator=g, dtype=dtype)
    k = torch.randn(B, H, N, Dk, generator=g, dtype=dtype)
    v = torch.randn(B, H, N, Dv, generator=g, dtype=dtype)
    s0 = torch.randn(B, H, Dk, Dv, generator=g, dtype=dtype)
    dones = torch.rand(B, T, generator=g) < p_done
    kappa = torch.rand(H, generator=g, dtype=torch.float64) * 0.9 + 0.05
    return [x.to(device) for x in (q, k, v, s0)] + [dones.to(device), kappa.to(device)]


def _brute_force(q, k, v, kappa, A, dones, causal, state):
    """Token-by-token double loop of the definition (D[n, m] from the episode of each timestep)."""
    B, H, N, _ = q.shape
    T = N // A
    qk = (q @ k.transpose(-1, -2)).tolist()  # q_n · k_m
    qs = (q @ state).tolist()  # q_n S_in
    vl = v.tolist()
    out = [[[[0.0] * v.shape[-1] for _ in range(N)] for _ in range(H)] for _ in range(B)]
    for b in range(B):
        ep = [int(dones[b, : t + 1].sum()) for t in range(T)]
        for h in range(H):
            kap = float(kappa[h])
            for n in range(N):
                tn, row = n // A, out[b][h][n]
                for m in range(N):
                    tm = m // A
                    if tm > tn or ep[tm] != ep[tn] or (causal and m > n):
                        continue
                    w = kap ** (tn - tm) * qk[b][h][n][m]
                    for j, x in enumerate(vl[b][h][m]):
                        row[j] += w * x
                if ep[tn] == 0:
                    for j, x in enumerate(qs[b][h][n]):
                        row[j] += kap ** (tn + 1) * x
    return torch.tensor(out, dtype=q.dtype)


# ------------------------------------------------------------------------------- the three forms agree
@pytest.mark.parametrize("causal", [False, True])
def test_parallel_equals_brute_force_definition(causal):
    q, k, v, s0, dones, kappa = _inputs(B=2, H=2, T=4, A=2, seed=1)
    out, _ = retention_parallel(q, k, v, kappa, n_agents=2, dones=dones, causal_agents=causal, state=s0)
    torch.testing.assert_close(out, _brute_force(q, k, v, kappa, 2, dones, causal, s0), **F64)


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    H=st.integers(1, 3),
    T=st.integers(1, 9),
    A=st.integers(1, 4),
    chunk=st.integers(1, 10),
    causal=st.booleans(),
    p_done=st.sampled_from([0.0, 0.3, 1.0]),
    with_state=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_property_parallel_recurrent_chunkwise_agree(B, H, T, A, chunk, causal, p_done, with_state, seed):
    q, k, v, s0, dones, kappa = _inputs(B, H, T, A, 3, 2, seed=seed, p_done=p_done)
    s0 = s0 if with_state else None
    kw = {"n_agents": A, "dones": dones, "causal_agents": causal, "state": s0}
    op, sp = retention_parallel_reference(q, k, v, kappa, **kw)
    orc, src = retention_recurrent_reference(q, k, v, kappa, **kw)
    och, sch = retention(q, k, v, kappa, chunk_size=chunk, **kw)  # chunk may not divide T
    for o, s in ((orc, src), (och, sch)):
        torch.testing.assert_close(o, op, **F64)
        torch.testing.assert_close(s, sp, **F64)


@pytest.mark.parametrize("chunk", [1, 2, 4, 8])
def test_chunk_sizes_one_two_four_and_full_episode(chunk):
    q, k, v, s0, dones, kappa = _inputs(B=2, H=2, T=8, A=3, seed=4)
    for causal in (False, True):
        kw = {"n_agents": 3, "dones": dones, "causal_agents": causal, "state": s0}
        ref = retention_parallel(q, k, v, kappa, **kw)
        got = retention(q, k, v, kappa, chunk_size=chunk, **kw)
        torch.testing.assert_close(got[0], ref[0], **F64)
        torch.testing.assert_close(got[1], ref[1], **F64)


def test_plain_retnet_is_the_one_agent_case():
    # n_agents = 1: D[n, m] = κ^(n - m) for m <= n, the RetNet decay matrix.
    q, k, v, _, _, kappa = _inputs(B=1, H=2, T=6, A=1, seed=2)
    n = torch.arange(6)
    D = kappa[:, None, None] ** (n[:, None] - n[None, :]).clamp(min=0) * (n[:, None] >= n[None, :])
    expected = ((q @ k.transpose(-1, -2)) * D) @ v
    out, state = retention(q, k, v, kappa, chunk_size=4)
    torch.testing.assert_close(out, expected, **F64)
    zeta = kappa[:, None] ** (5 - n)
    torch.testing.assert_close(state, k.transpose(-1, -2) @ (v * zeta[..., None]), **F64)


def test_state_carried_across_calls_equals_one_long_call():
    q, k, v, s0, dones, kappa = _inputs(B=2, H=2, T=9, A=2, seed=5)
    kw = {"n_agents": 2, "causal_agents": True}
    full, s_full = retention(q, k, v, kappa, dones=dones, state=s0, chunk_size=2, **kw)
    state, outs = s0, []
    for t0, t1 in ((0, 4), (4, 5), (5, 9)):  # uneven segments, different chunk sizes per call
        sl = slice(2 * t0, 2 * t1)
        o, state = retention(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], kappa, dones=dones[:, t0:t1], state=state,
            chunk_size=t1 - t0 if t1 - t0 < 4 else 3, **kw,
        )  # fmt: skip
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=2), full, **F64)
    torch.testing.assert_close(state, s_full, **F64)


def test_retention_step_over_timesteps_equals_sequence_op():
    q, k, v, s0, dones, kappa = _inputs(B=2, H=2, T=6, A=3, seed=6)
    for causal in (False, True):
        seq, s_seq = retention(q, k, v, kappa, n_agents=3, dones=dones, causal_agents=causal, state=s0)
        state, outs = s0, []
        for t in range(6):
            sl = slice(3 * t, 3 * t + 3)
            o, state = retention_step(
                q[:, :, sl], k[:, :, sl], v[:, :, sl], kappa, state, done=dones[:, t], causal_agents=causal
            )
            outs.append(o)
        torch.testing.assert_close(torch.cat(outs, dim=2), seq, **F64)
        torch.testing.assert_close(state, s_seq, **F64)


# ----------------------------------------------------------------------------------------- semantics
def test_reset_cuts_all_influence_of_earlier_tokens():
    q, k, v, s0, _, kappa = _inputs(B=1, H=2, T=8, A=3, seed=7)
    dones = torch.zeros(1, 8, dtype=torch.bool)
    dones[0, 5] = True
    base, s_base = retention(q, k, v, kappa, n_agents=3, dones=dones, state=s0, chunk_size=3)
    v2, k2 = v.clone(), k.clone()
    v2[:, :, : 5 * 3] += 10 * torch.randn_like(v2[:, :, :15])
    k2[:, :, : 5 * 3] -= 3.0
    pert, s_pert = retention(q, k2, v2, kappa, n_agents=3, dones=dones, state=s0 * 7, chunk_size=3)
    torch.testing.assert_close(pert[:, :, 15:], base[:, :, 15:], **F64)  # post-reset outputs unchanged
    torch.testing.assert_close(s_pert, s_base, **F64)
    assert not torch.allclose(pert[:, :, :15], base[:, :, :15])


def test_tiny_kappa_sees_only_the_current_timestep():
    q, k, v, s0, _, _ = _inputs(B=1, H=1, T=5, A=2, seed=8)
    out, _ = retention(q, k, v, 1e-30, n_agents=2, state=s0, chunk_size=2)
    for t in range(5):
        sl = slice(2 * t, 2 * t + 2)
        expected = (q[:, :, sl] @ k[:, :, sl].transpose(-1, -2)) @ v[:, :, sl]
        torch.testing.assert_close(out[:, :, sl], expected, **F64)


def test_dones_per_token_equal_dones_per_timestep_and_zero_one_numbers():
    q, k, v, s0, dones, kappa = _inputs(B=2, H=1, T=5, A=3, seed=9)
    a = retention(q, k, v, kappa, n_agents=3, dones=dones, state=s0)
    b = retention(q, k, v, kappa, n_agents=3, dones=dones.repeat_interleave(3, dim=1), state=s0)
    c = retention(q, k, v, kappa, n_agents=3, dones=dones.float(), state=s0)
    for x in (b, c):
        torch.testing.assert_close(x[0], a[0], **F64)


def test_kappa_forms_and_default_kappas_match_mava():
    kap = default_kappas(4)
    expected = 1 - torch.exp(torch.linspace(math.log(1 / 32), math.log(1 / 512), 4, dtype=torch.float64))
    torch.testing.assert_close(kap, expected, rtol=0, atol=1e-15)
    assert default_kappas(1).item() == pytest.approx(1 - 1 / 32)
    assert default_kappas(1, 0.8).item() == pytest.approx(0.8 * (1 - 1 / 32))  # rec_retention.yaml: ≈0.775
    q, k, v, _, _, _ = _inputs(B=1, H=2, T=3, A=1, seed=10)
    a = retention(q, k, v, 0.7)
    for form in ([0.7, 0.7], torch.tensor(0.7), torch.tensor([0.7, 0.7], dtype=torch.float32)):
        torch.testing.assert_close(retention(q, k, v, form)[0], a[0], rtol=1e-6, atol=1e-6)
    assert default_chunk_size(1) == 64 and default_chunk_size(3) == 21 and default_chunk_size(100) == 1


# ---------------------------------------------------------------------------------------- gradients
def test_chunkwise_gradients_equal_the_parallel_form():
    q, k, v, s0, dones, kappa = _inputs(B=2, H=2, T=7, A=2, seed=11)
    for causal in (False, True):
        leaves_a = [x.clone().requires_grad_() for x in (q, k, v, s0)]
        leaves_b = [x.clone().requires_grad_() for x in (q, k, v, s0)]
        kw = {"n_agents": 2, "dones": dones, "causal_agents": causal}
        oa, sa = retention(*leaves_a[:3], kappa, state=leaves_a[3], chunk_size=3, **kw)
        ob, sb = retention_parallel(*leaves_b[:3], kappa, state=leaves_b[3], **kw)
        g1, g2 = torch.randn_like(oa), torch.randn_like(sa)
        ga = torch.autograd.grad((oa, sa), leaves_a, (g1, g2))
        gb = torch.autograd.grad((ob, sb), leaves_b, (g1, g2))
        for x, y in zip(ga, gb):
            torch.testing.assert_close(x, y, **F64)


def test_gradcheck_float64_tiny():
    q, k, v, s0, dones, kappa = _inputs(B=1, H=1, T=3, A=2, Dk=2, Dv=2, seed=12, p_done=0.4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, s0)]

    def fn(q, k, v, s):
        return retention(q, k, v, kappa, n_agents=2, dones=dones, causal_agents=True, state=s, chunk_size=2)

    assert torch.autograd.gradcheck(fn, leaves)


# ------------------------------------------------------------------------------------- Triton vs reference
@needs_triton
@pytest.mark.parametrize(
    ("B", "H", "T", "A", "Dk", "Dv", "chunk", "causal"),
    [(2, 2, 7, 3, 4, 5, 2, False), (1, 2, 9, 1, 16, 20, 4, True), (1, 1, 5, 2, 3, 40, 3, True)],
)
def test_triton_forward_and_backward_match_reference(B, H, T, A, Dk, Dv, chunk, causal):
    q, k, v, s0, dones, kappa = _inputs(
        B, H, T, A, Dk, Dv, seed=13, dtype=torch.float32, device=TRITON_DEVICE
    )
    kw = {"n_agents": A, "dones": dones, "causal_agents": causal, "chunk_size": chunk}
    la = [x.clone().requires_grad_() for x in (q, k, v, s0)]
    lb = [x.clone().requires_grad_() for x in (q, k, v, s0)]
    oa, sa = retention(*la[:3], kappa, state=la[3], backend="triton", **kw)
    ob, sb = retention(*lb[:3], kappa, state=lb[3], backend="reference", **kw)
    torch.testing.assert_close(oa, ob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sa, sb, rtol=1e-5, atol=1e-5)
    g1, g2 = torch.randn_like(oa), torch.randn_like(sa)
    ga = torch.autograd.grad((oa, sa), la, (g1, g2))
    gb = torch.autograd.grad((ob, sb), lb, (g1, g2))
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


@needs_triton
@settings(max_examples=8, deadline=None)
@given(
    T=st.integers(1, 7),
    A=st.integers(1, 3),
    chunk=st.integers(1, 5),
    causal=st.booleans(),
    p_done=st.sampled_from([0.0, 0.4]),
    seed=st.integers(0, 10_000),
)
def test_property_triton_forward_matches_reference(T, A, chunk, causal, p_done, seed):
    q, k, v, s0, dones, kappa = _inputs(
        1, 2, T, A, 3, 5, seed=seed, dtype=torch.float32, p_done=p_done, device=TRITON_DEVICE
    )
    kw = {"n_agents": A, "dones": dones, "causal_agents": causal, "chunk_size": chunk, "state": s0}
    out, state = retention(q, k, v, kappa, backend="triton", **kw)
    ref, rstate = retention(q, k, v, kappa, backend="reference", **kw)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, rstate, rtol=1e-5, atol=1e-5)


def test_auto_dispatch_uses_the_reference_for_cpu_tensors(monkeypatch):
    q, k, v, s0, _, kappa = _inputs(B=1, H=1, T=3, A=1, dtype=torch.float64)
    out = retention(q, k, v, kappa, state=s0)  # float64 CPU: auto must not pick Triton
    monkeypatch.setenv("ICML25_KERNELS_BACKEND", "reference")
    torch.testing.assert_close(retention(q, k, v, kappa, state=s0)[0], out[0], rtol=0, atol=0)


@needs_triton
def test_triton_without_state_or_dones_and_half_precision():
    q, k, v, _, _, kappa = _inputs(1, 2, 6, 2, 8, 8, seed=14, dtype=torch.float32, device=TRITON_DEVICE)
    out, state = retention(q, k, v, kappa, n_agents=2, backend="triton")  # default chunk: 32 timesteps
    ref, rstate = retention_parallel(q.double(), k.double(), v.double(), kappa, n_agents=2)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.double(), rstate, rtol=1e-5, atol=1e-5)
    oh, _ = retention(q.half(), k.half(), v.half(), kappa, n_agents=2, backend="triton", chunk_size=2)
    assert oh.dtype == torch.float16
    torch.testing.assert_close(oh.double(), ref, rtol=2e-2, atol=2e-2)


@needs_triton
def test_triton_limits_raise_clear_errors():
    q, k, v, _, _, kappa = _inputs(1, 1, 4, 2, 4, 4, seed=15, dtype=torch.float32, device=TRITON_DEVICE)
    with pytest.raises(ValueError, match=r"chunk_size · n_agents = 33 · 2 = 66 tokens"):
        retention(q, k, v, kappa, n_agents=2, chunk_size=33, backend="triton")
    assert MAX_TRITON_CHUNK_TOKENS == 64
    wide = torch.zeros(1, 1, 4, 65, device=TRITON_DEVICE)
    with pytest.raises(ValueError, match="head dims"):
        retention(wide, wide, wide, kappa, n_agents=2, backend="triton")
    with pytest.raises(TypeError, match="q must be float32, float16 or bfloat16 on the Triton path"):
        retention(q.double(), k.double(), v.double(), kappa, n_agents=2, backend="triton")


# ------------------------------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_clear_errors():
    q, k, v, s0, dones, kappa = _inputs(B=2, H=2, T=4, A=3)
    with pytest.raises(ValueError, match=r"N = 12 \(q.shape\[2\]\) must be divisible by n_agents = 5"):
        retention(q, k, v, kappa, n_agents=5)
    with pytest.raises(ValueError, match="kappa must lie in"):
        retention(q, k, v, 1.5)
    with pytest.raises(ValueError, match="kappa must lie in"):
        retention(q, k, v, torch.tensor([0.5, 0.0]))
    with pytest.raises(ValueError, match=r"kappa must have shape \[H\] = \[2\]"):
        retention(q, k, v, torch.tensor([0.5, 0.5, 0.5]))
    bad = dones.repeat_interleave(3, dim=1)
    bad[0, 1] = ~bad[0, 1]
    with pytest.raises(ValueError, match="dones must be equal across the 3 agents"):
        retention(q, k, v, kappa, n_agents=3, dones=bad)
    with pytest.raises(ValueError, match=r"dones must have shape \[B, T\] = \[2, 4\]"):
        retention(q, k, v, kappa, n_agents=3, dones=dones[:, :3])
    with pytest.raises(ValueError, match="dones must hold only 0/1"):
        retention(q, k, v, kappa, n_agents=3, dones=dones.float() * 2)
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1, got 0"):
        retention(q, k, v, kappa, n_agents=3, chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        retention(q, k, v, kappa, n_agents=3, chunk_size=2.0)
    with pytest.raises(ValueError, match=r"state must have shape \[B, H, Dk, Dv\]"):
        retention(q, k, v, kappa, state=s0[:, :, :2])
    with pytest.raises(TypeError, match="state must have the dtype of q"):
        retention(q, k, v, kappa, state=s0.float())
    with pytest.raises(ValueError, match="k must have the shape of q"):
        retention(q, k[..., :2], v, kappa)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        retention(q, k.float(), v, kappa)
    with pytest.raises(TypeError, match="causal_agents must be a bool"):
        retention(q, k, v, kappa, causal_agents=1)
    with pytest.raises(ValueError, match="backend must be one of"):
        retention(q, k, v, kappa, backend="cuda")
    with pytest.raises(ValueError, match=r"done must have shape \[B\] = \[2\]"):
        retention_step(q[:, :, :3], k[:, :, :3], v[:, :, :3], kappa, s0, done=dones)
    with pytest.raises(ValueError, match="decay_scaling_factor must lie in"):
        default_kappas(2, 1.5)
    with pytest.raises(ValueError, match="n_head must be an int >= 1, got 0"):
        default_kappas(0)


def test_empty_sequence_returns_the_incoming_state():
    q, k, v, s0, _, kappa = _inputs(B=1, H=2, T=3, A=1)
    out, state = retention(q[:, :, :0], k[:, :, :0], v[:, :, :0], kappa, state=s0)
    assert out.shape == (1, 2, 0, 3)
    torch.testing.assert_close(state, s0, rtol=0, atol=0)
    out, state = retention_chunkwise_reference(q[:, :, :0], k[:, :, :0], v[:, :, :0], kappa)
    assert torch.all(state == 0)
