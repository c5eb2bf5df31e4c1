"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the mutable partial
mixed graph that the orientation rules, conflict detectors and probing work on.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
The graph keeps the mark matrix (pcalg codes, ``m[i][j]`` is the mark at j on ``i - j``) and, beside it,
per-vertex bitsets (Python ints, bit ``u`` = vertex ``u``) of who has which mark, so that a rule's inner
loop is a few ``&``/``|`` instead of a neighbour scan (why: the rules run hundreds of thousands of times
while listing, in pure Python).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from icml25.causal_discovery.mag_listing.marks import ARROW, CIRCLE, TAIL, Conflict


@lru_cache(maxsize=1 << 17)  # why: called on every inner loop; a cached tuple beats re-decoding bits
def bits(x: int) -> tuple[int, ...]:
    """Vertices in a bitset, ascending."""
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return tuple(out)


class MixedGraph:
    """Mutable partial mixed graph: ``m[i][j]`` is the mark at ``j`` on edge ``i - j`` (lists of ints).

    Change marks only with :meth:`set` (or call :meth:`sync` after writing ``m`` directly), because the
    bitsets below mirror ``m``:

    - ``A[v]``, ``T[v]``, ``C[v]``: the ``u`` whose edge ``u - v`` has an arrowhead / tail / circle at v;
    - ``rA[u]``, ``rT[u]``, ``rC[u]``: the ``v`` whose edge ``u - v`` has an arrowhead / tail / circle at v.

    So ``u -> v`` iff ``u in A[v]`` and ``u in rT[v]``: children of u are ``rA[u] & T[u]``, parents of v
    ``A[v] & rT[v]``. ``pag`` holds the marks of the PAG being listed (the conflict detectors compare
    against it); the skeleton (``adj``/``adjset``/``adjm``) and the PAG never change, so copies share them.
    ``dirty`` is the bitset of endpoints of marks set since the rules last ran (see
    :func:`~icml25.causal_discovery.mag_listing.scheduler.apply_rules`).
    """

    __slots__ = (
        "A",
        "C",
        "T",
        "adj",
        "adjm",
        "adjset",
        "dirty",
        "full",
        "m",
        "n",
        "pag",
        "pagA",
        "pagC",
        "rA",
        "rC",
        "rT",
    )

    def __init__(self, m: list[list[int]], pag: list[list[int]] | None = None) -> None:
        n = self.n = len(m)
        self.full = (1 << n) - 1
        self.m = [list(row) for row in m]
        self.adj = [[j for j in range(n) if m[i][j]] for i in range(n)]
        self.adjset = [frozenset(a) for a in self.adj]
        self.adjm = [sum(1 << j for j in a) for a in self.adj]
        self.pag = [list(row) for row in (pag if pag is not None else m)]
        self.pagA = [sum(1 << u for u in range(n) if self.pag[u][v] == ARROW) for v in range(n)]
        self.pagC = [sum(1 << u for u in range(n) if self.pag[u][v] == CIRCLE) for v in range(n)]
        self.sync()

    def sync(self) -> None:
        """Rebuild the bitsets from ``m`` (after ``m`` was written directly)."""
        n, m = self.n, self.m
        self.dirty = self.full  # every vertex: the rules have not looked at this graph yet
        self.A, self.T, self.C = [0] * n, [0] * n, [0] * n
        self.rA, self.rT, self.rC = [0] * n, [0] * n, [0] * n
        col = {ARROW: self.A, TAIL: self.T, CIRCLE: self.C}
        row = {ARROW: self.rA, TAIL: self.rT, CIRCLE: self.rC}
        for u in range(n):
            for v in range(n):
                x = m[u][v]
                if x:
                    col[x][v] |= 1 << u
                    row[x][u] |= 1 << v

    def copy(self) -> MixedGraph:
        new = object.__new__(MixedGraph)
        new.n, new.adj, new.adjset, new.adjm, new.full = self.n, self.adj, self.adjset, self.adjm, self.full
        new.dirty = self.dirty
        new.pag, new.pagA, new.pagC = self.pag, self.pagA, self.pagC
        new.m = [row[:] for row in self.m]
        new.A, new.T, new.C = self.A[:], self.T[:], self.C[:]
        new.rA, new.rT, new.rC = self.rA[:], self.rT[:], self.rC[:]
        return new

    def set(self, a: int, b: int, mark: int) -> bool:
        """Set the mark at ``b`` on ``a - b``; only a circle may change, anything else is a conflict."""
        cur = self.m[a][b]
        if cur == mark:
            return False
        if cur != CIRCLE:
            raise Conflict(f"mark at {b} on {a}-{b} is {cur}, a rule needs {mark}")
        self.m[a][b] = mark
        self.dirty |= 1 << a | 1 << b
        self.C[b] &= ~(1 << a)
        self.rC[a] &= ~(1 << b)
        if mark == ARROW:
            self.A[b] |= 1 << a
            self.rA[a] |= 1 << b
        else:
            self.T[b] |= 1 << a
            self.rT[a] |= 1 << b
        return True

    def circles(self) -> list[tuple[int, int]]:
        """``(a, b)`` for every circle mark, at ``b`` on ``a - b``, in index order."""
        return [(a, b) for a in range(self.n) for b in bits(self.rC[a])]

    def n_circles(self) -> int:
        return sum(row.bit_count() for row in self.rC)

    def contains(self, other: MixedGraph) -> bool:
        """Does this graph carry every definite mark of ``other`` (it is ``other`` or a refinement of it)?"""
        A, T = self.A, self.T
        for v, (a, t) in enumerate(zip(other.A, other.T, strict=True)):
            if a & ~A[v] or t & ~T[v]:
                return False
        return True

    def key(self) -> tuple[int, ...]:
        return tuple(x for row in self.m for x in row)


Rule = Callable[[MixedGraph], bool]
"""An orientation rule: orients circles of the graph in place, returns whether it changed a mark, raises
:class:`~icml25.causal_discovery.mag_listing.marks.Conflict` when it must overwrite a definite mark."""

__all__ = ["MixedGraph", "Rule", "bits"]
