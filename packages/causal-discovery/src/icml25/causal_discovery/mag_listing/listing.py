"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the listing of the
MAGs of a PAG by singleton background knowledge, and ``apply_background_knowledge``.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).

``List(G)``: close G under the orientation rules (and depth-1 probing); with no circle left output it;
otherwise pick one circle, and recurse on G + arrowhead and G + tail. With locally complete rules every
branch holds a MAG (no dead ends), so the delay is a polynomial number of closures.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from icml25.causal_discovery.mag_listing.graphs import MAG, PAG
from icml25.causal_discovery.mag_listing.mag import reference_mag
from icml25.causal_discovery.mag_listing.marks import (
    ARROW,
    CIRCLE,
    TAIL,
    Conflict,
    InconsistentBackgroundKnowledge,
    parse_bk_mark,
)
from icml25.causal_discovery.mag_listing.mixed_graph import MixedGraph, Rule
from icml25.causal_discovery.mag_listing.predicates import equivalent_marks, is_mag_marks
from icml25.causal_discovery.mag_listing.probing import ProbeCache, close
from icml25.causal_discovery.mag_listing.rules import DEFAULT_RULES


@dataclass
class ListingStats:
    """Filled in by ``list_mags(..., stats=ListingStats())`` while the generator runs.

    Attributes:
        delays: CPU seconds (``time.process_time``) of listing work before each output (the first entry is
            the time to the first MAG); time spent by the consumer between outputs is excluded, and so is
            time the process spends descheduled (other processes on a shared machine).
        closures: the machine-independent delay: closure calls (one per node of the listing tree: rules to
            a fixpoint, conflict check and, with ``probing``, depth-1 probing) since the previous output,
            one entry per output (the first counts from the start). Without dead ends a binary tree of
            depth <= c (circles of the PAG) needs at most c + 1 of them.
        rule_passes: rule saturations (``apply_rules`` calls, the probe closures included) in the same
            intervals: the work inside the closures.
        closures_after_last, rule_passes_after_last: the same counts after the last output, once the
            listing has run to its end (``None`` while it has not).
        n_outputs: MAGs emitted.
        nodes: recursion nodes visited (root included).
        dead_ends: branches that emitted no MAG (0 for a locally complete rule set).
        invalid_leaves: fully oriented leaves rejected by the safety net (``verify=True``).
        checked_nodes, incomplete_nodes: with ``check=True``, nodes compared with the brute-force oracle and
            nodes whose closure differs from the invariant marks of the MAGs agreeing with them.
    """

    delays: list[float] = field(default_factory=list)
    n_outputs: int = 0
    nodes: int = 0
    dead_ends: int = 0
    invalid_leaves: int = 0
    checked_nodes: int = 0
    incomplete_nodes: int = 0
    closures: list[int] = field(default_factory=list)
    rule_passes: list[int] = field(default_factory=list)
    closures_after_last: int | None = None
    rule_passes_after_last: int | None = None

    @property
    def time_to_first(self) -> float:
        return self.delays[0] if self.delays else float("nan")

    def delay_ratio(self) -> float:
        """max delay / median delay over the outputs after the first."""
        d = self.delays[1:]
        return float(max(d) / np.median(d)) if len(d) >= 2 and np.median(d) > 0 else float("nan")

    def max_closure_delay(self) -> int:
        """Most closure calls before an output, since the previous one, or after the last one when the
        listing ran to its end (0 before anything was counted)."""
        tail = [] if self.closures_after_last is None else [self.closures_after_last]
        return max(self.closures + tail, default=0)


def _check_pag(pag: object, strict: bool) -> bool:
    if not isinstance(pag, PAG):
        raise TypeError(
            f"pag must be a PAG (see PAG.from_causallearn / PAG(marks)), got {type(pag).__name__}"
        )
    try:
        pag.validate()
    except ValueError:
        if strict:
            raise
        warnings.warn("pag is not a valid PAG; listing nothing (strict=False)", stacklevel=3)
        return False
    return True


