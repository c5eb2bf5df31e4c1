"""Hostile-input contract of icml25.causal_discovery (CONTRIBUTING.md, "Bad input contract").

P07 MAG listing, P54 ARROW and P48 best subset selection: every public callable is registered with a
valid example call; :mod:`icml25.kernels.testing` derives the hostile variants and asserts a clear error or a documented,
finite result; ARROW and OptimalPursuitRegressor keep their fitted state after a rejected ``fit``.
"""

from __future__ import annotations

import numpy as np
import pytest

import icml25.causal_discovery as cd
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
