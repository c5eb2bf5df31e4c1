"""Bellman Unbiasedness (SF-LSVI) — ICML 2025, P43: finite-horizon tabular MDPs and exact DP.

:class:`TabularMDP` holds ``P(s' | s, a)`` and a finite reward distribution per ``(s, a, s')`` (rewards may
depend on the next state, as in gymnasium's toy-text environments). Exact dynamic programming, the oracle of
the tests and the reproduction:

* :func:`exact_return_moments`: the moments ``E[Z_h(s, a)^n]`` of the return of a policy, by the moment
  Bellman recursion ``m_h^(n)(s,a) = sum_k C(n,k) E[r^{n-k} m_{h+1}^(k)(s', pi(s'))]``;
* :func:`exact_return_pmf` / :func:`return_quantiles`: the whole return distribution for rewards on a
  lattice, and its quantiles (generalised inverse CDF);
* :func:`optimal_policy`: optimal Q-values and the greedy policy (uniform over exact ties).

Steps are 0-based here: ``h = 0 .. H-1`` (the paper's ``h = 1 .. H``). Policies are ``[H, S]`` action
indices or ``[H, S, A]`` probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from icml25.kernels.checks import check_float, check_int
from icml25.rl.sf_lsvi._checks import as_float_array, as_int_array, check_distribution
from icml25.rl.sf_lsvi.moments import expand

__all__ = [
    "TabularMDP",
    "exact_return_moments",
    "exact_return_pmf",
    "optimal_policy",
    "random_tabular_mdp",
    "return_quantiles",
    "two_branch_chain",
]


def as_transitions(P: Any) -> np.ndarray:
    """``P`` as a checked ``[S, A, S]`` float64 array of next-state distributions."""
    P = as_float_array(P, "P", ndim=3)
    if P.shape[0] == 0 or P.shape[1] == 0 or P.shape[2] != P.shape[0]:
        raise ValueError(f"P must have shape [S, A, S] with S, A >= 1, got {P.shape}")
    check_distribution(P, "P")
    return P


@dataclass(frozen=True, eq=False)
class TabularMDP:
    """A finite-horizon tabular MDP with finite reward distributions.

    Args:
        P: ``[S, A, S]`` transition probabilities.
        reward_values: ``[S, A, J]`` (reward independent of ``s'``) or ``[S, A, S, J]`` reward support.
        reward_probs: the matching probabilities (each ``[..., J]`` row sums to 1).
        init: ``[S]`` initial-state distribution.
        H: horizon (steps per episode).

    The arrays are stored as float64 copies, rewards always in the ``[S, A, S, J]`` form.
    """

    P: np.ndarray
    reward_values: np.ndarray
    reward_probs: np.ndarray
    init: np.ndarray
    H: int

    def __post_init__(self) -> None:
        P = as_transitions(self.P)
        S, A = P.shape[0], P.shape[1]
        vals = as_float_array(self.reward_values, "reward_values")
        probs = as_float_array(self.reward_probs, "reward_probs")
        if vals.shape != probs.shape:
            raise ValueError(
                f"reward_probs must have the shape of reward_values {vals.shape}, got {probs.shape}"
            )
        if vals.ndim == 3 and vals.shape[:2] == (S, A):
            vals = np.broadcast_to(vals[:, :, None, :], (S, A, S, vals.shape[2])).copy()
            probs = np.broadcast_to(probs[:, :, None, :], (S, A, S, probs.shape[2])).copy()
        if vals.ndim != 4 or vals.shape[:3] != (S, A, S):
            raise ValueError(
                f"reward_values must have shape [S, A, J] = [{S}, {A}, J] or [S, A, S, J], got {vals.shape}"
            )
        check_distribution(probs, "reward_probs")
        init = as_float_array(self.init, "init", ndim=1)
        if init.shape != (S,):
            raise ValueError(f"init must have shape [S] = [{S}], got {init.shape}")
        check_distribution(init, "init")
        object.__setattr__(self, "P", P)
        object.__setattr__(self, "reward_values", vals)
        object.__setattr__(self, "reward_probs", probs)
        object.__setattr__(self, "init", init)
        object.__setattr__(self, "H", check_int(self.H, "H", low=1))
        object.__setattr__(self, "_cdf_next", np.cumsum(P, axis=-1))
        object.__setattr__(self, "_cdf_reward", np.cumsum(probs, axis=-1))
        object.__setattr__(self, "_mean_reward", np.einsum("sap,sapj,sapj->sa", P, probs, vals))

    @property
    def n_states(self) -> int:
        return int(self.P.shape[0])

    @property
    def n_actions(self) -> int:
        return int(self.P.shape[1])

    def reward_moments(self, n_moments: int) -> np.ndarray:
        """``[S, A, S, N]``: ``E[r^n | s, a, s']`` for ``n = 1..N``."""
        n_moments = check_int(n_moments, "n_moments", low=1)
        powers = self.reward_values[..., None] ** np.arange(1, n_moments + 1)
        return np.einsum("xyzj,xyzjn->xyzn", self.reward_probs, powers)

    @property
    def mean_reward(self) -> np.ndarray:
        """``[S, A]``: ``E[r | s, a]``."""
        return self._mean_reward.copy()

    @property
    def reward_range(self) -> tuple[float, float]:
        """Smallest and largest reward with positive probability."""
        support = self.reward_values[self.reward_probs > 0]
        return float(support.min()), float(support.max())

    def sample(self, s: int, a: int, rng: np.random.Generator) -> tuple[float, int]:
        """One transition from ``(s, a)``: ``(reward, next_state)``."""
        cdf = self._cdf_next[s, a]
        nxt = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), self.n_states - 1)
        cdf = self._cdf_reward[s, a, nxt]
        j = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), cdf.shape[0] - 1)
        return float(self.reward_values[s, a, nxt, j]), nxt


