"""Relative Error Fair Clustering in the Weak-Strong Oracle Model — ICML 2025, P08: the
input conversions shared by the oracles, the coreset and the fair cost.

Wang, Nguyen, Dharangutte, Zhou, Jiang, Braverman, Zhang, "Relative Error Fair Clustering in the Weak-Strong
Oracle Model", ICML 2025 (arXiv 2506.12287; no official code was published). The pipeline is described in
:mod:`icml25.causal_discovery.fair_coreset`.

What :mod:`icml25.kernels.checks` does not cover: point ids that pack into int64 pair keys, group labels of
any comparable type (missing ones rejected) as integer codes, coordinates whose distances cannot overflow.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from icml25.kernels.checks import check_array, check_int

__all__ = ["MAX_ID", "as_generator", "as_group_codes", "as_point_ids", "as_points"]

MAX_ID = 2**31 - 1
"""Largest point id: pair keys pack two ids into one int64."""


def as_point_ids(ids: Any, name: str, *, unique: bool = False, ndim: int | None = 1) -> np.ndarray:
    """``ids`` as an int64 array of point ids in ``[0, MAX_ID]`` (``ndim`` dimensions unless None; distinct if
    ``unique``)."""
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and arr.size == 0):
        raise TypeError(f"{name} must hold integer point ids, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array of point ids, got shape {arr.shape}")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > MAX_ID):
        raise ValueError(f"{name} must hold point ids in [0, {MAX_ID}], got range [{arr.min()}, {arr.max()}]")
    if unique and np.unique(arr).size != arr.size:
        raise ValueError(f"{name} must hold distinct point ids, got {arr.size - np.unique(arr).size} repeats")
    return arr


def as_group_codes(groups: Any, n: int, name: str = "groups") -> tuple[np.ndarray, np.ndarray]:
    """``(codes [n] in 0..G-1, labels [G])``; missing labels (None, NaN, empty strings) are rejected."""
    arr = np.asarray(groups)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of group labels, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} must have one label per point ({n}), got {arr.shape[0]}")
    if arr.dtype.kind == "c" or (arr.dtype.kind not in "biufUSO"):
        raise TypeError(f"{name} must hold int or str group labels, got dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            raise ValueError(f"{name} must label every point, got {int(bad.sum())} missing (NaN/inf) labels")
        if np.any(arr != np.round(arr)):
            raise TypeError(f"{name} must hold int or str group labels, got non-integer floats")
        arr = arr.astype(np.int64)
    elif arr.dtype == object:
        missing = [v is None or (isinstance(v, float) and not math.isfinite(v)) or v == "" for v in arr]
        if any(missing):
            raise ValueError(f"{name} must label every point, got {sum(missing)} missing (None/NaN) labels")
        try:
            labels, codes = np.unique(arr, return_inverse=True)
        except TypeError:
            raise TypeError(f"{name} must hold labels of one comparable type (int or str)") from None
        return codes.astype(np.int64), labels
    elif arr.dtype.kind in "US" and np.any(arr == arr.dtype.type()):
        raise ValueError(
            f"{name} must label every point, got {int(np.sum(arr == ''))} missing (empty-string) labels"
        )
    labels, codes = np.unique(arr, return_inverse=True)
    return codes.astype(np.int64).reshape(-1), labels


def as_generator(seed: Any) -> np.random.Generator:
    """``seed`` if it is a numpy Generator, else a new one from None or a non-negative int."""
    if seed is None or isinstance(seed, np.random.Generator):
        return np.random.default_rng(seed)
    return np.random.default_rng(check_int(seed, "seed (None, an int or a numpy Generator)", low=0))


def as_points(X: Any, name: str = "X") -> np.ndarray:
    """``X`` as a finite float64 ``[n_points, n_features]`` array (non-empty, entries below 1e150)."""
    arr = check_array(X, name, ndim=2, dtype=("float", "int", "bool"), non_empty=True).astype(np.float64)
    peak = float(np.abs(arr).max())
    if peak > 1e150:
        raise ValueError(
            f"{name} must have entries below 1e150 in magnitude (distances overflow), got {peak:.3g}"
        )
    return arr
