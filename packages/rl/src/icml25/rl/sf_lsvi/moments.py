"""Bellman Unbiasedness (SF-LSVI) — ICML 2025, P43: moment and quantile Bellman targets, moment projection.

Cho, Han, Ju, Kim, Lee, Lee, "Bellman Unbiasedness: Toward Provably Efficient Distributional Reinforcement
Learning with General Value Function Approximation", ICML 2025 (arXiv 2407.21260; no official code).

* :func:`moment_bellman_target`: the binomial expansion of ``E[(r + Z')^n]``. It is linear in the next
  state's moments, so one sampled ``(r, s')`` gives an unbiased target (Bellman unbiasedness);
* :func:`quantile_bellman_target`: the quantile-regression fixed point of a sampled target
  ``r + {next atoms}``. It is nonlinear in the next state's distribution, so averaging single-sample
  targets is biased (the paper's counter-example: quantiles are neither Bellman-closed nor -unbiased);
* :func:`project_moments`: clips a (regressed) moment vector of a return in ``[0, upper]`` onto necessary
  conditions of a moment sequence (support bounds, ``m_n^2 <= m_{n-1} m_{n+1}``; variance >= 0 included).

Numerics: everything is float64; moments of a return in ``[0, L]`` grow like ``L^n`` (``L = 100``, ``n = 4``:
1e8, exact to ~1e-8 relative), so no rescaling is needed at the horizons used here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from icml25.rl.sf_lsvi._checks import as_float_array, like_input

__all__ = ["moment_bellman_target", "project_moments", "quantile_bellman_target"]


def binomial_table(n_moments: int) -> np.ndarray:
    """``C[n, k] = binom(n, k)`` for ``0 <= k <= n <= n_moments`` (float64, zero above the diagonal)."""
    table = np.zeros((n_moments + 1, n_moments + 1))
    for n in range(n_moments + 1):
        for k in range(n + 1):
            table[n, k] = math.comb(n, k)
    return table


def expand(reward_powers: np.ndarray, next_moments: np.ndarray) -> np.ndarray:
    """The binomial expansion without checks: ``out[..., n-1] = sum_k C(n,k) R[..., n-k] M[..., k]``.

    ``reward_powers`` and ``next_moments`` are ``[..., N+1]`` with index 0 equal to 1 (``E r^0``, ``E Z^0``).
    """
    n_moments = next_moments.shape[-1] - 1
    table = binomial_table(n_moments)
    shape = np.broadcast_shapes(reward_powers.shape[:-1], next_moments.shape[:-1])
    out = np.zeros((*shape, n_moments))
    for n in range(1, n_moments + 1):
        for k in range(n + 1):
            out[..., n - 1] += table[n, k] * reward_powers[..., n - k] * next_moments[..., k]
    return out


def expansion_tensor(n_moments: int) -> np.ndarray:
    """``B[n-1, j, k] = C(n, k)`` when ``j = n - k``, else 0: :func:`expand` as one contraction."""
    table = binomial_table(n_moments)
    out = np.zeros((n_moments, n_moments + 1, n_moments + 1))
    for n in range(1, n_moments + 1):
        for k in range(n + 1):
            out[n - 1, n - k, k] = table[n, k]
    return out


def project(m: np.ndarray, u: np.ndarray | float) -> np.ndarray:
    """:func:`project_moments` without checks (``m [..., N]``, ``u`` broadcasting to ``m[..., 0]``)."""
    out = np.empty_like(m)
    prev2 = np.ones(m.shape[:-1])
    prev = np.clip(m[..., 0], 0.0, u)
    out[..., 0] = prev
    for n in range(1, m.shape[-1]):
        low = np.where(prev2 > 0, prev * prev / np.where(prev2 > 0, prev2, 1.0), 0.0)
        cur = np.minimum(np.maximum(m[..., n], low), u * prev)
        out[..., n] = cur
        prev2, prev = prev, cur
    return out


def moment_bellman_target(r: Any, next_moments: Any, r_moments: Any = None) -> Any:
    """Moment Bellman target ``y_n = sum_{k=0}^{n} C(n,k) r^{n-k} m'_k`` for ``n = 1..N`` (``m'_0 = 1``).

    With a sampled reward ``r`` and the moments ``m'_k = E[Z'^k]`` of the return from a sampled next state,
    ``E[y_n] = E[(r + Z')^n]`` exactly: the target is linear in the next-state moments, so a single sampled
    transition is an unbiased estimate (Bellman unbiasedness). The future return ``Z'`` must be independent
    of ``r`` given the next state (true in an MDP), not the reward of the transition itself.

    Args:
        r: sampled rewards, shape ``[...]`` (numpy array, torch tensor or number). ``None`` when
            ``r_moments`` is given.
        next_moments: ``[..., N]`` moments ``E[Z'^1..N]`` of the next return (zeros past the horizon or at a
            terminal state).
        r_moments: optional ``[..., N]`` reward moments ``E[r^1..N]`` used instead of the powers of a sampled
            ``r`` (a known reward distribution; then ``r`` and ``Z'`` must be independent).

    Returns:
        ``[..., N]`` float64 target moments, a torch tensor when ``next_moments`` is one, else numpy.

    Raises:
        ValueError: non-finite inputs, ``N == 0``, mismatched batch shapes, both or neither of ``r`` and
            ``r_moments``, or targets that overflow float64.
        TypeError: non-numeric inputs.
    """
    nxt = as_float_array(next_moments, "next_moments", min_ndim=1)
    n_moments = nxt.shape[-1]
    if n_moments == 0:
        raise ValueError(
            f"next_moments must hold at least one moment on its last axis, got shape {nxt.shape}"
        )
    batch = nxt.shape[:-1]
    if (r is None) == (r_moments is None):
        raise ValueError("give exactly one of r (sampled rewards) and r_moments (reward moments), got "
                         f"r={'None' if r is None else 'an array'}, r_moments="
                         f"{'None' if r_moments is None else 'an array'}")  # fmt: skip
    if r is not None:
        rew = as_float_array(r, "r")
        if rew.shape != batch:
            raise ValueError(
                f"r must have the batch shape {batch} of next_moments ([..., N]), got {rew.shape}"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            powers = rew[..., None] ** np.arange(n_moments + 1)
    else:
        rm = as_float_array(r_moments, "r_moments", min_ndim=1)
        if rm.shape != nxt.shape:
            raise ValueError(f"r_moments must have the shape of next_moments {nxt.shape}, got {rm.shape}")
        powers = np.concatenate([np.ones((*batch, 1)), rm], axis=-1)
    moments = np.concatenate([np.ones((*batch, 1)), nxt], axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        out = expand(powers, moments)
    if not np.isfinite(out).all():
        raise ValueError(
            "r and next_moments give non-finite targets (float64 overflow): rewards and moments must be "
            f"of a representable size, got max |r| = {np.abs(powers[..., 1]).max(initial=0):.3g} and max "
            f"|next_moments| = {np.abs(nxt).max(initial=0):.3g}"
        )
    return like_input(out, next_moments)


def quantile_bellman_target(r: Any, next_atoms: Any, taus: Sequence[float] | Any) -> Any:
    """Quantile-regression fixed point of a sampled target ``{r + theta'_j}`` at the levels ``taus``.

    The sampled target distribution puts mass ``1/M`` on each of the ``M`` atoms ``r + theta'_j``; the
    quantile-regression (pinball loss) minimiser at level ``tau`` is its generalised inverse CDF, the
    ``ceil(tau M)``-th smallest atom. Averaged over sampled next states this is **not** the quantile of the
    true target distribution (quantiles are not Bellman-unbiased).

    Args:
        r: sampled rewards ``[...]``.
        next_atoms: ``[..., M]`` quantile atoms of the next return (zeros past the horizon).
        taus: ``[T]`` levels in ``(0, 1)``.

    Returns:
        ``[..., T]`` float64, a torch tensor when ``next_atoms`` is one.
    """
    atoms = as_float_array(next_atoms, "next_atoms", min_ndim=1)
    if atoms.shape[-1] == 0:
        raise ValueError(f"next_atoms must hold at least one atom on its last axis, got shape {atoms.shape}")
    rew = as_float_array(r, "r")
    if rew.shape != atoms.shape[:-1]:
        raise ValueError(f"r must have the batch shape of next_atoms {atoms.shape[:-1]}, got {rew.shape}")
    levels = as_float_array(taus, "taus", ndim=1)
    if levels.size == 0 or (levels <= 0).any() or (levels >= 1).any():
        raise ValueError(f"taus must be a non-empty list of levels in (0, 1), got {levels.tolist()}")
    m = atoms.shape[-1]
    idx = np.clip(np.ceil(levels * m - 1e-9).astype(np.int64) - 1, 0, m - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        target = np.sort(rew[..., None] + atoms, axis=-1)[..., idx]
    if not np.isfinite(target).all():
        raise ValueError("r and next_atoms give non-finite targets (float64 overflow)")
    return like_input(target, next_atoms)


def project_moments(moments: Any, upper: Any) -> Any:
    """Project moments ``[..., N]`` of a return in ``[0, upper]`` onto necessary moment conditions.

    Sequentially: ``m_1 in [0, U]``, then ``m_n in [m_{n-1}^2 / m_{n-2}, U m_{n-1}]`` (``m_0 = 1``): the
    support bound ``Z^n <= U Z^{n-1}`` and Cauchy-Schwarz ``E[Z^{n-1}]^2 <= E[Z^{n-2}] E[Z^n]``, which for
    ``n = 2`` is variance >= 0. The interval is never empty (the previous step enforced ``m_{n-1} <= U
    m_{n-2}``); a valid moment vector is returned unchanged, so the projection only repairs regression noise.

    Args:
        moments: ``[..., N]`` raw moments.
        upper: the support bound ``U >= 0`` (a number or an array broadcasting to ``moments[..., 0]``).

    Returns:
        ``[..., N]`` float64, a torch tensor when ``moments`` is one.
    """
    m = as_float_array(moments, "moments", min_ndim=1)
    if m.shape[-1] == 0:
        raise ValueError(f"moments must hold at least one moment on its last axis, got shape {m.shape}")
    u = as_float_array(upper, "upper")
    if (u < 0).any():
        raise ValueError(f"upper must be >= 0 (returns lie in [0, upper]), got min {u.min():.3g}")
    try:
        u = np.broadcast_to(u, m.shape[:-1])
    except ValueError:
        raise ValueError(
            f"upper must broadcast to the batch shape of moments {m.shape[:-1]}, got {u.shape}"
        ) from None
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = project(m, u)
    if not np.isfinite(out).all():
        raise ValueError("moments and upper give non-finite projected moments (float64 overflow)")
    return like_input(out, moments)
