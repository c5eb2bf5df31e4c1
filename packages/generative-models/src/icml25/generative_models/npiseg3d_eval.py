"""NPISeg3D: Probabilistic Interactive 3D Segmentation with Hierarchical Neural Processes — ICML 2025, P17: the interactive evaluation protocol.

Liu et al., ICML 2025 (arXiv 2505.01726; official code ``jliu4ai/NPISeg3D``, built on AGILE3D). Simulated
users and the metrics the paper reports:

* :func:`knn` (the point cloud's kNN graph), :func:`simulate_clicks` (the next click per label at the most
  interior point of its largest error region, optionally weighted by uncertainty, official ``seg_new.py``)
  and :func:`clicks_on_graph` (the same on a precomputed graph);
* :func:`object_ious`, :func:`noc_at`, :func:`uncertainty_auroc`, :func:`expected_calibration_error`;
* :func:`check_points` / :func:`check_labels`: the point-cloud and label validation the segmenter shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.calibration import calibration_curve
from sklearn.metrics import roc_auc_score

from icml25.kernels.checks import check_array, check_float, check_int

__all__ = [
    "Click",
    "check_labels",
    "check_points",
    "clicks_on_graph",
    "expected_calibration_error",
    "knn",
    "noc_at",
    "object_ious",
    "simulate_clicks",
    "uncertainty_auroc",
]


@dataclass(frozen=True)
class Click:
    """One user click: the clicked point's index and the object label it marks (0 = background)."""

    index: int
    label: int


# ------------------------------------------------------------------------------------------- geometry
def check_points(points: object, name: str = "points", min_points: int = 1) -> np.ndarray:
    """``points`` as a finite floating ``(P, 3)`` numpy array (a tensor is converted) with at least
    ``min_points`` rows (the kNN graph needs ``k + 1``), coordinates of magnitude <= 1e6 and not all equal.

    :func:`icml25.kernels.checks.check_array` checks the kind, dtype, shape and finiteness; the point-count,
    magnitude and degenerate-cloud rules are this paper's.

    Raises:
        TypeError: not an array, or not floating.
        ValueError: wrong shape, too few points, non-finite, too large or a single repeated point.
    """
    if isinstance(points, torch.Tensor):
        points = points.detach().cpu().numpy()
    points = check_array(points, name, shape=(None, 3), dtype="float")
    if points.shape[0] < min_points:
        raise ValueError(
            f"{name} must have at least {min_points} points (k of the kNN graph), got {points.shape[0]}"
        )
    if np.abs(points).max() > 1e6:
        raise ValueError(f"{name} must have coordinates of magnitude <= 1e6, got {np.abs(points).max():.3g}")
    if points.shape[0] > 1 and float(np.ptp(points, axis=0).max()) == 0.0:
        raise ValueError(f"{name} must not be a single repeated point (all coordinates equal)")
    return points


def check_labels(labels: object, name: str, n: int | None) -> np.ndarray:
    """``labels`` as an int64 numpy array of shape ``(n,)`` (any length if ``n`` is None) holding labels >= 0 (0 = background; a tensor is
    converted), through :func:`icml25.kernels.checks.check_array`.

    Raises:
        TypeError: not an integer array.
        ValueError: wrong shape or a negative label.
    """
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    labels = check_array(labels, name, shape=(n,), dtype="int")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{name} must hold labels >= 0, got {labels.min()}")
    return labels.astype(np.int64)


