"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the public MAG
predicates and maps: ``is_mag``, ``markov_equivalent``, ``pag_from_mag``, ``reference_mag``.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
They validate their arguments and call the mark-list forms in
:mod:`~icml25.causal_discovery.mag_listing.predicates` (ancestral, maximal, Markov equivalent) and
:mod:`~icml25.causal_discovery.mag_listing.fci` (oracle FCI, Zhang's construction).
"""

from __future__ import annotations

from icml25.causal_discovery.mag_listing.fci import pag_marks_from_mag, valid_pag_reference
from icml25.causal_discovery.mag_listing.graphs import MAG, PAG, as_marks
from icml25.causal_discovery.mag_listing.predicates import equivalent_marks, is_mag_marks


def is_mag(graph: object) -> bool:
    """Whether ``graph`` (a :class:`MAG`, :class:`PAG` or ``[n, n]`` mark matrix) is a maximal ancestral graph.

    Only ``->`` and ``<->`` edges are allowed (no selection bias); a circle mark makes it not a MAG.
    Ancestral: no directed cycle and no ``a <-> b`` with ``a`` an ancestor of ``b``. Maximal: no inducing
    path between non-adjacent vertices.
    """
    return is_mag_marks(as_marks(graph, "graph", allow_circles=True))


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


def pag_from_mag(mag: object) -> PAG:
    """The PAG (Markov equivalence class) of a MAG: oracle FCI (unshielded colliders, R1-R4, R8-R10).

    ``mag``: a :class:`MAG` or an ``[n, n]`` mark matrix of a MAG (``ValueError`` otherwise).
    """
    m = as_marks(mag, "mag")
    if not is_mag_marks(m):
        raise ValueError("mag must be a MAG (ancestral, maximal, edges -> or <->), got a graph that is not")
    names = mag.names if isinstance(mag, (MAG, PAG)) else None
    return PAG._trusted(pag_marks_from_mag(m), names)


def reference_mag(pag: PAG) -> MAG:
    """One MAG of a valid PAG (Zhang's construction); ``ValueError("not a valid PAG")`` if it fails."""
    if not isinstance(pag, PAG):
        raise TypeError(f"pag must be a PAG, got {type(pag).__name__}")
    return MAG._trusted(valid_pag_reference(pag.to_list()), pag.names)


__all__ = ["is_mag", "markov_equivalent", "pag_from_mag", "reference_mag"]
