"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: depth-1 probing and
the closure used at every node of the listing tree.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
Probing sets a circle to each value, closes under the rules and runs the conflict detectors; a value that
conflicts forces the other, two conflicting values make the node dead. The paper's new rules were not
retrievable; our reconstruction (R_A, R_B and probing) is locally complete on every node we checked
against brute force (the tests and the reproduction re-measure it).
"""

from __future__ import annotations

from collections.abc import Sequence

from icml25.causal_discovery.mag_listing.conflicts import find_conflict
from icml25.causal_discovery.mag_listing.marks import ARROW, CIRCLE, TAIL, Conflict
from icml25.causal_discovery.mag_listing.mixed_graph import MixedGraph, Rule, bits
from icml25.causal_discovery.mag_listing.rules import DEFAULT_RULES
from icml25.causal_discovery.mag_listing.scheduler import apply_rules


class ProbeCache:
    """What probing learnt, handed down the listing tree.

    ``witnesses``: probe closures ``closure(G' + one mark)`` computed at this node or an ancestor G',
    rule-closed and conflict-free. Probing accepts a value exactly when such a closure exists, i.e. it
    takes these graphs to hold a MAG of the PAG (our brute-force check: 0 wrongly accepted values in
    112,234 exhaustive tests). On that same premise a witness W that refines the current node G and has
    ``value`` at a circle of G shows that ``G + value`` holds a MAG (W's MAG refines it), so probing skips
    closing ``G + value``. Per-node local completeness is re-measured against brute force in the tests.

    ``results[(a, b, value)]``: ``closure(G + value at b on a - b)`` where this node computed it; a child
    of the listing tree that is exactly that branch starts from it instead of re-closing.

    ``passes``: rule saturations (``apply_rules`` calls, probe closures included) run with this cache, the
    machine-independent work count that :class:`~.listing.ListingStats` records per output.
    """

    __slots__ = ("passes", "results", "witnesses")

    def __init__(self, witnesses: list[MixedGraph] | None = None) -> None:
        self.witnesses = list(witnesses or ())
        self.results: dict[tuple[int, int, int], MixedGraph] = {}
        self.passes = 0

    def for_child(self) -> ProbeCache:
        """The cache a child node starts with: this node's witnesses."""
        return ProbeCache(self.witnesses)


def probe(g: MixedGraph, rules: Sequence[Rule], cache: ProbeCache | None = None) -> bool:
    """Depth-1 probing: for each circle try arrowhead and tail, close with ``rules``, test for conflicts.

    If one value conflicts the other is forced (and the rules re-applied); if both conflict the graph is
    dead (:class:`Conflict`). Returns whether any mark was forced. With a :class:`ProbeCache`, values
    already shown possible by a witness are not re-closed, and the closures computed are recorded.
    """
    cache = cache if cache is not None else ProbeCache()
    wits = [w for w in cache.witnesses if w.contains(g)]
    # seen[(a, b)]: bitset of values (1 << mark) shown possible by a witness that refines g
    seen: dict[tuple[int, int], int] = {}

    def note(w: MixedGraph) -> None:
        wits.append(w)
        m = w.m
        for a, row in enumerate(g.rC):
            for b in bits(row):
                mark = m[a][b]
                if mark != CIRCLE:
                    seen[(a, b)] = seen.get((a, b), 0) | 1 << mark

    old, wits = wits, []
    for w in old:
        note(w)
    changed = False
    for a, b in g.circles():
        if g.m[a][b] != CIRCLE:  # oriented by an earlier forced mark
            continue
        ok = []
        for value in (ARROW, TAIL):
            if seen.get((a, b), 0) >> value & 1:
                ok.append(value)
                continue
            h = g.copy()
            try:
                h.set(a, b, value)
                cache.passes += 1
                apply_rules(h, rules)
                if find_conflict(h) is None:
                    ok.append(value)
                    note(h)
                    cache.results[(a, b, value)] = h
            except Conflict:
                pass
        if not ok:
            raise Conflict(f"both marks at {b} on {a}-{b} conflict")
        if len(ok) == 1:
            g.set(a, b, ok[0])
            cache.passes += 1
            apply_rules(g, rules)
            changed = True
            # witnesses that disagree with the forced marks say nothing about g any more
            old, wits = [w for w in wits if w.contains(g)], []
            seen.clear()
            for w in old:
                note(w)
    cache.witnesses = wits
    return changed


def close(
    g: MixedGraph,
    rules: Sequence[Rule] = DEFAULT_RULES,
    probing: bool = True,
    cache: ProbeCache | None = None,
    *,
    closed: bool = False,
) -> None:
    """Closure: rules to a fixpoint, conflict check, then probing (repeated until nothing changes).

    ``closed=True`` says ``g`` is already rule-closed and conflict-free (a probe result), so the first
    rule pass is skipped. ``cache`` (see :class:`ProbeCache`) carries witnesses in and results out.
    """
    cache = cache if cache is not None else ProbeCache()
    while True:
        if not closed:
            cache.passes += 1
            apply_rules(g, rules)
            reason = find_conflict(g)
            if reason is not None:
                raise Conflict(reason)
        closed = False
        if not probing or not probe(g, rules, cache):
            return


__all__ = ["ProbeCache", "close", "probe"]
