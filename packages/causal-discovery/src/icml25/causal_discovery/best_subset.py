"""Best subset selection: optimal pursuit for feature selection and elimination — ICML 2025, P48: the exact
entry/exit criteria and the enhanced greedy best-subset algorithms as scikit-learn estimators.

Zhu, Zhang, Xia, "Best Subset Selection: Optimal Pursuit for Feature Selection and Elimination", ICML 2025
(PMLR 267:80398-80426, arXiv 2501.16815); official MATLAB code: github.com/Zhihanmath/Optimal_Pursuit_public
(``op.m``, ``Cosaop.m``, ``op_bess.m``).

The objective is ``f(S) = min_b ||y - X_S b||^2``. For an active set ``S`` with least-squares fit
``beta_S`` and residual ``r``:

* **entry** (selection): adding ``j`` decreases ``f`` by exactly
  ``Delta+_j = (x_j' r)^2 / ||P_S^perp x_j||^2`` (the other coefficients refit), where ``P_S^perp`` projects
  onto the orthogonal complement of ``span(X_S)``; the classical criteria rank by the correlation
  ``|x_j' r|`` (OMP, CoSaMP) or by ABESS's forward sacrifice ``(x_j' r)^2 / ||x_j||^2``, the decrease when
  only ``b_j`` is fitted and the others are frozen: a partial variation of ``f``.
* **exit** (elimination): removing ``j`` increases ``f`` by exactly
  ``Delta-_j = beta_j^2 / [(X_S' X_S)^{-1}]_jj``; the classical criteria rank by ``|beta_j|`` (CoSaMP's
  pruning) or by ABESS's backward sacrifice ``beta_j^2 ||x_j||^2``, the increase when the others are frozen.

The paper substitutes the exact criteria into three classical algorithms, which :class:`OptimalPursuitRegressor`
implements with ``criterion="optimal"`` (the paper's) or ``criterion="classical"`` (the baselines), the two
differing only in the criterion:

* ``algorithm="omp"``: OP, orthogonal matching pursuit with the exact entry (this equals Orthogonal Least
  Squares selection); the classical variant is OMP (``sklearn.linear_model.OrthogonalMatchingPursuit``).
* ``algorithm="cosamp"``: CoSaOP / CoSaMP. Each iteration merges the current support with the top ``2K``
  candidates by the entry score computed once at the current support, fits least squares on the merged set,
  keeps the ``K`` with the largest exit scores and refits (the official ``Cosaop.m``; the classical variant
  uses the same refit, i.e. CoSaMP with a debiasing least-squares step).
* ``algorithm="splicing"``: OP-(A)BESS / (A)BESS splicing at a fixed sparsity. Start from the top ``K`` of
  ``|x_j' y| / ||x_j||``; for exchange sizes ``s = 1 .. exchange_max`` swap the ``s`` active features with
  the smallest exit scores for the ``s`` inactive ones with the largest entry scores, accept the first swap
  that lowers ``||r||`` by more than ``splice_tol * ||y||``; repeat until no swap is accepted
  (``op_bess.m``; the classical scores are ABESS's sacrifices).

``batch="official"`` scores the candidates of a batch once, at the current support (the official code);
``batch="sequential"`` picks them one at a time, rescoring after each pick (greedy-sequential: exact per
pick, our option). Everything works in the Gram space: ``X'X`` is formed once (``O(n p^2)``, shared by both
criteria), the active set keeps a Cholesky factor ``L`` of ``X_S'X_S`` and ``W = L^{-1} X_S'X``, so
``||P_S^perp x_j||^2 = ||x_j||^2 - ||W_j||^2`` costs ``O(p k)`` per added feature and the exit scores
``O(k^3)``: the exact criteria add no asymptotic cost to an iteration.

Scaling: the exact criteria are invariant to the scale of each column; the classical correlation and
magnitude rules (``|x_j' r|``, ``|beta_j|``) are not, so ``criterion="classical"`` results depend on
standardisation (the compressed-sensing literature assumes unit-norm columns, on which all the classical
rules of one algorithm rank alike).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_triangular
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_array, column_or_1d

from icml25.kernels.checks import check_choice, check_float, check_int

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _sk_validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    _sk_validate_data = None

__all__ = [
    "ALGORITHMS",
    "BATCHES",
    "CRITERIA",
    "OptimalPursuitRegressor",
    "SelectionWarning",
    "best_subset_exhaustive",
    "entry_scores",
    "exit_scores",
]

ALGORITHMS = ("omp", "cosamp", "splicing")
"""The enhanced algorithms of the paper (OP, CoSaOP, OP-(A)BESS) and their classical counterparts."""
CRITERIA = ("optimal", "classical")
"""``optimal``: the exact entry/exit criteria; ``classical``: the algorithm's own criteria (baseline)."""
BATCHES = ("official", "sequential")
"""How a batch of entries/exits is scored: once at the current support, or greedily one pick at a time."""

