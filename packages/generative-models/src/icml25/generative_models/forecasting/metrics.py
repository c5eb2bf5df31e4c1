"""K²VAE: Koopman–Kalman VAE for long-term probabilistic forecasting — ICML 2025, P06: forecast metrics.

Wu et al., "K²VAE: A Koopman-Kalman Enhanced Variational AutoEncoder for Probabilistic Time Series
Forecasting", ICML 2025 (arXiv 2505.23017; official code ``decisionintelligence/K2VAE``, built on ProbTS).

Sample CRPS (the exact energy form of the empirical distribution), the closed-form Gaussian CRPS, the
ProbTS/GluonTS "CRPS" (mean weighted quantile loss, normalised by ``sum |y|``), the normalised deviation
(ND, called NMAE in the paper) and central-interval coverage. Samples are ``(N, *shape)`` and targets
``shape``; everything is computed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from icml25.kernels.checks import check_tensor

__all__ = [
    "DEFAULT_QUANTILES",
    "crps_from_samples",
    "gaussian_crps",
    "gluonts_quantile",
    "interval_coverage",
    "nmae",
    "weighted_quantile_loss",
]

DEFAULT_QUANTILES: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 20))
"""The 19 quantile levels 0.05, 0.10, ..., 0.95 used for the quantile-loss CRPS."""


def _as_tensor(value: object, name: str) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(value).__name__}")
    return check_tensor(value, name, non_empty=True).detach().to(torch.float64)


def _samples_target(samples: object, y: object) -> tuple[torch.Tensor, torch.Tensor]:
    s, t = _as_tensor(samples, "samples"), _as_tensor(y, "y")
    if s.shape[1:] != t.shape:
        raise ValueError(
            f"samples must have shape (N, *y.shape) = (N, {', '.join(map(str, t.shape))}); got "
            f"samples {tuple(s.shape)} and y {tuple(t.shape)}"
        )
    return s, t


def crps_from_samples(samples: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Exact CRPS of the empirical distribution of ``samples`` ``(N, *shape)`` at ``y`` ``(*shape)``.

    ``CRPS = E|X - y| - 0.5 E|X - X'|`` with both expectations over the ``N`` samples (the "energy" form,
    computed in ``O(N log N)`` from the sorted samples). Returns a float64 tensor of shape ``y.shape``.
    """
    s, t = _samples_target(samples, y)
    n = s.shape[0]
    term1 = (s - t).abs().mean(0)
    xs = torch.sort(s, dim=0).values
    w = (2.0 * torch.arange(1, n + 1, dtype=torch.float64) - n - 1).reshape(-1, *([1] * t.dim()))
    term2 = (w * xs).sum(0) / (n * n)  # = 0.5 * E|X - X'|
    return term1 - term2


def gaussian_crps(
    mean: torch.Tensor | np.ndarray, std: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray
) -> torch.Tensor:
    """Closed-form CRPS of ``N(mean, std²)`` at ``y`` (all of one shape; ``std > 0``), float64.

    ``σ [z (2Φ(z) − 1) + 2φ(z) − 1/√π]`` with ``z = (y − μ)/σ`` (Gneiting & Raftery, 2007).
    """
    m, s, t = _as_tensor(mean, "mean"), _as_tensor(std, "std"), _as_tensor(y, "y")
    if not m.shape == s.shape == t.shape:
        raise ValueError(
            f"mean, std and y must have one shape; got mean {tuple(m.shape)}, std {tuple(s.shape)}, "
            f"y {tuple(t.shape)}"
        )
    if (s <= 0).any():
        raise ValueError(f"std must be > 0 everywhere; got min {float(s.min()):g}")
    z = (t - m) / s
    pdf = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
    return s * (z * (2 * cdf - 1) + 2 * pdf - 1 / math.sqrt(math.pi))


def _check_levels(quantiles: Sequence[float], name: str = "quantiles") -> torch.Tensor:
    try:
        q = torch.as_tensor(list(quantiles), dtype=torch.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a sequence of floats in (0, 1), got {quantiles!r}") from err
    if q.dim() != 1 or q.numel() == 0 or not bool(((q > 0) & (q < 1)).all()):
        raise ValueError(f"{name} must be a non-empty sequence of floats in (0, 1), got {list(quantiles)!r}")
    return q


def gluonts_quantile(samples: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """GluonTS' sample quantile: the sorted sample at index ``round((N − 1) τ)`` (half to even, as
    ``np.round``), for ``samples`` ``(N, *shape)`` and levels ``q`` ``(Q,)``; returns ``(Q, *shape)``."""
    n = samples.shape[0]
    idx = torch.round((n - 1) * q).long()
    return torch.sort(samples, dim=0).values[idx]


def weighted_quantile_loss(
    samples: torch.Tensor | np.ndarray,
    y: torch.Tensor | np.ndarray,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
) -> float:
    """The ProbTS / GluonTS "CRPS": mean over ``quantiles`` of ``2 Σ |(y − q̂)(1{y ≤ q̂} − τ)| / Σ |y|``.

    ``q̂`` is GluonTS' ``τ``-quantile of ``samples`` ``(N, *shape)`` (:func:`gluonts_quantile`, the sorted
    sample at ``round((N − 1) τ)``, as ``SampleForecast.quantile``); the sums run over every element of ``y``. Equals GluonTS ``Evaluator(quantiles)``'s ``mean_wQuantileLoss`` on the same samples.
    """
    s, t = _samples_target(samples, y)
    q = _check_levels(quantiles)
    denom = float(t.abs().sum())
    if denom == 0.0:
        raise ValueError("y must not be all zeros: the weighted quantile loss divides by sum |y| = 0")
    qhat = gluonts_quantile(s, q)  # (Q, *shape)
    tq = t.unsqueeze(0)
    ind = (tq <= qhat).to(torch.float64)
    losses = 2 * ((tq - qhat) * (ind - q.reshape(-1, *([1] * t.dim())))).abs().flatten(1).sum(1)
    return float((losses / denom).mean())


def nmae(samples: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> float:
    """Normalised deviation (GluonTS ``ND``; the paper's NMAE): ``Σ |y − median| / Σ |y|``.

    ``samples`` ``(N, *shape)``; the median is GluonTS' 0.5-quantile (:func:`gluonts_quantile`).
    """
    s, t = _samples_target(samples, y)
    denom = float(t.abs().sum())
    if denom == 0.0:
        raise ValueError("y must not be all zeros: NMAE divides by sum |y| = 0")
    med = gluonts_quantile(s, torch.tensor([0.5], dtype=torch.float64))[0]
    return float((t - med).abs().sum() / denom)


def interval_coverage(
    samples: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, level: float = 0.8
) -> float:
    """Fraction of ``y`` inside the central ``level`` interval of ``samples`` ``(N, *shape)``
    (empirical ``(1−level)/2`` and ``(1+level)/2`` quantiles, bounds included)."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < float(level) < 1:
        raise ValueError(f"level must be a float in (0, 1), got {level!r}")
    s, t = _samples_target(samples, y)
    lo_hi = torch.quantile(s, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64), dim=0)
    return float(((t >= lo_hi[0]) & (t <= lo_hi[1])).to(torch.float64).mean())
