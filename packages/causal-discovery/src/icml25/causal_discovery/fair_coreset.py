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

The oracles live in :mod:`icml25.causal_discovery.fair_coreset_oracles`, the fair cost in
:mod:`icml25.causal_discovery.fair_coreset_cost` and the input conversions in
:mod:`icml25.causal_discovery.fair_coreset_validation`; this module builds the coreset and re-exports the
public names of the others.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from icml25.causal_discovery.fair_coreset_cost import fair_cost, proportional_bounds
from icml25.causal_discovery.fair_coreset_oracles import (
    CORRUPTIONS,
    StrongOracle,
    WeakOracle,
    as_oracle,
    robust_distance,
)
from icml25.causal_discovery.fair_coreset_validation import as_generator, as_group_codes, as_point_ids
from icml25.kernels.checks import check_choice, check_float, check_int

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

ASSIGNMENTS = ("median", "weak", "strong")
"""Distances from points to centres: median over a strong-verified ball (the paper's), raw weak, exact."""


class MetricWarning(UserWarning):
    """The strong oracle's answers break the triangle inequality on a random check (not a metric)."""


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
    z = check_float(z, "z", low=1.0, high=16.0)
    check_choice(assign, "assign", ASSIGNMENTS)
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
    ids = as_point_ids(indices, "indices", unique=True)
    n = ids.size
    if n == 0:
        raise ValueError("indices must hold at least one point id, got an empty array")
    codes, labels = as_group_codes(groups, n)
    p = _params(n, k, eps, z, samples_per_ring, ball_size, n_candidates, n_seed_samples, resolve_budget,
                collapse_budget, assign)  # fmt: skip
    strong, weak = as_oracle(strong, "strong"), as_oracle(weak, "weak")
    rng = as_generator(seed)
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
    ids: np.ndarray, centres: np.ndarray, S: np.ndarray, DSA: np.ndarray, strong: StrongOracle, weak: WeakOracle,
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
    ids = as_point_ids(indices, "indices", unique=True)
    if ids.size == 0:
        raise ValueError("indices must hold at least one point id, got an empty array")
    codes, labels = as_group_codes(groups, ids.size)
    size = check_int(size, "size", low=1, high=ids.size)
    pick = np.sort(as_generator(seed).choice(ids.size, size=size, replace=False))
    return Coreset(ids[pick], np.full(size, ids.size / size), labels[codes[pick]])
