"""Tests of the token-merge op family (P26 ToMA): greedy facility location vs brute force and a slow loop,
soft-merge invariants, the ToMeSD baseline, Triton vs reference (TRITON_INTERPRET=1 on CPU), bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels import triton_available
from icml25.kernels.token_merge import (
    bipartite_soft_matching_2d,
    facility_location_bruteforce,
    facility_location_greedy,
    facility_location_objective,
    soft_merge_matrices,
    soft_unmerge,
    tile_soft_merge,
)

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _x(G=3, n=10, C=6, seed=0, dtype=torch.float32):
    return torch.randn(G, n, C, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _slow_greedy(x: torch.Tensor, k: int) -> list[list[int]]:
    """Python loops of the definition, in float64 (the oracle of the batched reference)."""
    out = []
    for g in range(x.shape[0]):
        xn = x[g].double() / x[g].double().norm(dim=1, keepdim=True)
        sim = (xn @ xn.T).tolist()
        n = len(sim)
        S: list[int] = []
        for _ in range(k):
            best, best_v = -math.inf, -1
            for v in range(n):
                if v in S:
                    continue
                val = sum(max([sim[i][j] for j in S] + [sim[i][v]]) for i in range(n))
                if val > best + 1e-12:
                    best, best_v = val, v
            S.append(best_v)
        out.append(S)
    return out


# ------------------------------------------------------------------------------- facility location
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 10), k=st.integers(1, 3), C=st.integers(2, 6))
def test_greedy_equals_the_slow_definition_and_is_within_1_minus_1_over_e(seed, n, k, C):
    k = min(k, n)
    x = _x(2, n, C, seed)
    idx = facility_location_greedy(x, k, backend="reference")
    slow = torch.tensor(_slow_greedy(x, k))
    for j in range(1, k + 1):  # same objective after every step (float32 vs float64 may swap exact ties)
        f_fast = facility_location_objective(x, idx[:, :j])
        torch.testing.assert_close(f_fast, facility_location_objective(x, slow[:, :j]), atol=1e-5, rtol=0)
    # F + n is the non-negative monotone submodular function of the (1 - 1/e) guarantee (sim >= -1)
    opt, _ = facility_location_bruteforce(x, k)
    got = facility_location_objective(x, idx).double()
    assert bool((got <= opt + 1e-5).all())
    assert bool((got + n >= (1 - 1 / math.e) * (opt + n) - 1e-5).all())


def test_objective_is_nondecreasing_along_the_greedy_path_and_first_pick_is_the_best_singleton():
    x = _x(4, 12, 5, seed=3)
    idx = facility_location_greedy(x, 6, backend="reference")
    vals = torch.stack([facility_location_objective(x, idx[:, : j + 1]) for j in range(6)], dim=1)
    assert bool((vals[:, 1:] >= vals[:, :-1] - 1e-6).all())
    best_single, _ = facility_location_bruteforce(x, 1)
    torch.testing.assert_close(vals[:, 0].double(), best_single, atol=1e-5, rtol=0)
    assert all(len(set(row)) == 6 for row in idx.tolist())  # distinct picks


def test_duplicate_tokens_are_not_picked_twice_and_zero_tokens_are_finite():
    x = torch.zeros(1, 6, 4)
    x[0, :3] = torch.tensor([1.0, 0, 0, 0])
    idx = facility_location_greedy(x, 4, backend="reference")
    assert len(set(idx[0].tolist())) == 4
    merged, A = tile_soft_merge(x, idx, backend="reference")
    assert bool(torch.isfinite(merged).all()) and bool(torch.isfinite(A).all())


def test_selection_is_scale_invariant_and_survives_huge_tokens():
    x = _x(2, 9, 4, seed=5)
    scales = torch.tensor([1e-20, 1.0, 1e30]).repeat(3)[:9].reshape(1, 9, 1)
    ref = facility_location_greedy(x, 3, backend="reference")
    got = facility_location_greedy(x * scales, 3, backend="reference")
    assert torch.equal(got[:, :2], ref[:, :2])  # float rounding of the rescaling may swap a near-tie later
    f_ref, f_got = facility_location_objective(x, ref), facility_location_objective(x, got)
    torch.testing.assert_close(f_got, f_ref, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------- soft merge
def test_merge_matrices_are_stochastic_and_a_constant_round_trips():
    x = _x(3, 16, 8, seed=1)
    idx = facility_location_greedy(x, 5, backend="reference")
    M, U = soft_merge_matrices(x, idx, scale=5.0, backend="reference")
    ones = torch.ones(3, 16)
    torch.testing.assert_close(M.sum(2), ones[:, :5], atol=1e-6, rtol=0)  # rows of M
    torch.testing.assert_close(U.sum(2), ones, atol=1e-6, rtol=0)  # rows of U (columns of A)
    c = torch.full((3, 16, 2), 3.5)
    merged, A = tile_soft_merge(x, idx, c, scale=5.0, backend="reference")
    torch.testing.assert_close(soft_unmerge(merged, A), c, atol=1e-5, rtol=0)


def test_keeping_every_token_with_a_sharp_softmax_is_the_identity():
    x = _x(2, 12, 16, seed=2)
    idx = facility_location_greedy(x, 12, backend="reference")
    M, _ = soft_merge_matrices(x, idx, scale=1e4, backend="reference")
    perm = torch.zeros(2, 12, 12).scatter_(2, idx[:, :, None], 1.0)
    torch.testing.assert_close(M, perm, atol=1e-5, rtol=0)
    merged, A = tile_soft_merge(x, idx, scale=1e4, backend="reference")
    torch.testing.assert_close(soft_unmerge(merged, A), x, atol=1e-5, rtol=0)


def test_merged_values_are_the_weighted_means_of_the_definition():
    x, v = _x(2, 7, 3, seed=4), _x(2, 7, 5, seed=9)
    idx = torch.tensor([[0, 3], [6, 1]])
    merged, A = tile_soft_merge(x, idx, v, scale=2.0, backend="reference")
    xn = x / x.norm(dim=2, keepdim=True)
    for g in range(2):
        logits = 2.0 * xn[g, idx[g]] @ xn[g].T
        a = torch.softmax(logits, dim=0)
        torch.testing.assert_close(A[g], a, atol=1e-6, rtol=0)
        torch.testing.assert_close(merged[g], (a / a.sum(1, keepdim=True)) @ v[g], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------- ToMeSD baseline
def test_bipartite_baseline_merges_r_tokens_and_unmerge_copies_destinations():
    x = _x(2, 16, 4, seed=6)
    merge, unmerge = bipartite_soft_matching_2d(x, 4, 4, 6, no_rand=True)
    y = merge(x)
    assert y.shape == (2, 10, 4)
    back = unmerge(y)
    dst = torch.tensor([0, 2, 8, 10])  # top-left of each 2 x 2 cell
    assert float(torch.cdist(back[:, dst], y[:, -4:]).amin(dim=2).max()) == 0.0  # destinations copied
    sizes = merge(torch.ones(2, 16, 1), mode="sum")
    assert sizes.sum().item() == pytest.approx(32.0)
    exact = (back == x).all(dim=2).sum(dim=1)
    assert min(exact.tolist()) >= 6  # the 6 unmerged sources (and unmatched destinations) come back exactly


def test_bipartite_baseline_matches_the_tomesd_package():
    tomesd_merge = pytest.importorskip("tomesd.merge")
    x = _x(2, 64, 8, seed=7)
    for no_rand in (True, False):
        g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        m1, u1 = bipartite_soft_matching_2d(x, 8, 8, 20, no_rand=no_rand, generator=g1)
        m2, u2 = tomesd_merge.bipartite_soft_matching_random2d(
            x, 8, 8, 2, 2, 20, no_rand=no_rand, generator=g2
        )
        assert torch.equal(m1(x), m2(x))
        assert torch.equal(u1(m1(x)), u2(m2(x)))


# ---------------------------------------------------------------------------------- Triton vs reference
@needs_triton
@pytest.mark.parametrize("n,C,k", [(20, 24, 5), (37, 70, 9)])
def test_triton_facility_location_matches_reference(n, C, k):
    x = _x(3, n, C, seed=n).to(DEV)
    ref = facility_location_greedy(x, k, backend="reference")
    tri = facility_location_greedy(x, k, backend="triton")
    f_ref, f_tri = facility_location_objective(x, ref), facility_location_objective(x, tri)
    torch.testing.assert_close(f_tri, f_ref, atol=1e-4, rtol=0)  # near-ties may swap a pick
    assert (ref == tri).all(dim=1).float().mean().item() >= 0.6
    assert torch.equal(tri[:, 0], ref[:, 0])


@needs_triton
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float16, 1e-3), (torch.bfloat16, 1e-2)])
def test_triton_soft_merge_matches_reference(dtype, atol):
    x = _x(2, 19, 40, seed=11).to(DEV, dtype)
    v = _x(2, 19, 33, seed=12).to(DEV, dtype)
    idx = facility_location_greedy(x, 6, backend="reference")
    for scale in (10.0, 1000.0):
        m_ref, a_ref = tile_soft_merge(x, idx, v, scale=scale, backend="reference")
        m_tri, a_tri = tile_soft_merge(x, idx, v, scale=scale, backend="triton")
        tol = atol * (10 if scale > 100 and dtype == torch.float32 else 1)
        torch.testing.assert_close(a_tri, a_ref, atol=tol, rtol=0)
        torch.testing.assert_close(m_tri.float(), m_ref.float(), atol=tol * 4, rtol=1e-2)
        assert m_tri.dtype == dtype


# --------------------------------------------------------------------------------------- bad inputs
def test_bad_inputs_are_rejected_with_named_arguments():
    x = _x(2, 8, 4)
    with pytest.raises(ValueError, match="k = 9 exceeds"):
        facility_location_greedy(x, 9)
    with pytest.raises(ValueError, match="x must be finite"):
        facility_location_greedy(x.clone().index_fill_(1, torch.tensor([0]), float("nan")), 2)
    with pytest.raises(ValueError, match=r"scale must be a finite float in \(0\.0, inf\), got"):
        tile_soft_merge(x, torch.zeros(2, 1, dtype=torch.long), scale=0.0)
    with pytest.raises(ValueError, match=r"dst_idx must hold token indices in \[0, n\)"):
        tile_soft_merge(x, torch.full((2, 2), 8))
    with pytest.raises(TypeError, match="dst_idx must be an integer tensor"):
        tile_soft_merge(x, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="metric must have N = h"):
        bipartite_soft_matching_2d(x, 3, 3, 2)
    with pytest.raises(ValueError, match="y must have the leading dims"):
        soft_unmerge(torch.ones(2, 3, 1), torch.ones(2, 2, 8))
