"""Hostile-input contract of the public kernel ops (CONTRIBUTING.md, "Bad input contract").

Each entry registers one public op with a valid example call; :mod:`icml25.kernels.testing` derives the
hostile variants (NaN, ±Inf, empty axes, wrong dtype, extra/missing dim, constant, huge) and asserts that
each gets a ValueError/TypeError naming the argument or a documented finite result.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml25.kernels import hadamard_grid as hg
from icml25.kernels import nn_match as nnm
from icml25.kernels import quantization as qz
from icml25.kernels import retention as rt
from icml25.kernels import selective_scan as ss
from icml25.kernels import sparse_attention as sa
from icml25.kernels import testing as kt
from icml25.kernels import token_merge as tmg
from icml25.kernels import topk_decode as td
from icml25.kernels import xor_lag as xl
from icml25.kernels.rng import global_rng_state, isolated_rng, make_generator
from icml25.kernels.testing import Allow, HostileSpec, check_hostile

REF = {"backend": "reference"}
_g = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_g)


_X = _randn(2, 64)
_Q = qz.quantize(_X, 4, 32)
_QKV = {"q": _randn(1, 2, 32, 16), "k": _randn(1, 2, 32, 16), "v": _randn(1, 2, 32, 16)}
_SPARGE = {**_QKV, "block_q": 16, "block_k": 16, **REF}
_MASK = torch.ones(1, 2, 2, 2, dtype=torch.bool)
_VALS, _IDX = _randn(3, 4).abs(), torch.stack([torch.randperm(16, generator=_g)[:4] for _ in range(3)])
_WDEC = _randn(16, 8)
_BITS = (torch.rand(3, 40, generator=_g) > 0.5).to(torch.uint8)
_WORDS = xl.pack_bits(_BITS)
_GRID = _randn(16, 2)
_RET = {
    "q": _randn(1, 2, 6, 4),
    "k": _randn(1, 2, 6, 4),
    "v": _randn(1, 2, 6, 3),
    "kappa": torch.tensor([0.9, 0.5]),
    "n_agents": 2,
    "dones": torch.tensor([[False, True, False]]),
    "state": _randn(1, 2, 4, 3),
}

_SS = {
    "u": _randn(2, 3, 5),
    "delta": _randn(2, 3, 5),
    "A": -_randn(3, 4).abs(),
    "B": _randn(2, 4, 5),
    "C": _randn(2, 4, 5),
    "D": _randn(3),
    "z": _randn(2, 3, 5),
    "delta_bias": _randn(3),
    "delta_softplus": True,
}

CONST_OK = "a constant input is valid: its result is finite and exact"
EMPTY_OK = "an empty axis gives an empty (exact) result"
HUGE_OK = "1e30-scaled inputs stay finite and the result is the correct one"
PROPAGATES = Allow(
    "documented: a linear op propagates NaN/Inf to the rows that use them (no host sync)", False
)
ORACLE = "test oracle / baseline in plain PyTorch, documented as 'arguments not validated'; the public op validates"

_TMX = _randn(2, 8, 4)
_TMIDX = torch.tensor([[0, 3], [5, 1]])
_TM_ALLOW = {
    "constant": "constant tokens are valid: every cosine is 1 and the lowest indices win the ties",
    "huge": "cosine similarity is scale-invariant (rows are divided by their max |entry| first)",
    "empty:0": EMPTY_OK,
}
_RET_ALLOW = {
    "nan": PROPAGATES,
    "posinf": PROPAGATES,
    "neginf": PROPAGATES,
    "constant": CONST_OK,
    "huge": "linear in each of q, k, v, state: a 1e30-scaled one gives a finite, scaled result",
    "kappa:missing_dim": "a 0-d kappa is one decay shared by every head",
    "dones:dtype": "0/1 numeric dones are valid (read as bool)",
}
REGISTRY: dict[str, list[HostileSpec]] = {
    "quantization": [
        HostileSpec(
            "quantize",
            qz.quantize,
            {"x": _X, "bits": 4, "group_size": 32, **REF},
            ("x",),
            {
                "constant": "a constant group quantizes exactly (scale 0)",
                "empty": EMPTY_OK,
                "huge": "|x| <= MAX_ABS quantizes to finite scale/zero",
            },
        ),
        HostileSpec(
            "quantize_dequantize",
            qz.quantize_dequantize,
            {"x": _X, "bits": 4, "group_size": 32, **REF},
            ("x",),
            {"constant": CONST_OK, "empty": EMPTY_OK, "huge": HUGE_OK},
        ),
        HostileSpec("dequantize", lambda q: qz.dequantize(q, **REF), {"q": _Q}, (), covers=("dequantize",)),
        HostileSpec(
            "QuantizedTensor",
            qz.QuantizedTensor,
            {
                "packed": _Q.packed,
                "scale": _Q.scale,
                "zero": _Q.zero,
                "bits": 4,
                "group_size": 32,
                "shape": _Q.shape,
                "dtype": _Q.dtype,
            },
            ("packed", "scale", "zero"),
            {
                "packed:constant": "any int32 word is a valid code word",
                "constant": "a container: any scale/zero values are stored as given",
                "huge": "a container: any scale/zero values are stored as given",
                "nan": Allow("documented: the container does not inspect values (no host sync)", False),
                "posinf": Allow("documented: the container does not inspect values (no host sync)", False),
                "neginf": Allow("documented: the container does not inspect values (no host sync)", False),
            },
        ),
        HostileSpec(
            "pack_codes",
            qz.pack_codes,
            {"codes": torch.randint(0, 16, (2, 32), generator=_g), "bits": 4},
            ("codes",),
            {
                "constant": CONST_OK,
                "empty": EMPTY_OK,
                "extra_dim": "codes (..., n): a trailing axis of 1 code is valid",
                "missing_dim": "codes (..., n): a 1-D row is valid",
            },
        ),
        HostileSpec(
            "unpack_codes",
            qz.unpack_codes,
            {"packed": _Q.packed[0, 0], "bits": 4, "n": 32},
            ("packed",),
            {"constant": "any int32 word is a valid code word"},
        ),
    ],
    "sparse_attention": [
        HostileSpec(
            "sparge_attention",
            sa.sparge_attention,
            dict(_SPARGE),
            ("q", "k", "v"),
            {
                "constant": "constant q/k/v are valid: attention is finite (uniform weights)",
                "huge": "INT8 Q/K quantization is scale-invariant; the output is finite",
            },
        ),
        HostileSpec(
            "predict_block_mask",
            sa.predict_block_mask,
            {"q": _QKV["q"], "k": _QKV["k"], "block_q": 16, "block_k": 16, **REF},
            ("q", "k"),
            {"constant": CONST_OK, "huge": HUGE_OK},
        ),
        HostileSpec(
            "block_sparse_attention",
            sa.block_sparse_attention,
            {**_SPARGE, "block_mask": _MASK},
            ("q", "k", "v", "block_mask"),
            {"constant": CONST_OK, "huge": HUGE_OK},
        ),
        HostileSpec("SpargeStats", lambda: sa.SpargeStats(0.5, torch.zeros(2), 0.0, 1, 2, 0), {}, ()),
    ],
    "topk_decode": [
        HostileSpec(
            n,
            getattr(td, n),
            {"values": _VALS, "idx": _IDX, "W_dec": _WDEC, **REF, **extra},
            ("values", "idx", "W_dec"),
            {
                "constant": CONST_OK,
                "nan": PROPAGATES,
                "posinf": PROPAGATES,
                "neginf": PROPAGATES,
                "huge": HUGE_OK,
                "W_dec:empty:1": EMPTY_OK,
            },
        )
        for n, extra in (("topk_decode", {}), ("topk_decode_prefix", {"ks": [2, 4]}))
    ],
    "xor_lag": [
        HostileSpec(
            "pack_bits", xl.pack_bits, {"bits": _BITS}, ("bits",), {"constant": CONST_OK, "empty": EMPTY_OK}
        ),
        HostileSpec(
            "unpack_bits",
            xl.unpack_bits,
            {"words": _WORDS, "n_bits": 40},
            ("words",),
            {"constant": CONST_OK, "empty:0": "zero streams unpack to a (0, n_bits) array"},
        ),
        HostileSpec(
            "popcount32",
            xl.popcount32,
            {"v": _WORDS},
            ("v",),
            {
                "constant": CONST_OK,
                "empty": EMPTY_OK,
                "extra_dim": "elementwise: any shape",
                "missing_dim": "elementwise: any shape",
            },
        ),
        HostileSpec("n_patches", xl.n_patches, {"n_bits": 40, "patch_bits": 2}, ()),
        HostileSpec(
            "xor_lag_counts",
            xl.xor_lag_counts,
            {"words": _WORDS, "n_bits": 40, "lag_max": 4, **REF},
            ("words",),
            {"constant": CONST_OK, "empty:0": "zero streams give empty (0, 0, lag_max) count arrays"},
        ),
    ],
    "selective_scan": [
        HostileSpec(
            name,
            fn,
            {**_SS, **extra},
            ("u", "delta", "A", "B", "C", "D", "z", "delta_bias"),
            {
                "nan": PROPAGATES,
                "posinf": PROPAGATES,
                "neginf": PROPAGATES,
                "constant": CONST_OK,
                "empty": "an empty batch, channel, state or sequence axis gives an empty or zero-state result",
                "huge": Allow(
                    "documented: exp(Δ·A) and Δ·B·u of 1e30-scaled inputs overflow float32 (values are not "
                    "inspected on the hot path)",
                    False,
                ),
            },
        )
        for name, fn, extra in (
            ("selective_scan", ss.selective_scan, {"return_last_state": True, **REF}),
            ("selective_scan_chunked", ss.selective_scan_chunked, {"chunk_size": 2}),
        )
    ],
    "hadamard_grid": [
        HostileSpec(
            "fwht",
            hg.fwht,
            {"x": _randn(3, 16)},
            ("x",),
            {
                "constant": CONST_OK,
                "nan": PROPAGATES,
                "posinf": PROPAGATES,
                "neginf": PROPAGATES,
                "empty:0": EMPTY_OK,
                "extra_dim": "a last dim of 1 = 2**0 is a valid size",
                "huge": HUGE_OK,
            },
        ),
        HostileSpec("hadamard_matrix", hg.hadamard_matrix, {"size": 16}, ()),
        HostileSpec(
            "grid_encode",
            hg.grid_encode,
            {"x": _randn(3, 32), "grid": _GRID, "group": 16, **REF},
            ("x", "grid"),
            {"constant": CONST_OK, "empty": EMPTY_OK, "grid:huge": HUGE_OK},
        ),
        HostileSpec(
            "grid_decode",
            hg.grid_decode,
            {
                **dict(zip(("idx", "scale"), hg.grid_encode(_randn(3, 32), _GRID, 16, **REF))),
                "grid": _GRID,
                "group": 16,
                **REF,
            },
            ("idx", "scale", "grid"),
            {
                "constant": CONST_OK,
                "grid:huge": HUGE_OK,
                "scale:huge": Allow(
                    "documented: decode scales grid points; 1e30 * grid overflows fp32", False
                ),
            },
        ),
    ],
    "retention": [
        HostileSpec(
            name,
            fn,
            {**_RET, **extra},
            ("q", "k", "v", "kappa", "dones", "state", "n_agents", *extra_args),
            _RET_ALLOW,
        )
        for name, fn, extra, extra_args in (
            ("retention", rt.retention, {"chunk_size": 2, **REF}, ("chunk_size",)),
            ("retention_parallel", rt.retention_parallel, {}, ()),
        )
    ]
    + [
        HostileSpec(
            "retention_step",
            rt.retention_step,
            {
                **{n: _RET[n][:, :, :2] for n in ("q", "k", "v")},
                "kappa": _RET["kappa"],
                "state": _RET["state"],
                "done": torch.tensor([True]),
                "causal_agents": True,
            },
            ("q", "k", "v", "kappa", "state", "done"),
            {
                **{k: a for k, a in _RET_ALLOW.items() if not k.startswith("dones")},
                "done:dtype": "0/1 numeric done flags are valid (read as bool)",
            },
        ),
        HostileSpec(
            "default_kappas",
            rt.default_kappas,
            {"n_head": 4, "decay_scaling_factor": 0.8},
            ("n_head", "decay_scaling_factor"),
        ),
        HostileSpec("default_chunk_size", rt.default_chunk_size, {"n_agents": 3}, ("n_agents",)),
    ],
    "nn_match": [
        HostileSpec(
            "nearest_neighbor",
            nnm.nearest_neighbor,
            {"x": _randn(2, 6, 4), "y": _randn(2, 3, 4), "metric": "euclidean", **REF},
            ("x", "y"),
            {
                "constant": "constant tokens are valid: every score ties and the lowest index wins",
                "empty:0": EMPTY_OK,
                "x:empty:1": "no sources: an empty [G, 0] result",
            },
        ),
        HostileSpec(
            "check_tokens",
            nnm.check_tokens,
            {"t": _randn(2, 6, 4), "name": "x"},
            ("t",),
            {
                **{
                    k: Allow("only the form is checked; check_token_values inspects the values", False)
                    for k in ("nan", "posinf", "neginf")
                },
                "constant": "constant tokens have a valid form",
                "huge": "only the form is checked; check_token_values bounds the norms",
                "empty:0": EMPTY_OK,
                "empty:1": "no tokens: a valid [G, 0, C] form",
                "extra_dim": "any number of leading dims: [..., N, C]",
                "missing_dim": "any number of leading dims: [N, C] is valid",
            },
        ),
        HostileSpec(
            "check_token_values",
            nnm.check_token_values,
            {"t": _randn(2, 6, 4), "name": "x", "metric": "euclidean"},
            ("t",),
            {
                "constant": "constant tokens are valid values",
                "empty:0": EMPTY_OK,
                "empty:1": EMPTY_OK,
                "empty:2": "no entries: nothing to reject (the form is check_tokens' job)",
                "extra_dim": "values only: rows are the last dim, whatever the leading dims",
                "missing_dim": "values only: rows are the last dim, whatever the leading dims",
            },
        ),
    ],
    "token_merge": [
        HostileSpec(
            "facility_location_greedy",
            tmg.facility_location_greedy,
            {"x": _TMX, "k": 3, **REF},
            ("x", "k"),
            _TM_ALLOW,
        ),
        HostileSpec(
            "facility_location_objective",
            tmg.facility_location_objective,
            {"x": _TMX, "idx": _TMIDX},
            ("x", "idx"),
            {**_TM_ALLOW, "idx:constant": "a repeated index is a valid (smaller) selection"},
        ),
        HostileSpec(
            "tile_soft_merge",
            tmg.tile_soft_merge,
            {"x": _TMX, "dst_idx": _TMIDX, "values": _randn(2, 8, 3), "scale": 10.0, **REF},
            ("x", "dst_idx", "values", "scale"),
            {
                **_TM_ALLOW,
                "dst_idx:constant": "a repeated destination is valid (the two share its members)",
                "values:huge": "merging is linear in values: a 1e30-scaled one gives a finite, scaled result",
            },
        ),
        HostileSpec(
            "soft_merge_matrices",
            tmg.soft_merge_matrices,
            {"x": _TMX, "dst_idx": _TMIDX, "scale": 10.0, **REF},
            ("x", "dst_idx", "scale"),
            {**_TM_ALLOW, "dst_idx:constant": "a repeated destination is valid (the two share its members)"},
        ),
        HostileSpec(
            "soft_unmerge",
            tmg.soft_unmerge,
            {"y": _randn(2, 2, 3), "A": torch.softmax(_randn(2, 2, 8), dim=1)},
            ("y", "A"),
            {
                "nan": PROPAGATES,
                "posinf": PROPAGATES,
                "neginf": PROPAGATES,
                "constant": CONST_OK,
                "huge": "linear in y and A: a 1e30-scaled one gives a finite, scaled result",
                "empty:0": EMPTY_OK,
                "empty:2": EMPTY_OK,
                "A:empty:2": "no tokens to unmerge onto: an empty [G, 0, Cv] result",
            },
        ),
        HostileSpec(
            "bipartite_soft_matching_2d",
            lambda metric, h, w, r: tmg.bipartite_soft_matching_2d(metric, h, w, r, no_rand=True)[0](metric),
            {"metric": _randn(2, 16, 4), "h": 4, "w": 4, "r": 5},
            ("metric", "h", "w", "r"),
            {
                "metric:constant": "constant tokens are valid: every similarity ties and argsort breaks the ties",
                "metric:empty:0": EMPTY_OK,
                "metric:huge": "cosine similarity is scale-invariant (overflow-safe normalisation)",
            },
            covers=("bipartite_soft_matching_2d",),
        ),
    ],
}
MODULES = {
    "quantization": qz,
    "retention": rt,
    "selective_scan": ss,
    "sparse_attention": sa,
    "topk_decode": td,
    "xor_lag": xl,
    "hadamard_grid": hg,
    "token_merge": tmg,
    "nn_match": nnm,
}
EXCLUDED = {
    "quantization": {},
    "sparse_attention": {
        "dense_attention_reference": ORACLE,
        "mask_to_lut": "LUT builder for a validated mask (internal step, used by the ops)",
        "relative_l1": ORACLE,
    },
    "topk_decode": {
        "topk_decode_reference": ORACLE,
        "topk_decode_prefix_reference": ORACLE,
        "dense_decode": ORACLE,
    },
    "xor_lag": {"xor_lag_counts_reference": ORACLE, "xor_lag_counts_bruteforce": ORACLE},
    "hadamard_grid": {},
    "nn_match": {
        "nearest_neighbor_chunked_reference": ORACLE,
        "nearest_neighbor_reference": ORACLE,
        "similarity_matrix_reference": ORACLE,
    },
    "token_merge": {
        "bipartite_soft_matching_2d_reference": ORACLE,
        "facility_location_bruteforce": "brute-force test oracle (tiny n only), arguments not validated",
        "facility_location_greedy_reference": ORACLE,
        "facility_location_objective_reference": ORACLE,
        "tile_soft_merge_reference": ORACLE,
    },
    "selective_scan": {
        "selective_scan_reference": ORACLE,
        "selective_scan_chunked_reference": ORACLE,
    },
    "retention": {
        "retention_chunkwise_reference": ORACLE,
        "retention_parallel_reference": ORACLE,
        "retention_recurrent_reference": ORACLE,
        "retention_step_reference": ORACLE,
    },
}
SPECS = [s for specs in REGISTRY.values() for s in specs]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    report = spec.check()
    print(report.summary())


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_registry_covers_public_ops(family: str) -> None:
    covered = kt.assert_covers(MODULES[family], REGISTRY[family], EXCLUDED[family])
    print(f"icml25.kernels.{family}: covers {covered}; excluded {sorted(EXCLUDED[family])}")


def test_quantize_nan_group_is_rejected() -> None:
    x = torch.randn(2, 128)
    x[0, 3] = float("nan")
    with pytest.raises(
        ValueError,
        match=r"x must be finite \(no NaN or inf\), got 1 NaN and 0 inf values .* shape \(2, 128\)",
    ):
        qz.quantize(x, 4, 64)
    x[0, 3] = float("inf")
    with pytest.raises(ValueError, match=r"x must be finite .*got 0 NaN and 1 inf"):
        qz.quantize(x, 4, 64, backend="triton")  # validated on the host before any launch


def test_quantize_range_overflow_is_rejected_and_large_finite_range_is_finite() -> None:
    with pytest.raises(ValueError, match=r"x must have entries of magnitude <= 8.5\d+e\+37, got max 3e\+38"):
        qz.quantize(torch.tensor([[3e38, -3e38] * 16]), 4, 32)
    x = torch.tensor([[qz.MAX_ABS, -qz.MAX_ABS] * 16])
    for bits in qz.SUPPORTED_BITS:
        q = qz.quantize(x, bits, 32)
        out = q.dequantize()
        assert torch.isfinite(q.scale).all() and torch.isfinite(out).all()
        assert torch.equal(out, x)  # two-valued groups decode exactly (codes 0 and qmax)


def test_quantize_check_finite_false_skips_the_check() -> None:
    x = torch.randn(1, 32)
    x[0, 0] = float("nan")
    q = qz.quantize(x, 4, 32, check_finite=False)  # the caller's promise; documented as undefined
    assert q.shape == x.shape


@pytest.mark.parametrize(
    "shape,match",
    [
        ((1, 2, 0, 16), "k must have every dimension >= 1"),
        ((1, 2, 32, 0), "q must have every dimension >= 1"),
    ],
)
def test_sparge_attention_empty_keys_or_head_dim(shape: tuple[int, ...], match: str) -> None:
    q = torch.randn(1, 2, 32, shape[-1])
    k = torch.randn(*shape)
    with pytest.raises(ValueError, match=match):
        sa.sparge_attention(q, k, k, block_q=16, block_k=16)


def test_negative_a_removed_validation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite has teeth: with quantize's finiteness check removed, the contract check fails."""
    spec = REGISTRY["quantization"][0]
    assert spec.name == "quantize"
    monkeypatch.setattr(qz, "check_tensor", lambda x, name, **kwargs: x)  # quantize's only check_tensor call
    with pytest.raises(AssertionError, match=r"x:nan: returned a result without an error"):
        spec.check()


