"""Relative Error Fair Clustering in the Weak-Strong Oracle Model — ICML 2025, P08: strong/weak distance
oracles with query counting, the (1 + eps) fair k-median coreset built from few strong queries, and the fair
assignment cost (LP, min-cost flow) that evaluates it.

Wang, Nguyen, Dharangutte, Zhou, Jiang, Braverman, Zhang, "Relative Error Fair Clustering in the Weak-Strong
Oracle Model", ICML 2025 (arXiv 2506.12287). No official code was published; the paper's text was not
available to us either, so this module implements the standard pipeline the result builds on, with every
constant exposed (our parameters, not the paper's constants).

**The model.** Distances between points (identified by integer ids) come from two oracles: a *strong* one,
exact and expensive (a large embedding model), and a *weak* one, cheap but wrong on some pairs. In the
weak-strong model of Bateni et al. (2024), each unordered pair is independently answered correctly with
probability at least ``1 - delta`` (``delta < 1/2``) and arbitrarily otherwise, and answers are
*persistent*: asking again returns the same value. :class:`StrongOracle` and :class:`WeakOracle` cache their
answers and count the distinct pairs asked (``n_queries``); :class:`WeakOracle` can simulate the corruption
(``delta``, a persistent per-pair hash, ``corruption="random"``: a uniform value in ``[0, scale]``, or
``"adversarial_far"``: ``scale``).

**The coreset** (:func:`build_fair_coreset`, :class:`FairCoreset`). For ``n`` points with group labels:

1. *constant-factor centres*: strong-query all pairs of a uniform sample ``S`` of ``~1.5 k ln n`` points,
   run k-median++ (``D^z`` sampling) and single-swap local search on it: centres ``A`` (``|A| = k``);
2. *robust distances*: for each centre ``a`` find a ball ``B_a`` of ``m ~ log2 n`` points near it (the
   ``3m`` weak-nearest candidates, strong-verified, the ``m - 1`` closest kept, ``a`` included), so that
   ``d(a, b)`` is known exactly for ``b`` in ``B_a``; estimate ``d(x, a)`` by the median over ``b`` in ``B_a`` of
   ``weak(x, b)`` (:func:`robust_distance`). Since ``|d(x, b) - d(x, a)| <= d(a, b) <= r_a`` and most weak
   answers are right, the median is within the ball radius ``r_a`` of the truth. Points whose two nearest
   estimated centres are within ``r_1 + r_2`` of each other are ambiguous; the most ambiguous are resolved
   with strong queries, up to a budget of ``~k m ln n`` queries;
3. *rings*: each point goes to its nearest centre by the estimates; cluster ``i`` with average radius
   ``R_i = (mean est^z)^(1/z)`` is cut into an inner ball ``est <= R_i`` and rings
   ``(2^(j-1) R_i, 2^j R_i]``, ``j <= ceil(log2(n / eps))``;
4. *group-aware sampling*: each cell (cluster, ring, group) keeps ``s = samples_per_ring`` uniform samples
   of weight ``|cell| / s`` (all its points, weight 1, when ``|cell| <= s``), so every group keeps its exact
   total weight; the cheapest cells, up to ``collapse_budget`` (default ``eps / log2 n``) of the estimated
   cost, are replaced by their centre with the cell's weight and group.

Strong queries: ``|S|(|S|-1)/2 + k * 3m + resolve_budget``, i.e. poly(k log n) and independent of ``n``
otherwise; weak queries ``~n k (m + 1)``. ``assign="strong"`` (exact distances from every point to every
centre, ``n k`` strong queries: the naive pipeline) and ``assign="weak"`` (one raw weak query per point and
centre: no median, no verification) are the baselines on the same code; :func:`uniform_coreset` is the
uniform-sampling baseline.

**Fair cost** (:func:`fair_cost`). An assignment is fair when every cluster's share of each group ``g`` lies
in ``[alpha_g, beta_g]``: ``alpha_g w(C) <= w(C & g) <= beta_g w(C)``. The bounds depend on each cluster's own
mass, a variable, so the cost of centres ``C`` (the minimum over fair fractional assignments of
``sum w(x) d(x, sigma(x))^z``) is a linear program, solved with HiGHS (``scipy.optimize.linprog``). With fixed
per-cluster group masses (``counts``) it is a transportation problem, also solvable as a min-cost flow
(``networkx``, integer masses).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from icml25.kernels.checks import check_float, check_int

__all__ = [
    "ASSIGNMENTS",
    "CORRUPTIONS",
    "Coreset",
    "FairCoreset",
    "MetricWarning",
    "StrongOracle",
    "WeakOracle",
    "build_fair_coreset",
    "fair_cost",
    "proportional_bounds",
    "robust_distance",
    "uniform_coreset",
]

CORRUPTIONS = ("random", "adversarial_far")
"""How a corrupted weak answer is drawn: uniform in ``[0, scale]``, or ``scale`` itself (far)."""
ASSIGNMENTS = ("median", "weak", "strong")
"""Distances from points to centres: median over a strong-verified ball (the paper's), raw weak, exact."""

_MAX_ID = 2**31 - 1  # pair keys pack two ids into one int64
_CHUNK = 1 << 18  # pairs per metric call of the coordinate oracles (bounded memory)
_M1, _M2, _M3 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


class MetricWarning(UserWarning):
    """The strong oracle's answers break the triangle inequality on a random check (not a metric)."""


# ------------------------------------------------------------------------------------------ validation
def _check_z(z: Any) -> float:
    if isinstance(z, bool) or not isinstance(z, numbers.Real):
        raise TypeError(f"z must be a number >= 1 (1: k-median, 2: k-means), got {type(z).__name__}")
    if not (math.isfinite(float(z)) and 1 <= float(z) <= 16):
        raise ValueError(f"z must be a finite number in [1, 16] (1: k-median, 2: k-means), got {z}")
    return float(z)


def _check_ids(ids: Any, name: str, *, unique: bool = False, ndim: int | None = 1) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and arr.size == 0):
        raise TypeError(f"{name} must hold integer point ids, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array of point ids, got shape {arr.shape}")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > _MAX_ID):
        raise ValueError(
            f"{name} must hold point ids in [0, {_MAX_ID}], got range [{arr.min()}, {arr.max()}]"
        )
    if unique and np.unique(arr).size != arr.size:
        raise ValueError(f"{name} must hold distinct point ids, got {arr.size - np.unique(arr).size} repeats")
    return arr


