"""Hostile-input contract checks for public callables (like ``numpy.testing`` / ``torch.testing``).

The contract (CONTRIBUTING.md, "Bad input contract"): a public function or estimator given a non-finite,
empty, wrong-dtype, wrong-shape, constant or huge input either raises ``ValueError``/``TypeError`` whose
message names the argument, or returns a *documented*, finite result. Anything else, another exception
type (``IndexError``, a torch ``RuntimeError``, ``ZeroDivisionError``, ``LinAlgError``), a non-finite
output, or a silent answer for an input the function does not document as valid, is a violation.

Modelled on PyTorch's OpInfo and scikit-learn's ``check_estimator``: give a callable and one valid example
call, name the array/tensor (or float) arguments, and :func:`hostile_variants` derives the hostile calls,
:func:`check_hostile` runs them and asserts the contract::

    spec = HostileSpec("quantize", quantize, {"x": torch.randn(2, 64), "bits": 4, "group_size": 32},
                       arrays=("x",), allow={"constant": "a constant group quantizes exactly (scale 0)"})
    report = spec.check()          # AssertionError listing every violation; else a HostileReport

Variant kinds: ``nan``, ``posinf``, ``neginf`` (one entry of a float array, or a float scalar), ``empty:<axis>``
(length 0 along each axis), ``dtype`` (float -> int64 tensor / str array; int -> float32; a scalar -> str),
``extra_dim`` (a trailing axis of length 1), ``missing_dim`` (the last axis dropped), ``constant`` (every entry
equal) and ``huge`` (scaled to max |x| = 1e30, 1e300 in float64). ``allow`` maps a kind (or ``"arg:kind"``)
to the documented reason a finite answer is correct there; :class:`Allow` with ``finite=False`` documents
NaN propagation. Nothing here imports pytest; torch and numpy are imported where present.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from icml25.kernels.rng import global_rng_state

__all__ = [
    "DEFAULT_KINDS",
    "SKLEARN_CHECKS_FITTING_CLASS_LABELS",
    "Allow",
    "HostileCase",
    "HostileReport",
    "HostileSpec",
    "assert_covers",
    "check_hostile",
    "hostile_variants",
    "nonfinite_paths",
    "snapshot_state",
    "states_equal",
]

DEFAULT_KINDS = ("nan", "posinf", "neginf", "empty", "dtype", "extra_dim", "missing_dim", "constant", "huge")

# scikit-learn's estimator checks (``parametrize_with_checks``) that fit a classifier on 1-D class labels, or on
# data derived from such a fit. A classifier whose ``y`` is by design two columns (a label and a second observed
# outcome, e.g. TFLClassifier's [ybar, s], RagLcRouter's [lc_correct, rag_correct]) cannot pass them; its package
# declares them as expected failures with its reason.
SKLEARN_CHECKS_FITTING_CLASS_LABELS = (
    "check_classifier_data_not_an_array",
    "check_classifiers_classes",
    "check_classifiers_one_label",
    "check_classifiers_regression_target",
    "check_classifiers_train",
    "check_dict_unchanged",
    "check_dont_overwrite_parameters",
    "check_dtype_object",
    "check_estimators_dtypes",
    "check_estimators_fit_returns_self",
    "check_estimators_nan_inf",
    "check_estimators_overwrite_params",
    "check_estimators_pickle",
    "check_f_contiguous_array_estimator",
    "check_fit2d_1feature",
    "check_fit2d_1sample",
    "check_fit2d_predict1d",
    "check_fit_check_is_fitted",
    "check_fit_idempotent",
    "check_fit_score_takes_y",
    "check_methods_sample_order_invariance",
    "check_methods_subset_invariance",
    "check_n_features_in",
    "check_n_features_in_after_fitting",
    "check_pipeline_consistency",
    "check_positive_only_tag_during_fit",
    "check_readonly_memmap_input",
    "check_supervised_y_2d",
)
_HUGE = {torch.float64: 1e300, np.dtype(np.float64): 1e300}  # else 1e30 (float32/float16 overflow on x**2)


@dataclass(frozen=True)
class Allow:
    """A documented non-error outcome of a hostile variant: ``reason`` (why the answer is correct).

    ``finite=False`` documents that non-finite values propagate to the output (checked as allowed).
    """

    reason: str
    finite: bool = True


@dataclass(frozen=True)
class HostileCase:
    """One hostile call: ``kwargs`` with argument ``arg`` corrupted by ``kind`` (e.g. ``"empty:0"``)."""

    arg: str
    kind: str
    kwargs: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.arg}:{self.kind}"


# ------------------------------------------------------------------------------------------ variants
def _is_float_array(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.is_floating_point() or v.is_complex()
    return isinstance(v, np.ndarray) and v.dtype.kind in "fc"


def _set_first(v: Any, value: float) -> Any:
    out = v.clone() if isinstance(v, torch.Tensor) else np.array(v, copy=True)
    if out.size if isinstance(out, np.ndarray) else out.numel():
        flat = out.reshape(-1)
        flat[flat.shape[0] // 2] = value  # the middle entry: not a boundary that a slice might drop
        out = flat.reshape(v.shape)
    return out


def _empty(v: Any, axis: int) -> Any:
    idx = [slice(None)] * v.ndim
    idx[axis] = slice(0, 0)
    return v[tuple(idx)]


def _array_variants(v: Any, kinds: Iterable[str]) -> list[tuple[str, Any]]:
    kinds = set(kinds)
    out: list[tuple[str, Any]] = []
    is_t = isinstance(v, torch.Tensor)
    flt = _is_float_array(v)
    size = v.numel() if is_t else v.size
    if flt and size:
        for kind, val in (("nan", math.nan), ("posinf", math.inf), ("neginf", -math.inf)):
            if kind in kinds:
                out.append((kind, _set_first(v, val)))
    if "empty" in kinds:
        for ax in range(v.ndim):
            if v.shape[ax] != 0:
                out.append((f"empty:{ax}", _empty(v, ax)))
    if "dtype" in kinds:
        if is_t:
            out.append(("dtype", v.to(torch.int64) if flt else v.to(torch.float32)))
        else:
            out.append(("dtype", v.astype(str)))
    if "extra_dim" in kinds:
        out.append(("extra_dim", v[..., None]))
    if "missing_dim" in kinds and v.ndim >= 1:
        out.append(("missing_dim", v[..., 0]))
    if "constant" in kinds and size:
        first = v.reshape(-1)[0]
        out.append(("constant", (torch.full_like(v, first.item()) if is_t else np.full_like(v, first))))
    if "huge" in kinds and flt and size:
        peak = float(abs(v).max())
        big = _HUGE.get(v.dtype, 1e30)
        scaled = v * (big / peak) if peak > 0 else v + big
        out.append(("huge", scaled))
    return out


def _scalar_variants(v: Any, kinds: Iterable[str]) -> list[tuple[str, Any]]:
    kinds = set(kinds)
    out: list[tuple[str, Any]] = []
    for kind, val in (("nan", math.nan), ("posinf", math.inf), ("neginf", -math.inf)):
        if kind in kinds:
            out.append((kind, val))
    if "dtype" in kinds:
        out.append(("dtype", str(v)))
    return out


def _get(obj: Any, path: Sequence[Any]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _replace(obj: Any, path: Sequence[Any], value: Any) -> Any:
    """A copy of ``obj`` (nested lists/tuples/dicts) with the element at ``path`` replaced."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, Mapping):
        new = dict(obj)
        new[head] = _replace(obj[head], rest, value)
        return new
    new_list = list(obj)
    new_list[head] = _replace(obj[head], rest, value)
    return type(obj)(new_list) if isinstance(obj, tuple) else new_list


