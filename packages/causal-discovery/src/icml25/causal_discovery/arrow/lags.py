"""ARROW: An Accelerator for Time Series Causal Discovery with Time Weaving — ICML 2025, P54: XOR lag discovery and
global pruning (steps 2 and 3).

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
    bits = _check_bits(bits, lag_max, patch)
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


def _check_bits(bits: object, lag_max: object, patch: int) -> np.ndarray:
    arr = np.asarray(bits)
    if arr.ndim != 2 or arr.dtype != bool:
        raise ValueError(f"bits must be a bool array [T-1, d], got shape {arr.shape} dtype {arr.dtype}")
    if isinstance(lag_max, int) and arr.shape[0] + 1 < lag_max + patch:
        raise ValueError(
            f"bits must hold T-1 >= lag_max + {patch - 1} = {lag_max + patch - 1} trend bits for lag_max={lag_max}, "
            f"got shape {arr.shape}"
        )
    return arr


def _allowed_pairs(d: int, include_self: bool, exclude) -> np.ndarray:
    """``(d, d)`` bool mask of the (effect, cause) pairs that may be candidates."""
    allowed = np.ones((d, d), dtype=bool)
    if not include_self:
        np.fill_diagonal(allowed, False)
    for v in exclude:
        allowed[v, :] = False
        allowed[:, v] = False
    return allowed


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
    raw, lags = np.asarray(score), np.asarray(tau_star)
    if raw.dtype.kind not in "iuf":
        raise TypeError(f"score must be a real numeric [d, d] array, got dtype {raw.dtype}")
    if lags.dtype.kind not in "iu":
        raise TypeError(f"tau_star must be an integer [d, d] array of lags, got dtype {lags.dtype}")
    score = raw.astype(np.float64)
    if not np.isfinite(score).all():
        raise ValueError(f"score must be finite, got {int((~np.isfinite(score)).sum())} NaN/Inf entries")
    d = score.shape[0] if score.ndim else 0
    if score.ndim != 2 or score.shape != (d, d) or np.shape(tau_star) != (d, d):
        raise ValueError(
            f"score and tau_star must be square [d, d] arrays, got {score.shape} and {np.shape(tau_star)}"
        )
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.floating)):
        raise TypeError(f"theta must be a float threshold, got {type(theta).__name__} {theta!r}")
    if math.isnan(theta):
        raise ValueError(f"theta must be a float threshold (±inf allowed), not NaN, got {theta!r}")
    if not isinstance(k, (int, float, np.floating)) or not k > 0:
        raise ValueError(f"k must be a float > 0 (cap = floor(k*d^2/2) pairs), got {k!r}")
    if per_target_cap is not None and (
        not isinstance(per_target_cap, (int, np.integer)) or per_target_cap < 1
    ):
        raise ValueError(f"per_target_cap must be None or an int >= 1, got {per_target_cap!r}")
    allowed = _allowed_pairs(d, include_self, exclude)
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
    bits = _check_bits(bits, lag_max, patch)
    n_bits, d = bits.shape
    if d == 0:
        raise ValueError(f"bits must have at least one variable column [T-1, d >= 1], got shape {bits.shape}")
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


# ------------------------------------------------------------------------- dependence rescue (ours)
class DependenceScores(NamedTuple):
    """Output of :func:`dependence_scores`; every array is indexed ``[effect, cause, ...]``.

    Attributes:
        tau_star: int ``[d, d]``, the lag in ``1 … L-1`` with the largest ``G`` (the smallest one on ties).
        score: float ``[d, d]``, ``max_τ G_ij(τ)``.
        g: float ``[d, d, L]``, the G statistic ``2·n_τ·MI_ij(τ)`` (nats) per lag (slot 0 unused: 0).
        df: degrees of freedom of ``G`` under independence, ``(bins-1)²``.
    """

    tau_star: np.ndarray
    score: np.ndarray
    g: np.ndarray
    df: int


def rank_bins(X: np.ndarray, bins: int) -> np.ndarray:
    """Equal-frequency bin index ``0 … bins-1`` of every value, per column (ranks, ties by order)."""
    T = X.shape[0]
    ranks = np.argsort(np.argsort(X, axis=0, kind="stable"), axis=0, kind="stable")
    return (ranks * bins // T).astype(np.int64)


def dependence_scores(X: np.ndarray, lag_max: int, bins: int = 6) -> DependenceScores:
    """Lagged binned mutual information of every ordered pair at lags ``1 … lag_max-1`` (our extension).

    Each series is cut into ``bins`` equal-frequency (rank) bins; for effect ``i``, cause ``j`` and lag
    ``τ`` the plug-in mutual information of ``(bin x_i(t), bin x_j(t-τ))`` over the ``n_τ = T-τ`` aligned
    samples is turned into the G statistic ``2·n_τ·MI``, which is ``χ²((bins-1)²)`` for independent
    samples. Unlike the trend codes it sees any dependence, monotone or not (a ``sin`` or quadratic link
    whose up/down agreement with its cause is near chance). All pairs of one lag are one matrix product of
    one-hot codes, ``[d·bins, n_τ] @ [n_τ, d·bins]``: ``O(L·T·d²·bins²)``.

    Args:
        X: float ``[T, d]`` raw values.
        lag_max: ``L``; lag 0 is never scored (its slot stays 0), as for the XOR scores.
        bins: bins per series (``>= 2``).

    Returns:
        :class:`DependenceScores` indexed ``[effect, cause]``.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be a [T, d] array, got shape {X.shape}")
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 2:
        raise ValueError(f"rescue_bins must be an int >= 2, got {bins!r}")
    T, d = X.shape
    lag_max = check_lag_max(lag_max, T)
    codes = rank_bins(X, int(bins))
    onehot = np.zeros((T, d, bins))
    np.put_along_axis(onehot, codes[:, :, None], 1.0, axis=2)
    onehot = onehot.reshape(T, d * bins)
    g = np.zeros((d, d, lag_max))
    for tau in range(1, lag_max):
        n = T - tau
        joint = (onehot[tau:].T @ onehot[:n]).reshape(d, bins, d, bins).transpose(0, 2, 1, 3) / n
        p_eff = joint.sum(3, keepdims=True)  # [effect, cause, a, 1]
        p_cause = joint.sum(2, keepdims=True)  # [effect, cause, 1, b]
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(joint > 0, joint * np.log(joint / (p_eff * p_cause)), 0.0)
        g[:, :, tau] = 2.0 * n * terms.sum((2, 3))
    tau_star = g.argmax(-1)
    score = np.take_along_axis(g, tau_star[..., None], -1)[..., 0]
    return DependenceScores(tau_star.astype(np.int64), score, g, (int(bins) - 1) ** 2)


