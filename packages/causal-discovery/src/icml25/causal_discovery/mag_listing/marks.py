"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: the endpoint-mark
alphabet and the validation of mark matrices.

Wang, Du, Zhou, "Polynomial-delay MAG listing with singleton background knowledge", ICML 2025 (PMLR 267).

Convention (pcalg ``amat.pag``): ``M[i, j]`` is the mark **at j** on the edge ``i - j``;
``0`` no edge, ``1`` circle, ``2`` arrowhead, ``3`` tail. So ``M[a, b] = 2, M[b, a] = 3`` is ``a -> b``,
``M[a, b] = M[b, a] = 2`` is ``a <-> b`` and ``M[a, b] = 1, M[b, a] = 1`` is ``a o-o b``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NONE, CIRCLE, ARROW, TAIL = 0, 1, 2, 3
MARK_NAMES = {NONE: "none", CIRCLE: "circle", ARROW: "arrowhead", TAIL: "tail"}
_MARK_ALIASES = {
    "arrow": ARROW,
    "arrowhead": ARROW,
    ">": ARROW,
    "tail": TAIL,
    "-": TAIL,
    ARROW: ARROW,
    TAIL: TAIL,
}


class InconsistentBackgroundKnowledge(ValueError):
    """Background knowledge that no MAG of the PAG's equivalence class satisfies."""


class Conflict(Exception):
    """Internal: a partial mixed graph admits no MAG (raised by rules and conflict detectors)."""


def parse_bk_mark(value: object, name: str) -> int:
    """``"arrow"``/``"tail"`` (or the codes 2/3) -> code; anything else raises ``ValueError``."""
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, (bool, np.bool_)) or key not in _MARK_ALIASES:
        raise ValueError(f"{name} must be 'arrow' (2) or 'tail' (3), got {value!r}")
    return _MARK_ALIASES[key]  # type: ignore[index]


def validate_marks(marks: object, name: str = "marks") -> np.ndarray:
    """Check an ``[n, n]`` endpoint-mark matrix and return it as ``int8``.

    Raises ``TypeError`` for non-numeric input and ``ValueError`` for a non-square matrix, marks outside
    ``{0, 1, 2, 3}``, a non-zero diagonal or an asymmetric adjacency (a mark on one side only).
    """
    if isinstance(marks, (str, bytes)) or not isinstance(marks, (np.ndarray, Sequence)):
        raise TypeError(f"{name} must be an [n, n] integer array of marks, got {type(marks).__name__}")
    arr = np.asarray(marks)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise TypeError(f"{name} must be an [n, n] integer array of marks, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"{name} must be a square [n, n] matrix, got shape {arr.shape}")
    if np.issubdtype(arr.dtype, np.floating) and not np.all(arr == np.round(arr)):
        raise ValueError(f"{name} must hold integer mark codes 0-3, got non-integer values")
    bad = ~np.isin(arr, (NONE, CIRCLE, ARROW, TAIL))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(
            f"{name} must hold marks in {{0: none, 1: circle, 2: arrowhead, 3: tail}}, "
            f"got {arr[i, j]!r} at [{i}, {j}]"
        )
    arr = arr.astype(np.int8)
    if np.any(np.diag(arr) != 0):
        raise ValueError(f"{name} must have a zero diagonal (no self loops), got {np.diag(arr).tolist()}")
    asym = (arr == 0) != (arr.T == 0)
    if asym.any():
        i, j = np.argwhere(asym)[0]
        raise ValueError(
            f"{name} must have a symmetric adjacency (a mark at both ends of every edge), "
            f"got {name}[{i}, {j}]={arr[i, j]} but {name}[{j}, {i}]={arr[j, i]}"
        )
    return arr


def reject_selection_bias(arr: np.ndarray, name: str) -> None:
    """Tail-tail (``a -- b``) and circle-tail (``a --o b``) edges arise only from selection bias."""
    tail_at_i = arr.T == TAIL  # [i, j]: mark at i on i - j is a tail
    for other, what in ((TAIL, "tail-tail (undirected)"), (CIRCLE, "tail-circle")):
        hit = tail_at_i & (arr == other)
        if hit.any():
            i, j = np.argwhere(hit)[0]
            raise ValueError(
                f"{name} has a {what} edge between {i} and {j}; such marks arise only from selection "
                "bias, which this implementation does not support (edges must be ->, <->, o->, o-o)"
            )