class _Oracle:
    """Brute-force MEC as an array, for the per-node local-completeness check."""

    def __init__(self, pag: PAG) -> None:
        from icml25.causal_discovery.mag_listing.bruteforce import list_mags_bruteforce

        self.mags = np.stack([g.marks for g in list_mags_bruteforce(pag)])  # [K, n, n]

    def complete(self, m: list[list[int]], idx: np.ndarray) -> bool:
        """Do the definite marks of ``m`` equal the invariant marks of the MAGs ``idx``?"""
        sub = self.mags[idx]
        same = (sub == sub[0]).all(axis=0)
        inv = np.where(same, sub[0], np.where(sub[0] > 0, CIRCLE, 0))
        return bool((inv == np.asarray(m)).all())


def _most_informative(g: MixedGraph, cache: ProbeCache, default: tuple[int, int]) -> tuple[int, int]:
    """The circle whose probe closure with an arrowhead (the first child) leaves the fewest circles.

    Why: the first child of every node lies on the way to the next output; the fewer circles it keeps,
    the fewer values its probing has to establish and the shorter the descent.
    """
    best, fewest = default, None
    for (a, b, value), h in cache.results.items():
        if value != ARROW or g.m[a][b] != CIRCLE or not h.contains(g):
            continue
        left = sum(row.bit_count() for row in h.rC)
        if fewest is None or left < fewest or (left == fewest and (a, b) < best):
            best, fewest = (a, b), left
    return best


def list_mags(
    pag: PAG,
    rules: Sequence[Rule] = DEFAULT_RULES,
    *,
    probing: bool = True,
    verify: bool = True,
    check: bool = False,
    order: str = "informative",
    seed: int | None = None,
    stats: ListingStats | None = None,
    strict: bool = True,
) -> Iterator[MAG]:
    """Yield every MAG represented by ``pag`` exactly once (a generator; the first MAG comes fast).

    Args:
        pag: a valid PAG without selection-bias marks (``ValueError("not a valid PAG ...")`` otherwise).
        rules: orientation rules applied to a fixpoint at every node (``DEFAULT_RULES``: R1-R3, R4', R8-R10,
            R_SB, R_A, R_B).
        probing: depth-1 probing after the rules (needed for local completeness: without it
            the rules leave forced circles on e.g. the second regression PAG of the tests). Probe closures are
            kept as witnesses down the tree (:class:`~.rules.ProbeCache`), so a value already shown
            possible is not re-closed, and a child that is a probed branch starts from its probe closure.
        verify: safety net: check every leaf with ``is_mag`` and Markov equivalence to a reference MAG
            (rejected leaves are counted in ``stats.invalid_leaves``, never emitted).
        check: compare every node's closure with the brute-force oracle (exponential; counts
            ``stats.incomplete_nodes``); warns for more than 20 nodes.
        order: which circle to branch on: ``"index"`` (lowest ``(i, j)``), ``"random"`` (with ``seed``) or
            ``"informative"`` (the circle whose arrowhead closure, known from probing, orients the most
            marks; lowest index when probing computed none).
        stats: a :class:`ListingStats` to fill in.
        strict: if False, an invalid PAG gives an empty listing with a warning instead of ``ValueError``.
    """
    if order not in ("index", "random", "informative"):
        raise ValueError(f"order must be 'index', 'random' or 'informative', got {order!r}")
    if not _check_pag(pag, strict):
        return
    if check and pag.n_nodes > 20:
        warnings.warn(
            "check=True runs the brute-force oracle, which is exponential in the circles", stacklevel=2
        )
    st = stats if stats is not None else ListingStats()
    rng = random.Random(seed)
    ref = reference_mag(pag).to_list()
    oracle = _Oracle(pag) if check else None
    names = pag.names
    clock = [time.process_time()]
    work = [0, 0]  # closure calls, rule passes since the last output

    def leaf_check(m: list[list[int]]) -> bool:
        return is_mag_marks(m) and equivalent_marks(m, ref)

    def visit(g: MixedGraph, idx: np.ndarray | None, closed: bool, cache: ProbeCache) -> Iterator[MAG]:
        st.nodes += 1
        work[0] += 1
        try:
            close(g, rules, probing, cache, closed=closed)
        except Conflict:
            return
        finally:
            work[1] += cache.passes
        if oracle is not None and idx is not None and len(idx):
            st.checked_nodes += 1
            if not oracle.complete(g.m, idx):
                st.incomplete_nodes += 1
        circles = g.circles()
        if not circles:
            if verify and not leaf_check(g.m):
                st.invalid_leaves += 1
                return
            now = time.process_time()
            st.delays.append(now - clock[0])
            st.n_outputs += 1
            st.closures.append(work[0])
            st.rule_passes.append(work[1])
            work[0] = work[1] = 0
            yield MAG._trusted(g.m, names)
            clock[0] = time.process_time()
            return
        if order == "index":
            a, b = circles[0]
        elif order == "random":
            a, b = rng.choice(circles)
        else:
            a, b = _most_informative(g, cache, circles[0])
        for value in (ARROW, TAIL):
            # The probe of this very branch already closed G + value: start the child from it.
            done = cache.results.get((a, b, value))
            if done is not None and done.contains(g):
                child, child_closed = done.copy(), True
            else:
                child, child_closed = g.copy(), False
                child.set(a, b, value)
            sub = None if idx is None else idx[oracle.mags[idx, a, b] == value]  # type: ignore[union-attr]
            before = st.n_outputs
            yield from visit(child, sub, child_closed, cache.for_child())
            if st.n_outputs == before:
                st.dead_ends += 1

    root_idx = None if oracle is None else np.arange(len(oracle.mags))
    yield from visit(MixedGraph(pag.to_list()), root_idx, False, ProbeCache())
    st.closures_after_last, st.rule_passes_after_last = work


