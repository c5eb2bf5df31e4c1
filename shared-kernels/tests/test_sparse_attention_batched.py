"""The batched stage 2 of icml25.kernels.sparse_attention (SpargeAttn, ICML 2025, P01) against its oracle, the
tile-loop reference ``reference.sparse_flash_forward``: same outputs (fp32 rounding) and same λ-skip counts,
over every mask pattern edge (empty rows, dense, causal, ragged last blocks, GQA, INT8, fp16/bf16 V)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels.sparse_attention import batched, block_sparse_attention, sparge_attention
from icml25.kernels.sparse_attention import reference as ref


def _operands(q, k, *, quantize, gran_rows, block_q, block_k, scale):
    return ref.quantize_qk(
        q,
        k,
        scale=scale,
        smooth_k=True,
        quantize=quantize,
        block_q=block_q,
        block_k=block_k,
        q_group=gran_rows,
    )


def _both(q, k, v, mask, *, causal, lam, quantize=False, gran_rows=None, block_q=16, block_k=16, max_chunk=None,
          use_sdpa=True):  # fmt: skip
    """(loop, batched) outputs and skip counts for a given block mask."""
    lq, lk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    if causal:
        mask = mask & ref.causal_block_valid(mask.shape[-2], mask.shape[-1], block_q, block_k, "cpu")
    lut, count = ref.mask_to_lut(mask)
    ops = _operands(
        q, k, quantize=quantize, gran_rows=gran_rows, block_q=block_q, block_k=block_k, scale=scale
    )
    lam_t = ref.per_head(lam, q.shape[1], "cpu")
    kw = {
        "lq": lq,
        "lk": lk,
        "is_causal": causal,
        "pv_threshold": lam_t,
        "block_q": block_q,
        "block_k": block_k,
    }
    o_r, s_r = ref.sparse_flash_forward(*ops, v, lut, count, **kw)
    extra = {"use_sdpa": use_sdpa} if max_chunk is None else {"max_chunk": max_chunk, "use_sdpa": use_sdpa}
    o_b, s_b = batched.sparse_flash_forward(*ops, v, lut, count, **kw, **extra)
    return o_r, s_r, o_b, s_b


def _qkv(b, h, hkv, lq, lk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, lq, d, generator=g),
        torch.randn(b, hkv, lk, d, generator=g),
        torch.randn(b, hkv, lk, d, generator=g),
    )


def _assert_same(o_r, s_r, o_b, s_b, atol=2e-5):
    assert o_b.dtype == o_r.dtype and o_b.shape == o_r.shape
    assert torch.isfinite(o_b).all()
    torch.testing.assert_close(o_b.float(), o_r.float(), atol=atol, rtol=1e-4)
    assert torch.equal(s_b, s_r)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", ["dense", "random", "empty_rows", "single_block", "first_only"])
def test_batched_equals_loop_on_mask_patterns(causal, pattern):
    b, h, hkv, lq, lk, bq, bk = 2, 4, 2, 75, 83, 16, 16  # GQA, ragged last Q and K blocks
    q, k, v = _qkv(b, h, hkv, lq, lk, 32)
    nq, nk = math.ceil(lq / bq), math.ceil(lk / bk)
    g = torch.Generator().manual_seed(1)
    mask = {
        "dense": torch.ones(b, h, nq, nk, dtype=torch.bool),
        "random": torch.rand(b, h, nq, nk, generator=g) < 0.5,
        "empty_rows": (torch.rand(b, h, nq, nk, generator=g) < 0.5) & (torch.arange(nq) % 2 == 0)[:, None],
        "single_block": torch.zeros(b, h, nq, nk, dtype=torch.bool).index_fill_(
            -1, torch.tensor([nk - 1]), True
        ),
        "first_only": torch.zeros(b, h, nq, nk, dtype=torch.bool).index_fill_(-1, torch.tensor([0]), True),
    }[pattern]
    for lam in (math.inf, 50.0, 3.0, 0.0):
        for use_sdpa in (True, False):
            _assert_same(*_both(q, k, v, mask, causal=causal, lam=lam, use_sdpa=use_sdpa))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lk", [64, 61])
def test_batched_dense_and_shared_rows_take_sdpa_and_equal_loop(causal, lk, monkeypatch):
    # Dense heads / rows shared by a chunk go through scaled_dot_product_attention when no λ skip can occur
    # (λ = 50, ordinary scores); with a small λ the bound cannot prove it and the explicit route runs.
    q, k, v = _qkv(1, 2, 1, 64, lk, 16, seed=11)
    mask = torch.ones(1, 2, 4, 4, dtype=torch.bool)
    mask[:, 1, 2] = False  # head 1, Q block 2: nothing kept; the other rows of head 1 stay dense
    calls = []
    real = batched.F.scaled_dot_product_attention
    monkeypatch.setattr(
        batched.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    _assert_same(*_both(q, k, v, mask, causal=causal, lam=50.0))
    assert calls  # the fused route ran (whole causal head, or the non-causal shared rows of a full K)
    calls.clear()
    _assert_same(*_both(q, k, v, mask, causal=causal, lam=50.0, use_sdpa=False))
    assert not calls


@pytest.mark.parametrize("gran_rows", [None, 8])
def test_batched_equals_loop_int8(gran_rows):
    q, k, v = _qkv(1, 2, 1, 64, 96, 16, seed=3)
    mask = torch.rand(1, 2, 4, 6, generator=torch.Generator().manual_seed(2)) < 0.6
    for causal in (False, True):
        _assert_same(*_both(q, k, v, mask, causal=causal, lam=2.0, quantize=True, gran_rows=gran_rows))


def test_batched_lambda_skips_match_loop_on_dominant_first_block():
    g = torch.Generator().manual_seed(0)
    q = 0.5 * torch.randn(1, 2, 128, 32, generator=g)
    k = 0.5 * torch.randn(1, 2, 256, 32, generator=g)
    q[..., 0] += 10.0
    k[:, :, :64, 0] += 10.0
    v = torch.randn(1, 2, 256, 32, generator=g)
    mask = torch.ones(1, 2, 2, 4, dtype=torch.bool)
    o_r, s_r, o_b, s_b = _both(q, k, v, mask, causal=False, lam=0.0, block_q=64, block_k=64)
    assert int(s_r.sum()) >= 1
    _assert_same(o_r, s_r, o_b, s_b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_batched_equals_loop_half_v(dtype):
    q, k, v = (x.to(dtype) for x in _qkv(1, 2, 2, 48, 48, 16, seed=5))
    mask = torch.rand(1, 2, 3, 3, generator=torch.Generator().manual_seed(4)) < 0.7
    _assert_same(*_both(q, k, v, mask, causal=True, lam=4.0, quantize=True), atol=1e-2)


def test_batched_small_chunks_equal_one_chunk():
    # max_chunk smaller than one program: every program alone; results do not depend on the chunking.
    q, k, v = _qkv(1, 3, 3, 100, 100, 16, seed=7)
    mask = torch.rand(1, 3, 7, 7, generator=torch.Generator().manual_seed(6)) < 0.5
    o_r, s_r, o_b, s_b = _both(q, k, v, mask, causal=True, lam=1.0, max_chunk=1)
    _assert_same(o_r, s_r, o_b, s_b)
    _, _, o_b2, s_b2 = _both(q, k, v, mask, causal=True, lam=1.0, max_chunk=1 << 30)
    _assert_same(o_b, s_b, o_b2, s_b2)


@settings(max_examples=25, deadline=None)
@given(
    hkv=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2]),
    lq=st.integers(1, 70),
    lk=st.integers(1, 70),
    bq=st.sampled_from([8, 16, 32]),
    bk=st.sampled_from([8, 16]),
    causal=st.booleans(),
    quantize=st.booleans(),
    lam=st.sampled_from([math.inf, 0.0, 1.5, 6.0]),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 1000),
)
def test_property_batched_equals_loop(hkv, group, lq, lk, bq, bk, causal, quantize, lam, density, seed):
    q, k, v = _qkv(1, hkv * group, hkv, lq, lk, 8, seed=seed)
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(1, hkv * group, math.ceil(lq / bq), math.ceil(lk / bk), generator=g) < density
    for use_sdpa in (True, False):
        _assert_same(
            *_both(
                q,
                k,
                v,
                mask,
                causal=causal,
                lam=lam,
                quantize=quantize,
                block_q=bq,
                block_k=bk,
                use_sdpa=use_sdpa,
            )
        )


def test_public_ops_run_the_batched_path_and_match_the_loop(monkeypatch):
    # The public reference-backend ops equal the same call with the loop swapped in (end to end, INT8, λ).
    q, k, v = _qkv(1, 2, 2, 256, 256, 32, seed=9)
    kw = {"cdf_threshold": None, "topk": 0.5, "sim_threshold": -1.0, "pv_threshold": 2.0, "block_q": 32,
          "block_k": 16, "backend": "reference", "return_stats": True}  # fmt: skip
    o_b, st_b = sparge_attention(q, k, v, is_causal=True, **kw)
    mask = torch.rand(1, 2, 8, 16, generator=torch.Generator().manual_seed(0)) < 0.4
    o_mb, st_mb = block_sparse_attention(
        q, k, v, mask, pv_threshold=1.0, block_q=32, block_k=16, return_stats=True
    )
    monkeypatch.setattr(batched, "sparse_flash_forward", ref.sparse_flash_forward)
    o_r, st_r = sparge_attention(q, k, v, is_causal=True, **kw)
    o_mr, st_mr = block_sparse_attention(
        q, k, v, mask, pv_threshold=1.0, block_q=32, block_k=16, return_stats=True
    )
    torch.testing.assert_close(o_b, o_r, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(o_mb, o_mr, atol=2e-5, rtol=1e-4)
    assert st_b.skipped_pv_tiles == st_r.skipped_pv_tiles and st_b.sparsity == st_r.sparsity
    assert st_mb.skipped_pv_tiles == st_mr.skipped_pv_tiles


@pytest.mark.parametrize("q_group", [16, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("smooth", [True, False])
def test_operands_equal_int8_values_times_scales(q_group, dtype, smooth):
    # The reference path's fp32 operands are the INT8 ones times their scales, element for element
    # (ragged lengths: zero padding rows), and the inputs are left untouched.
    q, k, _ = _qkv(2, 2, 1, 75, 83, 32, seed=13)
    q, k = 3.0 * q.to(dtype), (2.0 * k + 0.5).to(dtype)
    q0, k0 = q.clone(), k.clone()
    k_mean = k.mean(dim=-2, dtype=torch.float32) if smooth else None
    scale = 1.0 / math.sqrt(32)
    q_op, q_s, k_op, k_s = batched.operands(
        q, k, scale=scale, k_mean=k_mean, quantize=True, block_q=16, block_k=16, q_group=q_group
    )
    assert q_s is None and k_s is None and q_op.dtype == k_op.dtype == torch.float32
    q8 = ref.block_stats(q, 16, quant_scale=scale * ref.LOG2E, quant_group=q_group)
    k8 = ref.block_stats(k, 16, mean=k_mean, quant_scale=1.0)
    q_ref = (q8.x_int8.float().view(2, 2, -1, q_group, 32) * q8.scale[..., None, None]).view_as(q_op)
    k_ref = (k8.x_int8.float().view(2, 1, -1, 16, 32) * k8.scale[..., None, None]).view_as(k_op)
    assert torch.equal(q_op, q_ref) and torch.equal(k_op, k_ref)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    plain = batched.operands(q, k, scale=scale, k_mean=k_mean, quantize=False, block_q=16, block_k=16,
                             q_group=q_group)  # fmt: skip
    expected = ref.quantize_qk(q, k, scale=scale, smooth_k=smooth, quantize=False, block_q=16, block_k=16,
                               k_mean=k_mean)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(plain[::2], expected[::2]))


@pytest.mark.parametrize("lk", [128, 121])
def test_grouped_route_merges_programs_with_the_same_tiles(lk, monkeypatch):
    # Q blocks that keep the same K blocks run as one longer query (fewer SDPA calls than programs, one
    # gather per set); a set that keeps the ragged last K block is cut to the real keys. Equal to the loop.
    q, k, v = _qkv(2, 2, 1, 128, lk, 16, seed=17)
    mask = torch.zeros(2, 2, 8, 8, dtype=torch.bool)
    mask[..., :4, :3] = True  # Q blocks 0-3: K blocks 0-2 (one set per head)
    mask[..., 4:, 5:] = True  # Q blocks 4-7: K blocks 5-7, holding the ragged last one when lk = 121
    mask[1, 1, 6] = False
    mask[1, 1, 6, 0] = True  # one program with a set of its own
    shapes = []
    real = batched.F.scaled_dot_product_attention
    monkeypatch.setattr(
        batched.F,
        "scaled_dot_product_attention",
        lambda *a, **kw: shapes.append(a[0].shape) or real(*a, **kw),
    )
    for lam in (math.inf, 50.0):
        shapes.clear()
        _assert_same(*_both(q, k, v, mask, causal=False, lam=lam))
        # Sets, not programs (32): both query heads read K/V head 0, so per batch the two sets hold 8
        # programs each, except batch 1's second set (7) and the lone program (1).
        assert sum(s[0] for s in shapes) == 5
        assert max(s[2] for s in shapes) == 8 * 16  # eight Q blocks in one query
    shapes.clear()
    _assert_same(*_both(q, k, v, mask, causal=False, lam=0.5))  # the norm bound cannot clear λ = 0.5
    assert sum(s[0] for s in shapes) < 5


@settings(max_examples=20, deadline=None)
@given(gain=st.floats(0.2, 6.0), lam=st.sampled_from([0.5, 2.0, 8.0, 30.0]), seed=st.integers(0, 1000))
def test_property_norm_bound_clears_only_programs_the_loop_never_skips(gain, lam, seed):
    # _range_no_skip is a proof: every program it clears has 0 skipped tiles in the tile loop.
    q, k, v = _qkv(1, 2, 2, 64, 96, 16, seed=seed)
    q, k = gain * q, gain * k
    q[..., 0] += gain * 4.0  # a dominant direction makes some tiles skippable
    k[:, :, :16, 0] += gain * 4.0
    mask = torch.rand(1, 2, 4, 6, generator=torch.Generator().manual_seed(seed)) < 0.8
    o_r, s_r, o_b, s_b = _both(q, k, v, mask, causal=False, lam=lam, quantize=True)
    _assert_same(o_r, s_r, o_b, s_b, atol=1e-4)
    q_op, _, k_op, _ = _operands(q, k, quantize=False, gran_rows=None, block_q=16, block_k=16, scale=0.25)
    x = batched._Ctx(
        qb=q_op.reshape(8, 16, 16), kb=k_op.reshape(12, 16, 16), vb=k_op.reshape(12, 16, 16),
        lut=torch.zeros(8, 6, dtype=torch.long), kv_base=torch.arange(8) // 4 * 6, i_idx=torch.arange(8) % 4,
        lam=torch.full((8,), lam), out=torch.zeros(8, 16, 16), skipped=torch.zeros(8, dtype=torch.int32),
        lq=64, lk=96, is_causal=False, block_q=16, block_k=16, v_dtype=torch.float32, sdpa=True,
    )  # fmt: skip
    cleared = batched._range_no_skip(x)
    _, s_plain, _, _ = _both(q, k, v, mask, causal=False, lam=lam)
    assert int(s_plain.view(-1)[cleared].sum()) == 0
