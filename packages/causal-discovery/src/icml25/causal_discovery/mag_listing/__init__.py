"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the public API.

Tian-Zuo Wang, Wen-Bo Du, Zhi-Hua Zhou (ICML 2025 oral, PMLR 267:62804-62824). Given a PAG (e.g. from
FCI), list every MAG it represents, each exactly once, by
recursively fixing one circle mark (singleton background knowledge) and closing under sound, locally
complete orientation rules, so no branch is a dead end and the delay is polynomial.

Marks use pcalg's ``amat.pag`` coding: ``marks[i, j]`` is the mark at j on ``i - j`` with
0 none, 1 circle, 2 arrowhead, 3 tail. No selection bias (MAG edges are ``->`` or ``<->``).

Modules, bottom up: ``marks`` (alphabet, matrix validation) -> ``mixed_graph`` (the mutable partial graph
with its bitsets) -> ``predicates`` (path predicates in spec and bitset form; MAG validation) -> ``rules``
(orientation rules with scope and cost) -> ``scheduler`` (incremental fixpoint) -> ``conflicts`` ->
``probing`` (depth-1 probing, closure) -> ``fci`` (oracle FCI, Zhang's MAG, valid-PAG check) -> ``graphs``
(PAG/MAG containers) -> ``mag`` (public predicates) -> ``bruteforce``, ``listing``, ``simulate``.
"""

from icml25.causal_discovery.mag_listing.bruteforce import (
    BruteForceStats,
    invariant_marks,
    list_mags_bruteforce,
    mec_bruteforce,
)
from icml25.causal_discovery.mag_listing.conflicts import find_conflict
from icml25.causal_discovery.mag_listing.graphs import MAG, PAG
from icml25.causal_discovery.mag_listing.listing import ListingStats, apply_background_knowledge, list_mags
from icml25.causal_discovery.mag_listing.mag import is_mag, markov_equivalent, pag_from_mag, reference_mag
from icml25.causal_discovery.mag_listing.marks import (
    ARROW,
    CIRCLE,
    NONE,
    TAIL,
    InconsistentBackgroundKnowledge,
)
from icml25.causal_discovery.mag_listing.mixed_graph import MixedGraph
from icml25.causal_discovery.mag_listing.probing import ProbeCache, close, probe
from icml25.causal_discovery.mag_listing.rules import (
    BASE_RULES,
    DEFAULT_RULES,
    rule_long_r2,
    rule_no_selection,
    rule_r1,
    rule_r2,
    rule_r3,
    rule_r4_noncollider,
    rule_r8,
    rule_r9,
    rule_r10,
    rule_triangle,
)
from icml25.causal_discovery.mag_listing.simulate import mag_from_dag, random_instance, random_mag

__all__ = [
    "ARROW",
    "BASE_RULES",
    "CIRCLE",
    "DEFAULT_RULES",
    "MAG",
    "NONE",
    "PAG",
    "TAIL",
    "BruteForceStats",
    "InconsistentBackgroundKnowledge",
    "ListingStats",
    "MixedGraph",
    "ProbeCache",
    "apply_background_knowledge",
    "close",
    "find_conflict",
    "invariant_marks",
    "is_mag",
    "list_mags",
    "list_mags_bruteforce",
    "mag_from_dag",
    "markov_equivalent",
    "mec_bruteforce",
    "pag_from_mag",
    "probe",
    "random_instance",
    "random_mag",
    "reference_mag",
    "rule_long_r2",
    "rule_no_selection",
    "rule_r1",
    "rule_r2",
    "rule_r3",
    "rule_r4_noncollider",
    "rule_r8",
    "rule_r9",
    "rule_r10",
    "rule_triangle",
]
