"""GAS: graph-assisted stitching for offline hierarchical RL — ICML 2025, P05: stage 2, the key graph.

From TDR embeddings f = φ(s) of the dataset states (all distances below are in TDR units ≈ steps):

1. Temporal-efficiency (TE) filter, per trajectory: state i is kept when the direction it moves in H steps,
   u = f[i+H] − f[i], agrees (cosine ≥ threshold) with the direction to the first future state at TDR
   distance ≥ H, w = f[k*] − f[i]. Wandering or noisy segments make the two disagree. The last H states of
   a trajectory are always kept (they have no H-step future).
2. TD-aware clustering (a leader algorithm in dataset order): a kept state opens a new cluster when its
   nearest leader is farther than H/2, otherwise it joins that leader; nodes are the cluster means.
   Because the metric is temporal distance, states on both sides of a wall are never merged, however close
   they are in raw coordinates — this is what makes the graph stitch fragments correctly.
3. Edges both ways between nodes within H, weighted by their φ distance; strongly connected components are
   then joined through their closest pairs, so every node can reach every other.
4. A goal is inserted as an extra node linked to every node within max(H, 1.2·min distance); one Dijkstra
   run from the goal gives every node's shortest path to it.
5. At execution, the agent starts from the path-node within H minimising (distance + path length) and aims
   at the farthest node of that path still within H (:func:`select_subgoal`).
"""

from __future__ import annotations

import logging
import warnings

import networkx as nx
import numpy as np

logger = logging.getLogger(__name__)


def _check_phi(phi: np.ndarray, name: str, dim: int | None = None) -> np.ndarray:
    raw = np.asarray(phi)
    if raw.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a real numeric array (n, d), got dtype {raw.dtype}")
    arr = raw.astype(np.float64)
    if arr.ndim != 2 or (dim is not None and arr.shape[1] != dim) or arr.shape[1] == 0:
        want = f"(n, {dim})" if dim is not None else "(n, d)"
        raise ValueError(f"{name} must be an array of shape {want}, got shape {np.shape(phi)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got NaN/inf")
    return arr


def _check_h(H: float) -> float:
    if isinstance(H, bool) or not isinstance(H, (int, float, np.integer, np.floating)):
        raise TypeError(f"H (temporal distance threshold, in steps) must be a positive number, got {H!r}")
    if not (H > 0 and np.isfinite(H)):
        raise ValueError(
            f"H (temporal distance threshold, in steps) must be a positive finite number, got {H!r}"
        )
    return float(H)


def te_filter(phi_traj: np.ndarray, H: int, thr: float) -> np.ndarray:
    """Indices of the temporally efficient states of one trajectory.

    Args:
        phi_traj: ``(T, d)`` TDR embeddings of one trajectory, in time order.
        H: temporal distance threshold (``way_steps``), a positive int.
        thr: cosine threshold in [-1, 1] (0.99 in the paper for mazes).

    Returns:
        ``(K,)`` int64 sorted local indices of the kept states (always including the last ``H``).
    """
    if isinstance(H, bool) or not isinstance(H, (int, np.integer)) or H <= 0:
        raise ValueError(f"H (way_steps) must be a positive int, got {H!r}")
    if isinstance(thr, bool) or not isinstance(thr, (int, float, np.floating)) or not -1.0 <= thr <= 1.0:
        raise ValueError(f"thr (te_threshold, a cosine) must be in [-1, 1], got {thr!r}")
    f = _check_phi(phi_traj, "phi_traj")
    keep = np.ones(len(f), dtype=bool)
    for i in range(len(f) - H):
        u = f[i + H] - f[i]
        future = f[i + 1 :]
        far = np.flatnonzero(np.linalg.norm(future - f[i], axis=1) >= H)
        w = (future[far[0]] if len(far) else f[-1]) - f[i]
        cos = u @ w / ((np.linalg.norm(u) + 1e-10) * (np.linalg.norm(w) + 1e-10))
        keep[i] = cos >= thr
    return np.flatnonzero(keep)


def te_filter_dataset(
    phi: np.ndarray, starts: np.ndarray, ends: np.ndarray, H: int, thr: float | None
) -> np.ndarray:
    """Global indices kept by :func:`te_filter` over all trajectories ``[starts[k], ends[k]]`` (inclusive).

    ``thr=None`` disables the filter (the ablation) and keeps every state. Warns when more than 95% of the
    states are removed (usually a badly trained TDR or a threshold too strict for the data).
    """
    f = _check_phi(phi, "phi")
    if thr is None:
        _check_h(H)
        return np.arange(len(f))
    if len(f) == 0:
        raise ValueError(f"phi must hold at least one state, got shape {f.shape}")
    bounds = []
    for name, b in (("starts", starts), ("ends", ends)):
        arr = np.asarray(b)
        if arr.dtype.kind not in "iu" or arr.ndim != 1 or arr.size == 0:
            raise ValueError(
                f"{name} must be a non-empty 1-D integer array of indices, got {arr.dtype} {arr.shape}"
            )
        bounds.append(arr)
    st_, en_ = bounds
    if st_.shape != en_.shape or (st_ < 0).any() or (en_ >= len(f)).any() or (en_ < st_).any():
        raise ValueError(
            f"starts and ends must have one shape and satisfy 0 <= starts <= ends < {len(f)}, got "
            f"starts={st_.tolist()[:5]} ends={en_.tolist()[:5]}"
        )
    if np.any(st_[1:] <= en_[:-1]):
        raise ValueError(
            "starts and ends must describe disjoint trajectories in order (starts[k+1] > ends[k])"
        )
    kept = [s + te_filter(f[s : e + 1], H, thr) for s, e in zip(st_, en_)]
    out = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    if len(f) and len(out) < 0.05 * len(f):
        warnings.warn(
            f"TE filter (te_threshold={thr}, H={H}) kept only {len(out)}/{len(f)} states (<5%); "
            "check the TDR training or lower te_threshold",
            stacklevel=2,
        )
    return out


