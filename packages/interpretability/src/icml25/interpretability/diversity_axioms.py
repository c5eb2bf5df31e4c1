"""Measuring Diversity: Axioms and Challenges — ICML 2025, P34: counterexample search for the three axioms.

Mironov & Prokhorenkova, "Measuring Diversity: Axioms and Challenges", ICML 2025 (arXiv 2410.14556; no
official code). The paper's axioms, as paraphrased from its abstract and summary (the exact quantifiers of
its Section 3 could not be retrieved; the audit below is our design):

- **M, monotonicity**: if all pairwise distances weakly increase and at least one strictly, diversity
  strictly increases (``strict=False``: does not decrease).
- **U, uniqueness**: for ``|Y| = n - 1``, ``y in Y``, ``z not in Y``: ``Div(Y + {y}) < Div(Y + {z})``.
- **C, continuity**: ``Div`` is continuous in the points, also at coincident points.

:func:`audit` searches for violations: for M, three distance-increasing moves from random points in
``[0, 1]^dim`` (uniform scaling by ``c > 1``; :func:`metric_push`, adding ``delta`` to one row and column
of ``D``; a single-entry increase within the triangle-inequality slack); for U, a duplicate ``y`` against a
random ``z`` (a quarter of them within ``1e-3`` of ``y``); for C, configurations with a duplicate and, for
threshold measures (``measure.thresholds``), a pair at exactly the threshold, perturbed by
``eps in {1e-2, 1e-4, 1e-6}`` (both ways along the pair). A C violation is a change at ``eps = 1e-6`` above
``1e-3 * max(1, |Div|)`` that is not at most 0.1 times the change at ``eps = 1e-2``. The first violation is
kept as a counterexample and re-evaluated (:func:`verify_counterexample`) before it is reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from icml25.interpretability.diversity import DiversityMeasure
from icml25.kernels.checks import check_int

__all__ = ["AXIOMS", "AxiomResult", "audit", "audit_table", "metric_push", "verify_counterexample"]

AXIOMS = ("M", "U", "C")
EPSILONS = (1e-2, 1e-4, 1e-6)


@dataclass
class AxiomResult:
    """Outcome of one axiom's counterexample search.

    ``passed``: no violation in ``trials`` trials; ``violations``: how many trials violated it;
    ``counterexample``: the first violation (distance matrices ``D_before``/``D_after`` ``(n, n)`` for M
    and U, points ``X0`` ``(n, dim)`` and perturbation ``U`` for C, and the measure's values);
    ``verified``: re-evaluating the counterexample reproduces the violation (None when passed).
    """

    axiom: str
    passed: bool
    trials: int
    violations: int
    counterexample: dict[str, Any] | None = None
    verified: bool | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def metric_push(D: Any, i: int, delta: float) -> np.ndarray:
    """``D`` with ``delta >= 0`` added to row and column ``i`` (off the diagonal): point ``i`` moves away
    from all others, and the triangle inequality is kept."""
    D = np.array(D, dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"D must be a square (n, n) matrix, got shape {D.shape}")
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < D.shape[0]:
        raise ValueError(f"i must be a point index in [0, {D.shape[0]}), got {i!r}")
    if not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
        raise ValueError(f"delta must be a finite number >= 0, got {delta!r}")
    out = D.copy()
    out[i, :] += delta
    out[:, i] += delta
    out[i, i] = 0.0
    return out


def pairwise(X: np.ndarray) -> np.ndarray:
    """Exact Euclidean distance matrix ``(n, n)`` of points ``(n, dim)`` (no validation: internal)."""
    diff = X[:, None, :] - X[None, :, :]
    return np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))


def _m_violated(before: float, after: float, strict: bool, tol: float) -> bool:
    if strict:
        return not after > before + tol
    return after < before - tol


def _u_violated(dup: float, new: float, tol: float) -> bool:
    return not new > dup + tol


def _c_changes(measure: DiversityMeasure, X0: np.ndarray, U: np.ndarray) -> tuple[float, list[float]]:
    v0 = measure.from_distances(pairwise(X0))
    values = [measure.from_distances(pairwise(X0 + eps * U)) for eps in EPSILONS]
    return v0, [0.0 if v == v0 else abs(v - v0) for v in values]


def _c_violated(v0: float, changes: Sequence[float]) -> bool:
    scale = 1.0 if not math.isfinite(v0) else max(1.0, abs(v0))
    small, large = changes[-1], changes[0]
    if not math.isfinite(small):  # a jump from -inf (a duplicate) to a finite value
        return True
    return small > 1e-3 * scale and not small <= 0.1 * large


def verify_counterexample(measure: DiversityMeasure, result: AxiomResult, tol: float = 1e-9) -> bool:
    """Re-evaluate ``measure`` on ``result.counterexample`` and confirm that it violates the axiom."""
    ce = result.counterexample
    if ce is None:
        return False
    if result.axiom == "M":
        before = measure.from_distances(np.asarray(ce["D_before"]))
        after = measure.from_distances(np.asarray(ce["D_after"]))
        increased = np.all(ce["D_after"] >= ce["D_before"]) and np.any(ce["D_after"] > ce["D_before"])
        return bool(increased) and _m_violated(before, after, bool(ce["strict"]), tol)
    if result.axiom == "U":
        dup = measure.from_distances(np.asarray(ce["D_before"]))
        new = measure.from_distances(np.asarray(ce["D_after"]))
        return _u_violated(dup, new, tol)
    best = False
    for U in ce["perturbations"]:
        v0, changes = _c_changes(measure, np.asarray(ce["X0"]), np.asarray(U))
        best = best or _c_violated(v0, changes)
    return best


def _m_move(D: np.ndarray, rng: np.random.Generator, kind: int) -> np.ndarray:
    n = D.shape[0]
    if kind == 0:
        return D * rng.uniform(1.05, 2.0)
    if kind == 1:
        return metric_push(D, int(rng.integers(n)), float(rng.uniform(0.01, 0.5)))
    # single entry within the triangle slack: D_ij <= D_ik + D_kj for every k != i, j
    iu = np.triu_indices(n, k=1)
    slack = np.full(len(iu[0]), np.inf)
    for p, (i, j) in enumerate(zip(*iu)):
        others = [k for k in range(n) if k not in (i, j)]
        if others:
            slack[p] = min(D[i, k] + D[k, j] for k in others) - D[i, j]
    slack = np.where(np.isinf(slack), 1.0, slack)
    p = int(rng.integers(len(slack)))
    if slack[p] < 1e-3:
        p = int(np.argmax(slack))
    i, j = iu[0][p], iu[1][p]
    out = D.copy()
    out[i, j] = out[j, i] = D[i, j] + rng.uniform(0.2, 1.0) * slack[p]
    return out


def _search_m(measure, n, dim, trials, strict, rng, tol) -> AxiomResult:
    count, first = 0, None
    for t in range(trials):
        D = pairwise(rng.uniform(0, 1, size=(n, dim)))
        D2 = _m_move(D, rng, t % 3)
        before, after = measure.from_distances(D), measure.from_distances(D2)
        if _m_violated(before, after, strict, tol):
            count += 1
            if first is None:
                move = ("scale", "metric_push", "single_entry")[t % 3]
                first = {"D_before": D, "D_after": D2, "before": before, "after": after, "move": move}
                first["strict"] = strict
    return AxiomResult("M", count == 0, trials, count, first)


def _search_u(measure, n, dim, trials, rng, tol) -> AxiomResult:
    count, first = 0, None
    for t in range(trials):
        Y = rng.uniform(0, 1, size=(n - 1, dim))
        y = Y[int(rng.integers(n - 1))]
        z = y + rng.normal(0, 1e-3, size=dim) if t % 4 == 3 else rng.uniform(0, 1, size=dim)
        if np.any(np.all(Y == z, axis=1)):
            continue
        D_dup, D_new = pairwise(np.vstack([Y, y])), pairwise(np.vstack([Y, z]))
        dup, new = measure.from_distances(D_dup), measure.from_distances(D_new)
        if _u_violated(dup, new, tol):
            count += 1
            if first is None:
                first = {"D_before": D_dup, "D_after": D_new, "before": dup, "after": new}
                first["Y"], first["y"], first["z"] = Y, y, z
    return AxiomResult("U", count == 0, trials, count, first)


def _search_c(measure, n, dim, trials, rng) -> AxiomResult:
    count, first = 0, None
    thresholds = tuple(getattr(measure, "thresholds", ()))
    for t in range(trials):
        X0 = rng.uniform(0, 1, size=(n, dim))
        if thresholds and t % 2 == 1:
            # threshold-degenerate start: points 0 and 1 exactly t apart along the first axis
            thr = thresholds[int(rng.integers(len(thresholds)))]
            X0 = rng.uniform(0, 1, size=(n, dim)) * 2 * thr
            X0[1] = X0[0]
            X0[1, 0] = X0[0, 0] + thr
            axis = np.zeros((n, dim))
            axis[1, 0] = 1.0
            perturbations = [axis, -axis]
        else:
            X0[1] = X0[0]  # a duplicate
            U = rng.normal(size=(n, dim))
            perturbations = [U / np.abs(U).max()]
        flagged = False
        for U in perturbations:
            v0, changes = _c_changes(measure, X0, U)
            flagged = flagged or _c_violated(v0, changes)
        if flagged:
            count += 1
            if first is None:
                first = {"X0": X0, "perturbations": perturbations, "value": v0, "changes": changes}
                first["eps"] = EPSILONS
    return AxiomResult("C", count == 0, trials, count, first)


def audit(
    measure: DiversityMeasure,
    axioms: Sequence[str] = AXIOMS,
    n: int = 6,
    dim: int = 2,
    trials: int = 2000,
    strict: bool = True,
    seed: int = 0,
    tol: float = 1e-9,
) -> dict[str, AxiomResult]:
    """Search for violations of ``axioms`` (a subset of ``("M", "U", "C")``) by ``measure`` on ``n``
    points in ``[0, 1]^dim``, ``trials`` random trials each; ``{axiom: AxiomResult}``.

    Every counterexample found is re-verified (``AxiomResult.verified``). ``strict`` chooses strict or
    weak monotonicity. A pass means no counterexample was found, not a proof.
    """
    if not isinstance(measure, DiversityMeasure):
        raise TypeError(f"measure must be a DiversityMeasure, got {type(measure).__name__}")
    if isinstance(axioms, str) or not all(a in AXIOMS for a in axioms) or not axioms:
        raise ValueError(f"axioms must be a non-empty sequence drawn from {AXIOMS}, got {axioms!r}")
    n, dim, trials = (
        check_int(n, "n", low=3),
        check_int(dim, "dim", low=1),
        check_int(trials, "trials", low=1),
    )
    check_int(seed, "seed", low=0)
    if not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    out: dict[str, AxiomResult] = {}
    for k, axiom in enumerate(AXIOMS):
        if axiom not in axioms:
            continue
        rng = np.random.default_rng([seed, k])
        if axiom == "M":
            res = _search_m(measure, n, dim, trials, strict, rng, tol)
        elif axiom == "U":
            res = _search_u(measure, n, dim, trials, rng, tol)
        else:
            res = _search_c(measure, n, dim, trials, rng)
        if res.counterexample is not None:
            res.verified = verify_counterexample(measure, res, tol)
        out[axiom] = res
    return out


def audit_table(measures: Sequence[DiversityMeasure], **audit_kwargs: Any) -> list[dict[str, Any]]:
    """One row per measure: ``{"measure": name, "M": bool, "U": bool, "C": bool, "M_violations": int,
    ..., "verified": bool}`` (``verified``: every counterexample reproduced); ``audit_kwargs`` go to
    :func:`audit`."""
    if isinstance(measures, DiversityMeasure) or not measures:
        raise ValueError("measures must be a non-empty sequence of DiversityMeasure")
    rows = []
    for m in measures:
        res = audit(m, **audit_kwargs)
        row: dict[str, Any] = {"measure": m.name}
        for axiom, r in res.items():
            row[axiom] = r.passed
            row[f"{axiom}_violations"] = r.violations
        row["verified"] = all(r.verified for r in res.values() if not r.passed)
        rows.append(row)
    return rows