_Y_MAX = 1e150  # the objective is in squared units of y: beyond this it overflows float64


class SelectionWarning(UserWarning):
    """A column was excluded (zero after centering) or fewer than ``n_nonzero_coefs`` could be selected."""


# ------------------------------------------------------------------------------------------ the problem
@dataclass
class _Problem:
    """Centred and globally rescaled data with its Gram matrix (the scaling leaves every ranking unchanged)."""

    X: np.ndarray
    y: np.ndarray
    G: np.ndarray
    c: np.ndarray
    g: np.ndarray
    usable: np.ndarray
    yy: float
    tol: float

    @classmethod
    def build(cls, X: np.ndarray, y: np.ndarray, tol: float) -> _Problem:
        G = X.T @ X
        g = np.diag(G).copy()
        return cls(X, y, G, X.T @ y, g, g > 0, float(y @ y), tol)


def _scaled(X: np.ndarray, y: np.ndarray, center: bool):
    """``(Xs, ys, x_mean, y_mean, sx, sy, zero_cols)`` with ``Xs = (X - x_mean) / sx`` in [-1, 1]."""
    s0 = float(np.max(np.abs(X))) if X.size else 0.0
    s0 = s0 if s0 > 0 else 1.0
    Xs = X / s0
    raw_scale = np.max(np.abs(Xs), axis=0) if Xs.shape[0] else np.zeros(Xs.shape[1])
    x_mean = Xs.mean(axis=0) if center else np.zeros(Xs.shape[1])
    Xs = Xs - x_mean
    # a column is zero when it vanishes, or its centred values are rounding noise of its own scale
    norms2 = np.einsum("ij,ij->j", Xs, Xs)
    zero = (norms2 <= Xs.shape[0] * (1e-13 * raw_scale) ** 2) | (raw_scale == 0)
    Xs[:, zero] = 0.0
    s1 = float(np.max(np.abs(Xs))) if Xs.size else 0.0
    s1 = s1 if s1 > 0 else 1.0
    Xs = Xs / s1
    y_mean = float(y.mean()) if center else 0.0
    yc = y - y_mean
    sy = float(np.max(np.abs(yc))) if yc.size else 0.0
    sy = sy if sy > 0 else 1.0
    return Xs, yc / sy, x_mean * s0, y_mean, s0 * s1, sy, np.flatnonzero(zero)


