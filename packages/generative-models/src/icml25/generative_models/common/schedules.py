"""Diffusion noise schedules shared by the generative-model papers: the VP and EDM SDEs and their time grids.

``x_t = α_t x_0 + σ_t ε`` with drift ``f(t) x`` and squared diffusion ``g(t)²``. :class:`VPSchedule` is the
variance-preserving SDE with a linear β (Song et al., ICLR 2021), :class:`EDMSchedule` the variance-exploding
one in the EDM parameterisation (Karras et al., NeurIPS 2022); :func:`time_grid` spaces sampler steps uniformly
in log-SNR, ``log t`` or ``t``. Used by density guidance (P49, :mod:`icml25.generative_models.density_guidance`)
and by the guided reverse SDE of bilevel diffusion (P30, :mod:`icml25.generative_models.bilevel`); the time
convention is theirs: ``t`` increases from data (``t_min`` ≈ 0) to noise (``t_max``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from icml25.kernels.checks import check_choice, check_float, check_int

__all__ = ["EDMSchedule", "Schedule", "VPSchedule", "time_grid"]


@dataclass(frozen=True)
class VPSchedule:
    """Variance-preserving SDE with a linear β: ``β(t) = β_min + t (β_max - β_min)`` on ``[t_min, t_max]``.

    ``x_t = α_t x_0 + σ_t ε`` with ``α_t = exp(-½ ∫β)``, ``σ_t² = 1 - α_t²``; ``f = -β/2``, ``g² = β``
    (Song et al.'s VP-SDE; the density-guidance paper's CIFAR-10 model).
    """

    beta_min: float = 0.1
    beta_max: float = 20.0
    t_min: float = 1e-3
    t_max: float = 1.0

    def __post_init__(self) -> None:
        for name in ("beta_min", "beta_max", "t_min", "t_max"):
            check_float(getattr(self, name), name, low=0.0, low_open=True)
        if self.beta_max < self.beta_min:
            raise ValueError(f"beta_max must be >= beta_min, got {self.beta_max:g} < {self.beta_min:g}")
        if not self.t_min < self.t_max:
            raise ValueError(f"t_min must be < t_max, got t_min={self.t_min:g}, t_max={self.t_max:g}")

    def _B(self, t: float) -> float:
        return self.beta_min * t + 0.5 * (self.beta_max - self.beta_min) * t * t

    def beta(self, t: float) -> float:
        """``β(t)``."""
        return self.beta_min + t * (self.beta_max - self.beta_min)

    def alpha(self, t: float) -> float:
        """Signal scale ``α_t``."""
        return math.exp(-0.5 * self._B(t))

    def sigma(self, t: float) -> float:
        """Noise scale ``σ_t``."""
        return math.sqrt(-math.expm1(-self._B(t)))

    def f(self, t: float) -> float:
        """Drift coefficient ``f(t) = -β(t)/2``."""
        return -0.5 * self.beta(t)

    def g2(self, t: float) -> float:
        """Squared diffusion ``g(t)² = β(t)``."""
        return self.beta(t)

    def log_snr(self, t: float) -> float:
        """``λ_t = log(α_t² / σ_t²)``."""
        b = self._B(t)
        return -b - math.log(-math.expm1(-b))

    def t_of_log_snr(self, lam: float) -> float:
        """The time whose log-SNR is ``lam`` (the inverse of :meth:`log_snr`)."""
        b = math.log1p(math.exp(-lam)) if lam > -30 else -lam  # softplus(-λ) = -log α²
        db = self.beta_max - self.beta_min
        if db == 0:
            return b / self.beta_min
        return (-self.beta_min + math.sqrt(self.beta_min**2 + 2.0 * db * b)) / db


@dataclass(frozen=True)
class EDMSchedule:
    """Variance-exploding SDE in the EDM parameterisation: ``σ_t = t`` on ``[sigma_min, sigma_max]``.

    ``x_t = x_0 + t ε``: ``α = 1``, ``f = 0``, ``g² = dσ²/dt = 2t`` (Karras et al.; the density-guidance
    paper's EDM2 model).
    """

    sigma_min: float = 0.002
    sigma_max: float = 80.0

    def __post_init__(self) -> None:
        for name in ("sigma_min", "sigma_max"):
            check_float(getattr(self, name), name, low=0.0, low_open=True)
        if not self.sigma_min < self.sigma_max:
            raise ValueError(f"sigma_min must be < sigma_max, got {self.sigma_min:g}, {self.sigma_max:g}")

    @property
    def t_min(self) -> float:
        return self.sigma_min

    @property
    def t_max(self) -> float:
        return self.sigma_max

    def alpha(self, t: float) -> float:
        return 1.0

    def sigma(self, t: float) -> float:
        return float(t)

    def f(self, t: float) -> float:
        return 0.0

    def g2(self, t: float) -> float:
        return 2.0 * t

    def log_snr(self, t: float) -> float:
        return -2.0 * math.log(t)

    def t_of_log_snr(self, lam: float) -> float:
        return math.exp(-0.5 * lam)


Schedule = VPSchedule | EDMSchedule


def time_grid(schedule: Schedule, n_steps: int, spacing: str = "log_snr") -> list[float]:
    """``n_steps + 1`` decreasing times from ``t_max`` to ``t_min``, uniform in log-SNR (``"log_snr"``, the
    density-guidance reference's grid), in ``log t`` (``"log_t"``) or in ``t`` (``"uniform"``)."""
    if not isinstance(schedule, (VPSchedule, EDMSchedule)):
        raise TypeError(f"schedule must be a VPSchedule or EDMSchedule, got {type(schedule).__name__}")
    n = check_int(n_steps, "n_steps", low=2)
    check_choice(spacing, "spacing", ("log_snr", "log_t", "uniform"))
    lo, hi = schedule.t_min, schedule.t_max
    if spacing == "log_snr":
        lam = np.linspace(schedule.log_snr(hi), schedule.log_snr(lo), n + 1)
        ts = [schedule.t_of_log_snr(float(v)) for v in lam]
    elif spacing == "log_t":
        ts = np.exp(np.linspace(math.log(hi), math.log(lo), n + 1)).tolist()
    else:
        ts = np.linspace(hi, lo, n + 1).tolist()
    ts[0], ts[-1] = hi, lo  # exact end points
    return [float(t) for t in ts]
