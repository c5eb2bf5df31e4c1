"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025 — P07: orientation rules, conflict detectors and closure for listing MAGs of a PAG (P07, ICML 2025).

Every rule is a separate function ``rule(g: MixedGraph) -> bool`` that orients circle marks in place,
returns whether it changed anything and raises :class:`Conflict` when it must overwrite a definite mark.
The rule set is a plain list (``DEFAULT_RULES``), so other rules can be plugged in.

Rules (Zhang 2008 numbering; no selection bias, so every MAG edge is ``->`` or ``<->``):

- ``rule_r1`` .. ``rule_r3``, ``rule_r4_noncollider`` (R4'), ``rule_r8`` .. ``rule_r10``: FCI's rules.
- ``rule_no_selection`` (R_SB): ``a -o b`` => ``a -> b``.
- ``rule_long_r2`` (R_A) and ``rule_triangle`` (R_B): the two rules of the brief's reconstruction (§10).
- depth-1 probing (:func:`probe`): set a circle to each value, close, and keep only non-conflicting values.

Conflicts are detected on the definite marks (:func:`find_conflict`): a directed cycle, ``a <-> b`` with a
directed path ``a => b``, an unshielded collider that the PAG lacks, and a collider on a discriminating
path where the PAG has a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from icml25.causal_discovery.mag_listing.marks import ARROW, CIRCLE, TAIL, Conflict


class MixedGraph:
    """Mutable partial mixed graph: ``m[i][j]`` is the mark at ``j`` on edge ``i - j`` (lists of ints).

    ``pag`` holds the marks of the PAG being listed (the conflict detectors compare against it); the
    skeleton (``adj``/``adjset``) never changes, so copies share it.
    """

    __slots__ = ("adj", "adjset", "m", "n", "pag")

    def __init__(self, m: list[list[int]], pag: list[list[int]] | None = None) -> None:
        self.n = len(m)
        self.m = [list(row) for row in m]
        self.adj = [[j for j in range(self.n) if m[i][j]] for i in range(self.n)]
        self.adjset = [frozenset(a) for a in self.adj]
        self.pag = [list(row) for row in (pag if pag is not None else m)]

    def copy(self) -> MixedGraph:
        new = object.__new__(MixedGraph)
        new.n, new.adj, new.adjset, new.pag = self.n, self.adj, self.adjset, self.pag
        new.m = [row[:] for row in self.m]
        return new

    def set(self, a: int, b: int, mark: int) -> bool:
        """Set the mark at ``b`` on ``a - b``; only a circle may change, anything else is a conflict."""
        cur = self.m[a][b]
        if cur == mark:
            return False
        if cur != CIRCLE:
            raise Conflict(f"mark at {b} on {a}-{b} is {cur}, a rule needs {mark}")
        self.m[a][b] = mark
        return True

    def circles(self) -> list[tuple[int, int]]:
        """``(a, b)`` for every circle mark, at ``b`` on ``a - b``, in index order."""
        m = self.m
        return [(a, b) for a in range(self.n) for b in self.adj[a] if m[a][b] == CIRCLE]

    def key(self) -> tuple[int, ...]:
        return tuple(x for row in self.m for x in row)


Rule = Callable[[MixedGraph], bool]


def _directed(m: list[list[int]], a: int, b: int) -> bool:
    """``a -> b`` (tail at a, arrowhead at b)."""
    return m[a][b] == ARROW and m[b][a] == TAIL


def rule_r1(g: MixedGraph) -> bool:
    """R1 (away from collider): ``a *-> b o-* c``, a and c non-adjacent => ``b -> c``."""
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for b in range(g.n):
        for a in adj[b]:
            if m[a][b] != ARROW:
                continue
            for c in adj[b]:
                if c != a and m[c][b] == CIRCLE and c not in adjset[a]:
                    g.set(c, b, TAIL)
                    g.set(b, c, ARROW)
                    changed = True
    return changed


def rule_r2(g: MixedGraph) -> bool:
    """R2 (away from cycle): ``a -> b *-> c`` or ``a *-> b -> c``, and ``a *-o c`` => ``a *-> c``."""
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for a in range(g.n):
        for c in adj[a]:
            if m[a][c] != CIRCLE:
                continue
            for b in adj[a]:
                if b == c or b not in adjset[c] or m[a][b] != ARROW:
                    continue
                if (m[b][a] == TAIL and m[b][c] == ARROW) or (m[b][c] == ARROW and m[c][b] == TAIL):
                    g.set(a, c, ARROW)
                    changed = True
                    break
    return changed


def rule_r3(g: MixedGraph) -> bool:
    """R3 (double triangle): ``a *-> b <-* c``, ``a *-o t o-* c``, a, c non-adjacent, ``t *-o b`` => ``t *-> b``."""
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for b in range(g.n):
        for t in adj[b]:
            if m[t][b] != CIRCLE:
                continue
            side = [x for x in adj[b] if x != t and x in adjset[t] and m[x][b] == ARROW and m[x][t] == CIRCLE]
            if any(c not in adjset[a] for i, a in enumerate(side) for c in side[i + 1 :]):
                g.set(t, b, ARROW)
                changed = True
    return changed


def discriminating_w(
    m: list[list[int]], adj: list[list[int]], adjset: list[frozenset[int]], w: int, z: int, y: int
) -> bool:
    """Is there a discriminating path ``<x, ..., w, z, y>`` for ``z`` (definite marks only)?

    Every vertex between x and z must be a collider on the path and a parent of y, and x, y non-adjacent.
    The in-between vertices therefore form a ``<->`` chain of parents of y ending at w, so a search over
    vertices (not paths) suffices: a repeated vertex can be cut out without breaking the collider pattern.
    """
    if not (_directed(m, w, y) and m[z][w] == ARROW):
        return False
    seen, stack = {w}, [w]
    while stack:
        q = stack.pop()
        for x in adj[q]:
            if x == z or x == y or m[x][q] != ARROW:
                continue
            if x not in adjset[y]:
                return True
            if x not in seen and m[q][x] == ARROW and _directed(m, x, y):
                seen.add(x)
                stack.append(x)
    return False


def rule_r4_noncollider(g: MixedGraph) -> bool:
    """R4' (discriminating path): a discriminating path ``<x, ..., w, z, y>`` for z with ``z o-* y`` => ``z -> y``.

    Only FCI's non-collider branch: a collider at z would put an arrowhead at z on ``z - y`` although the
    PAG has a circle there, which :func:`find_conflict` refutes.
    """
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for z in range(g.n):
        for y in adj[z]:
            if m[y][z] != CIRCLE:
                continue
            if any(w != y and w in adjset[y] and discriminating_w(m, adj, adjset, w, z, y) for w in adj[z]):
                g.set(y, z, TAIL)
                g.set(z, y, ARROW)
                changed = True
    return changed


def rule_r8(g: MixedGraph) -> bool:
    """R8: ``a -> b -> c`` (or ``a -o b -> c``) and ``a o-> c`` => ``a -> c``."""
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for a in range(g.n):
        for c in adj[a]:
            if not (m[c][a] == CIRCLE and m[a][c] == ARROW):
                continue
            for b in adj[a]:
                if b != c and b in adjset[c] and m[b][a] == TAIL and m[a][b] != TAIL and _directed(m, b, c):
                    g.set(c, a, TAIL)
                    changed = True
                    break
    return changed


def _pd_step(m: list[list[int]], u: int, v: int) -> bool:
    """Edge ``u - v`` is potentially directed from u to v: no arrowhead at u, no tail at v."""
    return m[v][u] != ARROW and m[u][v] != TAIL


def uncovered_pd_path(g: MixedGraph, prev: int, cur: int, target: int, visited: set[int]) -> bool:
    """Does the uncovered potentially directed path ``..., prev, cur`` extend to ``target``? (DFS, simple paths)."""
    if cur == target:
        return True
    m, adjset = g.m, g.adjset
    for nxt in g.adj[cur]:
        if nxt in visited or nxt in adjset[prev] or not _pd_step(m, cur, nxt):
            continue
        visited.add(nxt)
        found = uncovered_pd_path(g, cur, nxt, target, visited)
        visited.discard(nxt)
        if found:
            return True
    return False


def rule_r9(g: MixedGraph) -> bool:
    """R9: ``a o-> c`` and an uncovered p.d. path ``<a, b, t, ..., c>`` with b, c non-adjacent => ``a -> c``."""
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for a in range(g.n):
        for c in adj[a]:
            if not (m[c][a] == CIRCLE and m[a][c] == ARROW):
                continue
            for b in adj[a]:
                if b == c or b in adjset[c] or not _pd_step(m, a, b):
                    continue
                if uncovered_pd_path(g, a, b, c, {a, b}):
                    g.set(c, a, TAIL)
                    changed = True
                    break
    return changed


def rule_r10(g: MixedGraph) -> bool:
    """R10: ``a o-> c``, ``b -> c <- t``, uncovered p.d. paths a..b and a..t whose second vertices
    mu != omega are non-adjacent => ``a -> c``."""
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for a in range(g.n):
        for c in adj[a]:
            if not (m[c][a] == CIRCLE and m[a][c] == ARROW):
                continue
            parents = [x for x in adj[c] if x != a and _directed(m, x, c)]
            if len(parents) < 2:
                continue
            starts = [mu for mu in adj[a] if _pd_step(m, a, mu)]
            first = [
                {mu for mu in starts if mu == x or uncovered_pd_path(g, a, mu, x, {a, mu})} for x in parents
            ]
            hit = any(
                mu != om and om not in adjset[mu]
                for i in range(len(parents))
                for j in range(i + 1, len(parents))
                for mu in first[i]
                for om in first[j]
            )
            if hit:
                g.set(c, a, TAIL)
                changed = True
    return changed


def rule_no_selection(g: MixedGraph) -> bool:
    """R_SB (no selection bias): ``a -o b`` => ``a -> b``; a tail at both ends is a conflict."""
    m, changed = g.m, False
    for a in range(g.n):
        for b in g.adj[a]:
            if m[b][a] == TAIL:
                if m[a][b] == TAIL:
                    raise Conflict(f"tail-tail edge {a}-{b} (selection bias)")
                if m[a][b] == CIRCLE:
                    g.set(a, b, ARROW)
                    changed = True
    return changed


def rule_long_r2(g: MixedGraph) -> bool:
    """R_A (long-range R2): ``y *-> x``, a circle at x on ``x - v``, and a walk ``x, v=v1, ..., vk=y``
    (k >= 2), potentially directed forward, whose every step ``vi -> vi+1`` is already directed or has
    ``vi-1``, ``vi+1`` non-adjacent => arrowhead at x on ``x - v``.

    A tail at x would make the walk directed (each unshielded step is forced by R1's argument), so x
    would be an ancestor of y while ``y *-> x``. The search runs over (previous, current) vertex pairs.
    """
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for x in range(g.n):
        targets = {y for y in adj[x] if m[y][x] == ARROW}
        if not targets:
            continue
        for v in adj[x]:
            if m[v][x] != CIRCLE or m[x][v] == TAIL or v in targets:
                continue
            seen, stack, fire = {(x, v)}, [(x, v)], False
            while stack and not fire:
                p, c = stack.pop()
                for nxt in adj[c]:
                    if not _pd_step(m, c, nxt):
                        continue
                    if not (_directed(m, c, nxt) or (nxt != p and nxt not in adjset[p])):
                        continue
                    if nxt in targets:
                        fire = True
                        break
                    if (c, nxt) not in seen:
                        seen.add((c, nxt))
                        stack.append((c, nxt))
            if fire:
                g.set(v, x, ARROW)
                changed = True
    return changed


def rule_triangle(g: MixedGraph) -> bool:
    """R_B (triangle): ``a *-> b -> d``, a, d non-adjacent, c adjacent to a, b, d with a circle at c on
    ``c - d`` => ``c -> d``."""
    m, adj, adjset, changed = g.m, g.adj, g.adjset, False
    for b in range(g.n):
        for d in adj[b]:
            if not _directed(m, b, d):
                continue
            for a in adj[b]:
                if a == d or m[a][b] != ARROW or a in adjset[d]:
                    continue
                for c in adj[d]:
                    if m[d][c] == CIRCLE and c in adjset[a] and c in adjset[b]:
                        g.set(d, c, TAIL)
                        g.set(c, d, ARROW)
                        changed = True
    return changed


BASE_RULES: tuple[Rule, ...] = (
    rule_no_selection,
    rule_r1,
    rule_r2,
    rule_r3,
    rule_r4_noncollider,
    rule_r8,
    rule_r9,
    rule_r10,
)
DEFAULT_RULES: tuple[Rule, ...] = (*BASE_RULES, rule_long_r2, rule_triangle)


def descendants(m: list[list[int]], n: int) -> list[int]:
    """Bitmask of strict descendants of every vertex along definite directed edges (tail => directed)."""
    children = [0] * n
    for a in range(n):
        for b in range(n):
            if m[b][a] == TAIL and m[a][b]:
                children[a] |= 1 << b
    desc = [0] * n
    for a in range(n):
        reach, frontier = 0, children[a]
        while frontier:
            reach |= frontier
            nxt = 0
            f = frontier
            while f:
                low = f & -f
                nxt |= children[low.bit_length() - 1]
                f ^= low
            frontier = nxt & ~reach
        desc[a] = reach
    return desc


def find_conflict(g: MixedGraph) -> str | None:
    """A reason why no MAG of the PAG agrees with ``g``'s definite marks, or ``None`` (sound, not complete)."""
    m, n, adj, adjset, pag = g.m, g.n, g.adj, g.adjset, g.pag
    desc = descendants(m, n)
    for a in range(n):
        if desc[a] >> a & 1:
            return f"directed cycle through {a}"
        for b in adj[a]:
            if m[a][b] == ARROW and m[b][a] == ARROW and desc[a] >> b & 1:
                return f"{a} <-> {b} with a directed path {a} => {b}"
    for b in range(n):
        into = [a for a in adj[b] if m[a][b] == ARROW]
        for i, a in enumerate(into):
            for c in into[i + 1 :]:
                if c not in adjset[a] and (pag[a][b] != ARROW or pag[c][b] != ARROW):
                    return f"unshielded collider {a} *-> {b} <-* {c} not in the PAG"
    for z in range(n):
        for y in adj[z]:
            if pag[y][z] != CIRCLE or m[y][z] != ARROW:
                continue
            for w in adj[z]:
                if (
                    w != y
                    and m[w][z] == ARROW
                    and w in adjset[y]
                    and discriminating_w(m, adj, adjset, w, z, y)
                ):
                    return f"collider at {z} on a discriminating path <..., {w}, {z}, {y}>"
    return None


def apply_rules(g: MixedGraph, rules: Sequence[Rule]) -> None:
    """Apply ``rules`` until none changes a mark (raises :class:`Conflict`)."""
    changed = True
    while changed:
        changed = False
        for rule in rules:
            if rule(g):
                changed = True


def probe(g: MixedGraph, rules: Sequence[Rule]) -> bool:
    """Depth-1 probing: for each circle try arrowhead and tail, close with ``rules``, test for conflicts.

    If one value conflicts the other is forced (and the rules re-applied); if both conflict the graph is
    dead (:class:`Conflict`). Returns whether any mark was forced.
    """
    changed = False
    for a, b in g.circles():
        if g.m[a][b] != CIRCLE:  # oriented by an earlier forced mark
            continue
        ok = []
        for value in (ARROW, TAIL):
            h = g.copy()
            try:
                h.set(a, b, value)
                apply_rules(h, rules)
                if find_conflict(h) is None:
                    ok.append(value)
            except Conflict:
                pass
        if not ok:
            raise Conflict(f"both marks at {b} on {a}-{b} conflict")
        if len(ok) == 1:
            g.set(a, b, ok[0])
            apply_rules(g, rules)
            changed = True
    return changed


def close(g: MixedGraph, rules: Sequence[Rule] = DEFAULT_RULES, probing: bool = True) -> None:
    """Closure: rules to a fixpoint, conflict check, then probing (repeated until nothing changes)."""
    while True:
        apply_rules(g, rules)
        reason = find_conflict(g)
        if reason is not None:
            raise Conflict(reason)
        if not probing or not probe(g, rules):
            return
