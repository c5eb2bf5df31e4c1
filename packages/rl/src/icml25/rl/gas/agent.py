"""GAS: graph-assisted stitching for offline hierarchical RL — ICML 2025, P05: stage 4, the agent.

:class:`GASAgent` puts the stages together (scikit-learn style: hyper-parameters in ``__init__``, learned
state in ``*_`` attributes after :meth:`GASAgent.fit`):

1. train the TDR φ (:func:`~icml25.rl.gas.tdr.train_tdr`),
2. TE-filter the dataset states, cluster them into key nodes, build the :class:`~icml25.rl.gas.graph.KeyGraph`,
3. train the directional low-level policy (:func:`~icml25.rl.gas.policy.train_policy`; by default the
   official HILP-style actor-critic, ``PolicyConfig(low_level="bc")`` for behaviour cloning alone),
4. act: plan on the graph toward the goal and follow the farthest path node within H, switching to the
   final goal once ≤ ``final_goal_threshold`` path nodes remain.

:meth:`GASAgent.save` writes a fitted agent to a folder (``config.json``: hyper-parameters and network
shapes; ``model.safetensors``: network weights, key nodes, embeddings); :meth:`GASAgent.load` rebuilds it
bit-exactly (same weights, same key graph, hence the same actions).

:class:`FlatAgent` is the flat baseline: the same low-level policy pointed straight at the final goal.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icml25.kernels.rng import isolated_rng
from icml25.kernels.serialization import read_folder, write_folder
from icml25.rl.datasets import trajectories, validate_offline_dataset
from icml25.rl.gas.graph import KeyGraph, select_subgoal, td_cluster, te_filter_dataset
from icml25.rl.gas.policy import DirectionalPolicy, PolicyConfig, train_policy, unit_direction
from icml25.rl.gas.tdr import TDR, TDRConfig, train_tdr

logger = logging.getLogger(__name__)

SAVE_FORMAT = "icml25.rl.GASAgent"
SAVE_VERSION = 1


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
        progress: bool | None = None,
    ) -> GASAgent:
        """Train (or reuse the given) TDR and policy on ``dataset`` and build the key graph. Returns self.

        ``progress``: progress bars over the training steps; ``None`` (default) shows them in a terminal
        once a training has run for 2 s, never in CI (``CI`` set) or when stderr is not a terminal.
        Stages are logged at INFO level on the ``icml25.rl.gas`` loggers.
        """
        data = validate_offline_dataset(dataset)
        logger.info("GAS fit: %d transitions, H=%g, te_threshold=%s", len(data["observations"]), self.H,
                    self.te_threshold)  # fmt: skip
        self.tdr_ = (
            tdr if tdr is not None else train_tdr(data, self.tdr_config, seed=self.seed, progress=progress)
        )
        self.phi_ = self.tdr_.encode(data["observations"])
        self.build_graph(data)
        if policy is None:
            next_phi = self.tdr_.encode(trajectories(data).next_observations)
            policy = train_policy(
                data, self.phi_, self.policy_config, next_phi=next_phi, seed=self.seed, progress=progress
            )
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
        logger.info(
            "GAS key graph: TE filter kept %d/%d states, %d key nodes, %d edges",
            len(self.kept_indices_), len(self.phi_), self.graph_.n_base, self.graph_.graph.number_of_edges(),
        )  # fmt: skip
        return self.graph_

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write the fitted agent to the folder ``path`` (created if needed); returns it as a ``Path``.

        The folder holds ``config.json`` (format, the constructor's hyper-parameters, the networks' shapes)
        and ``model.safetensors`` (TDR and policy weights, the key nodes, ``phi_``, ``kept_indices_``,
        ``node_labels_``). Existing files of those two names are overwritten; nothing is pickled.
        """
        if not hasattr(self, "graph_"):
            raise ValueError("GASAgent is not fitted: call fit(dataset) before save")
        tensors = {f"tdr.{k}": v for k, v in self.tdr_.state_dict().items()}
        tensors.update({f"policy.{k}": v for k, v in self.policy_.state_dict().items()})
        tensors["graph.nodes"] = torch.from_numpy(self.graph_.nodes[: self.graph_.n_base])
        tensors["phi"] = torch.from_numpy(np.asarray(self.phi_))
        tensors["kept_indices"] = torch.from_numpy(np.asarray(self.kept_indices_, dtype=np.int64))
        tensors["node_labels"] = torch.from_numpy(np.asarray(self.node_labels_, dtype=np.int64))
        config = {
            "params": {
                "H": self.H,
                "te_threshold": self.te_threshold,
                "final_goal_threshold": self.final_goal_threshold,
                "seed": self.seed,
                "tdr_config": _config_dict(self.tdr_config),
                "policy_config": _config_dict(self.policy_config),
            },
            "tdr": self.tdr_.config(),
            "policy": self.policy_.config(),
        }
        folder = write_folder(path, tensors, config, format=SAVE_FORMAT, version=SAVE_VERSION)
        logger.info("GAS agent saved to %s", folder)
        return folder

    @classmethod
    def load(cls, path: str | os.PathLike) -> GASAgent:
        """Rebuild an agent written by :meth:`save` (same weights and key graph: the same actions).

        Raises:
            FileNotFoundError: ``path`` or one of its two files does not exist.
            NotADirectoryError: ``path`` is a file.
            ValueError: the files are not a saved :class:`GASAgent` (wrong format, newer version,
                corrupt JSON or safetensors, missing or mismatched tensors).
        """
        folder, config, tensors = read_folder(
            path, format=SAVE_FORMAT, version=SAVE_VERSION, writer="GASAgent.save", package="icml25-rl"
        )
        try:
            params = dict(config["params"])
            params["tdr_config"] = _config_from(TDRConfig, params["tdr_config"])
            params["policy_config"] = _config_from(PolicyConfig, params["policy_config"])
            agent = cls(**params)
            # Building the modules draws initial weights: do it on a private generator (they are overwritten).
            with isolated_rng(0):
                tdr, policy = TDR(**config["tdr"]), DirectionalPolicy(**config["policy"])
            tdr.load_state_dict(_prefixed(tensors, "tdr."))
            policy.load_state_dict(_prefixed(tensors, "policy."))
            agent.tdr_, agent.policy_ = tdr.eval(), policy.eval()
            agent.phi_ = tensors["phi"].numpy()
            agent.kept_indices_ = tensors["kept_indices"].numpy()
            agent.node_labels_ = tensors["node_labels"].numpy()
            agent.graph_ = KeyGraph().build(tensors["graph.nodes"].numpy(), agent.H)
        except (KeyError, TypeError, RuntimeError) as err:
            raise ValueError(f"{folder} does not hold a consistent saved GASAgent: {err!r}") from None
        logger.info("GAS agent loaded from %s (%d key nodes)", folder, agent.graph_.n_base)
        return agent

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


def _config_dict(cfg: TDRConfig | PolicyConfig | None) -> dict[str, Any] | None:
    if cfg is None:
        return None
    out = dataclasses.asdict(cfg)
    out["hidden_dims"] = list(out["hidden_dims"])
    return out


def _config_from(cls: type, data: dict[str, Any] | None) -> Any:
    if data is None:
        return None
    data = dict(data)
    data["hidden_dims"] = tuple(data["hidden_dims"])
    return cls(**data)


def _prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
