"""Compelling ReLU Networks to Exhibit Exponentially Many Linear Regions — ICML 2025, P23: the exact 1-D linear-region counter.

Milkert, Hyde, Laine, "Compelling ReLU Networks to Exhibit Exponentially Many Linear Regions at
Initialization and During Training", ICML 2025 (arXiv 2311.18022; no official code was published).

:func:`count_linear_regions_1d` counts the activation and linear regions of any 1-input ``Linear``/``ReLU``/
``LeakyReLU`` ``Sequential`` (or a :class:`~icml25.interpretability.relu_regions.TriangleNet`) on an interval
exactly, by propagating a breakpoint partition layer by layer (float64 with snapping, or exact rationals
with ``exact=True``). It is the measurement of the paper's claim: :func:`fit_1d
<icml25.interpretability.relu_regions_training.fit_1d>` logs it during training and the experiment reports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import nn

from icml25.interpretability.relu_regions import TriangleNet
from icml25.kernels.checks import check_float

__all__ = ["RegionCount", "count_linear_regions_1d", "linear_relu_layers"]


@dataclass(frozen=True)
class RegionCount:
    """Regions of a 1-D piecewise-linear network on ``[lo, hi]``.

    ``activation_regions``: intervals of constant ReLU pattern; ``linear_regions``: maximal intervals on
    which the output is affine (neighbours with equal slope merged); ``breakpoints``: the interior kinks of
    the output (floats, or ``Fraction`` with ``exact=True``); ``activation_breakpoints``: the interior
    pattern changes; ``slopes``: the output slope on each activation region.
    """

    activation_regions: int
    linear_regions: int
    breakpoints: tuple
    activation_breakpoints: tuple = ()
    slopes: tuple = field(default=(), repr=False)


_ALLOWED = (nn.Linear, nn.ReLU, nn.LeakyReLU, nn.Identity)


def linear_relu_layers(model: Any) -> list[nn.Module]:
    """The flat list of ``Linear``/``ReLU``/``LeakyReLU``/``Identity`` layers of ``model`` (a
    :class:`~icml25.interpretability.relu_regions.TriangleNet` through its ``to_mlp``; nested ``Sequential``
    flattened, eval-mode ``Dropout`` skipped); ``TypeError`` for anything else."""
    if isinstance(model, TriangleNet):
        model = model.to_mlp()
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"model must be an nn.Sequential of Linear/ReLU/LeakyReLU (or a TriangleNet), got "
            f"{type(model).__name__}"
        )
    mods = []
    for name, m in model.named_children():
        if isinstance(m, nn.Sequential):
            mods += linear_relu_layers(m)
        elif isinstance(m, nn.Dropout) and not m.training:
            continue  # eval-mode dropout is the identity
        elif not isinstance(m, _ALLOWED):
            mode = " in train mode" if isinstance(m, nn.Dropout) else ""
            raise TypeError(
                f"model holds an unsupported module {name!r}: {type(m).__name__}{mode}; "
                "count_linear_regions_1d handles Linear, ReLU, LeakyReLU (and eval-mode Dropout) only"
            )
        else:
            mods.append(m)
    return mods


def count_linear_regions_1d(
    model: nn.Sequential | TriangleNet,
    lo: float,
    hi: float,
    exact: bool = False,
    merge_tol: float = 1e-12,
    snap_tol: float = 1e-13,
) -> RegionCount:
    """Exact linear-region count of a 1-input ReLU network on ``[lo, hi]`` by breakpoint propagation.

    On every interval of the current partition each neuron is affine in ``x``; a ReLU/LeakyReLU splits an
    interval where its pre-activation crosses zero strictly inside it. Cost O(depth x width x #intervals).

    Args:
        model: an ``nn.Sequential`` of ``Linear`` (the first with ``in_features == 1``), ``ReLU``,
            ``LeakyReLU``, ``Identity`` and eval-mode ``Dropout`` (nested ``Sequential`` allowed), or a
            :class:`TriangleNet` (counted through :meth:`~TriangleNet.to_mlp`).
        lo, hi: the interval, ``lo < hi``.
        exact: rational arithmetic (``fractions.Fraction`` of the float weights, no tolerances): the exact
            count of the float network as written. Slow; for small networks.
        merge_tol: neighbouring pieces merge into one linear region when their slopes differ by at most
            ``merge_tol * max(1, max |slope|)`` (float mode; exact mode merges equal slopes only).
        snap_tol: float mode drops zero crossings within ``snap_tol * (hi - lo)`` of a breakpoint (float
            error at points where a pre-activation touches zero without crossing, e.g. a wave's valley).

    Returns:
        :class:`RegionCount`.
    """
    mods = linear_relu_layers(model)
    lo_f, hi_f = check_float(lo, "lo"), check_float(hi, "hi")
    if lo_f >= hi_f:
        raise ValueError(f"lo must be < hi, got lo={lo_f} and hi={hi_f}")
    if not isinstance(exact, bool):
        raise TypeError(f"exact must be a bool, got {type(exact).__name__}")
    merge_tol, snap_tol = check_float(merge_tol, "merge_tol"), check_float(snap_tol, "snap_tol")
    if merge_tol < 0 or snap_tol < 0:
        raise ValueError(f"merge_tol and snap_tol must be >= 0, got {merge_tol} and {snap_tol}")
    linears = [m for m in mods if isinstance(m, nn.Linear)]
    if not linears:
        raise TypeError("model must contain at least one nn.Linear layer")
    if linears[0].in_features != 1:
        raise TypeError(
            f"model's first Linear must take one input feature (a 1-D network), got in_features="
            f"{linears[0].in_features}"
        )

    def conv(t: torch.Tensor) -> np.ndarray:
        arr = t.detach().to("cpu", torch.float64).numpy()
        if not np.isfinite(arr).all():
            raise ValueError("model has non-finite weights; regions are undefined")
        if exact:
            return np.vectorize(Fraction, otypes=[object])(arr) if arr.size else arr.astype(object)
        return arr

    num = Fraction if exact else float
    pts = [num(lo_f), num(hi_f)]  # partition points, sorted
    A = np.array([[num(1)]], dtype=object if exact else np.float64)  # (intervals, width): h = A x + B
    B = np.array([[num(0)]], dtype=object if exact else np.float64)
    snap = 0.0 if exact else snap_tol * (hi_f - lo_f)
    for m in mods:
        if isinstance(m, nn.Linear):
            W = conv(m.weight)
            b = conv(m.bias) if m.bias is not None else np.zeros(W.shape[0], dtype=W.dtype)
            if W.shape[1] != A.shape[1]:
                raise TypeError(
                    f"model's Linear {W.shape[1]}->{W.shape[0]} does not fit the previous width {A.shape[1]}"
                )
            A, B = A @ W.T, B @ W.T + b
            continue
        if isinstance(m, nn.Identity):
            continue
        neg = num(float(m.negative_slope)) if isinstance(m, nn.LeakyReLU) else num(0)
        if not exact and not math.isfinite(float(neg)):
            raise ValueError("LeakyReLU negative_slope must be finite")
        # Zero crossings strictly inside each interval.
        new_pts: list = []
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # |z| = inf is out of range
            crossings = -B / np.where(A == 0, 1, A) if not exact else None
        for k in range(len(pts) - 1):
            left, right = pts[k], pts[k + 1]
            for j in range(A.shape[1]):
                a_kj = A[k, j]
                if a_kj == 0:
                    continue
                z = -B[k, j] / a_kj if exact else crossings[k, j]
                if left + snap < z < right - snap:
                    new_pts.append(z)
        if new_pts:
            merged = sorted(set(pts) | set(new_pts))
            if not exact and snap > 0:  # drop crossings closer than snap to an accepted point
                keep = [merged[0]]
                for p in merged[1:-1]:
                    if p - keep[-1] > snap:
                        keep.append(p)
                if merged[-1] - keep[-1] <= snap and len(keep) > 1:
                    keep.pop()
                keep.append(merged[-1])
                merged = keep
            parent = np.searchsorted(np.asarray([float(p) for p in pts]), [float(p) for p in merged[:-1]],
                                     side="right") - 1  # fmt: skip
            if exact:  # float searchsorted can misplace nearly equal rationals: recompute exactly
                parent = np.array([_parent_exact(pts, p) for p in merged[:-1]])
            A, B, pts = A[parent], B[parent], merged
        mids = np.array([(pts[k] + pts[k + 1]) / 2 for k in range(len(pts) - 1)], dtype=A.dtype)
        active = (A * mids[:, None] + B) > 0
        factor = np.where(active, num(1), neg).astype(A.dtype)
        A, B = A * factor, B * factor
    if A.shape[1] != 1:
        slopes_all = [tuple(row) for row in A]
    else:
        slopes_all = [row[0] for row in A]
    n_act = len(pts) - 1
    kinks: list = []
    if exact:
        for k in range(n_act - 1):
            if slopes_all[k] != slopes_all[k + 1]:
                kinks.append(pts[k + 1])
    else:
        S = np.asarray(A, dtype=np.float64)
        scale = max(1.0, float(np.abs(S).max()) if S.size else 1.0)
        for k in range(n_act - 1):
            if float(np.abs(S[k] - S[k + 1]).max()) > merge_tol * scale:
                kinks.append(float(pts[k + 1]))
    inner = tuple(pts[1:-1]) if exact else tuple(float(p) for p in pts[1:-1])
    return RegionCount(
        activation_regions=n_act,
        linear_regions=len(kinks) + 1,
        breakpoints=tuple(kinks),
        activation_breakpoints=inner,
        slopes=tuple(slopes_all),
    )


def _parent_exact(pts: list, p: Any) -> int:
    lo, hi = 0, len(pts) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pts[mid] <= p:
            lo = mid
        else:
            hi = mid
    return lo
