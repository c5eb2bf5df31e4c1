"""P48 optimal pursuit: the exact entry/exit criteria against brute-force refits, the enhanced algorithms
against independent implementations (OLS selection, scikit-learn's OMP, exhaustive search), the
scikit-learn estimator contract, bad inputs, and the quick reproduction gate."""

from __future__ import annotations

import itertools
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icml25.causal_discovery import best_subset as bs
from icml25.causal_discovery.best_subset import (
    OptimalPursuitRegressor,
    SelectionWarning,
    best_subset_exhaustive,
    entry_scores,
    exit_scores,
)

ALGOS = ("omp", "cosamp", "splicing")
PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rss(X: np.ndarray, y: np.ndarray, S) -> float:
    """f(S) = min_b ||y - X_S b||^2 by an explicit least-squares solve."""
    S = list(S)
    if not S:
        return float(y @ y)
    b = np.linalg.lstsq(X[:, S], y, rcond=None)[0]
    r = y - X[:, S] @ b
    return float(r @ r)


def problem(seed: int, n: int, p: int, scale_cols: bool = True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) @ (np.eye(p) + 0.4 * rng.normal(size=(p, p)) / np.sqrt(p))  # correlated
    if scale_cols:
        X *= rng.uniform(0.2, 5.0, size=p)
    y = X[:, : min(3, p)] @ rng.normal(size=min(3, p)) + 0.5 * rng.normal(size=n)
    return X, y


@st.composite
def problems(draw):
    n = draw(st.integers(6, 30))
    p = draw(st.integers(2, 9))
    k = draw(st.integers(0, min(n, p) - 1))
    seed = draw(st.integers(0, 2**31))
    X, y = problem(seed, n, p)
    S = sorted(np.random.default_rng(seed + 1).choice(p, size=k, replace=False).tolist())
    return X, y, S


# ------------------------------------------------------------------------------------------ exact criteria
@PROPS
@given(problems())
def test_entry_score_is_the_exact_decrease(case) -> None:
    X, y, S = case
    scores = entry_scores(X, y, S)
    f0 = rss(X, y, S)
    for j in range(X.shape[1]):
        if j in S:
            assert scores[j] == -np.inf
        else:
            np.testing.assert_allclose(scores[j], f0 - rss(X, y, [*S, j]), rtol=1e-7, atol=1e-9 * (y @ y))


@PROPS
@given(problems())
def test_exit_score_is_the_exact_increase(case) -> None:
    X, y, S = case
    if not S:
        S = [0]
    scores = exit_scores(X, y, S)
    f0 = rss(X, y, S)
    expected = [rss(X, y, [s for s in S if s != j]) - f0 for j in S]
    np.testing.assert_allclose(scores, expected, rtol=1e-7, atol=1e-9 * (y @ y))


@PROPS
@given(problems())
def test_classical_scores_are_partial_variations_and_never_beat_the_exact_ones(case) -> None:
    """Classical = the change with the other coefficients frozen; the exact change dominates it (the paper's
    optimality of the new criteria for one entry / one exit)."""
    X, y, S = case
    S = S or [0]
    beta = np.linalg.lstsq(X[:, S], y, rcond=None)[0]
    r = y - X[:, S] @ beta
    ent_c, ent_o = entry_scores(X, y, S, criterion="classical"), entry_scores(X, y, S)
    for j in set(range(X.shape[1])) - set(S):
        xj = X[:, j]
        frozen = r @ r - rss(xj[:, None], r, [0])  # only b_j fit
        np.testing.assert_allclose(ent_c[j], frozen, rtol=1e-7, atol=1e-9 * (y @ y))
        assert ent_o[j] >= ent_c[j] * (1 - 1e-9) - 1e-12 * (y @ y)
    ex_c, ex_o = exit_scores(X, y, S, criterion="classical"), exit_scores(X, y, S)
    for i, j in enumerate(S):
        frozen = np.sum((r + beta[i] * X[:, j]) ** 2) - r @ r  # others frozen
        np.testing.assert_allclose(ex_c[i], frozen, rtol=1e-7, atol=1e-9 * (y @ y))
        assert ex_o[i] <= ex_c[i] * (1 + 1e-9) + 1e-12 * (y @ y)