def as_policy(pi: Any, H: int, S: int, A: int, name: str = "pi") -> np.ndarray:
    """``[H, S]`` actions or ``[H, S, A]`` probabilities as ``[H, S, A]`` probabilities."""
    arr = np.asarray(pi.detach().cpu().numpy() if hasattr(pi, "detach") else pi)
    if arr.ndim == 2 and arr.dtype.kind in "iu":
        idx = as_int_array(arr, name, low=0, high=A)
        if idx.shape != (H, S):
            raise ValueError(f"{name} as actions must have shape [H, S] = [{H}, {S}], got {idx.shape}")
        return np.eye(A)[idx]
    probs = as_float_array(arr, name)
    if probs.shape != (H, S, A):
        raise ValueError(
            f"{name} must be [H, S] = [{H}, {S}] action indices or [H, S, A] = [{H}, {S}, {A}] "
            f"probabilities, got shape {probs.shape} ({probs.dtype} input {arr.dtype})"
        )
    check_distribution(probs, name, tol=1e-6)
    return probs


def _moment_dp(P: np.ndarray, rm: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """Unchecked recursion: ``P [S,A,S]``, ``rm [S,A,S,N]``, ``pi [H,S,A]`` -> ``[H,S,A,N]``."""
    H, S, A = pi.shape
    n_moments = rm.shape[-1]
    powers = np.concatenate([np.ones((*rm.shape[:-1], 1)), rm], axis=-1)  # [S,A,S,N+1]
    out = np.zeros((H, S, A, n_moments))
    nxt = np.zeros((S, n_moments + 1))
    nxt[:, 0] = 1.0  # past the horizon: Z = 0
    for h in reversed(range(H)):
        per_next = expand(powers, nxt[None, None])  # [S,A,S',N]: E[(r + Z')^n | s, a, s']
        out[h] = np.einsum("sap,sapn->san", P, per_next)
        nxt = np.concatenate([np.ones((S, 1)), np.einsum("sa,san->sn", pi[h], out[h])], axis=1)
    return out


def exact_return_moments(P: Any, R_moments: Any, pi: Any, H: int) -> np.ndarray:
    """Exact moments ``E[Z_h(s, a)^n]`` of the return of ``pi`` from ``(h, s, a)``, by dynamic programming.

    ``Z_h(s, a) = r_h + r_{h+1} + ... + r_{H-1}`` with ``a`` at step ``h`` and ``pi`` afterwards.

    Args:
        P: ``[S, A, S]`` transition probabilities.
        R_moments: ``[S, A, N]`` reward moments ``E[r^n | s, a]`` (reward independent of ``s'``) or
            ``[S, A, S, N]`` moments given the next state too; with ``N >= 2``, ``E[r^2] >= E[r]^2`` is
            required (``ValueError`` otherwise: no real reward has these moments).
        pi: ``[H, S]`` action indices or ``[H, S, A]`` probabilities.
        H: horizon.

    Returns:
        ``[H, S, A, N]`` float64 moments (``[..., 0]`` is ``Q^pi``).
    """
    H = check_int(H, "H", low=1)
    P = as_transitions(P)
    S, A = P.shape[0], P.shape[1]
    rm = as_float_array(R_moments, "R_moments")
    if rm.ndim == 3 and rm.shape[:2] == (S, A):
        rm = np.broadcast_to(rm[:, :, None, :], (S, A, S, rm.shape[2]))
    if rm.ndim != 4 or rm.shape[:3] != (S, A, S) or rm.shape[3] == 0:
        raise ValueError(
            f"R_moments must have shape [S, A, N] = [{S}, {A}, N] or [S, A, S, N] with N >= 1, got {rm.shape}"
        )
    if rm.shape[3] >= 2:  # moments of a real reward: E[r^2] >= E[r]^2 (a variance is never negative)
        m1, m2 = rm[..., 0], rm[..., 1]
        gap = m2 - m1**2
        tol = 1e-9 * np.maximum(1.0, np.abs(m2))
        if (gap < -tol).any():
            i = np.unravel_index(int(np.argmin(gap + tol)), gap.shape)
            raise ValueError(
                f"R_moments must be moments of a real reward (E[r^2] >= E[r]^2), got E[r] = {m1[i]:g} and "
                f"E[r^2] = {m2[i]:g} at (s, a, s') = {tuple(int(j) for j in i)}"
            )
    probs = as_policy(pi, H, S, A)
    with np.errstate(over="ignore", invalid="ignore"):
        out = _moment_dp(P, rm, probs)
    if not np.isfinite(out).all():
        raise ValueError("R_moments give non-finite return moments (float64 overflow)")
    return out


def policy_values(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """Unchecked ``V^pi`` at step 0: ``[S]`` (``pi`` as ``[H, S, A]`` probabilities)."""
    r, v = mdp._mean_reward, np.zeros(mdp.n_states)
    for h in reversed(range(pi.shape[0])):
        v = np.einsum("sa,sa->s", pi[h], r + mdp.P @ v)
    return v


def optimal_policy(P: Any, mean_reward: Any, H: int, tol: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """Optimal ``Q*`` ``[H, S, A]`` and the greedy policy ``[H, S, A]`` (uniform over actions within ``tol``).

    Args:
        P: ``[S, A, S]`` transitions. mean_reward: ``[S, A]`` expected rewards. H: horizon.
    """
    H = check_int(H, "H", low=1)
    P = as_transitions(P)
    S, A = P.shape[0], P.shape[1]
    r = as_float_array(mean_reward, "mean_reward", ndim=2)
    if r.shape != (S, A):
        raise ValueError(f"mean_reward must have shape [S, A] = [{S}, {A}], got {r.shape}")
    tol = check_float(tol, "tol", low=0.0)
    q = np.zeros((H, S, A))
    pi = np.zeros((H, S, A))
    v = np.zeros(S)
    with np.errstate(over="ignore", invalid="ignore"):
        for h in reversed(range(H)):
            q[h] = r + P @ v
            best = q[h].max(1, keepdims=True)
            ties = q[h] >= best - tol
            pi[h] = ties / ties.sum(1, keepdims=True)
            v = q[h].max(1)
    if not np.isfinite(q).all():
        raise ValueError("mean_reward gives non-finite values (float64 overflow)")
    return q, pi


def exact_return_pmf(mdp: TabularMDP, pi: Any, resolution: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Exact return distribution of ``pi`` for rewards on the lattice ``{0, resolution, 2 resolution, ...}``.

    Returns:
        ``(support [L], pmf [H, S, A, L])`` with ``support = resolution * arange(L)``.
    """
    if not isinstance(mdp, TabularMDP):
        raise TypeError(f"mdp must be a TabularMDP, got {type(mdp).__name__}")
    resolution = check_float(resolution, "resolution", low=0.0, low_open=True)
    S, A, H = mdp.n_states, mdp.n_actions, mdp.H
    probs = as_policy(pi, H, S, A)
    units = mdp.reward_values / resolution
    grid = np.rint(units)
    used = mdp.reward_probs > 0
    if (np.abs(units - grid)[used] > 1e-9).any() or (grid[used] < 0).any():
        raise ValueError(
            f"mdp rewards must be non-negative multiples of resolution={resolution} for an exact lattice "
            "distribution"
        )
    grid = np.where(used, grid, 0).astype(np.int64)
    top = int(grid.max())
    L = H * top + 1
    if L > 1_000_000:
        raise ValueError(f"resolution={resolution} gives a lattice of {L} points; use a coarser resolution")
    # reward pmf per (s, a, s') on the lattice
    rpmf = np.zeros((S, A, S, top + 1))
    np.add.at(rpmf, (*np.indices(grid.shape)[:3], grid), mdp.reward_probs)
    out = np.zeros((H, S, A, L))
    nxt = np.zeros((S, L))
    nxt[:, 0] = 1.0
    for h in reversed(range(H)):
        for s in range(S):
            for a in range(A):
                acc = np.zeros(L + top)
                for s2 in np.flatnonzero(mdp.P[s, a] > 0):
                    acc += mdp.P[s, a, s2] * np.convolve(rpmf[s, a, s2], nxt[s2])
                out[h, s, a] = acc[:L]
        nxt = np.einsum("sa,sal->sl", probs[h], out[h])
    return resolution * np.arange(L), out


def return_quantiles(support: Any, pmf: Any, taus: Any) -> np.ndarray:
    """Quantiles ``inf{z : F(z) >= tau}`` of ``pmf [..., L]`` on ``support [L]``: ``[..., T]``."""
    z = as_float_array(support, "support", ndim=1)
    p = as_float_array(pmf, "pmf", min_ndim=1)
    if p.shape[-1] != z.shape[0] or z.shape[0] == 0:
        raise ValueError(f"pmf must have a last axis of len(support) = {z.shape[0]} >= 1, got {p.shape}")
    check_distribution(p, "pmf", tol=1e-6)
    levels = as_float_array(taus, "taus", ndim=1)
    if levels.size == 0 or (levels <= 0).any() or (levels >= 1).any():
        raise ValueError(f"taus must be a non-empty list of levels in (0, 1), got {levels.tolist()}")
    cdf = np.cumsum(p, axis=-1)
    idx = (cdf[..., None, :] < levels[:, None] - 1e-12).sum(-1)  # first index with F >= tau
    return z[np.minimum(idx, z.shape[0] - 1)]


def random_tabular_mdp(n_states: int, n_actions: int, H: int, seed: int = 0) -> TabularMDP:
    """A random MDP: ``P(. | s, a) ~ Dirichlet(1)``, Bernoulli rewards with ``p(s, a) ~ U(0, 1)``, uniform
    initial state."""
    S = check_int(n_states, "n_states", low=1)
    A = check_int(n_actions, "n_actions", low=1)
    H = check_int(H, "H", low=1)
    rng = np.random.default_rng(check_int(seed, "seed", low=0))
    P = rng.dirichlet(np.ones(S), size=(S, A))
    p = rng.uniform(size=(S, A))
    values = np.broadcast_to(np.array([0.0, 1.0]), (S, A, 2))
    probs = np.stack([1.0 - p, p], axis=-1)
    return TabularMDP(P, values, probs, np.full(S, 1.0 / S), H)


# States of the two-branch chain.
CHAIN_START, CHAIN_SAFE, CHAIN_RISKY, CHAIN_DEAD = 0, (1, 2, 3), (4, 5, 6), 7


def two_branch_chain(H: int = 8, p_risky: float = 0.3, r_safe: float = 0.5) -> TabularMDP:
    """The "stochastic chain" of the regret experiment: 8 states, 2 actions, start state 0.

    At the start (step 0, reward 0) action 0 enters the *safe* branch (states 1-3), action 1 the *risky*
    branch (states 4-6). In a branch, action 0 ("continue") moves along the branch's cycle and pays
    ``r_safe`` (safe, deterministic) or Bernoulli(``p_risky``) (risky: higher variance, lower mean);
    action 1 ("exit") pays 0 and falls into the dead end (state 7, reward 0 forever). The optimal policy
    takes the safe branch and continues; the risky branch loses ``(H - 1)(r_safe - p_risky)`` per episode
    (1.4 with the defaults).
    """
    H = check_int(H, "H", low=2)
    p_risky = check_float(p_risky, "p_risky", low=0.0, high=1.0)
    r_safe = check_float(r_safe, "r_safe", low=0.0, high=1.0)
    S, A = 8, 2
    P = np.zeros((S, A, S))
    values = np.zeros((S, A, 2))
    probs = np.zeros((S, A, 2))
    probs[..., 0] = 1.0  # reward 0 unless set below
    P[CHAIN_START, 0, CHAIN_SAFE[0]] = 1.0
    P[CHAIN_START, 1, CHAIN_RISKY[0]] = 1.0
    for branch in (CHAIN_SAFE, CHAIN_RISKY):
        for i, s in enumerate(branch):
            P[s, 0, branch[(i + 1) % len(branch)]] = 1.0
            P[s, 1, CHAIN_DEAD] = 1.0
            if branch is CHAIN_SAFE:
                values[s, 0] = (r_safe, r_safe)
            else:
                values[s, 0] = (0.0, 1.0)
                probs[s, 0] = (1.0 - p_risky, p_risky)
    P[CHAIN_DEAD, :, CHAIN_DEAD] = 1.0
    init = np.zeros(S)
    init[CHAIN_START] = 1.0
    return TabularMDP(P, values, probs, init, H)
