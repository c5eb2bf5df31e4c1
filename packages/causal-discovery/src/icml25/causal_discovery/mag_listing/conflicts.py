"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: conflict detection,
the test that a partial mixed graph's definite marks admit no MAG of the PAG.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
The detectors are sound (a conflict means no MAG of the PAG refines the graph), not complete; depth-1
probing (:mod:`~icml25.causal_discovery.mag_listing.probing`) calls them on every probe closure.
"""

from __future__ import annotations

from icml25.causal_discovery.mag_listing.mixed_graph import MixedGraph, bits
from icml25.causal_discovery.mag_listing.predicates import descendants_bits, discriminating_ends


def find_conflict(g: MixedGraph) -> str | None:
    """A reason why no MAG of the PAG agrees with ``g``'s definite marks, or ``None``.

    Detected: a directed cycle; ``a <-> b`` with a directed path ``a => b``; an unshielded collider that
    the PAG lacks; a collider on a discriminating path where the PAG has a circle.
    """
    n, A, rA, rT, adjm, pagA, pagC = g.n, g.A, g.rA, g.rT, g.adjm, g.pagA, g.pagC
    desc = descendants_bits(g)
    for a in range(n):
        if desc[a] >> a & 1:
            return f"directed cycle through {a}"
        if A[a] & rA[a] & desc[a]:
            b = bits(A[a] & rA[a] & desc[a])[0]
            return f"{a} <-> {b} with a directed path {a} => {b}"
    for b in range(n):
        into = A[b]
        for a in bits(into & ~pagA[b]):  # arrowheads at b that the PAG does not have
            if into & ~adjm[a] & ~(1 << a):
                c = bits(into & ~adjm[a] & ~(1 << a))[0]
                return f"unshielded collider {a} *-> {b} <-* {c} not in the PAG"
    ends: dict[int, int] = {}
    for z in range(n):
        # y with an arrowhead at z on y - z where the PAG has a circle (so z is adjacent to y and not a
        # parent of y), and w <-> z with w -> y: a discriminating path through w makes z a collider
        for y in bits(A[z] & pagC[z]):
            cand = A[z] & rA[z] & A[y] & rT[y]
            if not cand:
                continue
            if y not in ends:
                ends[y] = discriminating_ends(g, y)
            if cand & ends[y]:
                w = bits(cand & ends[y])[0]
                return f"collider at {z} on a discriminating path <..., {w}, {z}, {y}>"
    return None


__all__ = ["find_conflict"]