@PROPS
@given(problems(), st.floats(0.01, 100.0), st.integers(0, 2**31))
def test_exact_criteria_are_invariant_to_column_scales(case, y_scale: float, seed: int) -> None:
    X, y, S = case
    d = np.random.default_rng(seed).uniform(0.01, 100.0, size=X.shape[1])
    a, b = entry_scores(X, y, S), entry_scores(X * d, y * y_scale, S) / y_scale**2
    np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(a)], rtol=1e-6, atol=1e-10 * (y @ y))
    assert np.array_equal(np.isfinite(a), np.isfinite(b))
    if S:
        np.testing.assert_allclose(
            exit_scores(X, y, S), exit_scores(X * d, y * y_scale, S) / y_scale**2, rtol=1e-6
        )


def test_orthonormal_columns_make_both_criteria_coincide() -> None:
    rng = np.random.default_rng(3)
    Q = np.linalg.qr(rng.normal(size=(40, 12)))[0]
    y = Q[:, :4] @ rng.normal(size=4) + 0.3 * rng.normal(size=40)
    S = [1, 5, 7]
    np.testing.assert_allclose(
        entry_scores(Q, y, S), entry_scores(Q, y, S, criterion="classical"), rtol=1e-10
    )
    np.testing.assert_allclose(exit_scores(Q, y, S), exit_scores(Q, y, S, criterion="classical"), rtol=1e-10)
    for algo in ALGOS:
        fits = [
            OptimalPursuitRegressor(4, algorithm=algo, criterion=c, fit_intercept=False).fit(Q, y)
            for c in ("optimal", "classical")
        ]
        assert np.array_equal(fits[0].support_, fits[1].support_), algo
        np.testing.assert_allclose(fits[0].coef_, fits[1].coef_, atol=1e-12)


def test_collinear_candidates_score_minus_inf_without_dividing_by_zero() -> None:
    X, y = problem(4, 30, 6)
    X = np.column_stack([X, 2.5 * X[:, 1], X[:, 0] - X[:, 2]])  # 6 = 2.5 x1, 7 = x0 - x2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no divide-by-zero / invalid RuntimeWarning
        sc = entry_scores(X, y, [1, 0, 2])
    assert sc[6] == -np.inf and sc[7] == -np.inf and np.all(np.isfinite(sc[[3, 4, 5]]))
    with pytest.raises(ValueError, match="support must index linearly independent columns"):
        exit_scores(X, y, [1, 6])
    for algo in ALGOS:
        for crit in ("optimal", "classical"):
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                m = OptimalPursuitRegressor(5, algorithm=algo, criterion=crit).fit(X, y)
            assert not (m.support_[1] and m.support_[6]), (algo, crit)
            assert np.linalg.matrix_rank(X[:, m.support_]) == m.support_.sum(), (algo, crit)


# ------------------------------------------------------------------------------------------ the algorithms
def ols_selection(X: np.ndarray, y: np.ndarray, k: int) -> list[int]:
    """Orthogonal least squares by brute force: each step adds the column whose refit lowers f the most."""
    S: list[int] = []
    for _ in range(k):
        S.append(min((j for j in range(X.shape[1]) if j not in S), key=lambda j: rss(X, y, [*S, j])))
    return S


@pytest.mark.parametrize("seed", range(5))
def test_op_omp_is_ols_selection(seed: int) -> None:
    X, y = problem(10 + seed, 40, 15)
    m = OptimalPursuitRegressor(6, algorithm="omp", fit_intercept=False).fit(X, y)
    assert m.active_.tolist() == ols_selection(X, y, 6)
    np.testing.assert_allclose(m.objective_path_, [rss(X, y, m.active_[:t]) for t in range(7)], rtol=1e-9)


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_classical_omp_reproduces_scikit_learn(fit_intercept: bool) -> None:
    from sklearn.linear_model import OrthogonalMatchingPursuit

    for seed in range(10):
        X, y = problem(100 + seed, 50, 20)
        ref = OrthogonalMatchingPursuit(n_nonzero_coefs=5, fit_intercept=fit_intercept).fit(X, y)
        ours = OptimalPursuitRegressor(5, algorithm="omp", criterion="classical", fit_intercept=fit_intercept)
        ours.fit(X, y)
        assert np.array_equal(ours.support_, ref.coef_ != 0), seed
        np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)