def td_cluster(
    phi: np.ndarray, H: float, *, return_assignment: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TD-aware leader clustering of ``phi`` ``(N, d)`` (in the given order) with radius ``H / 2``.

    Returns:
        centres ``(n_nodes, d)`` (the mean of each cluster's points); with ``return_assignment=True`` also
        ``leaders`` ``(n_nodes,)`` (row of ``phi`` that opened each cluster) and ``labels`` ``(N,)``.
    """
    radius = _check_h(H) / 2.0
    f = _check_phi(phi, "phi")
    if len(f) == 0:
        raise ValueError("phi must contain at least one state to cluster, got 0 rows")
    leaders = np.empty_like(f)
    leader_rows = [0]
    leaders[0] = f[0]
    labels = np.zeros(len(f), dtype=np.int64)
    n = 1
    for i in range(1, len(f)):
        dist = np.linalg.norm(leaders[:n] - f[i], axis=1)
        j = int(np.argmin(dist))
        if dist[j] > radius:
            leaders[n] = f[i]
            leader_rows.append(i)
            labels[i] = n
            n += 1
        else:
            labels[i] = j
    counts = np.bincount(labels, minlength=n)[:, None]
    centres = np.zeros((n, f.shape[1]))
    np.add.at(centres, labels, f)
    centres /= counts
    if return_assignment:
        return centres, np.asarray(leader_rows, dtype=np.int64), labels
    return centres


def pairwise_distances(a: np.ndarray, b: np.ndarray, block: int = 4096) -> np.ndarray:
    """Euclidean distances ``(n, m)`` between rows of ``a`` ``(n, d)`` and ``b`` ``(m, d)``, in row blocks."""
    out = np.empty((len(a), len(b)))
    for i in range(0, len(a), block):
        out[i : i + block] = np.linalg.norm(a[i : i + block, None, :] - b[None, :, :], axis=-1)
    return out


def select_subgoal(path: np.ndarray, phi_s: np.ndarray, H: float) -> int:
    """Index of the farthest node along ``path`` ``(k, d)`` within ``H`` of ``phi_s`` ``(d,)`` (0 if none)."""
    H = _check_h(H)
    p = _check_phi(path, "path")
    if len(p) == 0:
        raise ValueError(f"path must hold at least one node, got shape {p.shape}")
    s = _check_phi(
        np.asarray(phi_s)[None] if np.ndim(phi_s) == 1 else np.full((2, 0), 0.0), "phi_s", p.shape[1]
    )
    within = np.flatnonzero(np.linalg.norm(p - s[0], axis=1) <= H)
    return int(within[-1]) if len(within) else 0


class KeyGraph:
    """Directed graph over TDR key nodes with goal insertion and shortest-path planning.

    Node ids ``0 .. n_base - 1`` are the key nodes; the goal, once added with :meth:`add_goal`, is node
    ``n_base``. Every node has attribute ``pos`` (its φ) and every edge ``weight`` (the φ distance).

    Example:
        >>> g = KeyGraph().build(np.array([[0.0, 0.0], [3.0, 0.0], [6.0, 0.0]]), H=4)
        >>> g.add_goal(np.array([8.0, 0.0]))
        3
        >>> g.plan(np.array([-1.0, 1.0])).tolist()
        [[0.0, 0.0], [3.0, 0.0], [6.0, 0.0], [8.0, 0.0]]
    """

    def __init__(self) -> None:
        self.H: float = 0.0
        self.nodes: np.ndarray = np.zeros((0, 0))
        self.graph: nx.DiGraph = nx.DiGraph()
        self.n_base = 0
        self.goal_idx: int | None = None
        self._paths: dict[int, list[int]] = {}
        self._lengths: dict[int, float] = {}

    def build(self, nodes: np.ndarray, H: float) -> KeyGraph:
        """Add the key nodes ``(n, d)``, edges both ways within ``H``, then join the SCCs. Returns self."""
        self.H = _check_h(H)
        self.nodes = _check_phi(nodes, "nodes").copy()
        if len(self.nodes) == 0:
            raise ValueError("nodes must contain at least one key node, got 0 rows")
        self.n_base = len(self.nodes)
        self.goal_idx, self._paths, self._lengths = None, {}, {}
        dist = pairwise_distances(self.nodes, self.nodes)
        np.fill_diagonal(dist, np.inf)
        g = nx.DiGraph()
        for i, pos in enumerate(self.nodes):
            g.add_node(i, pos=pos)
        rows, cols = np.nonzero(dist <= self.H)
        g.add_weighted_edges_from((int(i), int(j), float(dist[i, j])) for i, j in zip(rows, cols))
        # Join components: component 0 absorbs the rest one closest pair at a time.
        comps = [sorted(c) for c in nx.strongly_connected_components(g)]
        logger.debug("key graph: %d nodes, %d edges within H=%g, %d strongly connected components to join",
                     self.n_base, g.number_of_edges(), self.H, len(comps))  # fmt: skip
        main, others = comps[0], comps[1:]
        while others:
            rest = np.concatenate(others)
            sub = dist[np.ix_(main, rest)]
            a, b = np.unravel_index(int(np.argmin(sub)), sub.shape)
            u, v = int(main[a]), int(rest[b])
            g.add_edge(u, v, weight=float(dist[u, v]))
            g.add_edge(v, u, weight=float(dist[u, v]))
            k = next(k for k, c in enumerate(others) if v in c)
            main = main + others.pop(k)
        self.graph = g
        return self

    def add_goal(self, phi_g: np.ndarray) -> int:
        """Insert the goal ``(d,)`` (replacing a previous one), run Dijkstra from it; returns its node id."""
        if self.n_base == 0:
            raise ValueError("call build(nodes, H) before add_goal")
        g_pos = np.asarray(phi_g, dtype=np.float64)
        if g_pos.shape != (self.nodes.shape[1],) or not np.all(np.isfinite(g_pos)):
            raise ValueError(
                f"phi_g must be a finite vector of shape ({self.nodes.shape[1]},), got {np.shape(phi_g)}"
            )
        self.clear_goal()
        dist = np.linalg.norm(self.nodes - g_pos, axis=1)
        if dist.min() > self.H:
            warnings.warn(
                f"goal is farther than H={self.H:g} from every key node (nearest {dist.min():.3g}); "
                "connecting it through the 1.2·min-distance rule",
                stacklevel=2,
            )
        radius = max(self.H, 1.2 * float(dist.min()))
        gid = self.n_base
        self.graph.add_node(gid, pos=g_pos)
        for i in np.flatnonzero(dist <= radius):
            self.graph.add_edge(int(i), gid, weight=float(dist[i]))
            self.graph.add_edge(gid, int(i), weight=float(dist[i]))
        self.nodes = np.vstack([self.nodes, g_pos])
        self.goal_idx = gid
        lengths, paths = nx.single_source_dijkstra(self.graph, gid, weight="weight")
        # Edges come in symmetric pairs, so the reversed path from the goal is a path to the goal.
        self._paths = {n: p[::-1] for n, p in paths.items() if n != gid}
        self._lengths = {n: float(lengths[n]) for n in self._paths}
        return gid

    def clear_goal(self) -> None:
        """Remove the goal node and its paths."""
        if self.goal_idx is not None:
            self.graph.remove_node(self.goal_idx)
            self.nodes = self.nodes[: self.n_base]
        self.goal_idx, self._paths, self._lengths = None, {}, {}

    def plan_indices(self, phi_s: np.ndarray, force_closest: bool = True) -> list[int] | None:
        """Node ids of the path from the best start node near ``phi_s`` ``(d,)`` to the goal.

        The start minimises (distance to ``phi_s`` + path length) among path nodes within ``H``; when none is
        within ``H`` the closest node is used (``force_closest``) or ``None`` is returned.
        """
        if self.goal_idx is None:
            raise ValueError("call add_goal(phi_g) before planning")
        s = np.asarray(phi_s, dtype=np.float64)
        if s.shape != (self.nodes.shape[1],):
            raise ValueError(f"phi_s must have shape ({self.nodes.shape[1]},), got {np.shape(phi_s)}")
        keys = np.fromiter(self._paths, dtype=np.int64)
        d0 = np.linalg.norm(self.nodes[keys] - s, axis=1)
        cand = np.flatnonzero(d0 <= self.H)
        if len(cand) == 0:
            if not force_closest:
                return None
            cand = np.array([int(np.argmin(d0))])
        total = d0[cand] + np.array([self._lengths[int(k)] for k in keys[cand]])
        return list(self._paths[int(keys[cand[int(np.argmin(total))]])])

    def plan(self, phi_s: np.ndarray, force_closest: bool = True) -> np.ndarray | None:
        """φ positions ``(k, d)`` of the planned path from near ``phi_s`` to the goal (last row = goal)."""
        idx = self.plan_indices(phi_s, force_closest)
        return None if idx is None else self.nodes[idx]

    def path_length(self, node: int) -> float:
        """Shortest-path length from ``node`` to the goal (TDR units)."""
        return self._lengths[node]

    def to_networkx(self) -> nx.DiGraph:
        """The underlying ``networkx.DiGraph`` (node attr ``pos``, edge attr ``weight``), for inspection."""
        return self.graph
