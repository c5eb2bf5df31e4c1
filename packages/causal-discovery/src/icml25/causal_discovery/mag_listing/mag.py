"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025 — P07: mAG predicates and the MAG -> PAG map for the MAG-listing subpackage (P07, ICML 2025).

``is_mag`` (ancestral + maximal), ``markov_equivalent`` (Spirtes-Richardson / Zhang 2008 criterion),
``pag_from_mag`` (oracle FCI: unshielded colliders, then R1-R4 and R8-R10 with R4 decided by the MAG)
and ``reference_mag`` (Zhang's construction of one MAG of a PAG). Internals work on ``list[list[int]]``.
"""

from __future__ import annotations

from collections.abc import Callable

from icml25.causal_discovery.mag_listing.graphs import MAG, PAG, as_marks
from icml25.causal_discovery.mag_listing.marks import ARROW, CIRCLE, TAIL, Conflict
from icml25.causal_discovery.mag_listing.rules import (
    MixedGraph,
    apply_rules,
    descendants,
    discriminating_w,
    rule_r1,
    rule_r2,
    rule_r3,
    rule_r8,
    rule_r9,
    rule_r10,
)


def _ancestral(m: list[list[int]], n: int) -> bool:
    desc = descendants(m, n)
    for a in range(n):
        if desc[a] >> a & 1:
            return False
        for b in range(a + 1, n):
            if m[a][b] == ARROW and m[b][a] == ARROW and (desc[a] >> b & 1 or desc[b] >> a & 1):
                return False
    return True


def _maximal(m: list[list[int]], n: int) -> bool:
    """No inducing path between non-adjacent a, b: no collider path a *-> v1 <-> ... <-> vk <-* b inside An({a, b})."""
    desc = descendants(m, n)
    anc = [0] * n  # anc[v]: strict ancestors of v
    for a in range(n):
        d = desc[a]
        while d:
            low = d & -d
            anc[low.bit_length() - 1] |= 1 << a
            d ^= low
    for a in range(n):
        for b in range(a + 1, n):
            if m[a][b]:
                continue
            allowed = (anc[a] | anc[b]) & ~(1 << a | 1 << b)
            start = [v for v in range(n) if m[a][v] == ARROW and allowed >> v & 1]
            seen, stack = set(start), list(start)
            while stack:
                v = stack.pop()
                if m[b][v] == ARROW:
                    return False
                for u in range(n):
                    if u not in seen and allowed >> u & 1 and m[v][u] == ARROW and m[u][v] == ARROW:
                        seen.add(u)
                        stack.append(u)
    return True


def is_mag_marks(m: list[list[int]]) -> bool:
    """``is_mag`` on a symmetric-adjacency mark list without selection-bias edges."""
    n = len(m)
    for a in range(n):
        for b in range(n):
            if m[a][b] and (m[a][b] == CIRCLE or (m[a][b] == TAIL and m[b][a] == TAIL)):
                return False
    return _ancestral(m, n) and _maximal(m, n)


def is_mag(graph: object) -> bool:
    """Whether ``graph`` (a :class:`MAG`, :class:`PAG` or ``[n, n]`` mark matrix) is a maximal ancestral graph.

    Only ``->`` and ``<->`` edges are allowed (no selection bias); a circle mark makes it not a MAG.
    Ancestral: no directed cycle and no ``a <-> b`` with ``a`` an ancestor of ``b``. Maximal: no inducing
    path between non-adjacent vertices.
    """
    return is_mag_marks(as_marks(graph, "graph", allow_circles=True))


def _collider(m: list[list[int]], a: int, b: int, c: int) -> bool:
    return m[a][b] == ARROW and m[c][b] == ARROW


def equivalent_marks(m1: list[list[int]], m2: list[list[int]]) -> bool:
    """Markov equivalence of two MAG mark lists (same skeleton, unshielded colliders, and colliders on
    paths that are discriminating in both)."""
    n = len(m1)
    if len(m2) != n:
        return False
    for a in range(n):
        for b in range(n):
            if (m1[a][b] == 0) != (m2[a][b] == 0):
                return False
    adj = [[b for b in range(n) if m1[a][b]] for a in range(n)]
    adjset = [frozenset(x) for x in adj]
    # A mark matrix that is ARROW/TAIL in both exactly where both agree: a path is discriminating in both
    # graphs iff it is discriminating (on definite marks) in the graph of their common marks.
    common = [[m1[a][b] if m1[a][b] == m2[a][b] else CIRCLE for b in range(n)] for a in range(n)]
    for v in range(n):
        nb = adj[v]
        for i, w in enumerate(nb):
            for y in nb[i + 1 :]:
                c1, c2 = _collider(m1, w, v, y), _collider(m2, w, v, y)
                if c1 == c2:
                    continue
                if y not in adjset[w]:
                    return False  # unshielded collider in one graph only
                if discriminating_w(common, adj, adjset, w, v, y) or discriminating_w(
                    common, adj, adjset, y, v, w
                ):
                    return False
    return True


def markov_equivalent(g1: object, g2: object) -> bool:
    """Whether two MAGs (``MAG`` or ``[n, n]`` mark matrices) are Markov equivalent.

    Criterion (Spirtes & Richardson 1996; Zhang 2008, Prop. 2): same skeleton, same unshielded colliders,
    and a vertex that is a collider on a path discriminating in both graphs in one is a collider in the other.
    Raises ``ValueError`` if either argument is not a MAG.
    """
    m1, m2 = as_marks(g1, "g1"), as_marks(g2, "g2")
    for name, m in (("g1", m1), ("g2", m2)):
        if not is_mag_marks(m):
            raise ValueError(
                f"{name} must be a MAG (ancestral, maximal, edges -> or <->), got a graph that is not"
            )
    return equivalent_marks(m1, m2)


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
                if c not in g.adjset[a] and _collider(mag, a, b, c):
                    g.m[a][b] = g.m[c][b] = ARROW
    g.sync()  # the rules read the bitsets that mirror g.m
    rules = (rule_r1, rule_r2, rule_r3, _rule_r4_from_mag(mag), rule_r8, rule_r9, rule_r10)
    try:
        apply_rules(g, rules)
    except Conflict as exc:  # impossible for a MAG; kept loud in case of a bug
        raise RuntimeError(f"FCI rules conflicted on a MAG: {exc}") from exc
    return g.m


def pag_from_mag(mag: object) -> PAG:
    """The PAG (Markov equivalence class) of a MAG: oracle FCI (unshielded colliders, R1-R4, R8-R10).

    ``mag``: a :class:`MAG` or an ``[n, n]`` mark matrix of a MAG (``ValueError`` otherwise).
    """
    m = as_marks(mag, "mag")
    if not is_mag_marks(m):
        raise ValueError("mag must be a MAG (ancestral, maximal, edges -> or <->), got a graph that is not")
    names = mag.names if isinstance(mag, (MAG, PAG)) else None
    return PAG._trusted(pag_marks_from_mag(m), names)


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


def reference_mag(pag: PAG) -> MAG:
    """One MAG of a valid PAG (Zhang's construction); ``ValueError("not a valid PAG")`` if it fails."""
    if not isinstance(pag, PAG):
        raise TypeError(f"pag must be a PAG, got {type(pag).__name__}")
    m = reference_marks(pag.to_list())
    if not is_mag_marks(m) or pag_marks_from_mag(m) != pag.to_list():
        raise ValueError("not a valid PAG: Zhang's construction does not give a MAG whose PAG is the input")
    return MAG._trusted(m, pag.names)
