"""Relative Error Fair Clustering in the Weak-Strong Oracle Model — ICML 2025, P08: the
strong and weak distance oracles.

Wang, Nguyen, Dharangutte, Zhou, Jiang, Braverman, Zhang, "Relative Error Fair Clustering in the Weak-Strong
Oracle Model", ICML 2025 (arXiv 2506.12287; no official code was published). The pipeline is described in
:mod:`icml25.causal_discovery.fair_coreset`.

Distances between points (identified by integer ids) come from two oracles: a *strong* one, exact and
expensive (a large embedding model), and a *weak* one, cheap but wrong on some pairs. In the weak-strong
model of Bateni et al. (2024), each unordered pair is independently answered correctly with probability at
least ``1 - delta`` (``delta < 1/2``) and arbitrarily otherwise, and answers are *persistent*: asking again
returns the same value. :class:`StrongOracle` and :class:`WeakOracle` cache their answers and count the
distinct pairs asked (``n_queries``); :class:`WeakOracle` can simulate the corruption (``delta``, a
persistent per-pair hash, ``corruption="random"``: a uniform value in ``[0, scale]``, or
``"adversarial_far"``: ``scale``). :func:`robust_distance` is the median-of-ball estimate the coreset uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from icml25.causal_discovery.fair_coreset_validation import MAX_ID, as_point_ids, as_points
from icml25.kernels.checks import check_choice, check_float, check_int

__all__ = ["CORRUPTIONS", "StrongOracle", "WeakOracle", "as_oracle", "robust_distance"]

CORRUPTIONS = ("random", "adversarial_far")
"""How a corrupted weak answer is drawn: uniform in ``[0, scale]``, or ``scale`` itself (far)."""

_CHUNK = 1 << 18  # pairs per metric call of the coordinate oracles (bounded memory)
_M1, _M2, _M3 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


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
        self.n_points = None if n_points is None else check_int(n_points, "n_points", low=1, high=MAX_ID + 1)
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
        a, b = np.broadcast_arrays(as_point_ids(i, "i", ndim=None), as_point_ids(j, "j", ndim=None))
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
        X = as_points(X)
        return cls(_coordinate_metric(X), n_points=X.shape[0])

    @classmethod
    def from_transform(cls, model: Any, X: Any) -> StrongOracle:
        """Euclidean distances between embeddings ``model.transform(X[ids])`` (any scikit-learn transformer
        or a callable), computed only for the points the oracle is asked about (``n_embedded`` counts them)."""
        transform = getattr(model, "transform", model)
        if not callable(transform):
            raise TypeError(f"model must have a transform method or be callable, got {type(model).__name__}")
        X = as_points(X)
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
        check_choice(corruption, "corruption", CORRUPTIONS)
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
        X = as_points(X)
        scale = 2.0 * float(np.sqrt(((X - X.mean(0)) ** 2).sum(1)).max())
        return cls(
            _coordinate_metric(X), delta, corruption=corruption, scale=scale if scale > 0 else 1.0,
            seed=seed, n_points=X.shape[0],
        )  # fmt: skip

    def corrupted(self, i: Any, j: Any) -> np.ndarray:
        """Whether the pairs' answers are corrupted (ground truth of the simulation; asks nothing)."""
        a, b = np.broadcast_arrays(as_point_ids(i, "i", ndim=None), as_point_ids(j, "j", ndim=None))
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


def as_oracle(oracle: Any, name: str) -> _Oracle:
    """``oracle`` if it has ``query(i, j)`` and an int ``n_queries`` (a :class:`StrongOracle` or
    :class:`WeakOracle`), else a ``TypeError`` naming ``name``."""
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
    weak = as_oracle(weak, "weak")
    b = as_point_ids(ball, "ball")
    if b.size == 0:
        raise ValueError("ball must hold at least one point id, got an empty array")
    xs = as_point_ids(x, "x", ndim=None)
    if xs.ndim > 1:
        raise ValueError(f"x must be one id or a 1-D array of ids, got shape {xs.shape}")
    est = np.median(weak.query(xs.reshape(-1, 1), b.reshape(1, -1)), axis=1)
    return float(est[0]) if xs.ndim == 0 else est
