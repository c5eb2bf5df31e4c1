"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: PettingZoo integration.

Sable (Mahjoub et al., ICML 2025; official code ``instadeepai/Mava``) on environments with the PettingZoo
Parallel API: :class:`DelayedCueParallelEnv` is the delayed-cue game of :mod:`icml25.rl.sable.env` as a
``pettingzoo.ParallelEnv``, and :class:`ParallelEnvVectorizer` runs ``n_envs`` copies of any ParallelEnv
with a fixed agent set, homogeneous Box observations and Discrete actions (e.g. MPE ``simple_spread_v3``
from ``mpe2``) behind the vectorised interface :class:`~icml25.rl.sable.ppo.PPOTrainer` drives.
Needs the ``pettingzoo`` extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

try:
    from gymnasium import spaces
    from pettingzoo import ParallelEnv
except ImportError as err:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "icml25.rl.sable's PettingZoo integration needs pettingzoo: pip install 'icml25-rl[pettingzoo]'"
    ) from err

from icml25.kernels.checks import check_int
from icml25.rl.sable.env import DelayedCueEnv

__all__ = ["DelayedCueParallelEnv", "ParallelEnvVectorizer", "simple_spread"]


def _discrete_action(action: object, name: str, space: spaces.Discrete) -> int:
    """An action of ``Discrete(n)``: a Python or NumPy integer (or a 0-d integer array) in ``[start, start + n)``."""
    if isinstance(action, np.ndarray) and action.shape == () and action.dtype.kind in "iu":
        action = action.item()
    low = int(space.start)
    return check_int(action, name, low=low, high=low + int(space.n) - 1)


