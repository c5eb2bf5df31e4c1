"""P29 GraphGPT: Eulerian serialization (exact reversibility), SMTP masking, models, heads, reproduction."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models import graphgpt as gg
from icml25.generative_models.experiments import graphgpt as exp
from icml25.kernels.experiment import torch_threads

CFG = gg.SerializeConfig(node_scope=32)


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):  # tiny models: one thread (as the experiments); no oversubscription on 2 cores
        yield


def _attr_match(a: dict, b: dict) -> bool:
    return a.get("attr") == b.get("attr")


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 12))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))) if pairs else []
    G = nx.Graph()
    labels = draw(st.permutations(list(range(100, 100 + n))))  # arbitrary node labels
    G.add_nodes_from(labels)
    G.add_edges_from((labels[i], labels[j]) for i, j in edges)
    for v in G:
        G.nodes[v]["attr"] = draw(st.sampled_from([0, 1, "C", 2.5]))
    for e in G.edges:
        G.edges[e]["attr"] = draw(st.sampled_from([1, 2, "aromatic"]))
    return G


@settings(max_examples=150, deadline=None)
@given(
    G=graphs(),
    seed=st.integers(0, 2**31),
    base=st.sampled_from([None, 4]),
    edge_types=st.booleans(),
    reindex=st.sampled_from(["seq", "cyclic", "random"]),
)
def test_roundtrip_is_isomorphic_with_attributes(G, seed, base, edge_types, reindex) -> None:
    cfg = gg.SerializeConfig(node_scope=16, scope_base=base, edge_types=edge_types, reindex=reindex)
    toks = gg.graph_to_sequence(G, cfg, node_attr="attr", edge_attr="attr", seed=seed)
    H = gg.sequence_to_graph(toks, cfg)
    assert nx.is_isomorphic(G, H, node_match=_attr_match, edge_match=_attr_match)
    assert sorted(H.nodes) == list(range(G.number_of_nodes()))  # nodes by order of first appearance


def _families(n: int = 300):
    rng = np.random.default_rng(1)
    for i in range(n):
        k = int(rng.integers(1, 13))
        kind = i % 5
        if kind == 0:
            yield nx.random_labeled_tree(k, seed=i)
        elif kind == 1:  # several components
            yield nx.disjoint_union(nx.gnp_random_graph(k, 0.4, seed=i), nx.cycle_graph(3))
        else:
            yield nx.gnp_random_graph(k, float(rng.uniform(0.05, 0.6)), seed=i)


def test_walk_covers_every_edge_and_only_edges() -> None:
    """Consecutive nodes are adjacent in G (eulerization only duplicates edges), every edge is covered, and
    <jump> joins different components."""
    for i, G in enumerate(_families()):
        toks, first = gg._serialize(G, CFG, None, None, None, i)
        node_at = {int(toks[p]): v for v, p in first.items()}
        assert len(node_at) == G.number_of_nodes()
        covered, seen, prev = set(), set(), None
        for t in toks:
            if t == gg.JUMP:
                prev = "jump"
                continue
            v = node_at[int(t)]
            if prev == "jump":
                assert v not in seen  # a new component
            elif prev is not None:
                assert G.has_edge(prev, v)
                covered.add(frozenset((prev, v)))
            seen.add(v)
            prev = v
        assert covered == {frozenset(e) for e in G.edges}
        assert toks.count(gg.JUMP) == nx.number_connected_components(G) - 1


def test_shortened_walk_length_bounds() -> None:
    """The walk has at most 1 + |E after eulerization| visits and at least 1 + |E| (every edge once)."""
    for i, G in enumerate(_families(100)):
        if not nx.is_connected(G) or G.number_of_edges() == 0:
            continue
        toks = gg.graph_to_sequence(G, CFG, seed=i)
        eul = nx.eulerize(nx.MultiGraph(G)) if not nx.is_eulerian(G) else G
        assert G.number_of_edges() + 1 <= len(toks) <= eul.number_of_edges() + 1


def test_cyclic_reindex_is_consecutive_mod_scope_and_deterministic() -> None:
    G = nx.petersen_graph()
    starts = set()
    for seed in range(30):
        toks = gg.graph_to_sequence(G, gg.SerializeConfig(node_scope=12), seed=seed)
        firsts = list(dict.fromkeys(int(t) for t in toks))
        assert len(firsts) == 10
        s = firsts[0]
        assert firsts == [(s + k) % 12 for k in range(10)]
        starts.add(s)
        assert toks == gg.graph_to_sequence(G, gg.SerializeConfig(node_scope=12), seed=seed)
    assert len(starts) > 5  # the start is drawn, not fixed
    seq = gg.graph_to_sequence(G, gg.SerializeConfig(node_scope=12, reindex="seq"), seed=0)
    assert list(dict.fromkeys(int(t) for t in seq)) == list(range(10))


def test_scope_base_tokens_and_start() -> None:
    cfg = gg.SerializeConfig(node_scope=64, scope_base=8, reindex="seq")
    G = nx.path_graph(10)
    toks = gg.graph_to_sequence(G, cfg, start=0, seed=0)
    assert toks[:2] == ["0*8", "0"] and toks[-2:] == [
        "1*8",
        "1",
    ]  # index 9 = 1*8 + 1, a path walked end to end
    assert nx.is_isomorphic(gg.sequence_to_graph(toks, cfg), G)
    single = gg.graph_to_sequence(nx.empty_graph(1), CFG, seed=3)
    assert len(single) == 1 and gg.sequence_to_graph(single, CFG).number_of_nodes() == 1


def test_smtp_mask_fraction_schedule_and_labels() -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (200, 30), generator=g)
    maskable = torch.rand(200, 30, generator=g) < 0.7
    maskable[:, 0] = True
    for power in (1.0, 2.0):
        inputs, labels, w = gg.smtp_mask(ids, 1, maskable=maskable, power=power, generator=g)
        u = (power / w).double()
        k = (labels != -100).sum(1)
        n = maskable.sum(1)
        want = torch.clamp(torch.ceil((1 - u**power) * n - 1e-6), min=1)
        assert torch.all((k - want).abs() <= 1e-9 + (k == 1).long())  # ceil of 1 - u^p (>= 1)
        assert torch.all(k >= 1)
        assert torch.all((labels != -100) <= maskable)  # only maskable positions
        assert torch.equal(labels[labels != -100], ids[labels != -100])
        assert torch.all(inputs[labels != -100] == 1) and torch.equal(
            inputs[labels == -100], ids[labels == -100]
        )
    keep, lab, _ = gg.smtp_mask(ids, 1, mtp=(0.0, 0.0, 1.0), seed=0)
    assert torch.equal(keep, ids) and (lab != -100).any()
    rnd, lab, _ = gg.smtp_mask(ids, 1, mtp=(0.0, 1.0, 0.0), random_ids=torch.arange(50, 55), seed=0)
    assert torch.all((rnd[lab != -100] >= 50) & (rnd[lab != -100] < 55))
    _, lab, _ = gg.smtp_mask(ids, 1, schedule="cosine", u_range=(0.5, 0.5), seed=0)
    assert torch.all((lab != -100).sum(1) == 15)  # 0.5 + 0.5 cos(pi/2) = 0.5 of 30


def test_model_causality_and_bidirectionality() -> None:
    ids = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    later = ids.clone()
    later[:, -1] = (later[:, -1] + 1) % 20
    for causal in (True, False):
        m = gg.GraphGPTModel(20, 16, 1, 2, causal=causal, seed=0)
        h1, h2 = m(ids), m(later)
        same_prefix = torch.allclose(h1[:, :-1], h2[:, :-1], atol=1e-6)
        assert same_prefix is causal
    m = gg.GraphGPTModel(20, 16, 1, 2, causal=False, seed=0)  # right padding leaves the real tokens unchanged
    am = torch.ones(2, 12, dtype=torch.bool)
    am[:, 9:] = False
    padded = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(m(padded, am)[:, :9], m(ids), atol=1e-5, rtol=1e-5)


def test_ntp_and_smtp_losses_train() -> None:
    tok = gg.GraphTokenizer(gg.SerializeConfig(node_scope=12))
    gs = [nx.cycle_graph(k) for k in range(3, 9)] * 4
    for causal, objective in ((True, "ntp"), (False, "smtp")):
        m = gg.GraphGPTModel(len(tok), 32, 1, 2, causal=causal, seed=0)
        losses = gg.pretrain(m, tok, gs, 40, objective=objective, batch_size=16, lr=3e-3, seed=0, views=2)
        assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3
    ids, am = tok.batch(gs[:3], seed=0)
    assert math.isfinite(float(gg.ntp_loss(gg.GraphGPTModel(len(tok), 16, 1, 2, causal=True), ids, am)))


def test_smtp_reduce_hand_computed_official_and_masked_mean() -> None:
    # 2 rows x 3 positions; row 0 masks positions 0, 2 (u = 0.5 -> weight 2), row 1 position 1 (u = 0.25 -> 4)
    tok = torch.tensor([[1.0, 9.0, 3.0], [9.0, 2.0, 9.0]])
    sel = torch.tensor([[True, False, True], [False, True, False]])
    w = torch.tensor([2.0, 4.0])
    assert float(gg.smtp_reduce(tok, sel)) == pytest.approx((1 + 3 + 2) / 3)  # plain masked mean
    assert float(gg.smtp_reduce(tok, sel, w)) == pytest.approx((2 * 1 + 2 * 3 + 4 * 2) / 3)
    # official dlm_wgt: the weighted sum over batch x sequence length, here 2 x 3
    assert float(gg.smtp_reduce(tok, sel, w, normalize="length")) == pytest.approx(16 / 6)
    # the official collator pads the length 3 up to 8: only the denominator changes
    assert float(gg.smtp_reduce(tok, sel, w, normalize="length", pad_to_multiple_of=8)) == pytest.approx(
        16 / 16
    )
    # unit weights reduce to the plain mean (masked) and, with every position masked, so does "length"
    ones = torch.ones(2)
    assert float(gg.smtp_reduce(tok, sel, ones)) == pytest.approx(float(tok[sel].mean()))
    every = torch.ones_like(sel)
    assert float(gg.smtp_reduce(tok, every, ones, normalize="length")) == pytest.approx(float(tok.mean()))
    with pytest.raises(ValueError, match="normalize"):
        gg.smtp_reduce(tok, sel, normalize="sum")
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        gg.smtp_reduce(tok, sel, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="weight"):
        gg.smtp_reduce(tok, sel, torch.ones(3))
    with pytest.raises(ValueError, match="selected"):
        gg.smtp_reduce(tok, sel.float())


def test_smtp_loss_official_weighting_matches_the_hand_reduction() -> None:
    tok = gg.GraphTokenizer(gg.SerializeConfig(node_scope=12))
    ids, am = tok.batch([nx.cycle_graph(k) for k in (3, 5, 7)], seed=0)
    m = gg.GraphGPTModel(len(tok), 16, 1, 2, causal=False, seed=0)

    def loss(**kw):
        return float(gg.smtp_loss(m, ids, am, tok.mask_id, generator=torch.Generator().manual_seed(3), **kw))

    inputs, labels, w = gg.smtp_mask(
        ids, tok.mask_id, maskable=am, generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(
            m.logits(m(inputs, am)).transpose(1, 2), labels, ignore_index=-100, reduction="none"
        )
    sel = labels != -100
    official = float((ce * w[:, None])[sel].sum() / (ids.shape[0] * 8 * math.ceil(ids.shape[1] / 8)))
    with torch.no_grad():
        assert loss(dlm_weight=True, normalize="length", pad_to_multiple_of=8) == pytest.approx(
            official, rel=1e-5
        )
        assert loss() == pytest.approx(float(ce[sel].mean()), rel=1e-5)
        # u = 1 at power 1 gives weight 1: the dlm-weighted masked mean is the plain mean
        one = {"u_range": (1.0, 1.0)}
        assert loss(dlm_weight=True, **one) == pytest.approx(loss(**one), rel=1e-6)


def test_official_warmup_decay_schedule_lr_at_start_warmup_end_and_last_step() -> None:
    steps, warmup, peak = 100, 10, 1e-3
    lin = torch.nn.Linear(2, 2)
    opt, sched = gg.pretrain_optimizer(lin, steps, lr=peak, eps=1e-6, schedule="warmup_decay", warmup=warmup)
    assert opt.defaults["eps"] == 1e-6 and opt.defaults["betas"] == (0.9, 0.95)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # DeepSpeed: step 0 at warmup_min_lr 0; step k at gamma(k - 1), log(i + 1) / log(W) during warm-up
    assert lrs[0] == 0.0 and lrs[1] == 0.0
    assert lrs[2] == pytest.approx(peak * math.log(2) / math.log(warmup))
    assert lrs[warmup] == pytest.approx(peak)  # end of warm-up: gamma(W - 1) = log W / log W
    assert lrs[warmup + 1] == pytest.approx(peak)  # first decay step: (T - W) / (T - W)
    assert lrs[warmup + 2] == pytest.approx(peak * (steps - warmup - 1) / (steps - warmup))
    assert lrs[-1] == pytest.approx(peak * 2 / (steps - warmup))  # last step: linear decay to 0 at T
    assert gg.warmup_decay_factor(steps + 1, steps, warmup) == 0.0
    assert all(b <= a for a, b in zip(lrs[warmup + 1 :], lrs[warmup + 2 :], strict=False))
    assert gg.warmup_decay_factor(6, steps, warmup, "linear") == pytest.approx(5 / warmup)
    opt, sched = gg.pretrain_optimizer(lin, steps, lr=peak)  # ours: constant, PyTorch's eps
    assert opt.defaults["eps"] == 1e-8 and opt.param_groups[0]["lr"] == peak
    for bad, match in (
        ({"schedule": "cosine"}, "schedule"),
        ({"warmup_type": "exp"}, "warmup_type"),
        ({"eps": 0.0}, "eps"),
        ({"warmup": -1}, "warmup"),
    ):
        with pytest.raises(ValueError, match=match):
            gg.pretrain_optimizer(lin, steps, **bad)


def test_pretrain_continues_one_schedule_across_calls_with_the_official_loss() -> None:
    tok = gg.GraphTokenizer(gg.SerializeConfig(node_scope=12))
    gs = [nx.cycle_graph(k) for k in range(3, 9)] * 4
    m = gg.GraphGPTModel(len(tok), 32, 1, 2, causal=False, seed=0)
    pair = gg.pretrain_optimizer(m, 40, lr=3e-3, eps=1e-6, schedule="warmup_decay", warmup=4)
    official = {"dlm_weight": True, "normalize": "length", "pad_to_multiple_of": 8}
    losses = []
    for chunk in range(4):
        losses += gg.pretrain(m, tok, gs, 10, batch_size=16, seed=chunk, views=2, optimizer=pair, **official)
    assert len(losses) == 40 and all(math.isfinite(v) and v > 0 for v in losses)
    assert pair[1].last_epoch == 40  # one schedule across the four calls, not four restarts
    assert pair[0].param_groups[0]["lr"] == pytest.approx(3e-3 * gg.warmup_decay_factor(40, 40, 4))
    assert len(pair[0].state) == len(list(m.parameters()))  # the Adam moments carried over
    with pytest.raises(TypeError, match="optimizer"):
        gg.pretrain(m, tok, gs, 1, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))


def test_experiment_defaults_are_official_and_ours_is_reachable() -> None:
    assert (exp.FULL.loss, exp.FULL.optimizer) == ("official", "official")
    assert (exp.Setting.loss, exp.Setting.optimizer) == ("official", "official")
    assert (exp.QUICK.loss, exp.QUICK.optimizer) == ("mean", "ours")  # the quick gate's budget (docstring)


def test_tokenizer_roundtrip_save_load_and_unknown(tmp_path) -> None:
    G = nx.Graph([(0, 1), (1, 2)])
    nx.set_node_attributes(G, {0: "C", 1: "N", 2: "C"}, "el")
    nx.set_edge_attributes(G, {(0, 1): 1, (1, 2): 2}, "bond")
    tok = gg.GraphTokenizer.from_graphs([G], CFG, node_attr="el", edge_attr="bond")
    ids = tok.encode(G, seed=0)
    assert ids[0] == tok.token_to_id[gg.BOS] and ids[-1] == tok.eos_id
    H = tok.decode(ids)
    assert nx.is_isomorphic(
        G, H, node_match=lambda a, b: a["el"] == b["el"], edge_match=lambda a, b: a["bond"] == b["bond"]
    )
    tok2 = gg.GraphTokenizer.from_pretrained(tok.save_pretrained(tmp_path / "tok"))
    assert tok2.vocab == tok.vocab and tok2.encode(G, seed=0) == ids
    G.nodes[2]["el"] = "O"
    with pytest.warns(UserWarning, match="outside the vocabulary"):
        ids = tok.encode(G, seed=0)
    assert tok.token_to_id[gg.UNK_NA] in ids
    assert None in nx.get_node_attributes(tok.decode(ids), "el").values()
    strict = gg.GraphTokenizer(
        gg.SerializeConfig(node_scope=32, strict=True), "el", "bond", ["C", "N"], [1, 2]
    )
    with pytest.raises(ValueError, match="strict=True"):
        strict.encode(G)


# ---- §8 bad inputs, one test each ----------------------------------------------------------------------
def test_directed_graph_is_serialized_undirected_with_warning() -> None:
    D = nx.DiGraph([(0, 1), (1, 2), (2, 0)])
    with pytest.warns(UserWarning, match="directed"):
        toks = gg.graph_to_sequence(D, CFG, seed=0)
    assert nx.is_isomorphic(gg.sequence_to_graph(toks, CFG), nx.cycle_graph(3))


def test_self_loops_raise() -> None:
    with pytest.raises(ValueError, match=r"G must have no self-loops.*got 1"):
        gg.graph_to_sequence(nx.Graph([(0, 1), (1, 1)]), CFG)


def test_multigraph_raises_unless_allow_multi() -> None:
    M = nx.MultiGraph([(0, 1), (0, 1), (1, 2)])
    with pytest.raises(ValueError, match=r"multigraph.*allow_multi"):
        gg.graph_to_sequence(M, CFG)
    with pytest.warns(UserWarning, match="collapsing parallel edges"):
        toks = gg.graph_to_sequence(M, gg.SerializeConfig(node_scope=32, allow_multi=True), seed=0)
    assert nx.is_isomorphic(gg.sequence_to_graph(toks, CFG), nx.path_graph(3))


def test_more_nodes_than_scope_raises_with_hint() -> None:
    with pytest.raises(ValueError, match=r"13 nodes but node_scope=12.*increase SerializeConfig.node_scope"):
        gg.graph_to_sequence(nx.path_graph(13), gg.SerializeConfig(node_scope=12))


def test_unknown_attribute_values() -> None:
    G = nx.path_graph(2)
    nx.set_node_attributes(G, "C", "el")
    tok = gg.GraphTokenizer(CFG, node_attr="el", node_values=["N"])
    with pytest.warns(UserWarning, match="encoded as unknown"):
        tok.encode(G, seed=0)
    G.nodes[0]["el"] = object()
    with pytest.raises(TypeError, match="node_attr values must be Python literals"):
        gg.graph_to_sequence(G, CFG, node_attr="el")
    with pytest.raises(ValueError, match="node_attr='missing' is missing on 2 node"):
        gg.graph_to_sequence(G, CFG, node_attr="missing")


def test_empty_graph_raises() -> None:
    with pytest.raises(ValueError, match="G must have at least one node"):
        gg.graph_to_sequence(nx.Graph(), CFG)
    with pytest.raises(TypeError, match="G must be a networkx graph"):
        gg.graph_to_sequence([(0, 1)], CFG)


@pytest.mark.parametrize(
    ("tokens", "cfg", "match"),
    [
        ([], CFG, "non-empty"),
        (["<edge_bi>", "1"], CFG, "expected a node index"),
        (["1", "<edge_bi>"], CFG, "expected a node after it"),
        (["1", "<jump>"], CFG, "where a node index was expected"),
        (["1", "1"], CFG, "self-loop"),
        (["1", "2", "<jump>", "2"], CFG, "already seen"),
        (["40"], CFG, "outside"),
        (["1", "2"], gg.SerializeConfig(node_scope=32, edge_types=True), "expected <edge_bi> or <jump>"),
        (["0*8"], gg.SerializeConfig(node_scope=32, scope_base=8), "low index token"),
        (["3", "<na:1>", "4", "3", "<na:2>"], CFG, "conflicting"),
        (["3", "<na:(>"], CFG, "not a valid na attribute"),
    ],
)
def test_malformed_sequences_raise(tokens, cfg, match) -> None:
    with pytest.raises(ValueError, match=match):
        gg.sequence_to_graph(tokens, cfg)


def test_estimator_rejected_fit_keeps_state_and_not_fitted() -> None:
    clf = gg.GraphGPTClassifier(CFG, hidden=16, layers=1, heads=2, epochs=1)
    with pytest.raises(ValueError, match="GraphGPTClassifier is not fitted"):
        clf.predict([nx.path_graph(3)])
    gs = [nx.path_graph(3), nx.cycle_graph(3)]
    clf.fit(gs, [0, 1])
    before = [p.detach().clone() for p in clf.model_.parameters()]
    with pytest.raises(ValueError, match="graphs\\[1\\] must have no self-loops"):
        clf.fit([nx.path_graph(3), nx.Graph([(0, 0)])], [0, 1])
    with pytest.raises(ValueError, match="y must be 1-D with one label per graph"):
        clf.fit(gs, [0, 1, 1])
    assert all(torch.equal(a, b) for a, b in zip(before, clf.model_.parameters()))


# ---- heads -------------------------------------------------------------------------------------------
def test_graph_head_learns_connectivity_and_node_edge_heads_read_targets() -> None:
    rng = np.random.default_rng(0)
    gs, y = [], []
    for i in range(40):
        k = int(rng.integers(4, 8))
        G = nx.path_graph(k) if i % 2 else nx.disjoint_union(nx.path_graph(k - 2), nx.path_graph(2))
        gs.append(G)
        y.append(i % 2)
    clf = gg.GraphGPTClassifier(
        CFG, hidden=32, layers=1, heads=2, epochs=15, lr=3e-3, batch_size=8, fit_views=4
    )
    assert clf.fit(gs, y).score(gs, y) >= 0.9  # disconnected <=> a <jump> token
    G = nx.star_graph(5)
    node = gg.GraphGPTClassifier(CFG, task="node", hidden=16, layers=1, heads=2, epochs=2)
    node.fit([G] * 6, [1, 0, 0, 0, 0, 0], targets=list(range(6)))
    ids, where = node._encode(G, 3, seed=0)
    assert where == [1]  # the walk starts at the target node (after <bos>)
    edge = gg.GraphGPTClassifier(CFG, task="edge", hidden=16, layers=1, heads=2, epochs=2)
    edge.fit([G] * 4, [0, 1, 0, 1], targets=[(0, 1), (0, 2), (0, 3), (0, 4)])
    ids, where = edge._encode(G, (2, 0), seed=0)
    assert where == [1, 2] and ids[2] == ids[4]  # u first, then the hub v, then back to it (a star walk)
    assert edge.predict_proba([G], targets=[(0, 5)]).shape == (1, 2)
    with pytest.raises(ValueError, match="targets\\[0\\] must be a \\(u, v\\) pair"):
        edge.predict([G], targets=[(0, 9)])
    sub = gg.ego_subgraph(nx.path_graph(10), (4, 5), radius=1)
    assert sorted(sub.nodes) == [3, 4, 5, 6]


# ---- reproduction --------------------------------------------------------------------------------------
def test_matched_triangle_task_removes_the_size_shortcut() -> None:
    from sklearn.linear_model import LogisticRegression

    gs, y = exp.triangle_task(1200, seed=10_000)
    X = exp.degree_features(gs)[:, :2]
    lr = LogisticRegression().fit((X[:200] - X[:200].mean(0)) / X[:200].std(0), y[:200])
    assert lr.score((X[200:] - X[:200].mean(0)) / X[:200].std(0), y[200:]) <= exp.MAX_NM_ACC
    assert abs(y.mean() - 0.5) < 0.05


def _broken_serialize(G, cfg, seed=None, **kw):
    """Node identity removed: every visit gets an independent random index (not reversible)."""
    toks = gg.graph_to_sequence(G, cfg, seed=seed, **kw)
    rng = np.random.default_rng(seed)
    return [t if t.startswith("<") else str(int(rng.integers(cfg.node_scope))) for t in toks]


def test_quick_reproduction_passes() -> None:
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.checks
    assert report.metrics["roundtrip_fraction"] == 1.0
    assert report.metrics["masked_node_loss"] < report.metrics["masked_node_loss_init"] - 0.8


def test_broken_serialization_fails_the_quick_gate() -> None:
    report = exp.evaluate(exp.QUICK, seed=0, serialize=_broken_serialize)
    assert report.passed is False
    assert report.failed_checks == [c.name for c in exp.checks(exp.QUICK)]  # both checks fail
    assert report.metrics["masked_node_loss"] > math.log(32) - 0.3


@pytest.mark.slow
def test_full_reproduction_is_the_recorded_known_miss() -> None:
    """The full run (about 20 min of CPU; recorded with the official loss and optimiser: pre-trained 0.619 vs
    scratch 0.634, 3 seeds) misses only the transfer margin: pre-training learns the sequences, every other
    gate holds."""
    report = exp.run(quick=False, seed=0)
    assert report.passed is False
    assert report.failed_checks == ["pretrained acc >= scratch acc + 0.05"]
    assert report.metrics["masked_node_loss"] < report.metrics["unigram_floor"] - 0.8
