"""Tests of P54 ARROW's integrations (issue 22): DataFrame column names and tigramite's graph layout.

Each item is checked against the real library: pandas DataFrames, networkx graphs, and tigramite's own
``links_to_graph`` / ``dag_to_links`` helpers and ``PCMCI.run_pcmci`` output.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone

import icml25.causal_discovery.arrow as arrow_pkg
from icml25.causal_discovery.arrow import (
    ARROW,
    feature_names,
    from_tigramite_graph,
    reverse_mark,
    simulate_svar,
    to_tigramite_graph,
)

pd = pytest.importorskip("pandas")
NAMES = ["temp", "wind", "rain", "sun", "fog"]


def _edges(G) -> set[tuple]:
    return {(u, v, G.edges[u, v]["lags"]) for u, v in G.edges}


# --------------------------------------------------------------------------------- DataFrame names
def test_dataframe_fit_sets_feature_names_and_names_the_nodes() -> None:
    X, _ = simulate_svar(d=5, T=1000, rng=0)
    df = pd.DataFrame(X, columns=NAMES)
    by_array = ARROW(base="granger", lag_max=6).fit(X)
    model = ARROW(base="granger", lag_max=6).fit(df)
    assert not hasattr(by_array, "feature_names_in_")  # scikit-learn: arrays set no names
    assert model.feature_names_in_.dtype == object and model.feature_names_in_.tolist() == NAMES
    assert model.n_features_in_ == 5
    # the names change nothing else: same candidates, same graph
    assert model.candidates_ == by_array.candidates_ and np.array_equal(model.graph_, by_array.graph_)
    G, G_idx = model.to_networkx(), by_array.to_networkx()
    assert list(G.nodes) == NAMES and list(G_idx.nodes) == list(range(5))
    assert _edges(G) == {(NAMES[u], NAMES[v], lags) for u, v, lags in _edges(G_idx)}
    assert len(G.edges) == int(model.summary_.sum()) > 0
    for u, v in G.edges:  # edge cause -> effect is graph_[effect, cause]
        i, j = NAMES.index(v), NAMES.index(u)
        assert G.edges[u, v]["lags"] == tuple(np.nonzero(model.graph_[i, j])[0].tolist())
        assert G.edges[u, v]["score"] == pytest.approx(float(model.scores_[i, j]))
    # explicit names win; a refit on an array forgets the names (scikit-learn's reset)
    assert list(model.to_networkx(names=list("ABCDE")).nodes) == list("ABCDE")
    model.fit(X)
    assert not hasattr(model, "feature_names_in_") and list(model.to_networkx().nodes) == list(range(5))
    assert clone(ARROW(base="granger", lag_max=6)).fit(df).feature_names_in_.tolist() == NAMES


def test_feature_names_follow_scikit_learn_rules() -> None:
    X, _ = simulate_svar(d=3, T=1000, rng=1)
    from sklearn.utils.validation import _get_feature_names  # the reference behaviour

    for columns in (["a", "b", "c"], [0, 1, 2], pd.RangeIndex(3)):
        df = pd.DataFrame(X, columns=columns)
        ours, ref = feature_names(df), _get_feature_names(df)
        assert (ours is None) == (ref is None)
        if ref is not None:
            assert ours.tolist() == ref.tolist()
    assert feature_names(X) is None
    assert not hasattr(ARROW(base="granger", lag_max=6).fit(pd.DataFrame(X)), "feature_names_in_")
    mixed = pd.DataFrame(X, columns=["a", 1, "c"])
    with pytest.raises(TypeError):
        _get_feature_names(mixed)
    model = ARROW(base="granger", lag_max=6).fit(pd.DataFrame(X, columns=["a", "b", "c"]))
    graph = model.graph_.copy()
    with pytest.raises(TypeError, match=r"X's column names must be all strings .* \['int', 'str'\]"):
        model.fit(mixed)
    assert model.feature_names_in_.tolist() == ["a", "b", "c"] and np.array_equal(model.graph_, graph)


class _Table:
    """A DataFrame-like object that is not pandas: ``.columns`` and ``__array__``."""

    def __init__(self, values: np.ndarray, columns: list[str]) -> None:
        self.values, self.columns = values, columns

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.values if dtype is None else self.values.astype(dtype)


def test_names_are_duck_typed_and_arrow_never_imports_pandas() -> None:
    X, _ = simulate_svar(d=3, T=1000, rng=2)
    model = ARROW(base="granger", lag_max=6).fit(_Table(X, ["x", "y", "z"]))
    assert model.feature_names_in_.tolist() == ["x", "y", "z"]
    assert set(model.to_networkx().nodes) == {"x", "y", "z"}
    for path in Path(arrow_pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "pandas" for a in node.names), path
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "pandas", path


# ------------------------------------------------------------------------------ tigramite layout
def _tigramite_links(graph: np.ndarray) -> dict[int, list[tuple[int, int]]]:
    """tigramite's parents dict ``{target: [(source, -lag), ...]}`` of a bool ``[effect, cause, lag]`` graph."""
    d = graph.shape[0]
    return {i: [(int(j), -int(t)) for j, t in zip(*np.nonzero(graph[i]))] for i in range(d)}


