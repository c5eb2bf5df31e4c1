"""Bellman Unbiasedness (SF-LSVI) — ICML 2025, P43: tabular and linear SF-LSVI agents, ε-greedy baseline.

SF-LSVI (Statistical-Functional Least-Squares Value Iteration, Cho et al., ICML 2025) regresses the first
``N`` moments of the return at every step ``h`` on moment Bellman targets built from sampled transitions,
going backward ``h = H-1 .. 0`` after every episode, and acts greedily on an optimistic mean:

* moments: ``f_h^(n) = argmin_f sum (f(s, a) - y^(n))^2`` with ``y^(n) = sum_k C(n,k) r^{n-k}
  m_{h+1}^(k)(s', pi_{h+1})`` (:func:`~icml25.rl.sf_lsvi.moment_bellman_target`), projected onto valid
  moment vectors (:func:`~icml25.rl.sf_lsvi.project_moments`);
* decision: the optimistic mean ``Q_h = min(f_h + b_h, r_max (H - h))`` regressed on ``r + max_a
  Q_{h+1}(s', a)`` with the bonus ``b_h = beta / sqrt(N_h(s, a) + lam)`` (tabular) or ``beta sqrt(phi^T
  Lambda_h^{-1} phi)`` (linear), i.e. LSVI-UCB (Jin et al., 2020) on the mean; ``pi_h`` is greedy on ``Q_h``
  with ties broken uniformly at random (and the moment targets average over tied actions, so they describe
  the executed policy).

Two options choose between the paper's Algorithm 1 (Appendix B; no official code) and our earlier reading;
the defaults are the paper's:

* ``moment_targets="optimistic"`` (Algorithm 1, lines 10-11): the moment vector carried to step ``h - 1``
  has the optimistic ``min(f_h^(1) + b_h, r_max (H - h))`` as its first moment (the regressed higher moments
  are then projected with it), so the binomial targets of step ``h - 1`` hold the optimistic mean in their
  cross terms and ``moments_`` are optimistic until the bonus shrinks. ``"regressed"`` (ours): the moments
  are regressed on the unbiased targets of the greedy policy's regressed moments; the optimism lives only
  in the mean used for the decision, so ``moments_`` estimate the executed policy's return distribution
  without the bonus. With ``beta = 0`` the two coincide.
* ``pool_steps=True`` (Algorithm 1, line 5): the fit of step ``h`` uses the transitions of *every* step
  ``h'`` of past episodes (targets built with step ``h + 1``'s estimates), and the bonus counts them all.
  This assumes a **time-homogeneous** MDP (the transition kernel and the reward law do not depend on ``h``,
  as for every :class:`~icml25.rl.sf_lsvi.TabularMDP` and gymnasium env here); with step-dependent kernels
  pass ``pool_steps=False`` (ours, standard LSVI: step ``h`` on the step-``h`` transitions only).

Either way the decision is greedy on the optimistic mean regressed on ``r + V_{h+1}(s')``, so the actions do
not depend on ``N`` or on ``moment_targets``: ``n_moments=1`` is LSVI-UCB (same bonus, same tie-breaking
stream, on the pooled data when ``pool_steps``).

Data: an episode is a sequence of :class:`Transition` ``(state, action, reward, next_state, terminated)``,
one per step ``h = 0, 1, ...`` (at most ``H``); a terminated transition ends the episode (future return 0).
Rewards must lie in ``[0, r_max]`` (the moment projection assumes returns in ``[0, r_max (H - h)]``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from icml25.kernels.checks import check_choice, check_float, check_int
from icml25.rl.sf_lsvi._checks import as_float_array
from icml25.rl.sf_lsvi.mdp import as_policy
from icml25.rl.sf_lsvi.moments import expansion_tensor, moment_bellman_target, project

__all__ = ["EpisodeBatch", "EpsilonGreedyQLearning", "LinearSFLSVI", "TabularSFLSVI", "Transition"]

logger = logging.getLogger(__name__)

_MAX_TABLE = 200_000_000  # float64 entries of the dense tabular statistics (1.6 GB)
MOMENT_TARGETS = ("optimistic", "regressed")


def _options(moment_targets: Any, pool_steps: Any) -> tuple[str, bool]:
    """Validated ``moment_targets`` and ``pool_steps`` (see the module docstring)."""
    moment_targets = check_choice(moment_targets, "moment_targets", MOMENT_TARGETS)
    if not isinstance(pool_steps, (bool, np.bool_)):
        raise TypeError(f"pool_steps must be a bool, got {type(pool_steps).__name__} {pool_steps!r}")
    return moment_targets, bool(pool_steps)


class Transition(NamedTuple):
    """One step of an episode (gymnasium's ``obs, action, reward, next_obs, terminated``)."""

    state: Any
    action: int
    reward: float
    next_state: Any
    terminated: bool = False


@dataclass(frozen=True)
class EpisodeBatch:
    """Episodes of a tabular agent as flat arrays, one row per transition (built by :meth:`from_episodes`)."""

    step: np.ndarray
    state: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_state: np.ndarray
    terminated: np.ndarray
    episode: np.ndarray
    n_episodes: int

    @classmethod
    def from_episodes(cls, episodes: Sequence[Sequence[Transition]]) -> EpisodeBatch:
        """Flatten ``episodes`` (a list of episodes, each a list of :class:`Transition`)."""
        if isinstance(episodes, (str, bytes)) or not isinstance(episodes, Sequence):
            raise TypeError(
                f"episodes must be a list of episodes (lists of Transition), got {type(episodes).__name__}"
            )
        rows: list[tuple[int, Any, Any, Any, Any, bool, int]] = []
        for e, episode in enumerate(episodes):
            for h, tr in enumerate(_transitions(episode, f"episodes[{e}]")):
                if isinstance(tr[2], bool) or not isinstance(tr[2], (int, float, np.integer, np.floating)):
                    raise TypeError(f"episodes[{e}][{h}].reward must be a real number, got {tr[2]!r}")
                rows.append((h, tr[0], tr[1], tr[2], tr[3], bool(tr[4]) if len(tr) > 4 else False, e))
        cols = list(zip(*rows)) if rows else [()] * 7

        def col(i: int, name: str, kind: str) -> np.ndarray:
            try:
                arr = np.asarray(cols[i], dtype=np.float64 if kind == "f" else None)
            except (TypeError, ValueError):
                raise TypeError(f"episodes: every transition's {name} must be a number") from None
            if kind == "i":
                if arr.size and arr.dtype.kind not in "iu":
                    raise TypeError(
                        f"episodes: every transition's {name} must be an int, got dtype {arr.dtype}"
                    )
                arr = arr.astype(np.int64)
            return arr

        return cls(
            step=np.asarray(cols[0], dtype=np.int64),
            state=col(1, "state", "i"),
            action=col(2, "action", "i"),
            reward=col(3, "reward", "f"),
            next_state=col(4, "next_state", "i"),
            terminated=np.asarray(cols[5], dtype=bool),
            episode=np.asarray(cols[6], dtype=np.int64),
            n_episodes=len(episodes),
        )


def _transitions(episode: Any, name: str) -> list[tuple]:
    if isinstance(episode, (str, bytes)) or not isinstance(episode, Sequence):
        raise TypeError(
            f"{name} must be a list of Transition(state, action, reward, next_state, terminated), "
            f"got {type(episode).__name__}"
        )  # fmt: skip
    out = []
    for h, tr in enumerate(episode):
        if not isinstance(tr, tuple) or len(tr) not in (4, 5):
            raise TypeError(
                f"{name}[{h}] must be a Transition(state, action, reward, next_state, terminated), got {tr!r}"
            )
        if len(tr) == 5 and tr[4] and h != len(episode) - 1:
            raise ValueError(f"{name}[{h}] is terminated but is followed by more transitions")
        out.append(tr)
    return out


def _discrete(space: Any, name: str) -> tuple[int, int]:
    """``(n, start)`` of an int or a gymnasium ``Discrete`` space."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n), int(space.start)
    if isinstance(space, gym.spaces.Space):
        raise TypeError(
            f"{name} must be an int or a gymnasium Discrete space for a tabular agent, got {space}; for "
            "continuous or structured observations use LinearSFLSVI with a feature_fn"
        )
    return check_int(space, name, low=1), 0


def _seed(seed: Any) -> int | None:
    return None if seed is None else check_int(seed, "seed", low=0)


def _greedy(q: np.ndarray) -> np.ndarray:
    """Uniform distribution over the exact maximisers along the last axis."""
    ties = q == q.max(-1, keepdims=True)
    return ties / ties.sum(-1, keepdims=True)


class _TabularAgent:
    """Spaces, step/state checks, episode validation and random tie-breaking shared by the tabular agents."""

    def __init__(self, n_states: Any, n_actions: Any, H: int, r_max: float, seed: int | None) -> None:
        self.n_states, self._s_start = _discrete(n_states, "n_states")
        self.n_actions, self._a_start = _discrete(n_actions, "n_actions")
        self.H = check_int(H, "H", low=1)
        self.r_max = check_float(r_max, "r_max", low=0.0, low_open=True)
        self._rng = np.random.default_rng(_seed(seed))

    @classmethod
    def from_env(cls, env: gym.Env, H: int, **kwargs: Any) -> Any:
        """An agent for ``env``'s ``Discrete`` observation and action spaces (``TypeError`` otherwise)."""
        if not isinstance(env, gym.Env):
            raise TypeError(f"env must be a gymnasium Env, got {type(env).__name__}")
        return cls(env.observation_space, env.action_space, H, **kwargs)

    def _step_state(self, h: Any, s: Any) -> tuple[int, int]:
        h = check_int(h, "h", low=0)
        if h >= self.H:
            raise ValueError(f"h must be a step in [0, H) = [0, {self.H}), got {h}")
        if isinstance(s, np.ndarray) and s.ndim == 0:
            s = s.item()
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"s must be an int state of a Discrete space, got {type(s).__name__} {s!r}")
        idx = int(s) - self._s_start
        if not 0 <= idx < self.n_states:
            raise ValueError(
                f"s must be a state in [{self._s_start}, {self._s_start + self.n_states}), got {int(s)}"
            )
        return h, idx

    def _action(self, a: Any) -> int:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"a must be an int action, got {type(a).__name__} {a!r}")
        idx = int(a) - self._a_start
        if not 0 <= idx < self.n_actions:
            raise ValueError(
                f"a must be an action in [{self._a_start}, {self._a_start + self.n_actions}), got {a}"
            )
        return idx

    def _batch(self, data: Any, name: str) -> EpisodeBatch:
        """Validated, 0-based :class:`EpisodeBatch` of ``data`` (episodes or an ``EpisodeBatch``)."""
        batch = data if isinstance(data, EpisodeBatch) else EpisodeBatch.from_episodes(data)
        if (batch.step < 0).any() or (batch.step >= self.H).any():
            raise ValueError(f"{name}: episodes must have at most H = {self.H} transitions")
        for arr, label, start, n in (
            (batch.state, "state", self._s_start, self.n_states),
            (batch.next_state, "next_state", self._s_start, self.n_states),
            (batch.action, "action", self._a_start, self.n_actions),
        ):
            bad = (arr < start) | (arr >= start + n)
            if bad.any():
                raise ValueError(
                    f"{name}: transition {label} must lie in [{start}, {start + n}), got {arr[bad][0]}"
                )
        r = batch.reward
        if not np.isfinite(r).all():
            raise ValueError(f"{name}: every transition's reward must be finite, got {r[~np.isfinite(r)][0]}")
        out = (r < 0) | (r > self.r_max)
        if out.any():
            raise ValueError(
                f"{name}: every transition's reward must lie in the declared range [0, r_max = {self.r_max}] "
                f"(the moments assume returns in [0, r_max * H]), got reward {r[out][0]}"
            )
        return EpisodeBatch(
            batch.step, batch.state - self._s_start, batch.action - self._a_start, r,
            batch.next_state - self._s_start, batch.terminated, batch.episode, batch.n_episodes,
        )  # fmt: skip

    def _episode_weights(self, weights: Any, n_episodes: int) -> np.ndarray:
        if weights is None:
            return np.ones(n_episodes)
        w = as_float_array(weights, "weights", ndim=1)
        if w.shape != (n_episodes,) or (w < 0).any():
            raise ValueError(
                f"weights must be {n_episodes} non-negative numbers (one per episode), got shape {w.shape}"
                + (f" with min {w.min():.3g}" if w.size else "")
            )
        return w

    def _pick(self, q: np.ndarray) -> int:
        ties = np.flatnonzero(q == q.max())
        return int(ties[self._rng.integers(len(ties))]) + self._a_start


