"""GAS: graph-assisted stitching for offline hierarchical RL — ICML 2025, P05: the method, in four stages.

Offline goal-conditioned RL from short, fragmentary trajectories: a temporal-distance representation (TDR)
φ, a temporal-efficiency filter and TD-aware clustering turn dataset states into a graph whose shortest
paths supply subgoals to a low-level directional policy — graph search replaces the learned high-level
policy of hierarchical RL. Official code ``qortmdgh4141/GAS`` (JAX).

Modules: :mod:`.tdr` (stage 1), :mod:`.graph` (stage 2), :mod:`.policy` (stage 3), :mod:`.agent` (stage 4).
"""

from icml25.rl.gas.agent import FlatAgent, GASAgent
from icml25.rl.gas.graph import KeyGraph, select_subgoal, td_cluster, te_filter, te_filter_dataset
from icml25.rl.gas.policy import (
    DirectionalCritic,
    DirectionalPolicy,
    PolicyConfig,
    train_policy,
    unit_direction,
    waystep_indices,
)
from icml25.rl.gas.tdr import TDR, TDRConfig, train_tdr

__all__ = [
    "TDR",
    "DirectionalCritic",
    "DirectionalPolicy",
    "FlatAgent",
    "GASAgent",
    "KeyGraph",
    "PolicyConfig",
    "TDRConfig",
    "select_subgoal",
    "td_cluster",
    "te_filter",
    "te_filter_dataset",
    "train_policy",
    "train_tdr",
    "unit_direction",
    "waystep_indices",
]
