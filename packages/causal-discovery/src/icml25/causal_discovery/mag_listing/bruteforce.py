"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the brute-force
oracle, per-edge enumeration with pruning.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).

Every edge that carries a circle is given one of the MAG edge types ``->``, ``<-``, ``<->`` allowed by its
definite marks (never ``2^c`` mark assignments). Branches die as soon as an unshielded triple's collider
status differs from the reference MAG's, or a directed cycle / an ``a <-> b`` with ``a`` an ancestor of
``b`` appears. A complete assignment is kept iff it is a MAG and Markov equivalent to the reference MAG.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from icml25.causal_discovery.mag_listing.graphs import MAG, PAG
from icml25.causal_discovery.mag_listing.mag import reference_mag
from icml25.causal_discovery.mag_listing.marks import ARROW, CIRCLE, TAIL
from icml25.causal_discovery.mag_listing.predicates import ancestral, equivalent_marks, is_mag_marks

_TYPES = ((TAIL, ARROW), (ARROW, TAIL), (ARROW, ARROW))  # (mark at a, mark at b) for a < b


@dataclass
class BruteForceStats:
    """Filled in by ``list_mags_bruteforce(..., stats=BruteForceStats())``: the size of the search.

    Attributes:
        nodes: partial assignments that survived the pruning (the root included).
        leaves: complete assignments tested with ``is_mag`` and Markov equivalence.
        n_outputs: MAGs found.

    ``leaves / n_outputs`` near 1 means the pruning leaves the search output-linear: the brute force then
    pays about one MAG test per MAG instead of the ``3^edges`` of the unpruned enumeration.
    """

    nodes: int = 0
    leaves: int = 0
    n_outputs: int = 0


def _fits(mark: int, want: int) -> bool:
    return mark == CIRCLE or mark == want


def enumerate_equivalent(
    pattern: list[list[int]], ref: list[list[int]], stats: BruteForceStats | None = None
) -> list[list[list[int]]]:
    """All MAG mark lists that refine ``pattern`` (circles free) and are Markov equivalent to ``ref``."""
    st = stats if stats is not None else BruteForceStats()
    n = len(pattern)
    edges = [(a, b) for a in range(n) for b in range(a + 1, n) if pattern[a][b]]
    index = {e: k for k, e in enumerate(edges)}
    domains = [
        [t for t in _TYPES if _fits(pattern[b][a], t[0]) and _fits(pattern[a][b], t[1])] for a, b in edges
    ]
    # Unshielded triple x - v - y is checked when the later of its two edges is assigned.
    checks: list[list[tuple[int, int, int, bool]]] = [[] for _ in edges]
    adj = [[u for u in range(n) if pattern[v][u]] for v in range(n)]
    for v in range(n):
        for i, x in enumerate(adj[v]):
            for y in adj[v][i + 1 :]:
                if not pattern[x][y]:
                    k = max(index[(min(x, v), max(x, v))], index[(min(y, v), max(y, v))])
                    checks[k].append((x, v, y, ref[x][v] == ARROW and ref[y][v] == ARROW))
    m = [[0] * n for _ in range(n)]
    out: list[list[list[int]]] = []

    def rec(k: int) -> None:
        st.nodes += 1
        if k == len(edges):
            st.leaves += 1
            if is_mag_marks(m) and equivalent_marks(m, ref):
                out.append([row[:] for row in m])
            return
        a, b = edges[k]
        for ma, mb in domains[k]:
            m[b][a], m[a][b] = ma, mb
            if all(
                (m[x][v] == ARROW and m[y][v] == ARROW) == col for x, v, y, col in checks[k]
            ) and ancestral(m):
                rec(k + 1)
        m[b][a] = m[a][b] = 0

    rec(0)
    st.n_outputs += len(out)
    return out


def _warn_size(n_free: int) -> None:
    if n_free > 16:
        warnings.warn(
            f"brute force over {n_free} free edges is exponential (3^{n_free} leaves)", stacklevel=3
        )


def list_mags_bruteforce(pag: PAG, *, stats: BruteForceStats | None = None) -> list[MAG]:
    """All MAGs represented by a valid PAG, by exhaustive per-edge enumeration (the test oracle).

    ``stats`` (a :class:`BruteForceStats`) receives the number of search nodes and tested leaves.
    Raises ``TypeError`` for a non-PAG and ``ValueError("not a valid PAG ...")`` for an invalid one.
    """
    ref = reference_mag(pag)
    m = pag.to_list()
    _warn_size(sum(1 for a in range(len(m)) for b in range(a + 1, len(m)) if CIRCLE in (m[a][b], m[b][a])))
    return [MAG._trusted(x, pag.names) for x in enumerate_equivalent(m, ref.to_list(), stats)]


def mec_bruteforce(mag: MAG) -> list[MAG]:
    """The Markov equivalence class of a MAG, enumerating all three edge types on every skeleton edge.

    Independent of the FCI rules: its invariant marks give the PAG (see :func:`invariant_marks`).
    """
    if not isinstance(mag, MAG):
        raise TypeError(f"mag must be a MAG, got {type(mag).__name__}")
    m = mag.to_list()
    free = [[CIRCLE if x else 0 for x in row] for row in m]
    _warn_size(sum(1 for row in m for x in row if x) // 2)
    return [MAG._trusted(x, mag.names) for x in enumerate_equivalent(free, m)]


def invariant_marks(mags: list[MAG]) -> PAG:
    """The marks shared by all ``mags`` (a circle where they differ): the PAG of a whole MEC."""
    if not mags:
        raise ValueError("mags must be a non-empty list of MAGs, got an empty list")
    import numpy as np

    stack = np.stack([g.marks for g in mags])
    same = (stack == stack[0]).all(axis=0)
    return PAG._trusted(np.where(same, stack[0], np.where(stack[0] > 0, CIRCLE, 0)), mags[0].names)