class _Fit:
    """Least squares on an ordered active set: Cholesky ``L`` of ``X_S'X_S``, ``z = L^{-1} X_S'y`` and
    (lazily) ``W = L^{-1} X_S'X``; grown one feature at a time by :meth:`append` or built at once."""

    __slots__ = ("L", "S", "W", "_beta", "_r", "pb", "z")

    def __init__(self, pb: _Problem, track: bool = False) -> None:
        self.pb = pb
        self.S: list[int] = []
        self.L = np.zeros((0, 0))
        self.z = np.zeros(0)
        self.W: np.ndarray | None = np.zeros((0, pb.X.shape[1])) if track else None
        self._beta: np.ndarray | None = None
        self._r: np.ndarray | None = None

    def copy(self) -> _Fit:
        new = _Fit.__new__(_Fit)
        new.pb, new.S, new.L, new.z = self.pb, list(self.S), self.L, self.z
        new.W, new._beta, new._r = self.W, self._beta, self._r
        return new

    @classmethod
    def from_support(cls, pb: _Problem, S: Sequence[int]) -> _Fit | None:
        """From scratch (LAPACK Cholesky); ``None`` when a column is dependent on the ones before it."""
        fit = cls(pb)
        S = [int(j) for j in S]
        if not S:
            return fit
        if not np.all(pb.usable[S]):
            return None
        try:
            L = np.linalg.cholesky(pb.G[np.ix_(S, S)])
        except np.linalg.LinAlgError:
            return None
        if np.any(np.diag(L) ** 2 <= pb.tol * pb.g[S]) or not np.all(np.isfinite(L)):
            return None
        fit.S, fit.L = S, L
        fit.z = solve_triangular(L, pb.c[S], lower=True, check_finite=False)
        fit.W = None
        return fit

    def append(self, j: int) -> bool:
        """Add column ``j`` (incremental Cholesky, ``O(k^2 + k p)``); False, unchanged, if it is dependent."""
        pb, k = self.pb, len(self.S)
        if not pb.usable[j] or j in self.S:
            return False
        w = solve_triangular(self.L, pb.G[self.S, j], lower=True, check_finite=False) if k else np.zeros(0)
        piv2 = pb.g[j] - float(w @ w)
        if not piv2 > pb.tol * pb.g[j]:
            return False
        piv = math.sqrt(piv2)
        L = np.zeros((k + 1, k + 1))
        L[:k, :k] = self.L
        L[k, :k] = w
        L[k, k] = piv
        self.L = L
        self.z = np.append(self.z, (pb.c[j] - float(w @ self.z)) / piv)
        if self.W is not None:
            self.W = np.vstack([self.W, (pb.G[j] - w @ self.W) / piv])
        self.S = [*self.S, int(j)]
        self._beta = self._r = None
        return True

    @property
    def beta(self) -> np.ndarray:
        if self._beta is None:
            self._beta = (
                solve_triangular(self.L, self.z, lower=True, trans="T", check_finite=False)
                if self.S
                else np.zeros(0)
            )
        return self._beta

    @property
    def residual(self) -> np.ndarray:
        if self._r is None:
            self._r = self.pb.y - self.pb.X[:, self.S] @ self.beta if self.S else self.pb.y.copy()
        return self._r

    @property
    def rss(self) -> float:
        r = self.residual
        return float(r @ r)

    def proj_norms2(self) -> np.ndarray:
        """``||P_S^perp x_j||^2`` for every column (``g_j - ||W_j||^2``)."""
        if self.W is None:
            self.W = solve_triangular(self.L, self.pb.G[self.S], lower=True, check_finite=False)
        return self.pb.g - np.einsum("ij,ij->j", self.W, self.W)

    def inv_diag(self) -> np.ndarray:
        """``diag((X_S'X_S)^{-1})`` from ``L^{-1}`` (``O(k^3)``)."""
        Linv = solve_triangular(self.L, np.eye(len(self.S)), lower=True, check_finite=False)
        return np.einsum("ij,ij->j", Linv, Linv)


# ------------------------------------------------------------------------------------------ the criteria
def _optimal_entry(fit: _Fit) -> np.ndarray:
    """Exact entry gains ``Delta+_j = (x_j'r)^2 / ||P_S^perp x_j||^2``; ``-inf`` off the candidates."""
    pb = fit.pb
    corr = pb.X.T @ fit.residual
    den = fit.proj_norms2()
    ok = pb.usable & (den > pb.tol * pb.g)
    ok[fit.S] = False
    out = np.full(pb.g.shape, -np.inf)
    out[ok] = corr[ok] ** 2 / den[ok]
    return out


def _optimal_exit(fit: _Fit) -> np.ndarray:
    """Exact exit costs ``Delta-_j = beta_j^2 / [(X_S'X_S)^{-1}]_jj`` in the order of ``fit.S``."""
    return fit.beta**2 / fit.inv_diag()


def _classical_entry(fit: _Fit, rule: str) -> np.ndarray:
    pb = fit.pb
    corr = pb.X.T @ fit.residual
    out = np.full(pb.g.shape, -np.inf)
    ok = pb.usable.copy()
    ok[fit.S] = False
    out[ok] = np.abs(corr[ok]) if rule == "correlation" else corr[ok] ** 2 / pb.g[ok]
    return out


def _classical_exit(fit: _Fit, rule: str) -> np.ndarray:
    if rule == "magnitude":
        return np.abs(fit.beta)
    return fit.beta**2 * fit.pb.g[fit.S]


_CLASSICAL = {
    "omp": ("correlation", None),
    "cosamp": ("correlation", "magnitude"),
    "splicing": ("sacrifice",) * 2,
}


def _entry(fit: _Fit, criterion: str, algorithm: str) -> np.ndarray:
    if criterion == "optimal":
        return _optimal_entry(fit)
    return _classical_entry(fit, _CLASSICAL[algorithm][0])


