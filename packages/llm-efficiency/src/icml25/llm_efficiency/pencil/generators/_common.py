"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: argument checks shared by the trace generators."""

from __future__ import annotations

import numbers


def _int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_count(x: object, name: str, lowest: int = 1) -> int:
    """``x`` as an int ``>= lowest`` (``TypeError``/``ValueError`` naming ``name`` otherwise)."""
    if not _int(x):
        raise TypeError(f"{name} must be an int, got {type(x).__name__} {x!r}")
    if x < lowest:
        raise ValueError(f"{name} must be >= {lowest}, got {x}")
    return int(x)


def check_range(lo: object, hi: object, lo_name: str, hi_name: str, lowest: int, what: str) -> None:
    """``lowest <= lo <= hi`` for two int arguments."""
    for v, n in ((lo, lo_name), (hi, hi_name)):
        if not _int(v):
            raise TypeError(f"{n} must be an int, got {type(v).__name__} {v!r}")
    if lo < lowest:
        raise ValueError(f"{lo_name} must be >= {lowest} ({what}), got {lo}")
    if lo > hi:
        raise ValueError(f"{lo_name} must be <= {hi_name}, got {lo_name}={lo} > {hi_name}={hi}")


def check_seed(seed: object) -> int:
    if not _int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return int(seed)
