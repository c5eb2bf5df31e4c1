"""Sable: a Performant, Efficient and Scalable Sequence Model for MARL — ICML 2025, P45: retention-based MARL.

Mahjoub et al., ICML 2025 (official JAX code ``instadeepai/Mava``). :class:`SableNet` (encoder–decoder
retention policy), :class:`PPOTrainer` (PPO with chunkwise training and recurrent acting), the IPPO baseline
:class:`IPPOPolicy`, the vectorised delayed-cue memory game :class:`DelayedCueEnv`; the PettingZoo
integration (:class:`DelayedCueParallelEnv`, :class:`ParallelEnvVectorizer`, MPE's :func:`simple_spread`)
is imported lazily (extra ``pettingzoo``).
"""

from __future__ import annotations

from typing import Any

from icml25.rl.sable.env import DelayedCueEnv
from icml25.rl.sable.memory import SoftmaxAttentionEncoder, forward_peak_bytes
from icml25.rl.sable.network import MultiScaleRetention, SableConfig, SableNet, SableState
from icml25.rl.sable.ppo import IPPOPolicy, PPOConfig, PPOTrainer, TrainResult, VectorEnv

__all__ = [
    "DelayedCueEnv",
    "DelayedCueParallelEnv",
    "IPPOPolicy",
    "MultiScaleRetention",
    "PPOConfig",
    "PPOTrainer",
    "ParallelEnvVectorizer",
    "SableConfig",
    "SableNet",
    "SableState",
    "SoftmaxAttentionEncoder",
    "TrainResult",
    "VectorEnv",
    "forward_peak_bytes",
    "simple_spread",
]

_LAZY = {"DelayedCueParallelEnv", "ParallelEnvVectorizer", "simple_spread"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from icml25.rl.sable import pettingzoo_env

        return getattr(pettingzoo_env, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
