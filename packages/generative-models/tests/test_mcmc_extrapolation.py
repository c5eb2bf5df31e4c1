"""P20 Learning extrapolative sequence transformations from Markov chains: correctness, bad inputs, quick gate."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from icml25.generative_models import mcmc_extrapolation as mx
from icml25.generative_models.experiments import mcmc_extrapolation as exp
from icml25.kernels.experiment import torch_threads

V, L = 3, 3
STATES = np.array(list(itertools.product(range(V), repeat=L)))
_LOGP = np.random.default_rng(0).normal(scale=1.0, size=len(STATES))


def _index(X: np.ndarray) -> np.ndarray:
    return (X * V ** np.arange(L - 1, -1, -1)).sum(1)


def _log_target(X: np.ndarray) -> np.ndarray:
    return _LOGP[_index(X)]


def _context_mlm(X: np.ndarray) -> np.ndarray:
    """An asymmetric, context-dependent infill model over V tokens plus a mask token (id V)."""
    n = X.shape[0]
    left = np.concatenate([np.full((n, 1), V), X[:, :-1]], 1)
    logits = np.zeros((n, L, V + 1))
    for v in range(V):
        logits[:, :, v] = 0.7 * v * (left == 1) - 0.5 * v * np.arange(L) + 0.3 * (left == v)
    logits[:, :, V] = -30.0  # the mask token is (almost) never drawn
    return logits


def _empirical_tv(proposal, *, ignore_q: bool = False) -> float:
    x0 = STATES[np.random.default_rng(1).integers(0, len(STATES), 300)]

    class Wrapped:
        def propose(self, X, rng):
            new, fwd, rev = proposal.propose(X, rng)
            return (new, np.zeros_like(fwd), np.zeros_like(rev)) if ignore_q else (new, fwd, rev)

    chains = mx.metropolis_hastings(x0, _log_target, Wrapped(), 400, seed=2)
    idx = np.concatenate([_index(c.states[100::3]) for c in chains])
    emp = np.bincount(idx, minlength=len(STATES)) / len(idx)
    p = np.exp(_LOGP - _LOGP.max())
    return float(0.5 * np.abs(emp - p / p.sum()).sum())


# ---- MH exactness on an enumerable space -----------------------------------------------------------


def test_mh_substitution_matches_softmax_target() -> None:
    assert _empirical_tv(mx.SubstitutionProposal(V, (1, 2))) < 0.05


def test_mh_mlm_infill_matches_target_and_needs_the_q_ratio() -> None:
    prop = mx.MaskInfillProposal(_context_mlm, mask_token_id=V, mask_frac=0.3, allowed_tokens=range(V))
    assert _empirical_tv(prop) < 0.05
    assert _empirical_tv(prop, ignore_q=True) > 0.1  # the asymmetric proposal biases a chain without q ratio


def test_infill_log_q_recomputed_independently() -> None:
    prop = mx.MaskInfillProposal(_context_mlm, mask_token_id=V, mask_frac=0.5, allowed_tokens=range(V))
    X = STATES[[1, 5, 17, 26]]
    new, fwd, rev = prop.propose(X, np.random.default_rng(7))
    mask = prop.sample_mask(len(X), L, np.random.default_rng(7))  # the same draws: the same mask
    assert np.all(new[~mask] == X[~mask])
    lp = torch.log_softmax(torch.as_tensor(_context_mlm(np.where(mask, V, X)))[:, :, :V], -1).numpy()
    want_f = [sum(lp[i, j, new[i, j]] for j in np.flatnonzero(mask[i])) for i in range(len(X))]
    want_r = [sum(lp[i, j, X[i, j]] for j in np.flatnonzero(mask[i])) for i in range(len(X))]
    np.testing.assert_allclose(fwd, want_f, atol=1e-9)
    np.testing.assert_allclose(rev, want_r, atol=1e-9)
    assert np.all(np.isfinite(fwd)) and np.all(np.isfinite(rev))


def test_substitution_proposal_is_symmetric_with_exact_probability() -> None:
    prop = mx.SubstitutionProposal(8, (1, 2))
    X = np.zeros((200, 6), dtype=np.int64)
    new, fwd, rev = prop.propose(X, np.random.default_rng(0))
    k = (new != X).sum(1)
    assert set(k.tolist()) == {1, 2}
    np.testing.assert_array_equal(fwd, rev)
    want = np.where(k == 1, np.log(0.5 / 6 / 7), np.log(0.5 / 15 / 49))
    np.testing.assert_allclose(fwd, want)


# ---- episodes and pairs ------------------------------------------------------------------------------


def _random_chain(seed: int, T: int = 200) -> list[tuple[list[int], float]]:
    rng = np.random.default_rng(seed)
    scores = np.cumsum(rng.normal(0.05, 1.0, T))
    return [([t // 100, t // 10 % 10, t % 10], float(s)) for t, s in enumerate(scores)]  # distinct states


@pytest.mark.parametrize("rule", ["improve", "quantile"])
@pytest.mark.parametrize("seed", range(5))
def test_select_episode_increasing_from_x0_within_max_len(rule: str, seed: int) -> None:
    chain = _random_chain(seed)
    score = {tuple(s): v for s, v in chain}
    delta = 0.5
    ep = mx.select_episode(chain, rule=rule, delta=delta, max_len=4)
    assert ep[0] == chain[0][0] and 2 <= len(ep) <= 4
    vals = [score[tuple(s)] for s in ep]
    assert all(b > a for a, b in itertools.pairwise(vals))
    if rule == "improve":
        assert all(b - a >= delta for a, b in itertools.pairwise(vals))
    else:  # ends at the chain's best state passing the rule
        best, kept = chain[0][1], []
        for _s, v in chain[1:]:
            if v - best >= delta:
                best = v
                kept.append(v)
        assert vals[-1] == kept[-1]


def test_select_episode_from_chain_object() -> None:
    toy = mx.SequenceDesignToy(6, 4, seed=0)
    chains = mx.metropolis_hastings(
        toy.sample(3, seed=0),
        mx.energy_target(toy.oracle, toy.sample(3, seed=0)),
        mx.SubstitutionProposal(4),
        50,
        seed=0,
    )
    ep = mx.select_episode(chains[0], rule="quantile", max_len=5)
    assert ep[0] == chains[0].states[0].tolist()
    assert np.all(np.diff(toy.oracle(np.array(ep))) > 0)


def test_pairs_never_cross_episodes() -> None:
    eps = [[[e * 10 + j] * 3 for j in range(4)] for e in range(3)]  # episode e uses tokens 10e..10e+3
    pairs = mx.build_pairs(eps, history=2)
    assert len(pairs) == 9
    for src, tgt in pairs:
        assert {t // 10 for t in src} == {tgt[0] // 10}
        assert len(src) == 6
    assert pairs[0] == ([0, 0, 0, 0, 0, 0], [1, 1, 1])  # left-padded by the episode's first state


# ---- the extrapolator ----------------------------------------------------------------------------------


def _fitted(**kw) -> mx.ExtrapolatorLM:
    rng = np.random.default_rng(0)
    src = rng.integers(0, 4, (32, 5))
    pairs = [(s.tolist(), np.sort(s).tolist()) for s in src]
    return mx.ExtrapolatorLM(4, 5, n_layer=1, n_embd=16, n_head=2, seed=0, **kw).fit(pairs, epochs=2)


def test_transform_zero_steps_is_identity_and_greedy_is_deterministic() -> None:
    model = _fitted()
    x = np.random.default_rng(1).integers(0, 4, (6, 5))
    np.testing.assert_array_equal(model.transform(x, 0).sequences, x)
    a = model.transform(x, 3, guide=lambda X: X.sum(1).astype(float)).sequences
    b = model.transform(x, 3, guide=lambda X: X.sum(1).astype(float)).sequences
    np.testing.assert_array_equal(a, b)
    s1 = model.transform(x, 2, n_candidates=3, greedy=False, guide=lambda X: X.sum(1) * 1.0, seed=5)
    s2 = model.transform(x, 2, n_candidates=3, greedy=False, guide=lambda X: X.sum(1) * 1.0, seed=5)
    np.testing.assert_array_equal(s1.sequences, s2.sequences)
    assert s1.guide_evals == 7
    assert np.all(s1.guide_scores[-1] >= s1.guide_scores[0])  # steps are kept only if the guide improves


def test_sklearn_regressor_guide() -> None:
    from sklearn.linear_model import Ridge

    X = np.random.default_rng(0).integers(0, 4, (40, 5))
    reg = Ridge().fit(X, X.sum(1))
    g = mx.as_guide(reg)
    np.testing.assert_allclose(g(X), reg.predict(X))


# ---- bad inputs (one test each) ----------------------------------------------------------------------


def test_empty_sequences_rejected() -> None:
    with pytest.raises(ValueError, match=r"x0 must be non-empty"):
        mx.metropolis_hastings(np.zeros((2, 0), dtype=int), _log_target, mx.SubstitutionProposal(3), 5)


def test_mismatched_lengths_rejected() -> None:
    with pytest.raises(ValueError, match=r"x0 must be equal-length"):
        mx.metropolis_hastings([[0, 1, 2], [0, 1]], _log_target, mx.SubstitutionProposal(3), 5)
    with pytest.raises(ValueError, match=r"x must have sequence length 5; got length 4"):
        _fitted().transform(np.zeros((2, 4), dtype=int), 1)


def test_out_of_vocabulary_tokens_rejected() -> None:
    with pytest.raises(ValueError, match=r"X must hold token ids in \[0, 3\).*e\.g\. 7"):
        mx.SubstitutionProposal(3).propose(np.array([[0, 7, 1]]), np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"x must hold token ids in \[0, 4\)"):
        _fitted().transform(np.array([[0, 1, 2, 3, 4]]), 1)


def test_non_finite_guide_names_the_sequence() -> None:
    g = mx.as_guide(lambda X: np.where(X[:, 0] == 2, np.nan, 1.0))
    with pytest.raises(ValueError, match=r"guide returned a non-finite value nan for sequence \[2, 0, 1\]"):
        g(np.array([[0, 0, 0], [2, 0, 1]]))


@pytest.mark.parametrize("frac", [0.0, -0.1, 1.0, 1.5])
def test_mask_frac_outside_unit_interval_rejected(frac: float) -> None:
    with pytest.raises(ValueError, match=rf"mask_frac must be in \(0, 1\); got {frac}"):
        mx.MaskInfillProposal(_context_mlm, mask_token_id=V, mask_frac=frac)


def test_stuck_chains_warn_and_build_pairs_raises() -> None:
    class Stay:
        def propose(self, X, rng):
            n = len(X)
            return (X + 1) % V, np.zeros(n), np.full(n, -np.inf)  # never accepted

    with pytest.warns(UserWarning, match=r"2 of 2 chains accepted no move"):
        chains = mx.metropolis_hastings(STATES[:2], _log_target, Stay(), 10, seed=0)
    episodes = [mx.select_episode(c) for c in chains]
    with pytest.raises(ValueError, match=r"episodes produced no training pairs: all 2 episodes"):
        mx.build_pairs(episodes)


def test_oracle_as_guide_warns_leakage() -> None:
    toy = mx.SequenceDesignToy(5, 4, seed=0)
    with pytest.warns(UserWarning, match=r"guide is the evaluation oracle \(leakage\)"):
        _fitted().transform(toy.sample(2, seed=0), 1, guide=toy.oracle)


def test_unfitted_extrapolator_rejected() -> None:
    with pytest.raises(ValueError, match=r"ExtrapolatorLM is not fitted"):
        mx.ExtrapolatorLM(4, 5).transform(np.zeros((1, 5), dtype=int), 1)


# ---- the toy and the quick gate ----------------------------------------------------------------------


def test_toy_optimum_by_brute_force() -> None:
    toy = mx.SequenceDesignToy(4, 3, n_motifs=3, seed=3)
    allx = np.array(list(itertools.product(range(3), repeat=4)))
    assert toy.optimum() == pytest.approx(toy.oracle(allx).max())


def test_quick_gate_passes() -> None:
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.summary()
    assert report.metrics["f_qtheta"] > report.metrics["baseline_f_mcmc_short"] + 3.0


def test_broken_variant_fails_quick_gate() -> None:
    with torch_threads(1):
        report = exp.evaluate(exp.broken_setting(True), 0)
    assert not report.passed, report.summary()
