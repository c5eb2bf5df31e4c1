"""P34 Measuring Diversity: closed forms, invariances, hard-coded counterexamples, brute force vs networkx,
bad inputs, the audit and the quick reproduction (with broken variants that must fail its gate)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.interpretability import diversity as dv
from icml25.interpretability import diversity_axioms as da
from icml25.interpretability.experiments import diversity_axioms as exp

ALL = [
    dv.APD(),
    dv.Diameter(),
    dv.Bottleneck(),
    dv.NNMean(),
    dv.NumDistinct(),
    dv.Circles(0.5),
    dv.Energy(1.0),
    dv.VendiScore(0.5),
    dv.Magnitude(2.0),
    dv.LogDet(0.5),
]


def line(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float64)[:, None]


# ---- closed forms (brief §7) ----


def test_apd_equilateral_triangle_is_one() -> None:
    tri = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]])
    assert dv.APD()(tri, is_distance=False) == pytest.approx(1.0, abs=1e-12)
    D = 1.0 - np.eye(3)
    assert dv.APD()(D, is_distance=True) == 1.0


def test_vendi_closed_forms() -> None:
    assert dv.vendi_from_kernel(np.ones((4, 4))) == pytest.approx(1.0)
    assert dv.vendi_from_kernel(np.eye(5)) == pytest.approx(5.0)
    assert dv.VendiScore(1.0)(np.zeros((4, 3)), is_distance=False) == pytest.approx(1.0)
    far = np.arange(4.0)[:, None] * 100  # Gaussian kernel ~ I
    assert dv.VendiScore(1.0)(far, is_distance=False) == pytest.approx(4.0)


@pytest.mark.parametrize("r", [0.1, 1.0, 3.0])
def test_magnitude_two_points(r: float) -> None:
    D = np.array([[0.0, r], [r, 0.0]])
    assert dv.Magnitude(1.0)(D, is_distance=True) == pytest.approx(2 / (1 + math.exp(-r)), rel=1e-12)
    # a duplicate: the magnitude of a single point
    assert dv.Magnitude(1.0)(np.zeros((2, 2)), is_distance=True) == pytest.approx(1.0)


def test_energy_and_logdet_of_a_duplicate_are_minus_inf() -> None:
    X = line(0.0, 1.0, 1.0)
    assert dv.Energy(1.0)(X) == -math.inf
    assert dv.LogDet(1.0)(X) == -math.inf
    assert dv.Energy(1.0)(line(0.0, 1.0, 3.0)) == pytest.approx(-(1 + 1 / 3 + 1 / 2) / 3)


def test_simple_measures_on_a_line() -> None:
    X = line(0.0, 1.0, 3.0)
    assert dv.Diameter()(X) == 3.0
    assert dv.Bottleneck()(X) == 1.0
    assert dv.NNMean()(X) == pytest.approx((1 + 1 + 2) / 3)
    assert dv.NumDistinct()(line(0.0, 1.0, 1.0, 2.0)) == 3.0
    assert dv.Circles(1.5)(line(0.0, 1.0, 2.0, 3.0)) == 2.0
    assert dv.Circles(1.0)(line(0.0, 1.0, 2.0, 3.0)) == 4.0


# ---- invariances ----


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_permutation_and_rigid_motion_invariance(seed: int) -> None:
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, size=(6, 2))
    theta = rng.uniform(0, 2 * np.pi)
    R = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    Y = (X @ R.T + rng.normal(size=2))[rng.permutation(6)]
    for m in ALL:
        a, b = m(X, is_distance=False), m(Y, is_distance=False)
        if isinstance(m, (dv.NumDistinct, dv.Circles)):  # integer-valued (random points: no ties at t)
            assert a == b, m.name
        else:
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), m.name


def test_torch_points_accepted() -> None:
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    assert dv.Diameter()(X) == pytest.approx(math.sqrt(5))


def test_jaccard_on_bit_vectors() -> None:
    B = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 1]])
    D = dv.pairwise(B, metric="jaccard")
    assert D[0, 1] == pytest.approx(0.5)
    assert D[0, 2] == 1.0
    with pytest.raises(ValueError, match="0/1 bit vectors"):
        dv.pairwise(B * 0.5, metric="jaccard")


# ---- hard-coded counterexamples (brief §7) ----


def test_apd_uniqueness_counterexample() -> None:
    apd = dv.APD()
    assert apd(line(0.0, 1.0, 1.0)) == pytest.approx(2 / 3)
    assert apd(line(0.0, 1.0, 0.5)) == pytest.approx(2 / 3)  # the duplicate scores as high as a new point


def test_bottleneck_strict_monotonicity_counterexample() -> None:
    b = dv.Bottleneck()
    assert b(line(0.0, 1.0, 3.0)) == b(line(0.0, 1.0, 4.0)) == 1.0  # distances rose, diversity did not


def test_num_distinct_continuity_counterexample() -> None:
    nd = dv.NumDistinct()
    for eps in (1e-2, 1e-6, 1e-12):
        assert nd(line(0.0, eps)) - nd(line(0.0, 0.0)) == 1.0  # the jump does not shrink with eps


def test_metric_push_keeps_the_triangle_inequality() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        D = dv.pairwise(rng.uniform(size=(7, 3)))
        D2 = da.metric_push(D, int(rng.integers(7)), float(rng.uniform(0, 2)))
        dv.distance_matrix(D2, is_distance=True)  # raises if not a metric
        assert np.all(D2 >= D)


# ---- brute force vs networkx ----


@pytest.mark.parametrize("seed", range(12))
def test_max_clique_brute_force_matches_networkx(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 13))
    A = rng.uniform(size=(n, n)) < rng.uniform(0.2, 0.8)
    A = np.triu(A, 1)
    A = A | A.T
    assert dv.max_clique_size(A, method="brute") == dv.max_clique_size(A, method="networkx")


def test_circles_beyond_brute_force_uses_networkx() -> None:
    X = np.random.default_rng(0).uniform(size=(20, 2))
    D = dv.pairwise(X)
    assert dv.Circles(0.3)(X) == dv.max_clique_size(D >= 0.3, method="networkx")


# ---- the audit ----


def test_audit_finds_and_verifies_the_provable_failures() -> None:
    res = da.audit(dv.APD(), n=5, trials=100)
    assert res["M"].passed and res["C"].passed and not res["U"].passed
    assert res["U"].verified is True and res["U"].violations > 0
    res = da.audit(dv.Bottleneck(), axioms=("M",), n=5, trials=60)
    assert not res["M"].passed and res["M"].verified
    assert da.audit(dv.Bottleneck(), axioms=("M",), n=5, trials=60, strict=False)[
        "M"
    ].passed  # weakly monotone
    assert not da.audit(dv.Circles(0.5), axioms=("C",), n=5, trials=100)["C"].passed


def test_audit_energy_continuity_fails_only_as_real_valued() -> None:
    res = da.audit(dv.Energy(1.0), n=5, trials=50)
    assert res["M"].passed and res["U"].passed
    assert not res["C"].passed and res["C"].counterexample["value"] == -math.inf


def test_verification_rejects_a_fake_counterexample() -> None:
    fake = da.AxiomResult(
        "U", False, 1, 1, {"D_before": dv.pairwise(line(0, 1, 1)), "D_after": dv.pairwise(line(0, 1, 2))}
    )
    assert da.verify_counterexample(dv.Bottleneck(), fake) is False
    assert da.verify_counterexample(dv.APD(), fake) is False  # APD does rise with a far new point


def test_audit_table_rows() -> None:
    rows = da.audit_table([dv.APD(), dv.Diameter()], n=4, trials=40)
    assert [r["measure"] for r in rows] == ["APD", "Diameter"]
    assert rows[1]["M"] is False and rows[1]["verified"] is True


# ---- bad inputs (brief §8) ----


def test_bad_distance_matrices_raise() -> None:
    D = dv.pairwise(line(0.0, 1.0, 3.0))
    bad_sym = D.copy()
    bad_sym[0, 1] += 0.5
    with pytest.raises(ValueError, match="symmetric"):
        dv.APD()(bad_sym, is_distance=True)
    bad_diag = D + np.eye(3)
    with pytest.raises(ValueError, match="zero diagonal"):
        dv.APD()(bad_diag, is_distance=True)
    neg = -D
    with pytest.raises(ValueError, match="non-negative"):
        dv.APD()(neg, is_distance=True)
    tri = np.array([[0, 1, 5], [1, 0, 1], [5, 1, 0]], dtype=float)
    with pytest.raises(ValueError, match="triangle inequality"):
        dv.APD()(tri, is_distance=True)
    assert dv.APD()(tri, is_distance=True, check_metric=False) == pytest.approx(7 / 3)


def test_non_finite_points_raise() -> None:
    with pytest.raises(ValueError, match=r"X must be finite \(no NaN or inf\), got 1 NaN and 0 inf"):
        dv.APD()(np.array([[0.0, np.nan, 1.0]]).T)
    with pytest.raises(ValueError, match=r"X must be finite \(no NaN or inf\), got 0 NaN and 1 inf"):
        dv.APD()(np.array([[0.0, np.inf, 1.0]]).T)


def test_non_numeric_or_complex_points_raise_type_errors_naming_the_argument() -> None:
    """Points and kernels go through icml25.kernels.checks.check_array: its messages; bools and ints pass."""
    with pytest.raises(TypeError, match=r"^X must be a float or int or bool array, got .* dtype complex128"):
        dv.pairwise(np.array([[0.0, 1j], [1.0, 0.0]]))
    with pytest.raises(
        TypeError, match=r"^K must be a numeric array, got numpy.ndarray of shape \(\) and dtype <U"
    ):
        dv.vendi_from_kernel("identity")
    with pytest.raises(ValueError, match=r"^K must be finite \(no NaN or inf\), got 1 NaN"):
        dv.vendi_from_kernel(np.array([[1.0, np.nan], [np.nan, 1.0]])[:1, :1] * np.nan)
    np.testing.assert_array_equal(
        dv.pairwise(np.array([[0, 1], [1, 1]])), dv.pairwise([[0.0, 1.0], [1.0, 1.0]])
    )


def test_fewer_than_two_points_raise() -> None:
    with pytest.raises(ValueError, match="at least 2 points"):
        dv.APD()(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="at least 2 points"):
        dv.APD()(np.zeros((1, 1)), is_distance=True)


@pytest.mark.parametrize("make", [dv.VendiScore, dv.LogDet, dv.Magnitude, dv.Energy, dv.Circles])
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_bandwidth_must_be_positive(make, value) -> None:
    with pytest.raises(ValueError, match=r"must be a finite float in \(0, inf\), got"):
        make(value)


def test_np_hard_measure_above_its_cap_raises() -> None:
    X = np.random.default_rng(0).uniform(size=(30, 2))
    with pytest.raises(ValueError, match=r"NP-hard.*n = 30.*max_n = 20"):
        dv.Circles(0.3, max_n=20)(X)
    with pytest.raises(ValueError, match=r"enumerates 2\^n"):
        dv.max_clique_size(np.ones((25, 25), bool), method="brute")


def test_square_input_needs_is_distance() -> None:
    with pytest.raises(ValueError, match="square: pass is_distance=True"):
        dv.APD()(np.zeros((3, 3)))
    assert dv.APD()(np.eye(3), is_distance=False) == pytest.approx(math.sqrt(2))
    with pytest.raises(ValueError, match="must be a square"):
        dv.APD()(np.zeros((3, 2)), is_distance=True)


def test_audit_argument_errors() -> None:
    with pytest.raises(TypeError, match="DiversityMeasure"):
        da.audit(lambda D: 0.0)
    with pytest.raises(ValueError, match="axioms"):
        da.audit(dv.APD(), axioms=("X",))
    with pytest.raises(ValueError, match="n must be an int >= 3, got 2"):
        da.audit(dv.APD(), n=2)
    with pytest.raises(ValueError, match="measures must be a non-empty"):
        da.audit_table([])


# ---- the reproduction ----


def test_quick_run_passes() -> None:
    report = exp.run(quick=True)
    assert report.passed, report.checks
    assert report.metrics["audit_entries_matched"] == 13
    assert report.metrics["apd_min_dist"] < 0.05
    assert min(report.metrics["energy_min_dist"], report.metrics["bottleneck_min_dist"]) > 0.25


def _never_searches(measure, axioms=da.AXIOMS, **kwargs):
    return {a: da.AxiomResult(a, True, 0, 0) for a in axioms}


def _bottleneck_over_the_diagonal(X: torch.Tensor, tau: float) -> torch.Tensor:
    d = torch.sqrt(((X[..., :, None, :] - X[..., None, :, :]) ** 2).sum(-1) + 1e-12)  # includes d_ii ~ 0
    return -tau * torch.logsumexp(-d.flatten(-2) / tau, dim=-1)


def test_an_audit_that_never_searches_fails_the_gate() -> None:
    report = exp.evaluate(exp.QUICK, audit_fn=_never_searches)
    assert not report.passed
    assert not report.checks["all 13 provable audit entries match"]


def test_a_bottleneck_over_the_diagonal_fails_the_gate() -> None:
    objectives = dict(exp.OBJECTIVES, bottleneck=_bottleneck_over_the_diagonal)
    report = exp.evaluate(exp.QUICK, objectives=objectives)
    assert not report.passed
    assert report.metrics["bottleneck_min_dist"] < 0.25
