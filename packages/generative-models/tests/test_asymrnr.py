"""Tests of P21 AsymRnR: the spatiotemporal split, matching, reduce/restore exactness, asymmetric attention
(ratio 0 = plain attention, exact Q reduction on duplicated queries), the schedule and its conflict rule,
calibration tiers, the matching cache, bad inputs, the quick reproduction and its broken variant."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models import (
    MatchCache,
    RedundancyRecorder,
    RnRSchedule,
    asymrnr_attention,
    calibrate_redundancy,
    match_tokens,
    reduce_tokens,
    reduced_length,
    restore_tokens,
    rnr_apply,
    spatiotemporal_split,
    tiers_from_statistic,
)
from icml25.generative_models.experiments import asymrnr as exp


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    from icml25.kernels import torch_threads

    with torch_threads(1):
        yield


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------ split
@settings(max_examples=40, deadline=None)
@given(
    grid=st.tuples(st.integers(1, 6), st.integers(1, 7), st.integers(1, 7)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
    seed=st.integers(0, 1000),
)
def test_split_is_a_permutation_with_one_destination_per_chunk(grid, stride, seed):
    stride = tuple(min(s, g) for s, g in zip(stride, grid))
    split = spatiotemporal_split(grid, stride, generator=_gen(seed))
    n = math.prod(grid)
    assert sorted(torch.cat([split.dst_idx, split.src_idx]).tolist()) == list(range(n))
    # each axis is cut into ceil(side / stride) chunks, one more when a random offset splits the padding
    lo = math.prod(math.ceil(g / s) for g, s in zip(grid, stride))
    hi = math.prod(math.ceil(g / s) + (g % s != 0) for g, s in zip(grid, stride))
    assert lo <= split.n_dst <= hi


def test_divisible_grid_has_exactly_one_destination_in_each_stride_cube():
    split = spatiotemporal_split((4, 6, 6), (2, 2, 2), generator=_gen(1))
    f, h, w = np.unravel_index(split.dst_idx.numpy(), (4, 6, 6))
    cells = sorted(zip(f // 2, h // 2, w // 2))
    assert cells == sorted({(a, b, c) for a in range(2) for b in range(3) for c in range(3)})
    other = spatiotemporal_split((4, 6, 6), (2, 2, 2), generator=_gen(2))
    assert not torch.equal(split.dst_idx, other.dst_idx)  # random destinations


def test_padded_grid_gives_every_chunk_one_destination():
    for seed in range(5):  # random offsets
        split = spatiotemporal_split((5, 3, 7), (2, 2, 3), generator=_gen(seed))
        assert split.n_dst in {3 * 2 * 3, 3 * 2 * 4}  # 5/2 -> 3 chunks, 3/2 -> 2, 7/3 -> 3 or 4 (offset)


# ------------------------------------------------------------------------------------------------ match
def test_match_equals_brute_force_and_orders_least_similar_first():
    x = torch.randn(2, 3, 72, 5, generator=_gen(3))
    split = spatiotemporal_split((2, 6, 6), (2, 2, 2), generator=_gen(4))
    m = match_tokens(x, split)
    src, dst = x[..., split.src_idx, :], x[..., split.dst_idx, :]
    d = torch.cdist(src.double(), dst.double()) ** 2
    torch.testing.assert_close(m.similarity.double(), -d.amin(-1), atol=1e-4, rtol=1e-5)
    assert (m.nearest_dst == d.argmin(-1)).float().mean() > 0.99
    s_sorted = m.similarity.gather(-1, m.order)
    assert bool((s_sorted[..., 1:] >= s_sorted[..., :-1]).all())


# ---------------------------------------------------------------------------------- reduce / restore
@settings(max_examples=30, deadline=None)
@given(ratio=st.floats(0.0, 0.99), seed=st.integers(0, 1000), mode=st.sampled_from(["replace", "mean"]))
def test_reduced_length_and_restore_exactness(ratio, seed, mode):
    grid = (2, 4, 6)
    x = torch.randn(2, 48, 3, generator=_gen(seed))
    split = spatiotemporal_split(grid, (2, 2, 2), generator=_gen(seed + 1))
    m = match_tokens(x, split)
    xr, info = reduce_tokens(x, split, m, ratio, mode)
    target = math.floor(48 * (1 - ratio))
    assert xr.shape[-2] == reduced_length(48, split.n_dst, ratio) == max(target, split.n_dst)
    y = restore_tokens(xr, info)
    if mode == "replace":
        kept = info.kept_pos
        assert torch.equal(
            y.gather(1, kept[..., None].expand(-1, -1, 3)), x.gather(1, kept[..., None].expand(-1, -1, 3))
        )
        assert torch.equal(y[:, split.dst_idx], x[:, split.dst_idx])
    # each reduced source holds its matched destination's (restored) value
    dpos = split.dst_idx[info.reduced_dst]
    got = y.gather(1, info.reduced_pos[..., None].expand(-1, -1, 3))
    assert torch.equal(got, y.gather(1, dpos[..., None].expand(-1, -1, 3)))
    if mode == "mean" and info.reduced_pos.shape[-1]:  # the destination holds the mean of its group
        b, j = 0, int(info.reduced_dst[0, 0])
        members = [int(split.dst_idx[j]), *info.reduced_pos[0][info.reduced_dst[0] == j].tolist()]
        torch.testing.assert_close(y[b, split.dst_idx[j]], x[b, members].mean(0))


def test_ratio_zero_is_the_identity_and_rnr_apply_of_identity_copies_destinations():
    x = torch.randn(1, 72, 4, generator=_gen(5))
    split = spatiotemporal_split((2, 6, 6), (2, 2, 2), generator=_gen(6))
    m = match_tokens(x, split)
    assert torch.equal(rnr_apply(x, lambda t: t, split, m, 0.0), x)


# ---------------------------------------------------------------------------------------- attention
def _qkv(text=5, n=72, seed=7):
    return [torch.randn(2, 3, text + n, 8, generator=_gen(seed + i)) for i in range(3)]


def test_zero_ratios_equal_plain_attention_bit_for_bit():
    q, k, v = _qkv()
    out = asymrnr_attention(q, k, v, (2, 6, 6), text_len=5)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))


def test_q_reduction_is_exact_when_sources_equal_their_destination():
    q, k, v = _qkv(text=4)
    split = spatiotemporal_split((2, 6, 6), (2, 2, 2), generator=_gen(8))
    vid = q[..., 4:, :].clone()
    chunk_of = torch.zeros(72, dtype=torch.long)  # every video query := its chunk's destination query
    f, h, w = np.unravel_index(np.arange(72), (2, 6, 6))
    cid = torch.as_tensor((f // 2) * 9 + (h // 2) * 3 + (w // 2))
    dst_of_chunk = {int(cid[d]): int(d) for d in split.dst_idx}
    chunk_of = torch.tensor([dst_of_chunk[int(c)] for c in cid])
    q = torch.cat([q[..., :4, :], vid[..., chunk_of, :]], dim=-2)
    full = F.scaled_dot_product_attention(q, k, v)
    for text_first in (True, False):
        qq, kk, vv = (
            (q, k, v) if text_first else [torch.cat([t[..., 4:, :], t[..., :4, :]], -2) for t in (q, k, v)]
        )
        ref = full if text_first else torch.cat([full[..., 4:, :], full[..., :4, :]], -2)
        out = asymrnr_attention(
            qq, kk, vv, (2, 6, 6), text_len=4, ratio_q=0.8, text_first=text_first, generator=_gen(8)
        )
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


def test_kv_reduction_with_mean_mode_and_log_count_bias_is_exact_on_duplicated_keys():
    # keys/values constant within each chunk: 'mean' keeps them and the log-count bias restores the weights
    q, k, v = _qkv(text=0)
    f, h, w = np.unravel_index(np.arange(72), (2, 6, 6))
    cid = torch.as_tensor((f // 2) * 9 + (h // 2) * 3 + (w // 2))
    k, v = k[..., cid, :], v[..., cid, :]
    full = F.scaled_dot_product_attention(q, k, v)
    out = asymrnr_attention(
        q, k, v, (2, 6, 6), ratio_kv=0.85, mode="mean", log_count_bias=True, generator=_gen(9)
    )
    torch.testing.assert_close(out, full, atol=1e-5, rtol=0)
    plain = asymrnr_attention(q, k, v, (2, 6, 6), ratio_kv=0.5, generator=_gen(9))  # no bias: not exact
    assert float((plain - full).abs().max()) > 1e-3


# ---------------------------------------------------------------------------------------- schedule
def test_schedule_thresholds_and_conflict_rule():
    tiers = {f: torch.full((2, 3), t) for f, t in (("h", 9), ("q", 7), ("k", 0), ("v", 8))}
    s = RnRSchedule(tiers, {"q": {6: 0.4, 7: 0.8}, "v": {8: 0.3}, "h": {5: 0.2}})
    assert s.ratio("q", 0, 0) == 0.8 and s.ratio("v", 1, 2) == 0.3 and s.ratio("k", 0, 0) == 0.0
    r = s.ratios(0, 0)
    # q: 0.5 * 0.8 - 0.07 = 0.33 > 0.2 -> h disabled; then v applies (and k = v)
    assert r == {"h": 0.0, "q": 0.8, "k": 0.3, "v": 0.3}
    s2 = RnRSchedule(tiers, {"q": {6: 0.4}, "v": {8: 0.3}, "h": {5: 0.2}})
    # q: 0.5 * 0.4 - 0.07 = 0.13 <= 0.2 -> q skipped; v: 0.4 * 0.3 - 0.01 = 0.11 <= 0.2 -> v skipped
    assert s2.ratios(1, 1) == {"h": 0.2, "q": 0.0, "k": 0.0, "v": 0.0}


def test_schedule_round_trips_through_safetensors(tmp_path):
    tiers = {f: torch.randint(0, 10, (4, 5), generator=_gen(i)) for i, f in enumerate("hqkv")}
    s = RnRSchedule(tiers, {"q": {7: 0.9}})
    s.save(tmp_path / "sched.safetensors")
    back = RnRSchedule.from_safetensors(tmp_path / "sched.safetensors", {"q": {7: 0.9}}, 4, 5)
    assert all(torch.equal(back.tiers[f], tiers[f]) for f in "hqkv")
    with pytest.raises(
        ValueError, match=r"must have shape \(num_blocks, num_steps\) = \(3, 5\), got \(4, 5\)"
    ):
        RnRSchedule.from_safetensors(tmp_path / "sched.safetensors", {}, 3, 5)


@settings(max_examples=20, deadline=None)
@given(vals=st.lists(st.floats(-5, 5), min_size=10, max_size=40, unique=True))
def test_tiers_are_deciles(vals):
    t = tiers_from_statistic(torch.tensor(vals))
    assert int(t.min()) == 0 and int(t.max()) == 9
    counts = torch.bincount(t, minlength=10)
    assert int(counts.max()) - int(counts.min()) <= 1 + len(vals) // 10  # nearly equal groups
    order = torch.tensor(vals).argsort()
    assert bool((t[order][1:] >= t[order][:-1]).all())  # monotone in the statistic


def test_calibration_ranks_smooth_features_as_more_redundant():
    setting = exp.QUICK
    gen = _gen(0)
    rough, smooth = exp.make_fields(setting, 0.5, gen)[0], exp.make_fields(setting, 3.0, gen)[0]

    def run_fn(rec: RedundancyRecorder) -> None:
        for step in range(2):
            rec.record("v", 0, step, rough, setting.grid)
            rec.record("v", 1, step, smooth, setting.grid)

    sched = calibrate_redundancy(run_fn, 2, 2, {"v": {5: 0.5}})
    assert sched.tiers["v"][1].min() > sched.tiers["v"][0].max()
    assert torch.equal(sched.tiers["k"], sched.tiers["v"])
    assert sched.ratios(1, 0)["v"] == 0.5 and sched.ratios(0, 0)["v"] == 0.0


# -------------------------------------------------------------------------------------------- cache
def test_cache_recomputes_exactly_every_cache_steps():
    cache = MatchCache(3, generator=_gen(0))
    x = torch.randn(1, 72, 4, generator=_gen(1))
    seen = []
    for step in range(8):
        split, _m = cache.get("blk0", step, x + 0.01 * step, (2, 6, 6), (2, 2, 2))
        seen.append(split.dst_idx)
    assert [s for _, s in cache.recomputed] == [0, 3, 6]
    assert torch.equal(seen[0], seen[2]) and not torch.equal(seen[2], seen[3])


# --------------------------------------------------------------------------------------- bad inputs
def test_bad_inputs_are_rejected_with_named_arguments():
    split = spatiotemporal_split((2, 4, 4), (2, 2, 2), generator=_gen(0))
    x = torch.randn(1, 32, 3)
    m = match_tokens(x, split)
    with pytest.raises(ValueError, match=r"x has 30 tokens .* grid F\*H\*W has 32"):
        match_tokens(x[:, :30], split)
    with pytest.raises(ValueError, match=r"stride must have sides in \[1, grid side\]"):
        spatiotemporal_split((2, 4, 4), (0, 2, 2))
    with pytest.raises(ValueError, match=r"stride must have sides in \[1, grid side\]"):
        spatiotemporal_split((2, 4, 4), (3, 2, 2))
    with pytest.raises(ValueError, match=r"ratio must be a finite float in \[0\.0, 1\.0\), got"):
        reduce_tokens(x, split, m, 1.0)
    with pytest.raises(ValueError, match=r"ratio must be a finite float in \[0\.0, 1\.0\), got"):
        reduce_tokens(x, split, m, -0.1)
    with pytest.raises(ValueError, match="metric must be one of"):
        match_tokens(x, split, "manhattan")
    with pytest.raises(ValueError, match="mode must be one of"):
        reduce_tokens(x, split, m, 0.5, "max")
    q = torch.randn(1, 1, 40, 4)
    with pytest.raises(ValueError, match=r"text_len \+ F\*H\*W = 5 \+ 32 = 37 tokens .* got 40"):
        asymrnr_attention(q, q, q, (2, 4, 4), text_len=5, ratio_q=0.5)
    with pytest.raises(ValueError, match=r"tiers\[.v.\] must have shape"):
        RnRSchedule({"q": torch.zeros(2, 3, dtype=torch.long), "v": torch.zeros(2, 4, dtype=torch.long)})
    with pytest.raises(ValueError, match="cache_steps must be an int >= 1"):
        MatchCache(0)


def test_grid_stride_and_ratio_go_through_the_shared_checks():
    """icml25.kernels.checks: a NumPy int side or float ratio is the same value; the messages name the entry."""
    x = torch.randn(1, 32, 3)
    a = spatiotemporal_split((2, 4, 4), (2, 2, 2), generator=_gen(0))
    b = spatiotemporal_split((np.int64(2), 4, 4), [2, np.int32(2), 2], generator=_gen(0))
    assert torch.equal(a.dst_idx, b.dst_idx) and torch.equal(a.src_idx, b.src_idx)
    m = match_tokens(x, a)
    assert torch.equal(reduce_tokens(x, a, m, 0.5)[0], reduce_tokens(x, a, m, np.float64(0.5))[0])
    with pytest.raises(TypeError, match=r"^grid must be a tuple of 3 ints, got tuple \(2, 4\)"):
        spatiotemporal_split((2, 4), (2, 2, 2))
    with pytest.raises(TypeError, match=r"^stride must be a tuple of 3 ints, got tuple \(2, 2\.0, 2\)"):
        spatiotemporal_split((2, 4, 4), (2, 2.0, 2))
    with pytest.raises(ValueError, match=r"^ratio must be a finite float in \[0\.0, 1\.0\), got nan"):
        reduce_tokens(x, a, m, float("nan"))
    xn = x.clone()
    xn[0, 3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^x must be finite \(no NaN or inf\), got 1 NaN and 0 inf"):
        match_tokens(xn, a)


# -------------------------------------------------------------------------------- reproduction gate
def test_quick_reproduction_passes():
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.summary()
    assert report.metrics["err_a"] < report.metrics["baseline_err_b"]


def test_broken_variant_reversed_order_fails_the_quick_gate():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = exp.evaluate(exp.QUICK, 0, variant="reversed_order")
    assert not report.passed
    assert report.checks["err(a) AsymRnR < err(b) uniform symmetric"] is False
    assert "0.8 x err(b)" in exp.threshold(quick=False) and "0.8 x err(b)" not in exp.threshold(quick=True)
