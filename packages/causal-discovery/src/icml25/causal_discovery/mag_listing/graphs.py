"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the PAG and MAG
containers, with networkx and causal-learn conversions.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).

Mark convention (pcalg ``amat.pag``): ``marks[i, j]`` is the mark **at j** on the edge ``i - j``;
``0`` none, ``1`` circle (``o``), ``2`` arrowhead (``>``), ``3`` tail (``-``). ``marks[a, b] = 2,
marks[b, a] = 3`` is ``a -> b``. causal-learn's ``GeneralGraph.graph[i, j]`` is instead the mark **at i**
(TAIL=-1, ARROW=1, CIRCLE=2), i.e. the transpose with other codes; ``from_causallearn``/``to_causallearn``
convert, and ``pretty()`` prints edges unambiguously (``X1 o-> X2``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from icml25.causal_discovery.mag_listing.fci import valid_pag_reference
from icml25.causal_discovery.mag_listing.marks import (
    ARROW,
    CIRCLE,
    NONE,
    TAIL,
    reject_selection_bias,
    validate_marks,
)
from icml25.causal_discovery.mag_listing.predicates import is_mag_marks

_LEFT = {CIRCLE: "o", ARROW: "<", TAIL: "-"}
_RIGHT = {CIRCLE: "o", ARROW: ">", TAIL: "-"}
# causal-learn Endpoint values: TAIL=-1, NULL=0, ARROW=1, CIRCLE=2, STAR=3, TAIL_AND_ARROW=4, ...
_FROM_CL = {0: NONE, -1: TAIL, 1: ARROW, 2: CIRCLE}
_TO_CL = {NONE: 0, TAIL: -1, ARROW: 1, CIRCLE: 2}


class _MarkGraph:
    """Immutable, hashable endpoint-mark matrix; equality compares marks (names are labels only)."""

    __slots__ = ("_key", "_m", "names")
    _kind = "graph"

    def __init__(self, marks: object, names: Sequence[str] | None = None) -> None:
        arr = validate_marks(marks, "marks")
        reject_selection_bias(arr, "marks")
        self._init(arr, names)
        self._check()

    def _init(self, arr: np.ndarray, names: Sequence[str] | None) -> None:
        arr = np.array(arr, dtype=np.int8)
        arr.setflags(write=False)
        self._m = arr
        self._key = arr.tobytes()
        n = arr.shape[0]
        if names is None:
            names = [f"X{i + 1}" for i in range(n)]
        names = [str(x) for x in names]
        if len(names) != n or len(set(names)) != n:
            raise ValueError(f"names must be {n} distinct labels, got {names!r}")
        self.names = tuple(names)

    def _check(self) -> None:  # subclass hook
        pass

    @classmethod
    def _trusted(cls, marks: list[list[int]] | np.ndarray, names: Sequence[str] | None = None):
        obj = object.__new__(cls)
        obj._init(np.asarray(marks), names)
        return obj

    @property
    def marks(self) -> np.ndarray:
        """Read-only ``[n, n]`` ``int8`` mark matrix (``marks[i, j]``: mark at j on ``i - j``)."""
        return self._m

    @property
    def n_nodes(self) -> int:
        return int(self._m.shape[0])

    def to_list(self) -> list[list[int]]:
        return self._m.tolist()

    def edges(self) -> list[tuple[int, int, int, int]]:
        """``(i, j, mark_at_i, mark_at_j)`` for every edge, ``i < j``."""
        m = self._m
        return [(i, j, int(m[j, i]), int(m[i, j])) for i, j in zip(*np.nonzero(np.triu(m)), strict=True)]

    def n_circles(self) -> int:
        return int((self._m == CIRCLE).sum())

    def pretty(self) -> str:
        """One edge per line, e.g. ``X1 o-> X2``, ``X2 <-> X3``, ``X3 --> X4``."""
        lines = [f"{self.names[i]} {_LEFT[a]}-{_RIGHT[b]} {self.names[j]}" for i, j, a, b in self.edges()]
        return "\n".join(lines) if lines else "(no edges)"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._key == self._key  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self._kind, self._key))

    def __repr__(self) -> str:
        body = self.pretty().replace("\n", ", ")
        return f"{type(self).__name__}({self.n_nodes} nodes: {body})"

    # ---- conversions -------------------------------------------------------------------------------
    def to_networkx(self):
        """``nx.Graph`` whose nodes are ``names`` and whose edges carry ``marks={u: mark_at_u, v: mark_at_v}``."""
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from(self.names)
        for i, j, a, b in self.edges():
            u, v = self.names[i], self.names[j]
            g.add_edge(u, v, marks={u: a, v: b})
        return g

    @classmethod
    def from_networkx(cls, graph: object):
        """From ``to_networkx()``'s format, or from an ``nx.DiGraph`` (``u -> v`` edges; both directions = ``<->``)."""
        import networkx as nx

        if not isinstance(graph, (nx.Graph, nx.DiGraph)):
            raise TypeError(f"graph must be a networkx Graph or DiGraph, got {type(graph).__name__}")
        names = list(graph.nodes)
        idx = {v: k for k, v in enumerate(names)}
        m = np.zeros((len(names), len(names)), dtype=np.int8)
        if graph.is_directed():
            for u, v in graph.edges:
                i, j = idx[u], idx[v]
                m[i, j] = ARROW
                m[j, i] = ARROW if graph.has_edge(v, u) else TAIL
        else:
            for u, v, data in graph.edges(data=True):
                marks = data.get("marks")
                if not isinstance(marks, dict) or set(marks) != {u, v}:
                    raise ValueError(
                        f"graph edge ({u!r}, {v!r}) must carry marks={{u: mark, v: mark}}, got {marks!r}"
                    )
                m[idx[v], idx[u]] = marks[u]
                m[idx[u], idx[v]] = marks[v]
        return cls(m, [str(x) for x in names])

    def to_causallearn(self):
        """causal-learn ``GeneralGraph`` with the same edges (needs the ``[causallearn]`` extra)."""
        try:
            from causallearn.graph.Edge import Edge
            from causallearn.graph.Endpoint import Endpoint
            from causallearn.graph.GeneralGraph import GeneralGraph
            from causallearn.graph.GraphNode import GraphNode
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "to_causallearn needs causal-learn: pip install 'icml25-causal-discovery[causallearn]'"
            ) from exc
        ends = {TAIL: Endpoint.TAIL, ARROW: Endpoint.ARROW, CIRCLE: Endpoint.CIRCLE}
        nodes = [GraphNode(name) for name in self.names]
        g = GeneralGraph(nodes)
        for i, j, a, b in self.edges():
            g.add_edge(Edge(nodes[i], nodes[j], ends[a], ends[b]))
        return g

    @classmethod
    def from_causallearn(cls, graph: object):
        """From a causal-learn ``GeneralGraph`` (e.g. ``fci(...)[0]``); ``graph.graph[i, j]`` is the mark at i."""
        cl = getattr(graph, "graph", None)
        get_nodes = getattr(graph, "get_nodes", None)
        if not isinstance(cl, np.ndarray) or get_nodes is None:
            raise TypeError(f"graph must be a causal-learn GeneralGraph, got {type(graph).__name__}")
        bad = ~np.isin(cl, list(_FROM_CL))
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise ValueError(
                f"graph.graph must hold causal-learn endpoints TAIL=-1, ARROW=1, CIRCLE=2, got {cl[i, j]} at [{i}, {j}]"
            )
        m = np.vectorize(_FROM_CL.get)(cl).T if cl.size else np.zeros_like(cl)
        return cls(m.astype(np.int8), [n.get_name() for n in get_nodes()])