def _exit(fit: _Fit, criterion: str, algorithm: str) -> np.ndarray:
    if criterion == "optimal":
        return _optimal_exit(fit)
    return _classical_exit(fit, _CLASSICAL[algorithm][1])


def _ranked(scores: np.ndarray) -> np.ndarray:
    """Indices with a finite, positive score, best first (ties: lowest index first)."""
    order = np.argsort(-scores, kind="stable")
    return order[np.isfinite(scores[order]) & (scores[order] > 0)]


# ------------------------------------------------------------------------------------------ the algorithms
@dataclass
class _Result:
    fit: _Fit
    path: list[float]
    n_iter: int


def _omp(pb: _Problem, K: int, criterion: str, algorithm: str = "omp") -> _Result:
    fit, path, done = _Fit(pb, track=criterion == "optimal"), [], 0
    path.append(fit.rss)
    for _ in range(K):
        if fit.rss <= pb.tol * pb.yy:
            break
        if not any(fit.append(int(j)) for j in _ranked(_entry(fit, criterion, algorithm))):
            break
        path.append(fit.rss)
        done += 1
    return _Result(fit, path, done)


def _grow(fit: _Fit, n_add: int, criterion: str, algorithm: str, batch: str, allowed: np.ndarray) -> _Fit:
    """``fit`` plus up to ``n_add`` candidates from ``allowed`` by the entry score (skipping dependent ones)."""
    out, added = fit.copy(), 0
    if batch == "official":  # one scoring at the current support; the merged set needs no W
        ranked = _ranked(np.where(allowed, _entry(fit, criterion, algorithm), -np.inf))
        merged = _Fit.from_support(fit.pb, fit.S + [int(j) for j in ranked[:n_add]])
        if merged is not None:  # the usual case: the top candidates are independent (one factorisation)
            return merged
        out.W = None
        for j in ranked:
            if added == n_add:
                break
            added += out.append(int(j))
        return out
    if criterion == "optimal" and out.W is None:  # sequential: rescore after every pick, W kept up to date
        out.proj_norms2()
    for _ in range(n_add):
        scores = np.where(allowed, _entry(out, criterion, algorithm), -np.inf)
        if not any(out.append(int(j)) for j in _ranked(scores)):
            break
    return out


def _shrink(fit: _Fit, n_keep: int, criterion: str, algorithm: str, batch: str) -> _Fit | None:
    """``fit`` reduced to ``n_keep`` features: drop the smallest exit scores (once, or one at a time)."""
    if batch == "official":
        scores = _exit(fit, criterion, algorithm)
        keep = np.sort(np.argsort(-scores, kind="stable")[:n_keep])  # keep the relative order of fit.S
        return _Fit.from_support(fit.pb, [fit.S[i] for i in keep])
    out: _Fit | None = fit
    while out is not None and len(out.S) > n_keep:
        drop = int(np.argmin(_exit(out, criterion, algorithm)))
        out = _Fit.from_support(fit.pb, out.S[:drop] + out.S[drop + 1 :])
    return out


def _cosamp(pb: _Problem, K: int, criterion: str, batch: str, max_iter: int) -> _Result:
    fit, n_iter = _Fit(pb), 0
    path = [fit.rss]
    for _ in range(max_iter):
        if fit.rss <= pb.tol * pb.yy:
            break
        allowed = np.ones(pb.g.shape, dtype=bool)
        merged = _grow(fit, 2 * K, criterion, "cosamp", batch, allowed)
        new = _shrink(merged, K, criterion, "cosamp", batch) if len(merged.S) > K else merged
        if new is None:  # cannot happen for a subset of an independent set; kept as a guard
            break
        n_iter += 1
        unchanged = set(new.S) == set(fit.S)
        fit = new
        path.append(fit.rss)
        if unchanged:
            break
    return _Result(fit, path, n_iter)


