"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the orientation
rules, each with the scope and cost that the scheduler uses.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
Every rule is a function ``rule(g: MixedGraph, focus: int = -1) -> bool`` that orients circle marks in
place, returns whether it changed anything, and raises :class:`Conflict` when it must overwrite a definite
mark. The rule set is a plain list (``DEFAULT_RULES``), so other rules can be plugged in (a plugged-in
``rule(g) -> bool`` without the decorator is run on the whole graph, as a path rule).

Rules (Zhang 2008 numbering; no selection bias, so every MAG edge is ``->`` or ``<->``):

- ``rule_r1`` .. ``rule_r3``, ``rule_r4_noncollider`` (R4'), ``rule_r8`` .. ``rule_r10``: FCI's rules;
- ``rule_no_selection`` (R_SB): ``a -o b`` => ``a -> b``; with R1-R4', R8-R10 these are the rules that are
  sound and complete for *local* background knowledge (Wang, Qin, Zhou, NeurIPS 2022), the base the
  ICML 2025 paper extends to singleton background knowledge;
- ``rule_long_r2`` (R_A) and ``rule_triangle`` (R_B): two rules of our reconstruction (the paper's own
  new rules could not be retrieved), checked node by node against brute force in the tests.

**Scope** (``rule.scope``) says where an instance can newly fire after marks change, so that the closure
after one singleton mark only re-examines the few vertices around it. Marks only ever go from circle to
definite, and every antecedent here is a definite mark, a skeleton (non-)adjacency, or a condition that a
new definite mark can only switch off ("circle at", "no arrowhead at", "potentially directed"). So an
instance can newly fire only if a definite mark of its antecedent is new. Keying each instance by one
vertex: ``"self"``: every such mark lies on an edge at the key vertex; ``"nbr"``: on edges at the key or at
its neighbours; ``"all"``: marks anywhere along a path, so the rule is re-run on the whole graph.
**Cost** (``rule.cost``): ``"local"`` (a bounded pattern around the key) or ``"path"`` (a search along
paths); the scheduler takes the local rules to their fixpoint before running the path rules.
"""

from __future__ import annotations

from collections.abc import Callable

from icml25.causal_discovery.mag_listing.marks import ARROW, TAIL, Conflict
from icml25.causal_discovery.mag_listing.mixed_graph import MixedGraph, Rule, bits
from icml25.causal_discovery.mag_listing.predicates import (
    discriminating_ends,
    forced_walk,
    pd_next,
    uncovered_pd_path,
)

SCOPES = ("self", "nbr", "all")
COSTS = ("local", "path")


def rule(*, scope: str, cost: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Attach a rule's scope and cost (see the module docstring) where the rule is defined."""
    if scope not in SCOPES or cost not in COSTS:
        raise ValueError(f"scope must be one of {SCOPES} and cost one of {COSTS}, got {scope!r}, {cost!r}")

    def attach(fn: Callable[..., bool]) -> Callable[..., bool]:
        fn.scope = scope  # type: ignore[attr-defined]
        fn.cost = cost  # type: ignore[attr-defined]
        return fn

    return attach


def scope_of(r: Rule) -> str:
    """A rule's scope; ``"all"`` for a plugged-in rule without one."""
    return getattr(r, "scope", "all")


def cost_of(r: Rule) -> str:
    """A rule's cost; ``"path"`` for a plugged-in rule without one."""
    return getattr(r, "cost", "path")


@rule(scope="self", cost="local")  # key b: a *-> b (edge at b)
def rule_r1(g: MixedGraph, focus: int = -1) -> bool:
    """R1 (away from collider): ``a *-> b o-* c``, a and c non-adjacent => ``b -> c``."""
    A, C, adjm, changed = g.A, g.C, g.adjm, False
    for b in bits(focus & g.full):
        if not (A[b] and C[b]):
            continue
        for a in bits(A[b]):
            for c in bits(C[b] & ~adjm[a] & ~(1 << a)):
                g.set(c, b, TAIL)
                g.set(b, c, ARROW)
                changed = True
    return changed


@rule(scope="self", cost="local")  # key b: a *-> b *-> c (edges at b)
def rule_r2(g: MixedGraph, focus: int = -1) -> bool:
    """R2 (away from cycle): ``a -> b *-> c`` or ``a *-> b -> c``, and ``a *-o c`` => ``a *-> c``.

    Instances are keyed by the middle vertex b, whose two edges carry every mark the rule needs.
    """
    A, C, T, rA, rT, changed = g.A, g.C, g.T, g.rA, g.rT, False
    for b in bits(focus & g.full):
        if not (A[b] and rA[b]):
            continue
        for c in bits(rA[b]):  # b *-> c
            into = A[b] & C[c]  # a *-> b with a circle at c on a - c
            if into and not T[b] >> c & 1:  # not b -> c: then a -> b is needed
                into &= rT[b]
            for a in bits(into):
                g.set(a, c, ARROW)
                changed = True
    return changed


@rule(scope="self", cost="local")  # key b: a *-> b <-* c (edges at b); the circles at t only switch off
def rule_r3(g: MixedGraph, focus: int = -1) -> bool:
    """R3 (double triangle): ``a *-> b <-* c``, ``a *-o t o-* c``, a, c non-adjacent, ``t *-o b`` => ``t *-> b``."""
    A, C, adjm, changed = g.A, g.C, g.adjm, False
    for b in bits(focus & g.full):
        if not A[b]:
            continue
        for t in bits(C[b]):
            side = A[b] & C[t]  # x with x *-> b and x *-o t
            if side & (side - 1) and any(side & ~adjm[a] & ~(1 << a) for a in bits(side)):
                g.set(t, b, ARROW)
                changed = True
    return changed


@rule(scope="all", cost="path")  # the discriminating path's marks lie anywhere along it
def rule_r4_noncollider(g: MixedGraph, focus: int = -1) -> bool:
    """R4' (discriminating path): a discriminating path ``<x, ..., w, z, y>`` for z with ``z o-* y`` => ``z -> y``.

    Only FCI's non-collider branch: a collider at z would put an arrowhead at z on ``z - y`` although the
    PAG has a circle there, which the conflict detectors refute. One search per y
    (:func:`~.predicates.discriminating_ends`), redone after a firing changes the marks.
    """
    A, rA, rC, rT, changed = g.A, g.rA, g.rC, g.rT, False
    ends: dict[int, int] = {}
    for y in range(g.n):
        parents = A[y] & rT[y]
        if not parents:
            continue
        for z in bits(rC[y]):  # circle at z on z - y (z adjacent to y, not a parent of y)
            cand = A[y] & rT[y] & rA[z]  # w -> y with z *-> w
            if not cand:
                continue
            if y not in ends:
                ends[y] = discriminating_ends(g, y)
            if cand & ends[y]:
                g.set(y, z, TAIL)
                g.set(z, y, ARROW)
                changed = True
                ends.clear()  # the new z -> y changes the parents (and chains) of y and its neighbours
    return changed


@rule(scope="nbr", cost="local")  # key a: b -> c at the neighbour b of a
def rule_r8(g: MixedGraph, focus: int = -1) -> bool:
    """R8: ``a -> b -> c`` (or ``a -o b -> c``) and ``a o-> c`` => ``a -> c``."""
    A, C, T, rA, rT, changed = g.A, g.C, g.T, g.rA, g.rT, False
    for a in bits(focus & g.full):
        if not T[a]:
            continue
        for c in bits(C[a] & rA[a]):  # a o-> c
            if T[a] & ~rT[a] & A[c] & rT[c]:  # b: tail at a on a - b, no tail at b, b -> c
                g.set(c, a, TAIL)
                changed = True
    return changed


@rule(scope="self", cost="path")  # key a: a o-> c (edge at a); the p.d. path can only be switched off
def rule_r9(g: MixedGraph, focus: int = -1) -> bool:
    """R9: ``a o-> c`` and an uncovered p.d. path ``<a, b, t, ..., c>`` with b, c non-adjacent => ``a -> c``."""
    C, rA, adjm, changed = g.C, g.rA, g.adjm, False
    for a in bits(focus & g.full):
        for c in bits(C[a] & rA[a]):  # a o-> c
            for b in bits(pd_next(g, a) & ~adjm[c] & ~(1 << c)):
                if uncovered_pd_path(g, a, b, c, 1 << a | 1 << b):
                    g.set(c, a, TAIL)
                    changed = True
                    break
    return changed


@rule(scope="self", cost="path")  # key c: a o-> c, b -> c <- t (edges at c); the p.d. paths only switch off
def rule_r10(g: MixedGraph, focus: int = -1) -> bool:
    """R10: ``a o-> c``, ``b -> c <- t``, uncovered p.d. paths a..b and a..t whose second vertices
    mu != omega are non-adjacent => ``a -> c``.

    Instances are keyed by c, whose edges carry every definite mark the rule needs.
    """
    A, rC, rT, adjm, changed = g.A, g.rC, g.rT, g.adjm, False
    for c in bits(focus & g.full):
        parent_mask = A[c] & rT[c]
        if not parent_mask & (parent_mask - 1):  # fewer than two parents
            continue
        parents = bits(parent_mask)
        for a in bits(A[c] & rC[c]):  # a o-> c
            start_mask = pd_next(g, a)
            # mu != omega must be non-adjacent, so only starts with a non-adjacent partner can help
            starts = [mu for mu in bits(start_mask) if start_mask & ~adjm[mu] & ~(1 << mu)]
            if not starts:
                continue
            first = [
                sum(1 << mu for mu in starts if uncovered_pd_path(g, a, mu, x, 1 << a | 1 << mu))
                for x in parents
            ]
            hit = any(
                first[j] & ~adjm[mu] & ~(1 << mu)
                for i in range(len(parents))
                for j in range(i + 1, len(parents))
                for mu in bits(first[i])
            )
            if hit:
                g.set(c, a, TAIL)
                changed = True
    return changed


@rule(scope="self", cost="local")  # key a: a -o b (the tail at a is on a - b)
def rule_no_selection(g: MixedGraph, focus: int = -1) -> bool:
    """R_SB (no selection bias): ``a -o b`` => ``a -> b``; a tail at both ends is a conflict."""
    T, rC, rT, changed = g.T, g.rC, g.rT, False
    for a in bits(focus & g.full):
        x = T[a] & (rC[a] | rT[a])  # b with a tail at a and a circle or a tail at b
        for b in bits(x):
            if g.m[a][b] == TAIL:
                raise Conflict(f"tail-tail edge {a}-{b} (selection bias)")
            g.set(a, b, ARROW)
            changed = True
    return changed


@rule(scope="all", cost="path")  # the walk's directed steps lie anywhere along it
def rule_long_r2(g: MixedGraph, focus: int = -1) -> bool:
    """R_A (long-range R2): ``y *-> x``, a circle at x on ``x - v``, and a walk ``x, v=v1, ..., vk=y``
    (k >= 2), potentially directed forward, whose every step ``vi -> vi+1`` is already directed or has
    ``vi-1``, ``vi+1`` non-adjacent => arrowhead at x on ``x - v``.

    A tail at x would make the walk directed (each unshielded step is forced by R1's argument), so x
    would be an ancestor of y while ``y *-> x``. The walk is :func:`~.predicates.forced_walk`.
    """
    A, C, rT, changed = g.A, g.C, g.rT, False
    for x in range(g.n):
        targets = A[x]
        if not targets:
            continue
        for v in bits(C[x] & ~rT[x] & ~targets):
            if forced_walk(g, x, v, targets):
                g.set(v, x, ARROW)
                changed = True
    return changed


@rule(scope="self", cost="local")  # key b: a *-> b -> d (edges at b)
def rule_triangle(g: MixedGraph, focus: int = -1) -> bool:
    """R_B (triangle): ``a *-> b -> d``, a, d non-adjacent, c adjacent to a, b, d with a circle at c on
    ``c - d`` => ``c -> d``.

    Sound: either ``a *-> c`` and R1 orients ``c -> d``; or ``c -> a``, so ``c *-> b``, and then either
    ``c -> b -> d`` (R2's cycle argument) or ``<a, b, c, d>`` is a discriminating path for c and R4' orients
    ``c -> d``.
    """
    A, T, rA, rC, adjm, changed = g.A, g.T, g.rA, g.rC, g.adjm, False
    for b in bits(focus & g.full):
        if not A[b]:
            continue
        for d in bits(rA[b] & T[b]):  # b -> d
            for a in bits(A[b] & ~adjm[d] & ~(1 << d)):
                for c in bits(rC[d] & adjm[a] & adjm[b]):
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
"""R1-R3, R4', R8-R10, R_SB: sound and complete for local background knowledge (Wang, Qin, Zhou 2022)."""

DEFAULT_RULES: tuple[Rule, ...] = (*BASE_RULES, rule_long_r2, rule_triangle)
"""The base rules plus R_A and R_B (used with depth-1 probing by default)."""

__all__ = [
    "BASE_RULES",
    "DEFAULT_RULES",
    "cost_of",
    "rule",
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
    "scope_of",
]
