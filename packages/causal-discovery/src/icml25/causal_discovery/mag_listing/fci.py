"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: oracle FCI (the PAG
of a MAG), Zhang's MAG of a PAG, and the valid-PAG check, on plain mark lists.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
Oracle FCI: unshielded colliders, then R1-R4 and R8-R10 with R4 decided by the MAG (Zhang 2008). Zhang's
construction (2008, Thm 2): ``o->`` becomes ``->`` and the ``o-o`` part is oriented without unshielded
colliders. A PAG is valid iff Zhang's construction gives a MAG whose PAG is the input.
"""

from __future__ import annotations

from collections.abc import Callable

from icml25.causal_discovery.mag_listing.marks import ARROW, CIRCLE, TAIL, Conflict
from icml25.causal_discovery.mag_listing.mixed_graph import MixedGraph
from icml25.causal_discovery.mag_listing.predicates import discriminating_w, is_mag_marks
from icml25.causal_discovery.mag_listing.rules import rule_r1, rule_r2, rule_r3, rule_r8, rule_r9, rule_r10
from icml25.causal_discovery.mag_listing.scheduler import apply_rules


def _rule_r4_from_mag(mag: list[list[int]]) -> Callable[[MixedGraph], bool]:
    """FCI's full R4 with the MAG as the oracle: on a discriminating path for z with ``z o-* y``, orient
    ``w <-> z <-> y`` if z is a collider in the MAG, else ``z -> y``."""

    def rule_r4(g: MixedGraph) -> bool:
        m, adj, adjset, changed = g.m, g.adj, g.adjset, False
        for z in range(g.n):
            for y in adj[z]:
                if m[y][z] != CIRCLE:
                    continue
                for w in adj[z]:
                    if w == y or w not in adjset[y] or not discriminating_w(m, adj, adjset, w, z, y):
                        continue
                    if mag[w][z] == ARROW and mag[y][z] == ARROW:
                        g.set(w, z, ARROW)
                        g.set(y, z, ARROW)
                        g.set(z, y, ARROW)
                    else:
                        g.set(y, z, TAIL)
                        g.set(z, y, ARROW)
                    changed = True
                    break
        return changed

    return rule_r4


def pag_marks_from_mag(mag: list[list[int]]) -> list[list[int]]:
    """Oracle FCI on a MAG's mark list; returns the PAG's mark list."""
    n = len(mag)
    m = [[CIRCLE if mag[a][b] else 0 for b in range(n)] for a in range(n)]
    g = MixedGraph(m)
    for b in range(n):
        nb = g.adj[b]
        for i, a in enumerate(nb):
            for c in nb[i + 1 :]:
                if c not in g.adjset[a] and mag[a][b] == ARROW and mag[c][b] == ARROW:
                    g.m[a][b] = g.m[c][b] = ARROW
    g.sync()  # the rules read the bitsets that mirror g.m
    rules = (rule_r1, rule_r2, rule_r3, _rule_r4_from_mag(mag), rule_r8, rule_r9, rule_r10)
    try:
        apply_rules(g, rules)
    except Conflict as exc:  # impossible for a MAG; kept loud in case of a bug
        raise RuntimeError(f"FCI rules conflicted on a MAG: {exc}") from exc
    return g.m


def reference_marks(pag: list[list[int]]) -> list[list[int]]:
    """Zhang's (2008, Thm 2) MAG of a PAG: ``o->`` becomes ``->`` and the ``o-o`` part is oriented by a
    maximum cardinality search order (a DAG without unshielded colliders when that part is chordal)."""
    n = len(pag)
    m = [row[:] for row in pag]
    for a in range(n):
        for b in range(n):
            if m[a][b] == ARROW and m[b][a] == CIRCLE:
                m[b][a] = TAIL
    circ = [[b for b in range(n) if m[a][b] == CIRCLE and m[b][a] == CIRCLE] for a in range(n)]
    weight, pos, order = [0] * n, [-1] * n, 0
    for _ in range(n):
        v = max((u for u in range(n) if pos[u] < 0), key=lambda u: (weight[u], -u))
        pos[v] = order
        order += 1
        for u in circ[v]:
            weight[u] += 1
    for a in range(n):
        for b in circ[a]:
            if pos[a] < pos[b]:
                m[b][a], m[a][b] = TAIL, ARROW
    return m


def valid_pag_reference(pag: list[list[int]]) -> list[list[int]]:
    """Zhang's MAG of ``pag`` if ``pag`` is a valid PAG, else ``ValueError("not a valid PAG ...")``."""
    m = reference_marks(pag)
    if not is_mag_marks(m) or pag_marks_from_mag(m) != pag:
        raise ValueError("not a valid PAG: Zhang's construction does not give a MAG whose PAG is the input")
    return m


__all__ = ["pag_marks_from_mag", "reference_marks", "valid_pag_reference"]
