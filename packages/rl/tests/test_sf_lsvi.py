"""P43 SF-LSVI (Bellman unbiasedness): exact checks, property tests, gymnasium integration, the quick gate."""

from __future__ import annotations

import dataclasses
import itertools
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.rl import (
    EpisodeBatch,
    EpsilonGreedyQLearning,
    LinearSFLSVI,
    TabularMDP,
    TabularMDPEnv,
    TabularSFLSVI,
    Transition,
    exact_return_moments,
    exact_return_pmf,
    moment_bellman_target,
    optimal_policy,
    project_moments,
    quantile_bellman_target,
    random_tabular_mdp,
    return_quantiles,
    run_episode,
    tabular_mdp_from_gym,
    two_branch_chain,
)
from icml25.rl.experiments import sf_lsvi as experiment
from icml25.rl.sf_lsvi.mdp import policy_values

SETTINGS = settings(max_examples=40, deadline=None)


def _moments_of(values: np.ndarray, probs: np.ndarray, n_moments: int) -> np.ndarray:
    return np.array([(probs * values**n).sum() for n in range(1, n_moments + 1)])


# ----------------------------------------------------------------------------- moment targets
@SETTINGS
@given(r=st.floats(0, 1), z=st.floats(0, 10), n_moments=st.integers(1, 6))
def test_deterministic_reward_and_return_give_powers(r, z, n_moments):
    target = moment_bellman_target(np.array(r), z ** np.arange(1, n_moments + 1))
    np.testing.assert_allclose(target, (r + z) ** np.arange(1, n_moments + 1), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    n_next=st.integers(1, 4),
    n_atoms=st.integers(1, 3),
    n_moments=st.integers(1, 5),
)
def test_one_sample_moment_target_is_unbiased(seed, n_next, n_atoms, n_moments):
    """E over (r, s') of the one-sample target = the moments of r + Z' (r may depend on s')."""
    rng = np.random.default_rng(seed)
    p_next = rng.dirichlet(np.ones(n_next))
    rewards = rng.uniform(0, 1, size=(n_next, 2))  # reward support given s'
    p_reward = rng.dirichlet(np.ones(2), size=n_next)
    atoms = rng.uniform(0, 3, size=(n_next, n_atoms))  # Z' | s' is uniform on these atoms
    next_m = np.stack(
        [_moments_of(atoms[i], np.full(n_atoms, 1 / n_atoms), n_moments) for i in range(n_next)]
    )
    expected_target = sum(
        p_next[i] * p_reward[i, j] * moment_bellman_target(np.array(rewards[i, j]), next_m[i])
        for i in range(n_next)
        for j in range(2)
    )
    # brute force: the law of r + Z'
    vals, probs = [], []
    for i, j, k in itertools.product(range(n_next), range(2), range(n_atoms)):
        vals.append(rewards[i, j] + atoms[i, k])
        probs.append(p_next[i] * p_reward[i, j] / n_atoms)
    np.testing.assert_allclose(
        expected_target, _moments_of(np.array(vals), np.array(probs), n_moments), rtol=1e-10
    )


def test_reward_moment_form_and_torch_io():
    r_moments = np.array([[0.3, 0.3, 0.3]])  # Bernoulli(0.3)
    nxt = np.array([[2.0, 5.0, 14.0]])
    # E over r of the sampled form = the r_moments form (r independent of Z')
    sampled = 0.7 * moment_bellman_target(np.array([0.0]), nxt) + 0.3 * moment_bellman_target(
        np.array([1.0]), nxt
    )
    np.testing.assert_allclose(moment_bellman_target(None, nxt, r_moments=r_moments), sampled, rtol=1e-12)
    out = moment_bellman_target(torch.tensor([0.5]), torch.tensor([[1.0, 2.0]]))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    # numpy's check: torch.testing's first call imports for seconds
    np.testing.assert_allclose(out.numpy(), [[1.5, 0.25 + 2 * 0.5 * 1.0 + 2.0]], rtol=1e-15)