def _splicing(
    pb: _Problem, K: int, criterion: str, batch: str, max_iter: int, exchange_max: int, splice_tol: float
) -> _Result:
    init = np.full(pb.g.shape, -np.inf)
    init[pb.usable] = np.abs(pb.c[pb.usable]) / np.sqrt(pb.g[pb.usable])
    fit = _Fit(pb)
    for j in np.argsort(-init, kind="stable"):
        if len(fit.S) == K or not np.isfinite(init[j]):
            break
        fit.append(int(j))
    path, n_iter, margin = [fit.rss], 0, splice_tol * math.sqrt(pb.yy)
    for _ in range(max_iter):
        if fit.rss <= pb.tol * pb.yy or not fit.S:
            break
        n_iter += 1  # exchange rounds run; the last one found no improving swap unless max_iter stopped it
        outside = np.ones(pb.g.shape, dtype=bool)
        outside[fit.S] = False
        accepted = None
        exit_order = np.argsort(_exit(fit, criterion, "splicing"), kind="stable")
        entry_order = _ranked(np.where(outside, _entry(fit, criterion, "splicing"), -np.inf))
        for s in range(1, min(exchange_max, len(fit.S), len(entry_order)) + 1):
            if batch == "official":
                drop = set(exit_order[:s].tolist())
                trial = _Fit.from_support(pb, [j for i, j in enumerate(fit.S) if i not in drop] + [
                    int(j) for j in entry_order[:s]
                ])  # fmt: skip
            else:
                reduced = _shrink(fit, len(fit.S) - s, criterion, "splicing", "sequential")
                trial = None if reduced is None else _grow(reduced, s, criterion, "splicing", batch, outside)
                trial = trial if trial is not None and len(trial.S) == len(fit.S) else None
            if trial is not None and math.sqrt(trial.rss) < math.sqrt(fit.rss) - margin:
                accepted = trial
                break
        if accepted is None:
            break
        fit = accepted
        path.append(fit.rss)
    return _Result(fit, path, n_iter)


# ------------------------------------------------------------------------------------------ validation
def _wrap(name: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith(name) else f"{name} is invalid: {msg}") from None
    except TypeError as exc:
        msg = str(exc)
        raise TypeError(msg if msg.startswith(name) else f"{name} is invalid: {msg}") from None


def _check_X(X: object, name: str = "X") -> np.ndarray:
    if isinstance(X, np.ndarray) and X.dtype.kind in "USV":
        raise TypeError(f"{name} must be a numeric 2-D array, got dtype {X.dtype}")
    return _wrap(name, check_array, X, dtype=np.float64, input_name=name)


def _check_y(y: object, n: int) -> np.ndarray:
    if y is None:
        raise ValueError("requires y to be passed, but the target y is None")
    if isinstance(y, np.ndarray) and y.dtype.kind in "USV":
        raise TypeError(f"y must be a numeric 1-D array, got dtype {y.dtype}")
    y = _wrap("y", check_array, y, dtype=np.float64, ensure_2d=False, input_name="y")
    y = _wrap("y", column_or_1d, y, warn=True)
    if y.shape[0] != n:
        raise ValueError(f"y must hold one target per row of X ({n} rows), got {y.shape[0]} values")
    peak = float(np.max(np.abs(y))) if y.size else 0.0
    if peak > _Y_MAX:
        raise ValueError(
            f"y must have max |y| <= {_Y_MAX:g} (the squared-error objective overflows float64), got {peak:g}"
        )
    return y


