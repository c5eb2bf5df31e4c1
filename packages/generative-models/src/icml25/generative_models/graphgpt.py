"""GraphGPT: Generative Pre-trained Graph Eulerian Transformer — ICML 2025, P29: serialization, SMTP/NTP, heads.

Zhao, Ren, Li, Liu, He & Xu, "GraphGPT: Generative Pre-trained Graph Eulerian Transformer", ICML 2025
(arXiv 2401.00529; official code ``alibaba/graph-gpt``). A graph is written as a token sequence by walking an
Eulerian path of the graph made (semi-)Eulerian by duplicating a minimum set of its edges (``nx.eulerize``),
so that every edge appears and consecutive nodes are adjacent: the sequence is exactly reversible. Nodes are
re-indexed by order of first appearance (cyclically from a random start in ``[0, node_scope)`` by default),
indices may be split into two base-``scope_base`` tokens, discrete node/edge attributes become extra tokens
and connected components are joined by a ``<jump>`` token. A Llama-style transformer is pre-trained on the
sequences by next-token prediction (NTP, causal) or scheduled masked-token prediction (SMTP: a per-sequence
mask ratio ``1 - u**p`` with ``u ~ U[u_min, u_max]``, bidirectional attention), then fine-tuned for graph-,
node- or edge-level tasks from the hidden states of the ``<eos>`` token or of the target nodes' tokens.

Public API:

- :class:`SerializeConfig`, :func:`graph_to_sequence`, :func:`sequence_to_graph` (inverse up to the node
  re-indexing), :func:`ego_subgraph` (the subgraph around a node or an edge, for node/edge tasks);
- :class:`GraphTokenizer` (vocabulary, ``encode``/``decode``/``batch``, ``save_pretrained``/``from_pretrained``);
- :class:`GraphGPTModel` (pure-torch Llama block: RMSNorm, RoPE, SwiGLU; ``backend="hf"`` runs a
  ``transformers.LlamaModel`` instead, see :mod:`icml25.generative_models.graphgpt_hf`);
- :func:`smtp_mask`, :func:`smtp_loss` (reduced by :func:`smtp_reduce`), :func:`ntp_loss`, :func:`pretrain`
  (optimiser and schedule: :func:`pretrain_optimizer`, :func:`warmup_decay_factor`);
- :class:`GraphGPTClassifier` (scikit-learn style ``pretrain`` / ``fit`` / ``predict`` / ``predict_proba``
  for ``task="graph" | "node" | "edge"``).

networkx (a dependency of torch) is the graph format in and out.
"""

from __future__ import annotations

import ast
import json
import math
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import networkx as nx
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml25.kernels.checks import check_float, check_int
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "GraphGPTClassifier",
    "GraphGPTModel",
    "GraphTokenizer",
    "SerializeConfig",
    "ego_subgraph",
    "graph_to_sequence",
    "ntp_loss",
    "pretrain",
    "pretrain_optimizer",
    "sequence_to_graph",
    "smtp_loss",
    "smtp_mask",
    "smtp_reduce",
    "warmup_decay_factor",
]

PAD, MASK, BOS, EOS, JUMP, EDGE = "<pad>", "<mask>", "<bos>", "<eos>", "<jump>", "<edge_bi>"
UNK_NA, UNK_EA = "<na:?>", "<ea:?>"
SPECIALS = (PAD, MASK, BOS, EOS, UNK_NA, UNK_EA, JUMP, EDGE)
"""Special tokens, in vocabulary order (``<edge_bi>``: the undirected edge-type token; ``<na:?>`` /
``<ea:?>``: an unknown node / edge attribute value, decoded as None)."""
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (64, 2, 4),
    "mini": (256, 4, 8),
    "small": (512, 8, 8),
    "base": (768, 12, 12),
}
"""(hidden, layers, heads) of the named model sizes (the official code's ``mini`` is 256 x 4, base 768 x 12)."""