class PAG(_MarkGraph):
    """Partial ancestral graph: an ``[n, n]`` mark matrix with pcalg codes (see the module docstring).

    Construction checks the matrix form (``ValueError``) and rejects selection-bias marks
    (``ValueError``); whether it is a *valid* PAG is checked by :meth:`validate` (and by
    ``list_mags``), because that needs the FCI rules.
    """

    _kind = "pag"

    def validate(self) -> PAG:
        """Raise ``ValueError("not a valid PAG ...")`` unless this is the PAG of some MAG; return self."""
        valid_pag_reference(self.to_list())
        return self


class MAG(_MarkGraph):
    """Maximal ancestral graph without selection bias: edges ``->`` (codes 3/2) or ``<->`` (2/2).

    Construction raises ``ValueError`` if the matrix is not a MAG (circles, cycles, ``a <-> b`` with
    ``a`` an ancestor of ``b``, or an inducing path between non-adjacent vertices).
    """

    _kind = "mag"

    def _check(self) -> None:
        if (self._m == CIRCLE).any():
            raise ValueError("marks of a MAG must be arrowheads/tails only, got a circle (1)")
        if not is_mag_marks(self.to_list()):
            raise ValueError("marks must describe a MAG (ancestral and maximal), got a graph that is not")


def as_marks(graph: object, name: str, allow_circles: bool = False) -> list[list[int]]:
    """Mark list of a ``MAG``/``PAG``/matrix argument (validated)."""
    if isinstance(graph, _MarkGraph):
        return graph.to_list()
    arr = validate_marks(graph, name)
    reject_selection_bias(arr, name)
    if not allow_circles and (arr == CIRCLE).any():
        raise ValueError(f"{name} must be a MAG (marks 0, 2, 3 only), got a circle mark (1)")
    return arr.tolist()