def _check_groups(groups: Any, n: int, name: str = "groups") -> tuple[np.ndarray, np.ndarray]:
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


def _rng(seed: Any) -> np.random.Generator:
    """``seed`` if it is a numpy Generator, else a new one from None or a non-negative int."""
    if seed is None or isinstance(seed, np.random.Generator):
        return np.random.default_rng(seed)
    return np.random.default_rng(check_int(seed, "seed (None, an int or a numpy Generator)", low=0))


def _check_points(X: Any, name: str = "X") -> np.ndarray:
    arr = np.asarray(X)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a numeric array [n_points, n_features], got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(
            f"{name} must be a non-empty 2-D array [n_points, n_features], got shape {arr.shape}"
        )
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} must be finite, got {int(bad.sum())} NaN/inf values in shape {arr.shape}")
    peak = float(np.abs(arr).max())
    if peak > 1e150:
        raise ValueError(
            f"{name} must have entries below 1e150 in magnitude (distances overflow), got {peak:.3g}"
        )
    return arr


# ------------------------------------------------------------------------------------------ oracles
def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic): a persistent per-pair hash."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _uniform(keys: np.ndarray, salt: int) -> np.ndarray:
    """A deterministic uniform [0, 1) value per int64 key and salt."""
    h = _mix(keys.astype(np.uint64) ^ _mix(np.array([salt], dtype=np.uint64) * _M3))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