# ------------------------------------------------------------------------------------- serialization
@dataclass(frozen=True)
class SerializeConfig:
    """How a graph becomes tokens (the official code's tokenization config).

    Attributes:
        node_scope: number of node-index values S (a graph may have at most S nodes; official default 256).
        scope_base: when set, an index i is written as the two tokens ``"{i // b}*{b}"`` and ``"{i % b}"``
            (smaller vocabulary); None writes one token ``"{i}"``.
        reindex: ``"seq"`` (0, 1, 2, ... by first appearance), ``"cyclic"`` (start uniform in [0, S),
            +1 mod S; the official default) or ``"random"`` (distinct uniform indices).
        edge_types: write ``<edge_bi>`` between adjacent nodes (the official structure-only configs remove
            it: with one edge type the token is deterministic).
        allow_multi: collapse the parallel edges of a multigraph (with a warning) instead of raising.
        strict: raise on attribute values outside a :class:`GraphTokenizer`'s vocabulary instead of mapping
            them to ``<na:?>`` / ``<ea:?>`` with a warning.
    """

    node_scope: int = 256
    scope_base: int | None = None
    reindex: Literal["seq", "cyclic", "random"] = "cyclic"
    edge_types: bool = False
    allow_multi: bool = False
    strict: bool = False

    def __post_init__(self) -> None:
        check_int(self.node_scope, "node_scope", low=1)
        if self.scope_base is not None:
            check_int(self.scope_base, "scope_base", low=2, high=self.node_scope)
        if self.reindex not in ("seq", "cyclic", "random"):
            raise ValueError(f"reindex must be 'seq', 'cyclic' or 'random', got {self.reindex!r}")

    def index_tokens(self, i: int) -> list[str]:
        """The token(s) of node index ``i``."""
        if self.scope_base is None:
            return [str(i)]
        b = self.scope_base
        return [f"{i // b}*{b}", str(i % b)]

    def all_index_tokens(self) -> list[str]:
        """Every node-index token of this scope, in vocabulary order."""
        if self.scope_base is None:
            return [str(i) for i in range(self.node_scope)]
        b = self.scope_base
        highs = [f"{q}*{b}" for q in range((self.node_scope - 1) // b + 1)]
        return highs + [str(r) for r in range(b)]


def _attr_token(kind: str, value: Any, name: str) -> str:
    text = repr(value)
    try:
        ok = ast.literal_eval(text) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        ok = False
    if not ok:
        raise TypeError(
            f"{name} values must be Python literals (int, float, str, bool, tuple, None) so that the "
            f"sequence decodes to the same value; got {type(value).__name__} {text[:40]}"
        )
    return f"<{kind}:{text}>"


def _check_graph(G: Any, cfg: SerializeConfig, name: str = "G") -> nx.Graph:
    if not isinstance(G, nx.Graph):
        raise TypeError(f"{name} must be a networkx graph, got {type(G).__name__}")
    if G.number_of_nodes() == 0:
        raise ValueError(f"{name} must have at least one node, got an empty graph")
    if G.is_multigraph():
        if not cfg.allow_multi:
            raise ValueError(
                f"{name} is a multigraph with parallel edges; pass nx.Graph({name}) or "
                "SerializeConfig(allow_multi=True) to collapse them"
            )
        warnings.warn(f"{name}: collapsing parallel edges of a multigraph (allow_multi=True)", stacklevel=3)
        G = nx.DiGraph(G) if G.is_directed() else nx.Graph(G)
    if G.is_directed():
        warnings.warn(
            f"{name} is directed: serializing its undirected version (edge direction is not encoded)",
            stacklevel=3,
        )
        G = G.to_undirected()
    loops = nx.number_of_selfloops(G)
    if loops:
        raise ValueError(f"{name} must have no self-loops (an Eulerian walk cannot encode them), got {loops}")
    if G.number_of_nodes() > cfg.node_scope:
        raise ValueError(
            f"{name} has {G.number_of_nodes()} nodes but node_scope={cfg.node_scope}: node indices would "
            "collide; increase SerializeConfig.node_scope (with scope_base to keep the vocabulary small) or "
            "serialize subgraphs (ego_subgraph)"
        )
    return G


def _component_walk(G: nx.Graph, nodes: list, start: Hashable | None, rng: np.random.Generator) -> list:
    """A walk of the component ``nodes`` that covers every edge, consecutive nodes adjacent."""
    if len(nodes) == 1:
        return list(nodes)
    perm = [nodes[i] for i in rng.permutation(len(nodes))]  # permute_nodes: a different walk per draw
    edges = list(G.subgraph(nodes).edges())
    H = nx.MultiGraph()
    H.add_nodes_from(perm)
    for k in rng.permutation(len(edges)):
        u, v = edges[k]
        H.add_edge(*((u, v) if rng.random() < 0.5 else (v, u)))
    odd = [v for v in perm if H.degree(v) % 2]
    if len(odd) == 2 and (start is None or start in odd) and rng.random() < 0.5:
        src = start if start is not None else odd[int(rng.integers(2))]
        path = list(nx.eulerian_path(H, source=src))
        walk = [path[0][0]] + [v for _, v in path]
    else:
        if odd:
            H = nx.eulerize(H)  # duplicates existing edges only (shortest paths between odd nodes)
        src = start if start is not None else perm[int(rng.integers(len(perm)))]
        circuit = list(nx.eulerian_circuit(H, source=src))
        walk = [circuit[0][0]] + [v for _, v in circuit]
    # shorten_path: stop at the first prefix that covers every distinct edge
    need = {frozenset(e) for e in edges}
    seen: set[frozenset] = set()
    for k in range(1, len(walk)):
        seen.add(frozenset((walk[k - 1], walk[k])))
        if len(seen) == len(need):
            return walk[: k + 1]
    return walk


def _serialize(
    G: Any,
    cfg: SerializeConfig,
    node_attr: str | None,
    edge_attr: str | None,
    start: Hashable | None,
    seed: int | None,
) -> tuple[list[str], dict[Hashable, int]]:
    """Tokens and, for every node of ``G``, the position of its first index token."""
    if not isinstance(cfg, SerializeConfig):
        raise TypeError(f"cfg must be a SerializeConfig, got {type(cfg).__name__}")
    G = _check_graph(G, cfg)
    if start is not None and start not in G:
        raise ValueError(f"start must be a node of G, got {start!r}")
    for attr, what in ((node_attr, "node_attr"), (edge_attr, "edge_attr")):
        if attr is not None and not isinstance(attr, str):
            raise TypeError(f"{what} must be an attribute name (str) or None, got {type(attr).__name__}")
    if node_attr is not None:
        missing = [v for v, d in G.nodes(data=True) if node_attr not in d]
        if missing:
            raise ValueError(
                f"node_attr={node_attr!r} is missing on {len(missing)} node(s), e.g. {missing[0]!r}"
            )
    if edge_attr is not None:
        missing = [(u, v) for u, v, d in G.edges(data=True) if edge_attr not in d]
        if missing:
            raise ValueError(
                f"edge_attr={edge_attr!r} is missing on {len(missing)} edge(s), e.g. {missing[0]!r}"
            )
    rng = np.random.default_rng(seed)
    comps = [list(c) for c in nx.connected_components(G)]
    comps = [comps[i] for i in rng.permutation(len(comps))]
    if start is not None:
        comps.sort(key=lambda c: start not in c)  # the component of ``start`` first (stable)
    walks = [_component_walk(G, c, start if start in c else None, rng) for c in comps]

    order: dict[Hashable, int] = {}
    for w in walks:
        for v in w:
            order.setdefault(v, len(order))
    n, S = len(order), cfg.node_scope
    if cfg.reindex == "seq":
        index = np.arange(n)
    elif cfg.reindex == "cyclic":
        index = (int(rng.integers(S)) + np.arange(n)) % S
    else:
        index = rng.permutation(S)[:n]

    tokens: list[str] = []
    first_pos: dict[Hashable, int] = {}
    for c, w in enumerate(walks):
        if c:
            tokens.append(JUMP)
        for k, v in enumerate(w):
            if k:
                if cfg.edge_types:
                    tokens.append(EDGE)
                if edge_attr is not None:
                    tokens.append(_attr_token("ea", G.edges[w[k - 1], v][edge_attr], "edge_attr"))
            if v not in first_pos:
                first_pos[v] = len(tokens)
                tokens.extend(cfg.index_tokens(int(index[order[v]])))
                if node_attr is not None:
                    tokens.append(_attr_token("na", G.nodes[v][node_attr], "node_attr"))
            else:
                tokens.extend(cfg.index_tokens(int(index[order[v]])))
    return tokens, first_pos


def graph_to_sequence(
    G: nx.Graph,
    cfg: SerializeConfig | None = None,
    *,
    node_attr: str | None = None,
    edge_attr: str | None = None,
    start: Hashable | None = None,
    seed: int | None = None,
) -> list[str]:
    """Serialize ``G`` along an Eulerian walk (the official ``graph2path_v2``).

    Components are shuffled and joined by ``<jump>``; a non-Eulerian component is eulerized (edges duplicated)
    unless it is semi-Eulerian and a fair coin picks the open Eulerian path; the walk starts at ``start`` (else
    a random node) and is cut at the first prefix covering every edge. Layout: ``idx [na] ([<edge_bi>] [ea]
    idx [na])* (<jump> ...)*``; the node-attribute token follows a node's first appearance only, the
    edge-attribute token follows every traversal. ``seed`` draws the walk and re-indexing (vary it per sample
    for augmentation); the same graph and seed give the same sequence.

    Args:
        G: an undirected ``nx.Graph`` (a ``DiGraph`` is serialized undirected, with a warning; multigraphs
            raise unless ``cfg.allow_multi``; self-loops raise; at most ``cfg.node_scope`` nodes).
        cfg: :class:`SerializeConfig` (default ``SerializeConfig()``).
        node_attr / edge_attr: names of discrete attributes to write as tokens (Python literals).
        start: first node of the walk.
        seed: seed of the walk, component order and re-indexing.

    Returns:
        the token list (length ``|walk| + #components - 1`` plus edge and attribute tokens).
    """
    return _serialize(G, cfg if cfg is not None else SerializeConfig(), node_attr, edge_attr, start, seed)[0]


def _parse_attr(tok: str, kind: str, pos: int) -> Any:
    body = tok[len(kind) + 2 : -1]
    if body == "?":
        return None
    try:
        return ast.literal_eval(body)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"tokens[{pos}] = {tok!r} is not a valid {kind} attribute token") from exc


def sequence_to_graph(
    tokens: Sequence[str],
    cfg: SerializeConfig | None = None,
    *,
    node_attr: str = "attr",
    edge_attr: str = "attr",
) -> nx.Graph:
    """Invert :func:`graph_to_sequence`: the graph with nodes ``0..n-1`` in order of first appearance.

    Duplicated (eulerized) edges collapse into one; attribute tokens become the ``node_attr`` / ``edge_attr``
    attributes (an unknown value ``<na:?>`` / ``<ea:?>`` decodes to None). Raises ``ValueError`` on a malformed sequence: broken node/edge
    alternation, an unknown token, an index outside ``[0, node_scope)``, a self-loop, a node seen before
    reached through ``<jump>``, or conflicting attribute values.
    """
    cfg = cfg if cfg is not None else SerializeConfig()
    if not isinstance(cfg, SerializeConfig):
        raise TypeError(f"cfg must be a SerializeConfig, got {type(cfg).__name__}")
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise TypeError(f"tokens must be a sequence of token strings, got {type(tokens).__name__}")
    toks = list(tokens)
    if not toks:
        raise ValueError("tokens must be non-empty, got an empty sequence")
    bad = [t for t in toks if not isinstance(t, str)]
    if bad:
        raise TypeError(f"tokens must be strings, got a {type(bad[0]).__name__}: {bad[0]!r}")
    G = nx.Graph()
    node_of: dict[int, int] = {}
    i, L = 0, len(toks)
    prev: int | None = None  # the node an edge attaches to (None right after a jump / at the start)
    pending_edge: Any = None
    has_edge_attr = False

    def read_index(pos: int) -> tuple[int, int]:
        t = toks[pos]
        if cfg.scope_base is None:
            if not t.isdigit():
                raise ValueError(f"tokens[{pos}] = {t!r}: expected a node index token")
            return int(t), pos + 1
        b = cfg.scope_base
        head, sep, base = t.partition("*")
        if not (sep and head.isdigit() and base == str(b)):
            raise ValueError(f"tokens[{pos}] = {t!r}: expected the high index token 'q*{b}'")
        if pos + 1 >= L or not toks[pos + 1].isdigit() or int(toks[pos + 1]) >= b:
            got = toks[pos + 1] if pos + 1 < L else "the end"
            raise ValueError(
                f"tokens[{pos + 1}]: expected the low index token (0..{b - 1}) after {t!r}, got {got!r}"
            )
        return int(head) * b + int(toks[pos + 1]), pos + 2

    while True:
        if i >= L:
            raise ValueError(f"tokens end after position {L - 1} where a node index was expected")
        idx, j = read_index(i)
        if idx >= cfg.node_scope:
            raise ValueError(f"tokens[{i}]: node index {idx} is outside [0, node_scope={cfg.node_scope})")
        new = idx not in node_of
        if new:
            node_of[idx] = len(node_of)
            G.add_node(node_of[idx])
        v = node_of[idx]
        if prev is None and not new and G.number_of_nodes() > 1 and i > 0:
            raise ValueError(
                f"tokens[{i}]: node index {idx} after <jump> was already seen (components overlap)"
            )
        if j < L and toks[j].startswith("<na:"):
            value = _parse_attr(toks[j], "na", j)
            if node_attr in G.nodes[v] and G.nodes[v][node_attr] != value:
                raise ValueError(f"tokens[{j}]: node index {idx} has conflicting attributes")
            G.nodes[v][node_attr] = value
            j += 1
        if prev is not None:
            if prev == v:
                raise ValueError(f"tokens[{i}]: node index {idx} follows itself (self-loop)")
            if G.has_edge(prev, v) and has_edge_attr and G.edges[prev, v].get(edge_attr) != pending_edge:
                raise ValueError(f"tokens[{i}]: edge ({prev}, {v}) has conflicting attributes")
            G.add_edge(prev, v)
            if has_edge_attr:
                G.edges[prev, v][edge_attr] = pending_edge
        i, prev, has_edge_attr, pending_edge = j, v, False, None
        if i >= L:
            return G
        t = toks[i]
        if t == JUMP:
            prev = None
            i += 1
            continue
        if t == EDGE:
            i += 1
        elif cfg.edge_types:
            raise ValueError(
                f"tokens[{i}] = {t!r}: expected {EDGE} or {JUMP} between nodes (edge_types=True)"
            )
        if i < L and toks[i].startswith("<ea:"):
            pending_edge = _parse_attr(toks[i], "ea", i)
            has_edge_attr = True
            i += 1
        if i >= L:
            raise ValueError(f"tokens end with an edge at position {L - 1}: expected a node after it")


def ego_subgraph(
    G: nx.Graph,
    targets: Hashable | tuple[Hashable, Hashable],
    radius: int = 1,
    max_nodes: int | None = None,
    seed: int | None = None,
) -> nx.Graph:
    """The subgraph within ``radius`` hops of a target node or of both ends of a target edge (node-/edge-level
    fine-tuning). ``max_nodes`` keeps the targets and a random subset of the other nodes."""
    if not isinstance(G, nx.Graph):
        raise TypeError(f"G must be a networkx graph, got {type(G).__name__}")
    tgt = list(targets) if isinstance(targets, tuple) else [targets]
    for t in tgt:
        if t not in G:
            raise ValueError(f"targets must be node(s) of G, got {t!r}")
    radius = check_int(radius, "radius", low=0)
    keep: set = set()
    for t in tgt:
        keep |= set(nx.single_source_shortest_path_length(G, t, cutoff=radius))
    if max_nodes is not None:
        max_nodes = check_int(max_nodes, "max_nodes")
        if max_nodes < len(tgt):
            raise ValueError(f"max_nodes must be >= {len(tgt)} (the targets), got {max_nodes}")
        others = sorted(keep - set(tgt), key=repr)
        rng = np.random.default_rng(seed)
        pick = rng.permutation(len(others))[: max_nodes - len(tgt)]
        keep = set(tgt) | {others[k] for k in pick}
    return G.subgraph(keep).copy()


# ------------------------------------------------------------------------------------------ tokenizer
class GraphTokenizer:
    """Vocabulary and batching of serialized graphs: ``<bos> sequence <eos>`` as token ids.

    Vocabulary: :data:`SPECIALS`, the node-index tokens of ``config``, then one token per known node/edge
    attribute value. Unknown values encode as ``<na:?>`` / ``<ea:?>`` with a warning (``config.strict`` raises).
    """

    def __init__(
        self,
        config: SerializeConfig | None = None,
        node_attr: str | None = None,
        edge_attr: str | None = None,
        node_values: Iterable[Any] = (),
        edge_values: Iterable[Any] = (),
    ) -> None:
        self.config = config if config is not None else SerializeConfig()
        if not isinstance(self.config, SerializeConfig):
            raise TypeError(f"config must be a SerializeConfig, got {type(self.config).__name__}")
        self.node_attr, self.edge_attr = node_attr, edge_attr
        na = sorted({_attr_token("na", v, "node_values") for v in node_values})
        ea = sorted({_attr_token("ea", v, "edge_values") for v in edge_values})
        self.vocab: list[str] = list(SPECIALS) + self.config.all_index_tokens() + na + ea
        self.token_to_id = {t: k for k, t in enumerate(self.vocab)}
        self.index_ids = torch.tensor([self.token_to_id[t] for t in self.config.all_index_tokens()])

    @classmethod
    def from_graphs(
        cls,
        graphs: Iterable[nx.Graph],
        config: SerializeConfig | None = None,
        node_attr: str | None = None,
        edge_attr: str | None = None,
    ) -> GraphTokenizer:
        """A tokenizer whose attribute vocabulary is every value found in ``graphs``."""
        nv: list = []
        ev: list = []
        for G in graphs:
            if node_attr is not None:
                nv += [d[node_attr] for _, d in G.nodes(data=True) if node_attr in d]
            if edge_attr is not None:
                ev += [d[edge_attr] for _, _, d in G.edges(data=True) if edge_attr in d]
        return cls(config, node_attr, edge_attr, nv, ev)

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def pad_id(self) -> int:
        return self.token_to_id[PAD]

    @property
    def mask_id(self) -> int:
        return self.token_to_id[MASK]

    @property
    def eos_id(self) -> int:
        return self.token_to_id[EOS]

    def encode_tokens(self, tokens: Sequence[str]) -> list[int]:
        """Ids of ``<bos> tokens <eos>``; attribute tokens outside the vocabulary become ``<na:?>`` / ``<ea:?>``."""
        ids = [self.token_to_id[BOS]]
        unknown = []
        for t in tokens:
            k = self.token_to_id.get(t)
            if k is None:
                if not (t.startswith("<na:") or t.startswith("<ea:")):
                    raise ValueError(f"tokens contains {t!r}, which is not in this tokenizer's vocabulary")
                unknown.append(t)
                k = self.token_to_id[UNK_NA if t.startswith("<na:") else UNK_EA]
            ids.append(k)
        if unknown:
            msg = f"{len(unknown)} attribute value(s) outside the vocabulary, e.g. {unknown[0]}"
            if self.config.strict:
                raise ValueError(f"G has {msg} (strict=True)")
            warnings.warn(f"{msg}: encoded as unknown (<na:?> / <ea:?>)", stacklevel=3)
        return [*ids, self.eos_id]

    def encode(self, G: nx.Graph, seed: int | None = None, start: Hashable | None = None) -> list[int]:
        """Token ids of one serialization of ``G`` (see :func:`graph_to_sequence`)."""
        return self.encode_tokens(
            graph_to_sequence(
                G, self.config, node_attr=self.node_attr, edge_attr=self.edge_attr, start=start, seed=seed
            )
        )

    def encode_with_positions(
        self, G: nx.Graph, seed: int | None = None, start: Hashable | None = None
    ) -> tuple[list[int], dict[Hashable, int]]:
        """Ids and, per node of ``G``, the id position of its first index token (offset by ``<bos>``)."""
        toks, pos = _serialize(G, self.config, self.node_attr, self.edge_attr, start, seed)
        return self.encode_tokens(toks), {v: p + 1 for v, p in pos.items()}

    def decode(self, ids: Sequence[int] | torch.Tensor) -> nx.Graph:
        """The graph of ``ids`` (``<pad>``/``<bos>``/``<eos>`` dropped); see :func:`sequence_to_graph`."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1 or ids.is_floating_point():
                raise TypeError(
                    f"ids must be a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}"
                )
            ids = ids.tolist()
        out = []
        for k in ids:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < len(self.vocab):
                raise ValueError(f"ids must be token ids in [0, {len(self.vocab)}), got {k!r}")
            t = self.vocab[int(k)]
            if t not in (PAD, BOS, EOS):
                out.append(t)
        if not out:
            raise ValueError(
                f"ids must contain at least one node token besides <pad>/<bos>/<eos>, got {len(ids)} ids"
            )
        return sequence_to_graph(
            out, self.config, node_attr=self.node_attr or "attr", edge_attr=self.edge_attr or "attr"
        )

    def batch(
        self, graphs: Sequence[nx.Graph], seed: int | None = None, starts: Sequence[Hashable] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ids ``(B, L)`` and attention mask ``(B, L)`` (bool) of one serialization per graph;
        graph ``i`` uses seed ``seed + i`` (None: fresh randomness)."""
        rows = [
            self.encode(G, None if seed is None else seed + i, None if starts is None else starts[i])
            for i, G in enumerate(graphs)
        ]
        return self.pad(rows)

    def pad(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad id lists to ``(B, max len)``; returns ``(ids, attention_mask)``."""
        L = max(len(r) for r in rows)
        ids = torch.full((len(rows), L), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        return ids, ids != self.pad_id

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``tokenizer_config.json`` (config, attribute names) and ``vocab.json`` (token -> id)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        conf = {
            "serialize_config": asdict(self.config),
            "node_attr": self.node_attr,
            "edge_attr": self.edge_attr,
            "tokenizer_class": "GraphTokenizer",
        }
        (d / "tokenizer_config.json").write_text(json.dumps(conf, indent=1))
        (d / "vocab.json").write_text(json.dumps(self.token_to_id, indent=1))
        return d

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> GraphTokenizer:
        """Load what :meth:`save_pretrained` wrote (the vocabulary order is restored exactly)."""
        d = Path(directory)
        if not (d / "vocab.json").is_file():
            raise ValueError(f"directory must contain vocab.json and tokenizer_config.json, got {str(d)!r}")
        conf = json.loads((d / "tokenizer_config.json").read_text())
        vocab = json.loads((d / "vocab.json").read_text())
        tok = cls(SerializeConfig(**conf["serialize_config"]), conf["node_attr"], conf["edge_attr"])
        tok.vocab = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        tok.token_to_id = {t: k for k, t in enumerate(tok.vocab)}
        return tok


# --------------------------------------------------------------------------------------------- model
class _RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of ``x`` (B, H, L, D) (rotate-half convention, as Llama)."""
    L, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D)
    ang = torch.arange(L, dtype=torch.float32, device=x.device)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class _Block(nn.Module):
    def __init__(self, d: int, heads: int, inter: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = _RMSNorm(d), _RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * inter, bias=False)
        self.down = nn.Linear(inter, d, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, L, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(_rope(q), _rope(k), v, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(B, L, d))
        g, u = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


class GraphGPTModel(nn.Module):
    """Llama-style transformer over graph tokens: ``forward(ids, attention_mask) -> hidden (B, L, hidden)``.

    ``causal=True`` for NTP, False (bidirectional) for SMTP; ``logits(hidden)`` is the LM head ``(B, L, V)``.
    ``backend="torch"`` is a compact RMSNorm/RoPE/SwiGLU block; ``"hf"`` runs ``transformers.LlamaModel``
    (extra ``[hf]``; bidirectional through an explicit 4-D mask). ``seed`` initialises the weights without
    touching the global generator.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden: int = 128,
        layers: int = 3,
        heads: int = 4,
        intermediate: int | None = None,
        causal: bool = False,
        backend: Literal["torch", "hf"] = "torch",
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        for name, val, lo in (
            ("vocab_size", vocab_size, 2),
            ("hidden", hidden, 1),
            ("layers", layers, 1),
            ("heads", heads, 1),
        ):
            check_int(val, name, low=lo)
        if hidden % heads or (hidden // heads) % 2:
            raise ValueError(
                f"hidden must be a multiple of 2*heads (even head size), got hidden={hidden}, heads={heads}"
            )
        if backend not in ("torch", "hf"):
            raise ValueError(f"backend must be 'torch' or 'hf', got {backend!r}")
        inter = intermediate or int(math.ceil(8 * hidden / 3 / 8) * 8)
        self.vocab_size, self.hidden, self.causal, self.backend = (
            int(vocab_size),
            hidden,
            bool(causal),
            backend,
        )
        with isolated_rng(seed):
            if backend == "hf":
                from icml25.generative_models.graphgpt_hf import build_graphgpt

                self.hf = build_graphgpt(
                    vocab_size,
                    hidden=hidden,
                    layers=layers,
                    heads=heads,
                    intermediate=inter,
                    causal=True,
                    head=False,
                )
            else:
                self.embed = nn.Embedding(vocab_size, hidden)
                self.blocks = nn.ModuleList(_Block(hidden, heads, inter) for _ in range(layers))
                self.norm = _RMSNorm(hidden)
            self.lm_head = nn.Linear(hidden, vocab_size, bias=False)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)) and backend == "torch":
                    nn.init.normal_(m.weight, std=0.02)

    def attention_mask4d(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """Boolean ``(B, 1, L, L)`` mask: key padding, plus causal when ``causal`` (queries at padding see
        themselves, so no row is empty)."""
        B, L = attention_mask.shape
        m = attention_mask[:, None, None, :].expand(B, 1, L, L)
        if self.causal:
            m = m & torch.ones(L, L, dtype=torch.bool, device=m.device).tril()
        return m | torch.eye(L, dtype=torch.bool, device=m.device)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise TypeError(
                f"ids must be an integer tensor of shape (B, L), got {getattr(ids, 'dtype', type(ids))} "
                f"{tuple(getattr(ids, 'shape', ()))}"
            )
        if ids.numel() == 0:
            raise ValueError(f"ids must be non-empty, got shape {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(
                f"ids must lie in [0, vocab_size={self.vocab_size}), got [{int(ids.min())}, {int(ids.max())}]"
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(ids, dtype=torch.bool)
        if attention_mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of ids {tuple(ids.shape)}, got {tuple(attention_mask.shape)}"
            )
        mask = self.attention_mask4d(attention_mask.bool())
        if self.backend == "hf":
            add = torch.zeros(mask.shape, dtype=torch.float32).masked_fill(
                ~mask, torch.finfo(torch.float32).min
            )
            return self.hf(input_ids=ids, attention_mask=add).last_hidden_state
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Token logits ``(B, L, V)`` of hidden states ``(B, L, hidden)``."""
        return self.lm_head(hidden)


# ---------------------------------------------------------------------------------------- objectives
def smtp_mask(
    ids: torch.Tensor,
    mask_id: int,
    *,
    maskable: torch.Tensor | None = None,
    u_range: tuple[float, float] = (0.01, 0.99),
    power: float = 1.0,
    schedule: Literal["poly", "cosine"] = "poly",
    mtp: tuple[float, float, float] = (1.0, 0.0, 0.0),
    random_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scheduled masked-token corruption (official ``prepare_inputs_for_pretrain_mlm``).

    Per row, ``u ~ U[u_min, u_max]`` and the mask ratio is ``r = 1 - u**power`` (``"cosine"``:
    ``r = 0.5 + 0.5 cos(pi u)``); ``ceil(r * n)`` of the row's ``n`` maskable positions (at least one) are
    chosen uniformly. A chosen token becomes ``mask_id`` / a random id from ``random_ids`` / stays, with the
    probabilities ``mtp``.

    Args:
        ids: ``(B, L)`` token ids. maskable: ``(B, L)`` bool, positions that may be masked (default all);
            every row needs at least one.

    Returns:
        ``(inputs (B, L), labels (B, L) with -100 at unchosen positions, weight (B,) = power / u)`` (the
        discrete-diffusion weight, for ``dlm_wgt``).
    """
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dim() != 2:
        raise TypeError(
            f"ids must be an integer tensor of shape (B, L), got {getattr(ids, 'dtype', type(ids))} "
            f"of shape {tuple(getattr(ids, 'shape', ()))}"
        )
    if ids.numel() == 0:
        raise ValueError(f"ids must be non-empty, got shape {tuple(ids.shape)}")
    if maskable is None:
        maskable = torch.ones_like(ids, dtype=torch.bool)
    if not isinstance(maskable, torch.Tensor) or maskable.shape != ids.shape or maskable.dtype != torch.bool:
        raise ValueError(
            f"maskable must be a bool tensor of shape {tuple(ids.shape)}, got "
            f"{getattr(maskable, 'dtype', type(maskable))} {tuple(getattr(maskable, 'shape', ()))}"
        )
    n = maskable.sum(1)
    if bool((n == 0).any()):
        raise ValueError(
            f"maskable must allow at least one position per row; rows {torch.nonzero(n == 0).flatten().tolist()[:5]} have none"
        )
    lo, hi = (float(x) for x in u_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 < lo <= hi <= 1.0):
        raise ValueError(f"u_range must satisfy 0 < u_min <= u_max <= 1, got {u_range}")
    power = check_float(power, "power", low=0, low_open=True)
    if schedule not in ("poly", "cosine"):
        raise ValueError(f"schedule must be 'poly' or 'cosine', got {schedule!r}")
    p = np.asarray(mtp, dtype=np.float64)
    if p.shape != (3,) or not np.isfinite(p).all() or (p < 0).any() or abs(p.sum() - 1) > 1e-6:
        raise ValueError(f"mtp must be 3 probabilities (mask, random, keep) summing to 1, got {mtp}")
    if p[1] > 0 and (random_ids is None or len(random_ids) == 0):
        raise ValueError("random_ids must list the ids to draw random replacements from when mtp[1] > 0")
    g = make_generator(seed, generator)
    B, L = ids.shape
    u = lo + (hi - lo) * torch.rand(B, generator=g, dtype=torch.float64)
    r = 1.0 - u**power if schedule == "poly" else 0.5 + 0.5 * torch.cos(math.pi * u)
    k = torch.clamp(torch.ceil(r * n.double() - 1e-9).long(), min=1)
    k = torch.minimum(k, n)
    score = torch.rand(B, L, generator=g).masked_fill(~maskable, 2.0)
    rank = score.argsort(1).argsort(1)
    chosen = rank < k[:, None]
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    inputs = ids.clone()
    action = torch.rand(B, L, generator=g)
    to_mask = chosen & (action < p[0])
    to_rand = chosen & (action >= p[0]) & (action < p[0] + p[1])
    inputs[to_mask] = int(mask_id)
    if bool(to_rand.any()):
        pool = torch.as_tensor(random_ids, dtype=ids.dtype)
        inputs[to_rand] = pool[torch.randint(len(pool), (int(to_rand.sum()),), generator=g)]
    return inputs, labels, (power / u).float()


def smtp_reduce(
    token_loss: torch.Tensor,
    selected: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    normalize: Literal["masked", "length"] = "masked",
    pad_to_multiple_of: int = 1,
) -> torch.Tensor:
    """Reduce per-token SMTP losses to a scalar.

    ``token_loss`` and ``selected`` are ``(B, L)``: the cross-entropy at every position and which positions
    were corrupted (the loss counts only those). ``weight`` ``(B,)`` multiplies each row's token losses (the
    discrete-diffusion weight ``power / u`` of :func:`smtp_mask`; None: 1). ``normalize="masked"`` divides
    the sum by the number of selected tokens (the masked-token mean; with unit weights the plain mean);
    ``"length"`` divides by ``B * L'``, every position of the padded batch, with ``L`` rounded up to a
    multiple of ``pad_to_multiple_of`` (the official ``dlm_wgt`` loss: ``_get_dlm_ce_loss(...) / (bz * seq)``
    in ``modeling_pretrain.py``, where the collator pads ``seq`` to a multiple of 8; padding positions carry
    no loss and are masked from attention, so only the denominator needs the padded length).
    """
    if not isinstance(token_loss, torch.Tensor) or token_loss.dim() != 2:
        raise ValueError(
            f"token_loss must be a (B, L) tensor, got shape {tuple(getattr(token_loss, 'shape', ()))}"
        )
    if (
        not isinstance(selected, torch.Tensor)
        or selected.shape != token_loss.shape
        or selected.dtype != torch.bool
    ):
        raise ValueError(
            f"selected must be a bool tensor of shape {tuple(token_loss.shape)}, got "
            f"{getattr(selected, 'dtype', type(selected))} {tuple(getattr(selected, 'shape', ()))}"
        )
    if weight is not None and (not isinstance(weight, torch.Tensor) or weight.shape != token_loss.shape[:1]):
        raise ValueError(
            f"weight must be None or a tensor of shape ({token_loss.shape[0]},), got "
            f"{tuple(getattr(weight, 'shape', ())) if isinstance(weight, torch.Tensor) else type(weight).__name__}"
        )
    if normalize not in ("masked", "length"):
        raise ValueError(f"normalize must be 'masked' or 'length', got {normalize!r}")
    pad_to_multiple_of = check_int(pad_to_multiple_of, "pad_to_multiple_of", low=1)
    tok = token_loss if weight is None else token_loss * weight[:, None].to(token_loss.dtype)
    total = tok[selected].sum()
    if normalize == "length":
        B, L = token_loss.shape
        return total / (B * (-(-L // pad_to_multiple_of) * pad_to_multiple_of))
    return total / selected.sum().clamp(min=1)


def smtp_loss(
    model: GraphGPTModel,
    ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask_id: int,
    *,
    maskable: torch.Tensor | None = None,
    dlm_weight: bool = False,
    normalize: Literal["masked", "length"] = "masked",
    pad_to_multiple_of: int = 1,
    generator: torch.Generator | None = None,
    **mask_kwargs: Any,
) -> torch.Tensor:
    """SMTP loss: cross-entropy on the positions :func:`smtp_mask` corrupts, reduced by :func:`smtp_reduce`.

    Default: the mean over masked tokens. ``dlm_weight`` weights each row's token losses by ``power / u``;
    ``normalize="length"`` divides the (weighted) sum by batch x padded length instead of the number of
    masked tokens (the length rounded up to a multiple of ``pad_to_multiple_of``). The official default
    (``dlm_wgt: true``) is ``dlm_weight=True, normalize="length", pad_to_multiple_of=8``.
    ``maskable`` defaults to the non-padding positions."""
    m = attention_mask.bool() if maskable is None else maskable
    inputs, labels, w = smtp_mask(ids, mask_id, maskable=m, generator=generator, **mask_kwargs)
    logits = model.logits(model(inputs, attention_mask))
    tok = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return smtp_reduce(
        tok,
        labels != -100,
        w if dlm_weight else None,
        normalize=normalize,
        pad_to_multiple_of=pad_to_multiple_of,
    )


def ntp_loss(model: GraphGPTModel, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Next-token prediction: mean cross-entropy of ``ids[:, 1:]`` from the causal states at ``:-1``
    (padding ignored)."""
    if not model.causal:
        raise ValueError("model must be causal (GraphGPTModel(causal=True)) for next-token prediction")
    logits = model.logits(model(ids, attention_mask))[:, :-1]
    labels = ids[:, 1:].masked_fill(~attention_mask[:, 1:].bool(), -100)
    return F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100)


def _check_graph_list(graphs: Any, name: str = "graphs") -> list[nx.Graph]:
    if isinstance(graphs, nx.Graph) or not isinstance(graphs, Sequence):
        raise TypeError(f"{name} must be a sequence of networkx graphs, got {type(graphs).__name__}")
    if len(graphs) == 0:
        raise ValueError(f"{name} must be non-empty, got 0 graphs")
    for i, G in enumerate(graphs):
        if not isinstance(G, nx.Graph):
            raise TypeError(f"{name}[{i}] must be a networkx graph, got {type(G).__name__}")
    return list(graphs)


def warmup_decay_factor(
    step: int, steps: int, warmup: int, warmup_type: Literal["log", "linear"] = "log"
) -> float:
    """Learning-rate factor of optimiser step ``step`` (0-based) under DeepSpeed's ``WarmupDecayLR`` with
    ``warmup_min_lr = 0`` (the official pre-training schedule: ``examples/ds_config2_pt.json``, DeepSpeed
    0.15.4 pinned in ``requirements.txt``).

    DeepSpeed sets the rate of the first step to the minimum (0) and steps the scheduler after every
    optimiser step, so step ``k`` runs at ``gamma(k - 1)`` with ``W = max(2, warmup)``: ``gamma(i) =
    log(i + 1) / log(W)`` (``"log"``, DeepSpeed's default ``warmup_type``, which the official config does not
    set) or ``i / W`` (``"linear"``) for ``i < W``, then ``max(0, (steps - i) / max(1, steps - W))``, a
    linear decay that reaches ``2 / (steps - W)`` at the last step ``steps - 1``."""
    i = step - 1
    if i < 0:
        return 0.0
    w = max(2, warmup)
    if i < w:
        return math.log(i + 1) / math.log(w) if warmup_type == "log" else i / w
    return max(0.0, (steps - i) / max(1, steps - w))


def pretrain_optimizer(
    model: nn.Module,
    steps: int,
    *,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    eps: float = 1e-8,
    schedule: Literal["constant", "warmup_decay"] = "constant",
    warmup: int = 0,
    warmup_type: Literal["log", "linear"] = "log",
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (betas (0.9, 0.95)) and a per-step ``LambdaLR`` for ``steps`` pre-training steps.

    ``schedule="constant"``: a linear warm-up ``min(1, (k + 1) / warmup)`` then constant (ours; no warm-up
    with ``warmup=0``). ``"warmup_decay"``: the official DeepSpeed ``WarmupDecayLR`` (see
    :func:`warmup_decay_factor`) over the horizon ``steps``. The official optimiser is AdamW with ``eps=1e-6``
    (``configs/training/base.yaml``); the default ``1e-8`` is PyTorch's. Pass the pair to :func:`pretrain`'s
    ``optimizer`` to continue one schedule over several calls."""
    steps = check_int(steps, "steps", low=1)
    lr = check_float(lr, "lr", low=0, low_open=True)
    eps = check_float(eps, "eps", low=0, low_open=True)
    warmup = check_int(warmup, "warmup", low=0)
    if schedule not in ("constant", "warmup_decay"):
        raise ValueError(f"schedule must be 'constant' or 'warmup_decay', got {schedule!r}")
    if warmup_type not in ("log", "linear"):
        raise ValueError(f"warmup_type must be 'log' or 'linear', got {warmup_type!r}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=eps, weight_decay=weight_decay)
    if schedule == "warmup_decay":
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda k: warmup_decay_factor(k, steps, warmup, warmup_type)
        )
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0
        )
    return opt, sched


def pretrain(
    model: GraphGPTModel,
    tokenizer: GraphTokenizer,
    graphs: Sequence[nx.Graph],
    steps: int,
    *,
    objective: Literal["smtp", "ntp"] = "smtp",
    batch_size: int = 64,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    warmup: int = 0,
    eps: float = 1e-8,
    schedule: Literal["constant", "warmup_decay"] = "constant",
    warmup_type: Literal["log", "linear"] = "log",
    optimizer: tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler] | None = None,
    seed: int = 0,
    views: int | None = None,
    **mask_kwargs: Any,
) -> list[float]:
    """Self-supervised pre-training on serialized ``graphs``; returns the per-step losses.

    Optimiser: :func:`pretrain_optimizer` (AdamW betas (0.9, 0.95), ``eps``, ``weight_decay``, grad-norm 1;
    ``schedule`` "constant" after an optional linear ``warmup``, or the official "warmup_decay") built
    for ``steps``, unless ``optimizer`` passes an ``(optimizer, scheduler)`` pair to continue (then ``lr``,
    ``eps``, ``weight_decay`` and the schedule arguments are the pair's). Every sampled graph is serialized
    afresh (a new walk and re-indexing) unless ``views`` caps the number of distinct serializations per graph
    (precomputed). ``mask_kwargs`` go to :func:`smtp_loss` (e.g. ``dlm_weight=True, normalize="length",
    pad_to_multiple_of=8``: the official loss)."""
    graphs = _check_graph_list(graphs)
    steps = check_int(steps, "steps", low=0)
    if objective not in ("smtp", "ntp"):
        raise ValueError(f"objective must be 'smtp' or 'ntp', got {objective!r}")
    if objective == "smtp" and model.causal:
        raise ValueError("objective='smtp' needs a bidirectional model (causal=False)")
    if objective == "ntp" and not model.causal:
        raise ValueError("objective='ntp' needs a causal model (causal=True)")
    lr = check_float(lr, "lr", low=0, low_open=True)
    rng = np.random.default_rng(seed)
    g = make_generator(seed)
    cache: dict[tuple[int, int], list[int]] = {}
    if views is not None:
        views = check_int(views, "views", low=1)
    if optimizer is None:
        opt, sched = pretrain_optimizer(
            model,
            max(1, steps),
            lr=lr,
            weight_decay=weight_decay,
            eps=eps,
            schedule=schedule,
            warmup=warmup,
            warmup_type=warmup_type,
        )
    elif (
        not isinstance(optimizer, tuple)
        or len(optimizer) != 2
        or not isinstance(optimizer[0], torch.optim.Optimizer)
        or not isinstance(optimizer[1], torch.optim.lr_scheduler.LRScheduler)
    ):
        raise TypeError(
            f"optimizer must be None or an (Optimizer, LRScheduler) pair (pretrain_optimizer), got "
            f"{type(optimizer).__name__}"
        )
    else:
        opt, sched = optimizer
    special = torch.tensor([tokenizer.token_to_id[t] for t in (PAD, BOS, EOS)])
    losses = []
    model.train()
    for _ in range(steps):
        idx = rng.integers(len(graphs), size=batch_size)
        rows = []
        for i in idx:
            if views is None:
                rows.append(tokenizer.encode(graphs[int(i)], seed=int(rng.integers(2**62))))
                continue
            key = (int(i), int(rng.integers(views)))
            if key not in cache:
                cache[key] = tokenizer.encode(
                    graphs[key[0]], seed=(seed * len(graphs) + key[0]) * views + key[1]
                )
            rows.append(cache[key])
        ids, am = tokenizer.pad(rows)
        if objective == "smtp":
            maskable = am & ~torch.isin(ids, special)
            loss = smtp_loss(model, ids, am, tokenizer.mask_id, maskable=maskable, generator=g, **mask_kwargs)
        else:
            loss = ntp_loss(model, ids, am)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


# ------------------------------------------------------------------------------------------ estimator
class GraphGPTClassifier:
    """GraphGPT fine-tuned for classification, scikit-learn style.

    ``task="graph"``: one label per graph, from the ``<eos>`` hidden state. ``"node"``: ``targets[i]`` is a
    node of ``graphs[i]`` (e.g. an :func:`ego_subgraph`); the walk starts there and its token state is used.
    ``"edge"``: ``targets[i] = (u, v)``; the walk starts at ``u`` and the states of ``u`` and ``v`` are
    concatenated. :meth:`pretrain` (optional, before :meth:`fit`) runs SMTP (bidirectional) or NTP (causal).
    Fine-tuning: AdamW (lr ``lr``, betas (0.9, 0.95)), ``epochs`` passes, a fresh serialization per epoch
    (``fit_views`` caps them: the serializations are then computed once and cycled);
    :meth:`predict_proba` averages ``n_views`` serializations.
    """

    def __init__(
        self,
        config: SerializeConfig | None = None,
        task: Literal["graph", "node", "edge"] = "graph",
        hidden: int = 128,
        layers: int = 3,
        heads: int = 4,
        causal: bool = False,
        backend: Literal["torch", "hf"] = "torch",
        epochs: int = 30,
        lr: float = 5e-4,
        batch_size: int = 32,
        weight_decay: float = 0.0,
        n_views: int = 1,
        fit_views: int | None = None,
        node_attr: str | None = None,
        edge_attr: str | None = None,
        seed: int = 0,
    ) -> None:
        self.config = config if config is not None else SerializeConfig(node_scope=32)
        if not isinstance(self.config, SerializeConfig):
            raise TypeError(f"config must be a SerializeConfig, got {type(self.config).__name__}")
        if task not in ("graph", "node", "edge"):
            raise ValueError(f"task must be 'graph', 'node' or 'edge', got {task!r}")
        for name, v in (("epochs", epochs), ("batch_size", batch_size), ("n_views", n_views)):
            check_int(v, name, low=1)
        check_float(lr, "lr", low=0, low_open=True)
        self.task, self.hidden, self.layers, self.heads = task, hidden, layers, heads
        self.causal, self.backend, self.epochs, self.lr = causal, backend, epochs, float(lr)
        self.batch_size, self.weight_decay, self.n_views, self.seed = batch_size, weight_decay, n_views, seed
        if fit_views is not None:
            check_int(fit_views, "fit_views", low=1)
        self.node_attr, self.edge_attr, self.fit_views = node_attr, edge_attr, fit_views
        self.tokenizer_: GraphTokenizer | None = None
        self.model_: GraphGPTModel | None = None

    # -- helpers
    def _ensure_model(self, graphs: Sequence[nx.Graph]) -> None:
        if self.model_ is None:
            self.tokenizer_ = GraphTokenizer.from_graphs(graphs, self.config, self.node_attr, self.edge_attr)
            self.model_ = GraphGPTModel(
                len(self.tokenizer_),
                self.hidden,
                self.layers,
                self.heads,
                causal=self.causal,
                backend=self.backend,
                seed=self.seed,
            )

    def _check_targets(self, graphs: list[nx.Graph], targets: Sequence[Any] | None) -> list[Any]:
        if self.task == "graph":
            if targets is not None:
                raise ValueError("targets must be None for task='graph'")
            return [None] * len(graphs)
        if targets is None or len(targets) != len(graphs):
            raise ValueError(
                f"targets must give one {'node' if self.task == 'node' else '(u, v) edge'} per graph "
                f"for task={self.task!r}, got {None if targets is None else len(targets)}"
            )
        for i, (G, t) in enumerate(zip(graphs, targets)):
            ends = [t] if self.task == "node" else (list(t) if isinstance(t, tuple) and len(t) == 2 else None)
            if ends is None or any(e not in G for e in ends):
                raise ValueError(
                    f"targets[{i}] must be a {'node' if self.task == 'node' else '(u, v) pair of nodes'} "
                    f"of graphs[{i}], got {t!r}"
                )
        return list(targets)

    def _encode(self, G: nx.Graph, t: Any, seed: int) -> tuple[list[int], list[int]]:
        start = None if t is None else (t if self.task == "node" else t[0])
        ids, pos = self.tokenizer_.encode_with_positions(G, seed=seed, start=start)
        if self.task == "graph":
            return ids, [len(ids) - 1]
        return ids, ([pos[t]] if self.task == "node" else [pos[t[0]], pos[t[1]]])

    def _features(self, graphs: list[nx.Graph], targets: list[Any], seed: int) -> torch.Tensor:
        return self._states([self._encode(G, t, seed + i) for i, (G, t) in enumerate(zip(graphs, targets))])

    def _states(self, encoded: list[tuple[list[int], list[int]]]) -> torch.Tensor:
        rows, where = [r for r, _ in encoded], [w for _, w in encoded]
        ids, am = self.tokenizer_.pad(rows)
        h = self.model_(ids, am)
        w = torch.tensor(where)
        return h[torch.arange(len(rows))[:, None], w].reshape(len(rows), -1)

    # -- public
    def pretrain(
        self,
        graphs: Sequence[nx.Graph],
        steps: int = 1500,
        batch_size: int = 64,
        lr: float = 1e-3,
        **kwargs: Any,
    ) -> GraphGPTClassifier:
        """Self-supervised pre-training (:func:`pretrain`; SMTP unless ``causal``) on unlabeled ``graphs``."""
        graphs = _check_graph_list(graphs)
        for i, G in enumerate(graphs):
            _check_graph(G, self.config, f"graphs[{i}]")
        self._ensure_model(graphs)
        self.pretrain_losses_ = pretrain(
            self.model_,
            self.tokenizer_,
            graphs,
            steps,
            objective="ntp" if self.causal else "smtp",
            batch_size=batch_size,
            lr=lr,
            seed=self.seed,
            **kwargs,
        )
        return self

    def fit(
        self, graphs: Sequence[nx.Graph], y: Sequence[Any], targets: Sequence[Any] | None = None
    ) -> GraphGPTClassifier:
        """Fine-tune the model and a 2-layer head on labelled graphs; ``y`` has one label per graph."""
        graphs = _check_graph_list(graphs)
        for i, G in enumerate(graphs):
            _check_graph(G, self.config, f"graphs[{i}]")
        y_arr = np.asarray(y)
        if y_arr.ndim != 1 or len(y_arr) != len(graphs):
            raise ValueError(
                f"y must be 1-D with one label per graph ({len(graphs)}), got shape {y_arr.shape}"
            )
        if y_arr.dtype.kind == "f" and not np.isfinite(y_arr).all():
            raise ValueError("y must be finite labels, got NaN/Inf")
        classes, y_idx = np.unique(y_arr, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"y must contain at least 2 classes, got {classes.tolist()}")
        targets = self._check_targets(graphs, targets)
        self._ensure_model(graphs)
        width = self.hidden * (2 if self.task == "edge" else 1)
        with isolated_rng(self.seed + 1):
            self.head_ = nn.Sequential(
                nn.Linear(width, self.hidden), nn.GELU(), nn.Linear(self.hidden, len(classes))
            )
        params = list(self.model_.parameters()) + list(self.head_.parameters())
        opt = torch.optim.AdamW(params, lr=self.lr, betas=(0.9, 0.95), weight_decay=self.weight_decay)
        rng = np.random.default_rng(self.seed)
        yt = torch.as_tensor(y_idx, dtype=torch.long)
        self.model_.train()
        self.loss_curve_ = []
        cache: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        for epoch in range(self.epochs):
            perm = rng.permutation(len(graphs))
            for b in range(0, len(graphs), self.batch_size):
                sel = perm[b : b + self.batch_size]
                enc = []
                for i in sel:
                    key = (int(i), epoch % self.fit_views if self.fit_views else epoch)
                    if key not in cache:
                        cache[key] = self._encode(
                            graphs[i], targets[i], seed=(self.seed * 7919 + key[1]) * len(graphs) + key[0]
                        )
                    enc.append(cache[key])
                feats = self._states(enc)
                loss = F.cross_entropy(self.head_(feats), yt[sel])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                self.loss_curve_.append(float(loss.detach()))
        self.model_.eval()
        self.classes_ = classes
        return self

    def predict_proba(self, graphs: Sequence[nx.Graph], targets: Sequence[Any] | None = None) -> np.ndarray:
        """Class probabilities ``(n, n_classes)``, averaged over ``n_views`` serializations."""
        if not hasattr(self, "classes_"):
            raise ValueError("GraphGPTClassifier is not fitted: call fit(...) first")
        graphs = _check_graph_list(graphs)
        for i, G in enumerate(graphs):
            _check_graph(G, self.config, f"graphs[{i}]")
        targets = self._check_targets(graphs, targets)
        out = np.zeros((len(graphs), len(self.classes_)))
        with torch.no_grad():
            for v in range(self.n_views):
                for b in range(0, len(graphs), 256):
                    feats = self._features(
                        graphs[b : b + 256], targets[b : b + 256], seed=10_000_019 * (v + 1) + b
                    )
                    out[b : b + 256] += torch.softmax(self.head_(feats), -1).double().numpy()
        return out / self.n_views

    def predict(self, graphs: Sequence[nx.Graph], targets: Sequence[Any] | None = None) -> np.ndarray:
        """Most probable class per graph."""
        proba = self.predict_proba(graphs, targets)
        return self.classes_[proba.argmax(1)]

    def score(
        self, graphs: Sequence[nx.Graph], y: Sequence[Any], targets: Sequence[Any] | None = None
    ) -> float:
        """Accuracy on ``(graphs, y)``."""
        return float(np.mean(self.predict(graphs, targets) == np.asarray(y)))
