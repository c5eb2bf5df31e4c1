"""Tests of the nearest-neighbour matching op family (P21 AsymRnR): the chunked torch path and the Triton
kernel (TRITON_INTERPRET=1 on CPU) against a Python brute force and the dense reference, the tie rule,
invariances, bad inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels import triton_available
from icml25.kernels.nn_match import (
    METRICS,
    SQUARED_NORM_LIMIT,
    check_token_values,
    check_tokens,
    nearest_neighbor,
    nearest_neighbor_chunked_reference,
    nearest_neighbor_reference,
)

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _ints(*shape: int, seed: int = 0, hi: int = 4) -> torch.Tensor:
    """Small integers as floats: every score is exact in float32, so argmaxes (and ties) are exact."""
    return torch.randint(-hi, hi + 1, shape, generator=torch.Generator().manual_seed(seed)).float()


def _brute(x: torch.Tensor, y: torch.Tensor, metric: str) -> tuple[list[float], list[int]]:
    """Python loops of the definition over the rows of 2-D x, y (float64; ties to the lowest index)."""
    vals, idxs = [], []
    for xi in x.double().tolist():
        best, arg = None, -1
        for j, yj in enumerate(y.double().tolist()):
            if metric == "euclidean":
                s = -sum((a - b) ** 2 for a, b in zip(xi, yj))
            elif metric == "dot":
                s = sum(a * b for a, b in zip(xi, yj))
            else:
                nx = sum(a * a for a in xi) ** 0.5 or 1.0
                ny = sum(b * b for b in yj) ** 0.5 or 1.0
                s = sum(a * b for a, b in zip(xi, yj)) / (nx * ny)
            if best is None or s > best + (1e-9 if metric == "cosine" else 0.0):
                best, arg = s, j
        vals.append(best)
        idxs.append(arg)
    return vals, idxs


@pytest.mark.parametrize("metric", METRICS)
def test_equals_python_brute_force_with_lowest_index_ties(metric):
    x, y = _ints(2, 3, 23, 5, seed=1, hi=2), _ints(2, 3, 11, 5, seed=2, hi=2)  # many exact ties
    val, idx = nearest_neighbor(x, y, metric=metric, chunk=4)
    for b in range(2):
        for h in range(3):
            v, i = _brute(x[b, h], y[b, h], metric)
            if metric != "cosine":  # integer inputs: exact scores and ties
                assert idx[b, h].tolist() == i
            else:  # float32 cosines of parallel integer rows may differ in the last bit: same best value
                sims = torch.tensor(
                    [
                        _brute(x[b, h][s : s + 1], y[b, h][j : j + 1], metric)[0][0]
                        for s, j in enumerate(idx[b, h].tolist())
                    ],
                    dtype=torch.float64,
                )
                torch.testing.assert_close(sims, torch.tensor(v, dtype=torch.float64), atol=1e-6, rtol=0)
            torch.testing.assert_close(
                val[b, h].double(), torch.tensor(v, dtype=torch.float64), atol=1e-5, rtol=0
            )


def test_constant_destinations_tie_to_index_zero_and_identical_sources_match_themselves():
    x = _ints(7, 4, seed=3)
    _, idx = nearest_neighbor(x, torch.ones(5, 4))
    assert idx.tolist() == [0] * 7
    y = torch.cat([x[3:4], x, x])  # x_i appears at 1 + i (first) and 8 + i; x_3 also at 0
    val, idx = nearest_neighbor(x, y)
    assert float(val.abs().max()) == 0.0
    assert idx.tolist() == [1 + i if i != 3 else 0 for i in range(7)]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    ns=st.integers(1, 40),
    nd=st.integers(1, 25),
    c=st.integers(1, 9),
    chunk=st.integers(1, 17),
    metric=st.sampled_from(METRICS),
)
def test_chunked_path_equals_the_dense_reference(seed, ns, nd, c, chunk, metric):
    x, y = _ints(2, ns, c, seed=seed), _ints(2, nd, c, seed=seed + 1)
    v_ref, i_ref = nearest_neighbor_reference(x, y, metric)
    v, i = nearest_neighbor_chunked_reference(x, y, metric, chunk)
    if metric != "cosine":  # integer inputs: exact scores, so exact argmaxes including ties
        assert torch.equal(i, i_ref) and torch.equal(v, v_ref)
    else:
        torch.testing.assert_close(v, v_ref, atol=1e-6, rtol=0)
        picked = nearest_neighbor_reference(x, y, metric)[0]
        torch.testing.assert_close(picked, v, atol=1e-6, rtol=0)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.floats(-3, 3), scale=st.floats(0.25, 4))
def test_invariances(seed, shift, scale):
    x, y = torch.randn(30, 6, generator=torch.Generator().manual_seed(seed)), torch.randn(9, 6)
    _, i = nearest_neighbor(x, y)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(seed))
    _, ip = nearest_neighbor(x, y[perm])
    assert torch.equal(perm[ip], i)  # permuting destinations permutes the answer
    _, it = nearest_neighbor(x + shift, y + shift)  # euclidean: translation invariant
    _, isc = nearest_neighbor(x * scale, y * scale)  # and scale invariant
    assert (it == i).float().mean() >= 0.95 and (isc == i).float().mean() >= 0.95  # float rounding near-ties
    row_scale = torch.rand(9, 1, generator=torch.Generator().manual_seed(seed)) * 5 + 0.1
    _, ic = nearest_neighbor(x, y * row_scale, metric="cosine")
    assert (ic == nearest_neighbor(x, y, metric="cosine")[1]).float().mean() >= 0.95  # row scales ignored


def test_empty_sources_and_leading_dims():
    v, i = nearest_neighbor(torch.ones(2, 0, 3), torch.ones(2, 4, 3))
    assert v.shape == (2, 0) and i.shape == (2, 0)
    v, i = nearest_neighbor(torch.ones(0, 5, 3), torch.ones(0, 4, 3))
    assert v.shape == (0, 5) and i.dtype == torch.int64


# ---------------------------------------------------------------------------------- Triton vs reference
@needs_triton
@pytest.mark.parametrize("metric", METRICS)
def test_triton_matches_reference(metric):  # on CPU: TRITON_INTERPRET=1 (conftest)
    x, y = _ints(2, 37, 20, seed=5).to(DEV), _ints(2, 21, 20, seed=6).to(DEV)  # ragged tiles, exact ties
    v_ref, i_ref = nearest_neighbor_reference(x, y, metric)
    v, i = nearest_neighbor(x, y, metric=metric, backend="triton")
    if metric != "cosine":
        assert torch.equal(i, i_ref)
        torch.testing.assert_close(v, v_ref, atol=0, rtol=0)
    else:
        torch.testing.assert_close(v, v_ref, atol=1e-6, rtol=0)
        assert (i == i_ref).float().mean() >= 0.95
    xr, yr = torch.randn(3, 70, 33).to(DEV), torch.randn(3, 66, 33).to(DEV)  # several S and D blocks
    v_ref, i_ref = nearest_neighbor_reference(xr, yr, metric)
    v, i = nearest_neighbor(xr, yr, metric=metric, backend="triton")
    torch.testing.assert_close(v, v_ref, atol=1e-4, rtol=1e-5)
    assert (i == i_ref).float().mean() >= 0.99


# --------------------------------------------------------------------------------------- bad inputs
def test_bad_inputs_are_rejected_with_named_arguments():
    x, y = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="metric must be one of"):
        nearest_neighbor(x, y, metric="l1")
    with pytest.raises(ValueError, match=r"y must have the leading dims \[2\] and feature dim C = 3"):
        nearest_neighbor(x, torch.randn(2, 4, 2))
    with pytest.raises(ValueError, match="y must hold at least one destination"):
        nearest_neighbor(x, torch.randn(2, 0, 3))
    with pytest.raises(
        ValueError, match=r"x must be finite \(no NaN or inf\), got 1 NaN .*check_finite=False"
    ):
        nearest_neighbor(torch.where(torch.arange(30).reshape(2, 5, 3) == 7, float("nan"), x), y)
    with pytest.raises(ValueError, match="x has a squared row norm"):
        nearest_neighbor(x * 1e30, y)
    with pytest.raises(TypeError, match="y must be a float tensor"):
        nearest_neighbor(x, y.long())
    with pytest.raises(ValueError, match="chunk must be an int >= 1"):
        nearest_neighbor(x, y, chunk=0)


def test_token_value_check_bounds_squared_norms_except_for_cosine():
    # a row of 4 entries of 2e18 has squared norm 1.6e37: over the limit, although every entry is finite
    big = torch.full((1, 3, 4), 2e18)
    for metric in ("euclidean", "dot"):
        with pytest.raises(
            ValueError, match=rf"t has a squared row norm 1.6e\+37 .* {metric} scores \(limit 1e\+37\)"
        ):
            check_token_values(big, "t", metric)
    check_token_values(big, "t", "cosine")  # rows are normalised first: scale does not matter
    check_token_values(torch.full((1, 3, 4), 1.5e18), "t")  # 9e36 is under the limit
    assert SQUARED_NORM_LIMIT == 1e37
    with pytest.raises(ValueError, match=r"t must be finite .*got 0 NaN and 1 inf.*; skip me$"):
        check_token_values(torch.tensor([[1.0, float("inf")]]), "t", "cosine", hint="; skip me")
    with pytest.raises(ValueError, match=r"t must have at least 2 dims \[\.\.\., N, C\]"):
        check_tokens(torch.ones(3), "t")