def test_negative_an_unnamed_argument_is_caught() -> None:
    def quantize_without_names(x: torch.Tensor) -> object:
        if not bool(torch.isfinite(x).all()):
            raise ValueError("bad input")  # does not say which argument
        return qz.quantize(x, 4, 32)

    with pytest.raises(AssertionError, match="does not name the argument 'x'"):
        kt.check_hostile(quantize_without_names, {"x": _X}, arrays=("x",), kinds=("nan",))


def test_negative_a_torch_crash_is_caught() -> None:
    with pytest.raises(AssertionError, match="IndexError"):
        kt.check_hostile(lambda x: x[0, 5], {"x": _X}, arrays=("x",), kinds=("empty",))


def test_rejected_call_must_not_change_state() -> None:
    class Est:
        def __init__(self) -> None:
            self.w_ = torch.zeros(3)

        def fit(self, x: torch.Tensor) -> Est:
            self.w_ = x.sum(0)  # mutates before validating: the contract violation the check finds
            if not bool(torch.isfinite(x).all()):
                raise ValueError("x must be finite")
            return self

    est = Est()
    with pytest.raises(AssertionError, match="changed the state"):
        kt.check_hostile(est.fit, {"x": torch.ones(2, 3)}, arrays=("x",), kinds=("nan",), state_of=est)


