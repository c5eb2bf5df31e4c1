"""GAS: graph-assisted stitching for offline hierarchical RL — ICML 2025, P05: stage 4, the agent.

:class:`GASAgent` puts the stages together (scikit-learn style: hyper-parameters in ``__init__``, learned
state in ``*_`` attributes after :meth:`GASAgent.fit`):

1. train the TDR φ (:func:`~icml25.rl.gas.tdr.train_tdr`),
2. TE-filter the dataset states, cluster them into key nodes, build the :class:`~icml25.rl.gas.graph.KeyGraph`,
3. train the directional low-level policy (:func:`~icml25.rl.gas.policy.train_policy`),
4. act: plan on the graph toward the goal and follow the farthest path node within H, switching to the
   final goal once ≤ ``final_goal_threshold`` path nodes remain.

:class:`FlatAgent` is the flat baseline: the same low-level policy pointed straight at the final goal.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from icml25.rl.datasets import trajectories, validate_offline_dataset
from icml25.rl.gas.graph import KeyGraph, select_subgoal, td_cluster, te_filter_dataset
from icml25.rl.gas.policy import DirectionalPolicy, PolicyConfig, train_policy, unit_direction
from icml25.rl.gas.tdr import TDR, TDRConfig, train_tdr


def _check_obs(x: np.ndarray, name: str, dim: int) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float32)
    if arr.shape != (dim,):
        raise ValueError(f"{name} must be one observation of shape ({dim},), got shape {np.shape(x)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr}")
    return arr


class FlatAgent:
    """Flat baseline: act with z = normalise(φ(goal) − φ(obs)), no graph."""

    def __init__(self, tdr: TDR, policy: DirectionalPolicy) -> None:
        self.tdr, self.policy = tdr, policy

    def reset(self) -> None:
        """Nothing to reset (stateless)."""

    def act(self, obs: np.ndarray, goal: np.ndarray) -> int | np.ndarray:
        """Action for one observation ``(obs_dim,)`` and goal observation ``(obs_dim,)``."""
        obs = _check_obs(obs, "obs", self.tdr.obs_dim)
        goal = _check_obs(goal, "goal", self.tdr.obs_dim)
        z = unit_direction(self.tdr.encode(goal), self.tdr.encode(obs))
        action = self.policy.act(obs[None], z[None])[0]
        return int(action) if self.policy.discrete else action


class GASAgent:
    """Graph-Assisted Stitching agent.

    Args:
        H: temporal distance threshold ``way_steps`` (TDR units ≈ steps): TE-filter horizon, 2× the
            clustering radius, edge cutoff and subgoal reach.
        te_threshold: TE cosine threshold in [-1, 1], or ``None`` to disable the filter (ablation).
        final_goal_threshold: switch to the final goal once the remaining path has ≤ this many nodes.
        tdr_config, policy_config: training settings of the two networks.
        seed: seed of both trainings.

    Attributes (after :meth:`fit`):
        tdr_, policy_, graph_: the trained components; kept_indices_: dataset rows kept by the TE filter;
        node_labels_: cluster id of each kept row; phi_: ``(N, tdr_dim)`` embeddings of the dataset.
    """

    def __init__(
        self,
        H: float = 8,
        te_threshold: float | None = 0.99,
        final_goal_threshold: int = 2,
        tdr_config: TDRConfig | None = None,
        policy_config: PolicyConfig | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(H, bool) or not isinstance(H, (int, float)) or not H > 0:
            raise ValueError(
                f"H (temporal distance threshold, in steps) must be a positive number, got {H!r}"
            )
        if te_threshold is not None and not -1.0 <= te_threshold <= 1.0:
            raise ValueError(f"te_threshold must be a cosine in [-1, 1] or None, got {te_threshold!r}")
        if not isinstance(final_goal_threshold, int) or final_goal_threshold < 1:
            raise ValueError(f"final_goal_threshold must be an int >= 1, got {final_goal_threshold!r}")
        self.H = H
        self.te_threshold = te_threshold
        self.final_goal_threshold = final_goal_threshold
        self.tdr_config = tdr_config
        self.policy_config = policy_config
        self.seed = seed
        self.reset()

    def fit(
        self,
        dataset: Mapping[str, np.ndarray],
        *,
        tdr: TDR | None = None,
        policy: DirectionalPolicy | None = None,
        progress: bool = False,
    ) -> GASAgent:
        """Train (or reuse the given) TDR and policy on ``dataset`` and build the key graph. Returns self."""
        data = validate_offline_dataset(dataset)
        self.tdr_ = (
            tdr if tdr is not None else train_tdr(data, self.tdr_config, seed=self.seed, progress=progress)
        )
        self.phi_ = self.tdr_.encode(data["observations"])
        self.build_graph(data)
        if policy is None:
            policy = train_policy(data, self.phi_, self.policy_config, seed=self.seed, progress=progress)
        self.policy_ = policy
        return self

    def build_graph(self, data: Mapping[str, np.ndarray]) -> KeyGraph:
        """TE filter → TD-aware clustering → key graph, from ``self.phi_`` (stage 2)."""
        traj = trajectories(data)
        # TE filter needs an integer step horizon; the other uses of H are distances.
        self.kept_indices_ = te_filter_dataset(
            self.phi_, traj.starts, traj.ends, round(self.H), self.te_threshold
        )
        nodes, _, self.node_labels_ = td_cluster(
            self.phi_[self.kept_indices_], self.H, return_assignment=True
        )
        self.graph_ = KeyGraph().build(nodes, self.H)
        return self.graph_

    @property
    def kept_fraction_(self) -> float:
        """Fraction of dataset states kept by the TE filter."""
        return len(self.kept_indices_) / len(self.phi_)

    def reset(self) -> None:
        """Forget the current goal and plan (call between episodes; a new goal also triggers it)."""
        self._goal: np.ndarray | None = None
        self._phi_goal: np.ndarray | None = None
        self.path_: np.ndarray | None = None
        self.subgoal_: np.ndarray | None = None
        self._final_goal_on = False

    def act(self, obs: np.ndarray, goal: np.ndarray) -> int | np.ndarray:
        """Action toward ``goal`` ``(obs_dim,)`` from ``obs`` ``(obs_dim,)`` (greedy, temperature 0)."""
        if not hasattr(self, "graph_"):
            raise ValueError("GASAgent is not fitted: call fit(dataset) before act")
        obs = _check_obs(obs, "obs", self.tdr_.obs_dim)
        goal = _check_obs(goal, "goal", self.tdr_.obs_dim)
        phi_s = self.tdr_.encode(obs).astype(np.float64)
        if self._goal is None or not np.array_equal(goal, self._goal):
            # New goal: insert it and plan from the closest node even if none is within H.
            self.reset()
            self._goal = goal
            self._phi_goal = self.tdr_.encode(goal).astype(np.float64)
            self.graph_.add_goal(self._phi_goal)
            self.path_ = self.graph_.plan(phi_s, force_closest=True)
        if self._final_goal_on:
            target = self._phi_goal
        else:
            replanned = self.graph_.plan(phi_s, force_closest=False)
            if replanned is not None:  # off the graph: keep following the previous plan
                self.path_ = replanned
            assert self.path_ is not None
            if len(self.path_) <= self.final_goal_threshold:
                self._final_goal_on = True
                target = self._phi_goal
            else:
                target = self.path_[select_subgoal(self.path_, phi_s, self.H)]
        self.subgoal_ = target
        z = unit_direction(target, phi_s).astype(np.float32)
        action = self.policy_.act(obs[None], z[None])[0]
        return int(action) if self.policy_.discrete else action