def knn(points: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[P, k]`` of each point's k nearest neighbours (itself excluded)."""
    d = torch.cdist(points, points)
    d.fill_diagonal_(float("inf"))
    return d.topk(k, largest=False).indices


def _interior_point(points: np.ndarray, region: np.ndarray, weight: np.ndarray | None = None) -> int:
    """Index of the region point farthest from every point outside the region (optionally × weight)."""
    idx = np.flatnonzero(region)
    outside = points[~region]
    if outside.shape[0] == 0:
        dist = np.ones(idx.size)
    else:
        dist = torch.cdist(torch.from_numpy(points[idx]), torch.from_numpy(outside))
        dist = dist.min(1).values.numpy()
    if weight is not None and float(weight[idx].max()) > 0:
        dist = dist * weight[idx]
    return int(idx[int(np.argmax(dist))])


def _largest_component(region: np.ndarray, neighbors: np.ndarray) -> np.ndarray:
    n = region.size
    rows = np.repeat(np.arange(n), neighbors.shape[1])
    cols = neighbors.reshape(-1)
    keep = region[rows] & region[cols]
    adj = coo_matrix((np.ones(int(keep.sum())), (rows[keep], cols[keep])), shape=(n, n))
    _, comp = connected_components(adj, directed=False)
    sizes = np.bincount(comp[region], minlength=comp.max() + 1)
    return region & (comp == int(np.argmax(sizes)))


def simulate_clicks(
    points: np.ndarray,
    gt_labels: np.ndarray,
    pred_labels: np.ndarray | None = None,
    uncertainty: np.ndarray | None = None,
    strategy: Literal["center_of_largest_error", "uncertainty_weighted"] = "center_of_largest_error",
    k: int = 16,
) -> list[Click]:
    """The next simulated clicks, one per label (background 0 and every object) that still has errors.

    Without ``pred_labels`` (first round) each label's click is the most interior point of its ground-truth
    region; otherwise the most interior point of the largest connected (kNN, ``k``) error region
    ``gt == o ∧ pred ≠ o``. ``strategy="uncertainty_weighted"`` multiplies the interior distance by the
    min-max-normalised ``uncertainty`` (official ``seg_new.py``). ``points [P, 3]``, labels ``[P]``."""
    points = check_points(points, "points", min_points=k + 1)
    n = points.shape[0]
    gt = check_labels(gt_labels, "gt_labels", n)
    pred = None if pred_labels is None else check_labels(pred_labels, "pred_labels", n)
    if strategy not in ("center_of_largest_error", "uncertainty_weighted"):
        raise ValueError(
            f"strategy must be 'center_of_largest_error' or 'uncertainty_weighted', got {strategy!r}"
        )
    weight = None
    if strategy == "uncertainty_weighted":
        if uncertainty is None:
            raise ValueError("uncertainty is required for strategy='uncertainty_weighted'")
        u = np.asarray(uncertainty, dtype=np.float64)
        if u.shape != (n,) or not np.isfinite(u).all():
            raise ValueError(f"uncertainty must be a finite array of shape ({n},), got shape {u.shape}")
        span = u.max() - u.min()
        weight = (u - u.min()) / span if span > 0 else np.ones(n)
    return clicks_on_graph(points, gt, pred, weight, knn(torch.from_numpy(points), k).numpy())


def clicks_on_graph(
    points: np.ndarray,
    gt: np.ndarray,
    pred: np.ndarray | None,
    weight: np.ndarray | None,
    neighbors: np.ndarray,
) -> list[Click]:
    """:func:`simulate_clicks` on already checked arrays and a precomputed kNN graph ``neighbors [P, k]``
    (training and evaluation loops build the graph once per scene): one click per label with errors, at the
    most interior point of its largest connected error region (``weight [P]`` in [0, 1] or None)."""
    clicks = []
    for o in np.unique(gt):
        region = gt == o if pred is None else (gt == o) & (pred != o)
        if not region.any():
            continue
        comp = _largest_component(region, neighbors)
        clicks.append(Click(_interior_point(points, comp, weight), int(o)))
    return clicks


# -------------------------------------------------------------------------------------------- metrics
def object_ious(pred_labels: np.ndarray, gt_labels: np.ndarray) -> np.ndarray:
    """IoU of every object ``1..O`` of ``gt_labels`` (background 0 excluded) → ``[O]``."""
    gt = check_labels(gt_labels, "gt_labels", None)
    if gt.size == 0:
        raise ValueError("gt_labels must be non-empty, got shape (0,)")
    pred = check_labels(pred_labels, "pred_labels", gt.shape[0])
    n_obj = int(gt.max())
    if n_obj < 1:
        raise ValueError("gt_labels must contain at least one object (a label >= 1)")
    missing = sorted(set(range(1, n_obj + 1)) - set(np.unique(gt).tolist()))
    if missing:
        raise ValueError(f"gt_labels must use every object label 1..{n_obj}; missing {missing}")
    out = np.empty(n_obj)
    for o in range(1, n_obj + 1):
        a, b = gt == o, pred == o
        union = (a | b).sum()
        out[o - 1] = (a & b).sum() / union if union else 1.0
    return out


def noc_at(iou_curve: np.ndarray, threshold: float = 0.8, max_clicks: int | None = None) -> float:
    """Mean number of clicks per object to reach ``threshold`` IoU: ``iou_curve [N, K]`` holds the IoU after
    1..K clicks; a curve that never reaches it counts ``max_clicks`` (default K)."""
    curve = iou_curve.detach().cpu().numpy() if isinstance(iou_curve, torch.Tensor) else np.asarray(iou_curve)
    curve = check_array(curve, "iou_curve", ndim=2, dtype="float", non_empty=True)
    if curve.min() < 0 or curve.max() > 1:
        raise ValueError("iou_curve must hold finite IoUs in [0, 1]")
    threshold = check_float(threshold, "threshold", low=0.0, high=1.0, low_open=True)
    cap = curve.shape[1] if max_clicks is None else int(max_clicks)
    hit = curve >= threshold
    first = np.where(hit.any(1), hit.argmax(1) + 1, cap)
    return float(first.mean())


def uncertainty_auroc(uncertainty: np.ndarray, errors: np.ndarray) -> float:
    """ROC AUC of ``uncertainty [N]`` for detecting misclassified points ``errors [N]`` (bool), via
    :func:`sklearn.metrics.roc_auc_score`; 0.5 = uninformative."""
    u = np.asarray(uncertainty.detach().cpu() if isinstance(uncertainty, torch.Tensor) else uncertainty)
    e = np.asarray(errors.detach().cpu() if isinstance(errors, torch.Tensor) else errors)
    if u.ndim != 1 or e.shape != u.shape or u.size == 0:
        raise ValueError(
            f"uncertainty and errors must be 1-D of equal non-zero length, got {u.shape}, {e.shape}"
        )
    if u.dtype.kind not in "fiu" or not np.isfinite(u).all():
        raise ValueError("uncertainty must be a finite numeric array")
    if e.dtype != bool:
        raise TypeError(f"errors must be a boolean array, got dtype {e.dtype}")
    if e.all() or not e.any():
        raise ValueError("errors must contain both correct (False) and wrong (True) points")
    return float(roc_auc_score(e, u))


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 10) -> float:
    """ECE: Σ_b (n_b/N)·|acc_b − conf_b| over ``n_bins`` uniform bins, bin means from
    :func:`sklearn.calibration.calibration_curve`. ``confidence [N]`` in [0, 1], ``correct [N]`` bool."""
    c = np.asarray(confidence)
    y = np.asarray(correct)
    if c.dtype.kind != "f":
        raise TypeError(f"confidence must be a floating-point array, got dtype {c.dtype}")
    if c.ndim != 1 or y.shape != c.shape or c.size == 0:
        raise ValueError(
            f"confidence and correct must be 1-D of equal non-zero length, got {c.shape}, {y.shape}"
        )
    if not np.isfinite(c).all() or c.min() < 0 or c.max() > 1:
        raise ValueError("confidence must hold finite probabilities in [0, 1]")
    if y.dtype != bool:
        raise TypeError(f"correct must be a boolean array, got dtype {y.dtype}")
    n_bins = check_int(n_bins, "n_bins", low=1)
    if y.all() or not y.any():
        return float(abs(y.mean() - c.mean()))
    acc, conf = calibration_curve(y, c, n_bins=n_bins, strategy="uniform")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    counts = np.bincount(
        np.clip(np.searchsorted(edges[1:-1], c, side="right"), 0, n_bins - 1), minlength=n_bins
    )
    counts = counts[counts > 0]
    return float((counts / c.size * np.abs(acc - conf)).sum())