@st.composite
def lagged_dags(draw: st.DrawFn) -> np.ndarray:
    """bool [d, d, L] graphs whose lag-0 part is a DAG (random order), any lagged links."""
    d = draw(st.integers(1, 5))
    L = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    g = rng.random((d, d, L)) < draw(st.floats(0.0, 0.6))
    order = rng.permutation(d)
    rank = np.empty(d, dtype=int)
    rank[order] = np.arange(d)
    g[:, :, 0] &= rank[None, :] < rank[:, None]  # cause j before effect i in the order
    return g


@settings(max_examples=60, deadline=None)
@given(lagged_dags())
def test_to_tigramite_graph_equals_tigramite_links_to_graph_and_round_trips(g: np.ndarray) -> None:
    from tigramite.toymodels.structural_causal_processes import dag_to_links, links_to_graph

    tig = to_tigramite_graph(g)
    assert tig.shape == g.shape and tig.dtype == np.dtype("<U3")
    assert np.array_equal(tig, links_to_graph(_tigramite_links(g), tau_max=g.shape[2] - 1))
    assert np.array_equal(tig[:, :, 0], np.vectorize(reverse_mark)(tig[:, :, 0]).T)  # lag-0 symmetry
    parents = {k: sorted((int(a), int(b)) for a, b in v) for k, v in dag_to_links(tig).items()}
    assert parents == {k: sorted(v) for k, v in _tigramite_links(g).items()}
    back = from_tigramite_graph(tig)
    assert back.dtype == bool and np.array_equal(back, g)
    assert np.array_equal(to_tigramite_graph(back), tig)
    padded = to_tigramite_graph(g, tau_max=g.shape[2] + 1)
    assert np.array_equal(padded[:, :, : g.shape[2]], tig) and (padded[:, :, g.shape[2] :] == "").all()


def test_hand_built_layout() -> None:
    g = np.zeros((3, 3, 3), dtype=bool)
    g[1, 0, 0] = True  # x0(t) -> x1(t)
    g[2, 1, 2] = True  # x1(t-2) -> x2(t)
    g[0, 0, 1] = True  # x0(t-1) -> x0(t)
    tig = to_tigramite_graph(g)
    expected = np.zeros((3, 3, 3), dtype="<U3")
    expected[0, 1, 0], expected[1, 0, 0] = "-->", "<--"
    expected[1, 2, 2] = "-->"
    expected[0, 0, 1] = "-->"
    assert np.array_equal(tig, expected)
    assert np.array_equal(from_tigramite_graph(tig.astype(object)), g)  # object arrays of str too
    assert np.array_equal(to_tigramite_graph(g.astype(np.int64)), tig)  # 0/1 integers too


def test_from_tigramite_graph_undetermined_marks() -> None:
    tig = np.zeros((4, 4, 2), dtype="<U3")
    tig[0, 1, 0], tig[1, 0, 0] = "o-o", "o-o"  # PCMCI+ unoriented contemporaneous link
    tig[1, 2, 0], tig[2, 1, 0] = "o->", "<-o"  # PAG: x1 -> x2 possible, x2 -> x1 excluded
    tig[2, 3, 0], tig[3, 2, 0] = "<->", "<->"  # latent confounder: no direct cause either way
    tig[3, 0, 1] = "x->"  # conflicting lagged mark: forward in time only
    tig[0, 0, 1] = "-->"
    with pytest.raises(ValueError, match=r"graph\[0, 1, 0\] = 'o-o' does not fix a direction"):
        from_tigramite_graph(tig)
    dropped = from_tigramite_graph(tig, ambiguous="drop")
    assert {tuple(int(v) for v in e) for e in np.argwhere(dropped)} == {(0, 0, 1)}
    possible = from_tigramite_graph(tig, ambiguous="possible")
    assert {tuple(int(v) for v in e) for e in np.argwhere(possible)} == {
        (1, 0, 0),  # x0(t) -> x1(t) from o-o
        (0, 1, 0),  # x1(t) -> x0(t) from o-o
        (2, 1, 0),  # x1(t) -> x2(t) from o->
        (0, 3, 1),  # x3(t-1) -> x0(t) from x->
        (0, 0, 1),
    }
    assert {reverse_mark(m) for m in ("-->", "o->", "x-o", "<->", "")} == {"<--", "<-o", "o-x", "<->", ""}


