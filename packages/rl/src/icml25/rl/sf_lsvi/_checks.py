"""Input checks shared by the SF-LSVI modules: clear ``ValueError``/``TypeError`` naming the argument."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


def as_float_array(x: Any, name: str, *, ndim: int | None = None, min_ndim: int = 0) -> np.ndarray:
    """``x`` (numpy array, torch tensor, list or number) as a finite float64 numpy array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged lists
        raise TypeError(f"{name} must be a real numeric array, got {type(x).__name__} ({exc})") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a real numeric (int or float) array, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {arr.shape}")
    finite = np.isfinite(arr)
    if not finite.all():
        n_nan = int(np.isnan(arr).sum())
        raise ValueError(
            f"{name} must be finite; got {n_nan} NaN and {int((~finite).sum()) - n_nan} Inf values in an "
            f"array of shape {arr.shape}"
        )
    return arr


def as_int_array(x: Any, name: str, *, low: int, high: int) -> np.ndarray:
    """``x`` as an int64 array with entries in ``[low, high)``."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < low or arr.max() >= high):
        raise ValueError(f"{name} entries must lie in [{low}, {high}), got range [{arr.min()}, {arr.max()}]")
    return arr


def check_int(x: Any, name: str, *, minimum: int) -> int:
    """A Python/numpy integer ``>= minimum`` (bools rejected)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__} {x!r}")
    if int(x) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(x)}")
    return int(x)


def check_float(x: Any, name: str, *, minimum: float | None = None, maximum: float | None = None,
                strict_min: bool = False) -> float:  # fmt: skip
    """A finite real number in the given range (bools and strings rejected)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__} {x!r}")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    if minimum is not None and (x <= minimum if strict_min else x < minimum):
        raise ValueError(f"{name} must be {'>' if strict_min else '>='} {minimum}, got {x}")
    if maximum is not None and x > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {x}")
    return x


def check_distribution(p: np.ndarray, name: str, *, tol: float = 1e-8) -> None:
    """Non-negative entries summing to 1 along the last axis."""
    if p.shape[-1] == 0:
        raise ValueError(
            f"{name} must have a non-empty last axis (a probability vector), got shape {p.shape}"
        )
    if (p < 0).any():
        raise ValueError(f"{name} must be non-negative (probabilities), got min {p.min():.3g}")
    err = np.abs(p.sum(-1) - 1.0)
    if (err > tol).any():
        raise ValueError(f"{name} must sum to 1 along its last axis, got sums off by up to {err.max():.3g}")


def like_input(out: np.ndarray, template: Any) -> Any:
    """``out`` as a float64 torch tensor when ``template`` is a tensor, else the numpy array."""
    if isinstance(template, torch.Tensor):
        return torch.from_numpy(np.ascontiguousarray(out)).to(template.device)
    return out
