"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: random QBF instances with PENCIL traces.

Yang et al., ICML 2025 (official code ``chr26195/PENCIL``, ``dataset_qbf.py``). A random ∃/∀ prefix
(probability 0.5 each, at least one of each); a *valid* formula makes every ∃ variable equivalent to the AND
or OR of signed earlier ∀ variables, padded with tautologies to ``2n`` clauses and kept when the naive
solver agrees; an *invalid* one perturbs a valid formula (flip / remove a literal, remove / add a clause)
until it becomes invalid; then 0–3 filler clauses (tautologies or random clauses) are added, variables
renamed and clauses shuffled. The trace recurses over the prefix (``Try v = False/True``, ∃/∀
short-circuit); leaves check the clauses in order (``Check #i ( clause ) True/False``, ``Formula = True``).
The label is the solver's verdict (a random filler clause can invalidate a valid formula; the official
label is the intended one).
"""

from __future__ import annotations

import random
from typing import Any

from icml25.llm_efficiency.pencil.generators._common import check_count, check_range, check_seed
from icml25.llm_efficiency.pencil.vocab import CALL, RETURN, SEP

__all__ = ["brute_force_qbf", "generate_qbf", "qbf_trace"]

Prefix = list[tuple[str, int]]
Clause = list[int]
EXISTS, FORALL = "∃", "∀"


def _lit(lit: int) -> list[str]:
    return ["¬", str(-lit)] if lit < 0 else [str(lit)]


def _clause_words(c: Clause) -> list[str]:
    out = ["("]
    for i, lit in enumerate(c):
        if i:
            out.append("∨")
        out += _lit(lit)
    return [*out, ")"]


def format_qbf(prefix: Prefix, clauses: list[Clause]) -> list[str]:
    """Words of ``∃ 1 ∀ 2 : #1 ( 1 ∨ ¬ 2 ) #2 ( ... )``."""
    out = [w for q, v in prefix for w in (q, str(v))] + [":"]
    for i, c in enumerate(clauses):
        out += [f"#{i + 1}", *_clause_words(c)]
    return out


def _satisfied(clauses: list[Clause], assignment: dict[int, bool]) -> bool:
    return all(any(assignment.get(abs(lit), False) == (lit > 0) for lit in c) for c in clauses)


def brute_force_qbf(prefix: Prefix, clauses: list[Clause]) -> bool:
    """Truth of the closed QBF by full expansion of the prefix (no short-circuit; exact)."""

    def value(i: int, a: dict[int, bool]) -> bool:
        if i == len(prefix):
            return _satisfied(clauses, a)
        q, v = prefix[i]
        branches = [value(i + 1, {**a, v: b}) for b in (False, True)]
        return any(branches) if q == EXISTS else all(branches)

    return value(0, {})


def qbf_trace(prefix: Prefix, clauses: list[Clause]) -> tuple[bool, list[str]]:
    """``(valid, trace words)`` of the official recursive QBF solver with PENCIL markers."""
    steps: list[str] = []

    def question(i: int, a: dict[int, bool]) -> list[str]:
        if i < len(prefix):
            return ["Question:", "prefix_from", prefix[i][0], str(prefix[i][1])]
        words = [w for v, b in sorted(a.items()) for w in (str(v), "=", str(b))]
        return ["Question:", "evaluate", *(words or ["{", "}"])]

    def call(i: int, a: dict[int, bool]) -> bool:
        steps.extend([CALL, *question(i, a)])
        res = solve(i, a)
        steps.extend([SEP, "Answer:", str(res), RETURN])
        return res

    def evaluate(a: dict[int, bool]) -> bool:
        for j, c in enumerate(clauses):
            steps.extend(["Check", f"#{j + 1}", *_clause_words(c)])
            ok = any(a.get(abs(lit), False) == (lit > 0) for lit in c)
            steps.append(str(ok))
            if not ok:
                return False
        steps.extend(["Formula", "=", "True"])
        return True

    def solve(i: int, a: dict[int, bool]) -> bool:
        if i == len(prefix):
            return evaluate(a)
        q, v = prefix[i]
        for b in (False, True):
            steps.extend(["Try", str(v), "=", str(b)])
            r = call(i + 1, {**a, v: b})
            if q == EXISTS and r:
                return True
            if q == FORALL and not r:
                return False
        return q == FORALL

    return call(0, {}), steps


def _aggregator(rng: random.Random, e: int, univs: list[int]) -> list[Clause]:
    if not univs:
        return [[e]]
    lits = [u if rng.random() < 0.5 else -u for u in univs]
    if rng.random() < 0.5:  # e <-> AND(lits)
        return [[-e, lit] for lit in lits] + [[-lit for lit in lits] + [e]]
    return [[-e, *lits]] + [[-lit, e] for lit in lits]  # e <-> OR(lits)


def _tautology(rng: random.Random, n: int) -> Clause:
    x = rng.randint(1, n) * rng.choice((-1, 1))
    c, length = [x, -x], rng.randint(2, 3)
    while len(c) < length:
        c.append(rng.randint(1, n) * rng.choice((-1, 1)))
    return c


