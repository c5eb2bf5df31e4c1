"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: the delayed-cue game.

A vectorised numpy cooperative memory game (our CPU-scale test of Sable's claim of memory over time and
agents; Mahjoub et al., ICML 2025, official code ``instadeepai/Mava``). In each of ``n_envs`` parallel
episodes of ``episode_length`` steps, agent 0 alone sees a random cue ``c ∈ {0, 1}`` at ``t = 0``; at the
last step every agent must output ``c``. The team reward is 1 at the last step if all agents are right,
else 0; other actions are no-ops. A memoryless team policy succeeds with probability 1/2 at best.

Observation of agent ``i`` at step ``t`` (float32, ``2 + A + T``): the cue one-hot (agent 0 at ``t = 0``
only, zeros otherwise), the one-hot agent id and the one-hot timestep.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from icml25.kernels.checks import check_int

__all__ = ["DelayedCueEnv"]


class DelayedCueEnv:
    """Vectorised delayed-cue game with auto-reset at episode ends.

    Not a ``gymnasium.Env`` (nor a ``gymnasium.vector.VectorEnv``): a vectorised multi-agent environment with
    its own interface, the one :class:`~icml25.rl.sable.ppo.PPOTrainer` drives (as
    :class:`~icml25.rl.sable.pettingzoo_env.ParallelEnvVectorizer` does): ``reset(seed=None) -> obs``
    ``[E, A, obs_dim]`` and ``step(actions [E, A]) -> (obs, reward [E], done [E], info)``, a team reward and
    one ``done`` per episode (no terminated/truncated split: every episode ends after ``episode_length``
    steps). The gymnasium-family API is :class:`~icml25.rl.sable.pettingzoo_env.DelayedCueParallelEnv`, the
    same game as a PettingZoo ``ParallelEnv`` (gymnasium spaces).

    Args:
        n_envs: parallel episodes E; n_agents: A ≥ 1; episode_length: T ≥ 2; seed: the cue stream.

    Attributes:
        obs_dim (``2 + A + T``), n_actions (2).
    """

    n_actions = 2

    def __init__(self, n_envs: int, n_agents: int = 3, episode_length: int = 8, seed: int | None = 0) -> None:
        self.n_envs = check_int(n_envs, "n_envs", low=1)
        self.n_agents = check_int(n_agents, "n_agents", low=1)
        self.episode_length = check_int(episode_length, "episode_length", low=2)
        self.obs_dim = 2 + self.n_agents + self.episode_length
        self._rng = np.random.default_rng(seed)
        self._t = np.zeros(self.n_envs, dtype=np.int64)
        self._cue = np.zeros(self.n_envs, dtype=np.int64)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Start every episode; returns obs [E, A, obs_dim] float32."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t[:] = 0
        self._cue = self._rng.integers(0, 2, size=self.n_envs)
        return self._obs()

    def _obs(self) -> np.ndarray:
        E, A = self.n_envs, self.n_agents
        obs = np.zeros((E, A, self.obs_dim), dtype=np.float32)
        show = self._t == 0
        obs[show, 0, self._cue[show]] = 1.0
        obs[:, np.arange(A), 2 + np.arange(A)] = 1.0
        obs[np.arange(E), :, 2 + A + self._t] = 1.0
        return obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Apply actions [E, A] (ints in {0, 1}).

        Returns:
            ``(obs [E, A, obs_dim], reward [E], done [E], info)``: ``done[e]`` marks the last step of an
            episode, after which env ``e`` is reset and ``obs[e]`` is the new episode's first observation;
            ``info["success"]`` [E] bool (meaningful where ``done``).
        """
        a = np.asarray(actions)
        if a.shape != (self.n_envs, self.n_agents):
            raise ValueError(
                f"actions must have shape [E, A] = {[self.n_envs, self.n_agents]}, got {a.shape}"
            )
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"actions must be an integer array [E, A] of 0/1 actions, got dtype {a.dtype}")
        if a.size and (a.min() < 0 or a.max() > 1):
            raise ValueError(f"actions must be integers in {{0, 1}}, got values in [{a.min()}, {a.max()}]")
        last = self._t == self.episode_length - 1
        success = last & (a == self._cue[:, None]).all(axis=1)
        reward = success.astype(np.float32)
        self._t = np.where(last, 0, self._t + 1)
        new_cue = self._rng.integers(0, 2, size=self.n_envs)
        self._cue = np.where(last, new_cue, self._cue)
        return self._obs(), reward, last.copy(), {"success": success}