def rescue_candidates(
    X: np.ndarray,
    kept: list[Candidate],
    lag_max: int,
    bins: int = 6,
    alpha: float = 0.05,
    k: float = 0.5,
    include_self: bool = True,
    exclude: list[int] | tuple[int, ...] = (),
) -> tuple[list[Candidate], DependenceScores]:
    """Pairs that the XOR step dropped but a binned mutual-information screen finds dependent (our extension).

    Every ordered pair not in ``kept`` (self pairs only with ``include_self``; none touching ``exclude``)
    is tested at its best lag by :func:`dependence_scores`. A pair is rescued when its ``G`` exceeds the
    ``χ²((bins-1)²)`` quantile at ``1 - alpha / m``, ``m`` = screened pairs × lags (a Bonferroni bound over
    the whole screen, for independent samples: autocorrelation makes it liberal, which only costs base
    time). The rescued pairs are ranked by ``G`` and capped at ``⌊k·d²/2⌋``; their lag is the screen's
    argmax lag.

    Returns:
        ``([(effect, cause, lag), ...]`` in descending ``G`` order, the :class:`DependenceScores`).
    """
    from scipy.stats import chi2

    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)) or not 0 < alpha < 1:
        raise ValueError(f"rescue_alpha must be a float in (0, 1), got {alpha!r}")
    dep = dependence_scores(X, lag_max, bins)
    d = dep.score.shape[0]
    allowed = _allowed_pairs(d, include_self, exclude)
    for i, j, _ in kept:
        allowed[i, j] = False
    n_tests = int(allowed.sum()) * (lag_max - 1)
    if n_tests == 0:
        return [], dep
    crit = float(chi2.isf(alpha / n_tests, dep.df))
    flat = np.where(allowed, dep.score, -np.inf).ravel()
    order = np.argsort(-flat, kind="stable")
    rescued: list[Candidate] = []
    for idx in order[: n_top(d, float(k))]:
        if not flat[idx] > crit:
            break
        i, j = divmod(int(idx), d)
        rescued.append((i, j, int(dep.tau_star[i, j])))
    return rescued, dep