class TabularSFLSVI(_TabularAgent):
    """Tabular SF-LSVI: per-``(h, s, a)`` least squares (empirical averages) of moment Bellman targets.

    Args:
        n_states, n_actions: counts, or gymnasium ``Discrete`` spaces (any other space is a ``TypeError``:
            use :class:`LinearSFLSVI`).
        H: horizon. n_moments: ``N``, the moments learned (1 = LSVI-UCB).
        beta: bonus scale (``beta / sqrt(N(s, a) + lam)``); 0 disables optimism (unvisited pairs then have
            mean 0 instead of the optimistic maximum).
        lam: ridge on the counts (0: plain averages; ``lam > 0`` equals :class:`LinearSFLSVI` on one-hot
            features with the same ``lam``).
        r_max: rewards must lie in ``[0, r_max]``.
        eval_policy: optional ``[H, S]`` actions or ``[H, S, A]`` probabilities: the moment targets follow
            this fixed policy (distributional policy evaluation) instead of the greedy one.
        seed: seed of the tie-breaking generator.
        moment_targets: ``"optimistic"`` (the paper's Algorithm 1: the first moment carried and reported is
            ``min(f^(1) + b, r_max (H - h))``) or ``"regressed"`` (ours: the regressed moments, no bonus).
        pool_steps: ``True`` (Algorithm 1: every step's fit uses the transitions of all steps; assumes a
            time-homogeneous MDP) or ``False`` (ours: step ``h`` on the step-``h`` transitions).

    Fitted attributes (updated after every :meth:`update` / :meth:`fit`): ``moments_ [H, S, A, N]``,
    ``q_ [H, S, A]`` (optimistic mean), ``policy_ [H, S, A]`` (greedy, uniform over ties), ``counts_``.
    Statistics are dense: ``H S A (S + 1) (N + 1)`` floats.
    """

    def __init__(self, n_states: Any, n_actions: Any, H: int, n_moments: int = 4, beta: float = 1.0,
                 lam: float = 0.0, r_max: float = 1.0, eval_policy: Any = None,
                 seed: int | None = None, *, moment_targets: str = "optimistic",
                 pool_steps: bool = True) -> None:  # fmt: skip
        super().__init__(n_states, n_actions, H, r_max, seed)
        self.moment_targets, self.pool_steps = _options(moment_targets, pool_steps)
        self.n_moments = check_int(n_moments, "n_moments", low=1)
        self.beta = check_float(beta, "beta", low=0.0)
        self.lam = check_float(lam, "lam", low=0.0)
        S, A = self.n_states, self.n_actions
        size = self.H * S * A * (S + 1) * (self.n_moments + 1)
        if size > _MAX_TABLE:
            raise ValueError(
                f"n_states={S}, n_actions={A}, H={self.H}, n_moments={self.n_moments} need {size} dense "
                "statistics; use LinearSFLSVI with features for a state space this large"
            )
        self.eval_policy = (
            None if eval_policy is None else as_policy(eval_policy, self.H, S, A, "eval_policy")
        )
        self._expand = expansion_tensor(self.n_moments).reshape(self.n_moments, -1).T  # [(j, k), n]
        self._reset()

    def _reset(self) -> None:
        S, A, N = self.n_states, self.n_actions, self.n_moments
        self.counts_ = np.zeros((self.H, S, A))
        self._W = np.zeros(
            (self.H, S, A, S + 1, N + 1)
        )  # sum of r^j over samples landing in s' (S: terminal)
        self._recompute()

    def _add(self, b: EpisodeBatch, w: np.ndarray) -> None:
        nxt = np.where(b.terminated, self.n_states, b.next_state)
        np.add.at(self.counts_, (b.step, b.state, b.action), w)
        powers = b.reward[:, None] ** np.arange(self.n_moments + 1) * w[:, None]
        np.add.at(self._W, (b.step, b.state, b.action, nxt), powers)

    def update(self, episode: Sequence[Transition]) -> TabularSFLSVI:
        """Add one episode (validated first: a rejected episode changes nothing) and refit."""
        b = self._batch([episode], "episode")
        self._add(b, np.ones(len(b.step)))
        self._recompute()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("TabularSFLSVI update: episode of %d steps, %g transitions seen, V_0 max %.4g",
                         len(b.step), self.counts_.sum(), self.q_[0].max())  # fmt: skip
        return self

    def fit(
        self, episodes: Sequence[Sequence[Transition]] | EpisodeBatch, weights: Any = None
    ) -> TabularSFLSVI:
        """Refit from scratch on ``episodes`` with optional per-episode ``weights`` (e.g. a bootstrap)."""
        b = self._batch(episodes, "episodes")
        w = self._episode_weights(weights, b.n_episodes)
        self._reset_stats()
        self._add(b, w[b.episode])
        self._recompute()
        logger.info("TabularSFLSVI fit: %d episodes, %d transitions, H=%d, %d moments",
                    b.n_episodes, len(b.step), self.H, self.n_moments)  # fmt: skip
        return self

    def _reset_stats(self) -> None:
        self.counts_ = np.zeros_like(self.counts_)
        self._W = np.zeros_like(self._W)

    def _recompute(self) -> None:
        H, S, A, N = self.H, self.n_states, self.n_actions, self.n_moments
        moments = np.zeros((H, S, A, N))
        q = np.zeros((H, S, A))
        policy = np.zeros((H, S, A))
        nxt_m = np.zeros((S + 1, N + 1))
        nxt_m[:, 0] = 1.0
        nxt_v = np.zeros(S + 1)
        # pool_steps: every step is fit on the transitions of all steps (Algorithm 1, line 5)
        W_all, counts_all = (self._W.sum(0), self.counts_.sum(0)) if self.pool_steps else (None, None)
        for h in reversed(range(H)):
            W = self._W[h] if W_all is None else W_all
            cnt = (self.counts_[h] if counts_all is None else counts_all) + self.lam
            seen = cnt > 0
            safe = np.where(seen, cnt, 1.0)
            # sum_i y_i^(n) = sum_k C(n,k) sum_i r_i^{n-k} m^(k)(s'_i), one contraction over (s', j, k)
            part = np.swapaxes(W, -1, -2) @ nxt_m  # [S, A, j, k] = sum_i r_i^j m^(k)(s'_i)
            sums = part.reshape(S, A, -1) @ self._expand
            cap = self.r_max * (H - h)
            raw = np.where(seen[..., None], sums / safe[..., None], 0.0)
            mean_opt = (W[..., 1].sum(-1) + W[..., 0] @ nxt_v) / safe
            if self.beta > 0:
                bonus = np.where(seen, self.beta / np.sqrt(safe), np.inf)
            else:
                bonus = np.zeros((S, A))
            if self.moment_targets == "optimistic":  # Algorithm 1, lines 10-11: carry the optimistic mean
                raw[..., 0] = np.minimum(raw[..., 0] + bonus, cap)
            moments[h] = project(raw, cap)
            q[h] = np.minimum(np.where(seen, mean_opt, 0.0) + bonus, cap)
            policy[h] = _greedy(q[h])
            target = policy[h] if self.eval_policy is None else self.eval_policy[h]
            nxt_m[:S, 1:] = np.einsum("sa,san->sn", target, moments[h])
            nxt_v[:S] = q[h].max(1)
        self.moments_, self.q_, self.policy_ = moments, q, policy

    def act(self, h: int, s: Any) -> int:
        """Greedy action on the optimistic mean ``q_[h, s]`` (ties uniformly at random)."""
        h, s = self._step_state(h, s)
        return self._pick(self.q_[h, s])

    def moments(self, h: int, s: Any, a: int) -> np.ndarray:
        """``[N]`` estimated moments ``E[Z_h(s, a)^n]`` of the return of the greedy (or ``eval_policy``).

        With ``moment_targets="optimistic"`` (the default) the first moment is the optimistic
        ``min(f^(1) + b, r_max (H - h))`` and the higher moments carry it (Algorithm 1).
        """
        h, s = self._step_state(h, s)
        return self.moments_[h, s, self._action(a)].copy()

    def q_values(self, h: int, s: Any) -> np.ndarray:
        """``[A]`` optimistic mean values at ``(h, s)``."""
        h, s = self._step_state(h, s)
        return self.q_[h, s].copy()


