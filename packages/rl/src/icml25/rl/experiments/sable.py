"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: small-scale reproduction.

Mahjoub et al., "Sable: a Performant, Efficient and Scalable Sequence Model for MARL", ICML 2025 (official
code: ``instadeepai/Mava``, JAX). Claims: retention gives Sable memory over time as well as over agents
(chunked training over whole rollouts, recurrent acting), and memory growing linearly in the number of agents.

Our CPU-scale test (:data:`FULL`; :class:`Setting` gives each knob's paper value next to ours): the delayed-cue
game (:class:`~icml25.rl.sable.env.DelayedCueEnv`; N = 3 agents, T = 8 steps, 512 envs): agent 0 alone sees a
cue at t = 0 and every agent must output it at t = T − 1. Solving it needs memory over time and across
agents; a memoryless team policy succeeds with probability 1/2 at most. rec-Sable trains with chunks of 4
timesteps on 16-step rollouts spanning 2 episodes (so the cross-chunk state and the mid-rollout reset are
exercised), against ff-Sable (no temporal memory) and IPPO (MLP). Metric: mean team success over the last
10k training episodes. Memory: the peak activation bytes of one ff-Sable training forward pass (agents
retained in chunks of 64, embed 32) at N ∈ {64, 256, 1024} agents against a softmax-attention encoder.
:data:`QUICK`: N = 2, T = 4, 128 envs, 8-step rollouts, chunks of 2 timesteps, 40,960 steps (40 updates), lr 1e-3,
no memory measurement.

Pass rule (:func:`checks`): rec-Sable ≥ 0.9 (quick 0.8); ff-Sable and IPPO ≤ 0.6; rec-Sable ≥ the best
baseline + 0.2; full mode also Sable's memory grows ≤ 5× from 256 to 1024 agents and attention's ≥ 10×.

Deviations (CPU scale): κ with ``decay_scaling_factor`` 1.0 (Mava's config 0.8 gives a cue weight of 0.17
after 7 steps), embed 32, lr 2e-3 (quick 1e-3) instead of 2.5e-4, 2 PPO epochs (Mava 4; quick 1 minibatch), 16-step
rollouts (Mava 128) and 196,608 steps per method (24 updates; 300k planned, cut once for CPU time).

Run: ``python -m icml25.rl.experiments.sable [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icml25.kernels.experiment import (
    Check,
    Report,
    experiment_main,
    new_figure,
    progress,
    save_figure,
    seed_everything,
    threshold_text,
    torch_threads,
)
from icml25.rl.sable import (
    DelayedCueEnv,
    IPPOPolicy,
    PPOConfig,
    PPOTrainer,
    SableConfig,
    SableNet,
    SoftmaxAttentionEncoder,
    TrainResult,
    forward_peak_bytes,
)

PAPER = "P45"
CLAIM = (
    "Sable's retention gives memory over time and across agents (rec-Sable solves a delayed-cue team task "
    "that ff-Sable and IPPO cannot beat chance on) with activation memory linear in the number of agents."
)


@dataclass(frozen=True)
class Setting:
    """One reproduction scale: task, budgets, network and pass bars."""

    n_agents: int
    """Agents (paper: up to 1,000+ on RWARE/SMAX/...; ours the delayed-cue game with 3, quick 2)."""
    episode_length: int
    """Episode length T (ours 8, quick 4)."""
    n_envs: int
    """Parallel environments (Mava 64-512 per task; ours 512, quick 128: with 64, PPO's noisier single minibatch
    fell back towards chance after solving the task on some seeds and vector paths)."""
    rollout_length: int
    """Steps per rollout (Mava 128; ours 2 episodes: 16, quick 8)."""
    chunk_size: int
    """Training chunk in timesteps (Mava 32 / whole rollout; ours 4, quick 2: cross-chunk state is used)."""
    total_steps: int
    """Team environment steps per method (paper ~20M; ours 196,608 = 24 updates, quick 40,960 = 40 updates)."""
    lr: float
    """Adam learning rate (Mava 2.5e-4; ours 2e-3, quick 1e-3: 3e-3 and 2e-3 let PPO collapse back to chance
    after solving the task on some seeds)."""
    eval_episodes: int
    """Success is averaged over the last this many training episodes (ours 10k, quick 1,024)."""
    min_rec_success: float
    """Pass bar on rec-Sable (ours 0.9, quick 0.8; chance 0.5 for a memoryless team)."""
    memory_agents: tuple[int, ...] = ()
    """Agent counts of the memory measurement (ours 64, 256, 1024; quick none)."""
    embed_dim: int = 32
    """Width (Mava 64; ours 32)."""
    n_head: int = 1
    """Retention heads (Mava 1, as here)."""
    decay_scaling_factor: float = 1.0
    """κ multiplier (Mava's config 0.8; ours 1.0: κ = 1 − 1/32 keeps the cue's weight 0.80 after 7 steps)."""
    epochs: int = 4
    """PPO epochs per update (Mava 4; ours 2, for CPU time)."""
    n_minibatches: int = 2
    """Minibatches per epoch (Mava 2, as here; quick 1)."""
    max_baseline_success: float = 0.6
    """Cap on ff-Sable and IPPO (ours 0.6: their ceiling is 0.5)."""


FULL = Setting(
    n_agents=3,
    episode_length=8,
    n_envs=512,
    rollout_length=16,
    chunk_size=4,
    total_steps=196_608,
    lr=2e-3,
    eval_episodes=10_000,
    min_rec_success=0.9,
    memory_agents=(64, 256, 1024),
    epochs=2,
)
QUICK = Setting(
    n_agents=2,
    episode_length=4,
    n_envs=128,
    rollout_length=8,
    chunk_size=2,
    total_steps=40_960,
    lr=1e-3,
    eval_episodes=1_024,
    min_rec_success=0.8,
    epochs=2,
    n_minibatches=1,
)

ORDER_MARGIN = 0.2
"""rec-Sable success minus the best baseline's, at least (the gap between the bars 0.8 and 0.6)."""
MAX_SABLE_MEMORY_GROWTH = 5.0
"""Peak activation memory of Sable at 1024 agents over 256, at most (linear: 4×)."""
MIN_ATTENTION_MEMORY_GROWTH = 10.0
"""The same ratio for softmax attention, at least (quadratic: 16×)."""


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting``: rec-Sable reaches its bar and beats both memoryless baselines, which stay
    under their cap; with a memory measurement, Sable's memory grows linearly and attention's quadratically."""
    cap = setting.max_baseline_success
    out = [
        Check(f"rec-Sable success >= {setting.min_rec_success:g}",
              lambda m: m["rec_sable_success"] >= setting.min_rec_success),
        Check(f"rec-Sable success >= best baseline + {ORDER_MARGIN:g}",
              lambda m: m["rec_sable_success"]
              >= max(m["baseline_ff_sable_success"], m["baseline_ippo_success"]) + ORDER_MARGIN),
        Check(f"ff-Sable success <= {cap:g}", lambda m: m["baseline_ff_sable_success"] <= cap),
        Check(f"IPPO success <= {cap:g}", lambda m: m["baseline_ippo_success"] <= cap),
    ]  # fmt: skip
    if setting.memory_agents:
        out += [
            Check(f"Sable memory growth 256->1024 agents <= {MAX_SABLE_MEMORY_GROWTH:g}x",
                  lambda m: m["sable_memory_growth"] <= MAX_SABLE_MEMORY_GROWTH),
            Check(f"attention memory growth 256->1024 agents >= {MIN_ATTENTION_MEMORY_GROWTH:g}x",
                  lambda m: m["attention_memory_growth"] >= MIN_ATTENTION_MEMORY_GROWTH),
        ]  # fmt: skip
    return out


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


# ----------------------------------------------------------------------------------------- training
def train_method(setting: Setting, method: str, seed: int = 0) -> TrainResult:
    """Train one method (``"rec"``, ``"ff"`` Sable or ``"ippo"``) on the delayed-cue game of ``setting``."""
    env = DelayedCueEnv(setting.n_envs, setting.n_agents, setting.episode_length, seed=seed)
    if method == "ippo":
        policy: Any = IPPOPolicy(env.obs_dim, env.n_actions, env.n_agents, seed=seed)
    elif method in ("rec", "ff"):
        cfg = SableConfig(
            n_agents=setting.n_agents, obs_dim=env.obs_dim, n_actions=env.n_actions,
            embed_dim=setting.embed_dim, n_head=setting.n_head, memory=method,
            decay_scaling_factor=setting.decay_scaling_factor, chunk_size=setting.chunk_size,
        )  # fmt: skip
        policy = SableNet(cfg, seed=seed)
    else:
        raise ValueError(f"method must be 'rec', 'ff' or 'ippo', got {method!r}")
    ppo = PPOConfig(
        lr=setting.lr, rollout_length=setting.rollout_length, epochs=setting.epochs,
        n_minibatches=setting.n_minibatches,
    )  # fmt: skip
    trainer = PPOTrainer(env, policy, ppo, seed=seed)
    n_updates = setting.total_steps // (setting.n_envs * setting.rollout_length)
    bar = progress(total=n_updates, desc=f"P45 {method}")
    result = trainer.train(setting.total_steps, callback=lambda *_: bar.update(1))
    bar.close()
    return result


def measure_memory(
    agent_counts: Sequence[int], embed_dim: int = 32, agents_per_chunk: int = 64
) -> dict[str, list[int]]:
    """Peak activation bytes of one training forward pass at each agent count: ff-Sable with agents retained
    in chunks of ``agents_per_chunk`` (one timestep, batch 1) and the softmax-attention encoder."""
    obs_dim = 8
    out: dict[str, list[int]] = {"sable": [], "attention": []}
    for n in agent_counts:
        apc = min(agents_per_chunk, n)
        net = SableNet(SableConfig(n, obs_dim, 2, embed_dim=embed_dim, memory="ff", agents_per_chunk=apc))
        att = SoftmaxAttentionEncoder(obs_dim, embed_dim)
        obs = torch.randn(1, 1, n, obs_dim, generator=torch.Generator().manual_seed(0))
        act = torch.zeros(1, 1, n, dtype=torch.long)
        out["sable"].append(forward_peak_bytes(lambda net=net, obs=obs, act=act: net.forward_train(obs, act)))
        out["attention"].append(forward_peak_bytes(lambda att=att, obs=obs: att(obs[:, 0])))
    return out


def evaluate(
    setting: Setting,
    seed: int = 0,
    out_dir: str | Path | None = None,
    method: str = "rec",
    baselines: dict[str, TrainResult] | None = None,
) -> Report:
    """Train rec-Sable (or ``method``, e.g. ``"ff"``: the mechanism removed) and the baselines, apply
    :func:`checks`. ``baselines`` reuses trained ``{"ff": ..., "ippo": ...}`` results."""
    t0 = time.perf_counter()
    base = dict(baselines) if baselines is not None else {}
    # A method equal to a given baseline (the broken variant "ff") reuses its run: same seed, same result.
    res = {"rec": base[method] if method in base else train_method(setting, method, seed)}
    for m in ("ff", "ippo"):
        res[m] = base[m] if m in base else train_method(setting, m, seed)
    n = setting.eval_episodes
    metrics: dict[str, float] = {
        "rec_sable_success": res["rec"].last_mean(n),
        "baseline_ff_sable_success": res["ff"].last_mean(n),
        "baseline_ippo_success": res["ippo"].last_mean(n),
        "rec_sable_train_seconds": res["rec"].seconds,
        "n_episodes": float(len(res["rec"].episode_returns)),
    }
    mem = None
    if setting.memory_agents:
        mem = measure_memory(setting.memory_agents, setting.embed_dim)
        i256, i1024 = setting.memory_agents.index(256), setting.memory_agents.index(1024)
        metrics["sable_memory_growth"] = mem["sable"][i1024] / mem["sable"][i256]
        metrics["attention_memory_growth"] = mem["attention"][i1024] / mem["attention"][i256]
        for n_ag, s, a in zip(setting.memory_agents, mem["sable"], mem["attention"], strict=True):
            metrics[f"sable_peak_bytes_{n_ag}"] = float(s)
            metrics[f"attention_peak_bytes_{n_ag}"] = float(a)
    metrics["total_seconds"] = time.perf_counter() - t0
    figures = [plot(out_dir, res, setting, mem)] if out_dir is not None else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="rec_sable_success",
        baseline="baseline_ff_sable_success",
        figures=figures,
        notes=(
            f"delayed-cue game: N={setting.n_agents}, T={setting.episode_length}, {setting.n_envs} envs, "
            f"{setting.rollout_length}-step rollouts, chunk {setting.chunk_size} timesteps, "
            f"{setting.total_steps} steps per method, embed {setting.embed_dim}, {setting.n_head} head, "
            f"decay_scaling_factor {setting.decay_scaling_factor}, lr {setting.lr}; success over the last "
            f"{setting.eval_episodes} training episodes (rec-Sable method: {method!r})."
        ),
    )


def plot(
    out_dir: str | Path, res: dict[str, TrainResult], setting: Setting, mem: dict[str, list[int]] | None
) -> Path:
    """Learning curves of rec-Sable, ff-Sable and IPPO; peak activation memory against N (full mode)."""
    fig, axes = new_figure(1, 2 if mem else 1, figsize=(11 if mem else 6, 4))
    ax = axes[0] if mem else axes
    for key, label in (("rec", "rec-Sable"), ("ff", "ff-Sable"), ("ippo", "IPPO")):
        r = res[key]
        ax.plot(r.update_steps, r.update_returns, label=label)
    ax.axhline(0.5, color="grey", ls=":", lw=1, label="memoryless ceiling")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("team success")
    ax.set_title(f"P45 delayed cue (N={setting.n_agents}, T={setting.episode_length})")
    ax.legend()
    if mem:
        ax2 = axes[1]
        ax2.loglog(
            setting.memory_agents, np.array(mem["sable"]) / 2**20, "o-", label="Sable (agent chunks 64)"
        )
        ax2.loglog(setting.memory_agents, np.array(mem["attention"]) / 2**20, "s-", label="softmax attention")
        ax2.set_xlabel("agents N")
        ax2.set_ylabel("peak activation memory (MiB)")
        ax2.set_title("one training forward pass")
        ax2.legend()
    fig.tight_layout()
    return save_figure(fig, out_dir, "p45_sable")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the Sable claims at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(
        1
    ):  # tiny networks: one thread is fastest on 2 cores and bit-identical across machines
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
