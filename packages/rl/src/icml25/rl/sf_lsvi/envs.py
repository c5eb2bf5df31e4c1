"""Bellman Unbiasedness (SF-LSVI) — ICML 2025, P43: gymnasium adapters for the finite-horizon agents.

* :class:`TabularMDPEnv`: a :class:`~icml25.rl.sf_lsvi.TabularMDP` as a gymnasium ``Env`` (``Discrete``
  spaces, truncated after ``H`` steps);
* :func:`tabular_mdp_from_gym`: the exact model of a toy-text environment (FrozenLake, CliffWalking, Taxi:
  anything exposing ``unwrapped.P[s][a] = [(prob, s', reward, terminated), ...]``), with one absorbing
  zero-reward state appended for terminations, so :func:`exact_return_moments` gives the exact return
  moments of an agent trained on the environment itself;
* :func:`run_episode`: one finite-horizon episode of an agent on any gymnasium environment.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from icml25.kernels.checks import check_int
from icml25.rl.sf_lsvi.agents import Transition
from icml25.rl.sf_lsvi.mdp import TabularMDP

__all__ = ["TabularMDPEnv", "run_episode", "tabular_mdp_from_gym"]


class TabularMDPEnv(gym.Env):
    """A :class:`TabularMDP` with the gymnasium API.

    ``reset(seed=...)`` draws the initial state from ``mdp.init``; ``step(a)`` samples ``s'`` and the
    reward; the episode is truncated after ``H`` steps (``mdp.H`` by default) and never terminates.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, mdp: TabularMDP, H: int | None = None) -> None:
        if not isinstance(mdp, TabularMDP):
            raise TypeError(f"mdp must be a TabularMDP, got {type(mdp).__name__}")
        self.mdp = mdp
        self.H = mdp.H if H is None else check_int(H, "H", low=1)
        self.observation_space = gym.spaces.Discrete(mdp.n_states)
        self.action_space = gym.spaces.Discrete(mdp.n_actions)
        self._state = 0
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self._state = int(self.np_random.choice(self.mdp.n_states, p=self.mdp.init))
        self._t = 0
        return self._state, {"step": 0}

    def step(self, action: Any) -> tuple[int, float, bool, bool, dict]:
        if not self.action_space.contains(action):
            raise ValueError(f"action must lie in {self.action_space}, got {action!r}")
        reward, self._state = self.mdp.sample(self._state, int(action), self.np_random)
        self._t += 1
        return self._state, reward, False, self._t >= self.H, {"step": self._t}


def tabular_mdp_from_gym(env: gym.Env, H: int) -> TabularMDP:
    """The exact :class:`TabularMDP` of a toy-text gymnasium environment, over horizon ``H``.

    States ``0..S-1`` are the environment's; state ``S`` is an absorbing zero-reward state that every
    terminating transition enters (its reward, which may depend on ``s'``, is kept). The initial
    distribution is ``unwrapped.initial_state_distrib`` when present, else a point mass at state 0.
    """
    if not isinstance(env, gym.Env):
        raise TypeError(f"env must be a gymnasium Env, got {type(env).__name__}")
    base = env.unwrapped
    obs, act = env.observation_space, env.action_space
    if not (isinstance(obs, gym.spaces.Discrete) and isinstance(act, gym.spaces.Discrete)):
        raise TypeError(f"env must have Discrete observation and action spaces, got {obs} and {act}")
    model = getattr(base, "P", None)
    if not isinstance(model, dict):
        raise TypeError(
            f"env must expose its model as unwrapped.P[s][a] = [(prob, next_state, reward, terminated)] "
            f"(gymnasium toy-text), {type(base).__name__} has none"
        )
    H = check_int(H, "H", low=1)
    S, A = int(obs.n), int(act.n)
    end = S  # absorbing state
    joint: dict[tuple[int, int, int], dict[float, float]] = {}
    for s in range(S):
        for a in range(A):
            for prob, s2, reward, done in model[s][a]:
                nxt = end if done else int(s2)
                cell = joint.setdefault((s, a, nxt), {})
                cell[float(reward)] = cell.get(float(reward), 0.0) + float(prob)
    J = max(len(c) for c in joint.values())
    P = np.zeros((S + 1, A, S + 1))
    values = np.zeros((S + 1, A, S + 1, J))
    probs = np.zeros((S + 1, A, S + 1, J))
    probs[..., 0] = 1.0
    for (s, a, nxt), cell in joint.items():
        total = sum(cell.values())
        P[s, a, nxt] = total
        probs[s, a, nxt] = 0.0
        for j, (reward, prob) in enumerate(sorted(cell.items())):
            values[s, a, nxt, j] = reward
            probs[s, a, nxt, j] = prob / total
    P[end, :, end] = 1.0
    init = np.zeros(S + 1)
    dist = getattr(base, "initial_state_distrib", None)
    if dist is None:
        init[0] = 1.0
    else:
        init[:S] = np.asarray(dist, dtype=np.float64)
    return TabularMDP(P, values, probs, init, H)


def run_episode(env: gym.Env, agent: Any, H: int | None = None, *, seed: int | None = None,
                learn: bool = True) -> list[Transition]:  # fmt: skip
    """Run ``agent`` (``act(h, obs)``, ``update(episode)``) for at most ``H`` steps on ``env``.

    ``seed`` is passed to ``env.reset`` (give it on the first episode only, as gymnasium recommends).
    The episode stops early when the environment terminates or truncates. With ``learn`` the agent is
    updated on the episode. Returns the transitions.
    """
    if not isinstance(env, gym.Env):
        raise TypeError(f"env must be a gymnasium Env, got {type(env).__name__}")
    if not (callable(getattr(agent, "act", None)) and callable(getattr(agent, "update", None))):
        raise TypeError(f"agent must have act(h, obs) and update(episode), got {type(agent).__name__}")
    H = check_int(getattr(agent, "H", None) if H is None else H, "H", low=1)
    obs, _ = env.reset(seed=seed)
    episode: list[Transition] = []
    for h in range(H):
        action = agent.act(h, obs)
        nxt, reward, terminated, truncated, _ = env.step(action)
        episode.append(Transition(obs, action, float(reward), nxt, bool(terminated)))
        if terminated or truncated:
            break
        obs = nxt
    if learn:
        agent.update(episode)
    return episode