def _check_support(support: object, p: int, name: str = "support") -> list[int]:
    if isinstance(support, (str, bytes)) or not isinstance(support, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of column indices, got {type(support).__name__}")
    arr = np.asarray(support)
    if arr.size == 0:
        return []
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise TypeError(
            f"{name} must be a 1-D sequence of integer column indices, got {arr.dtype} {arr.shape}"
        )
    out = [int(j) for j in arr]
    bad = [j for j in out if not 0 <= j < p]
    if bad:
        raise ValueError(f"{name} must hold column indices in [0, {p}), got {bad}")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must hold distinct column indices, got {out}")
    return out


def _problem_for_scores(
    X: object, y: object, support: object, tol: float
) -> tuple[_Problem, list[int], float]:
    tol = check_float(tol, "tol", low=0.0, high=1.0, low_open=True)
    X = _check_X(X)
    y = _check_y(y, X.shape[0])
    S = _check_support(support, X.shape[1])
    Xs, ys, _, _, _, sy, zero = _scaled(X, y, center=False)
    pb = _Problem.build(Xs, ys, tol)
    if set(S) & set(zero.tolist()):
        raise ValueError(
            f"support must not contain zero columns of X, got {sorted(set(S) & set(zero.tolist()))}"
        )
    return pb, S, sy


# ------------------------------------------------------------------------------------------ public functions
def entry_scores(
    X: np.ndarray,
    y: np.ndarray,
    support: Sequence[int] = (),
    *,
    criterion: str = "optimal",
    tol: float = 1e-10,
) -> np.ndarray:
    """Entry (selection) scores of every column of ``X`` at the active set ``support``.

    ``criterion="optimal"``: ``Delta+_j = f(S) - f(S + {j})``, the exact decrease of the least-squares
    objective ``f(S) = min_b ||y - X_S b||^2`` when ``j`` enters and every coefficient is refit.
    ``criterion="classical"``: ``(x_j' r)^2 / ||x_j||^2``, the decrease when only ``b_j`` is fit (ABESS's
    forward sacrifice on this scale; it ranks like ``|x_j' r|`` on unit-norm columns). No intercept: centre
    ``X`` and ``y`` first for one.

    Args:
        X: ``[n, p]`` design. y: ``[n]`` response. support: active column indices (distinct,
        linearly independent). tol: columns with ``||P_S^perp x_j||^2 <= tol * ||x_j||^2`` (collinear with
        the active set) score ``-inf``, never a division by ~0.

    Returns:
        ``[p]`` scores in squared units of ``y``; ``-inf`` for active, zero and collinear columns.
    """
    criterion = check_choice(criterion, "criterion", CRITERIA)
    pb, S, sy = _problem_for_scores(X, y, support, tol)
    fit = _Fit.from_support(pb, S)
    if fit is None:
        raise ValueError(f"support must index linearly independent columns of X (tol={pb.tol:g}), got {S}")
    scores = _optimal_entry(fit) if criterion == "optimal" else _classical_entry(fit, "sacrifice")
    return scores * sy**2


def exit_scores(
    X: np.ndarray, y: np.ndarray, support: Sequence[int], *, criterion: str = "optimal", tol: float = 1e-10
) -> np.ndarray:
    """Exit (elimination) scores of the active columns ``support``, in its order.

    ``criterion="optimal"``: ``Delta-_j = f(S - {j}) - f(S) = beta_j^2 / [(X_S'X_S)^{-1}]_jj``, the exact
    increase of the objective when ``j`` leaves and the others refit. ``criterion="classical"``:
    ``beta_j^2 ||x_j||^2``, the increase when the others stay frozen (ABESS's backward sacrifice on this
    scale; it ranks like ``|beta_j|`` on unit-norm columns).

    Args:
        X: ``[n, p]`` design. y: ``[n]`` response. support: at least one active column index (distinct,
        linearly independent up to ``tol``).

    Returns:
        ``[len(support)]`` scores in squared units of ``y``.
    """
    criterion = check_choice(criterion, "criterion", CRITERIA)
    pb, S, sy = _problem_for_scores(X, y, support, tol)
    if not S:
        raise ValueError("support must name at least one active column, got an empty support")
    fit = _Fit.from_support(pb, S)
    if fit is None:
        raise ValueError(f"support must index linearly independent columns of X (tol={pb.tol:g}), got {S}")
    scores = _optimal_exit(fit) if criterion == "optimal" else _classical_exit(fit, "sacrifice")
    return scores * sy**2


def best_subset_exhaustive(
    X: np.ndarray, y: np.ndarray, n_nonzero_coefs: int, *, max_subsets: int = 1_000_000
) -> tuple[np.ndarray, float]:
    """The exact best subset by enumeration: ``argmin_{|S| = k} min_b ||y - X_S b||^2`` (no intercept).

    Returns ``(support, rss)`` with ``support`` sorted; ties go to the lexicographically first subset.
    Refuses more than ``max_subsets`` subsets (``C(p, k)``), the reference for small ``p`` only.
    """
    X = _check_X(X)
    y = _check_y(y, X.shape[0])
    n, p = X.shape
    k = check_int(n_nonzero_coefs, "n_nonzero_coefs", low=1)
    if k > min(n, p):
        raise ValueError(f"n_nonzero_coefs must be <= min(n_samples, n_features) = {min(n, p)}, got {k}")
    max_subsets = check_int(max_subsets, "max_subsets", low=1)
    if math.comb(p, k) > max_subsets:
        raise ValueError(
            f"n_nonzero_coefs={k} of {p} columns gives {math.comb(p, k)} subsets > max_subsets={max_subsets}: "
            "exhaustive search is for small problems"
        )
    Xs, ys, *_, sy, _ = _scaled(X, y, center=False)
    G, c, yy = Xs.T @ Xs, Xs.T @ ys, float(ys @ ys)

    def exact(S: tuple[int, ...]) -> float:
        coef = np.linalg.lstsq(Xs[:, S], ys, rcond=None)[0]
        r = ys - Xs[:, S] @ coef
        return float(r @ r)

    # screen every subset with the normal equations, batched; refit the near-best ones exactly
    fast: list[np.ndarray] = []
    subsets = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(p), k)), dtype=np.intp)
    subsets = subsets.reshape(-1, k)
    for lo in range(0, len(subsets), 20_000):
        idx = subsets[lo : lo + 20_000]
        Gs, cs = G[idx[:, :, None], idx[:, None, :]], c[idx]
        try:
            sol = np.linalg.solve(Gs, cs[:, :, None])[:, :, 0]
            fast.append(yy - np.einsum("ij,ij->i", cs, sol))
        except np.linalg.LinAlgError:  # an exactly singular subset: refit this chunk one by one
            fast.append(np.array([exact(tuple(S)) for S in idx]))
    rss_fast = np.concatenate(fast)
    near = np.flatnonzero(rss_fast <= rss_fast.min() + 1e-8 * yy + 1e-300)
    exact_rss = [exact(tuple(subsets[i])) for i in near]
    best_i = int(near[int(np.argmin(exact_rss))])  # argmin: the lexicographically first among exact ties
    best, best_rss = subsets[best_i].tolist(), float(min(exact_rss))
    return np.asarray(best, dtype=np.intp), best_rss * sy**2


