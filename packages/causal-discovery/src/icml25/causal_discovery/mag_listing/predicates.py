"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: graph predicates
(descendants, discriminating paths, uncovered potentially directed paths, forced walks) and the MAG
validation built on them (ancestral, maximal, Markov equivalent).

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
Each path predicate has two forms:

- a **spec** form on the plain mark list (``m[i][j]``: mark at j on ``i - j``), written to read like the
  definition (Zhang 2008 for discriminating and uncovered p.d. paths), used by the MAG validation;
- a **bitset** form on :class:`~icml25.causal_discovery.mag_listing.mixed_graph.MixedGraph`, used by the
  rules and conflict detectors in the listing's inner loop.

The tests check that both forms agree on random partial mixed graphs. Every predicate reads definite marks
only (a circle is neither an arrowhead nor a tail).
"""

from __future__ import annotations

from icml25.causal_discovery.mag_listing.marks import ARROW, CIRCLE, TAIL
from icml25.causal_discovery.mag_listing.mixed_graph import MixedGraph, bits


def directed(m: list[list[int]], a: int, b: int) -> bool:
    """``a -> b`` (tail at a, arrowhead at b)."""
    return m[a][b] == ARROW and m[b][a] == TAIL


# --------------------------------------------------------------------------------------- descendants
def descendants_spec(m: list[list[int]]) -> list[set[int]]:
    """Spec: strict descendants of every vertex along definite ``->`` edges (depth-first search)."""
    n = len(m)
    out = []
    for a in range(n):
        seen: set[int] = set()
        stack = [a]
        while stack:
            u = stack.pop()
            for v in range(n):
                if directed(m, u, v) and v not in seen:
                    seen.add(v)
                    stack.append(v)
        out.append(seen)
    return out


def _transitive_closure(children: list[int]) -> list[int]:
    """Warshall on bitsets: ``reach[a]`` = every vertex reachable from a by one or more ``children`` steps."""
    reach = list(children)
    for k, rk in enumerate(reach):
        if not rk:
            continue
        bit = 1 << k
        for a in range(len(reach)):
            if reach[a] & bit:
                reach[a] |= reach[k]
    return reach


def descendants(m: list[list[int]], n: int | None = None) -> list[int]:
    """Bitset form on a mark list: ``descendants(m)[a]`` has bit v iff v is a strict descendant of a."""
    n = len(m) if n is None else n
    children = [0] * n
    for a in range(n):
        for b in range(n):
            if m[b][a] == TAIL and m[a][b] == ARROW:
                children[a] |= 1 << b
    return _transitive_closure(children)


def descendants_bits(g: MixedGraph) -> list[int]:
    """Bitset form on a :class:`MixedGraph` (children of u: ``rA[u] & T[u]``)."""
    return _transitive_closure([ra & t for ra, t in zip(g.rA, g.T, strict=True)])


# ------------------------------------------------------------------------------ discriminating paths
def discriminating_w(
    m: list[list[int]], adj: list[list[int]], adjset: list[frozenset[int]], w: int, z: int, y: int
) -> bool:
    """Spec: is there a discriminating path ``<x, ..., w, z, y>`` for ``z`` (definite marks only)?

    ``w -> y``, ``z *-> w``, x and y non-adjacent, and every vertex between x and z a collider on the path
    and a parent of y. Those in-between vertices form a ``<->`` chain of parents of y ending at w, so a
    search over vertices (not paths) suffices: a repeated vertex can be cut out without breaking the
    collider pattern.
    """
    if not (directed(m, w, y) and m[z][w] == ARROW):
        return False
    seen, stack = {w}, [w]
    while stack:
        q = stack.pop()
        for x in adj[q]:
            if x == z or x == y or m[x][q] != ARROW:
                continue
            if x not in adjset[y]:
                return True
            if x not in seen and m[q][x] == ARROW and directed(m, x, y):
                seen.add(x)
                stack.append(x)
    return False


def discriminating_bits(g: MixedGraph, w: int, z: int, y: int) -> bool:
    """Bitset form of :func:`discriminating_w` for one ``(w, z, y)``."""
    A, rA, rT, adjm = g.A, g.rA, g.rT, g.adjm
    parents_y = A[y] & rT[y]
    if not (parents_y >> w & 1 and rA[z] >> w & 1):
        return False
    skip = ~(1 << z | 1 << y)
    seen, stack = 1 << w, [w]
    while stack:
        q = stack.pop()
        into = A[q] & skip  # x *-> q
        if into & ~adjm[y]:
            return True
        nxt = into & rA[q] & parents_y & ~seen  # x <-> q and x -> y: the path goes on
        seen |= nxt
        stack.extend(bits(nxt))
    return False


def discriminating_ends(g: MixedGraph, y: int) -> int:
    """Bitset of the parents w of y that end a discriminating path ``<x, ..., w, z, y>`` for any z that is
    adjacent to y and not a parent of y (the rules and detectors only ask for such z: they need a circle or
    an arrowhead at z on ``z - y``); the path for a given z still needs ``z *-> w``.

    Why one set per y: the ``<->`` chain of parents of y does not depend on z, so one search per y replaces
    one search per ``(w, z, y)``. ``discriminating_bits(g, w, z, y) == (w in ends and z *-> w)`` for such z.
    """
    A, rA, rT, adjm = g.A, g.rA, g.rT, g.adjm
    parents = A[y] & rT[y]
    far = ~adjm[y] & ~(1 << y)  # candidates for x: non-adjacent to y
    ends = 0
    for q in bits(parents):
        if A[q] & far:
            ends |= 1 << q
    stack = list(bits(ends))
    while stack:
        q = stack.pop()
        nxt = A[q] & rA[q] & parents & ~ends  # q <-> x with x -> y: x reaches the endpoint through q
        if nxt:
            ends |= nxt
            stack.extend(bits(nxt))
    return ends


# --------------------------------------------------------------- uncovered potentially directed paths
def pd_step(m: list[list[int]], u: int, v: int) -> bool:
    """Spec: ``u - v`` is potentially directed from u: an edge with no arrowhead at u and no tail at v."""
    return bool(m[u][v]) and m[v][u] != ARROW and m[u][v] != TAIL


def pd_next(g: MixedGraph, u: int) -> int:
    """Bitset form of :func:`pd_step`: every v with ``u - v`` potentially directed from u."""
    return g.adjm[u] & ~g.A[u] & ~g.rT[u]


def uncovered_pd_path_spec(m: list[list[int]], prev: int, cur: int, target: int, visited: set[int]) -> bool:
    """Spec: does the uncovered potentially directed path ``..., prev, cur`` extend to ``target``?

    Simple paths only (``visited`` holds the path's vertices); uncovered: consecutive triples unshielded.
    """
    if cur == target:
        return True
    for nxt in range(len(m)):
        if nxt in visited or not pd_step(m, cur, nxt) or m[prev][nxt] or nxt == prev:
            continue
        if uncovered_pd_path_spec(m, cur, nxt, target, visited | {nxt}):
            return True
    return False


def uncovered_pd_path(g: MixedGraph, prev: int, cur: int, target: int, visited: int) -> bool:
    """Bitset form of :func:`uncovered_pd_path_spec` (``visited`` is a bitset)."""
    if cur == target:
        return True
    for nxt in bits(pd_next(g, cur) & ~visited & ~g.adjm[prev]):
        if uncovered_pd_path(g, cur, nxt, target, visited | 1 << nxt):
            return True
    return False


# ----------------------------------------------------------------------- forced walks (rule R_A)
def forced_walk_spec(m: list[list[int]], x: int, v: int, targets: set[int]) -> bool:
    """Spec: a walk ``x, v = v1, ..., vk`` (k >= 2, vk in ``targets``), potentially directed forward, whose
    every step ``vi -> vi+1`` (i >= 1) is already directed or has ``vi-1``, ``vi+1`` non-adjacent.

    Searched over (previous, current) vertex pairs, so walks may repeat vertices.
    """
    seen = {(x, v)}
    stack = [(x, v)]
    while stack:
        p, c = stack.pop()
        for nxt in range(len(m)):
            if not pd_step(m, c, nxt):
                continue
            if not (directed(m, c, nxt) or (nxt != p and not m[p][nxt])):
                continue
            if nxt in targets:
                return True
            if (c, nxt) not in seen:
                seen.add((c, nxt))
                stack.append((c, nxt))
    return False


def forced_walk(g: MixedGraph, x: int, v: int, targets: int) -> bool:
    """Bitset form of :func:`forced_walk_spec` (``targets`` is a bitset)."""
    rA, T, adjm = g.rA, g.T, g.adjm
    seen = [0] * g.n  # seen[c] = bitset of p with (p, c) visited
    seen[v] = 1 << x
    stack = [(x, v)]
    while stack:
        p, c = stack.pop()
        step = pd_next(g, c) & ((rA[c] & T[c]) | (~adjm[p] & ~(1 << p)))
        if step & targets:
            return True
        for nxt in bits(step):
            if not seen[nxt] >> c & 1:
                seen[nxt] |= 1 << c
                stack.append((c, nxt))
    return False


# ------------------------------------------------------------------------------------ MAG validation
def ancestral(m: list[list[int]]) -> bool:
    """No directed cycle and no ``a <-> b`` with a an ancestor of b (definite marks)."""
    n = len(m)
    desc = descendants(m, n)
    for a in range(n):
        if desc[a] >> a & 1:
            return False
        for b in range(a + 1, n):
            if m[a][b] == ARROW and m[b][a] == ARROW and (desc[a] >> b & 1 or desc[b] >> a & 1):
                return False
    return True


def maximal(m: list[list[int]]) -> bool:
    """No inducing path between non-adjacent a, b: no collider path a *-> v1 <-> ... <-> vk <-* b inside An({a, b})."""
    n = len(m)
    desc = descendants(m, n)
    anc = [0] * n  # anc[v]: strict ancestors of v
    for a in range(n):
        for v in bits(desc[a]):
            anc[v] |= 1 << a
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
    """Is a symmetric-adjacency mark list a MAG without selection bias (``->``/``<->`` only, ancestral, maximal)?"""
    n = len(m)
    for a in range(n):
        for b in range(n):
            if m[a][b] and (m[a][b] == CIRCLE or (m[a][b] == TAIL and m[b][a] == TAIL)):
                return False
    return ancestral(m) and maximal(m)


def _collider(m: list[list[int]], a: int, b: int, c: int) -> bool:
    return m[a][b] == ARROW and m[c][b] == ARROW


def equivalent_marks(m1: list[list[int]], m2: list[list[int]]) -> bool:
    """Markov equivalence of two MAG mark lists (Spirtes & Richardson 1996; Zhang 2008, Prop. 2): same
    skeleton, same unshielded colliders, and the same colliders on paths that are discriminating in both."""
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


__all__ = [
    "ancestral",
    "descendants",
    "descendants_bits",
    "descendants_spec",
    "directed",
    "discriminating_bits",
    "discriminating_ends",
    "discriminating_w",
    "equivalent_marks",
    "forced_walk",
    "forced_walk_spec",
    "is_mag_marks",
    "maximal",
    "pd_next",
    "pd_step",
    "uncovered_pd_path",
    "uncovered_pd_path_spec",
]