# ------------------------------------------------------------------ the global-RNG rule and icml25.kernels.rng
def _draws_from_global(x: torch.Tensor) -> torch.Tensor:
    return x + torch.randn(x.shape)  # the defect: the caller's torch stream advances


def _draws_locally(x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    return x + torch.randn(x.shape, generator=make_generator(seed))


def test_valid_call_that_draws_from_the_global_generator_is_a_violation():
    example = {"x": torch.ones(3)}
    with pytest.raises(AssertionError, match="changed the global random state"):
        check_hostile(_draws_from_global, example, arrays=(), kinds=())
    # documented (the PyTorch convention for generator=None): accepted
    check_hostile(
        _draws_from_global, example, arrays=(), kinds=(), global_rng="generator=None draws globally"
    )
    check_hostile(_draws_locally, example, arrays=(), kinds=())


def test_valid_call_with_non_finite_result_is_a_violation():
    with pytest.raises(AssertionError, match="valid call returned non-finite"):
        check_hostile(lambda x: x / 0.0, {"x": torch.ones(2)}, arrays=(), kinds=())


def test_isolated_rng_restores_the_callers_stream_and_is_reproducible():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    with isolated_rng(7):
        a = torch.nn.Linear(3, 2).weight.detach().clone()
    assert torch.equal(torch.rand(4), expected)
    with isolated_rng(7):
        b = torch.nn.Linear(3, 2).weight.detach().clone()
    assert torch.equal(a, b)


def test_make_generator_is_local_and_validates():
    before = global_rng_state()
    g = make_generator(5)
    x = torch.randn(3, generator=g)
    assert torch.equal(x, torch.randn(3, generator=make_generator(5)))
    assert global_rng_state() == before
    assert make_generator(generator=g) is g
    with pytest.raises(TypeError, match="seed"):
        make_generator(1.5)
    with pytest.raises(ValueError, match="seed"):
        make_generator(-1)
    with pytest.raises(TypeError, match="generator"):
        make_generator(generator=np.random.default_rng(0))