# ------------------------------------------------------------------------------------------ the estimator
class OptimalPursuitRegressor(RegressorMixin, BaseEstimator):
    """Best-subset linear regression with ``n_nonzero_coefs`` features by OP / CoSaOP / OP-(A)BESS.

    Args:
        n_nonzero_coefs: sparsity ``K`` (default ``max(int(0.1 * n_features), 1)``, like scikit-learn's
            ``OrthogonalMatchingPursuit``); at most ``min(n_samples, n_features)``.
        algorithm: ``"omp"`` (OP / OMP), ``"cosamp"`` (CoSaOP / CoSaMP) or ``"splicing"`` (OP-(A)BESS /
            (A)BESS splicing at fixed sparsity).
        criterion: ``"optimal"`` (the exact entry/exit criteria of the paper) or ``"classical"`` (OMP's and
            CoSaMP's correlation and magnitude, ABESS's sacrifices): the baseline, otherwise the same code.
        batch: ``"official"`` (a batch is scored once at the current support, as the official code does) or
            ``"sequential"`` (one pick at a time, rescored). OMP adds one feature per step either way.
        exchange_max: largest splicing exchange size (the official demos use 2).
        splice_tol: a swap is accepted when it lowers ``||r||`` by more than ``splice_tol * ||y||``
            (the official code uses an absolute 0.01; relative here, so that the rule is scale-free).
        max_iter: iterations of CoSaMP and of splicing (the official CoSaOP: 100).
        tol: columns with ``||P_S^perp x_j||^2 <= tol * ||x_j||^2`` are collinear with the active set and
            never enter; the search stops once ``||r||^2 <= tol * ||y||^2`` (an exact fit).
        fit_intercept: centre ``X`` and ``y`` (an unpenalised intercept, as scikit-learn does).

    Fitted attributes: ``coef_`` (``[p]``), ``intercept_``, ``support_`` (boolean mask ``[p]``,
    scikit-learn's selector convention), ``active_`` (the selected indices, in selection order for OMP),
    ``n_iter_`` (OMP: features added; CoSaMP: merge-and-prune iterations; splicing: exchange rounds, the last
    one finding no improving swap), ``objective_path_`` (the residual sum of squares at the start and after
    each addition, iteration or accepted swap), ``n_features_in_``. Zero columns (constant ones when ``fit_intercept``) are excluded
    with a :class:`SelectionWarning`; fewer than ``K`` features are selected, with a warning, when the
    remaining columns are zero or collinear.
    """

    def __init__(
        self,
        n_nonzero_coefs: int | None = None,
        *,
        algorithm: str = "splicing",
        criterion: str = "optimal",
        batch: str = "official",
        exchange_max: int = 2,
        splice_tol: float = 1e-3,
        max_iter: int = 100,
        tol: float = 1e-10,
        fit_intercept: bool = True,
    ) -> None:
        self.n_nonzero_coefs = n_nonzero_coefs
        self.algorithm = algorithm
        self.criterion = criterion
        self.batch = batch
        self.exchange_max = exchange_max
        self.splice_tol = splice_tol
        self.max_iter = max_iter
        self.tol = tol
        self.fit_intercept = fit_intercept

    def _checked_params(self) -> dict:
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise TypeError(f"fit_intercept must be a bool, got {type(self.fit_intercept).__name__}")
        return {
            "algorithm": check_choice(self.algorithm, "algorithm", ALGORITHMS),
            "criterion": check_choice(self.criterion, "criterion", CRITERIA),
            "batch": check_choice(self.batch, "batch", BATCHES),
            "exchange_max": check_int(self.exchange_max, "exchange_max", low=1),
            "splice_tol": check_float(self.splice_tol, "splice_tol", low=0.0, high=1.0),
            "max_iter": check_int(self.max_iter, "max_iter", low=1),
            "tol": check_float(self.tol, "tol", low=0.0, high=1.0, low_open=True),
        }

    def fit(self, X: np.ndarray, y: np.ndarray) -> OptimalPursuitRegressor:
        """Select ``n_nonzero_coefs`` columns and fit least squares on them; returns ``self``.

        Every input is validated before any attribute is set: a rejected call leaves a fitted estimator as it was.
        """
        params = self._checked_params()
        Xa = _check_X(X)
        ya = _check_y(y, Xa.shape[0])
        n, p = Xa.shape
        if self.n_nonzero_coefs is None:
            K = max(int(0.1 * p), 1)
        else:
            K = check_int(self.n_nonzero_coefs, "n_nonzero_coefs", low=1)
        if K > min(n, p):
            raise ValueError(
                f"n_nonzero_coefs must be <= min(n_samples, n_features) = min({n}, {p}), got {K}"
            )
        if _sk_validate_data is not None:  # sets n_features_in_ / feature_names_in_ (input already checked)
            _sk_validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        else:  # pragma: no cover - older scikit-learn
            self._validate_data(X, y, dtype=np.float64, y_numeric=True)

        Xs, ys, x_mean, y_mean, sx, sy, zero = _scaled(Xa, ya, center=bool(self.fit_intercept))
        if zero.size:
            what = "constant" if self.fit_intercept else "zero"
            warnings.warn(
                f"X has {zero.size} {what} column(s) {zero[:10].tolist()}{'...' if zero.size > 10 else ''}: "
                "excluded from the selection",
                SelectionWarning,
                stacklevel=2,
            )
        pb = _Problem.build(Xs, ys, params["tol"])
        algo, crit = params["algorithm"], params["criterion"]
        if algo == "omp":
            res = _omp(pb, K, crit)
        elif algo == "cosamp":
            res = _cosamp(pb, K, crit, params["batch"], params["max_iter"])
        else:
            res = _splicing(
                pb, K, crit, params["batch"], params["max_iter"], params["exchange_max"], params["splice_tol"]
            )
        if len(res.fit.S) < K and res.fit.rss > pb.tol * pb.yy:
            warnings.warn(
                f"selected {len(res.fit.S)} of n_nonzero_coefs={K} features: the other columns are zero, "
                "collinear with the selected ones or orthogonal to the residual",
                SelectionWarning,
                stacklevel=2,
            )
        coef = np.zeros(p)
        coef[res.fit.S] = res.fit.beta * (sy / sx)
        self.coef_ = coef
        self.intercept_ = float(y_mean - x_mean @ coef) if self.fit_intercept else 0.0
        self.active_ = np.asarray(res.fit.S, dtype=np.intp)
        support = np.zeros(p, dtype=bool)
        support[res.fit.S] = True
        self.support_ = support
        self.n_iter_ = res.n_iter
        self.objective_path_ = np.asarray(res.path) * sy**2
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``X @ coef_ + intercept_``."""
        if not hasattr(self, "coef_"):
            raise NotFittedError(f"{type(self).__name__} is not fitted: call fit(...) first")
        if isinstance(X, np.ndarray) and X.dtype.kind in "USV":
            raise TypeError(f"X must be a numeric 2-D array, got dtype {X.dtype}")
        if _sk_validate_data is not None:
            Xa = _wrap("X", _sk_validate_data, self, X, dtype=np.float64, reset=False)
        else:  # pragma: no cover - older scikit-learn
            Xa = _wrap("X", self._validate_data, X, dtype=np.float64, reset=False)
        return Xa @ self.coef_ + self.intercept_