def test_op_omp_differs_from_omp_on_unnormalised_columns() -> None:
    """The exact entry ignores column scale; raw correlation does not (the paper's point on normalisation)."""
    X, y = problem(7, 50, 20)
    d = np.ones(20)
    d[10:] = 50.0
    a = OptimalPursuitRegressor(5, algorithm="omp").fit(X, y).active_
    b = OptimalPursuitRegressor(5, algorithm="omp").fit(X * d, y).active_
    c = OptimalPursuitRegressor(5, algorithm="omp", criterion="classical").fit(X, y).active_
    e = OptimalPursuitRegressor(5, algorithm="omp", criterion="classical").fit(X * d, y).active_
    assert a.tolist() == b.tolist() and c.tolist() != e.tolist()


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("batch", ["official", "sequential"])
def test_objective_path_and_least_squares_coefficients(algo: str, batch: str) -> None:
    for seed in range(4):
        X, y = problem(200 + seed, 60, 25)
        for crit in ("optimal", "classical"):
            m = OptimalPursuitRegressor(6, algorithm=algo, criterion=crit, batch=batch).fit(X, y)
            S = m.active_
            assert len(S) == 6 and m.support_.sum() == 6
            Xc, yc = X - X.mean(0), y - y.mean()
            np.testing.assert_allclose(m.coef_[S], np.linalg.lstsq(Xc[:, S], yc, rcond=None)[0], rtol=1e-8)
            assert np.all(m.coef_[~m.support_] == 0)
            np.testing.assert_allclose(m.objective_path_[-1], rss(Xc, yc, S), rtol=1e-9)
            np.testing.assert_allclose(m.score(X, y), 1 - rss(Xc, yc, S) / (yc @ yc), rtol=1e-9)
            if algo != "cosamp":  # OMP adds, splicing accepts only improving swaps: monotone
                assert np.all(np.diff(m.objective_path_) <= 1e-12 * (yc @ yc)), (crit, m.objective_path_)
            if algo == "splicing":  # every accepted swap lowers ||r|| by more than splice_tol * ||y||
                assert np.all(np.diff(np.sqrt(m.objective_path_)) < -m.splice_tol * np.sqrt(yc @ yc))


@pytest.mark.parametrize("batch", ["official", "sequential"])
def test_splicing_stops_where_no_exchange_improves(batch: str) -> None:
    """At the returned support, the single exchange the rule proposes (exit by the smallest exit score; entry
    by the entry score at the current support, or after the exit for ``sequential``) does not lower
    ``||r||`` by more than the acceptance margin, recomputed here with the public scores and lstsq."""
    for seed in range(5):
        X, y = problem(300 + seed, 50, 30)
        for crit in ("optimal", "classical"):
            m = OptimalPursuitRegressor(5, criterion=crit, exchange_max=1, batch=batch, fit_intercept=False)
            S = m.fit(X, y).active_.tolist()
            out = S[int(np.argmin(exit_scores(X, y, S, criterion=crit)))]
            rest = [s for s in S if s != out]
            ent = entry_scores(X, y, S if batch == "official" else rest, criterion=crit)
            ent[S] = -np.inf
            new = int(np.argmax(ent))
            margin = m.splice_tol * np.linalg.norm(y)
            assert np.sqrt(rss(X, y, [*rest, new])) >= np.sqrt(rss(X, y, S)) - margin - 1e-12
            assert m.n_iter_ == len(m.objective_path_)  # every accepted round, plus the final rejected one


