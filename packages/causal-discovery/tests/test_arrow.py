"""Tests of P54 ARROW (icml25.causal_discovery.arrow) and its quick reproduction."""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone

from icml25.causal_discovery.arrow import (
    ARROW,
    dependence_scores,
    granger_base,
    n_top,
    null_threshold,
    prune_candidates,
    rescue_candidates,
    simulate_svar,
    time_weave,
    to_networkx,
    xor_lag_scores,
)
from icml25.causal_discovery.arrow.lags import rank_bins


def random_walks(T: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(T, d)).cumsum(0)


# ------------------------------------------------------------------------------------ time weaving
def test_time_weave_hand_example_and_ties() -> None:
    x = np.array([0.0, 1.0, 1.0, 0.0, 2.0, 2.0 + 1e-12])
    bits, symbols = time_weave(x[:, None])
    # diffs: +1, 0 (tie -> down), -1, +2, +1e-12
    assert bits[:, 0].tolist() == [True, False, False, True, True]
    assert symbols[:, 0].tolist() == [2, 0, 1, 3]  # 2·b_p + b_{p+1}
    assert symbols.dtype == np.uint8 and symbols.shape == (4, 1)
    # eps turns small rises into "down"
    bits_eps, _ = time_weave(x[:, None], eps=1e-9)
    assert bits_eps[:, 0].tolist() == [True, False, False, True, False]


def test_time_weave_general_patch() -> None:
    x = np.array([0.0, 1.0, 2.0, 1.0, 3.0])  # bits 1 1 0 1
    _, sym4 = time_weave(x[:, None], patch=4)
    assert sym4[:, 0].tolist() == [0b110, 0b101]