def _valid(rng: random.Random, n: int, m: int, attempts: int) -> tuple[Prefix, list[Clause]]:
    for _ in range(attempts):
        ids = list(range(1, n + 1))
        rng.shuffle(ids)
        prefix = [(EXISTS if rng.random() < 0.5 else FORALL, v) for v in ids]
        if not any(q == EXISTS for q, _ in prefix):
            prefix[0] = (EXISTS, prefix[0][1])
        if not any(q == FORALL for q, _ in prefix):
            prefix[-1] = (FORALL, prefix[-1][1])
        clauses: list[Clause] = []
        univs: list[int] = []
        for q, v in prefix:
            if q == FORALL:
                univs.append(v)
            else:
                clauses += _aggregator(rng, v, list(univs))
        while len(clauses) < m:
            clauses.append(_tautology(rng, n))
        clauses = clauses[:m]
        if brute_force_qbf(prefix, clauses):
            return prefix, clauses
    raise RuntimeError(f"no valid QBF with n={n} found in {attempts} attempts")


def _perturb(rng: random.Random, clauses: list[Clause]) -> list[Clause]:
    new = [list(c) for c in clauses]
    how = rng.choice(("flip", "remove_lit", "remove_clause", "add_clause"))
    if how in ("flip", "remove_lit") and new:
        c = new[rng.randrange(len(new))]
        if how == "remove_lit" and len(c) > 1:
            del c[rng.randrange(len(c))]
        elif c:
            i = rng.randrange(len(c))
            c[i] = -c[i]
    elif how == "remove_clause" and new:
        del new[rng.randrange(len(new))]
    else:
        present = sorted({abs(lit) for c in new for lit in c}) or [1]
        chosen = rng.sample(present, min(len(present), rng.randint(1, 3)))
        new.append([v * rng.choice((-1, 1)) for v in chosen])
    return new


def _filler(rng: random.Random, n: int) -> Clause:
    if rng.random() < 0.5:  # a tautology over 2-4 variables
        length = rng.randint(2, 4)
        chosen = rng.sample(range(1, n + 1), min(n, length))
        x = rng.choice(chosen) * rng.choice((-1, 1))
        c = [x, -x]
        while len(c) < length:
            c.append(rng.randint(1, n) * rng.choice((-1, 1)))
        rng.shuffle(c)
        return c
    avail = list(range(1, n + 1))
    rng.shuffle(avail)
    return [v * rng.choice((-1, 1)) for v in avail[: rng.randint(2, 4)]]


def generate_qbf(
    n_instances: int,
    min_vars: int = 3,
    max_vars: int = 5,
    clause_ratio: float = 2.0,
    valid_ratio: float = 0.5,
    seed: int = 0,
    max_attempts: int = 5000,
) -> list[dict[str, Any]]:
    """``n_instances`` random QBF examples ``{"prompt", "trace", "label", "n", "prefix", "clauses"}``.

    ``n`` in ``[min_vars, max_vars]`` (``min_vars >= 2``: a prefix with both quantifiers); ``label`` is the
    solver's truth value (equal to :func:`brute_force_qbf`). Seeded and pure Python.
    """
    check_count(n_instances, "n_instances")
    check_range(min_vars, max_vars, "min_vars", "max_vars", lowest=2, what="a prefix needs one ∃ and one ∀")
    if max_vars > 12:
        raise ValueError(f"max_vars must be <= 12 (labels are verified by full expansion), got {max_vars}")
    if not isinstance(clause_ratio, (int, float)) or not 0 < clause_ratio <= 10:
        raise ValueError(f"clause_ratio must be a float in (0, 10], got {clause_ratio!r}")
    if not isinstance(valid_ratio, (int, float)) or not 0 <= valid_ratio <= 1:
        raise ValueError(f"valid_ratio must be a float in [0, 1], got {valid_ratio!r}")
    check_count(max_attempts, "max_attempts")
    rng = random.Random(check_seed(seed))
    out = []
    for _ in range(n_instances):
        n = rng.randint(min_vars, max_vars)
        m = int(n * clause_ratio)
        make_valid = rng.random() < valid_ratio
        n_fill = rng.randint(0, 3)
        prefix, clauses = _valid(rng, n, m, max_attempts)
        if not make_valid:
            for _ in range(max_attempts):
                clauses = _perturb(rng, clauses)
                if not brute_force_qbf(prefix, clauses):
                    break
            else:
                raise RuntimeError(f"could not make a QBF with n={n} invalid in {max_attempts} perturbations")
        clauses = clauses + [_filler(rng, n) for _ in range(n_fill)]
        order = [v for _, v in prefix]
        rng.shuffle(order)
        rename = {old: new for new, old in enumerate(order, start=1)}
        prefix = [(q, rename[v]) for q, v in prefix]
        clauses = [[rename[abs(lit)] * (1 if lit > 0 else -1) for lit in c] for c in clauses]
        rng.shuffle(clauses)
        label, trace = qbf_trace(prefix, clauses)
        out.append(
            {
                "prompt": format_qbf(prefix, clauses),
                "trace": trace,
                "label": label,
                "n": n,
                "prefix": prefix,
                "clauses": clauses,
            }
        )
    return out
