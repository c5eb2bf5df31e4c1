"""Hostile-input contract of icml25.rl (CONTRIBUTING.md, "Bad input contract").

P05 GAS: every public callable is registered with a valid example call; :mod:`icml25.kernels.testing`
derives the hostile variants and asserts a clear error or a documented, finite result.
"""

from __future__ import annotations

import numpy as np
import pytest

import icml25.rl as rl
from icml25.kernels import testing as kt
from icml25.kernels.testing import HostileSpec

_rng = np.random.default_rng(0)
_PHI = _rng.normal(size=(12, 3))
_TRAJ = np.cumsum(_rng.normal(size=(10, 3)), 0)
CONST_OK = "identical embeddings are valid: all states are one cluster / one node"

SPECS = [
    HostileSpec(
        "td_cluster",
        rl.td_cluster,
        {"phi": _PHI, "H": 2.0},
        ("phi", "H"),
        {"constant": CONST_OK, "huge": "a distance threshold on finite embeddings: finite centres"},
    ),
    HostileSpec(
        "te_filter",
        rl.te_filter,
        {"phi_traj": _TRAJ, "H": 2, "thr": 0.5},
        ("phi_traj", "thr"),
        {
            "constant": "a standing-still trajectory is valid (no direction: filtered out)",
            "huge": "cosines are scale-free",
            "empty:0": "an empty trajectory keeps no state",
        },
    ),
    HostileSpec(
        "select_subgoal",
        rl.select_subgoal,
        {"path": _PHI[:4], "phi_s": _PHI[5], "H": 2.0},
        ("path", "phi_s", "H"),
        {"constant": CONST_OK, "huge": "distances of finite points"},
    ),
    HostileSpec(
        "KeyGraph.build",
        lambda nodes, H: rl.KeyGraph().build(nodes, H),
        {"nodes": _PHI, "H": 2.0},
        ("nodes", "H"),
        {"constant": CONST_OK, "huge": "distances of finite points"},
        covers=("KeyGraph",),
    ),
    HostileSpec(
        "te_filter_dataset",
        rl.te_filter_dataset,
        {"phi": _TRAJ, "starts": np.array([0]), "ends": np.array([9]), "H": 2, "thr": 0.5},
        ("phi", "starts", "ends", "thr"),
        {
            "phi:constant": "a standing-still trajectory is valid",
            "phi:huge": "cosines are scale-free",
            "starts:constant": "a one-trajectory dataset: any single valid start is valid",
            "ends:constant": "a one-trajectory dataset: any single valid end is valid",
        },
    ),
]
EXCLUDED = {
    "TDR": "an nn.Module built by train_tdr; its inputs are checked by validate_offline_dataset",
    "DirectionalPolicy": "an nn.Module built by train_policy",
    "FlatAgent": "wraps a trained TDR + policy",
    "GASAgent": "fit() goes through validate_offline_dataset (registered below via trajectories)",
    "GridMaze": "an environment: layouts are strings, actions are checked by the gymnasium API",
    "PolicyConfig": "a plain config dataclass",
    "TDRConfig": "a plain config dataclass",
    "generate_stitch_dataset": "a simulator: no array input",
    "train_policy": "trains on a dataset that validate_offline_dataset checks; long-running (not in a 60 s suite)",
    "train_tdr": "trains on a dataset that validate_offline_dataset checks; long-running (not in a 60 s suite)",
    "trajectories": "structure of a dataset validated by validate_offline_dataset",
    "validate_offline_dataset": "the validator itself; exercised by test_gas",
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    print(spec.check().summary())


def test_registry_covers_public_api() -> None:
    print("icml25.rl covers", kt.assert_covers(rl, SPECS, EXCLUDED))