# ------------------------------------------------------------------------------------- XOR lags
def official_scores(X: np.ndarray, lag_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Plain-Python transcription of the definition: effect stream from patch τ XOR cause stream."""
    T, d = X.shape
    n_p = T - 2
    codes = [
        [(int(X[p + 1, i] > X[p, i]), int(X[p + 2, i] > X[p + 1, i])) for p in range(n_p)] for i in range(d)
    ]
    tau_star = np.zeros((d, d), dtype=int)
    score = np.zeros((d, d))
    for i in range(d):
        for j in range(d):
            for tau in range(1, lag_max):
                k = [(a[0] ^ b[0]) + (a[1] ^ b[1]) for a, b in zip(codes[i][tau:], codes[j][: n_p - tau])]
                s = max(k.count(0), k.count(2)) / len(k)
                if s > score[i, j]:
                    score[i, j], tau_star[i, j] = s, tau
    return tau_star, score


@settings(max_examples=15, deadline=None)
@given(T=st.integers(8, 60), d=st.integers(1, 3), seed=st.integers(0, 10_000), data=st.data())
def test_xor_scores_equal_bruteforce(T: int, d: int, seed: int, data: st.DataObject) -> None:
    lag_max = data.draw(st.integers(2, T - 3))
    X = np.random.default_rng(seed).integers(0, 3, size=(T, d)).astype(float)  # many ties on purpose
    sc = xor_lag_scores(time_weave(X)[0], lag_max)
    tau_ref, score_ref = official_scores(X, lag_max)
    np.testing.assert_allclose(sc.score, score_ref, rtol=0, atol=1e-12)
    assert np.array_equal(sc.tau_star, tau_ref)
    assert np.all(sc.same[:, :, 0] == 0) and np.all(sc.opp[:, :, 0] == 0)


def test_shifted_copy_and_sign_flip() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=1500).cumsum()
    lead = 3
    y = np.roll(x, lead) + 1e-3 * rng.normal(size=1500)  # y(t) = x(t-3): x causes y at lag 3
    z = -np.roll(x, lead)
    X = np.stack([x, y, z], 1)[lead:]
    sc = xor_lag_scores(time_weave(X)[0], 20)
    assert sc.tau_star[1, 0] == 3 and sc.score[1, 0] >= 0.95
    assert sc.same[1, 0, 3] >= 0.95
    assert sc.tau_star[2, 0] == 3 and sc.score[2, 0] >= 0.95  # mirrored: the score comes from opp
    assert sc.opp[2, 0, 3] >= 0.95 and sc.same[2, 0, 3] < 0.05
    # direction: the lag is reported for (effect y <- cause x), not for (x <- y)
    assert sc.score[0, 1] < 0.4


def test_null_long_series_below_threshold() -> None:
    X = random_walks(2000, 6, seed=2)
    sc = xor_lag_scores(time_weave(X)[0], 100)
    off = ~np.eye(6, dtype=bool)
    assert sc.score[off].max() < 0.33


def test_null_short_series_rejected_by_null_threshold() -> None:
    X = random_walks(300, 6, seed=3)
    bits = time_weave(X)[0]
    sc = xor_lag_scores(bits, 30)
    off = ~np.eye(6, dtype=bool)
    assert sc.score[off].max() > 0.33  # the fixed threshold lets null pairs through at T = 300
    theta = null_threshold(bits, 30, n_shifts=10, rng=0)
    assert theta > sc.score[off].max()
    kept = prune_candidates(sc.score, sc.tau_star, theta=theta, k=2.0, include_self=False)
    assert kept == []
    assert null_threshold(bits, 30, n_shifts=10, rng=0) == theta  # deterministic given rng


# ------------------------------------------------------------------------------------- pruning
@settings(max_examples=40, deadline=None)
@given(d=st.integers(1, 7), k=st.floats(0.1, 2.0), theta=st.floats(0.0, 1.0), seed=st.integers(0, 1000))
def test_prune_is_global_threshold_plus_cap(d: int, k: float, theta: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    score = rng.choice([0.2, 0.3, 0.34, 0.5, 0.9], size=(d, d))  # ties on purpose
    tau = rng.integers(1, 5, size=(d, d))
    kept = prune_candidates(score, tau, theta=theta, k=k)
    cap = math.floor(k * d * d / 2)
    assert len(kept) <= cap
    # brute force: sort by (-score, effect, cause), filter > theta, take the first `cap`
    ref = sorted((-score[i, j], i, j) for i in range(d) for j in range(d) if score[i, j] > theta)[:cap]
    assert kept == [(i, j, int(tau[i, j])) for _, i, j in ref]


def test_prune_options() -> None:
    score = np.array([[0.9, 0.8, 0.7], [0.6, 0.5, 0.4], [0.35, 0.34, 0.2]])
    tau = np.arange(1, 10).reshape(3, 3)
    assert n_top(3, 0.5) == 2
    assert prune_candidates(score, tau) == [(0, 0, 1), (0, 1, 2)]
    assert prune_candidates(score, tau, k=2.0, include_self=False) == [
        (0, 1, 2),
        (0, 2, 3),
        (1, 0, 4),
        (1, 2, 6),
        (2, 0, 7),
        (2, 1, 8),
    ]
    assert prune_candidates(score, tau, k=2.0, per_target_cap=1) == [(0, 0, 1), (1, 0, 4), (2, 0, 7)]
    assert prune_candidates(score, tau, k=2.0, exclude=[0]) == [(1, 1, 5), (1, 2, 6), (2, 1, 8)]


# --------------------------------------------------------------------------------- the estimator
def test_no_pruning_reproduces_granger_base_exactly() -> None:
    X, _ = simulate_svar(d=5, T=400, rng=4)
    model = ARROW(base="granger", lag_max=4, theta=-np.inf, k=2.0, pad=4, readout="all").fit(X)
    base_graph, _ = model.run_base_only(X)
    assert model.graph_.shape == (5, 5, 4)
    assert np.array_equal(model.graph_, base_graph)
    assert np.array_equal(base_graph, granger_base(X, None, 3).astype(bool))


def test_no_pruning_reproduces_pcmci_exactly() -> None:
    pytest.importorskip("tigramite")
    X, _ = simulate_svar(d=4, T=300, n_parents=1, rng=5)
    kw = {"pc_alpha": 0.05, "alpha_level": 0.01}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # T < 1000 warning of the fixed threshold
        model = ARROW(
            base="pcmci", lag_max=4, theta=-np.inf, k=2.0, pad=4, readout="all", base_kwargs=kw
        ).fit(X)
        base_graph, _ = model.run_base_only(X)
    assert np.array_equal(model.graph_, base_graph)
    assert base_graph.sum() > 0


def test_arrow_pcmci_recovers_lags() -> None:
    pytest.importorskip("tigramite")
    X, truth = simulate_svar(d=6, T=1000, n_parents=1, rng=6)
    model = ARROW(base="pcmci", lag_max=6, base_kwargs={"pc_alpha": 0.05, "alpha_level": 0.01}).fit(X)
    cross = [(i, j, t) for i, j, t in zip(*np.nonzero(truth)) if i != j]
    assert np.mean([model.tau_star_[i, j] == t for i, j, t in cross]) >= 5 / 6
    assert np.mean([model.graph_[i, j, t] for i, j, t in cross]) >= 5 / 6
    assert set(model.timings_) == {"encode", "xor", "prune", "base", "total"}
    assert model.summary_.shape == (6, 6) and np.array_equal(model.summary_, model.graph_.any(-1))
    for i, j, t in model.candidates_:
        assert model.lags_[i, j] == t


@pytest.mark.slow  # `import lingam` alone takes 10-60 s on 2 busy cores
def test_varlingam_base_runs_restricted() -> None:
    pytest.importorskip("lingam")
    rng = np.random.default_rng(7)
    T = 600
    e = rng.uniform(-1, 1, size=(T, 3))  # non-Gaussian noise, as LiNGAM assumes
    X = np.zeros((T, 3))
    for t in range(3, T):
        X[t] = e[t] + np.array([0.3 * X[t - 1, 0], 0.8 * X[t - 2, 0], 0.8 * X[t - 3, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = ARROW(base="varlingam", lag_max=5, k=1.0).fit(X)
    assert model.graph_[1, 0, 2] and model.graph_[2, 1, 3]
    assert not model.graph_[0, 1].any() and not model.graph_[0, 2].any()


def test_callable_base_sees_only_kept_links() -> None:
    seen = {}

    def everything(X: np.ndarray, links: dict | None, tau_max: int) -> np.ndarray:
        seen["X"], seen["links"], seen["tau_max"] = X, links, tau_max
        return np.ones((X.shape[1], X.shape[1], tau_max + 1), dtype=bool)

    X, _ = simulate_svar(d=6, T=1000, rng=8)
    model = ARROW(base=everything, lag_max=6, self_lag1=False, fallback="none").fit(X)
    assert seen["tau_max"] == 5
    tested = {(i, j, t) for i, pairs in seen["links"].items() for j, t in pairs}
    assert tested == set(model.candidates_)
    assert {tuple(int(v) for v in e) for e in zip(*np.nonzero(model.graph_))} == tested

    ARROW(base=everything, lag_max=6, input="codes").fit(X)  # the official input: 4-state patch symbols
    assert seen["X"].shape == (X.shape[0] - 2, 6)
    assert set(np.unique(seen["X"])) <= {0.0, 1.0, 2.0, 3.0}


def test_pad_and_self_lag1_links() -> None:
    X, _ = simulate_svar(d=6, T=1000, rng=9)
    model = ARROW(base="granger", lag_max=6, pad=1, fallback="none", self_lag1=True).fit(X)
    for i, j, t in model.candidates_:
        for lag in (t - 1, t, t + 1):
            if 1 <= lag <= 5:
                assert (j, lag) in model.links_[i]
    assert all((i, 1) in model.links_[i] for i in range(6))
    # official default: no extra self-links, only the kept (cause, τ*) pairs are tested
    plain = ARROW(base="granger", lag_max=6, fallback="none").fit(X)
    assert {(i, j, t) for i, pairs in plain.links_.items() for j, t in pairs} == set(plain.candidates_)


def test_readout_pair_reads_each_pair_at_its_xor_lag_only() -> None:
    """readout="pair" (official): one decision per pair at (j, τ*_ij); "all" (ours): every tested link."""

    def everything(X: np.ndarray, links: dict | None, tau_max: int) -> np.ndarray:
        return np.ones((X.shape[1], X.shape[1], tau_max + 1), dtype=bool)

    X, _ = simulate_svar(d=6, T=1000, rng=8)
    pair = ARROW(base=everything, lag_max=6, pad=1, self_lag1=True).fit(X)
    every = clone(pair).set_params(readout="all").fit(X)
    assert pair.candidates_ == every.candidates_ and pair.links_ == every.links_
    tested = {(i, j, t) for i, pairs in every.links_.items() for j, t in pairs}
    assert {tuple(int(v) for v in e) for e in zip(*np.nonzero(every.graph_))} == tested
    expected = {(i, j, t) for i, j, t in tested if t == pair.tau_star_[i, j]}
    assert {tuple(int(v) for v in e) for e in zip(*np.nonzero(pair.graph_))} == expected
    assert set(pair.candidates_) <= expected  # every kept pair is tested at its own τ*
    assert (pair.graph_.sum(-1) <= 1).all() and pair.graph_.sum() < every.graph_.sum()
    assert ARROW().get_params()["readout"] == "pair" and ARROW().get_params()["self_lag1"] is False


def test_null_theta_is_deterministic() -> None:
    X, _ = simulate_svar(d=5, T=1000, rng=10)
    a = ARROW(base="granger", lag_max=6, theta="null", null_shifts=5, random_state=3).fit(X)
    b = clone(a).fit(X)
    assert a.theta_ == b.theta_ and a.candidates_ == b.candidates_
    assert 0.25 < a.theta_ < 0.4


def test_networkx_export() -> None:
    graph = np.zeros((3, 3, 4), dtype=bool)
    graph[1, 0, 2] = graph[1, 0, 3] = graph[2, 2, 1] = True
    G = to_networkx(graph, names=["a", "b", "c"], scores=np.full((3, 3), 0.5))
    assert set(G.nodes) == {"a", "b", "c"}
    assert set(G.edges) == {("a", "b"), ("c", "c")}
    assert G.edges["a", "b"]["lags"] == (2, 3) and G.edges["a", "b"]["lag"] == 2
    assert G.edges["a", "b"]["score"] == 0.5
    X, _ = simulate_svar(d=4, T=1000, rng=11)
    model = ARROW(base="granger", lag_max=6).fit(X)
    assert model.to_networkx().number_of_edges() == int(model.summary_.sum())


# ------------------------------------------------------------------------------------ bad inputs
def test_bad_inputs() -> None:
    X, _ = simulate_svar(d=3, T=1000, rng=12)
    with pytest.raises(ValueError, match="NaN"):
        Xn = X.copy()
        Xn[5, 1] = np.nan
        ARROW(base="granger", lag_max=6).fit(Xn)
    Xn = X.copy()
    Xn[5, 1] = np.nan
    model = ARROW(base="granger", lag_max=6, nan_policy="interpolate").fit(Xn)
    assert model.graph_.shape == (3, 3, 6)
    Xc = X.copy()
    Xc[:, 2] = 1.0
    with pytest.raises(ValueError, match="constant"):
        ARROW(base="granger", lag_max=6).fit(Xc)
    with pytest.warns(UserWarning, match="constant"):
        model = ARROW(base="granger", lag_max=6, constant_policy="exclude").fit(Xc)
    assert not model.graph_[:, 2].any() and all(2 not in (i, j) for i, j, _ in model.candidates_)
    with pytest.raises(ValueError, match="too short"):
        ARROW(base="granger", lag_max=998).fit(X)
    with pytest.raises(ValueError, match="lag_max must be >= 2"):
        ARROW(base="granger", lag_max=1).fit(X)
    with pytest.raises(ValueError, match="2-D"):
        ARROW(base="granger").fit(X[:, 0])
    with pytest.raises(TypeError, match="numeric"):
        ARROW(base="granger").fit(np.array([["a", "b"]] * 10))
    with pytest.raises(ValueError, match="base must be one of"):
        ARROW(base="surd", lag_max=6).fit(X)
    with pytest.raises(ValueError, match="theta"):
        ARROW(base="granger", lag_max=6, theta="auto").fit(X)
    with pytest.raises(ValueError, match="input"):
        ARROW(base="granger", lag_max=6, input="bins").fit(X)
    with pytest.raises(ValueError, match=r"readout must be one of \['pair', 'all'\], got 'any'"):
        ARROW(base="granger", lag_max=6, readout="any").fit(X)
    with pytest.raises(TypeError, match="self_lag1 must be a bool"):
        ARROW(base="granger", lag_max=6, self_lag1="yes").fit(X)
    with pytest.raises(ValueError, match="Complex data not supported: X must be a real array"):
        ARROW(base="granger", lag_max=6).fit(X + 1j)
    with pytest.raises(ValueError, match="bool array"):
        xor_lag_scores(X, 6)


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "tigramite" or m.startswith("tigramite.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tigramite", None)
    X, _ = simulate_svar(d=3, T=1000, rng=13)
    with pytest.raises(ImportError, match=r"icml25-causal-discovery\[tigramite\]"):
        ARROW(base="pcmci", lag_max=6).fit(X)


# ------------------------------------------------------------------- dependence rescue (issue 21)
def _no_edges(X: np.ndarray, links: dict | None, tau_max: int) -> np.ndarray:
    return np.zeros((X.shape[1], X.shape[1], tau_max + 1), dtype=bool)


def _cross_pair_recall(truth: np.ndarray, cands: list[tuple[int, int, int]]) -> float:
    pairs = {(i, j) for i, j, t in zip(*np.nonzero(truth)) if i != j}
    return len(pairs & {(i, j) for i, j, _ in cands}) / len(pairs)


def test_dependence_scores_equal_bruteforce_mi() -> None:
    rng = np.random.default_rng(20)
    X = rng.normal(size=(200, 3))
    X[2:, 1] += np.sin(1.5 * X[:-2, 0])  # x0 -> x1 at lag 2
    dep = dependence_scores(X, 4, bins=3)
    assert dep.df == 4 and dep.g.shape == (3, 3, 4) and np.all(dep.g[:, :, 0] == 0)
    codes = rank_bins(X, 3)
    assert np.all(np.bincount(codes[:, 0]) >= 66)  # equal-frequency bins
    for i, j, tau in [(1, 0, 2), (0, 2, 1), (2, 2, 3)]:
        a, b = codes[tau:, i], codes[: 200 - tau, j]
        n = len(a)
        mi = 0.0
        for u in range(3):
            for v in range(3):
                p = np.mean((a == u) & (b == v))
                if p > 0:
                    mi += p * np.log(p / (np.mean(a == u) * np.mean(b == v)))
        assert dep.g[i, j, tau] == pytest.approx(2 * n * mi, rel=1e-9, abs=1e-12)
    assert dep.tau_star[1, 0] == 2


def test_rescue_screen_finds_quadratic_link_only() -> None:
    rng = np.random.default_rng(21)
    T = 2000
    x = rng.normal(size=T)
    y = np.zeros(T)
    y[3:] = x[:-3] ** 2 + 0.3 * rng.normal(size=T - 3)  # symmetric link: zero linear correlation
    X = np.stack([x, y, rng.normal(size=T)], 1)
    assert abs(np.corrcoef(X[3:, 1], X[:-3, 0])[0, 1]) < 0.1
    rescued, _ = rescue_candidates(X, [], 6, include_self=False)
    assert (1, 0, 3) in rescued
    assert {(i, j) for i, j, _ in rescued} == {(1, 0)}  # the independent pairs stay out (family-wise 5%)


def test_rescue_raises_recall_on_non_monotone_svar() -> None:
    X, truth = simulate_svar(d=8, T=1000, link="sin", noise="laplace", rng=0)
    off = ARROW(base=_no_edges, lag_max=6).fit(X)
    on = ARROW(base=_no_edges, lag_max=6, rescue="dependence").fit(X)
    r_off, r_on = _cross_pair_recall(truth, off.candidates_), _cross_pair_recall(truth, on.candidates_)
    assert r_off <= 0.25  # measured 3/16 kept by the XOR step
    assert r_on >= 0.75 and r_on - r_off >= 0.5  # measured 13/16 with the screen
    assert on.candidates_[: len(off.candidates_)] == off.candidates_  # the rescue only adds pairs
    assert on.rescued_ == on.candidates_[len(off.candidates_) :] and on.rescued_
    assert len(on.rescued_) <= n_top(8, 0.5)
    assert "rescue" in on.timings_ and "rescue" not in off.timings_
    for i, j, t in on.rescued_:
        assert (j, t) in on.links_[i] and on.lags_[i, j] == t


def test_rescue_off_reproduces_old_candidates_exactly() -> None:
    X, _ = simulate_svar(d=8, T=1000, link="sin", noise="laplace", rng=1)
    model = ARROW(base=_no_edges, lag_max=6, rescue="none").fit(X)
    sc = xor_lag_scores(time_weave(X)[0], 6)
    assert model.candidates_ == prune_candidates(sc.score, sc.tau_star, 0.33, 0.5)
    assert model.rescued_ == []
    assert model.candidates_ == ARROW(base=_no_edges, lag_max=6).fit(X).candidates_  # default is off
    assert set(model.timings_) == {"encode", "xor", "prune", "base", "total"}


def test_rescue_bad_values_name_the_parameter() -> None:
    X, _ = simulate_svar(d=3, T=1000, rng=12)
    for kwargs, name in [
        ({"rescue": "mi"}, "rescue must be"),
        ({"rescue": None}, "rescue must be"),
        ({"rescue": "dependence", "rescue_bins": 1}, "rescue_bins"),
        ({"rescue": "dependence", "rescue_alpha": 0.0}, "rescue_alpha"),
        ({"rescue": "dependence", "rescue_alpha": 1.5}, "rescue_alpha"),
        ({"rescue": "dependence", "rescue_alpha": float("nan")}, "rescue_alpha"),
    ]:
        with pytest.raises(ValueError, match=name):
            ARROW(base="granger", lag_max=6, **kwargs).fit(X)
    with pytest.raises(TypeError, match="rescue_bins must be an int >= 2, got float"):
        ARROW(base="granger", lag_max=6, rescue="dependence", rescue_bins=4.0).fit(X)
    with pytest.raises(ValueError, match="rescue_bins"):
        dependence_scores(X, 6, bins=1)
    with pytest.raises(ValueError, match="rescue_alpha"):
        rescue_candidates(X, [], 6, alpha=0.0)


def test_simulate_svar_links_and_noise() -> None:
    X, truth = simulate_svar(d=4, T=500, link="sin", noise="laplace", rng=0)
    assert X.shape == (500, 4) and truth.shape == (4, 4, 6)
    with pytest.raises(ValueError, match="link"):
        simulate_svar(d=4, T=500, link="cube")
    with pytest.raises(ValueError, match="noise"):
        simulate_svar(d=4, T=500, noise="cauchy")


# ---------------------------------------------------------------- the official protocol's readout
def test_official_baseline_keeps_one_lag_per_cause_and_lag_metrics() -> None:
    from icml25.causal_discovery.experiments.arrow import lag_rates, one_lag_per_cause

    g = np.zeros((3, 3, 5), dtype=bool)
    g[1, 0, 2] = g[2, 0, 2] = g[2, 0, 4] = True  # cause 0: two edges at lag 2, one at lag 4 -> lag 2
    g[0, 1, 3] = g[2, 1, 1] = True  # cause 1: a tie between lags 1 and 3 -> the smaller, 1
    kept, lags = one_lag_per_cause(g)
    assert {tuple(int(v) for v in e) for e in zip(*np.nonzero(kept))} == {(1, 0, 2), (2, 0, 2), (2, 1, 1)}
    assert lags.tolist() == [[0, 0, 0], [2, 0, 0], [2, 1, 0]]
    truth = np.zeros((3, 3, 5), dtype=bool)
    truth[1, 0, 2] = truth[2, 1, 3] = truth[0, 0, 1] = True
    rates = lag_rates(truth, lags)  # true pairs: (1,0) right, (2,1) wrong lag, (0,0) missed; (2,0) extra
    assert rates["tpr"] == pytest.approx(1 / 3) and rates["fpr"] == pytest.approx(1 / 6)
    assert rates["auc"] == pytest.approx(0.5 * (1 + 1 / 3))


# --------------------------------------------------------------------------- quick reproduction
def test_threshold_text_is_the_checks() -> None:
    from icml25.causal_discovery.experiments import arrow as exp

    assert exp.threshold(True) == "quick: speedup >= 3x; quick: tau* accuracy >= 0.85"
    full = exp.threshold(False)
    assert "sin (non-monotone), rescue='dependence': F1 >= PCMCI - 0.02" in full
    assert "sin (non-monotone), rescue='dependence': speedup >= 2x" in full
    assert "linear: F1 >= PCMCI - 0.02" in full and "wide window: speedup >= 20x" in full


def test_quick_reproduction_passes(tmp_path) -> None:
    pytest.importorskip("tigramite")
    from icml25.causal_discovery.experiments.arrow import run

    report = run(quick=True, seed=0, out_dir=tmp_path)
    m = report.metrics
    assert report.paper == "P54"
    assert m["quick_speedup"] >= 3.0
    assert m["quick_tau_acc"] >= 0.85
    assert report.passed and all(report.checks.values())
    assert report.seeds == [0]
    assert report.figures and report.figures[0].exists()


def test_broken_variant_fails_quick_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """XOR lag scores shuffled across pairs (the lag discovery removed): tau* accuracy falls to chance."""
    pytest.importorskip("tigramite")
    from icml25.causal_discovery.arrow import estimator
    from icml25.causal_discovery.experiments import arrow as exp
    from icml25.kernels.experiment import evaluate_checks

    real = estimator.xor_lag_scores

    def shuffled(bits: np.ndarray, lag_max: int, **kwargs: object):
        sc = real(bits, lag_max, **kwargs)
        d = sc.score.shape[0]
        perm = np.random.default_rng(0).permutation(d * d)
        return type(sc)(*(a.reshape(d * d, *a.shape[2:])[perm].reshape(a.shape) for a in sc))

    monkeypatch.setattr(estimator, "xor_lag_scores", shuffled)
    metrics = exp.measure(exp.QUICK, seed=0)
    verdict = evaluate_checks(exp.checks(exp.QUICK), metrics)
    assert metrics["quick_tau_acc"] < 0.5
    assert verdict["quick: tau* accuracy >= 0.85"] is False
    assert not all(verdict.values())


@pytest.mark.slow
def test_full_reproduction_misses_exactly_the_linear_f1_check() -> None:
    """The full run (about 15 min on the shared 2-core CPU) as recorded in the results ledger: with the
    official defaults every check passes but ``linear: F1 >= PCMCI - 0.02`` (the catalog's known miss:
    the lag-1 self-links that the XOR step does not keep are never tested)."""
    pytest.importorskip("tigramite")
    from icml25.causal_discovery.experiments import arrow as exp

    report = exp.run(quick=False, seed=0)
    assert [name for name, ok in report.checks.items() if not ok] == ["linear: F1 >= PCMCI - 0.02"]
    m = report.metrics
    assert m["linear_f1_arrow_ours"] >= m["linear_f1_base"] - 0.02  # our variant keeps the self-links
    assert m["official_speedup"] > 1 and m["official_sum_tpr_arrow"] >= m["official_sum_tpr_base"]
