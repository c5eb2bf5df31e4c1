"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: random 3-SAT instances with DPLL PENCIL traces.

Yang et al., ICML 2025 (official code ``chr26195/PENCIL``, ``dataset_sat.py``). ``n`` variables drawn from
``1..max_vars``, ``floor(ratio·n)`` clauses of 3 distinct variables with random signs (ratio 4.3, the official
command line's value); satisfiable and unsatisfiable 50/50. A satisfiable instance plants an assignment and
flips one literal of each clause it falsifies; an unsatisfiable one is a random formula kept when brute force
(here; ``pysat`` officially) says UNSAT. The trace is the official DPLL: each call writes
``[CALL] Question: <cnf>``, then a unit clause (``Found ¬ v Let v = False``) or a branch on the smallest
variable (``Try v = True`` then ``False``), and closes with ``[SEP] Answer: <bool> [RETURN]``.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np

from icml25.llm_efficiency.pencil.generators._common import check_count, check_range, check_seed
from icml25.llm_efficiency.pencil.vocab import CALL, RETURN, SEP

__all__ = ["brute_force_sat", "dpll_trace", "format_cnf", "generate_sat"]

Clause = list[int]


def format_cnf(clauses: list[Clause]) -> list[str]:
    """Words of a CNF: ``( 1 ∨ ¬ 2 ∨ 3 ) ∧ ( ... )``."""
    out: list[str] = []
    for j, c in enumerate(clauses):
        if j:
            out.append("∧")
        out.append("(")
        for i, lit in enumerate(c):
            if i:
                out.append("∨")
            out += ["¬", str(-lit)] if lit < 0 else [str(lit)]
        out.append(")")
    return out


def brute_force_sat(clauses: list[Clause]) -> bool:
    """Satisfiability by enumerating every assignment of the variables present (exact; ``2^n`` rows)."""
    variables = sorted({abs(lit) for c in clauses for lit in c})
    if not clauses:
        return True
    if any(len(c) == 0 for c in clauses):
        return False
    col = {v: i for i, v in enumerate(variables)}
    table = np.array(list(itertools.product((False, True), repeat=len(variables))), dtype=bool)
    ok = np.ones(len(table), dtype=bool)
    for c in clauses:
        sat = np.zeros(len(table), dtype=bool)
        for lit in c:
            x = table[:, col[abs(lit)]]
            sat |= x if lit > 0 else ~x
        ok &= sat
    return bool(ok.any())


def _simplify(clauses: list[Clause], var: int, value: bool) -> list[Clause]:
    out = []
    for c in clauses:
        if (var in c and value) or (-var in c and not value):
            continue
        out.append([lit for lit in c if abs(lit) != var])
    return out


def _base(clauses: list[Clause]) -> bool | None:
    if not clauses:
        return True
    if any(not c for c in clauses):
        return False
    return None


def dpll_trace(clauses: list[Clause]) -> tuple[bool, list[str]]:
    """``(satisfiable, trace words)`` of the official DPLL with PENCIL markers."""
    steps: list[str] = []

    def call(cls: list[Clause]) -> bool:
        steps.extend([CALL, "Question:", *format_cnf(cls)])
        res = dpll(cls)
        steps.extend([SEP, "Answer:", str(res), RETURN])
        return res

    def dpll(cls: list[Clause]) -> bool:
        unit = next((c[0] for c in cls if len(c) == 1), None)
        if unit is not None:
            v, val = abs(unit), unit > 0
            steps.extend(["Found", *(["¬"] if not val else []), str(v), "Let", str(v), "=", str(val)])
            new = _simplify(cls, v, val)
            res = _base(new)
            return call(new) if res is None else res
        v = min(abs(lit) for c in cls for lit in c)
        for val in (True, False):
            steps.extend(["Try", str(v), "=", str(val)])
            new = _simplify(cls, v, val)
            res = _base(new)
            if res is None:
                res = call(new)
            if res:
                return True
        return False

    res = call([list(c) for c in clauses])
    return res, steps


def _random_clause(rng: random.Random, var_ids: list[int]) -> Clause:
    return [v * rng.choice((-1, 1)) for v in rng.sample(var_ids, 3)]


def _instance(
    rng: random.Random, n: int, max_vars: int, ratio: float, sat: bool, attempts: int
) -> list[Clause]:
    var_ids = rng.sample(range(1, max_vars + 1), n)
    m = int(n * ratio)
    if sat:
        assignment = {v: rng.random() < 0.5 for v in var_ids}
        clauses = []
        for _ in range(m):
            c = _random_clause(rng, var_ids)
            if not any((lit > 0) == assignment[abs(lit)] for lit in c):
                i = rng.randrange(3)
                c[i] = -c[i]
            clauses.append(c)
        return clauses
    for _ in range(attempts):
        clauses = [_random_clause(rng, var_ids) for _ in range(m)]
        bound = (2 * (7 / 8) ** (m / n)) ** n
        if bound < 1e-3 or not brute_force_sat(clauses):
            return clauses
    raise RuntimeError(f"no unsatisfiable 3-SAT instance with n={n}, m={m} found in {attempts} attempts")


def generate_sat(
    n_instances: int,
    min_vars: int = 4,
    max_vars: int = 6,
    clause_ratio: float = 4.3,
    sat_ratio: float = 0.5,
    seed: int = 0,
    max_attempts: int = 5000,
) -> list[dict[str, Any]]:
    """``n_instances`` random 3-SAT examples ``{"prompt", "trace", "label", "n", "clauses"}``.

    ``prompt``/``trace``: word lists (``prompt`` the CNF, ``trace`` the DPLL trace; join them with
    :meth:`~icml25.llm_efficiency.pencil.PencilVocab.encode`); ``label``: satisfiability (the trace's answer,
    equal to the intended one by construction); ``n`` in ``[min_vars, max_vars]`` uniformly, ``n >= 3``.
    Seeded and pure Python (``random.Random(seed)``).
    """
    check_count(n_instances, "n_instances")
    check_range(min_vars, max_vars, "min_vars", "max_vars", lowest=3, what="3-SAT needs 3 distinct variables")
    if max_vars > 20:
        raise ValueError(f"max_vars must be <= 20 (labels are verified by brute force), got {max_vars}")
    if not isinstance(clause_ratio, (int, float)) or not 0 < clause_ratio <= 20:
        raise ValueError(f"clause_ratio must be a float in (0, 20], got {clause_ratio!r}")
    if not isinstance(sat_ratio, (int, float)) or not 0 <= sat_ratio <= 1:
        raise ValueError(f"sat_ratio must be a float in [0, 1], got {sat_ratio!r}")
    check_count(max_attempts, "max_attempts")
    rng = random.Random(check_seed(seed))
    out = []
    for _ in range(n_instances):
        n = rng.randint(min_vars, max_vars)
        sat = rng.random() < sat_ratio
        clauses = _instance(rng, n, max_vars, float(clause_ratio), sat, max_attempts)
        label, trace = dpll_trace(clauses)
        if label != sat:  # pragma: no cover - the constructions guarantee it
            raise AssertionError(f"DPLL says {label} for an instance built to be {sat}")
        out.append(
            {"prompt": format_cnf(clauses), "trace": trace, "label": label, "n": n, "clauses": clauses}
        )
    return out
