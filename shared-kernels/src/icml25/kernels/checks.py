"""Argument validation shared by every icml25 package: one way to say what an argument must be.

Each ``check_*`` takes the value first, then the argument's name as the caller spells it, and either returns
the value (normalised: a Python ``int``/``float``, a tensor or array) or raises a ``TypeError`` (wrong kind)
or ``ValueError`` (right kind, wrong value) whose message names the argument, what was expected and what was
given::

    >>> check_int(3, "n_layers", low=1)
    3
    >>> check_float(float("nan"), "lr", low=0.0, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: lr must be a finite float in (0.0, inf), got nan

Why one module: a library whose every public function validates its input needs the same rules everywhere —
``bool`` is not an int, NumPy integers and floats are accepted, NaN never passes a float check, a tensor's
message says its shape and dtype — and the same words in the errors users read.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = [
    "check_array",
    "check_choice",
    "check_fitted",
    "check_float",
    "check_int",
    "check_ints",
    "check_same_length",
    "check_size2d",
    "check_sklearn_array",
    "check_tensor",
    "describe",
]

T = TypeVar("T")

_DTYPE_FAMILIES = ("float", "int", "bool", "complex")


def describe(value: object) -> str:
    """What an error message says was given: ``type value`` for a scalar (the value cut at 80 characters),
    the type plus shape and dtype for a tensor or array (``"torch.Tensor of shape (2, 3) and dtype
    torch.float32"``)."""
    if isinstance(value, torch.Tensor):
        return f"torch.Tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"numpy.ndarray of shape {value.shape} and dtype {value.dtype}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def _range_text(kind: str, low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"{kind} in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {high}"
    return kind


def check_int(value: object, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python ``int`` in ``[low, high]`` (either bound optional).

    Accepts ``int`` and NumPy integers; rejects ``bool`` and floats (even integral ones, ``2.0``).

    Raises:
        TypeError: ``value`` is not an integer.
        ValueError: it is outside ``[low, high]``.
    """
    expected = _range_text("an int", low, high, False, False)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name} must be {expected}, got {v}")
    return v


def check_ints(
    value: object, name: str, *, length: int | None = None, low: int | None = None, high: int | None = None
) -> tuple[int, ...]:
    """``value`` (a tuple or list of ints, ``length`` of them if given) as a tuple of Python ``int``, each in
    ``[low, high]`` (either bound optional); entries follow :func:`check_int` (``bool`` and floats rejected).

    Raises:
        TypeError: not a tuple or list of integers, or not ``length`` of them.
        ValueError: an entry is outside ``[low, high]`` (the message names it as ``name[i]``).
    """
    expected = f"a tuple of {'' if length is None else f'{length} '}ints"
    if (
        not isinstance(value, (tuple, list))
        or (length is not None and len(value) != length)
        or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in value)
    ):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    return tuple(check_int(v, f"{name}[{i}]", low=low, high=high) for i, v in enumerate(value))


def check_size2d(value: object, name: str, *, low: int | None = None) -> tuple[int, int]:
    """An image size: an int ``n`` (read as ``(n, n)``) or a ``(height, width)`` tuple of ints, as a pair of
    Python ``int``, each ``>= low`` if given (``bool`` rejected, as in :func:`check_int`).

    Raises:
        TypeError: neither an int nor a tuple of two ints.
        ValueError: a side is below ``low`` (the message names it as ``name[0]`` or ``name[1]``).
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value)
    elif not (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)
    ):
        raise TypeError(f"{name} must be an int or a (height, width) tuple of ints, got {describe(value)}")
    height, width = (check_int(v, f"{name}[{i}]", low=low) for i, v in enumerate(value))
    return height, width


def check_float(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite Python ``float`` between ``low`` and ``high`` (open or closed ends, optional).

    Accepts Python and NumPy reals (ints included); rejects ``bool``, NaN and ±inf.

    Raises:
        TypeError: ``value`` is not a real number.
        ValueError: it is NaN, infinite or out of range.
    """
    lo = -math.inf if low is None else low
    hi = math.inf if high is None else high
    expected = (
        "a finite float"
        if low is None and high is None
        else _range_text("a finite float", lo, hi, low_open or low is None, high_open or high is None)
    )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    v = float(value)
    ok = math.isfinite(v) and (v > lo if low_open else v >= lo) and (v < hi if high_open else v <= hi)
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {v!r}")
    return v


def check_choice(value: T, name: str, choices: Collection[T]) -> T:
    """``value`` if it is one of ``choices`` (compared with ``==``; a string never matches a non-string).

    Raises:
        ValueError: it is not one of them.
    """
    listed = list(choices)
    try:  # a string never equals a non-string choice; an array compared with a choice is no match
        found = any(isinstance(value, str) == isinstance(c, str) and bool(value == c) for c in listed)
    except (TypeError, ValueError):
        found = False
    if not found:
        text = repr(value)
        raise ValueError(
            f"{name} must be one of {listed}, got {text if len(text) <= 80 else text[:77] + '...'}"
        )
    return value


def _check_shape(shape: tuple[int, ...], want: Sequence[int | None] | None, ndim: int | Sequence[int] | None,
                 name: str, what: str) -> None:  # fmt: skip
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if len(shape) not in allowed:
            dims = " or ".join(str(d) for d in allowed)
            raise ValueError(f"{name} must have {dims} dimension(s), got {what}")
    if want is not None:
        if len(shape) != len(want) or any(w is not None and s != w for s, w in zip(shape, want)):
            form = "(" + ", ".join("*" if w is None else str(w) for w in want) + ")"
            raise ValueError(f"{name} must have shape {form}, got {what}")


def _dtype_family(dtype: torch.dtype | np.dtype) -> str:
    if isinstance(dtype, torch.dtype):
        if dtype == torch.bool:
            return "bool"
        if dtype.is_complex:
            return "complex"
        return "float" if dtype.is_floating_point else "int"
    kind = np.dtype(dtype).kind
    return {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex"}.get(kind, kind)


def _check_dtype(
    have: torch.dtype | np.dtype, want: str | Sequence[str] | None, name: str, noun: str, what: str
) -> None:
    """Raise unless ``have``'s family is one of ``want`` (a family name or several; ``None``: any)."""
    if want is None:
        return
    families = (want,) if isinstance(want, str) else tuple(want)
    unknown = set(families) - set(_DTYPE_FAMILIES)
    if unknown:
        raise ValueError(f"dtype must name families among {_DTYPE_FAMILIES}, got {sorted(unknown)}")
    if _dtype_family(have) not in families:
        raise TypeError(f"{name} must be a {' or '.join(families)} {noun}, got {what}")


def _raise_not_finite(value: torch.Tensor, name: str, what: str) -> None:
    n_nan, n_inf = int(torch.isnan(value).sum()), int(torch.isinf(value).sum())
    raise ValueError(
        f"{name} must be finite (no NaN or inf), got {n_nan} NaN and {n_inf} inf values in {what}"
    )


def _all_finite(value: torch.Tensor) -> bool:
    """No NaN or ±inf in a floating or complex tensor. Real tensors take one ``aminmax`` pass (NaN propagates to
    the extremes, ±inf shows in them), several times faster than ``isfinite(x).all()`` on large tensors."""
    value = value.detach()
    if value.is_complex():
        return bool(torch.isfinite(value).all())
    lo, hi = torch.aminmax(value)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def check_tensor(
    value: object,
    name: str,
    *,
    ndim: int | Sequence[int] | None = None,
    shape: Sequence[int | None] | None = None,
    dtype: str | Sequence[str] | None = "float",
    finite: bool = True,
    max_abs: float | None = None,
    device: torch.device | str | None = None,
    non_empty: bool = False,
    binary: bool = False,
) -> torch.Tensor:
    """``value`` if it is a ``torch.Tensor`` of the given form.

    Args:
        ndim: allowed number(s) of dimensions.
        shape: the exact shape, ``None`` entries free (``(None, 3)``: any rows, 3 columns).
        dtype: allowed dtype families, among ``"float"``, ``"int"``, ``"bool"``, ``"complex"``; ``None``: any.
        finite: reject NaN and ±inf (floating and complex tensors).
        max_abs: reject entries with a larger magnitude (e.g. what a float16 kernel can hold).
        device: the device it must be on.
        non_empty: reject a tensor with no elements.
        binary: reject entries other than 0 and 1 (a mask; a boolean tensor always passes).

    Raises:
        TypeError: not a tensor, or a dtype outside ``dtype``.
        ValueError: wrong dimensions, shape or device; empty; non-finite, too-large or non-binary entries.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {describe(value)}")
    what = describe(value)
    _check_dtype(value.dtype, dtype, name, "tensor", what)
    _check_shape(tuple(value.shape), shape, ndim, name, what)
    if device is not None and value.device != torch.device(device):
        raise ValueError(f"{name} must be on device {torch.device(device)}, got one on {value.device}")
    if non_empty and value.numel() == 0:
        raise ValueError(f"{name} must not be empty, got {what}")
    if not value.numel():
        return value
    check_finite = finite and (value.is_floating_point() or value.is_complex())
    if max_abs is not None:
        # One reduction on the valid path: NaN propagates to the peak and inf exceeds any bound, so a finite
        # peak within the bound also proves the tensor finite.
        peak = float(value.detach().abs().max())
        if not peak <= max_abs:
            if check_finite and not math.isfinite(peak):
                _raise_not_finite(value, name, what)
            if peak > max_abs:  # a NaN peak with finite=False passes, as a NaN entry would
                raise ValueError(f"{name} must have entries of magnitude <= {max_abs:g}, got max {peak:g}")
    elif check_finite and not _all_finite(value):
        _raise_not_finite(value, name, what)
    if binary and value.dtype != torch.bool:
        bad = (value != 0) & (value != 1)
        if bool(bad.any()):
            raise ValueError(
                f"{name} must be boolean or hold only 0 and 1, got {int(bad.sum())} other entries such as "
                f"{value[bad].flatten()[0].item()!r} in {what}"
            )
    return value


def check_array(
    value: object,
    name: str,
    *,
    ndim: int | Sequence[int] | None = None,
    shape: Sequence[int | None] | None = None,
    dtype: str | Sequence[str] | None = "float",
    finite: bool = True,
    non_empty: bool = False,
) -> np.ndarray:
    """``value`` as a NumPy array (lists and other array-likes converted) of the given form.

    ``dtype`` families as in :func:`check_tensor`; an ``int``/``bool`` array passes a ``"float"`` check only
    if ``"int"``/``"bool"`` is listed too (nothing is cast silently). Object and string arrays never pass.

    Raises:
        TypeError: not array-like, or a dtype outside ``dtype`` (complex input to a real check included).
        ValueError: wrong dimensions or shape, empty, or non-finite entries.
    """
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a numpy array or array-like, got {describe(value)}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be array-like, got {describe(value)} ({err})") from None
    what = describe(arr)
    if arr.dtype.kind in "OSUV":
        raise TypeError(f"{name} must be a numeric array, got {what}")
    _check_dtype(arr.dtype, dtype, name, "array", what)
    _check_shape(arr.shape, shape, ndim, name, what)
    if non_empty and arr.size == 0:
        raise ValueError(f"{name} must not be empty, got {what}")
    if finite and arr.size and arr.dtype.kind in "fc" and not np.isfinite(arr).all():
        n_nan, n_inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
        raise ValueError(
            f"{name} must be finite (no NaN or inf), got {n_nan} NaN and {n_inf} inf values in {what}"
        )
    return arr


def check_same_length(values: Mapping[str, Any], *, axis: int = 0) -> int:
    """The common length (size along ``axis``) of the named sequences, arrays or tensors.

    Raises:
        ValueError: they differ; the message lists each name with its length.
    """
    lengths = {
        k: (len(v) if axis == 0 and not hasattr(v, "shape") else int(v.shape[axis]))
        for k, v in values.items()
    }
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise ValueError(f"{' and '.join(lengths)} must have the same length along axis {axis}: {listed}")
    return next(iter(lengths.values()), 0)


def check_sklearn_array(value: object, name: str, *, estimator: object = None, **kwargs: Any) -> Any:
    """``value`` through scikit-learn's ``check_array`` (``input_name=name``), every error naming ``name``.

    For estimators that follow scikit-learn's conventions (its ``check_estimator`` expects its own messages:
    "Complex data not supported", "Reshape your data", "0 feature(s) ... is required", sparse input refused
    unless ``accept_sparse``): the messages are scikit-learn's, prefixed with ``name:`` where they do not
    already name it. A ``torch.Tensor`` is converted with ``.detach().cpu().numpy()`` first. ``kwargs`` go
    to ``check_array`` (``dtype``, ``ensure_2d``, ``ensure_all_finite``, ``ensure_min_features``, ...).
    Needs scikit-learn (imported here, lazily).

    Raises:
        TypeError, ValueError: as ``check_array`` does, with ``name`` in the message.
    """
    validation = importlib.import_module("sklearn.utils.validation")
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        return validation.check_array(value, input_name=name, estimator=estimator, **kwargs)
    except (TypeError, ValueError) as err:
        text = str(err)
        if name in text:
            raise
        kind = TypeError if isinstance(err, TypeError) and not isinstance(err, ValueError) else ValueError
        raise kind(f"{name}: {text}") from None


class _NotFittedError(ValueError, AttributeError):
    """scikit-learn's ``NotFittedError`` where scikit-learn is not installed (the same two bases)."""


def _not_fitted_error() -> type[Exception]:
    try:  # icml25-kernels does not need scikit-learn; the area packages that fit estimators do
        error: type[Exception] = importlib.import_module("sklearn.exceptions").NotFittedError
    except ImportError:
        return _NotFittedError
    return error


def check_fitted(estimator: object, attributes: str | Sequence[str]) -> None:
    """Raise scikit-learn's ``NotFittedError`` (a ``ValueError`` and ``AttributeError``) unless ``estimator``
    has every fitted attribute in ``attributes`` (names ending in ``_``, set by ``fit``)."""
    names = (attributes,) if isinstance(attributes, str) else tuple(attributes)
    missing = [a for a in names if not hasattr(estimator, a)]
    if missing:
        raise _not_fitted_error()(
            f"This {type(estimator).__name__} instance is not fitted yet (no {', '.join(missing)}); "
            "call 'fit' with appropriate arguments before using this estimator."
        )
