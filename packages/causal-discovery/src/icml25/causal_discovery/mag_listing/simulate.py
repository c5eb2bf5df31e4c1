"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: random instances
for the tests and the reproduction: DAG with latents -> MAG -> PAG.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).
"""

from __future__ import annotations

import numpy as np

from icml25.causal_discovery.mag_listing.graphs import MAG, PAG
from icml25.causal_discovery.mag_listing.mag import pag_from_mag
from icml25.causal_discovery.mag_listing.marks import ARROW, TAIL


def _d_separated(parents: list[list[int]], anc_set: set[int], a: int, b: int, z: set[int]) -> bool:
    """d-separation of a, b given z (z inside the ancestral set ``anc_set`` of {a, b}) by moralisation."""
    nb: dict[int, set[int]] = {v: set() for v in anc_set}
    for v in anc_set:
        ps = parents[v]
        for p in ps:
            nb[v].add(p)
            nb[p].add(v)
        for i, p in enumerate(ps):
            for q in ps[i + 1 :]:
                nb[p].add(q)
                nb[q].add(p)
    seen, stack = {a}, [a]
    while stack:
        v = stack.pop()
        if v == b:
            return False
        for u in nb[v]:
            if u not in seen and u not in z:
                seen.add(u)
                stack.append(u)
    return True


def mag_from_dag(adjacency: np.ndarray, latent: list[int] | np.ndarray) -> MAG:
    """MAG over the observed vertices of a DAG (``adjacency[i, j] = 1``: ``i -> j``) with ``latent`` removed.

    ``a ~ b`` iff no set of observed vertices d-separates them, tested with ``An({a, b}) ∩ O \\ {a, b}``
    (enough for ancestral graphs); oriented ``a -> b`` if ``a`` is an ancestor of ``b``, else ``<->``.
    """
    adjacency = np.asarray(adjacency, dtype=bool)
    n_all = adjacency.shape[0]
    parents = [list(np.nonzero(adjacency[:, v])[0]) for v in range(n_all)]
    anc = [set() for _ in range(n_all)]  # ancestors including self
    for v in range(n_all):
        stack = [v]
        while stack:
            u = stack.pop()
            if u not in anc[v]:
                anc[v].add(u)
                stack.extend(parents[u])
    lat = set(int(x) for x in latent)
    obs = [v for v in range(n_all) if v not in lat]
    n = len(obs)
    m = np.zeros((n, n), dtype=np.int8)
    for i in range(n):
        for j in range(i + 1, n):
            a, b = obs[i], obs[j]
            anc_ab = anc[a] | anc[b]
            z = (anc_ab - lat) - {a, b}
            if _d_separated(parents, anc_ab, a, b, z):
                continue
            if a in anc[b]:
                m[i, j], m[j, i] = ARROW, TAIL
            elif b in anc[a]:
                m[i, j], m[j, i] = TAIL, ARROW
            else:
                m[i, j] = m[j, i] = ARROW
    return MAG(m)


def random_mag(n_observed: int, n_latent: int, p: float, rng: np.random.Generator) -> MAG:
    """Random DAG over ``n_observed + n_latent`` vertices (edge probability ``p``), latents marginalised."""
    n_all = n_observed + n_latent
    perm = rng.permutation(n_all)
    adjacency = np.zeros((n_all, n_all), dtype=bool)
    for i in range(n_all):
        for j in range(i + 1, n_all):
            if rng.random() < p:
                adjacency[perm[i], perm[j]] = True
    latent = rng.choice(n_all, size=n_latent, replace=False)
    return mag_from_dag(adjacency, latent)


def random_instance(
    n_observed: int, n_latent: int, p: float, rng: np.random.Generator, max_edges: int | None = None
) -> tuple[MAG, PAG]:
    """A random (MAG, PAG) pair; redraws until the skeleton has at most ``max_edges`` edges."""
    while True:
        mag = random_mag(n_observed, n_latent, p, rng)
        if max_edges is None or int((mag.marks > 0).sum()) // 2 <= max_edges:
            return mag, pag_from_mag(mag)
