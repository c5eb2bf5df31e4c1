"""Tests of P26 ToMA: tiling, merge/unmerge invariants, the reuse schedule, the ToMeSD baseline, bad inputs,
the quick reproduction and its broken variant (random destinations)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models import (
    ToMAState,
    facility_location_select,
    tile_tokens,
    toma_fns,
    toma_merge_matrices,
    tomesd_fns,
    untile_tokens,
)
from icml25.generative_models.experiments import toma as exp


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    from icml25.kernels import torch_threads

    with torch_threads(1):  # tiny ops: one thread is fastest on the shared 2-core machine
        yield


def _x(B=2, N=64, C=8, seed=0):
    return torch.randn(B, N, C, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------- tiling
@settings(max_examples=30, deadline=None)
@given(t=st.integers(1, 4), th=st.integers(1, 4), tw=st.integers(1, 4), B=st.integers(1, 2))
def test_tiling_then_untiling_is_the_identity(t, th, tw, B):
    H, W = t * th, t * tw
    x = _x(B, H * W, 3, seed=t * 100 + th * 10 + tw)
    tiles, perm = tile_tokens(x, (H, W), t * t)
    assert tiles.shape == (B, t * t, th * tw, 3)
    assert torch.equal(tiles.reshape(B, -1, 3), x[:, perm])
    assert sorted(perm.tolist()) == list(range(H * W))
    assert torch.equal(untile_tokens(tiles, perm), x)
    # the first tile is the top-left th x tw block of the grid
    assert torch.equal(tiles[0, 0], x[0].reshape(H, W, 3)[:th, :tw].reshape(-1, 3))


# ----------------------------------------------------------------------------------- merge / unmerge
def test_ratio_zero_with_sharp_softmax_is_the_identity_and_matrices_are_permutations():
    x = _x(2, 64, 16, seed=1)
    plan = toma_fns(x, ratio=0.0, num_tiles=4, scale=1e4)
    assert plan.n_merged == 64
    torch.testing.assert_close(plan.unmerge(plan.merge(x)), x, atol=1e-5, rtol=0)
    tiles, _ = tile_tokens(x, None, 4)
    M, _ = toma_merge_matrices(tiles.reshape(8, 16, 16), plan.dst_idx, scale=1e4)
    torch.testing.assert_close(M.round(), M, atol=1e-5, rtol=0)
    torch.testing.assert_close(M.sum(1), torch.ones(8, 16), atol=1e-5, rtol=0)


def test_stochastic_rows_and_columns_and_constant_round_trip():
    x = _x(2, 64, 8, seed=2)
    plan = toma_fns(x, ratio=0.5, num_tiles=4)
    A = plan.A
    torch.testing.assert_close(A.sum(1), torch.ones(8, 16), atol=1e-5, rtol=0)  # columns of A
    M, U = toma_merge_matrices(tile_tokens(x, None, 4)[0].reshape(8, 16, 8), plan.dst_idx)
    torch.testing.assert_close(M.sum(2), torch.ones(8, 8), atol=1e-5, rtol=0)
    torch.testing.assert_close(U.sum(2), torch.ones(8, 16), atol=1e-5, rtol=0)
    c = torch.full((2, 64, 5), -2.25)
    torch.testing.assert_close(plan.unmerge(plan.merge(c)), c, atol=1e-5, rtol=0)
    assert plan.merge(c).shape == (2, 32, 5)


def test_merge_is_the_tilewise_weighted_mean_and_selection_is_per_batch_element():
    x = _x(2, 16, 4, seed=3)
    x[1] = x[1].flip(0)  # a different image in the batch: its destinations differ
    plan = toma_fns(x, ratio=0.5, num_tiles=1, scale=3.0)
    ref0 = facility_location_select(x[:1], 8)
    assert torch.equal(plan.dst_idx[:1], ref0)
    assert torch.equal(plan.dst_idx[1:], facility_location_select(x[1:], 8))
    M = plan.A / plan.A.sum(2, keepdim=True)
    torch.testing.assert_close(plan.merge(x), M @ x, atol=1e-6, rtol=0)


def test_destination_count_uses_the_official_floor_per_tile():
    x = _x(1, 36, 4)
    plan = toma_fns(x, ratio=0.5, num_tiles=4)  # tiles of 9 tokens -> floor(4.5) = 4 destinations
    assert plan.dst_idx.shape == (4, 4) and plan.n_merged == 16


def test_log_sizes_sum_to_the_token_count():
    x = _x(2, 64, 8, seed=4)
    plan = toma_fns(x, ratio=0.75, num_tiles=4)
    torch.testing.assert_close(plan.log_sizes().exp().sum(1), torch.full((2,), 64.0), atol=1e-3, rtol=0)


# ------------------------------------------------------------------------------------------- reuse
def test_reuse_state_recomputes_exactly_on_the_scheduled_steps():
    state = ToMAState(recompute_every=3)
    builds = []
    for step in range(10):
        for _ in range(3):  # 3 blocks share key "a"; one block has key "b"
            state.get("a", lambda s=step: builds.append(("a", s)) or s)
        assert state.get("b", lambda s=step: builds.append(("b", s)) or s) == 3 * (step // 3)
        state.advance()
    assert [s for k, s in builds if k == "a"] == [0, 3, 6, 9]
    assert [s for k, s in builds if k == "b"] == [0, 3, 6, 9]
    assert state.recomputes[:2] == [(0, "a"), (0, "b")]
    state.reset()
    assert state.step == 0 and not state.plans
    on = ToMAState(merge_steps={1, 2})
    flags = []
    for _ in range(4):
        flags.append(on.merging())
        on.advance()
    assert flags == [False, True, True, False]


# ------------------------------------------------------------------------------------------ ToMeSD
def test_tomesd_baseline_keeps_n_minus_r_tokens_and_is_exact_on_unmerged_tokens():
    x = _x(2, 64, 8, seed=5)
    merge, unmerge = tomesd_fns(x, ratio=0.5, seed=0)
    y = merge(x)
    assert y.shape == (2, 32, 8)
    back = unmerge(y)
    assert int((back == x).all(dim=2).sum(dim=1).min()) >= 64 - 32 - 16  # 16 sources left unmerged
    merge_r, _ = tomesd_fns(x, ratio=0.75, seed=None)
    assert merge_r(x).shape == (2, 16, 8)


def test_toma_reconstructs_redundant_tokens_better_than_random_destinations():
    X = exp.make_tokens(exp.Setting(n_images=2), seed=0)
    fl = toma_fns(X, ratio=0.75, num_tiles=16)
    rnd = toma_fns(X, ratio=0.75, num_tiles=16, selection="random", seed=1)
    err = [float((p.unmerge(p.merge(X)) - X).norm() / X.norm()) for p in (fl, rnd)]
    assert err[0] < err[1]


# -------------------------------------------------------------------------------------- bad inputs
def test_non_square_tokens_without_hw_are_rejected():
    with pytest.raises(ValueError, match="not a perfect square"):
        toma_fns(_x(1, 12, 4), ratio=0.5, num_tiles=1)
    with pytest.raises(ValueError, match="H \\* W = N"):
        tile_tokens(_x(1, 12, 4), (3, 5), 1)


@pytest.mark.parametrize("num_tiles,match", [(8, "perfect square"), (9, "must divide the grid")])
def test_num_tiles_must_be_a_square_dividing_the_grid(num_tiles, match):
    with pytest.raises(ValueError, match=match):
        toma_fns(_x(1, 64, 4), ratio=0.5, num_tiles=num_tiles)


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, math.nan])
def test_ratio_outside_0_1_is_rejected(ratio):
    with pytest.raises(ValueError, match=r"ratio must be a finite float in \[0\.0, 1\.0\), got"):
        toma_fns(_x(1, 64, 4), ratio=ratio, num_tiles=4)


def test_zero_destinations_per_tile_is_rejected():
    with pytest.raises(ValueError, match="0 destinations"):
        toma_fns(_x(1, 64, 4), ratio=0.9, num_tiles=16)  # tiles of 4 tokens -> floor(0.4) = 0


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf])
def test_non_positive_scale_is_rejected(scale):
    with pytest.raises(ValueError, match=r"scale must be a finite float in \(0\.0, inf\), got"):
        toma_fns(_x(1, 64, 4), ratio=0.5, num_tiles=4, scale=scale)


@pytest.mark.parametrize("fns", [toma_fns, tomesd_fns])
def test_non_finite_tokens_are_rejected_with_their_counts(fns):
    x = _x(1, 64, 4)
    x[0, 3, 1], x[0, 9, 0] = math.nan, -math.inf
    with pytest.raises(ValueError, match=r"x must be finite \(no NaN or inf\), got 1 NaN and 1 inf values"):
        fns(x, ratio=0.5, **({"num_tiles": 4} if fns is toma_fns else {}))


def test_plan_rejects_tokens_of_another_shape():
    plan = toma_fns(_x(2, 64, 4), ratio=0.5, num_tiles=4)
    with pytest.raises(ValueError, match="x must have shape"):
        plan.merge(_x(2, 16, 4))
    with pytest.raises(ValueError, match="y must have shape"):
        plan.unmerge(_x(2, 64, 4))


# ----------------------------------------------------------------------------------- reproduction
def test_quick_reproduction_passes():
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.summary() if hasattr(report, "summary") else report
    assert report.metrics["toma_forbidden_ops"] == 0 and report.metrics["tomesd_forbidden_ops"] > 0
    assert report.metrics["attn_flops_ratio_r0.5"] == 0.25


def test_broken_variant_random_destinations_fails_the_quick_gate():
    with torch.no_grad():
        report = exp.evaluate(exp.QUICK, seed=0, selection="random")
    assert report.passed is False
    assert report.failed_checks[:2] == [c.name for c in exp.checks(exp.QUICK)[:2]]


def test_full_threshold_has_the_attention_parity_checks():
    text = exp.threshold(quick=False)
    assert "ToMeSD at r=0.5" in text and "ToMeSD at r=0.75" in text
    assert "ToMeSD at r=0.5" not in exp.threshold(quick=True)


def test_numpy_scalars_pass_the_shared_checks_and_merge_as_python_floats():
    """ratio and scale go through icml25.kernels.checks.check_float: a NumPy float is the same value."""
    x = _x(1, 64, 4)
    a = toma_fns(x, ratio=0.5, num_tiles=4, scale=0.1).A
    b = toma_fns(x, ratio=np.float64(0.5), num_tiles=4, scale=np.float64(0.1)).A
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(TypeError, match="ratio must be a finite float in"):
        toma_fns(x, ratio="0.5", num_tiles=4)