class _PairCache:
    """Answers by unordered pair, kept as sorted int64 keys (``lo << 32 | hi``) with their values."""

    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.int64)
        self.values = np.empty(0, dtype=np.float64)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.keys.size:
            return np.full(keys.shape, np.nan), np.zeros(keys.shape, dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        found = self.keys[pos] == keys
        return np.where(found, self.values[pos], np.nan), found

    def insert(self, keys: np.ndarray, values: np.ndarray) -> None:
        pos = np.searchsorted(self.keys, keys)
        self.keys = np.insert(self.keys, pos, keys)
        self.values = np.insert(self.values, pos, values)


class _Oracle:
    """Shared query logic: ids broadcast, unordered pairs cached, distinct off-diagonal pairs counted."""

    _kind = "oracle"

    def __init__(self, metric: Callable[[np.ndarray, np.ndarray], np.ndarray], n_points: int | None) -> None:
        if not callable(metric):
            raise TypeError(
                f"metric must be callable as metric(i, j) -> distances, got {type(metric).__name__}"
            )
        self.metric = metric
        self.n_points = None if n_points is None else check_int(n_points, "n_points", low=1, high=_MAX_ID + 1)
        self.n_queries = 0
        self._cache = _PairCache()

    def _answer(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        out = np.asarray(self.metric(lo, hi), dtype=np.float64)
        if out.shape != lo.shape:
            raise ValueError(
                f"metric must return one distance per pair, shape {lo.shape}, got shape {out.shape} "
                f"from the {self._kind} oracle"
            )
        bad = ~np.isfinite(out) | (out < 0)
        if bad.any():
            raise ValueError(
                f"metric must return finite non-negative distances, got {int(bad.sum())} negative or "
                f"non-finite values from the {self._kind} oracle"
            )
        return out

    def query(self, i: Any, j: Any) -> np.ndarray:
        """Distances between ids ``i`` and ``j`` (broadcast); each new unordered pair costs one query."""
        a, b = np.broadcast_arrays(_check_ids(i, "i", ndim=None), _check_ids(j, "j", ndim=None))
        if self.n_points is not None and a.size and max(a.max(), b.max()) >= self.n_points:
            raise ValueError(
                f"i and j must be point ids below n_points={self.n_points}, got max {max(a.max(), b.max())}"
            )
        lo, hi = np.minimum(a, b).ravel(), np.maximum(a, b).ravel()
        out = np.zeros(lo.shape, dtype=np.float64)
        off = lo != hi  # d(x, x) = 0 is known without asking
        if off.any():
            keys = (lo[off] << 32) | hi[off]
            uniq, inv = np.unique(keys, return_inverse=True)
            vals, found = self._cache.lookup(uniq)
            if not found.all():
                new = uniq[~found]
                fresh = np.concatenate(
                    [
                        self._answer(c >> 32, c & 0xFFFFFFFF)
                        for c in np.array_split(new, -(-new.size // _CHUNK))
                    ]
                )
                self._cache.insert(new, fresh)
                vals[~found] = fresh
                self.n_queries += int(new.size)
            out[off] = vals[inv.reshape(-1)]
        return out.reshape(a.shape)

    __call__ = query

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_points={self.n_points}, n_queries={self.n_queries})"


def _coordinate_metric(X: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def metric(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        diff = X[i] - X[j]
        return np.sqrt(np.einsum("ij,ij->i", diff, diff))

    return metric


class StrongOracle(_Oracle):
    """The exact, expensive distance oracle, with a cache and a count of the distinct pairs asked.

    Args:
        metric: ``metric(i, j) -> distances`` for 1-D int arrays of point ids of equal length (one distance
            per pair); called only on pairs not asked before, so an expensive model is evaluated once per pair.
        n_points: ids must lie in ``[0, n_points)`` when given.

    ``query(i, j)`` (or calling the oracle) broadcasts ``i`` and ``j``; ``n_queries`` counts distinct
    unordered pairs ``i != j`` (``d(i, i) = 0`` is free). :meth:`from_points` wraps coordinates (Euclidean),
    :meth:`from_transform` an embedding model applied lazily to the points it is asked about.
    """

    _kind = "strong"

    def __init__(
        self, metric: Callable[[np.ndarray, np.ndarray], np.ndarray], *, n_points: int | None = None
    ):
        super().__init__(metric, n_points)

    @classmethod
    def from_points(cls, X: Any) -> StrongOracle:
        """Euclidean distances between the rows of ``X [n_points, n_features]``."""
        X = _check_points(X)
        return cls(_coordinate_metric(X), n_points=X.shape[0])

    @classmethod
    def from_transform(cls, model: Any, X: Any) -> StrongOracle:
        """Euclidean distances between embeddings ``model.transform(X[ids])`` (any scikit-learn transformer
        or a callable), computed only for the points the oracle is asked about (``n_embedded`` counts them)."""
        transform = getattr(model, "transform", model)
        if not callable(transform):
            raise TypeError(f"model must have a transform method or be callable, got {type(model).__name__}")
        X = _check_points(X)
        state: dict[str, Any] = {"emb": None, "done": np.zeros(X.shape[0], dtype=bool)}

        def metric(i: np.ndarray, j: np.ndarray) -> np.ndarray:
            need = np.unique(np.concatenate([i, j]))
            need = need[~state["done"][need]]
            if need.size:
                emb = np.asarray(transform(X[need]), dtype=np.float64)
                if emb.ndim != 2 or emb.shape[0] != need.size or not np.all(np.isfinite(emb)):
                    raise ValueError(
                        f"model.transform must return finite embeddings [n, d] for {need.size} rows, "
                        f"got shape {emb.shape}"
                    )
                if state["emb"] is None:
                    state["emb"] = np.zeros((X.shape[0], emb.shape[1]))
                state["emb"][need] = emb
                state["done"][need] = True
            diff = state["emb"][i] - state["emb"][j]
            return np.sqrt(np.einsum("ij,ij->i", diff, diff))

        oracle = cls(metric, n_points=X.shape[0])
        oracle._embedded = state["done"]
        return oracle

    @property
    def n_embedded(self) -> int:
        """Points embedded so far (:meth:`from_transform` oracles; 0 otherwise)."""
        done = getattr(self, "_embedded", None)
        return int(done.sum()) if done is not None else 0


class WeakOracle(_Oracle):
    """The cheap, unreliable distance oracle (persistent answers, query counting).

    Args:
        metric: ``metric(i, j) -> distances`` (as :class:`StrongOracle`): the cheap distance itself.
        delta: probability that a pair's answer is corrupted (simulated; ``0`` keeps ``metric``'s answers).
            Must be ``< 0.5``: the median-of-ball estimate needs a majority of correct answers.
        corruption: ``"random"``: a corrupted pair answers a uniform value in ``[0, scale]``;
            ``"adversarial_far"``: it answers ``scale`` (every wrong answer on the far side).
        scale: the largest distance (needed when ``delta > 0``).
        seed: the corruption pattern's seed. Corruption is a hash of ``(seed, pair)``, so a pair answers the
            same value every time it is asked, in any order: persistent noise, as in the model.
        n_points: ids must lie in ``[0, n_points)`` when given.
    """

    _kind = "weak"

    def __init__(
        self,
        metric: Callable[[np.ndarray, np.ndarray], np.ndarray],
        delta: float = 0.0,
        *,
        corruption: str = "random",
        scale: float | None = None,
        seed: int | None = None,
        n_points: int | None = None,
    ) -> None:
        delta = check_float(delta, "delta", low=0.0, high=1.0)
        if delta >= 0.5:
            raise ValueError(
                f"delta must be < 0.5: the median over a ball needs a majority of correct weak answers, got {delta}"
            )
        if corruption not in CORRUPTIONS:
            raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}")
        if scale is not None:
            scale = check_float(scale, "scale", low=0.0, high=1e300, low_open=True)
        elif delta > 0:
            raise ValueError("scale must be given (the largest distance) when delta > 0, got None")
        if seed is None:
            seed = int(np.random.default_rng().integers(2**62))
        self.delta, self.corruption, self.scale = delta, corruption, scale
        self.seed = check_int(seed, "seed", low=0, high=2**63 - 1)
        super().__init__(metric, n_points)

    @classmethod
    def from_points(
        cls, X: Any, delta: float = 0.0, *, corruption: str = "random", seed: int | None = None
    ) -> WeakOracle:
        """Euclidean distances between the rows of ``X``, each pair corrupted with probability ``delta``;
        ``scale = 2 max ||x - mean||`` (at least the diameter)."""
        X = _check_points(X)
        scale = 2.0 * float(np.sqrt(((X - X.mean(0)) ** 2).sum(1)).max())
        return cls(
            _coordinate_metric(X), delta, corruption=corruption, scale=scale if scale > 0 else 1.0,
            seed=seed, n_points=X.shape[0],
        )  # fmt: skip

    def corrupted(self, i: Any, j: Any) -> np.ndarray:
        """Whether the pairs' answers are corrupted (ground truth of the simulation; asks nothing)."""
        a, b = np.broadcast_arrays(_check_ids(i, "i", ndim=None), _check_ids(j, "j", ndim=None))
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        return (_uniform((lo << 32) | hi, self.seed) < self.delta) & (lo != hi)

    def _answer(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        out = super()._answer(lo, hi)
        if self.delta > 0:
            keys = (lo << 32) | hi
            bad = _uniform(keys, self.seed) < self.delta
            if self.corruption == "random":
                out[bad] = self.scale * _uniform(keys[bad], self.seed ^ 0x5DEECE66D)
            else:
                out[bad] = self.scale
        return out


def _check_oracle(oracle: Any, name: str) -> _Oracle:
    if not (callable(getattr(oracle, "query", None)) and isinstance(getattr(oracle, "n_queries", None), int)):
        raise TypeError(
            f"{name} must be an oracle with query(i, j) and n_queries (StrongOracle / WeakOracle), "
            f"got {type(oracle).__name__}"
        )
    return oracle


def robust_distance(x: Any, ball: Any, weak: WeakOracle) -> np.ndarray | float:
    """The median over ``b`` in ``ball`` of ``weak(x, b)``: an estimate of ``d(x, c)`` for the centre ``c``
    the ball surrounds, within the ball's radius ``max_b d(b, c)`` of the truth whenever most of the weak
    answers are correct (``|d(x, b) - d(x, c)| <= d(b, c)``). ``x``: one id or an array of ids (then an array
    of estimates, empty for an empty array); ``ball``: a non-empty 1-D array of ids (odd sizes give a proper
    median)."""
    weak = _check_oracle(weak, "weak")
    b = _check_ids(ball, "ball")
    if b.size == 0:
        raise ValueError("ball must hold at least one point id, got an empty array")
    xs = _check_ids(x, "x", ndim=None)
    if xs.ndim > 1:
        raise ValueError(f"x must be one id or a 1-D array of ids, got shape {xs.shape}")
    est = np.median(weak.query(xs.reshape(-1, 1), b.reshape(1, -1)), axis=1)
    return float(est[0]) if xs.ndim == 0 else est


# ------------------------------------------------------------------------------------------ the coreset
@dataclass
class Coreset:
    """A weighted multiset of ``(point id, weight, group)`` entries and how it was built.

    ``indices`` may repeat an id (a centre carrying collapsed cells of several groups): an entry's group is
    the group it stands for, not necessarily the point's own. For every group, the weights of its entries
    sum to the group's size. The diagnostics (``centers`` .. ``n_weak_queries``) describe the input points.
    """

    indices: np.ndarray
    """Point ids of the entries [m]."""
    weights: np.ndarray
    """Entry weights [m] (float)."""
    groups: np.ndarray
    """Entry group labels [m] (the input's labels)."""
    centers: np.ndarray | None = None
    """Ids of the constant-factor centres A [k] (None for the uniform baseline)."""
    assignment: np.ndarray | None = None
    """Index in ``centers`` of every input point's (estimated) nearest centre [n]."""
    distances: np.ndarray | None = None
    """Estimated distance of every input point to its assigned centre [n]."""
    rings: np.ndarray | None = None
    """Ring of every input point (0: inner ball ``<= R_i``; ``j``: ``(2^(j-1) R_i, 2^j R_i]``) [n]."""
    n_strong_queries: int = 0
    """Distinct strong pairs asked by the construction."""
    n_weak_queries: int = 0
    """Distinct weak pairs asked by the construction."""

    def __len__(self) -> int:
        return int(self.indices.size)


def _kmedian_local_search(
    Dz: np.ndarray, k: int, rng: np.random.Generator, max_iter: int = 100
) -> np.ndarray:
    """k-median++ (``D^z`` sampling) then best-improvement single swaps on a [m, m] cost matrix."""
    m = Dz.shape[0]
    centres = [int(rng.integers(m))]
    closest = Dz[:, centres[0]].copy()
    for _ in range(1, k):
        p = closest.copy()
        p[centres] = 0.0
        total = p.sum()
        if total > 0:
            c = int(rng.choice(m, p=p / total))
        else:  # every remaining point coincides with a centre: any unchosen point
            c = int(rng.choice(np.setdiff1d(np.arange(m), centres)))
        centres.append(c)
        closest = np.minimum(closest, Dz[:, c])
    cs = np.array(centres)
    cost = Dz[:, cs].min(1).sum()
    for _ in range(max_iter):
        best = (cost, -1, -1)
        for pos in range(k):
            rest = np.delete(cs, pos)
            base = Dz[:, rest].min(1) if rest.size else np.full(m, np.inf)
            cand = np.minimum(base[:, None], Dz).sum(0)
            cand[cs] = np.inf
            j = int(np.argmin(cand))
            if cand[j] < best[0] - 1e-12 * max(cost, 1e-300):
                best = (float(cand[j]), pos, j)
        if best[1] < 0:
            break
        cs[best[1]] = best[2]
        cost = best[0]
    return cs


def _triangle_violations(D: np.ndarray, rng: np.random.Generator, n_triples: int = 300) -> int:
    m = D.shape[0]
    if m < 3:
        return 0
    a, b, c = (rng.integers(m, size=n_triples) for _ in range(3))
    tol = 1e-9 * max(float(D.max()), 1e-300)
    return int(np.sum(D[a, c] > D[a, b] + D[b, c] + tol))


@dataclass(frozen=True)
class _Params:
    k: int
    eps: float
    z: float
    samples_per_ring: int
    ball_size: int
    n_candidates: int
    n_seed_samples: int
    resolve_budget: int
    collapse_budget: float
    assign: str


def _params(n: int, k: Any, eps: Any, z: Any, samples_per_ring: Any, ball_size: Any, n_candidates: Any,
            n_seed_samples: Any, resolve_budget: Any, collapse_budget: Any, assign: Any) -> _Params:  # fmt: skip
    k = check_int(k, "k", low=1)
    if k > n:
        raise ValueError(f"k must be <= the number of points ({n}), got k={k}")
    eps = check_float(eps, "eps", low=0.0, high=1.0, low_open=True, high_open=True)
    z = _check_z(z)
    if assign not in ASSIGNMENTS:
        raise ValueError(f"assign must be one of {ASSIGNMENTS}, got {assign!r}")
    log2n = math.log2(max(n, 2))
    s = (
        math.ceil(1.0 / eps**2)
        if samples_per_ring is None
        else check_int(samples_per_ring, "samples_per_ring", low=1)
    )
    m = (math.ceil(log2n) | 1) if ball_size is None else check_int(ball_size, "ball_size", low=1)
    m = min(m, n)
    cand = 3 * m if n_candidates is None else check_int(n_candidates, "n_candidates", low=0)
    if cand < m - 1:
        raise ValueError(f"n_candidates must be >= ball_size - 1 = {m - 1}, got {cand}")
    cand = min(cand, n - 1)
    seed_n = math.ceil(1.5 * k * math.log(max(n, 2))) if n_seed_samples is None else n_seed_samples
    seed_n = min(max(check_int(seed_n, "n_seed_samples", low=1), k), n)
    budget = math.ceil(k * m * math.log(max(n, 2))) if resolve_budget is None else resolve_budget
    budget = check_int(budget, "resolve_budget", low=0)
    collapse = eps / log2n if collapse_budget is None else collapse_budget
    collapse = check_float(collapse, "collapse_budget", low=0.0, high=1.0, high_open=True)
    return _Params(k, eps, z, s, m, cand, seed_n, budget, collapse, assign)


def build_fair_coreset(
    indices: Any,
    groups: Any,
    k: int,
    eps: float,
    strong: StrongOracle,
    weak: WeakOracle,
    *,
    z: float = 1,
    samples_per_ring: int | None = None,
    ball_size: int | None = None,
    n_candidates: int | None = None,
    n_seed_samples: int | None = None,
    resolve_budget: int | None = None,
    collapse_budget: float | None = None,
    assign: str = "median",
    seed: int | np.random.Generator | None = None,
) -> Coreset:
    """A fair (k, z)-clustering coreset of the points ``indices`` from strong and weak distance queries.

    Args:
        indices: distinct point ids [n] (the ids both oracles understand).
        groups: a group label per point [n] (int or str; none missing).
        k: number of centres. eps: target relative error in (0, 1).
        strong, weak: the oracles (:class:`StrongOracle`, :class:`WeakOracle`); their counters grow.
        z: cost exponent (1: k-median, 2: k-means); keep the same ``z`` in :func:`fair_cost`.
        samples_per_ring: samples per (cluster, ring, group) cell (default ``ceil(1 / eps^2)``; the theory's
            ``k eps^-2 polylog`` constants are far larger).
        ball_size: points ``m`` per centre ball, the centre included (default ``ceil(log2 n)``, made odd).
        n_candidates: weak-nearest candidates strong-verified per ball (default ``3 m``).
        n_seed_samples: size of the strong sample ``S`` (default ``ceil(1.5 k ln n)``).
        resolve_budget: strong queries for ambiguous assignments (default ``ceil(k m ln n)``).
        collapse_budget: share of the estimated cost whose cheapest cells are collapsed onto their centre
            (default ``eps / log2 n``; 0 disables).
        assign: ``"median"`` (the paper's robust estimates), ``"weak"`` (raw weak distances: baseline) or
            ``"strong"`` (exact distances to all centres, ``n k`` strong queries: the naive pipeline).
        seed: seed of the samples (int, None or a numpy Generator).

    Returns:
        :class:`Coreset` (entries, centres, per-point assignment, estimates and rings, query counts).
    """
    ids = _check_ids(indices, "indices", unique=True)
    n = ids.size
    if n == 0:
        raise ValueError("indices must hold at least one point id, got an empty array")
    codes, labels = _check_groups(groups, n)
    p = _params(n, k, eps, z, samples_per_ring, ball_size, n_candidates, n_seed_samples, resolve_budget,
                collapse_budget, assign)  # fmt: skip
    strong, weak = _check_oracle(strong, "strong"), _check_oracle(weak, "weak")
    rng = _rng(seed)
    s0, w0 = strong.n_queries, weak.n_queries

    # 1. constant-factor centres from the strong sample S
    S = np.sort(rng.choice(n, size=p.n_seed_samples, replace=False))
    DS = strong.query(ids[S][:, None], ids[S][None, :])
    bad = _triangle_violations(DS, rng)
    if bad:
        warnings.warn(
            f"strong oracle breaks the triangle inequality on {bad} of 300 random triples of its sample: "
            "it is not a metric, and the coreset's guarantee assumes one",
            MetricWarning,
            stacklevel=2,
        )
    A = _kmedian_local_search(DS**p.z, p.k, rng)
    centre_pos = S[A]
    centres = ids[centre_pos]

    # 2. distances from every point to every centre
    if p.assign == "strong":
        E = strong.query(ids[:, None], centres[None, :])
    elif p.assign == "weak":
        E = weak.query(ids[:, None], centres[None, :])
    else:
        E = _robust_estimates(ids, centres, S, DS[:, A], strong, weak, p)
    assignment = np.argmin(E, axis=1)
    dist = E[np.arange(n), assignment]

    # 3. rings
    rings = np.zeros(n, dtype=np.int64)
    j_max = math.ceil(math.log2(n / p.eps))
    for i in range(p.k):
        members = assignment == i
        if not members.any():
            continue
        radius = float(np.mean(dist[members] ** p.z)) ** (1.0 / p.z)
        if radius > 0:
            ratio = dist[members] / radius
            with np.errstate(divide="ignore"):
                j = np.where(ratio > 1, np.ceil(np.log2(np.maximum(ratio, 1.0))), 0)
            rings[members] = np.minimum(j, j_max).astype(np.int64)

    # 4. cells (cluster, ring, group): collapse the cheapest, sample the rest
    n_rings = j_max + 1
    n_groups = labels.size
    cell = (assignment * n_rings + rings) * n_groups + codes
    cells, cell_of = np.unique(cell, return_inverse=True)
    cell_of = cell_of.reshape(-1)
    size = np.bincount(cell_of, minlength=cells.size)
    cost = np.bincount(cell_of, weights=dist**p.z, minlength=cells.size)
    collapsed = np.zeros(cells.size, dtype=bool)
    total = float(cost.sum())
    if p.collapse_budget > 0 and total > 0:
        order = np.argsort(cost, kind="stable")
        within = np.cumsum(cost[order]) <= p.collapse_budget * total
        collapsed[order[within]] = True
        collapsed &= size > 1  # a one-point cell is already a single entry
    out_ids, out_w, out_g = [], [], []
    order = np.argsort(cell_of, kind="stable")
    starts = np.concatenate([[0], np.cumsum(size)])
    merged: dict[tuple[int, int], float] = {}
    for c in range(cells.size):
        members = order[starts[c] : starts[c + 1]]
        g = int(codes[members[0]])
        if collapsed[c]:
            key = (int(assignment[members[0]]), g)
            merged[key] = merged.get(key, 0.0) + float(members.size)
            continue
        if members.size <= p.samples_per_ring:
            pick, weight = members, 1.0
        else:
            pick = rng.choice(members, size=p.samples_per_ring, replace=False)
            weight = members.size / p.samples_per_ring
        out_ids.append(ids[np.sort(pick)])
        out_w.append(np.full(pick.size, weight))
        out_g.append(np.full(pick.size, g))
    for (i, g), w in sorted(merged.items()):
        out_ids.append(centres[i : i + 1])
        out_w.append(np.array([w]))
        out_g.append(np.array([g]))
    return Coreset(
        indices=np.concatenate(out_ids).astype(np.int64),
        weights=np.concatenate(out_w).astype(np.float64),
        groups=labels[np.concatenate(out_g).astype(np.int64)],
        centers=centres,
        assignment=assignment.astype(np.int64),
        distances=dist,
        rings=rings,
        n_strong_queries=strong.n_queries - s0,
        n_weak_queries=weak.n_queries - w0,
    )


def _robust_estimates(
    ids: np.ndarray, centres: np.ndarray, S: np.ndarray, DSA: np.ndarray, strong: _Oracle, weak: _Oracle,
    p: _Params,
) -> np.ndarray:  # fmt: skip
    """[n, k] distance estimates: median over strong-verified balls, exact where known, ambiguity resolved."""
    n, k = ids.size, centres.size
    sorter = np.argsort(ids)
    exact = np.zeros((n, k), dtype=bool)
    E = np.empty((n, k))
    radii = np.zeros(k)
    for i, c in enumerate(centres):
        # candidates: the points nearest to c by a first median estimate over c's nearest strong-sample points
        # (raw weak nearest neighbours would be mostly corrupted pairs: with n delta corrupted answers spread
        # over [0, scale], many fall below the true nearest-neighbour distance once n is large)
        near = np.argsort(DSA[:, i], kind="stable")[: p.ball_size]
        wd = robust_distance(ids, np.union1d(ids[S[near]], [c]), weak)
        wd[ids == c] = np.inf
        cand = ids[np.argsort(wd, kind="stable")[: p.n_candidates]]
        sd = strong.query(c, cand)
        keep = np.argsort(sd, kind="stable")[: p.ball_size - 1]
        ball = np.concatenate([[c], cand[keep]])
        radii[i] = float(sd[keep].max()) if keep.size else 0.0
        E[:, i] = robust_distance(ids, ball, weak)
        pos = sorter[np.searchsorted(ids, cand[keep], sorter=sorter)]  # the ball's distances are exact
        E[pos, i], exact[pos, i] = sd[keep], True
        at = np.flatnonzero(ids == c)
        E[at, i], exact[at, i] = 0.0, True
    E[S, :], exact[S, :] = DSA, True  # the strong sample's distances are known
    if k > 1 and p.resolve_budget >= 2:
        top = np.argsort(E, axis=1, kind="stable")[:, :2]
        e = np.take_along_axis(E, top, axis=1)
        margin = radii[top[:, 0]] + radii[top[:, 1]]
        known = np.take_along_axis(exact, top, axis=1).all(1)
        with np.errstate(divide="ignore", invalid="ignore"):
            gap = np.where(margin > 0, (e[:, 1] - e[:, 0]) / margin, np.inf)
        amb = np.flatnonzero((gap <= 1) & ~known)
        amb = amb[np.argsort(gap[amb], kind="stable")][: p.resolve_budget // 2]
        if amb.size:
            cols = top[amb]
            d = strong.query(ids[amb][:, None], centres[cols])
            E[amb[:, None], cols], exact[amb[:, None], cols] = d, True
    return E


class FairCoreset:
    """Scikit-learn-style builder of a fair (k, z)-clustering coreset from strong and weak oracles.

    The hyperparameters are those of :func:`build_fair_coreset` (``get_params``/``set_params`` work, so
    ``sklearn.base.clone`` does). ``fit(indices, groups, strong=..., weak=...)`` builds the coreset and sets
    ``coreset_`` (:class:`Coreset`), ``indices_``, ``weights_``, ``groups_`` (its entries), ``centers_`` (the
    constant-factor centres), ``labels_`` (every input point's cluster among them), ``n_strong_queries_`` and
    ``n_weak_queries_``. A rejected ``fit`` leaves a fitted builder unchanged.

    Deliberately not a ``sklearn.base.BaseEstimator``: the points are not a feature matrix but indices into
    two distance oracles (``strong`` and ``weak``, keyword-only and required, the query counts being the
    paper's cost), and there is no ``y``, ``predict`` or ``transform``. scikit-learn's estimator checks
    (``check_estimator``), which fit on ``(X, y)`` arrays, therefore do not apply; the parameter protocol
    (``get_params``/``set_params``, hence ``clone`` and ``GridSearchCV``-style parameter handling) is kept.
    """

    def __init__(
        self,
        k: int = 5,
        eps: float = 0.2,
        *,
        z: float = 1,
        samples_per_ring: int | None = None,
        ball_size: int | None = None,
        n_candidates: int | None = None,
        n_seed_samples: int | None = None,
        resolve_budget: int | None = None,
        collapse_budget: float | None = None,
        assign: str = "median",
        seed: int | None = None,
    ) -> None:
        self.k = k
        self.eps = eps
        self.z = z
        self.samples_per_ring = samples_per_ring
        self.ball_size = ball_size
        self.n_candidates = n_candidates
        self.n_seed_samples = n_seed_samples
        self.resolve_budget = resolve_budget
        self.collapse_budget = collapse_budget
        self.assign = assign
        self.seed = seed

    _PARAMS = ("k", "eps", "z", "samples_per_ring", "ball_size", "n_candidates", "n_seed_samples",
               "resolve_budget", "collapse_budget", "assign", "seed")  # fmt: skip

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params: Any) -> FairCoreset:
        for name, value in params.items():
            if name not in self._PARAMS:
                raise ValueError(f"set_params got an unknown parameter {name!r}; valid: {self._PARAMS}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        return f"FairCoreset(k={self.k!r}, eps={self.eps!r}, assign={self.assign!r})"

    def fit(self, indices: Any, groups: Any, *, strong: StrongOracle, weak: WeakOracle) -> FairCoreset:
        """Build the coreset of the points ``indices`` with labels ``groups`` (see the class docstring)."""
        coreset = build_fair_coreset(
            indices, groups, self.k, self.eps, strong, weak, z=self.z, samples_per_ring=self.samples_per_ring,
            ball_size=self.ball_size, n_candidates=self.n_candidates, n_seed_samples=self.n_seed_samples,
            resolve_budget=self.resolve_budget, collapse_budget=self.collapse_budget, assign=self.assign,
            seed=self.seed,
        )  # fmt: skip
        self.coreset_ = coreset
        self.indices_, self.weights_, self.groups_ = coreset.indices, coreset.weights, coreset.groups
        self.centers_, self.labels_ = coreset.centers, coreset.assignment
        self.n_strong_queries_, self.n_weak_queries_ = coreset.n_strong_queries, coreset.n_weak_queries
        return self

    def _fitted(self) -> Coreset:
        if not hasattr(self, "coreset_"):
            raise ValueError("FairCoreset is not fitted: call fit(...) first")
        return self.coreset_

    def __len__(self) -> int:
        return len(self._fitted())


def uniform_coreset(
    indices: Any, groups: Any, size: int, *, seed: int | np.random.Generator | None = None
) -> Coreset:
    """The uniform-sampling baseline: ``size`` distinct points drawn uniformly, each of weight ``n / size``
    (per-group totals then match the groups' sizes only in expectation)."""
    ids = _check_ids(indices, "indices", unique=True)
    if ids.size == 0:
        raise ValueError("indices must hold at least one point id, got an empty array")
    codes, labels = _check_groups(groups, ids.size)
    size = check_int(size, "size", low=1, high=ids.size)
    pick = np.sort(_rng(seed).choice(ids.size, size=size, replace=False))
    return Coreset(ids[pick], np.full(size, ids.size / size), labels[codes[pick]])


# ------------------------------------------------------------------------------------------ fair cost
def proportional_bounds(
    groups: Any, slack: float = 0.1, *, weights: Any = None
) -> dict[Any, tuple[float, float]]:
    """``{g: (share_g - slack, share_g + slack)}`` clipped to [0, 1], ``share_g`` the (weighted) share of group
    ``g``: every cluster's mix within ``slack`` of the population's."""
    arr = np.asarray(groups)
    if arr.ndim == 1 and arr.shape[0] == 0:
        raise ValueError("groups must hold at least one label, got an empty array")
    codes, labels = _check_groups(groups, arr.shape[0] if arr.ndim else -1)
    slack = check_float(slack, "slack", low=0.0, high=1.0)
    w = _check_weights(weights, codes.size) if weights is not None else np.ones(codes.size)
    share = np.bincount(codes, weights=w, minlength=labels.size) / w.sum()
    return {
        labels[g].item(): (max(0.0, float(share[g]) - slack), min(1.0, float(share[g]) + slack))
        for g in range(labels.size)
    }


def _check_weights(weights: Any, n: int) -> np.ndarray:
    w = np.asarray(weights)
    if w.dtype.kind not in "biuf":
        raise TypeError(f"weights must be a numeric array [n_points], got dtype {w.dtype}")
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(f"weights must be a 1-D array with one weight per point ({n}), got shape {w.shape}")
    w = w.astype(np.float64)
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(
            f"weights must be finite and non-negative, got {int(np.sum(~np.isfinite(w) | (w < 0)))} bad values"
        )
    if w.size and w.max() > 1e150:
        raise ValueError(f"weights must be below 1e150 (costs overflow), got max {w.max():.3g}")
    if not w.sum() > 0:
        raise ValueError("weights must have a positive total, got all zeros")
    return w


def _check_distances(distances: Any) -> np.ndarray:
    D = np.asarray(distances)
    if D.dtype.kind not in "biuf":
        raise TypeError(f"distances must be a numeric array [n_points, n_centers], got dtype {D.dtype}")
    if D.ndim != 2 or D.shape[0] == 0 or D.shape[1] == 0:
        raise ValueError(
            f"distances must be a non-empty 2-D array [n_points, n_centers], got shape {D.shape}"
        )
    D = D.astype(np.float64)
    bad = ~np.isfinite(D) | (D < 0)
    if bad.any():
        raise ValueError(
            f"distances must be finite and non-negative, got {int(bad.sum())} bad values in shape {D.shape}"
        )
    if D.max() > 1e15:
        raise ValueError(
            f"distances must be below 1e15 (d^z overflows the solver's range), got max {D.max():.3g}"
        )
    return D


def fair_cost(
    distances: Any,
    weights: Any,
    groups: Any,
    bounds: Mapping[Any, tuple[float, float]] | None = None,
    *,
    z: float = 1,
    counts: Mapping[Any, Any] | None = None,
    solver: str = "lp",
    return_assignment: bool = False,
) -> float | tuple[float, np.ndarray]:
    """The fair (k, z)-clustering cost ``min sum_x,c X[x, c] d(x, c)^z`` over fractional assignments ``X``
    (``sum_c X[x, c] = w(x)``) that respect the fairness constraint.

    Args:
        distances: ``d(x, c)`` from every point (or coreset entry) to every centre [n, k].
        weights: ``w(x)`` [n] (ones for the full data, the coreset's weights for a coreset).
        groups: group labels [n].
        bounds: ``{g: (alpha_g, beta_g)}``: every cluster ``C`` has ``alpha_g w(C) <= w(C & g) <= beta_g w(C)``
            (groups not named are unconstrained). Infeasible when ``alpha_g`` exceeds group ``g``'s share (or
            ``beta_g`` is below it): a ``ValueError`` names the group. ``None`` and no ``counts``: the plain
            (unconstrained) cost ``sum_x w(x) min_c d(x, c)^z``.
        z: cost exponent.
        counts: the fixed-count variant instead of ``bounds``: ``{g: masses [k]}`` of group ``g`` assigned to
            each cluster (summing to the group's weight); every group must be named.
        solver: ``"lp"`` (HiGHS via ``scipy.optimize.linprog``) or ``"flow"`` (``networkx.min_cost_flow``;
            ``counts`` only, integer weights and counts; costs rounded to integers at 1e-9 of the largest).
        return_assignment: also return ``X`` [n, k].
    """
    D = _check_distances(distances)
    n, k = D.shape
    w = _check_weights(weights, n)
    codes, labels = _check_groups(groups, n)
    z = _check_z(z)
    if solver not in ("lp", "flow"):
        raise ValueError(f"solver must be 'lp' or 'flow', got {solver!r}")
    if bounds is not None and counts is not None:
        raise ValueError(
            "bounds and counts are exclusive: give proportional bounds or fixed counts, not both"
        )
    if solver == "flow" and counts is None:
        raise ValueError(
            "solver='flow' needs counts (fixed per-cluster group masses); bounds need solver='lp'"
        )
    lookup = {lab.item() if hasattr(lab, "item") else lab: g for g, lab in enumerate(labels)}
    mass = np.bincount(codes, weights=w, minlength=labels.size)
    Dz = D**z
    if bounds is None and counts is None:
        X = np.zeros((n, k))
        X[np.arange(n), np.argmin(Dz, axis=1)] = w
        cost = float((w * Dz.min(1)).sum())
        return (cost, X) if return_assignment else cost
    if counts is not None:
        target = _check_counts(counts, lookup, mass, k)
        if solver == "flow":
            X = _flow_assignment(Dz, w, codes, target)
            cost = float((X * Dz).sum())
            return (cost, X) if return_assignment else cost
        rows = [(g, c, "eq", target[g, c]) for g in range(labels.size) for c in range(k)]
    else:
        rows = _bound_rows(bounds, lookup, mass / mass.sum(), k)
    return _lp_assignment(Dz, w, codes, rows, return_assignment)


def _bound_rows(bounds: Any, lookup: dict, share: np.ndarray, k: int) -> list[tuple[int, int, str, float]]:
    if not isinstance(bounds, Mapping):
        raise TypeError(f"bounds must be a mapping {{group: (alpha, beta)}}, got {type(bounds).__name__}")
    rows = []
    for g, ab in bounds.items():
        if g not in lookup:
            raise ValueError(
                f"bounds names group {g!r}, which has no points; groups: {sorted(lookup, key=str)}"
            )
        try:
            alpha, beta = (float(v) for v in ab)
        except (TypeError, ValueError):
            raise TypeError(f"bounds[{g!r}] must be a pair (alpha, beta) of floats, got {ab!r}") from None
        if not (0 <= alpha <= beta <= 1):
            raise ValueError(f"bounds[{g!r}] must satisfy 0 <= alpha <= beta <= 1, got ({alpha}, {beta})")
        s = float(share[lookup[g]])
        if alpha > s + 1e-12 or beta < s - 1e-12:
            raise ValueError(
                f"bounds are infeasible for group {g!r}: its share of the weight is {s:.4g} (in groups, "
                f"weighted by weights), outside "
                f"[alpha, beta] = [{alpha:.4g}, {beta:.4g}], and every fair clustering averages to the share"
            )
        for c in range(k):
            if alpha > 0:
                rows.append((lookup[g], c, "lo", alpha))
            if beta < 1:
                rows.append((lookup[g], c, "hi", beta))
    return rows


def _check_counts(counts: Any, lookup: dict, mass: np.ndarray, k: int) -> np.ndarray:
    if not isinstance(counts, Mapping):
        raise TypeError(f"counts must be a mapping {{group: masses [k]}}, got {type(counts).__name__}")
    target = np.full((mass.size, k), np.nan)
    for g, v in counts.items():
        if g not in lookup:
            raise ValueError(
                f"counts names group {g!r}, which has no points; groups: {sorted(lookup, key=str)}"
            )
        arr = np.asarray(v, dtype=np.float64)
        if arr.shape != (k,) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError(f"counts[{g!r}] must be {k} finite non-negative masses, got {v!r}")
        if not math.isclose(arr.sum(), mass[lookup[g]], rel_tol=1e-9, abs_tol=1e-9):
            raise ValueError(
                f"counts[{g!r}] must sum to the group's weight {mass[lookup[g]]:.6g}, got {arr.sum():.6g}"
            )
        target[lookup[g]] = arr
    if np.isnan(target).any():
        missing = [lab for lab, g in lookup.items() if np.isnan(target[g]).any()]
        raise ValueError(f"counts must name every group, missing {missing}")
    return target


def _lp_assignment(Dz: np.ndarray, w: np.ndarray, codes: np.ndarray, rows: list, return_assignment: bool):
    from scipy import sparse
    from scipy.optimize import linprog

    n, k = Dz.shape
    nv = n * k
    w_scale = float(w.mean())
    c_scale = float(Dz.max()) if Dz.max() > 0 else 1.0
    ws = w / w_scale
    A_eq_rows = [sparse.csr_matrix((np.ones(nv), (np.repeat(np.arange(n), k), np.arange(nv))), shape=(n, nv))]
    b_eq = [ws]
    ub_r, ub_c, ub_v, b_ub = [], [], [], []
    eq_r, eq_c, eq_v, b_eq2 = [], [], [], []
    cols = np.arange(n) * k
    for g, c, kind, value in rows:
        ind = (codes == g).astype(np.float64)
        if kind == "lo":  # alpha * sum_x X - sum_{x in g} X <= 0
            vals = value - ind
        elif kind == "hi":  # sum_{x in g} X - beta * sum_x X <= 0
            vals = ind - value
        else:  # sum_{x in g} X = count
            sel = np.flatnonzero(ind)
            eq_r.append(np.full(sel.size, len(b_eq2)))
            eq_c.append(cols[sel] + c)
            eq_v.append(np.ones(sel.size))
            b_eq2.append(value / w_scale)
            continue
        nz = np.flatnonzero(vals)
        ub_r.append(np.full(nz.size, len(b_ub)))
        ub_c.append(cols[nz] + c)
        ub_v.append(vals[nz])
        b_ub.append(0.0)
    if b_eq2:
        A_eq_rows.append(
            sparse.csr_matrix(
                (np.concatenate(eq_v), (np.concatenate(eq_r), np.concatenate(eq_c))), shape=(len(b_eq2), nv)
            )
        )
        b_eq.append(np.array(b_eq2))
    A_ub = (
        sparse.csr_matrix(
            (np.concatenate(ub_v), (np.concatenate(ub_r), np.concatenate(ub_c))), shape=(len(b_ub), nv)
        )
        if b_ub
        else None
    )
    res = linprog(
        (Dz / c_scale).ravel(), A_ub=A_ub, b_ub=np.array(b_ub) if b_ub else None,
        A_eq=sparse.vstack(A_eq_rows).tocsr(), b_eq=np.concatenate(b_eq), bounds=(0, None), method="highs",
    )  # fmt: skip
    if res.status != 0:
        raise ValueError(
            f"fair assignment LP failed (status {res.status}): {res.message}; check bounds/counts"
        )
    X = np.maximum(res.x.reshape(n, k), 0.0) * w_scale
    cost = float(res.fun) * c_scale * w_scale
    return (cost, X) if return_assignment else cost


def _flow_assignment(Dz: np.ndarray, w: np.ndarray, codes: np.ndarray, target: np.ndarray) -> np.ndarray:
    import networkx as nx

    n, k = Dz.shape
    if np.any(w != np.round(w)) or np.any(target != np.round(target)):
        raise ValueError(
            "weights and counts must be integer masses for solver='flow' (min-cost flow is integral)"
        )
    scale = 1e9 / float(Dz.max()) if Dz.max() > 0 else 1.0
    cost = np.round(Dz * scale).astype(np.int64)
    G = nx.DiGraph()
    for x in range(n):
        G.add_node(("x", x), demand=-int(w[x]))
    for g in range(target.shape[0]):
        for c in range(k):
            G.add_node(("c", c, g), demand=int(target[g, c]))
    for x in range(n):
        for c in range(k):
            G.add_edge(("x", x), ("c", c, int(codes[x])), weight=int(cost[x, c]))
    flow = nx.min_cost_flow(G)
    X = np.zeros((n, k))
    for x in range(n):
        for (_, c, _), f in flow[("x", x)].items():
            X[x, c] = f
    return X
