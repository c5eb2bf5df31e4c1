"""XOR lag discovery and global pruning (ARROW steps 2 and 3).

For effect ``i``, cause ``j`` and lag ``τ ≥ 1`` the effect's patch ``p+τ`` is XORed with the cause's patch
``p`` for every ``p``: ``same_ij(τ)`` is the fraction of identical two-step shapes (XOR ``00``) and
``opp_ij(τ)`` the fraction of mirrored ones (XOR ``11``, a negative link). The pair's lag is
``τ*_ij = argmax_τ max(same, opp)`` and its score ``s_ij`` the maximum. Chance level is about 0.25 per
statistic; taking the maximum over lags and the two statistics lifts the null to about 0.30 at
``T = 1000``, which is why the official threshold is 0.33.

Pruning ranks all ``d²`` ordered pairs (self pairs included) by score in one global list and keeps those
above ``θ``, at most ``⌊k·d²/2⌋`` of them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from icml25.causal_discovery.arrow.weaving import pack_trend_bits
from icml25.kernels.xor_lag import xor_lag_counts

Candidate = tuple[int, int, int]  # (effect, cause, lag)


class LagScores(NamedTuple):
    """Output of :func:`xor_lag_scores`; every array is indexed ``[effect, cause, ...]``.

    Attributes:
        tau_star: int ``[d, d]``, the best lag in ``1 … L-1`` (the smallest one on ties).
        score: float ``[d, d]``, ``max_τ max(same, opp)``.
        same: float ``[d, d, L]``, fraction of identical patch pairs per lag (slot 0 unused: 0).
        opp: float ``[d, d, L]``, fraction of mirrored patch pairs per lag (slot 0 unused: 0).
    """

    tau_star: np.ndarray
    score: np.ndarray
    same: np.ndarray
    opp: np.ndarray


def check_lag_max(lag_max: object, T: int, patch: int = 3) -> int:
    """Validate the lag bound ``L`` (candidate lags ``1 … L-1``) against the series length ``T``.

    At the largest lag ``L-1`` at least two patch pairs must remain: ``T - patch + 1 - (L-1) >= 2``, i.e.
    ``T >= L + patch`` (``T >= L + 3`` for 3-point patches).
    """
    if isinstance(lag_max, bool) or not isinstance(lag_max, (int, np.integer)):
        raise TypeError(
            f"lag_max must be an int (candidate lags 1 … lag_max-1), got {type(lag_max).__name__}"
        )
    lag_max = int(lag_max)
    if lag_max < 2:
        raise ValueError(f"lag_max must be >= 2 (candidate lags 1 … lag_max-1), got {lag_max}")
    if T < lag_max + patch:
        raise ValueError(
            f"series too short for lag_max={lag_max}: need T >= lag_max + {patch} = {lag_max + patch} "
            f"(two patches at the largest lag), got T={T}"
        )
    return lag_max


def xor_lag_scores(
    bits: np.ndarray, lag_max: int, patch: int = 3, *, backend: str | None = None, device: str | None = None
) -> LagScores:
    """XOR lag scores of every ordered pair (self pairs included) at lags ``1 … lag_max-1``.

    Args:
        bits: bool ``[T-1, d]`` trend bits from :func:`~icml25.causal_discovery.arrow.time_weave`.
        lag_max: ``L``; lag 0 is never scored (its slot stays 0), as in the official code.
        patch: points per patch (patches carry ``patch-1`` bits).
        backend: kernel backend for :func:`icml25.kernels.xor_lag.xor_lag_counts`.
        device: torch device of the counting (e.g. ``"cuda"`` for the Triton kernel); ``None``: CPU.

    Returns:
        :class:`LagScores` indexed ``[effect, cause]``.
    """
    bits = np.asarray(bits)
    if bits.ndim != 2 or bits.dtype != bool:
        raise ValueError(f"bits must be a bool array [T-1, d], got shape {bits.shape} dtype {bits.dtype}")
    T = bits.shape[0] + 1
    lag_max = check_lag_max(lag_max, T, patch)
    n_bits = bits.shape[0]
    words = pack_trend_bits(bits)
    if device is not None:
        words = words.to(device)
    same_c, opp_c = xor_lag_counts(words, n_bits, lag_max, patch - 1, backend=backend)
    n_pairs = torch.as_tensor(n_bits - (patch - 1) + 1 - np.arange(lag_max), dtype=torch.float64)
    same = (same_c.cpu() / n_pairs).numpy()
    opp = (opp_c.cpu() / n_pairs).numpy()
    same[:, :, 0] = 0.0  # τ = 0 is never a candidate
    opp[:, :, 0] = 0.0
    per_lag = np.maximum(same, opp)
    tau_star = per_lag.argmax(-1)  # first maximum: the smallest lag wins ties
    score = np.take_along_axis(per_lag, tau_star[..., None], -1)[..., 0]
    return LagScores(tau_star.astype(np.int64), score, same, opp)


def n_top(d: int, k: float) -> int:
    """The official global cap ``⌊k·d²/2⌋`` on kept pairs (``d²/4`` for ``k = 0.5``)."""
    return math.floor(k * d * d / 2)


def prune_candidates(
    score: np.ndarray,
    tau_star: np.ndarray,
    theta: float = 0.33,
    k: float = 0.5,
    per_target_cap: int | None = None,
    include_self: bool = True,
    exclude: list[int] | tuple[int, ...] = (),
) -> list[Candidate]:
    """Global ranking of ordered pairs by score, thresholded and capped.

    Args:
        score: ``[d, d]`` pair scores ``s_ij`` (``[effect, cause]``).
        tau_star: ``[d, d]`` best lags.
        theta: keep pairs with ``s_ij > theta`` (strict, as in the official code).
        k: cap the kept pairs at ``⌊k·d²/2⌋`` in total (global, not per target).
        per_target_cap: optionally also keep at most this many causes per effect (our extension).
        include_self: rank the self pairs ``(i, i)`` too (official).
        exclude: variables excluded as causes and effects (e.g. constant series).

    Returns:
        ``[(effect, cause, lag), ...]`` in descending score order; ties broken by ``(effect, cause)``.
    """
    score = np.asarray(score, dtype=np.float64)
    d = score.shape[0]
    if score.ndim != 2 or score.shape != (d, d) or np.shape(tau_star) != (d, d):
        raise ValueError(
            f"score and tau_star must be square [d, d] arrays, got {score.shape} and {np.shape(tau_star)}"
        )
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.floating)) or math.isnan(theta):
        raise TypeError(f"theta must be a float threshold, got {theta!r}")
    if not isinstance(k, (int, float, np.floating)) or not k > 0:
        raise ValueError(f"k must be a float > 0 (cap = floor(k*d^2/2) pairs), got {k!r}")
    if per_target_cap is not None and (
        not isinstance(per_target_cap, (int, np.integer)) or per_target_cap < 1
    ):
        raise ValueError(f"per_target_cap must be None or an int >= 1, got {per_target_cap!r}")
    allowed = np.ones((d, d), dtype=bool)
    if not include_self:
        np.fill_diagonal(allowed, False)
    for v in exclude:
        allowed[v, :] = False
        allowed[:, v] = False
    flat = score.ravel()
    order = np.argsort(-flat, kind="stable")  # descending; equal scores keep (effect, cause) order
    cap = n_top(d, float(k))
    kept: list[Candidate] = []
    per_target = np.zeros(d, dtype=np.int64)
    for idx in order:
        if len(kept) >= cap or not flat[idx] > theta:  # sorted: nothing further can pass the threshold
            break
        i, j = divmod(int(idx), d)
        if not allowed[i, j] or (per_target_cap is not None and per_target[i] >= per_target_cap):
            continue
        kept.append((i, j, int(tau_star[i, j])))
        per_target[i] += 1
    return kept


def null_threshold(
    bits: np.ndarray,
    lag_max: int,
    n_shifts: int = 20,
    quantile: float = 0.95,
    patch: int = 3,
    rng: np.random.Generator | int | None = None,
    *,
    backend: str | None = None,
    device: str | None = None,
) -> float:
    """Data-driven threshold from circular-shift surrogates (our extension; the official θ is a fixed 0.33).

    For each of ``n_shifts`` surrogates every cause stream is rotated by its own random offset in
    ``[L, T-1-L]``, which destroys any lagged relation up to ``L`` but keeps each series' own trend
    statistics. The surrogate statistic is the largest score over all (effect, rotated cause) pairs, so
    the threshold is its ``quantile`` across surrogates: a family-wise bound on the best null pair.

    Returns:
        the threshold (compare with ``>`` like ``theta``).
    """
    bits = np.asarray(bits)
    n_bits, d = bits.shape
    lag_max = check_lag_max(lag_max, n_bits + 1, patch)
    if isinstance(n_shifts, bool) or not isinstance(n_shifts, (int, np.integer)) or n_shifts < 1:
        raise ValueError(f"null_shifts must be an int >= 1, got {n_shifts!r}")
    if not 0 < quantile < 1:
        raise ValueError(f"null_quantile must be in (0, 1), got {quantile!r}")
    rng = np.random.default_rng(rng)
    lo, hi = lag_max, n_bits - lag_max  # offsets far from 0 modulo n_bits in both directions
    if hi <= lo:
        lo, hi = 1, n_bits
    t = np.arange(n_bits)
    maxima = np.empty(n_shifts)
    for s in range(n_shifts):
        offsets = rng.integers(lo, hi, size=d)
        rotated = bits[(t[:, None] + offsets[None, :]) % n_bits, np.arange(d)[None, :]]
        both = np.concatenate([bits, rotated], axis=1)  # effects: first d columns, causes: last d
        sc = xor_lag_scores(both, lag_max, patch, backend=backend, device=device).score
        maxima[s] = sc[:d, d:].max()
    return float(np.quantile(maxima, quantile))