def test_quantile_target_is_biased_where_moments_are_not_closed_form():
    """r = 0, s' in {A, B} w.p. 1/2 with Z_A = 0 and Z_B = 1: the median of the target law is 0, but the
    averaged one-sample median is 1/2; the averaged moment targets are exact (E Z^n = 1/2)."""
    atoms = {"A": np.zeros(3), "B": np.ones(3)}
    median = {k: quantile_bellman_target(np.array(0.0), v, [0.5])[0] for k, v in atoms.items()}
    assert 0.5 * median["A"] + 0.5 * median["B"] == 0.5
    support, pmf = np.array([0.0, 1.0]), np.array([0.5, 0.5])
    assert return_quantiles(support, pmf, [0.5])[0] == 0.0
    moments = {k: moment_bellman_target(np.array(0.0), np.full(4, v[0])) for k, v in atoms.items()}
    np.testing.assert_array_equal(0.5 * moments["A"] + 0.5 * moments["B"], np.full(4, 0.5))
    # quantile fixed point of M atoms: the ceil(tau M)-th smallest atom of r + atoms
    np.testing.assert_array_equal(
        quantile_bellman_target(np.array(1.0), np.array([3.0, 0.0, 1.0, 2.0]), [0.1, 0.25, 0.5, 0.9]),
        [1.0, 1.0, 2.0, 4.0],
    )


# ----------------------------------------------------------------------------- projection
@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), n_atoms=st.integers(1, 5), upper=st.floats(0.5, 10))
def test_projection_keeps_valid_moment_vectors(seed, n_atoms, upper):
    rng = np.random.default_rng(seed)
    atoms = rng.uniform(0, upper, n_atoms)
    m = _moments_of(atoms, rng.dirichlet(np.ones(n_atoms)), 4)
    np.testing.assert_allclose(project_moments(m, upper), m, rtol=1e-10)


@SETTINGS
@given(raw=st.lists(st.floats(-50, 500), min_size=1, max_size=6), upper=st.floats(0, 8))
def test_projection_enforces_moment_conditions(raw, upper):
    m = project_moments(np.array(raw), upper)
    full = np.concatenate([[1.0], m])
    tol = 1e-9 * (1 + np.abs(full))
    assert 0 <= m[0] <= upper + 1e-12
    assert (full[1:] <= upper * full[:-1] + tol[1:]).all()
    assert (full[2:] * full[:-2] >= full[1:-1] ** 2 - 1e-9 * (1 + full[1:-1] ** 2)).all()
    if m.size >= 2:
        assert m[1] - m[0] ** 2 >= -1e-9  # variance >= 0
    np.testing.assert_allclose(project_moments(m, upper), m, rtol=1e-12, atol=1e-12)  # idempotent


# ----------------------------------------------------------------------------- exact DP
def _brute_force_moments(mdp: TabularMDP, pi: np.ndarray, n_moments: int) -> np.ndarray:
    """Enumerate every trajectory (s', reward) from every (h, s, a)."""
    H, S, A = mdp.H, mdp.n_states, mdp.n_actions
    out = np.zeros((H, S, A, n_moments))

    def law(h, s, a):  # list of (return, prob) of Z_h(s, a)
        items = []
        for s2, j in itertools.product(range(S), range(mdp.reward_values.shape[-1])):
            p = mdp.P[s, a, s2] * mdp.reward_probs[s, a, s2, j]
            if p == 0:
                continue
            r = mdp.reward_values[s, a, s2, j]
            if h == H - 1:
                items.append((r, p))
                continue
            for a2 in range(A):
                if pi[h + 1, s2, a2] > 0:
                    items += [(r + z, p * pi[h + 1, s2, a2] * q) for z, q in law(h + 1, s2, a2)]
        return items

    for h, s, a in itertools.product(range(H), range(S), range(A)):
        items = law(h, s, a)
        z, p = np.array([i[0] for i in items]), np.array([i[1] for i in items])
        out[h, s, a] = _moments_of(z, p, n_moments)
    return out


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_exact_dp_matches_trajectory_enumeration(seed):
    rng = np.random.default_rng(seed)
    S, A, H = 2, 2, 3
    P = rng.dirichlet(np.ones(S), size=(S, A))
    values = rng.uniform(0, 1, size=(S, A, S, 2))  # rewards depend on s'
    probs = rng.dirichlet(np.ones(2), size=(S, A, S))
    mdp = TabularMDP(P, values, probs, np.full(S, 0.5), H)
    pi = rng.dirichlet(np.ones(A), size=(H, S))
    dp = exact_return_moments(mdp.P, mdp.reward_moments(4), pi, H)
    np.testing.assert_allclose(dp, _brute_force_moments(mdp, pi, 4), rtol=1e-10)


