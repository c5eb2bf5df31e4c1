"""Relative Error Fair Clustering in the Weak-Strong Oracle Model — ICML 2025, P08: the
fair assignment cost that evaluates a coreset.

Wang, Nguyen, Dharangutte, Zhou, Jiang, Braverman, Zhang, "Relative Error Fair Clustering in the Weak-Strong
Oracle Model", ICML 2025 (arXiv 2506.12287; no official code was published). The pipeline is described in
:mod:`icml25.causal_discovery.fair_coreset`.

An assignment is fair when every cluster's share of each group ``g`` lies in ``[alpha_g, beta_g]``:
``alpha_g w(C) <= w(C & g) <= beta_g w(C)``. The bounds depend on each cluster's own mass, a variable, so the
cost of centres ``C`` (the minimum over fair fractional assignments of ``sum w(x) d(x, sigma(x))^z``) is a
linear program, solved with HiGHS (``scipy.optimize.linprog``). With fixed per-cluster group masses
(``counts``) it is a transportation problem, also solvable as a min-cost flow (``networkx``, integer
masses). :func:`proportional_bounds` gives every cluster the population's mix within a slack.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from icml25.causal_discovery.fair_coreset_validation import as_group_codes
from icml25.kernels.checks import check_float

__all__ = ["fair_cost", "proportional_bounds"]


def proportional_bounds(
    groups: Any, slack: float = 0.1, *, weights: Any = None
) -> dict[Any, tuple[float, float]]:
    """``{g: (share_g - slack, share_g + slack)}`` clipped to [0, 1], ``share_g`` the (weighted) share of group
    ``g``: every cluster's mix within ``slack`` of the population's."""
    arr = np.asarray(groups)
    if arr.ndim == 1 and arr.shape[0] == 0:
        raise ValueError("groups must hold at least one label, got an empty array")
    codes, labels = as_group_codes(groups, arr.shape[0] if arr.ndim else -1)
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
    codes, labels = as_group_codes(groups, n)
    z = check_float(z, "z", low=1.0, high=16.0)
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
