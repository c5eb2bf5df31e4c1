"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the scheduler that
applies orientation rules to a fixpoint, incrementally.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
Why incremental: after one singleton mark the closure should only re-examine the vertices around the
new marks, not re-scan every rule over the whole graph. Each rule's ``scope`` and ``cost`` (attached where
the rule is defined, :mod:`~icml25.causal_discovery.mag_listing.rules`) tell the scheduler where an
instance can newly fire and whether it is a bounded pattern or a path search.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from icml25.causal_discovery.mag_listing.mixed_graph import MixedGraph, Rule, bits
from icml25.causal_discovery.mag_listing.rules import cost_of, scope_of


def _run(g: MixedGraph, rules: Sequence[Rule], scopes: Sequence[str], dirty: int) -> None:
    """One round of ``rules`` restricted by their scopes to what the marks at ``dirty`` can enable."""
    near = dirty
    for v in bits(dirty):
        near |= g.adjm[v]
    for r, scope in zip(rules, scopes, strict=True):
        if scope == "self":
            r(g, dirty)  # type: ignore[call-arg]
        elif scope == "nbr":
            r(g, near)  # type: ignore[call-arg]
        else:
            r(g)


@lru_cache(maxsize=64)  # why: apply_rules runs once per probe closure; split each rule set once
def _split(rules: tuple[Rule, ...]) -> tuple[tuple, tuple, tuple, tuple]:
    cheap = tuple(r for r in rules if cost_of(r) == "local")
    costly = tuple(r for r in rules if cost_of(r) != "local")
    return cheap, tuple(scope_of(r) for r in cheap), costly, tuple(scope_of(r) for r in costly)


def apply_rules(g: MixedGraph, rules: Sequence[Rule]) -> None:
    """Apply ``rules`` until none changes a mark (raises :class:`~.marks.Conflict`).

    Work is driven by ``g.dirty`` (endpoints of marks set since the rules last ran): rules of scope
    ``"self"``/``"nbr"`` only look around those vertices, the others run in full. The local-cost rules are
    first taken to their fixpoint, then the path rules run once on everything that changed meanwhile;
    this repeats until a round of the path rules changes nothing.
    """
    cheap, cheap_scopes, costly, costly_scopes = _split(tuple(rules))
    while g.dirty:
        pending = 0  # changes the path rules have not seen yet
        while g.dirty:
            dirty, g.dirty = g.dirty, 0
            pending |= dirty
            _run(g, cheap, cheap_scopes, dirty)
        if costly:
            _run(g, costly, costly_scopes, pending)


def full_rescan(g: MixedGraph, rules: Sequence[Rule]) -> None:
    """Spec of :func:`apply_rules`: every rule on the whole graph until a pass changes nothing."""
    changed = True
    while changed:
        changed = False
        for r in rules:
            changed |= r(g)
    g.dirty = 0


__all__ = ["apply_rules", "full_rescan"]
