"""Hostile-input contract of icml25.causal_discovery (CONTRIBUTING.md, "Bad input contract").

P07 MAG listing, P54 ARROW, P48 best subset selection, P08 fair coresets and P39 true-false labels: every public callable is registered with a
valid example call; :mod:`icml25.kernels.testing` derives the hostile variants and asserts a clear error or a documented,
finite result; ARROW, OptimalPursuitRegressor, FairCoreset and TFLClassifier keep their fitted state after a rejected ``fit``.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch

import icml25.causal_discovery as cd
from icml25.causal_discovery.arrow import from_tigramite_graph, to_tigramite_graph
from icml25.causal_discovery.mag_listing import ARROW as MARK_ARROW
from icml25.causal_discovery.mag_listing import TAIL
from icml25.kernels import testing as kt
from icml25.kernels.testing import HostileSpec

_rng = np.random.default_rng(0)
_X = _rng.normal(size=(120, 3)).cumsum(0)
_CHAIN = np.zeros((3, 3), dtype=np.int8)
for _i, _j in ((0, 1), (1, 2)):  # 0 -> 1 -> 2
    _CHAIN[_j, _i], _CHAIN[_i, _j] = TAIL, MARK_ARROW
_PAG = cd.pag_from_mag(cd.MAG(_CHAIN))
_BITS, _ = cd.time_weave(_X)
_SC = cd.xor_lag_scores(_BITS, 4)
_LAGGED = np.zeros((3, 3, 4), dtype=bool)
_LAGGED[1, 0, 0] = _LAGGED[2, 1, 2] = _LAGGED[0, 0, 1] = True  # lag 0: x0 -> x1; lagged x1 -> x2, x0 -> x0
_TIG = to_tigramite_graph(_LAGGED)
GRAPH_INTS = "marks are integer codes: any int-valued array is a candidate graph, checked for validity"
EMPTY_GRAPH = "a constant (all-zero) marks matrix is the empty graph, a valid graph"


_BX = _rng.normal(size=(40, 6))
_BY = _BX[:, :2] @ np.array([1.0, -2.0]) + 0.1 * _rng.normal(size=40)
BS_SCALE = "scale-free: X is rescaled internally (the exact criteria are invariant to column scales)"
BS_COLUMN_Y = "a column vector y [n, 1] is raveled with a DataConversionWarning, as in scikit-learn"
BS_CONSTANT = (
    "documented: constant (zero once centred) columns are excluded with a SelectionWarning; "
    "a constant y is fit exactly"
)


def _fitted_opr():
    model = cd.OptimalPursuitRegressor(2).fit(_BX, _BY)
    return model.fit, {"X": _BX, "y": _BY}, model


def _fitted_opr_predict():
    model = cd.OptimalPursuitRegressor(2).fit(_BX, _BY)
    return model.predict, {"X": _BX}, None


def _fitted_arrow():
    model = cd.ARROW(base="granger", lag_max=4, theta=0.0).fit(_X)
    return model.fit, {"X": _X}, model


_FX = _rng.normal(size=(60, 2)) + np.repeat([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]], 20, axis=0)
_FG = np.tile([0, 1, 1], 20)
_FD = np.linalg.norm(_FX[:, None] - _FX[None, :3], axis=2)
FC_SCALE = "distances are scale-free: any finite magnitude below the documented 1e150 is valid"
FC_STR = "documented: group labels may be strings (any int or str labels)"
FC_CONSTANT = "documented: coincident points (all distances 0) are valid data; every centre costs 0"


def _fc_oracles():
    return cd.StrongOracle.from_points(_FX), cd.WeakOracle.from_points(_FX, 0.2, seed=0)


def _fitted_fair_coreset():
    model = cd.FairCoreset(k=3, eps=0.3, seed=0).fit(np.arange(60), _FG, strong=_fc_oracles()[0],
                                                     weak=_fc_oracles()[1])  # fmt: skip

    def fit(indices, groups):
        return model.fit(indices, groups, strong=_fc_oracles()[0], weak=_fc_oracles()[1])

    return fit, {"indices": np.arange(60), "groups": _FG}, model


_TX = _rng.normal(size=(60, 4)) + 3.0 * np.eye(3, 4)[np.arange(60) % 3]
_TY = np.arange(60) % 3
_TYB, _TS = cd.make_tfl(_TY, 3, seed=0)
_TP = _rng.dirichlet(np.ones(3), size=60)
_TLOGITS = torch.as_tensor(_rng.normal(size=(8, 3)), dtype=torch.float32)
_TPRIOR = torch.softmax(torch.as_tensor(_rng.normal(size=(8, 3)), dtype=torch.float32), 1)
_EMB = torch.as_tensor(_rng.normal(size=(30, 6)), dtype=torch.float32)
TFL_CONSTANT_X = "constant features are valid data (the model then predicts from its bias terms)"
TFL_ANSWERS = (
    "all-True or all-False answers are valid TFL data (with a prior given, no self-training warning)"
)
TFL_FLOAT_LABELS = "integer-valued float class indices (and 0.0/1.0 answers) are accepted, as in scikit-learn"
COSINE_SCALE = "cosine similarity is scale-invariant (vectors are max-abs scaled before it)"
TIES = "equal embeddings tie: any of the tied indices is a correct retrieval"


def _fitted_tfl():
    model = cd.TFLClassifier((8,), epochs=1, seed=0).fit(_TX, _TYB, _TS, prior=_TP)

    def fit(X, y, s, prior):
        return model.fit(X, y, s, prior=prior)

    return fit, {"X": _TX, "y": _TYB, "s": _TS, "prior": _TP}, model


def _fitted_tfl_predict():
    model = cd.TFLClassifier((8,), epochs=1, seed=0).fit(_TX, _TYB, _TS, prior=_TP)
    return model.predict_proba, {"X": _TX}, None


SPECS = [
    HostileSpec("ARROW.fit", setup=_fitted_arrow, arrays=("X",), covers=("ARROW",), allow={}),
    HostileSpec(
        "ARROW(theta)",
        lambda theta: cd.ARROW(base="granger", lag_max=4, theta=theta).fit(_X),
        {"theta": 0.3},
        ("theta",),
        covers=("ARROW",),
        allow={
            "posinf": kt.Allow("theta = +inf keeps no candidate; theta_ records it", False),
            "neginf": kt.Allow("theta = -inf keeps every candidate up to the cap; theta_ records it", False),
        },
    ),
    HostileSpec(
        "to_tigramite_graph",
        to_tigramite_graph,
        {"graph": _LAGGED},
        ("graph",),
        allow={"constant": "an all-False graph is the empty graph (all '' entries)"},
    ),
    HostileSpec(
        "from_tigramite_graph",
        from_tigramite_graph,
        {"graph": _TIG},
        ("graph",),
        allow={
            "dtype": "the example is already a string array: astype(str) is the same valid graph",
            "constant": "an all-'' graph is the empty graph",
        },
    ),
    HostileSpec(
        "time_weave",
        cd.time_weave,
        {"X": _X},
        ("X",),
        allow={"constant": "documented: a constant series encodes to all-zero trend codes"},
    ),
    HostileSpec(
        "xor_lag_scores",
        cd.xor_lag_scores,
        {"bits": _BITS, "lag_max": 4},
        ("bits",),
        allow={"constant": "constant streams score finitely", "empty:1": "no variables: empty [0, 0] scores"},
    ),
    HostileSpec(
        "null_threshold",
        lambda bits: cd.null_threshold(bits, 4, n_shifts=3, rng=0),
        {"bits": _BITS},
        ("bits",),
        allow={"constant": "constant streams score finitely"},
    ),
    HostileSpec(
        "prune_candidates",
        cd.prune_candidates,
        {"score": _SC.score, "tau_star": _SC.tau_star, "theta": 0.1},
        ("score", "tau_star", "theta"),
        allow={
            "constant": "tied scores are valid (ties broken by index)",
            "huge": "a ranking: scale-free",
            "theta:posinf": "theta = +inf keeps none",
            "theta:neginf": "theta = -inf keeps all (capped)",
        },
    ),
    HostileSpec(
        "MAG", cd.MAG, {"marks": _CHAIN}, ("marks",), allow={"dtype": GRAPH_INTS, "constant": EMPTY_GRAPH}
    ),
    HostileSpec(
        "PAG", cd.PAG, {"marks": _PAG.marks}, ("marks",), allow={"dtype": GRAPH_INTS, "constant": EMPTY_GRAPH}
    ),
    HostileSpec(
        "is_mag",
        cd.is_mag,
        {"graph": _CHAIN},
        ("graph",),
        allow={"dtype": GRAPH_INTS, "constant": EMPTY_GRAPH},
    ),
    HostileSpec(
        "pag_from_mag",
        cd.pag_from_mag,
        {"mag": _CHAIN},
        ("mag",),
        allow={"dtype": GRAPH_INTS, "constant": EMPTY_GRAPH},
    ),
    HostileSpec(
        "markov_equivalent",
        cd.markov_equivalent,
        {"g1": _CHAIN, "g2": _CHAIN},
        ("g1", "g2"),
        allow={"dtype": GRAPH_INTS, "constant": EMPTY_GRAPH},
    ),
    HostileSpec(
        "list_mags",
        lambda marks: cd.list_mags(cd.PAG(marks)),
        {"marks": _PAG.marks},
        ("marks",),
        covers=("list_mags", "ListingStats"),
        allow={"dtype": GRAPH_INTS, "constant": EMPTY_GRAPH},
    ),
    HostileSpec(
        "list_mags_bruteforce",
        lambda marks: cd.list_mags_bruteforce(cd.PAG(marks)),
        {"marks": _PAG.marks},
        ("marks",),
        allow={"dtype": GRAPH_INTS, "constant": EMPTY_GRAPH},
    ),
    HostileSpec(
        "apply_background_knowledge",
        lambda marks: cd.apply_background_knowledge(cd.PAG(marks), {}),
        {"marks": _PAG.marks},
        ("marks",),
        covers=("apply_background_knowledge", "InconsistentBackgroundKnowledge"),
        allow={"dtype": GRAPH_INTS, "constant": EMPTY_GRAPH},
    ),
    HostileSpec(
        "OptimalPursuitRegressor.fit",
        setup=_fitted_opr,
        arrays=("X", "y"),
        covers=("OptimalPursuitRegressor",),
        allow={
            "X:huge": BS_SCALE,
            "constant": BS_CONSTANT,
            "y:extra_dim": BS_COLUMN_Y,
        },
    ),
    HostileSpec(
        "OptimalPursuitRegressor.predict",
        setup=_fitted_opr_predict,
        arrays=("X",),
        covers=("OptimalPursuitRegressor",),
        allow={
            "constant": "any finite X is a valid input to a linear prediction",
            "huge": "a linear prediction",
        },
    ),
    HostileSpec(
        "OptimalPursuitRegressor(tol, splice_tol)",
        lambda tol, splice_tol: cd.OptimalPursuitRegressor(2, tol=tol, splice_tol=splice_tol).fit(_BX, _BY),
        {"tol": 1e-10, "splice_tol": 1e-3},
        ("tol", "splice_tol"),
        covers=("OptimalPursuitRegressor",),
    ),
    HostileSpec(
        "entry_scores",
        lambda X, y: cd.entry_scores(X, y, ()),
        {"X": _BX, "y": _BY},
        ("X", "y"),
        allow={
            "X:huge": BS_SCALE,
            "constant": "identical columns or a constant y are valid data with finite scores",
            "y:extra_dim": BS_COLUMN_Y,
        },
    ),
    HostileSpec(
        "exit_scores",
        lambda X, y: cd.exit_scores(X, y, [0, 1]),
        {"X": _BX, "y": _BY},
        ("X", "y"),
        allow={
            "X:huge": BS_SCALE,
            "constant": "identical columns or a constant y are valid data with finite scores",
            "y:extra_dim": BS_COLUMN_Y,
        },
    ),
    HostileSpec(
        "best_subset_exhaustive",
        lambda X, y: cd.best_subset_exhaustive(X, y, 2),
        {"X": _BX, "y": _BY},
        ("X", "y"),
        allow={
            "X:huge": BS_SCALE,
            "constant": "every subset of identical columns (or a constant y) is a valid optimum",
            "y:extra_dim": BS_COLUMN_Y,
        },
    ),
    HostileSpec(
        "StrongOracle.from_points",
        lambda X: cd.StrongOracle.from_points(X).query([0, 1], [2, 3]),
        {"X": _FX},
        ("X",),
        covers=("StrongOracle",),
        allow={"constant": FC_CONSTANT, "huge": FC_SCALE},
    ),
    HostileSpec(
        "WeakOracle.from_points",
        lambda X, delta: cd.WeakOracle.from_points(X, delta, seed=0).query([0, 1], [2, 3]),
        {"X": _FX, "delta": 0.2},
        ("X", "delta"),
        covers=("WeakOracle",),
        allow={"constant": FC_CONSTANT, "huge": FC_SCALE},
    ),
    HostileSpec(
        "robust_distance",
        lambda x, ball: cd.robust_distance(x, ball, _fc_oracles()[1]),
        {"x": np.arange(10), "ball": np.array([0, 1, 2])},
        ("x", "ball"),
        allow={
            "constant": "repeated ids are valid queries (cached answers)",
            "x:empty:0": "documented: no query points give an empty array of estimates",
            "x:missing_dim": "documented: one id gives one float estimate",
        },
    ),
    HostileSpec(
        "build_fair_coreset",
        lambda indices, groups, eps: cd.build_fair_coreset(indices, groups, 3, eps, *_fc_oracles(), seed=0),
        {"indices": np.arange(60), "groups": _FG, "eps": 0.3},
        ("indices", "groups", "eps"),
        covers=("build_fair_coreset", "Coreset", "MetricWarning"),
        allow={"groups:constant": "one group: fairness is vacuous, a valid instance", "groups:dtype": FC_STR},
    ),
    HostileSpec(
        "FairCoreset.fit",
        setup=_fitted_fair_coreset,
        arrays=("indices", "groups"),
        covers=("FairCoreset",),
        allow={"groups:constant": "one group: fairness is vacuous, a valid instance", "groups:dtype": FC_STR},
    ),
    HostileSpec(
        "uniform_coreset",
        lambda indices, groups: cd.uniform_coreset(indices, groups, 10, seed=0),
        {"indices": np.arange(60), "groups": _FG},
        ("indices", "groups"),
        allow={"groups:constant": "one group is a valid labelling", "groups:dtype": FC_STR},
    ),
    HostileSpec(
        "fair_cost",
        lambda distances, weights, groups: cd.fair_cost(
            distances, weights, groups, cd.proportional_bounds(_FG, 0.1)
        ),
        {"distances": _FD, "weights": np.ones(60), "groups": _FG},
        ("distances", "weights", "groups"),
        allow={
            "distances:constant": "equal distances to every centre: every fair assignment costs the same",
            "weights:constant": "unit weights are the full data's",
            "groups:dtype": FC_STR,
            "weights:huge": "costs scale linearly with the weights (below the documented 1e150)",
        },
    ),
    HostileSpec(
        "proportional_bounds",
        lambda groups, weights: cd.proportional_bounds(groups, 0.1, weights=weights),
        {"groups": _FG, "weights": np.ones(60)},
        ("groups", "weights"),
        allow={
            "constant": "one group (or equal weights) has well-defined shares",
            "groups:dtype": FC_STR,
            "weights:huge": "shares are scale-free in the weights",
        },
    ),
    HostileSpec(
        "tfl_rc_loss",
        cd.tfl_rc_loss,
        {
            "logits": _TLOGITS,
            "ybar": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]),
            "s": torch.tensor([1, 0, 0, 1, 0, 0, 0, 1]),
            "prior": _TPRIOR,
        },
        ("logits", "ybar", "s", "prior"),
        allow={
            "logits:constant": "equal logits are a uniform prediction: the loss is log K per sample",
            "logits:huge": "log-softmax is shift-stable; the loss scales with the logits (finite in float32)",
            "ybar:constant": "every sample asked about the same class is valid TFL data",
            "ybar:dtype": TFL_FLOAT_LABELS,
            "s:constant": TFL_ANSWERS,
            "s:dtype": TFL_FLOAT_LABELS,
        },
    ),
    HostileSpec(
        "sharpen_prior",
        lambda prior: cd.sharpen_prior(prior, 0.5),
        {"prior": _TPRIOR},
        ("prior",),
        allow={
            "constant": "equal weights sharpen to the uniform distribution",
            "huge": "softmax(log p / T) is invariant to a common scale of p",
        },
    ),
    HostileSpec(
        "make_tfl",
        lambda oracle: cd.make_tfl(oracle, 3, annotator_acc=0.9, seed=0),
        {"oracle": _TY},
        ("oracle",),
        allow={"constant": "one true class for every instance is valid data"},
    ),
    HostileSpec(
        "TFLClassifier.fit",
        setup=_fitted_tfl,
        arrays=("X", "y", "s", "prior"),
        covers=("TFLClassifier",),
        allow={
            "X:constant": TFL_CONSTANT_X,
            "y:constant": "every sample asked about the same class is valid TFL data",
            "s:constant": TFL_ANSWERS,
        },
    ),
    HostileSpec(
        "TFLClassifier.predict_proba",
        setup=_fitted_tfl_predict,
        arrays=("X",),
        covers=("TFLClassifier",),
        allow={"constant": "any finite X below the documented 1e15 is a valid input to prediction"},
    ),
    HostileSpec(
        "PromptImageGenerator",
        lambda: cd.PromptImageGenerator(size=4)(),
        {},
        (),
        global_rng="constructing an nn.Module draws its initialisation from torch's global generator",
    ),
    HostileSpec(
        "retrieve_text_prompts",
        lambda prompt_emb, class_text_emb: cd.retrieve_text_prompts(prompt_emb, class_text_emb, n_prompts=4),
        {"prompt_emb": _EMB[0], "class_text_emb": _EMB[1:11]},
        ("prompt_emb", "class_text_emb"),
        allow={"huge": COSINE_SCALE, "constant": TIES},
    ),
    HostileSpec(
        "retrieve_image_prompts",
        lambda prompt_emb, image_emb: cd.retrieve_image_prompts(
            prompt_emb, image_emb, n_prompts=3, pool=20, seed=0
        ),
        {"prompt_emb": _EMB[0], "image_emb": _EMB},
        ("prompt_emb", "image_emb"),
        allow={"huge": COSINE_SCALE, "constant": TIES},
    ),
    HostileSpec(
        "mrp_features",
        cd.mrp_features,
        {
            "image_emb": _EMB[:5],
            "prompt_emb": _EMB[5],
            "text_prompts": _EMB[6:10],
            "image_prompts": _EMB[10:12],
        },
        ("image_emb", "prompt_emb", "text_prompts", "image_prompts"),
        allow={
            "constant": "a concatenation: constant embeddings are valid",
            "huge": "a concatenation is exact",
        },
    ),
]
EXCLUDED: dict[str, str] = {}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hostile_inputs(spec: HostileSpec) -> None:
    print(spec.check().summary())


def test_registry_covers_public_api() -> None:
    print("icml25.causal_discovery covers", kt.assert_covers(cd, SPECS, EXCLUDED))


def test_arrow_theta_nan_is_a_value_error_and_keeps_state() -> None:
    model = cd.ARROW(base="granger", lag_max=4, theta=0.0).fit(_X)
    before = kt.snapshot_state(model)
    model.theta = float("nan")
    with pytest.raises(ValueError, match=r"theta must be a float threshold .* got nan"):
        model.fit(_X)
    model.theta = 0.0
    assert kt.states_equal(before, kt.snapshot_state(model))
    with pytest.raises(ValueError, match="theta must be a float threshold"):
        cd.ARROW(theta=float("nan")).fit(_X)
    with pytest.raises(ValueError, match="not NaN"):
        cd.prune_candidates(_SC.score, _SC.tau_star, theta=float("nan"))


# ---------------------------------------------------------------------------- issue 81 (bad input round 2)
def test_arrow_fit_rejects_complex_sparse_and_empty_x_and_keeps_state() -> None:
    """Issue 81, item 15: complex X was cast to float (imaginary part dropped) without a word."""
    model = cd.ARROW(base="granger", lag_max=4, theta=0.0).fit(_X)
    before = kt.snapshot_state(model)
    with pytest.raises(
        ValueError, match=r"^Complex data not supported: X must be a real array .* complex128"
    ):
        model.fit(_X + 1j)
    with pytest.raises(ValueError, match="Complex data not supported"):
        model.fit(_X.astype(np.complex64))  # even with a zero imaginary part
    with pytest.raises(TypeError, match=r"^Sparse data not supported: X must be a dense array"):
        model.fit(scipy.sparse.csr_matrix(_X))
    with pytest.raises(ValueError, match=r"0 feature\(s\) \(shape=\(30, 0\)\) while a minimum of 1"):
        model.fit(np.zeros((30, 0)))
    with pytest.raises(ValueError, match=r"at least 3 time steps .* got 1 sample"):
        model.fit(_X[:1])
    with pytest.raises(TypeError, match="argument must be a string or a real number"):
        bad = _X.astype(object)
        bad[0, 0] = {"a": 1}
        model.fit(bad)
    assert kt.states_equal(before, kt.snapshot_state(model))
    assert np.array_equal(
        model.fit(_X.astype(object)).graph_, cd.ARROW(base="granger", lag_max=4, theta=0.0).fit(_X).graph_
    )


def test_tfl_fit_blames_a_prior_callable_with_too_few_columns() -> None:
    rng = np.random.default_rng(0)
    X, ybar, s = rng.normal(size=(20, 3)), np.arange(20) % 4, rng.integers(0, 2, 20)
    clf = cd.TFLClassifier(epochs=1)
    with pytest.raises(
        ValueError, match=r"^prior must have one column per class: .* holds class 3.* shape \(20, 2\)"
    ):
        clf.fit(X, ybar, s, prior=lambda X: np.full((len(X), 2), 0.5))
    assert not hasattr(clf, "coefs_")
    with pytest.raises(ValueError, match=r"^prior must have shape \(20, K\)"):
        clf.fit(X, ybar, s, prior=lambda X: np.full((len(X) - 1, 4), 0.25))
