"""Offline RL datasets as dicts of numpy arrays (D4RL / Minari / OGBench layout): validation and views.

Shared by the offline methods of this package (first used by *GAS: Graph-Assisted Stitching for offline
hierarchical RL*, catalog id P05).

Layout (one row per transition, ``N`` rows):

- ``observations`` ``(N, obs_dim)`` float, required, finite.
- ``actions`` ``(N,)`` int (discrete) or ``(N, act_dim)`` float (continuous), required.
- ``terminals`` ``(N,)`` bool/0-1, required: True on the last row of a trajectory (OGBench convention; a
  D4RL ``timeouts`` array, when present, also ends a trajectory).
- ``next_observations`` ``(N, obs_dim)``, optional: when absent, the successor of row ``i`` is row
  ``i + 1`` and the last row of each trajectory is not a usable transition.
- ``rewards``, ``timeouts`` ``(N,)``, optional.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

REQUIRED_KEYS: tuple[str, ...] = ("observations", "actions", "terminals")
OPTIONAL_KEYS: tuple[str, ...] = ("next_observations", "rewards", "timeouts")

# A dataset without trajectory boundaries longer than this is probably missing its terminals.
_LONG_SINGLE_TRAJECTORY = 10_000


def validate_offline_dataset(dataset: Mapping[str, object], name: str = "dataset") -> dict[str, np.ndarray]:
    """Check an offline dataset and return it as a dict of numpy arrays.

    Raises:
        TypeError: ``dataset`` is not a mapping.
        ValueError: a required key is missing, the dataset is empty, lengths differ, observations are not
            2-D or contain NaN/inf, or ``next_observations`` has the wrong shape.
    Warns:
        UserWarning: no trajectory boundary before the last row of a long dataset (missing terminals?).
    """
    if not isinstance(dataset, Mapping):
        raise TypeError(
            f"{name} must be a dict of numpy arrays with keys {REQUIRED_KEYS}, got {type(dataset).__name__}"
        )
    missing = [k for k in REQUIRED_KEYS if k not in dataset]
    if missing:
        raise ValueError(
            f"{name} must have keys {list(REQUIRED_KEYS)}; missing {missing} (has {sorted(dataset)})"
        )
    out = {k: np.asarray(v) for k, v in dataset.items() if k in REQUIRED_KEYS + OPTIONAL_KEYS}
    n = len(out["observations"])
    if n == 0:
        raise ValueError(
            f"{name} is empty: 'observations' has 0 rows; an offline method needs at least one transition"
        )
    lengths = {k: len(v) for k, v in out.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"{name} arrays must all have the same length (one row per transition), got {lengths}"
        )
    obs = out["observations"]
    if obs.ndim != 2 or not np.issubdtype(obs.dtype, np.number):
        raise ValueError(
            f"{name}['observations'] must be a numeric array of shape (N, obs_dim), got {obs.dtype} {obs.shape}"
        )
    if not np.all(np.isfinite(obs)):
        bad = int(np.flatnonzero(~np.isfinite(obs).all(axis=1))[0])
        raise ValueError(f"{name}['observations'] must be finite, got NaN/inf (first at row {bad})")
    if "next_observations" in out:
        nxt = out["next_observations"]
        if nxt.shape != obs.shape:
            raise ValueError(
                f"{name}['next_observations'] must have shape {obs.shape} like observations, got {nxt.shape}"
            )
        if not np.all(np.isfinite(nxt)):
            raise ValueError(f"{name}['next_observations'] must be finite, got NaN/inf")
    act = out["actions"]
    if act.ndim not in (1, 2) or not np.issubdtype(act.dtype, np.number):
        raise ValueError(
            f"{name}['actions'] must be (N,) ints or (N, act_dim) floats, got {act.dtype} {act.shape}"
        )
    for key in ("terminals", "timeouts"):
        if key in out:
            arr = out[key]
            if arr.ndim != 1 or not np.isin(arr, (0, 1)).all():
                raise ValueError(
                    f"{name}[{key!r}] must be a (N,) array of bools/0-1, got {arr.dtype} {arr.shape}"
                )
            out[key] = arr.astype(bool)
    ends = out["terminals"] | out.get("timeouts", np.zeros(n, dtype=bool))
    if n > _LONG_SINGLE_TRAJECTORY and not ends[:-1].any():
        warnings.warn(
            f"{name} has {n} rows and no terminals/timeouts before the last row: it is treated as ONE trajectory; "
            "mark trajectory ends in 'terminals' if it holds several",
            stacklevel=2,
        )
    return out


@dataclass(frozen=True)
class Trajectories:
    """Trajectory structure of a validated dataset.

    Attributes:
        starts: ``(T,)`` first row of each trajectory.
        ends: ``(T,)`` last row of each trajectory (inclusive).
        traj_end: ``(N,)`` the last row of the trajectory each row belongs to.
        next_observations: ``(N, obs_dim)`` successor observation of each row (given or derived).
        valid: ``(N,)`` bool, rows that are usable transitions (have a successor).
    """

    starts: np.ndarray
    ends: np.ndarray
    traj_end: np.ndarray
    next_observations: np.ndarray
    valid: np.ndarray


def trajectories(data: Mapping[str, np.ndarray]) -> Trajectories:
    """Split a validated dataset into trajectories at ``terminals | timeouts`` (and the last row)."""
    n = len(data["observations"])
    ends_mask = np.asarray(data["terminals"], dtype=bool).copy()
    if "timeouts" in data:
        ends_mask |= np.asarray(data["timeouts"], dtype=bool)
    ends_mask[-1] = True
    ends = np.flatnonzero(ends_mask)
    starts = np.concatenate([[0], ends[:-1] + 1])
    traj_end = np.repeat(ends, ends - starts + 1)
    obs = data["observations"]
    if "next_observations" in data:
        nxt = np.asarray(data["next_observations"])
        valid = np.ones(n, dtype=bool)
    else:
        # Without next_observations the successor is the next row, so a trajectory's last row has none.
        nxt = np.concatenate([obs[1:], obs[-1:]], axis=0)
        valid = ~ends_mask
    return Trajectories(starts=starts, ends=ends, traj_end=traj_end, next_observations=nxt, valid=valid)
