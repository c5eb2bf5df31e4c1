"""Measuring Diversity: Axioms and Challenges — ICML 2025, P34: the reviewed diversity measures.

Mironov & Prokhorenkova, "Measuring Diversity: Axioms and Challenges", ICML 2025 (arXiv 2410.14556; the
paper is theoretical and has no official code). A diversity measure maps a multiset of ``n`` points of a
metric space to a number; every measure here depends only on the ``(n, n)`` distance matrix ``D``.

Measures (all :class:`DiversityMeasure`): :class:`APD` (average pairwise distance), :class:`Diameter`,
:class:`Bottleneck` (minimum pairwise distance), :class:`NNMean` (mean nearest-neighbour distance),
:class:`NumDistinct`, :class:`Circles` (``#Circles(t)``: the largest subset with pairwise distances
``>= t``, an exact maximum clique), :class:`Energy` (``-mean D_ij^-gamma``), :class:`VendiScore`,
:class:`Magnitude` and :class:`LogDet` (DPP log-determinant). The paper's two constructed measures
(MultiDimVolume, IntegralMaxClique) are not implemented: their definitions could not be retrieved.

Inputs are points ``(n, p)`` (distances from ``metric=``, a scikit-learn ``pairwise_distances`` name such
as ``"euclidean"`` or ``"jaccard"`` for bit vectors, or a callable) or a distance matrix with
``is_distance=True``. A square input is ambiguous and needs ``is_distance`` set explicitly.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from icml25.kernels.checks import check_array, check_float, check_int

__all__ = [
    "APD",
    "Bottleneck",
    "Circles",
    "Diameter",
    "DiversityMeasure",
    "Energy",
    "LogDet",
    "Magnitude",
    "NNMean",
    "NumDistinct",
    "VendiScore",
    "distance_matrix",
    "max_clique_size",
    "pairwise",
    "vendi_from_kernel",
]

BRUTE_FORCE_MAX_N = 14
"""Largest ``n`` for which :func:`max_clique_size` enumerates all subsets (``method="auto"``)."""


def _as_float_array(x: Any, name: str) -> np.ndarray:
    """A real array-like (a tensor, bools and ints included) as a float64 array; finiteness is checked apart."""
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    return check_array(x, name, dtype=("float", "int", "bool"), finite=False).astype(np.float64)


def pairwise(X: Any, metric: str | Callable[..., float] = "euclidean") -> np.ndarray:
    """Distance matrix ``(n, n)`` of points ``X`` ``(n, p)`` under ``metric``.

    ``metric`` is a :func:`sklearn.metrics.pairwise_distances` name (``"euclidean"``, ``"cityblock"``,
    ``"cosine"``, ``"jaccard"`` on 0/1 vectors, ...) or a callable ``(u, v) -> float``.
    """
    arr = _as_float_array(X, "X")
    if arr.ndim != 2:
        raise ValueError(f"X must be points of shape (n, p), got shape {arr.shape}")
    if arr.shape[0] < 2 or arr.shape[1] < 1:
        raise ValueError(f"X must hold at least 2 points of dimension >= 1, got shape {arr.shape}")
    check_array(arr, "X")
    if not (isinstance(metric, str) or callable(metric)):
        raise TypeError(f"metric must be a metric name or a callable, got {type(metric).__name__}")
    from sklearn.metrics import pairwise_distances

    if metric == "euclidean":
        # differences, not sklearn's dot-product expansion: duplicates get exactly 0 (it leaves ~1e-8)
        diff = arr[:, None, :] - arr[None, :, :]
        with np.errstate(over="ignore", invalid="ignore"):
            D = np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))
        if not np.all(np.isfinite(D)):
            raise ValueError(
                f"X is too large: its Euclidean distances overflow float64 (max |X| = {np.abs(arr).max():.3g})"
            )
        return D
    if metric == "jaccard":
        if not np.all((arr == 0) | (arr == 1)):
            raise ValueError("X must be 0/1 bit vectors for metric='jaccard', got other values")
        D = pairwise_distances(arr.astype(bool), metric="jaccard")
    else:
        D = pairwise_distances(arr, metric=metric)
    D = np.asarray(D, dtype=np.float64)
    if not np.all(np.isfinite(D)):
        raise ValueError(f"X gives non-finite {metric!r} distances (max |X| = {np.abs(arr).max():.3g})")
    D = np.maximum((D + D.T) / 2, 0.0)
    np.fill_diagonal(D, 0.0)
    return D


def _check_metric(D: np.ndarray, tol: float) -> None:
    scale = max(1.0, float(np.abs(D).max()))
    if not np.allclose(D, D.T, rtol=0, atol=tol * scale):
        raise ValueError(
            f"D must be symmetric (max |D - D.T| = {np.abs(D - D.T).max():.3g}); pass check_metric=False "
            "to allow it"
        )
    if np.abs(np.diag(D)).max() > tol * scale:
        raise ValueError(
            f"D must have a zero diagonal, got max |D_ii| = {np.abs(np.diag(D)).max():.3g}; pass "
            "check_metric=False to allow it"
        )
    if D.min() < -tol * scale:
        raise ValueError(
            f"D must be non-negative, got min {D.min():.3g}; pass check_metric=False to allow it"
        )
    # triangle inequality: D_ij <= D_ik + D_kj for all i, j, k
    excess = D[:, None, :] - (D[:, :, None] + D[None, :, :])
    worst = float(excess.max())
    if worst > tol * scale:
        i, k, j = np.unravel_index(int(np.argmax(excess)), excess.shape)
        raise ValueError(
            f"D must satisfy the triangle inequality: D[{i},{j}] = {D[i, j]:.6g} > D[{i},{k}] + D[{k},{j}] = "
            f"{D[i, k] + D[k, j]:.6g}; pass check_metric=False to allow it"
        )


def distance_matrix(
    X: Any,
    *,
    is_distance: bool | None = None,
    metric: str | Callable[..., float] = "euclidean",
    check_metric: bool = True,
    tol: float = 1e-9,
) -> np.ndarray:
    """The validated ``(n, n)`` distance matrix of ``X``: points ``(n, p)`` or, with ``is_distance=True``,
    a distance matrix.

    ``is_distance=None`` reads a non-square ``X`` as points and rejects a square one as ambiguous. With
    ``check_metric`` the matrix must be symmetric, zero on the diagonal, non-negative and satisfy the
    triangle inequality (to ``tol`` times its largest entry, at least 1).
    """
    if is_distance is not None and not isinstance(is_distance, (bool, np.bool_)):
        raise TypeError(f"is_distance must be True, False or None, got {is_distance!r}")
    arr = _as_float_array(X, "X")
    if arr.ndim != 2:
        raise ValueError(f"X must be points (n, p) or a distance matrix (n, n), got shape {arr.shape}")
    square = arr.shape[0] == arr.shape[1]
    if is_distance is None:
        if square:
            raise ValueError(
                f"X of shape {arr.shape} is square: pass is_distance=True (a distance matrix) or "
                "is_distance=False (n points of dimension n)"
            )
        is_distance = False
    if not is_distance:
        return pairwise(arr, metric)
    if not square:
        raise ValueError(
            f"X must be a square (n, n) distance matrix with is_distance=True, got shape {arr.shape}"
        )
    if arr.shape[0] < 2:
        raise ValueError(f"X must hold at least 2 points, got a distance matrix of shape {arr.shape}")
    check_array(arr, "X")
    check_float(tol, "tol", low=0)
    if check_metric:
        _check_metric(arr, tol)
    return arr.copy()


def _offdiag(D: np.ndarray) -> np.ndarray:
    return D[np.triu_indices(D.shape[0], k=1)]


class DiversityMeasure(ABC):
    """A diversity measure of a multiset of points, computed from its distance matrix.

    ``measure(X, is_distance=..., metric=..., check_metric=...)`` validates ``X`` with
    :func:`distance_matrix` and returns :meth:`from_distances` of it, a float (``-inf`` where documented).
    ``thresholds`` lists the distances at which the measure may jump (used by the continuity audit).
    """

    name: str = "measure"
    needs_points: bool = False
    thresholds: tuple[float, ...] = ()

    def __call__(
        self,
        X: Any,
        *,
        is_distance: bool | None = None,
        metric: str | Callable[..., float] = "euclidean",
        check_metric: bool = True,
    ) -> float:
        D = distance_matrix(X, is_distance=is_distance, metric=metric, check_metric=check_metric)
        return float(self.from_distances(D))

    @abstractmethod
    def from_distances(self, D: np.ndarray) -> float:
        """The measure of a validated ``(n, n)`` distance matrix ``D`` (no checks)."""

    def __repr__(self) -> str:
        return self.name


class APD(DiversityMeasure):
    """Average pairwise distance, ``mean_{i<j} D_ij``."""

    name = "APD"

    def from_distances(self, D: np.ndarray) -> float:
        return float(_offdiag(D).mean())


class Diameter(DiversityMeasure):
    """Diameter, ``max_{i<j} D_ij``."""

    name = "Diameter"

    def from_distances(self, D: np.ndarray) -> float:
        return float(_offdiag(D).max())


class Bottleneck(DiversityMeasure):
    """Bottleneck, ``min_{i<j} D_ij`` (0 with a duplicate)."""

    name = "Bottleneck"

    def from_distances(self, D: np.ndarray) -> float:
        return float(_offdiag(D).min())


class NNMean(DiversityMeasure):
    """Mean nearest-neighbour distance, ``mean_i min_{j != i} D_ij``."""

    name = "NNMean"

    def from_distances(self, D: np.ndarray) -> float:
        off = D + np.diag(np.full(D.shape[0], np.inf))
        return float(off.min(axis=1).mean())


class NumDistinct(DiversityMeasure):
    """Number of distinct elements: connected components of the graph ``D_ij <= tol`` (``tol=0``: exact
    duplicates). Integer-valued, so it jumps when a duplicate is split."""

    def __init__(self, tol: float = 0.0) -> None:
        self.tol = check_float(tol, "tol", low=0)
        self.name = f"NumDistinct(tol={tol:g})"

    def from_distances(self, D: np.ndarray) -> float:
        # connected components by label propagation (n is small: O(n^3) at worst)
        close = D <= self.tol
        labels = np.arange(D.shape[0])
        while True:
            new = np.where(close, labels[None, :], D.shape[0]).min(axis=1)
            if np.array_equal(new, labels):
                return float(len(np.unique(labels)))
            labels = new


def max_clique_size(adjacency: Any, method: str = "auto", max_n: int = 64) -> int:
    """Size of a maximum clique of the graph with boolean adjacency ``(n, n)`` (diagonal ignored).

    ``method="brute"`` enumerates all ``2^n`` vertex subsets (``n <= 20``), ``"networkx"`` uses
    :func:`networkx.max_weight_clique` (exact branch and bound), ``"auto"`` picks brute force for
    ``n <= 14``. Maximum clique is NP-hard, so ``n > max_n`` raises.
    """
    A = np.asarray(adjacency)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] == 0:
        raise ValueError(f"adjacency must be a non-empty square (n, n) matrix, got shape {A.shape}")
    A = A.astype(bool)
    if not np.array_equal(A, A.T):
        raise ValueError("adjacency must be symmetric (an undirected graph)")
    n = A.shape[0]
    if method not in ("auto", "brute", "networkx"):
        raise ValueError(f"method must be 'auto', 'brute' or 'networkx', got {method!r}")
    if n > max_n:
        raise ValueError(
            f"maximum clique is NP-hard: n = {n} points exceeds max_n = {max_n} (exponential cost); "
            "raise max_n to accept the cost"
        )
    if method == "auto":
        method = "brute" if n <= BRUTE_FORCE_MAX_N else "networkx"
    if method == "brute":
        if n > 20:
            raise ValueError(f"method='brute' enumerates 2^n subsets; n = {n} exceeds its cap of 20")
        nbr = [sum(1 << j for j in range(n) if j != i and A[i, j]) for i in range(n)]
        best = 1
        for size in range(n, 1, -1):
            for combo in itertools.combinations(range(n), size):
                mask = sum(1 << i for i in combo)
                if all((mask & ~(1 << i)) & ~nbr[i] == 0 for i in combo):
                    return size
        return best
    import networkx as nx

    G = nx.Graph()
    G.add_nodes_from(range(n))
    G.add_edges_from((int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(A, k=1))))
    _, weight = nx.max_weight_clique(G, weight=None)
    return int(weight)


class Circles(DiversityMeasure):
    """``#Circles(t)``: the largest subset whose pairwise distances are all ``>= t`` (a packing number),
    i.e. a maximum clique of the graph ``D_ij >= t``; exact, NP-hard (``n > max_n`` raises)."""

    def __init__(self, t: float, max_n: int = 64) -> None:
        self.t = check_float(t, "t", low=0, low_open=True)
        self.max_n = check_int(max_n, "max_n", low=2)
        self.name = f"Circles(t={self.t:g})"
        self.thresholds = (self.t,)

    def from_distances(self, D: np.ndarray) -> float:
        return float(max_clique_size(D >= self.t, max_n=self.max_n))


class Energy(DiversityMeasure):
    """``Energy(gamma) = -mean_{i<j} D_ij^{-gamma}``; ``-inf`` when two points coincide."""

    def __init__(self, gamma: float = 1.0) -> None:
        self.gamma = check_float(gamma, "gamma", low=0, low_open=True)
        self.name = f"Energy(gamma={self.gamma:g})"

    def from_distances(self, D: np.ndarray) -> float:
        d = _offdiag(D)
        if np.any(d <= 0):
            return -math.inf
        with np.errstate(over="ignore"):
            return float(-np.mean(d ** (-self.gamma)))


def _gaussian_kernel(D: np.ndarray, h: float) -> np.ndarray:
    return np.exp(-(D**2) / (2.0 * h * h))


def vendi_from_kernel(K: Any) -> float:
    """Vendi score ``exp(-sum_i lambda_i log lambda_i)`` of the eigenvalues of ``K / n`` for a PSD
    similarity matrix ``K`` ``(n, n)`` with unit diagonal (negative eigenvalues are clipped to 0)."""
    K = _as_float_array(K, "K")
    if K.ndim != 2 or K.shape[0] != K.shape[1] or K.shape[0] < 1:
        raise ValueError(f"K must be a square (n, n) matrix, got shape {K.shape}")
    check_array(K, "K")
    if not np.allclose(K, K.T, atol=1e-9):
        raise ValueError("K must be symmetric")
    if not np.allclose(np.diag(K), 1.0, atol=1e-9):
        raise ValueError("K must have a unit diagonal (k(x, x) = 1)")
    lam = np.clip(np.linalg.eigvalsh(K / K.shape[0]), 0.0, None)
    lam = lam[lam > 0]
    return float(np.exp(-np.sum(lam * np.log(lam))))


class VendiScore(DiversityMeasure):
    """Vendi score with the Gaussian kernel ``K = exp(-D^2 / 2h^2)`` at bandwidth ``h``
    (1 for identical points, ``n`` when ``K = I``)."""

    def __init__(self, h: float = 1.0) -> None:
        self.h = check_float(h, "h", low=0, low_open=True)
        self.name = f"Vendi(h={self.h:g})"

    def from_distances(self, D: np.ndarray) -> float:
        return vendi_from_kernel(_gaussian_kernel(D, self.h))


class Magnitude(DiversityMeasure):
    """Magnitude at scale ``s``: the sum of a weighting ``w`` with ``Z w = 1``, ``Z = exp(-s D)``
    (the sum of the entries of ``Z^{-1}`` when ``Z`` is invertible). With duplicates ``Z`` is singular;
    the least-squares weighting gives the magnitude of the distinct points."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = check_float(scale, "scale", low=0, low_open=True)
        self.name = f"Magnitude(s={self.scale:g})"

    def from_distances(self, D: np.ndarray) -> float:
        Z = np.exp(-self.scale * D)
        w = np.linalg.lstsq(Z, np.ones(D.shape[0]), rcond=None)[0]
        return float(w.sum())


class LogDet(DiversityMeasure):
    """DPP log-determinant ``log det K``, ``K = exp(-D^2 / 2h^2)``; ``-inf`` when ``K`` is singular or not
    positive definite (duplicates)."""

    def __init__(self, h: float = 1.0) -> None:
        self.h = check_float(h, "h", low=0, low_open=True)
        self.name = f"LogDet(h={self.h:g})"

    def from_distances(self, D: np.ndarray) -> float:
        sign, logdet = np.linalg.slogdet(_gaussian_kernel(D, self.h))
        if sign <= 0 or not np.isfinite(logdet):
            return -math.inf
        # a rank-deficient K can come out with a tiny positive determinant from rounding
        eig_min = float(np.linalg.eigvalsh(_gaussian_kernel(D, self.h)).min())
        return -math.inf if eig_min <= 1e-12 else float(logdet)