class EpsilonGreedyQLearning(_TabularAgent):
    """Finite-horizon tabular Q-learning with ε-greedy exploration (the undirected-exploration baseline).

    ``Q_h(s,a) += alpha_n (r + max_a' Q_{h+1}(s', a') - Q_h(s,a))`` with ``alpha_n = (H + 1) / (H + n)``
    (Jin et al., 2018), ``Q`` initialised at 0; acts uniformly at random with probability ``epsilon``,
    else greedily (ties at random). ``policy_`` is the executed (ε-mixed) policy ``[H, S, A]``.
    """

    def __init__(self, n_states: Any, n_actions: Any, H: int, epsilon: float = 0.1, r_max: float = 1.0,
                 seed: int | None = None) -> None:  # fmt: skip
        super().__init__(n_states, n_actions, H, r_max, seed)
        self.epsilon = check_float(epsilon, "epsilon", low=0.0, high=1.0)
        self.q_ = np.zeros((self.H, self.n_states, self.n_actions))
        self.counts_ = np.zeros_like(self.q_)

    @property
    def policy_(self) -> np.ndarray:
        return (1.0 - self.epsilon) * _greedy(self.q_) + self.epsilon / self.n_actions

    def act(self, h: int, s: Any) -> int:
        h, s = self._step_state(h, s)
        if self._rng.random() < self.epsilon:
            return int(self._rng.integers(self.n_actions)) + self._a_start
        return self._pick(self.q_[h, s])

    def update(self, episode: Sequence[Transition]) -> EpsilonGreedyQLearning:
        """One Q-learning step per transition, in order (validated first)."""
        b = self._batch([episode], "episode")
        for h, s, a, r, s2, term in zip(b.step, b.state, b.action, b.reward, b.next_state, b.terminated):
            self.counts_[h, s, a] += 1
            alpha = (self.H + 1) / (self.H + self.counts_[h, s, a])
            v_next = 0.0 if term or h == self.H - 1 else self.q_[h + 1, s2].max()
            self.q_[h, s, a] += alpha * (r + v_next - self.q_[h, s, a])
        return self