def apply_background_knowledge(
    pag: PAG,
    bk: Mapping[tuple[int, int], object],
    rules: Sequence[Rule] = DEFAULT_RULES,
    *,
    probing: bool = True,
) -> PAG:
    """Close ``pag`` under background knowledge ``bk = {(i, j): "arrow" | "tail"}`` (the mark at j on ``i - j``).

    The marks are added one at a time, each followed by the closure, exactly as along a branch of the
    listing tree; so with locally complete rules the result equals the invariant marks of the MAGs of
    ``pag`` that satisfy ``bk``. Returns a :class:`PAG`-typed partial mixed graph (same mark codes).

    Raises ``InconsistentBackgroundKnowledge`` if no MAG of ``pag`` satisfies ``bk``, ``ValueError`` for a
    pair that is not an edge or an unknown mark, ``TypeError`` if ``bk`` is not a mapping.
    """
    _check_pag(pag, strict=True)
    if not isinstance(bk, Mapping):
        raise TypeError(f"bk must be a mapping {{(i, j): 'arrow' | 'tail'}}, got {type(bk).__name__}")
    n = pag.n_nodes
    items = []
    for key, value in bk.items():
        if not (
            isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, (int, np.integer)) for k in key)
        ):
            raise ValueError(f"bk keys must be (i, j) integer pairs, got {key!r}")
        i, j = int(key[0]), int(key[1])
        if not (0 <= i < n and 0 <= j < n) or pag.marks[i, j] == 0:
            raise ValueError(
                f"bk key {key!r} must be an edge i - j of the PAG (0 <= i, j < {n}), got a non-edge"
            )
        items.append((i, j, parse_bk_mark(value, f"bk[{key!r}]")))
    g = MixedGraph(pag.to_list())
    try:
        close(g, rules, probing)
        for i, j, mark in items:
            if g.m[i][j] == mark:
                continue
            if g.m[i][j] != CIRCLE:
                raise Conflict(f"mark at {j} on {i}-{j} is already {g.m[i][j]}")
            g.set(i, j, mark)
            close(g, rules, probing)
    except Conflict as exc:
        raise InconsistentBackgroundKnowledge(f"bk is inconsistent with the PAG: {exc}") from exc
    return PAG._trusted(g.m, pag.names)


__all__ = ["ListingStats", "apply_background_knowledge", "list_mags"]