def test_incremental_and_from_scratch_factorisations_agree() -> None:
    X, y = problem(5, 40, 12)
    Xs, ys, *_ = bs._scaled(X, y, center=False)
    pb = bs._Problem.build(Xs, ys, 1e-10)
    inc = bs._Fit(pb, track=True)
    S = [3, 0, 7, 11, 5]
    for j in S:
        assert inc.append(j)
    ref = bs._Fit.from_support(pb, S)
    for name in ("L", "z", "beta", "residual"):
        np.testing.assert_allclose(getattr(inc, name), getattr(ref, name), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(inc.W, np.linalg.solve(ref.L, pb.G[S]), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(inc.proj_norms2(), ref.proj_norms2(), rtol=1e-9, atol=1e-12)
    Q = np.linalg.qr(Xs[:, S])[0]  # the projector from a QR of X_S
    np.testing.assert_allclose(ref.proj_norms2(), np.sum((Xs - Q @ (Q.T @ Xs)) ** 2, axis=0), atol=1e-10)
    assert not inc.append(3)  # already active
    dup = np.column_stack([Xs, Xs[:, 0] + Xs[:, 7]])
    pb2 = bs._Problem.build(dup, ys, 1e-10)
    assert bs._Fit.from_support(pb2, [0, 7, 12]) is None


def test_exhaustive_search_agreement_on_small_problems() -> None:
    X, y = problem(9, 25, 8)
    S, best = best_subset_exhaustive(X, y, 3)
    assert best == pytest.approx(min(rss(X, y, c) for c in itertools.combinations(range(8), 3)), rel=1e-10)
    assert best == pytest.approx(rss(X, y, S), rel=1e-10)
    # k = 1: the exact entry from the empty set is the best single column, whatever the column scales
    for seed in range(10):
        X, y = problem(400 + seed, 25, 8)
        S1, _ = best_subset_exhaustive(X, y, 1)
        assert OptimalPursuitRegressor(1, algorithm="omp", fit_intercept=False).fit(
            X, y
        ).active_.tolist() == [S1[0]]
        # one exact exit from the full set is the best (p - 1)-subset
        drop = int(np.argmin(exit_scores(X, y, list(range(8)))))
        assert sorted(set(range(8)) - {drop}) == best_subset_exhaustive(X, y, 7)[0].tolist()
    # on small compressed-sensing problems (uniform [0, 1], unit-norm columns, noiseless) the exact criteria
    # reach the global optimum more often, for OMP and for splicing
    hits = {(a, c): 0 for a in ("omp", "splicing") for c in ("optimal", "classical")}
    for seed in range(40):
        rng = np.random.default_rng(seed)
        X = rng.random((10, 16))
        X /= np.linalg.norm(X, axis=0)
        beta = np.zeros(16)
        beta[rng.choice(16, 3, replace=False)] = rng.normal(size=3)
        y = X @ beta
        _, best = best_subset_exhaustive(X, y, 3)
        for a, c in hits:
            m = OptimalPursuitRegressor(3, algorithm=a, criterion=c, fit_intercept=False, splice_tol=0.0)
            hits[a, c] += m.fit(X, y).objective_path_[-1] <= best * (1 + 1e-9) + 1e-12
    assert hits["omp", "optimal"] > hits["omp", "classical"], hits
    assert (
        hits["splicing", "optimal"] > hits["splicing", "classical"] and hits["splicing", "optimal"] >= 30
    ), hits


@PROPS
@given(st.integers(0, 2**31), st.sampled_from(ALGOS), st.sampled_from(("optimal", "classical")))
def test_estimator_is_equivariant_to_column_permutations_and_shifts(seed: int, algo: str, crit: str) -> None:
    X, y = problem(seed, 40, 12, scale_cols=False)
    perm = np.random.default_rng(seed).permutation(12)
    a = OptimalPursuitRegressor(4, algorithm=algo, criterion=crit).fit(X, y)
    b = OptimalPursuitRegressor(4, algorithm=algo, criterion=crit).fit(X[:, perm] + 3.0, y - 7.0)
    assert np.array_equal(a.support_[perm], b.support_)
    np.testing.assert_allclose(a.coef_[perm], b.coef_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(a.predict(X), b.predict(X[:, perm] + 3.0) + 7.0, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------ scikit-learn
@pytest.mark.parametrize("algo", ALGOS)
def test_passes_scikit_learn_check_estimator(algo: str) -> None:
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(OptimalPursuitRegressor(algorithm=algo))


def test_works_inside_scikit_learn_model_selection() -> None:
    from sklearn.feature_selection import SelectFromModel
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = problem(11, 80, 15)
    grid = GridSearchCV(
        make_pipeline(StandardScaler(), OptimalPursuitRegressor()),
        {
            "optimalpursuitregressor__n_nonzero_coefs": [1, 3, 6],
            "optimalpursuitregressor__criterion": list(bs.CRITERIA),
        },
        cv=3,
    ).fit(X, y)
    assert grid.best_params_["optimalpursuitregressor__n_nonzero_coefs"] >= 3 and grid.best_score_ > 0.5
    sel = SelectFromModel(OptimalPursuitRegressor(4), threshold=1e-12).fit(X, y)
    assert sel.get_support().sum() == 4 and np.array_equal(sel.get_support(), sel.estimator_.support_)


# ------------------------------------------------------------------------------------------ bad inputs
def test_n_nonzero_coefs_larger_than_the_problem_is_rejected() -> None:
    X, y = problem(1, 10, 6)
    with pytest.raises(ValueError, match=r"n_nonzero_coefs must be <= min\(n_samples, n_features\)"):
        OptimalPursuitRegressor(7).fit(X, y)
    with pytest.raises(ValueError, match=r"n_nonzero_coefs must be <= min"):
        OptimalPursuitRegressor(5).fit(X[:4], y[:4])
    with pytest.raises(ValueError, match="n_nonzero_coefs must be an int >= 1"):
        OptimalPursuitRegressor(0).fit(X, y)
    with pytest.raises(TypeError, match="n_nonzero_coefs must be an int"):
        OptimalPursuitRegressor(2.5).fit(X, y)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_X_or_y_is_rejected(bad: float) -> None:
    X, y = problem(1, 20, 5)
    Xb, yb = X.copy(), y.copy()
    Xb[3, 2], yb[4] = bad, bad
    with pytest.raises(ValueError, match="X"):
        OptimalPursuitRegressor(2).fit(Xb, y)
    with pytest.raises(ValueError, match="y"):
        OptimalPursuitRegressor(2).fit(X, yb)
    with pytest.raises(ValueError, match="X"):
        entry_scores(Xb, y)
    with pytest.raises(ValueError, match="y"):
        exit_scores(X, yb, [0])


def test_zero_column_is_excluded_with_a_warning() -> None:
    X, y = problem(2, 30, 6)
    X[:, 2] = 0.0
    X[:, 4] = 3.7  # constant: zero once centred
    for algo in ALGOS:
        with pytest.warns(SelectionWarning, match=r"X has 2 constant column\(s\) \[2, 4\]"):
            m = OptimalPursuitRegressor(4, algorithm=algo).fit(X, y)
        assert not m.support_[2] and not m.support_[4] and m.support_.sum() == 4
    with pytest.warns(SelectionWarning) as record:
        OptimalPursuitRegressor(5, algorithm="omp").fit(X, y)
    assert any("selected 4 of n_nonzero_coefs=5" in str(w.message) for w in record)
    with pytest.warns(SelectionWarning, match=r"zero column\(s\) \[2\]"):
        OptimalPursuitRegressor(3, fit_intercept=False).fit(X, y)
    assert entry_scores(X, y)[2] == -np.inf
    with pytest.raises(ValueError, match="support must not contain zero columns"):
        exit_scores(X, y, [2])


def test_y_of_the_wrong_length_is_rejected() -> None:
    X, y = problem(1, 20, 5)
    with pytest.raises(ValueError, match=r"y must hold one target per row of X \(20 rows\), got 19"):
        OptimalPursuitRegressor(2).fit(X, y[:-1])
    with pytest.raises(ValueError, match="y must hold one target per row"):
        entry_scores(X, y[:-1])
    with pytest.raises(ValueError, match="y should be a 1d array"):
        OptimalPursuitRegressor(2).fit(X, np.column_stack([y, y]))


def test_unknown_options_are_rejected_with_the_choices() -> None:
    X, y = problem(1, 20, 5)
    with pytest.raises(
        ValueError, match=r"algorithm must be one of \['omp', 'cosamp', 'splicing'\], got 'iht'"
    ):
        OptimalPursuitRegressor(2, algorithm="iht").fit(X, y)
    with pytest.raises(ValueError, match=r"criterion must be one of \['optimal', 'classical'\]"):
        OptimalPursuitRegressor(2, criterion="wald").fit(X, y)
    with pytest.raises(ValueError, match=r"batch must be one of \['official', 'sequential'\]"):
        OptimalPursuitRegressor(2, batch="greedy").fit(X, y)
    with pytest.raises(ValueError, match=r"criterion must be one of"):
        entry_scores(X, y, criterion="abess")
    for name, value in (
        ("tol", 0.0),
        ("tol", float("nan")),
        ("splice_tol", -1.0),
        ("exchange_max", 0),
        ("max_iter", 0),
    ):
        with pytest.raises(ValueError, match=name):
            OptimalPursuitRegressor(2, **{name: value}).fit(X, y)
    with pytest.raises(ValueError, match=r"support must hold column indices in \[0, 5\), got \[9\]"):
        entry_scores(X, y, [9])
    with pytest.raises(ValueError, match="support must hold distinct"):
        exit_scores(X, y, [1, 1])


def test_rejected_fit_keeps_the_fitted_state() -> None:
    from icml25.kernels import testing as kt

    X, y = problem(1, 20, 5)
    m = OptimalPursuitRegressor(2).fit(X, y)
    before = kt.snapshot_state(m)
    Xb = X.copy()
    Xb[0, 0] = np.nan
    for call in (
        lambda: m.fit(Xb, y),
        lambda: m.fit(X, y[:-1]),
        lambda: m.set_params(algorithm="x").fit(X, y),
    ):
        with pytest.raises(ValueError):
            call()
    m.set_params(algorithm="splicing")
    assert kt.states_equal(before, kt.snapshot_state(m))
    with pytest.raises(ValueError, match="OptimalPursuitRegressor is not fitted: call fit"):
        OptimalPursuitRegressor().predict(X)


def test_exhaustive_search_refuses_large_problems() -> None:
    X, y = problem(1, 30, 25)
    with pytest.raises(ValueError, match="max_subsets"):
        best_subset_exhaustive(X, y, 12)


# ------------------------------------------------------------------------------------------ reproduction
def test_quick_reproduction_passes_its_gate() -> None:
    from icml25.causal_discovery.experiments import best_subset as exp

    t0 = time.perf_counter()
    report = exp.run(quick=True, seed=0)
    elapsed = time.perf_counter() - t0
    assert report.passed is True, report.checks
    m = report.metrics
    assert m["cs_omp_gain"] >= 0.05 and m["cs_splicing_gain"] >= 0.0
    assert m["reg_omp_max_excess"] <= 1e-9 and m["reg_splicing_max_excess"] <= 1e-9
    assert elapsed < 60, elapsed


def test_broken_variant_fails_the_quick_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact criteria replaced by the same scores shuffled across candidates (the mechanism removed)."""
    from icml25.causal_discovery.experiments import best_subset as exp
    from icml25.kernels.experiment import evaluate_checks

    rng = np.random.default_rng(0)
    real_entry, real_exit = bs._optimal_entry, bs._optimal_exit

    def shuffled_entry(fit):
        s = real_entry(fit)
        ok = np.isfinite(s)
        s[ok] = rng.permutation(s[ok])
        return s

    monkeypatch.setattr(bs, "_optimal_entry", shuffled_entry)
    monkeypatch.setattr(bs, "_optimal_exit", lambda fit: rng.permutation(real_exit(fit)))
    metrics = exp.measure(exp.QUICK, seed=0)
    verdict = evaluate_checks(exp.checks(exp.QUICK), metrics)
    assert metrics["cs_omp_gain"] < 0 and metrics["cs_splicing_gain"] < 0
    assert not any(verdict.values()), verdict
