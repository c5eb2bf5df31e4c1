"""Tests of icml25.kernels.checks: the one validation module (issue 81)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from icml25.kernels.checks import (
    check_array,
    check_choice,
    check_fitted,
    check_float,
    check_int,
    check_ints,
    check_same_length,
    check_size2d,
    check_tensor,
    describe,
)


@given(st.integers(-1000, 1000), st.integers(-50, 50), st.integers(0, 100))
def test_check_int_accepts_exactly_the_integers_in_range(value: int, low: int, width: int) -> None:
    high = low + width
    if low <= value <= high:
        assert check_int(value, "n", low=low, high=high) == value
        assert type(check_int(np.int64(value), "n", low=low, high=high)) is int
    else:
        with pytest.raises(ValueError, match=rf"^n must be an int in \[{low}, {high}\], got {value}$"):
            check_int(value, "n", low=low, high=high)


@pytest.mark.parametrize("bad", [True, 2.0, "3", None, np.float64(1.0), torch.tensor(1)])
def test_check_int_rejects_non_integers_with_a_type_error_naming_the_argument(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^n_layers must be an int >= 1, got "):
        check_int(bad, "n_layers", low=1)


@pytest.mark.parametrize(
    ("kwargs", "good", "bad", "expected"),
    [
        ({"low": 0.0, "low_open": True}, 1e-9, 0.0, r"a finite float in \(0.0, inf\)"),
        ({"low": 0.0, "high": 1.0}, 1.0, 1.0000001, r"a finite float in \[0.0, 1.0\]"),
        ({"low": 0.0, "high": 1.0, "high_open": True}, 0.0, 1.0, r"a finite float in \[0.0, 1.0\)"),
        ({}, -1e300, math.inf, "a finite float"),
        ({"high": 2.0}, -5.0, 2.5, r"a finite float in \(-inf, 2.0\]"),
    ],
)
def test_check_float_bounds(kwargs: dict, good: float, bad: float, expected: str) -> None:
    assert check_float(good, "lr", **kwargs) == good
    with pytest.raises(ValueError, match=rf"^lr must be {expected}, got "):
        check_float(bad, "lr", **kwargs)


def test_check_float_never_passes_nan_or_a_bool_and_takes_numpy_and_int_values() -> None:
    with pytest.raises(ValueError, match="got nan"):
        check_float(float("nan"), "sigma")
    with pytest.raises(TypeError, match="sigma must be a finite float, got bool True"):
        check_float(True, "sigma")
    assert check_float(np.float32(0.5), "sigma") == 0.5 and check_float(3, "sigma") == 3.0


def test_check_choice_compares_strings_only_with_strings() -> None:
    assert check_choice("mean", "reduction", ("mean", "sum")) == "mean"
    assert check_choice(2, "bits", (2, 4, 8)) == 2
    with pytest.raises(ValueError, match=r"^reduction must be one of \['mean', 'sum'\], got 'max'$"):
        check_choice("max", "reduction", ("mean", "sum"))
    with pytest.raises(ValueError, match="bits must be one of"):
        check_choice("2", "bits", (2, 4, 8))
    with pytest.raises(ValueError, match="mode must be one of"):
        check_choice(np.array(["a", "b"]), "mode", ("a",))


def test_check_ints_returns_a_tuple_of_python_ints_and_names_the_entry() -> None:
    assert check_ints([1, np.int64(2), 3], "grid", length=3, low=1) == (1, 2, 3)
    assert check_ints((), "sizes") == ()
    with pytest.raises(TypeError, match=r"^stride must be a tuple of 3 ints, got tuple \(1, 2\)"):
        check_ints((1, 2), "stride", length=3)
    with pytest.raises(TypeError, match="stride must be a tuple of 3 ints"):
        check_ints((1, True, 2), "stride", length=3)
    with pytest.raises(TypeError, match=r"stride must be a tuple of ints, got float 2\.0"):
        check_ints(2.0, "stride")
    with pytest.raises(ValueError, match=r"^grid\[1\] must be an int >= 1, got 0$"):
        check_ints((2, 0, 2), "grid", low=1)


def test_check_size2d_reads_an_int_as_a_square_and_names_the_side() -> None:
    assert check_size2d(8, "img_size") == (8, 8)
    assert check_size2d((np.int64(4), 6), "img_size", low=1) == (4, 6)
    assert all(type(v) is int for v in check_size2d((np.int64(4), 6), "img_size"))
    for bad in ((4, 4, 4), [4, 4], (4, 2.0), True, (True, 4), "8", 8.0):
        with pytest.raises(
            TypeError, match=r"^img_size must be an int or a \(height, width\) tuple of ints, got "
        ):
            check_size2d(bad, "img_size")
    with pytest.raises(ValueError, match=r"^img_size\[1\] must be an int >= 1, got 0$"):
        check_size2d((4, 0), "img_size", low=1)
    assert check_size2d(-3, "img_size") == (-3, -3)  # no bound unless asked for


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("n", [1, 5, 4099])
def test_check_tensor_finite_fast_path_catches_any_nan_or_inf(dtype: torch.dtype, bad: float, n: int) -> None:
    for pos in {0, n // 2, n - 1}:
        x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(dtype)
        assert check_tensor(x, "x") is x
        x[pos] = bad
        with pytest.raises(
            ValueError, match=r"^x must be finite \(no NaN or inf\), got [01] NaN and [01] inf"
        ):
            check_tensor(x, "x")
    z = torch.zeros(3, dtype=torch.complex64)
    z[1] = complex(0.0, float("nan"))
    with pytest.raises(ValueError, match="z must be finite"):
        check_tensor(z, "z", dtype="complex")


def test_check_tensor_form_and_messages() -> None:
    x = torch.zeros(2, 3)
    assert check_tensor(x, "x", ndim=2, shape=(None, 3)) is x
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor, got numpy.ndarray of shape \(3,\)"):
        check_tensor(np.zeros(3), "x")
    with pytest.raises(
        ValueError, match=r"^x must have 3 dimension\(s\), got torch.Tensor of shape \(2, 3\)"
    ):
        check_tensor(x, "x", ndim=3)
    with pytest.raises(ValueError, match=r"^x must have shape \(\*, 4\), got torch.Tensor of shape \(2, 3\)"):
        check_tensor(x, "x", shape=(None, 4))
    with pytest.raises(TypeError, match=r"^x must be a float tensor, got .* dtype torch.int64"):
        check_tensor(torch.zeros(2, dtype=torch.long), "x")
    assert check_tensor(torch.zeros(2, dtype=torch.long), "ids", dtype="int").dtype == torch.long
    with pytest.raises(ValueError, match=r"^x must be finite \(no NaN or inf\)"):
        check_tensor(torch.tensor([0.0, float("nan")]), "x")
    with pytest.raises(ValueError, match=r"^x must have entries of magnitude <= 10"):
        check_tensor(torch.tensor([0.0, 11.0]), "x", max_abs=10)
    with pytest.raises(ValueError, match="x must not be empty"):
        check_tensor(torch.zeros(0, 3), "x", non_empty=True)
    with pytest.raises(ValueError, match="x must be on device meta"):
        check_tensor(x, "x", device="meta")
    with pytest.raises(ValueError, match="dtype must name families"):
        check_tensor(x, "x", dtype="floating")


def test_check_tensor_max_abs_names_non_finite_entries_as_such_and_keeps_finite_false_semantics() -> None:
    nan, inf = float("nan"), float("inf")
    for bad, counts in (
        ([0.0, nan, inf], "1 NaN and 1 inf"),
        ([inf, 1.0], "0 NaN and 1 inf"),
        ([nan], "1 NaN"),
    ):
        with pytest.raises(ValueError, match=rf"^x must be finite \(no NaN or inf\), got {counts}"):
            check_tensor(torch.tensor(bad), "x", max_abs=10)
    with pytest.raises(ValueError, match=r"^z must be finite"):
        check_tensor(torch.tensor([1 + 1j, complex(nan, 0)]), "z", dtype="complex", max_abs=10)
    # finite=False: a NaN entry passes the bound (it is not larger), an infinite one does not
    check_tensor(torch.tensor([0.0, nan]), "x", finite=False, max_abs=10)
    with pytest.raises(ValueError, match=r"^x must have entries of magnitude <= 10, got max inf"):
        check_tensor(torch.tensor([0.0, inf]), "x", finite=False, max_abs=10)
    assert check_tensor(torch.tensor([-10, 3]), "ids", dtype="int", max_abs=10).dtype == torch.long


def test_check_tensor_binary_accepts_boolean_and_0_1_masks_of_any_family_and_names_other_entries() -> None:
    families = ("bool", "int", "float")
    for mask in (torch.tensor([True, False]), torch.tensor([0, 1]), torch.tensor([1.0, 0.0])):
        assert check_tensor(mask, "mask", dtype=families, binary=True) is mask
    for bad, shown in (
        (torch.tensor([0, 2]), "2"),
        (torch.tensor([1.0, 0.5]), "0.5"),
        (torch.tensor([-1, 1]), "-1"),
    ):
        with pytest.raises(
            ValueError,
            match=rf"^mask must be boolean or hold only 0 and 1, got 1 other entries such as {shown}",
        ):
            check_tensor(bad, "mask", dtype=families, binary=True)
    with pytest.raises(
        ValueError, match="mask must be boolean or hold only 0 and 1"
    ):  # NaN when finiteness is not asked
        check_tensor(torch.tensor([1.0, float("nan")]), "mask", finite=False, binary=True)
    assert check_tensor(torch.tensor([0.0, 2.0]), "x").tolist() == [0.0, 2.0]  # off by default


def test_check_array_converts_array_likes_and_casts_nothing_silently() -> None:
    np.testing.assert_array_equal(check_array([[1.0, 2.0]], "X", ndim=2), [[1.0, 2.0]])
    with pytest.raises(
        TypeError, match=r"^X must be a float array, got numpy.ndarray of shape \(2,\) and dtype complex"
    ):
        check_array(np.array([1 + 1j, 2]), "X")
    with pytest.raises(TypeError, match=r"X must be a float array, got .* dtype int64"):
        check_array(np.array([1, 2], dtype=np.int64), "X")
    assert check_array([1, 2], "X", dtype=("float", "int")).dtype.kind == "i"
    with pytest.raises(TypeError, match="X must be a numeric array"):
        check_array(["a", "b"], "X")
    with pytest.raises(TypeError, match=r"X must be a numpy array or array-like, got torch.Tensor"):
        check_array(torch.zeros(2), "X")
    with pytest.raises(ValueError, match=r"^X must be finite"):
        check_array([1.0, np.inf], "X")
    with pytest.raises(ValueError, match=r"^X must have 1 or 2 dimension\(s\)"):
        check_array(np.zeros((1, 1, 1)), "X", ndim=(1, 2))


def test_check_same_length_names_every_argument_and_its_length() -> None:
    assert check_same_length({"X": np.zeros((4, 2)), "y": [0, 1, 0, 1]}) == 4
    with pytest.raises(
        ValueError, match=r"^X and y must have the same length along axis 0: X has 4, y has 3$"
    ):
        check_same_length({"X": np.zeros((4, 2)), "y": [0, 1, 0]})
    assert check_same_length({"a": torch.zeros(2, 5), "b": np.zeros((3, 5))}, axis=1) == 5


def test_check_fitted_raises_sklearns_not_fitted_error_or_the_same_two_bases_without_sklearn() -> None:
    """icml25-kernels does not depend on scikit-learn: with it, the error is its ``NotFittedError``; without
    it, a stand-in with the same bases (``ValueError`` and ``AttributeError``)."""
    import importlib.util

    from icml25.kernels import checks

    error = checks._not_fitted_error()
    assert issubclass(error, ValueError) and issubclass(error, AttributeError)
    if importlib.util.find_spec("sklearn") is not None:
        from sklearn.exceptions import NotFittedError

        assert error is NotFittedError
    else:
        assert error is checks._NotFittedError

    class Probe:
        pass

    probe = Probe()
    with pytest.raises(error, match=r"This Probe instance is not fitted yet \(no coef_, classes_\)"):
        check_fitted(probe, ("coef_", "classes_"))
    probe.coef_, probe.classes_ = 1, 2  # type: ignore[attr-defined]
    check_fitted(probe, ("coef_", "classes_"))


def test_check_sklearn_array_names_the_argument_in_scikit_learns_messages() -> None:
    """scikit-learn's own wording (what its ``check_estimator`` matches), with the argument named."""
    pytest.importorskip("sklearn")
    from icml25.kernels.checks import check_sklearn_array

    assert check_sklearn_array(torch.ones(3, 2), "X").shape == (3, 2)
    with pytest.raises(ValueError, match=r"(?s)^features: .*Reshape your data"):
        check_sklearn_array(np.ones(3), "features")
    with pytest.raises(ValueError, match=r"(?s)features: .*Complex data not supported"):
        check_sklearn_array(np.ones((3, 2), dtype=complex), "features")
    with pytest.raises(ValueError, match=r"Input features contains NaN"):
        check_sklearn_array(np.array([[np.nan, 1.0]]), "features")
    with pytest.raises(ValueError, match=r"(?s)features: .*0 feature\(s\)"):
        check_sklearn_array(np.ones((3, 0)), "features")


def test_describe_says_what_was_given() -> None:
    assert describe(torch.zeros(2, 3)) == "torch.Tensor of shape (2, 3) and dtype torch.float32"
    assert describe(np.zeros((4,), dtype=np.int64)) == "numpy.ndarray of shape (4,) and dtype int64"
    assert describe(3) == "int 3" and describe("x") == "str 'x'"
    long = describe("a" * 200)
    assert long.startswith("str 'aaa") and long.endswith("...") and len(long) == len("str ") + 80
