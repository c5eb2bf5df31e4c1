"""Array conversions and a probability check shared by the SF-LSVI modules, on :mod:`icml25.kernels.checks`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from icml25.kernels.checks import check_array


def as_float_array(x: Any, name: str, *, ndim: int | None = None, min_ndim: int = 0) -> np.ndarray:
    """``x`` (numpy array, torch tensor, list or number) as a finite float64 numpy array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = check_array(x, name, ndim=ndim, dtype=("float", "int")).astype(np.float64)
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {arr.shape}")
    return arr


def as_int_array(x: Any, name: str, *, low: int, high: int) -> np.ndarray:
    """``x`` as an int64 array with entries in ``[low, high)``."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = check_array(x, name, dtype="int").astype(np.int64)
    if arr.size and (arr.min() < low or arr.max() >= high):
        raise ValueError(f"{name} entries must lie in [{low}, {high}), got range [{arr.min()}, {arr.max()}]")
    return arr


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