def test_chain_moments_and_pmf_closed_form():
    mdp = two_branch_chain()
    q, pi_star = optimal_policy(mdp.P, mdp.mean_reward, mdp.H)
    np.testing.assert_allclose(q[0, 0], [3.5, 2.1])  # the risky branch loses 7 x 0.2 = 1.4
    assert pi_star[0, 0].tolist() == [1.0, 0.0]
    m = exact_return_moments(mdp.P, mdp.reward_moments(4), pi_star, mdp.H)[0, 0]
    np.testing.assert_allclose(m[0], 3.5 ** np.arange(1, 5))
    k = np.arange(8)
    binom = np.array([math.comb(7, i) * 0.3**i * 0.7 ** (7 - i) for i in k])  # risky: Binomial(7, 0.3)
    np.testing.assert_allclose(m[1], [(binom * k**n).sum() for n in range(1, 5)], rtol=1e-12)
    support, pmf = exact_return_pmf(mdp, pi_star, resolution=0.5)
    np.testing.assert_allclose(pmf[0, 0, 1, ::2][:8], binom, atol=1e-15)
    np.testing.assert_allclose(pmf.sum(-1), 1.0)
    np.testing.assert_allclose(
        (pmf * support).sum(-1), exact_return_moments(mdp.P, mdp.reward_moments(1), pi_star, 8)[..., 0]
    )


# ----------------------------------------------------------------------------- the tabular learner
def _exact_batch(mdp: TabularMDP) -> tuple[EpisodeBatch, np.ndarray]:
    """Every (h, s, a, s', reward) once, weighted by its probability: the infinite-data limit."""
    H, S, A, J = mdp.H, mdp.n_states, mdp.n_actions, mdp.reward_values.shape[-1]
    h, s, a, s2, j = (x.ravel() for x in np.meshgrid(*map(np.arange, (H, S, A, S, J)), indexing="ij"))
    w = mdp.P[s, a, s2] * mdp.reward_probs[s, a, s2, j]
    n = h.size
    batch = EpisodeBatch(h, s, a, mdp.reward_values[s, a, s2, j], s2, np.zeros(n, bool), np.arange(n), n)
    return batch, w


def test_learned_moments_of_a_fixed_policy_equal_dp_with_exact_data():
    mdp = random_tabular_mdp(4, 3, 4, seed=3)
    pi = np.random.default_rng(0).dirichlet(np.ones(3), size=(4, 4))
    batch, w = _exact_batch(mdp)
    agent = TabularSFLSVI(4, 3, 4, n_moments=4, beta=0.0, eval_policy=pi).fit(batch, weights=w)
    dp = exact_return_moments(mdp.P, mdp.reward_moments(4), pi, 4)
    np.testing.assert_allclose(agent.moments_, dp, rtol=1e-10)


def test_learned_moments_with_1e5_samples_are_within_sampling_error():
    mdp = random_tabular_mdp(3, 2, 3, seed=1)
    H, S, A = 3, 3, 2
    pi = np.random.default_rng(1).integers(A, size=(H, S))
    rng = np.random.default_rng(2)
    per = 100_000 // (H * S * A)
    h, s, a = (np.repeat(x.ravel(), per) for x in np.meshgrid(*map(np.arange, (H, S, A)), indexing="ij"))
    cdf = np.cumsum(mdp.P, -1)[s, a]
    s2 = np.minimum((rng.random(h.size)[:, None] >= cdf).sum(-1), S - 1)
    r = (rng.random(h.size) < mdp.reward_probs[s, a, s2, 1]).astype(float)  # Bernoulli rewards
    batch = EpisodeBatch(h, s, a, r, s2, np.zeros(h.size, bool), np.arange(h.size), h.size)
    learned = TabularSFLSVI(S, A, H, beta=0.0, eval_policy=pi).fit(batch).moments_
    dp = exact_return_moments(mdp.P, mdp.reward_moments(4), pi, H)
    # a target of moment n is bounded by H^n, so its mean over `per` samples has SE <= H^n / sqrt(per);
    # three steps of plug-in propagation at most triple it
    bound = 5 * 3 * float(H) ** np.arange(1, 5) / math.sqrt(per)
    assert (np.abs(learned - dp) <= bound).all()


