"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: PPO training and IPPO.

PPO (Schulman et al. 2017) as Sable trains it (Mahjoub et al., ICML 2025; official code ``instadeepai/Mava``,
``mava/systems/sable/anakin/rec_sable.py``): rollouts of ``rollout_length`` steps from ``n_envs`` parallel
environments are collected with the recurrent form (hidden states carried across steps and rollouts, reset
at episode starts); the update re-evaluates each environment's whole rollout with the chunkwise form from
the hidden state the rollout started with, in an agent order drawn afresh every epoch (``shuffle_agents``).
The team reward is every agent's reward; advantages are GAE per agent (per-agent values from the encoder)
and the clipped ratio is per agent, as in Mava. The IPPO baseline
(:class:`IPPOPolicy`) is a shared-parameter MLP actor and critic on each agent's current observation.

A vectorised environment has ``n_envs``, ``n_agents``, ``obs_dim``, ``n_actions``, ``reset(seed) -> obs
[E, A, obs_dim]`` and ``step(actions [E, A]) -> (obs, reward [E], done [E], info)`` with auto-reset
(:class:`~icml25.rl.sable.env.DelayedCueEnv`, :class:`~icml25.rl.sable.pettingzoo_env.ParallelEnvVectorizer`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from icml25.kernels.checks import check_float, check_int
from icml25.kernels.rng import isolated_rng, make_generator
from icml25.rl.sable.network import SableNet, check_float_tensor

__all__ = ["IPPOPolicy", "PPOConfig", "PPOTrainer", "TrainResult", "VectorEnv"]


class VectorEnv(Protocol):
    """The vectorised multi-agent environment interface the trainer drives."""

    n_envs: int
    n_agents: int
    obs_dim: int
    n_actions: int

    def reset(self, seed: int | None = None) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]: ...


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters (Mava ``rec_sable.yaml``: lr 2.5e-4, rollout 128, 4 epochs, 2 minibatches, γ 0.99,
    λ 0.95, clip 0.2, entropy 0.01, value 0.5, grad-norm 0.5)."""

    lr: float = 2.5e-4
    rollout_length: int = 128
    epochs: int = 4
    n_minibatches: int = 2
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    entropy_coef: float = 0.01
    value_coef: float = 0.5
    max_grad_norm: float = 0.5
    shuffle_agents: bool = True
    """Every PPO epoch permutes the agents of the whole batch (one random permutation) before a
    :class:`~icml25.rl.sable.network.SableNet` re-evaluates it, so the decoder trains on random agent orders
    while acting keeps the fixed order (Mava's ``rec_sable.py``); False trains in the acting order. Policies
    that treat agents independently (:class:`IPPOPolicy`) are left as they are."""

    def __post_init__(self) -> None:
        if not isinstance(self.shuffle_agents, bool):
            raise TypeError(f"shuffle_agents must be a bool, got {self.shuffle_agents!r}")
        for name in ("rollout_length", "epochs", "n_minibatches"):
            check_int(getattr(self, name), name, low=1)
        for name in ("lr", "clip", "max_grad_norm"):
            check_float(getattr(self, name), name, low=0, low_open=True)
        for name in ("gamma", "gae_lambda"):
            check_float(getattr(self, name), name, low=0, high=1)
        for name in ("entropy_coef", "value_coef"):
            check_float(getattr(self, name), name, low=0)


@dataclass
class TrainResult:
    """What :meth:`PPOTrainer.train` returns."""

    episode_returns: np.ndarray
    """Team return of every finished episode, in completion order ([n_episodes])."""
    update_steps: np.ndarray
    """Environment steps (team steps, summed over envs) after each update ([n_updates])."""
    update_returns: np.ndarray
    """Mean team return of the episodes finished in each update's rollout ([n_updates]; NaN if none)."""
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def last_mean(self, n_episodes: int) -> float:
        """Mean team return over the last ``n_episodes`` finished episodes."""
        if len(self.episode_returns) == 0:
            raise ValueError("no episode finished: train longer than one episode")
        return float(np.mean(self.episode_returns[-n_episodes:]))


class IPPOPolicy(nn.Module):
    """IPPO: a shared MLP actor and critic on each agent's current observation (no memory, no communication).

    Args:
        obs_dim, n_actions: per agent; n_agents: A; hidden: width of the two tanh layers; seed: initialisation.
    """

    def __init__(
        self, obs_dim: int, n_actions: int, n_agents: int, hidden: int = 64, seed: int | None = 0
    ) -> None:
        super().__init__()
        for name, v in (
            ("obs_dim", obs_dim),
            ("n_actions", n_actions),
            ("n_agents", n_agents),
            ("hidden", hidden),
        ):
            check_int(v, name, low=1)
        self.obs_dim, self.n_actions, self.n_agents = obs_dim, n_actions, n_agents
        ctx = isolated_rng(seed) if seed is not None else contextlib.nullcontext()
        with ctx:
            self.actor = nn.Sequential(
                nn.Linear(obs_dim, hidden),
                nn.Tanh(),
                nn.Linear(hidden, hidden),
                nn.Tanh(),
                nn.Linear(hidden, n_actions),
            )
            self.critic = nn.Sequential(
                nn.Linear(obs_dim, hidden),
                nn.Tanh(),
                nn.Linear(hidden, hidden),
                nn.Tanh(),
                nn.Linear(hidden, 1),
            )
            nn.init.orthogonal_(self.actor[-1].weight, gain=0.01)

    def initial_state(self, batch_size: int) -> list[torch.Tensor]:
        """No hidden state (an empty list)."""
        return []

    def _check(self, obs: object, ndim: int) -> torch.Tensor:
        obs = check_float_tensor("obs", obs, ndim, f"[..., {self.n_agents}, {self.obs_dim}]")
        if obs.shape[-1] != self.obs_dim or obs.shape[-2] != self.n_agents:
            raise ValueError(f"obs must end in [{self.n_agents}, {self.obs_dim}], got {tuple(obs.shape)}")
        return obs

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, hstate: Any = None, first: Any = None, *, generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:  # fmt: skip
        """obs [B, A, D] -> (actions [B, A], logp [B, A], value [B, A], [])."""
        obs = self._check(obs, 3)
        logits = self.actor(obs)
        B, A, K = logits.shape
        if greedy:
            a = logits.argmax(-1)
        else:
            a = torch.multinomial(
                torch.softmax(logits, -1).reshape(B * A, K), 1, generator=generator
            ).reshape(B, A)
        logp = torch.log_softmax(logits, -1).gather(-1, a[..., None]).squeeze(-1)
        return a, logp, self.critic(obs).squeeze(-1), []

    @torch.no_grad()
    def value(self, obs: torch.Tensor, hstate: Any = None, first: Any = None) -> torch.Tensor:
        """Per-agent values [B, A]."""
        return self.critic(self._check(obs, 3)).squeeze(-1)

    def forward_train(
        self, obs: torch.Tensor, actions: torch.Tensor, dones: Any = None, hstate: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """obs [B, T, A, D], actions [B, T, A] -> (logp, entropy, value), each [B, T, A]."""
        dist = torch.distributions.Categorical(logits=self.actor(self._check(obs, 4)))
        return dist.log_prob(actions), dist.entropy(), self.critic(obs).squeeze(-1)


class PPOTrainer:
    """PPO over a vectorised multi-agent environment for a :class:`~icml25.rl.sable.network.SableNet` or an
    :class:`IPPOPolicy`.

    Args:
        env: a vectorised environment (see the module docstring); policy: the network;
        config: :class:`PPOConfig`; seed: environment resets, action samples and minibatch order.
    """

    def __init__(
        self, env: VectorEnv, policy: nn.Module, config: PPOConfig | None = None, seed: int = 0
    ) -> None:
        for attr in ("n_envs", "n_agents", "obs_dim", "n_actions", "reset", "step"):
            if not hasattr(env, attr):
                raise TypeError(f"env must be a vectorised environment with {attr!r} (see VectorEnv)")
        for attr in ("act", "value", "forward_train", "initial_state"):
            if not hasattr(policy, attr):
                raise TypeError(f"policy must be a SableNet or IPPOPolicy (missing {attr!r})")
        cfg = getattr(policy, "config", None)
        n_ag = cfg.n_agents if cfg is not None else policy.n_agents
        if n_ag != env.n_agents:
            raise NotImplementedError(
                f"the policy has n_agents = {n_ag} but env has {env.n_agents}: the agent count is fixed"
            )
        self.env, self.policy = env, policy
        self.config = config if config is not None else PPOConfig()
        if not isinstance(self.config, PPOConfig):
            raise TypeError(f"config must be a PPOConfig, got {type(self.config).__name__}")
        self.seed = seed
        self.generator = make_generator(seed)
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=self.config.lr, eps=1e-5)
        self._obs: torch.Tensor | None = None
        self.steps = 0

    def _start(self) -> None:
        self._obs = torch.as_tensor(self.env.reset(seed=self.seed), dtype=torch.float32)
        self._first = torch.ones(self.env.n_envs, dtype=torch.bool)
        self._h = self.policy.initial_state(self.env.n_envs)

    def train(self, total_steps: int, callback: Callable[[int, float], None] | None = None) -> TrainResult:
        """Run PPO for ``total_steps`` environment (team) steps, counted over all envs.

        Args:
            total_steps: ≥ ``n_envs · rollout_length`` (one update); callback: called ``(steps, mean
                return)`` after each update (e.g. a progress bar).
        """
        import time

        total_steps = check_int(total_steps, "total_steps")
        per = self.env.n_envs * self.config.rollout_length
        if total_steps < per:
            raise ValueError(
                f"total_steps must be >= n_envs * rollout_length = {per} (one update), got {total_steps}"
            )
        t0 = time.perf_counter()
        if self._obs is None:
            self._start()
        ep_returns: list[float] = []
        running = np.zeros(self.env.n_envs)
        steps, rets = [], []
        for _ in range(total_steps // per):
            batch, finished = self._rollout(running)
            ep_returns.extend(finished)
            self._update(batch)
            self.steps += per
            steps.append(self.steps)
            rets.append(float(np.mean(finished)) if finished else float("nan"))
            if callback is not None:
                callback(self.steps, rets[-1])
        return TrainResult(np.array(ep_returns), np.array(steps), np.array(rets), time.perf_counter() - t0)

    def _rollout(self, running: np.ndarray) -> tuple[dict[str, Any], list[float]]:
        cfg, env, pol = self.config, self.env, self.policy
        E, A, L = env.n_envs, env.n_agents, cfg.rollout_length
        h0 = [h.clone() for h in self._h]
        obs_b = torch.zeros(E, L, A, env.obs_dim)
        act_b = torch.zeros(E, L, A, dtype=torch.long)
        logp_b, val_b = torch.zeros(E, L, A), torch.zeros(E, L, A)
        rew_b, done_b = torch.zeros(E, L), torch.zeros(E, L, dtype=torch.bool)
        first_b = torch.zeros(E, L, dtype=torch.bool)
        finished: list[float] = []
        obs, first, h = self._obs, self._first, self._h
        assert obs is not None
        for t in range(L):
            a, lp, v, h = pol.act(obs, h, first, generator=self.generator)
            nobs, r, d, _ = env.step(a.numpy())
            obs_b[:, t], act_b[:, t], logp_b[:, t], val_b[:, t], first_b[:, t] = obs, a, lp, v, first
            rew_b[:, t] = torch.as_tensor(r, dtype=torch.float32)
            done_b[:, t] = torch.as_tensor(d, dtype=torch.bool)
            running += r
            if d.any():
                finished.extend(running[d].tolist())
                running[d] = 0.0
            obs, first = torch.as_tensor(nobs, dtype=torch.float32), torch.as_tensor(d, dtype=torch.bool)
        self._obs, self._first, self._h = obs, first, h
        last_v = pol.value(obs, h, first)
        adv = torch.zeros(E, L, A)
        gae = torch.zeros(E, A)
        for t in reversed(range(L)):
            nv = last_v if t == L - 1 else val_b[:, t + 1]
            nonterm = (~done_b[:, t]).float()[:, None]
            delta = rew_b[:, t, None] + cfg.gamma * nv * nonterm - val_b[:, t]
            gae = delta + cfg.gamma * cfg.gae_lambda * nonterm * gae
            adv[:, t] = gae
        batch = {"obs": obs_b, "actions": act_b, "logp": logp_b, "values": val_b, "adv": adv,
                 "returns": adv + val_b, "first": first_b, "h0": h0}  # fmt: skip
        return batch, finished

    def _update(self, b: dict[str, Any]) -> None:
        cfg, pol = self.config, self.policy
        E, _, A = b["actions"].shape
        n_mb = min(cfg.n_minibatches, E)
        shuffle = cfg.shuffle_agents and isinstance(pol, SableNet)
        per_agent = ("obs", "actions", "logp", "values", "adv", "returns")
        for _ in range(cfg.epochs):
            perm = torch.randperm(E, generator=self.generator)
            eb = b
            if shuffle:  # one agent order for the epoch; the hidden states sum over agents: unchanged
                agents = torch.randperm(A, generator=self.generator)
                eb = {k: (v[:, :, agents] if k in per_agent else v) for k, v in b.items()}
            for idx in perm.chunk(n_mb):
                h0 = [h[idx] for h in eb["h0"]]
                logp, ent, v = pol.forward_train(eb["obs"][idx], eb["actions"][idx], eb["first"][idx], h0)
                adv = eb["adv"][idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                ratio = torch.exp(logp - eb["logp"][idx])
                pg = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv).mean()
                v_old, ret = eb["values"][idx], eb["returns"][idx]
                v_clip = v_old + (v - v_old).clamp(-cfg.clip, cfg.clip)
                v_loss = 0.5 * torch.max((v - ret) ** 2, (v_clip - ret) ** 2).mean()
                loss = pg + cfg.value_coef * v_loss - cfg.entropy_coef * ent.mean()
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(pol.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