def _parse_arg(arg: str | tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    if isinstance(arg, tuple):
        return str(arg[0]), tuple(arg[1:])
    return arg, ()


def _arg_label(name: str, path: tuple[Any, ...]) -> str:
    return name + "".join(f"[{p!r}]" for p in path)


def hostile_variants(
    example: Mapping[str, Any],
    arrays: Iterable[str | tuple[Any, ...]],
    kinds: Iterable[str] = DEFAULT_KINDS,
) -> list[HostileCase]:
    """The hostile calls derived from a valid ``example`` (keyword arguments).

    Args:
        example: a valid call's keyword arguments.
        arrays: the arguments to corrupt: a name, or a path ``("client_states", 0, "w")`` into nested
            lists/dicts. Tensors/arrays get the array kinds, Python floats the scalar kinds.
        kinds: the subset of :data:`DEFAULT_KINDS` to derive.
    """
    kinds = tuple(kinds)
    unknown = set(kinds) - set(DEFAULT_KINDS)
    if unknown:
        raise ValueError(f"kinds must be among {DEFAULT_KINDS}, got unknown {sorted(unknown)}")
    cases = []
    for arg in arrays:
        name, path = _parse_arg(arg)
        if name not in example:
            raise ValueError(f"arrays names {name!r}, which is not an argument of example {sorted(example)}")
        value = _get(example[name], path)
        if isinstance(value, (torch.Tensor, np.ndarray)):
            variants = _array_variants(value, kinds)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            variants = _scalar_variants(value, kinds)
        else:
            raise TypeError(
                f"arrays entry {_arg_label(name, path)} must be a tensor, array or number in the example, "
                f"got {type(value).__name__}"
            )
        for kind, bad in variants:
            kw = dict(example)
            kw[name] = _replace(example[name], path, bad)
            cases.append(HostileCase(_arg_label(name, path), kind, kw))
    return cases


# ------------------------------------------------------------------------------------------ outputs
def nonfinite_paths(
    obj: Any, _path: str = "out", _depth: int = 0, _seen: set[int] | None = None
) -> list[str]:
    """Where ``obj`` holds non-finite floats: tensors, arrays, floats, containers, dataclasses, modules,
    and the fitted (trailing ``_``) attributes of estimators."""
    seen = set() if _seen is None else _seen
    if _depth > 5 or id(obj) in seen:
        return []
    if isinstance(obj, torch.Tensor):
        ok = not (obj.is_floating_point() or obj.is_complex()) or bool(torch.isfinite(obj.detach()).all())
        return [] if ok else [_path]
    if isinstance(obj, np.ndarray):
        ok = obj.dtype.kind not in "fc" or bool(np.isfinite(obj).all())
        return [] if ok else [_path]
    if isinstance(obj, (float, np.floating)):
        return [] if math.isfinite(obj) else [_path]
    if isinstance(obj, (str, bytes, int, bool, type(None))):
        return []
    seen.add(id(obj))
    bad: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            bad += nonfinite_paths(v, f"{_path}[{k!r}]", _depth + 1, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            bad += nonfinite_paths(v, f"{_path}[{i}]", _depth + 1, seen)
    elif isinstance(obj, torch.nn.Module):
        for k, v in obj.state_dict().items():
            bad += nonfinite_paths(v, f"{_path}.{k}", _depth + 1, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            bad += nonfinite_paths(getattr(obj, f.name), f"{_path}.{f.name}", _depth + 1, seen)
    elif hasattr(obj, "__dict__"):
        for k, v in vars(obj).items():
            if k.endswith("_") and not k.startswith("_"):
                bad += nonfinite_paths(v, f"{_path}.{k}", _depth + 1, seen)
    return bad


def snapshot_state(obj: Any) -> Any:
    """A deep copy of an estimator's state: a module's ``state_dict`` and mode, else its ``__dict__``."""
    if isinstance(obj, torch.nn.Module):
        return (obj.training, {k: v.detach().clone() for k, v in obj.state_dict().items()})
    return copy.deepcopy(vars(obj))


def states_equal(a: Any, b: Any) -> bool:
    """Exact equality of two snapshots (NaN equal to NaN, tensors and arrays elementwise)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(
                torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, 0, 0, equal_nan=True))
            )
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # objects without a usable ==: compare their state
        return type(a) is type(b) and states_equal(vars(a), vars(b)) if hasattr(a, "__dict__") else a is b


# ------------------------------------------------------------------------------------------ the check
@dataclass
class HostileReport:
    """Outcome per variant: ``"rejected"`` (clear error), ``"allowed"`` (documented result) or a violation."""

    name: str
    outcomes: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(v == outcome for v in self.outcomes.values())

    def summary(self) -> str:
        return (
            f"{self.name}: {len(self.outcomes)} hostile variants, {self.count('rejected')} rejected, "
            f"{self.count('allowed')} documented results, {len(self.known)} known gaps, "
            f"{len(self.violations)} violations"
        )


def _allowance(allow: Mapping[str, str | Allow], case: HostileCase) -> Allow | None:
    base = case.kind.split(":")[0]
    for key in (f"{case.arg}:{case.kind}", f"{case.arg}:{base}", case.kind, base):
        if key in allow:
            a = allow[key]
            return a if isinstance(a, Allow) else Allow(str(a))
    return None


def check_hostile(
    fn: Callable[..., Any],
    example: Mapping[str, Any],
    *,
    arrays: Iterable[str | tuple[Any, ...]],
    allow: Mapping[str, str | Allow] | None = None,
    kinds: Iterable[str] = DEFAULT_KINDS,
    name: str | None = None,
    state_of: Any = None,
    known: Mapping[str, str] | None = None,
    raise_on_violation: bool = True,
    global_rng: str | None = None,
) -> HostileReport:
    """Run every hostile variant of ``fn(**example)`` and assert the bad-input contract.

    Args:
        fn: the public callable (a function, a class, or a bound method such as ``est.fit``).
        example: a valid call's keyword arguments (the valid call itself must return a finite result).
        arrays: arguments to corrupt (see :func:`hostile_variants`).
        allow: ``{kind or "arg:kind": reason}`` for the variants where a finite answer is documented and
            correct (e.g. ``{"constant": "constant data is valid here"}``).
        kinds: which variant kinds to derive (default all).
        name: the label in messages (default ``fn.__qualname__``).
        state_of: an estimator whose state (:func:`snapshot_state`) must be unchanged after each rejected
            call: a rejected ``fit`` loses nothing.
        known: ``{"arg:kind" or kind: reason}``: violations that are known, listed gaps (like a strict
            xfail): reported in ``HostileReport.known``, not raised; a known gap that no longer occurs is
            itself a violation, so the list cannot go stale.
        raise_on_violation: raise ``AssertionError`` listing the violations (else only report them).
        global_rng: why the valid call may draw from torch's global generator (the PyTorch convention for
            ``nn.Module`` construction and for ``generator=None``). Without it, the valid ``example`` call
            must leave the global generators (torch, NumPy, ``random``) exactly as it found them: library
            code takes ``seed=`` / ``generator=`` (:mod:`icml25.kernels.rng`).

    Returns:
        :class:`HostileReport`.
    """
    allow = dict(allow or {})
    known = dict(known or {})
    label = name or getattr(fn, "__qualname__", repr(fn))
    report = HostileReport(label)
    snap = snapshot_state(state_of) if state_of is not None else None
    cases = hostile_variants(example, arrays, kinds)
    hit: set[str] = set()

    before = global_rng_state()
    try:
        valid_out = fn(**example)
    except Exception as exc:  # the example itself must be a valid call
        raise AssertionError(f"{label}: the valid example call raised {type(exc).__name__}: {exc}") from exc
    if global_rng is None and global_rng_state() != before:
        report.violations.append(
            f"{label}: the valid call changed the global random state (torch/NumPy/random); library code "
            "takes seed= or generator= (icml25.kernels.rng), or pass global_rng='why' to document it"
        )
    if nonfinite_paths(valid_out):
        report.violations.append(
            f"{label}: the valid call returned non-finite values at {nonfinite_paths(valid_out)[:3]}"
        )
    if state_of is not None:
        snap = snapshot_state(state_of)  # the valid call (e.g. fit) may change the state

    def _flag(case: HostileCase, message: str) -> None:
        key = next((k for k in known if _allowance({k: "x"}, case) is not None), None)
        if key is None:
            report.violations.append(message)
        else:
            hit.add(key)
            report.known.append(f"{message} [known: {known[key]}]")
            report.outcomes[case.label] = "known"

    for case in cases:
        top = case.arg.split("[")[0]
        try:
            out = fn(**case.kwargs)
        except (ValueError, TypeError) as exc:
            msg = str(exc)
            if top not in msg:
                _flag(case, f"{case.label}: {type(exc).__name__} does not name the argument {top!r}: {msg!r}")
            else:
                report.outcomes[case.label] = "rejected"
            if snap is not None and not states_equal(snap, snapshot_state(state_of)):
                _flag(case, f"{case.label}: the rejected call changed the state of {state_of!r}")
                snap = snapshot_state(state_of)
            continue
        except Exception as exc:
            _flag(case, f"{case.label}: {type(exc).__name__} (not ValueError/TypeError): {exc}")
            if snap is not None:
                snap = snapshot_state(state_of)  # judge the next variant against the current state
            continue
        allowed = _allowance(allow, case)
        if allowed is None:
            _flag(
                case,
                f"{case.label}: returned a result without an error, and no allowance documents this input "
                f"as valid (non-finite outputs: {nonfinite_paths(out)[:3]})",
            )
            continue
        bad = nonfinite_paths(out) if allowed.finite else []
        if bad:
            _flag(case, f"{case.label}: documented as valid but the result is non-finite at {bad[:3]}")
        else:
            report.outcomes[case.label] = "allowed"
        if snap is not None:
            snap = snapshot_state(state_of)  # an accepted call may legitimately change the state
    unused = [k for k in allow if not any(_allowance({k: allow[k]}, c) for c in cases)]
    if unused:
        report.violations.append(f"allow entries match no variant (typo?): {unused}")
    fixed = sorted(set(known) - hit)
    if fixed:
        report.violations.append(f"known gaps that no longer occur (remove them from known): {fixed}")
    if raise_on_violation and report.violations:
        raise AssertionError(
            f"{label} breaks the bad-input contract in {len(report.violations)} case(s):\n  "
            + "\n  ".join(report.violations)
        )
    return report


@dataclass
class HostileSpec:
    """One registry entry: a public callable, a valid example call and what to corrupt.

    ``covers`` names the public API names (``__all__`` entries) the entry exercises; ``setup`` (optional)
    returns ``(fn, example, state_of)`` lazily, for entries that need a fitted estimator.
    """

    name: str
    fn: Callable[..., Any] | None = None
    example: Mapping[str, Any] = field(default_factory=dict)
    arrays: Sequence[str | tuple[Any, ...]] = ()
    allow: Mapping[str, str | Allow] = field(default_factory=dict)
    kinds: Sequence[str] = DEFAULT_KINDS
    covers: Sequence[str] = ()
    known: Mapping[str, str] = field(default_factory=dict)
    setup: Callable[[], tuple[Callable[..., Any], Mapping[str, Any], Any]] | None = None
    global_rng: str | None = None

    def __post_init__(self) -> None:
        if not self.covers:
            self.covers = (self.name.split(".")[0],)

    def check(self, raise_on_violation: bool = True) -> HostileReport:
        fn, example, state_of = self.fn, self.example, None
        if self.setup is not None:
            fn, example, state_of = self.setup()
        if fn is None:
            raise ValueError(f"HostileSpec {self.name!r} needs fn or setup")
        return check_hostile(
            fn, example, arrays=self.arrays, allow=self.allow, kinds=self.kinds, name=self.name,
            state_of=state_of, known=self.known, raise_on_violation=raise_on_violation,
            global_rng=self.global_rng,
        )  # fmt: skip


def assert_covers(
    module: Any, specs: Iterable[HostileSpec], exclude: Mapping[str, str] | None = None
) -> list[str]:
    """Assert that ``specs`` cover every function and class in ``module.__all__`` (minus ``exclude``,
    a ``{name: reason}`` map); return the sorted covered names."""
    exclude = dict(exclude or {})
    public = {
        n
        for n in getattr(module, "__all__", ())
        if callable(getattr(module, n, None)) and not n.startswith("__")
    }
    covered = {c for s in specs for c in s.covers}
    missing = sorted(public - covered - set(exclude))
    stale = sorted(set(exclude) & covered) + sorted(set(exclude) - public)
    if missing or stale:
        raise AssertionError(
            f"hostile-input registry of {module.__name__}: uncovered public callables {missing}; "
            f"exclusions that are covered or not public {stale}"
        )
    return sorted(covered & public)