class LinearSFLSVI:
    """Linear SF-LSVI: ridge regression of the moment targets on features ``phi(s, a) in R^d``.

    With ``n_moments=1`` this is LSVI-UCB (Jin et al., 2020). Per step ``h``: ``Lambda_h = lam I + sum phi
    phi^T``, ``W_h = Lambda_h^{-1} sum phi y^T`` (``[d, N]``), optimistic ``Q_h(s, a) = min(phi^T w_h + beta
    sqrt(phi^T Lambda_h^{-1} phi), r_max (H - h))`` with ``w_h`` fit to ``r + max_a Q_{h+1}(s', a)``. The
    moments ``phi^T W_h`` (first moment plus the bonus, clipped, with ``moment_targets="optimistic"``) are
    projected onto valid moment vectors (:func:`project_moments`). ``pool_steps=True`` fits every step on
    the transitions of all steps (one ``Lambda`` for all ``h``; a time-homogeneous MDP).

    Args:
        feature_fn: ``feature_fn(state, action) -> [d]`` array (states may be anything the function takes).
        d: feature dimension. H: horizon. n_actions: number of actions (or a gymnasium ``Discrete``).
        n_moments, beta, r_max, seed, moment_targets, pool_steps: as in :class:`TabularSFLSVI`.
        lam: ridge ``> 0``.

    Every update refits all steps on all data (``O(n d^2 A)`` per step): meant for small problems.
    """

    def __init__(self, feature_fn: Callable[[Any, int], Any], d: int, H: int, n_actions: Any,
                 n_moments: int = 4, beta: float = 1.0, lam: float = 1.0, r_max: float = 1.0,
                 seed: int | None = None, *, moment_targets: str = "optimistic",
                 pool_steps: bool = True) -> None:  # fmt: skip
        if not callable(feature_fn):
            raise TypeError(
                f"feature_fn must be a callable (state, action) -> [d] array, got {type(feature_fn).__name__}"
            )
        self.feature_fn = feature_fn
        self.d = check_int(d, "d", low=1)
        self.H = check_int(H, "H", low=1)
        self.n_actions, self._a_start = _discrete(n_actions, "n_actions")
        self.n_moments = check_int(n_moments, "n_moments", low=1)
        self.beta = check_float(beta, "beta", low=0.0)
        self.lam = check_float(lam, "lam", low=0.0, low_open=True)
        self.r_max = check_float(r_max, "r_max", low=0.0, low_open=True)
        self.moment_targets, self.pool_steps = _options(moment_targets, pool_steps)
        self._rng = np.random.default_rng(_seed(seed))
        self._reset()

    def _reset(self) -> None:
        H, d = self.H, self.d
        self._phi: list[list[np.ndarray]] = [[] for _ in range(H)]
        self._phi_next: list[list[np.ndarray]] = [[] for _ in range(H)]
        self._r: list[list[float]] = [[] for _ in range(H)]
        self._term: list[list[bool]] = [[] for _ in range(H)]
        self.W_ = np.zeros((H, d, self.n_moments))
        self.w_ = np.zeros((H, d))
        self.Lambda_inv_ = np.broadcast_to(np.eye(d) / self.lam, (H, d, d)).copy()
        self.counts_ = np.zeros(H)

    def features(self, state: Any) -> np.ndarray:
        """``[A, d]`` features of ``state`` for every action (checked: finite, shape ``[d]`` each)."""
        rows = []
        for a in range(self.n_actions):
            phi = as_float_array(self.feature_fn(state, a + self._a_start), "feature_fn output")
            if phi.shape != (self.d,):
                raise ValueError(
                    f"feature_fn must return a vector of shape (d,) = ({self.d},), got {phi.shape} "
                    f"for action {a}"
                )
            with np.errstate(over="ignore"):
                if not np.isfinite(phi @ phi):
                    raise ValueError("feature_fn output is too large: its squared norm overflows float64")
            rows.append(phi)
        return np.stack(rows)

    def _check_h(self, h: Any) -> int:
        h = check_int(h, "h", low=0)
        if h >= self.H:
            raise ValueError(f"h must be a step in [0, H) = [0, {self.H}), got {h}")
        return h

    def _bonus(self, h: int, feats: np.ndarray) -> np.ndarray:
        width = np.sqrt(np.maximum(np.einsum("...d,de,...e->...", feats, self.Lambda_inv_[h], feats), 0.0))
        return self.beta * width

    def _q(self, h: int, feats: np.ndarray) -> np.ndarray:
        return np.minimum(feats @ self.w_[h] + self._bonus(h, feats), self.r_max * (self.H - h))

    def _moments(self, h: int, feats: np.ndarray) -> np.ndarray:
        cap = self.r_max * (self.H - h)
        raw = feats @ self.W_[h]
        if self.moment_targets == "optimistic":  # Algorithm 1, lines 10-11: carry the optimistic mean
            raw[..., 0] = np.minimum(raw[..., 0] + self._bonus(h, feats), cap)
        return project(raw, cap)

    def _rows(self, episode: Any, name: str) -> list[tuple[np.ndarray, float, np.ndarray, bool]]:
        trs = _transitions(episode, name)
        if len(trs) > self.H:
            raise ValueError(f"{name} must have at most H = {self.H} transitions, got {len(trs)}")
        rows = []
        for h, tr in enumerate(trs):
            s, a, r, s2 = tr[:4]
            term = bool(tr[4]) if len(tr) > 4 else False
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
                raise TypeError(f"{name}[{h}].action must be an int, got {type(a).__name__}")
            if not 0 <= int(a) - self._a_start < self.n_actions:
                raise ValueError(
                    f"{name}[{h}].action must lie in [{self._a_start}, "
                    f"{self._a_start + self.n_actions}), got {a}"
                )
            r = check_float(r, f"{name}[{h}].reward")
            if not 0.0 <= r <= self.r_max:
                raise ValueError(
                    f"{name}[{h}].reward must lie in the declared range [0, r_max = {self.r_max}], got {r}"
                )
            try:
                phi = self.features(s)[int(a) - self._a_start]
                phi_next = np.zeros((self.n_actions, self.d)) if term else self.features(s2)
            except (ValueError, TypeError) as exc:  # the user's feature_fn failed on this state
                raise type(exc)(f"{name}[{h}]: {exc}") from None
            rows.append((phi, r, phi_next, term))
        return rows

    def update(self, episode: Sequence[Transition]) -> LinearSFLSVI:
        """Add one episode (features computed and validated first) and refit every step."""
        self._append(self._rows(episode, "episode"))
        self._recompute()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("LinearSFLSVI update: %d transitions seen", int(sum(self.counts_)))
        return self

    def _append(self, rows: list[tuple[np.ndarray, float, np.ndarray, bool]]) -> None:
        for h, (phi, r, phi_next, term) in enumerate(rows):
            self._phi[h].append(phi)
            self._r[h].append(r)
            self._phi_next[h].append(phi_next)
            self._term[h].append(term)

    def fit(self, episodes: Sequence[Sequence[Transition]]) -> LinearSFLSVI:
        """Refit from scratch on ``episodes``."""
        if isinstance(episodes, (str, bytes)) or not isinstance(episodes, Sequence):
            raise TypeError(f"episodes must be a list of episodes, got {type(episodes).__name__}")
        all_rows = [self._rows(ep, f"episodes[{e}]") for e, ep in enumerate(episodes)]
        self._reset()
        for rows in all_rows:
            self._append(rows)
        self._recompute()
        logger.info("LinearSFLSVI fit: %d episodes, %d transitions, H=%d, d=%d, %d moments",
                    len(all_rows), sum(len(r) for r in all_rows), self.H, self.d, self.n_moments)  # fmt: skip
        return self

    def _data(self, h: int | None) -> tuple[int, Any, Any, Any, Any]:
        """``(n, phi [n, d], r [n], phi_next [n, A, d], term [n])`` of step ``h`` (``None``: all steps)."""
        steps = range(self.H) if h is None else (h,)
        n = sum(len(self._r[i]) for i in steps)
        if n == 0:
            return 0, None, None, None, None
        return (
            n,
            np.stack([x for i in steps for x in self._phi[i]]),
            np.asarray([x for i in steps for x in self._r[i]], dtype=np.float64),
            np.stack([x for i in steps for x in self._phi_next[i]]),
            np.asarray([x for i in steps for x in self._term[i]], dtype=bool),
        )

    def _recompute(self) -> None:
        H, d, N = self.H, self.d, self.n_moments
        pooled = self._data(None) if self.pool_steps else None  # Algorithm 1, line 5: all steps' data
        for h in reversed(range(H)):
            n, phi, r, feats, term = pooled if pooled is not None else self._data(h)
            self.counts_[h] = len(self._r[h])  # transitions seen at step h (the fit may pool all steps)
            if n == 0:
                self.W_[h], self.w_[h], self.Lambda_inv_[h] = 0.0, 0.0, np.eye(d) / self.lam
                continue
            if h == H - 1:
                m_next, v_next = np.zeros((n, N)), np.zeros(n)
            else:
                q_next = self._q(h + 1, feats)
                pi = _greedy(q_next)
                m_next = np.einsum("na,nam->nm", pi, self._moments(h + 1, feats))
                v_next = q_next.max(1)
                m_next[term], v_next[term] = 0.0, 0.0
            y = moment_bellman_target(r, m_next)
            lam_inv = np.linalg.inv(self.lam * np.eye(d) + phi.T @ phi)
            self.Lambda_inv_[h] = (lam_inv + lam_inv.T) / 2
            self.W_[h] = self.Lambda_inv_[h] @ (phi.T @ y)
            self.w_[h] = self.Lambda_inv_[h] @ (phi.T @ (r + v_next))

    def act(self, h: int, state: Any) -> int:
        """Greedy action on the optimistic mean (ties uniformly at random)."""
        q = self._q(self._check_h(h), self.features(state))
        ties = np.flatnonzero(q == q.max())
        return int(ties[self._rng.integers(len(ties))]) + self._a_start

    def q_values(self, h: int, state: Any) -> np.ndarray:
        """``[A]`` optimistic mean values."""
        return self._q(self._check_h(h), self.features(state))

    def moments(self, h: int, state: Any, a: int) -> np.ndarray:
        """``[N]`` estimated (projected) moments of the return from ``(h, state, a)``."""
        h = self._check_h(h)
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"a must be an int action, got {type(a).__name__}")
        idx = int(a) - self._a_start
        if not 0 <= idx < self.n_actions:
            raise ValueError(
                f"a must be an action in [{self._a_start}, {self._a_start + self.n_actions}), got {a}"
            )
        return self._moments(h, self.features(state)[idx])