def test_converter_bad_inputs_name_the_argument() -> None:
    g = np.zeros((2, 2, 3), dtype=bool)
    with pytest.raises(TypeError, match="graph must be a bool"):
        to_tigramite_graph(g.astype(str))
    with pytest.raises(ValueError, match=r"graph must be a \[d, d, L\] array .* got shape \(2, 3, 3\)"):
        to_tigramite_graph(np.zeros((2, 3, 3), dtype=bool))
    with pytest.raises(ValueError, match=r"only 0/1 .* got 2"):
        to_tigramite_graph(np.full((2, 2, 3), 2))
    with pytest.raises(ValueError, match="NaN"):
        to_tigramite_graph(np.full((2, 2, 3), np.nan))
    loop = g.copy()
    loop[1, 1, 0] = True
    with pytest.raises(ValueError, match="lag-0 self loop at variable 1"):
        to_tigramite_graph(loop)
    cycle = g.copy()
    cycle[0, 1, 0] = cycle[1, 0, 0] = True
    with pytest.raises(ValueError, match="lag-0 two-cycle between variables 0 and 1"):
        to_tigramite_graph(cycle)
    lagged = g.copy()
    lagged[0, 1, 2] = True
    with pytest.raises(ValueError, match=r"tau_max must be an int >= 2 .* got 1"):
        to_tigramite_graph(lagged, tau_max=1)
    assert to_tigramite_graph(g, tau_max=1).shape == (2, 2, 2)  # no edge is lost: truncating is fine

    tig = np.zeros((2, 2, 2), dtype="<U3")
    with pytest.raises(TypeError, match="graph must be a string array"):
        from_tigramite_graph(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="shape"):
        from_tigramite_graph(tig[:, :1])
    with pytest.raises(ValueError, match="ambiguous must be"):
        from_tigramite_graph(tig, ambiguous="both")
    bad = tig.copy()
    bad[0, 1, 1] = "-?>"
    with pytest.raises(ValueError, match=r"unknown link marks \['-\?>'\]"):
        from_tigramite_graph(bad)
    bad = tig.copy()
    bad[0, 1, 0] = "-->"
    with pytest.raises(ValueError, match=r"lag 0 must be symmetric: graph\[0, 1, 0\] = '-->' needs .* '<--'"):
        from_tigramite_graph(bad)
    bad = tig.copy()
    bad[0, 1, 1] = "<--"
    with pytest.raises(ValueError, match="back to"):
        from_tigramite_graph(bad)
    bad = tig.copy()
    bad[1, 1, 0] = "o-o"
    with pytest.raises(ValueError, match="lag-0 self link"):
        from_tigramite_graph(bad)
    with pytest.raises(ValueError, match="not fitted"):
        ARROW().to_tigramite_graph()


def test_arrow_pcmci_graph_equals_tigramite_pcmci_on_the_same_links() -> None:
    pytest.importorskip("tigramite")
    from tigramite.data_processing import DataFrame
    from tigramite.independence_tests.parcorr import ParCorr
    from tigramite.pcmci import PCMCI

    X, _ = simulate_svar(d=5, T=1000, n_parents=1, rng=3)
    kw = {"pc_alpha": 0.05, "alpha_level": 0.01}
    model = ARROW(base="pcmci", lag_max=6, base_kwargs=kw, readout="all").fit(pd.DataFrame(X, columns=NAMES))
    assumptions = {i: {(j, -tau): "-?>" for j, tau in model.links_[i]} for i in range(5)}
    lags = [tau for pairs in model.links_.values() for _, tau in pairs]
    res = PCMCI(dataframe=DataFrame(X, var_names=NAMES), cond_ind_test=ParCorr(), verbosity=0).run_pcmci(
        link_assumptions=assumptions, tau_min=min(lags), tau_max=max(lags), **kw
    )
    ours = model.to_tigramite_graph(tau_max=max(lags))
    assert np.array_equal(ours, res["graph"])
    assert np.array_equal(from_tigramite_graph(res["graph"]), model.graph_[:, :, : max(lags) + 1])
    assert (res["graph"] == "-->").sum() == model.graph_.sum() > 0
    # networkx names and the tigramite graph describe the same links
    G = model.to_networkx()
    for src, tgt, tau in zip(*np.nonzero(ours == "-->")):
        assert tau in G.edges[NAMES[src], NAMES[tgt]]["lags"]
    # the unrestricted base (run_base_only) is PCMCI's own graph too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        base_graph, _ = model.run_base_only(X, tau_max=3)
    full = PCMCI(dataframe=DataFrame(X), cond_ind_test=ParCorr(), verbosity=0).run_pcmci(
        tau_min=1, tau_max=3, **kw
    )
    assert np.array_equal(to_tigramite_graph(base_graph), full["graph"])