def _random_episodes(mdp: TabularMDP, n: int, seed: int) -> list[list[Transition]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        s, ep = int(rng.choice(mdp.n_states, p=mdp.init)), []
        for _ in range(mdp.H):
            a = int(rng.integers(mdp.n_actions))
            r, s2 = mdp.sample(s, a, rng)
            ep.append(Transition(s, a, r, s2))
            s = s2
        out.append(ep)
    return out


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_moment_estimates_are_invariant_to_the_order_of_the_data(seed):
    mdp = two_branch_chain()
    episodes = _random_episodes(mdp, 40, seed)
    perm = np.random.default_rng(seed).permutation(len(episodes))
    a = TabularSFLSVI(8, 2, 8, beta=0.5).fit(episodes)
    b = TabularSFLSVI(8, 2, 8, beta=0.5).fit([episodes[i] for i in perm])
    np.testing.assert_allclose(a.moments_, b.moments_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.q_, b.q_, rtol=1e-12, atol=1e-12)
    c = TabularSFLSVI(8, 2, 8, beta=0.5)
    for ep in episodes:
        c.update(ep)  # incremental updates: the same least-squares solution
    np.testing.assert_allclose(c.moments_, a.moments_, rtol=1e-12, atol=1e-12)


class _ReferenceLSVIUCB:
    """Tabular LSVI-UCB written sample by sample (Jin et al. 2020 with one-hot features, lam = 0).

    ``pool=True``: every step's fit uses the transitions of all steps (the paper's Algorithm 1, line 5).
    """

    def __init__(self, S, A, H, beta, pool=False):
        self.S, self.A, self.H, self.beta, self.pool = S, A, H, beta, pool
        self.data = [[] for _ in range(H)]
        self.q = np.zeros((H, S, A))

    def update(self, episode):
        for h, t in enumerate(episode):
            self.data[h].append(t)
        for h in reversed(range(self.H)):
            data = [t for d in self.data for t in d] if self.pool else self.data[h]
            for s, a in itertools.product(range(self.S), range(self.A)):
                ys = [
                    t.reward + (0.0 if h == self.H - 1 else self.q[h + 1, t.next_state].max())
                    for t in data
                    if (t.state, t.action) == (s, a)
                ]
                cap = self.H - h
                self.q[h, s, a] = min(sum(ys) / len(ys) + self.beta / math.sqrt(len(ys)), cap) if ys else cap


@pytest.mark.parametrize("pool_steps", [True, False])
def test_n_moments_1_is_lsvi_ucb_and_does_not_change_the_actions(pool_steps):
    mdp = two_branch_chain()
    beta = 1.5
    runs = {}
    for n_moments, targets in ((1, "optimistic"), (4, "optimistic"), (4, "regressed")):
        env = TabularMDPEnv(mdp)
        agent = TabularSFLSVI(8, 2, 8, n_moments=n_moments, beta=beta, seed=5, moment_targets=targets,
                              pool_steps=pool_steps)  # fmt: skip
        ref = _ReferenceLSVIUCB(8, 2, 8, beta, pool=pool_steps)
        actions, qs = [], []
        for k in range(60 if pool_steps else 120):
            episode = run_episode(env, agent, seed=11 if k == 0 else None)
            ref.update(episode)
            np.testing.assert_allclose(agent.q_, ref.q, rtol=1e-12, atol=1e-12)
            actions.append([t.action for t in episode])
            qs.append(agent.q_.copy())
        runs[n_moments, targets] = actions, np.stack(qs)
    for key in ((4, "optimistic"), (4, "regressed")):
        assert runs[1, "optimistic"][0] == runs[key][0]  # identical action sequences, same seed
        np.testing.assert_array_equal(runs[1, "optimistic"][1], runs[key][1])  # bit-for-bit optimistic values


def test_pooled_fit_of_every_step_is_the_fit_on_the_concatenated_data():
    """pool_steps (Algorithm 1, line 5): step h's fit equals a per-step fit on all steps' transitions."""
    mdp = two_branch_chain()  # time-homogeneous
    episodes = _random_episodes(mdp, 50, seed=6)
    episodes[2] = [*episodes[2][:3], Transition(*episodes[2][3][:4], terminated=True)]  # a terminal step
    b = EpisodeBatch.from_episodes(episodes)
    n, H = len(b.step), 8
    # every transition copied to every step h: the per-step statistics of step h are then the pooled ones
    rep = EpisodeBatch(np.repeat(np.arange(H), n), *(np.tile(x, H) for x in (b.state, b.action, b.reward,
                       b.next_state, b.terminated, b.episode)), b.n_episodes)  # fmt: skip
    for targets in ("optimistic", "regressed"):
        pooled = TabularSFLSVI(8, 2, H, beta=0.7, moment_targets=targets).fit(b)
        concat = TabularSFLSVI(8, 2, H, beta=0.7, moment_targets=targets, pool_steps=False).fit(rep)
        np.testing.assert_allclose(pooled.moments_, concat.moments_, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(pooled.q_, concat.q_, rtol=1e-12, atol=1e-12)
        assert (pooled.counts_ == b_counts(b)).all()  # the statistics stay per step; only the fit pools
    lin = LinearSFLSVI(lambda s, a: np.eye(16)[s * 2 + a], 16, H, 2, beta=0.7, lam=1.0).fit(episodes)
    tab = TabularSFLSVI(8, 2, H, beta=0.7, lam=1.0).fit(episodes)
    for h, s in itertools.product(range(H), range(8)):
        np.testing.assert_allclose(lin.q_values(h, s), tab.q_[h, s], rtol=1e-9, atol=1e-12)
        for a in range(2):
            np.testing.assert_allclose(lin.moments(h, s, a), tab.moments_[h, s, a], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(lin.counts_, b_counts(b).sum((1, 2)))


def b_counts(b: EpisodeBatch) -> np.ndarray:
    counts = np.zeros((8, 8, 2))
    np.add.at(counts, (b.step, b.state, b.action), 1.0)
    return counts


@pytest.mark.parametrize("pool_steps", [True, False])
def test_optimistic_moment_targets(pool_steps):
    """Algorithm 1, lines 10-11: the first moment carried is min(f + b, cap) = Q; with b = 0 the modes agree."""
    mdp = two_branch_chain()
    episodes = _random_episodes(mdp, 40, seed=8)
    kw = {"pool_steps": pool_steps}
    opt = TabularSFLSVI(8, 2, 8, beta=0.9, **kw).fit(episodes)
    reg = TabularSFLSVI(8, 2, 8, beta=0.9, moment_targets="regressed", **kw).fit(episodes)
    # greedy policy: the optimistic first moment is the decision's Q = min(f^(1) + b, r_max (H - h))
    np.testing.assert_allclose(opt.moments_[..., 0], opt.q_, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(opt.q_, reg.q_)  # the decision does not depend on the moment targets
    assert (opt.moments_[..., 0] >= reg.moments_[..., 0] - 1e-12).all()  # the bonus inflates the mean
    assert (opt.moments_[..., 0] > reg.moments_[..., 0] + 1e-6).any()
    # by hand at the last step (targets r^n, no carried moments): min(mean r + beta / sqrt(n), cap)
    counts = opt.counts_.sum(0) if pool_steps else opt.counts_[7]
    seen = counts > 0
    np.testing.assert_allclose(
        opt.moments_[7, ..., 0][seen],
        np.minimum(reg.moments_[7, ..., 0][seen] + 0.9 / np.sqrt(counts[seen]), 1.0),
        rtol=1e-12,
    )
    assert (opt.moments_[7, ..., 0][~seen] == 1.0).all()  # unvisited: the cap (infinite bonus)
    # a fixed eval_policy: first moment min(f^(1)_pi + b, cap), where f^(1)_pi carries the optimistic mean
    pi = np.random.default_rng(0).dirichlet(np.ones(2), size=(8, 8))
    ev = TabularSFLSVI(8, 2, 8, beta=0.9, eval_policy=pi, **kw).fit(episodes)
    assert (ev.moments_[..., 0] <= 8 - np.arange(8)[:, None, None] + 1e-12).all()
    v = project_moments(ev.moments_, (8 - np.arange(8))[:, None, None])
    np.testing.assert_allclose(v, ev.moments_, rtol=1e-12, atol=1e-12)  # valid moment vectors
    # zero bonus: the two target modes coincide, for the tabular and the linear agent
    for cls_kw in ({}, {"eval_policy": pi}):
        a = TabularSFLSVI(8, 2, 8, beta=0.0, **kw, **cls_kw).fit(episodes)
        b = TabularSFLSVI(8, 2, 8, beta=0.0, moment_targets="regressed", **kw, **cls_kw).fit(episodes)
        np.testing.assert_array_equal(a.moments_, b.moments_)
    feat = np.random.default_rng(1).normal(size=(16, 5))
    lins = [LinearSFLSVI(lambda s, a: feat[s * 2 + a], 5, 8, 2, beta=0.0, moment_targets=t, **kw).fit(episodes)
            for t in ("optimistic", "regressed")]  # fmt: skip
    np.testing.assert_array_equal(lins[0].W_, lins[1].W_)


def test_linear_with_one_hot_features_equals_tabular():
    mdp = two_branch_chain()
    S, A, H = 8, 2, 8
    episodes = _random_episodes(mdp, 60, seed=4)
    episodes[3] = [*episodes[3][:4], Transition(*episodes[3][4][:4], terminated=True)]  # a terminal step
    tab = TabularSFLSVI(S, A, H, beta=0.7, lam=1.0).fit(episodes)
    lin = LinearSFLSVI(lambda s, a: np.eye(S * A)[s * A + a], S * A, H, A, beta=0.7, lam=1.0).fit(episodes)
    for h, s in itertools.product(range(H), range(S)):
        np.testing.assert_allclose(lin.q_values(h, s), tab.q_[h, s], rtol=1e-9, atol=1e-12)
        for a in range(A):
            np.testing.assert_allclose(lin.moments(h, s, a), tab.moments_[h, s, a], rtol=1e-9, atol=1e-12)


def test_linear_moments_are_projected_onto_valid_vectors():
    rng = np.random.default_rng(0)
    mdp = two_branch_chain()
    proj = rng.normal(size=(8 * 2, 5))  # 5 random features: the regression cannot be exact
    lin = LinearSFLSVI(lambda s, a: proj[s * 2 + a], 5, 8, 2, beta=0.3).fit(_random_episodes(mdp, 30, 1))
    for h, s, a in itertools.product(range(8), range(8), range(2)):
        m = lin.moments(h, s, a)
        cap = 8 - h
        assert 0 <= m[0] <= cap and m[1] >= m[0] ** 2 - 1e-12 and (m[1:] <= cap * m[:-1] + 1e-9).all()


# ----------------------------------------------------------------------------- gymnasium
def test_tabular_mdp_env_passes_the_gymnasium_checker():
    env = TabularMDPEnv(two_branch_chain())
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    total, steps = 0.0, 0
    done = False
    while not done:
        _, r, term, trunc, _ = env.step(0)
        total, steps, done = total + r, steps + 1, term or trunc
    assert steps == 8 and total == pytest.approx(3.5)  # safe branch, continue


class _Behaviour:
    """A fixed ε-soft policy (collects data, learns nothing)."""

    def __init__(self, pi: np.ndarray, eps: float, seed: int) -> None:
        self.pi, self.eps, self.H = pi, eps, pi.shape[0]
        self.rng = np.random.default_rng(seed)

    def act(self, h, s):
        p = (1 - self.eps) * self.pi[h, s] + self.eps / self.pi.shape[-1]
        return int(self.rng.choice(self.pi.shape[-1], p=p))

    def update(self, episode):
        pass


def test_frozen_lake_moments_match_exact_dp():
    env = gym.make("FrozenLake-v1")
    H = 20
    mdp = tabular_mdp_from_gym(env, H)
    assert mdp.n_states == 17 and mdp.reward_range == (0.0, 1.0)
    _, pi_star = optimal_policy(mdp.P, mdp.mean_reward, H)
    dp = exact_return_moments(mdp.P, mdp.reward_moments(4), pi_star, H)
    np.testing.assert_allclose(dp[..., 1:], np.repeat(dp[..., :1], 3, -1), atol=1e-12)  # return in {0, 1}
    behaviour = _Behaviour(pi_star[:, :16], eps=0.2, seed=0)
    episodes = [run_episode(env, behaviour, H, seed=0 if k == 0 else None, learn=False) for k in range(1500)]
    learner = TabularSFLSVI.from_env(env, H, beta=0.0, eval_policy=pi_star[:, :16]).fit(episodes)
    m = learner.moments(0, 0, int(np.argmax(pi_star[0, 0])))
    np.testing.assert_allclose(m[1:], np.repeat(m[0], 3), atol=1e-12)  # Bernoulli return: equal moments
    assert abs(m[0] - dp[0, 0].max()) < 0.06  # ~1200 greedy starts: SE ~0.014, plus plug-in error
    # the exact model's transition law is what the environment samples
    counts = np.zeros((17, 4, 17))
    for ep in episodes:
        for t in ep:
            counts[t.state, t.action, 16 if t.terminated else t.next_state] += 1
    seen = counts.sum(-1) > 300
    np.testing.assert_allclose(
        (counts / np.maximum(counts.sum(-1, keepdims=True), 1))[seen], mdp.P[seen], atol=0.1
    )


@pytest.mark.parametrize("moment_targets", ["optimistic", "regressed"])
def test_online_learning_on_a_gymnasium_env(moment_targets):
    mdp = two_branch_chain()
    env = TabularMDPEnv(mdp)
    agent = TabularSFLSVI.from_env(env, 8, beta=2.0, seed=0, moment_targets=moment_targets)
    for k in range(400):
        run_episode(env, agent, seed=0 if k == 0 else None)
    _, pi_star = optimal_policy(mdp.P, mdp.mean_reward, 8)
    assert mdp.init @ policy_values(mdp, agent.policy_) == pytest.approx(
        mdp.init @ policy_values(mdp, pi_star)
    )
    exact = 3.5 ** np.arange(1, 5)  # the safe branch (deterministic rewards)
    if moment_targets == "regressed":
        np.testing.assert_allclose(agent.moments(0, 0, 0), exact)  # exactly
    else:  # the paper's Algorithm 1: optimistic moments, above the exact ones by the carried bonuses
        assert agent.moments(0, 0, 0)[0] == pytest.approx(agent.q_values(0, 0)[0], rel=1e-12)
        assert (agent.moments(0, 0, 0) > exact).all()


def test_linear_agent_on_a_box_observation_env():
    env = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match="LinearSFLSVI"):
        TabularSFLSVI.from_env(env, 20)

    def features(obs, a):
        phi = np.zeros(10)
        phi[5 * a : 5 * a + 5] = np.concatenate([[1.0], np.asarray(obs, dtype=np.float64)])
        return phi

    agent = LinearSFLSVI(features, 10, 20, env.action_space, beta=0.5, seed=0)
    lengths = [len(run_episode(env, agent, seed=0 if k == 0 else None)) for k in range(15)]
    assert agent.counts_[0] == 15 and agent.counts_[min(lengths) - 1] == 15
    obs, _ = env.reset(seed=1)
    m = agent.moments(0, obs, 0)
    assert np.isfinite(m).all() and 0 <= m[0] <= 20 and m[1] >= m[0] ** 2 - 1e-9


# ----------------------------------------------------------------------------- bad inputs
def test_bad_options_raise_clear_errors():
    for cls, args in ((TabularSFLSVI, (2, 2, 2)), (LinearSFLSVI, (lambda s, a: np.ones(2), 2, 2, 2))):
        with pytest.raises(ValueError, match="moment_targets must be one of"):
            cls(*args, moment_targets="mean")
        with pytest.raises(TypeError, match="pool_steps must be a bool"):
            cls(*args, pool_steps="yes")


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="n_moments"):
        TabularSFLSVI(4, 2, 3, n_moments=0)
    with pytest.raises(ValueError, match="n_moments"):
        LinearSFLSVI(lambda s, a: np.ones(2), 2, 3, 2, n_moments=0)
    with pytest.raises(ValueError, match="H"):
        TabularSFLSVI(4, 2, 0)
    with pytest.raises(ValueError, match="H"):
        LinearSFLSVI(lambda s, a: np.ones(2), 2, -1, 2)
    with pytest.raises(TypeError, match=r"n_states.*LinearSFLSVI"):
        TabularSFLSVI(gym.spaces.Box(0, 1, (2,)), 2, 3)
    with pytest.raises(TypeError, match="n_actions"):
        TabularSFLSVI(4, gym.spaces.Box(0, 1, (2,)), 3)
    with pytest.raises(ValueError, match="moments"):
        moment_bellman_target(np.zeros(2), np.zeros((2, 0)))


def test_rewards_outside_the_declared_range_are_rejected_without_changing_the_agent():
    agent = TabularSFLSVI(4, 2, 3, beta=1.0).fit([[Transition(0, 1, 0.5, 2)]])
    before = (agent.moments_.copy(), agent.q_.copy(), agent.counts_.copy(), agent._W.copy())
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match=r"reward.*declared range"):
            agent.update([Transition(0, 0, 0.2, 1), Transition(1, 0, bad, 2)])
    with pytest.raises(ValueError, match="reward"):
        EpsilonGreedyQLearning(4, 2, 3).update([Transition(0, 0, 2.0, 1)])
    lin = LinearSFLSVI(lambda s, a: np.eye(8)[2 * s + a], 8, 3, 2)
    with pytest.raises(ValueError, match="reward"):
        lin.update([Transition(0, 0, 1.01, 1)])
    after = (agent.moments_, agent.q_, agent.counts_, agent._W)
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    with pytest.raises(ValueError, match="r_max"):
        TabularSFLSVI(4, 2, 3, r_max=0.0)


def test_feature_vectors_of_the_wrong_dimension_are_rejected():
    lin = LinearSFLSVI(lambda s, a: np.ones(3), 4, 3, 2)
    with pytest.raises(ValueError, match=r"feature_fn must return a vector of shape \(d,\) = \(4,\)"):
        lin.act(0, 0)
    with pytest.raises(ValueError, match=r"episode\[0\].*feature_fn"):
        lin.update([Transition(0, 0, 0.5, 1)])
    assert lin.counts_.sum() == 0
    with pytest.raises(TypeError, match="feature_fn"):
        LinearSFLSVI("not callable", 4, 3, 2)


def test_episode_structure_errors():
    agent = TabularSFLSVI(4, 2, 2)
    with pytest.raises(ValueError, match="at most H"):
        agent.update([Transition(0, 0, 0.1, 1)] * 3)
    with pytest.raises(ValueError, match="terminated"):
        agent.update([Transition(0, 0, 0.1, 1, True), Transition(1, 0, 0.1, 1)])
    with pytest.raises(ValueError, match="state"):
        agent.update([Transition(7, 0, 0.1, 1)])
    with pytest.raises(TypeError, match="Transition"):
        agent.update([(0, 0)])
    with pytest.raises(ValueError, match="weights"):
        agent.fit([[Transition(0, 0, 0.1, 1)]], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="h must be a step"):
        agent.act(2, 0)


# ----------------------------------------------------------------------------- the reproduction
MOMENT_Z = "moment targets: max |z| < 4.9 over all (h, s, a, n<=4)"


def test_threshold_text_is_the_checks():
    assert experiment.threshold(True) == "; ".join(c.name for c in experiment.checks(experiment.QUICK))
    assert "regret(K) / regret(K/2) <= 1.6" in experiment.threshold(False)
    assert "regret" not in experiment.threshold(True)


def test_quick_reproduction(tmp_path):
    """The recorded expectation: a known miss of the moment check only (the catalog's P43 block).

    At the paper's Algorithm 1 the moments carry the optimistic mean, so they sit above exact DP by the
    bonus; our earlier form (regressed moments, per-step data; the ``ours_`` metrics) is within tolerance.
    """
    report = experiment.run(quick=True, seed=0, out_dir=tmp_path)
    assert report.paper == "P43" and report.passed is False
    assert list(report.checks) == [c.name for c in experiment.checks(experiment.QUICK)]
    assert [name for name, ok in report.checks.items() if not ok] == [experiment.MOMENT_CHECK]
    m = report.metrics
    assert m["moment_check_worst_ratio"] > 1.0 and m["risky_m1_learned"] > 1.1 * m["risky_m1_dp"]
    assert m["ours_moment_check_worst_ratio"] <= 1.0 and m["ours_safe_m4_learned"] == pytest.approx(3.5**4)
    # (A): moment targets unbiased (exactly, and statistically), quantile targets biased
    assert m["moment_max_exact_bias"] < 1e-10 and m["quantile_max_exact_bias"] > 0.3
    assert m["moment_max_abs_z"] < 4.9 and m["quantile_frac_abs_z_gt_5"] >= 0.3
    assert m["moment_entries"] == 600 and m["quantile_entries"] == 450
    # (B): SF-LSVI acts like LSVI-UCB; the safe branch's moments are exact (deterministic rewards)
    assert m["sf_lsvi_lsvi_ucb_identical_actions"] == 1.0 and m["sf_lsvi_regret"] == m["lsvi_ucb_regret"]
    assert m["ours_regret"] > m["sf_lsvi_regret"]  # pooling all steps' data learns faster here
    assert report.figures and all(f.exists() and f.stat().st_size > 0 for f in report.figures)


def test_broken_expansion_fails_the_quick_gate():
    report = experiment.run(quick=True, seed=0, moment_target=experiment.target_without_cross_terms)
    assert not report.passed and report.checks[MOMENT_Z] is False
    assert report.metrics["moment_max_exact_bias"] > 1.0


def test_no_optimism_bonus_fails_the_moment_check():
    """Without the bonus the greedy agent never tries the second branch: its moments stay unlearned.

    The paper's form already misses the moment check (inflated moments), so the control is our form's
    check, which the correct agent passes (``test_quick_reproduction``).
    """
    report = experiment.run(quick=True, seed=0, setting=dataclasses.replace(experiment.QUICK, bonus_c=0.0))
    assert not report.passed and report.checks[experiment.MOMENT_CHECK] is False
    assert report.metrics["ours_moment_check_worst_ratio"] > 1.0
    assert report.checks[MOMENT_Z]  # part (A) does not depend on the agent


def test_wrong_moment_clipping_fails_the_moment_check(monkeypatch):
    """Clipping m_n to [0, U] instead of [0, U^n] (a typical bug) breaks the learned moments."""
    import icml25.rl.sf_lsvi.agents as agents

    monkeypatch.setattr(agents, "project", lambda m, u: np.clip(m, 0.0, np.asarray(u)[..., None]))
    metrics, _ = experiment.regret_study(experiment.QUICK, seed=0)
    assert metrics["ours_moment_check_worst_ratio"] > 1.0 and metrics["moment_check_worst_ratio"] > 1.0


@pytest.mark.slow
def test_full_reproduction():
    report = experiment.run(quick=False, seed=0)
    assert report.passed is False and len(report.checks) == 7  # a known miss of the moment check only
    assert [name for name, ok in report.checks.items() if not ok] == [experiment.MOMENT_CHECK]
    m = report.metrics
    assert m["eps_greedy_regret"] >= 1.5 * m["sf_lsvi_regret"] and m["sf_lsvi_regret_ratio"] <= 1.6
    assert m["ours_moment_check_worst_ratio"] <= 1.0 and m["ours_regret_ratio"] <= 1.6