class DelayedCueParallelEnv(ParallelEnv):
    """The delayed-cue game (one episode at a time) with the PettingZoo Parallel API.

    Agents ``agent_0 … agent_{A-1}``; observations Box(0, 1, (2 + A + T,)); actions Discrete(2); every agent
    gets the team reward (1 at the last step if all output the cue); all terminate after ``episode_length``.

    Args:
        n_agents: A ≥ 1; episode_length: T ≥ 2; render_mode: unused (no rendering).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "delayed_cue_v0",
        "render_modes": [],
        "is_parallelizable": True,
    }

    def __init__(self, n_agents: int = 3, episode_length: int = 8, render_mode: str | None = None) -> None:
        self._core = DelayedCueEnv(1, n_agents, episode_length, seed=None)
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self.render_mode = render_mode
        d = self._core.obs_dim
        self._obs_space = spaces.Box(0.0, 1.0, (d,), dtype=np.float32)
        self._act_space = spaces.Discrete(2)
        self._t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._obs_space.seed(seed)
            self._act_space.seed(seed)
        obs = self._core.reset(seed=seed)[0]
        self.agents = list(self.possible_agents)
        self._t = 0
        return {a: obs[i] for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            raise ValueError("step() called after the episode ended: call reset() first")
        if not isinstance(actions, dict):
            raise TypeError(f"actions must be a dict {{agent: action}}, got {type(actions).__name__}")
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"actions must hold one action per live agent, missing {missing}")
        acts = np.array(
            [[_discrete_action(actions[a], f"actions[{a!r}]", self._act_space) for a in self.agents]]
        )
        obs, rew, done, info = self._core.step(acts)
        self._t += 1
        last = bool(done[0])
        agents = self.agents
        o = {a: obs[0, i] for i, a in enumerate(agents)}
        r = {a: float(rew[0]) for a in agents}
        term = {a: last for a in agents}
        trunc = {a: False for a in agents}
        infos = {a: {"success": bool(info["success"][0])} if last else {} for a in agents}
        if last:
            self.agents = []
        return o, r, term, trunc, infos

    def render(self) -> None:
        return None

    def close(self) -> None:
        return None


class ParallelEnvVectorizer:
    """``n_envs`` copies of a PettingZoo ParallelEnv as one vectorised team environment (auto-reset).

    Observations are stacked in ``possible_agents`` order ([E, A, obs_dim] float32); the team reward is the
    mean of the agents' rewards; an episode ends when any agent terminates or is truncated.

    Args:
        env_fn: a zero-argument factory of ParallelEnvs (e.g. ``lambda: simple_spread_v3.parallel_env()``).
        n_envs: copies E ≥ 1; seed: reset seeds ``seed, seed + 1, …`` (then advancing per episode).

    Raises:
        NotImplementedError: continuous (non-Discrete) action spaces (Sable needs a Gaussian head for them)
            or agents with different observation/action shapes, or an agent set that changes.
    """

    def __init__(self, env_fn: Callable[[], Any], n_envs: int = 1, seed: int = 0) -> None:
        if not callable(env_fn):
            raise TypeError(
                f"env_fn must be a zero-argument factory of ParallelEnvs, got {type(env_fn).__name__}"
            )
        n_envs = check_int(n_envs, "n_envs", low=1)
        self.envs = [env_fn() for _ in range(n_envs)]
        e0 = self.envs[0]
        if not hasattr(e0, "possible_agents") or not hasattr(e0, "action_space"):
            raise TypeError(f"env_fn must build a pettingzoo ParallelEnv, got {type(e0).__name__}")
        self.agent_ids = list(e0.possible_agents)
        obs_spaces = [e0.observation_space(a) for a in self.agent_ids]
        act_spaces = [e0.action_space(a) for a in self.agent_ids]
        for a, sp in zip(self.agent_ids, act_spaces, strict=True):
            if not isinstance(sp, spaces.Discrete):
                raise NotImplementedError(
                    f"action space of {a!r} is {sp}: continuous action spaces need a Gaussian head, which this "
                    "Sable does not implement; use Discrete actions (e.g. simple_spread_v3(continuous_actions=False))"
                )
        if len({sp.n for sp in act_spaces}) > 1 or len({sp.shape for sp in obs_spaces}) > 1:
            raise NotImplementedError(
                "Sable assumes homogeneous agents: observation shapes "
                f"{[sp.shape for sp in obs_spaces]}, action counts {[sp.n for sp in act_spaces]}"
            )
        self.n_envs, self.n_agents = n_envs, len(self.agent_ids)
        self.obs_dim = int(np.prod(obs_spaces[0].shape))
        self.n_actions = int(act_spaces[0].n)
        self._seed = seed

    def _stack(self, obs: dict, env_index: int) -> np.ndarray:
        if set(obs) != set(self.agent_ids):
            raise NotImplementedError(
                f"env {env_index} returned agents {sorted(obs)}, expected the fixed set {self.agent_ids}: "
                "Sable needs a constant agent count"
            )
        return np.stack([np.asarray(obs[a], dtype=np.float32).reshape(-1) for a in self.agent_ids])

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset every copy; returns obs [E, A, obs_dim]."""
        if seed is not None:
            self._seed = seed
        out = []
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=self._seed + i)
            out.append(self._stack(obs, i))
        self._seed += self.n_envs
        return np.stack(out)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """actions [E, A] ints -> ``(obs [E, A, D], team reward [E], done [E], info)`` with auto-reset."""
        a = np.asarray(actions)
        if a.shape != (self.n_envs, self.n_agents):
            raise ValueError(
                f"actions must have shape [E, A] = {[self.n_envs, self.n_agents]}, got {a.shape}"
            )
        obs_out, rew, done = [], np.zeros(self.n_envs, np.float32), np.zeros(self.n_envs, bool)
        for i, env in enumerate(self.envs):
            obs, r, term, trunc, _ = env.step({ag: int(a[i, j]) for j, ag in enumerate(self.agent_ids)})
            rew[i] = float(np.mean([r.get(ag, 0.0) for ag in self.agent_ids]))
            done[i] = any(term.values()) or any(trunc.values()) or not env.agents
            if done[i]:
                obs, _ = env.reset(seed=self._seed)
                self._seed += 1
            obs_out.append(self._stack(obs, i))
        return np.stack(obs_out), rew, done, {}


def simple_spread(
    n_envs: int = 1, n_agents: int = 3, max_cycles: int = 25, seed: int = 0
) -> ParallelEnvVectorizer:
    """MPE ``simple_spread_v3`` (from ``mpe2``, discrete actions) as the vectorised team env Sable trains on.

    ``n_agents`` agents must cover as many landmarks within ``max_cycles`` steps; observations
    ``[n_envs, n_agents, 6 + 4·n_agents]``, 5 actions. Needs the ``pettingzoo`` extra (it brings ``mpe2``).
    """
    for name, value in (("n_agents", n_agents), ("max_cycles", max_cycles)):
        check_int(value, name, low=1)
    try:
        from mpe2 import simple_spread_v3
    except ImportError as err:  # pragma: no cover - exercised without the extra
        raise ImportError("simple_spread needs mpe2: pip install 'icml25-rl[pettingzoo]'") from err
    return ParallelEnvVectorizer(
        lambda: simple_spread_v3.parallel_env(N=n_agents, max_cycles=max_cycles, continuous_actions=False),
        n_envs=n_envs,
        seed=seed,
    )
