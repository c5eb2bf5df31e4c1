"""ARROW: An Accelerator for Time Series Causal Discovery with Time Weaving — ICML 2025, P54: time weaving, raw series ->
up/down trend bits -> overlapping patches and their symbols (step 1).

A series ``x_0 … x_{T-1}`` becomes ``T-1`` trend bits ``b_t = 1[x_{t+1} - x_t > eps]``; ties (and
differences at most ``eps``) count as *down* (0), as in the official code. Patch ``p`` covers the
``patch`` points ``x_p … x_{p+patch-1}`` and carries the ``patch-1`` bits ``b_p … b_{p+patch-2}``;
neighbouring patches share all but one bit (the "weaving"). Its symbol is those bits read as a binary
number, most significant first: for the default 3-point patch ``s_p = 2·b_p + b_{p+1} ∈ {0, 1, 2, 3}``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from icml25.kernels.xor_lag import pack_bits


def check_series(X: object, *, name: str = "X", nan_policy: str = "raise", min_length: int = 3) -> np.ndarray:
    """Validate a multivariate series and return it as a float64 ``[T, d]`` array.

    Args:
        X: array-like ``[T, d]`` (time along rows, one column per variable).
        name: argument name used in error messages.
        nan_policy: ``"raise"`` (NaN -> ``ValueError``) or ``"interpolate"`` (linear interpolation in time,
            constant extrapolation at the ends).
        min_length: smallest accepted ``T``.

    Raises:
        TypeError: ``X`` is not numeric (an object array of numbers is converted), or sparse.
        ValueError: complex values, no column, wrong number of dimensions, too short, infinite values, NaN under
            ``nan_policy="raise"``.
    """
    if nan_policy not in ("raise", "interpolate"):
        raise ValueError(f"nan_policy must be 'raise' or 'interpolate', got {nan_policy!r}")
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()
    if hasattr(X, "tocsr") or hasattr(X, "toarray"):  # scipy.sparse matrices and arrays
        raise TypeError(
            f"Sparse data not supported: {name} must be a dense array [T, d], got {type(X).__name__}; "
            "convert it with .toarray()"
        )
    arr = np.asarray(X)
    if arr.dtype == object and arr.ndim == 2:  # numbers stored as Python objects (scikit-learn's convention)
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be a numeric array [T, d]: {err}") from None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must be a numeric array [T, d], got dtype {arr.dtype}")
    if (
        arr.dtype.kind == "c"
    ):  # scikit-learn's wording; a cast to float would drop the imaginary part silently
        raise ValueError(
            f"Complex data not supported: {name} must be a real array [T, d], got dtype {arr.dtype}"
        )
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D [T, d] (time x variables), got shape {arr.shape}")
    T, d = arr.shape
    if d < 1:
        raise ValueError(
            f"{name} has 0 feature(s) (shape={arr.shape}) while a minimum of 1 is required: one column per "
            "variable"
        )
    if T < min_length:
        raise ValueError(
            f"{name} must have at least {min_length} time steps and 1 variable, got {T} sample(s) "
            f"(shape {arr.shape})"
        )
    arr = arr.astype(np.float64, copy=True)
    if np.isinf(arr).any():
        raise ValueError(f"{name} contains infinite values")
    peak = float(np.nanmax(np.abs(arr))) if not np.isnan(arr).all() else 0.0
    if peak > 1e150:  # squares (regressions, variances in the bases) would overflow float64
        raise ValueError(
            f"{name} must have |values| <= 1e150 (squares overflow float64), got max |{name}| = {peak:.3g}"
        )
    nan = np.isnan(arr)
    if nan.any():
        if nan_policy == "raise":
            cols = sorted(set(np.nonzero(nan)[1].tolist()))
            raise ValueError(
                f"{name} contains {int(nan.sum())} NaN values (columns {cols}); "
                "clean them or pass nan_policy='interpolate'"
            )
        t = np.arange(T)
        for j in np.nonzero(nan.any(0))[0]:
            ok = ~nan[:, j]
            if not ok.any():
                raise ValueError(f"{name}[:, {j}] is all NaN and cannot be interpolated")
            arr[:, j] = np.interp(t, t[ok], arr[ok, j])
    return arr


def constant_columns(X: np.ndarray) -> list[int]:
    """Indices of the columns of ``X [T, d]`` that never change (their trend code is all zeros)."""
    return np.nonzero((X == X[:1]).all(0))[0].tolist()


def time_weave(X: object, patch: int = 3, eps: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Encode each series as trend bits and patch symbols.

    Args:
        X: ``[T, d]`` real series.
        patch: points per patch ``w >= 2``; a patch carries ``w - 1`` bits. ARROW uses 3 (2-bit patches);
            other widths are a generalisation not in the official code.
        eps: a step counts as *up* only when ``x_{t+1} - x_t > eps`` (ties are *down*).

    Returns:
        ``bits``: bool ``[T-1, d]``, ``bits[t, i] = x_{t+1,i} - x_{t,i} > eps``;
        ``symbols``: uint8 ``[T-patch+1, d]``, ``symbols[p, i] = Σ_m bits[p+m, i] · 2^(patch-2-m)``.
    """
    if isinstance(patch, bool) or not isinstance(patch, (int, np.integer)) or not 2 <= patch <= 9:
        raise ValueError(f"patch must be an int in [2, 9] (points per patch), got {patch!r}")
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")
    arr = check_series(X, min_length=patch)
    bits = np.diff(arr, axis=0) > eps
    n_p = arr.shape[0] - patch + 1
    symbols = np.zeros((n_p, arr.shape[1]), dtype=np.uint8)
    for m in range(patch - 1):  # most significant bit first
        symbols = (symbols << 1) | bits[m : m + n_p].astype(np.uint8)
    return bits, symbols


def pack_trend_bits(bits: np.ndarray) -> torch.Tensor:
    """Pack ``[T-1, d]`` trend bits into the ``[d, ceil((T-1)/32)]`` int64 words of :mod:`icml25.kernels.xor_lag`.

    Each series' woven stream is its bit sequence; patch ``p`` is bits ``p, p+1`` of it.
    """
    return pack_bits(torch.from_numpy(np.ascontiguousarray(bits.T)))


def warn_constant(cols: list[int]) -> None:
    """Warn that constant series are excluded (their all-zero code would match any other constant series)."""
    if cols:
        warnings.warn(
            f"series {cols} are constant: their trend code is all zeros, so they are excluded as causes and effects",
            UserWarning,
            stacklevel=3,
        )
