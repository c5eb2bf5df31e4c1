"""Diffused Gaussian mixtures: an exact score, log-density and Laplacian oracle for diffusion papers.

A mixture with diagonal covariances stays a mixture under the forward SDE ``x_t = α_t x_0 + σ_t ε`` of a
:mod:`~icml25.generative_models.common.schedules` schedule, so every marginal's score, log-density and
Laplacian are closed form. Density guidance (P49, :mod:`icml25.generative_models.density_guidance`) checks its
samplers against it; bilevel diffusion (P30, :mod:`icml25.generative_models.bilevel`) tilts it by quadratic
rewards (the tilt is a mixture again) for an exact lower level and an exact Doob guidance.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from icml25.generative_models.common.schedules import EDMSchedule, Schedule, VPSchedule
from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import make_generator

__all__ = ["GaussianMixture"]


class GaussianMixture:
    """A Gaussian mixture with diagonal covariances, diffused by ``schedule``: every marginal
    ``p_t = Σ_k π_k N(α_t μ_k, diag(α_t² v_k + σ_t²))`` is a mixture too, so the score, log-density and
    Laplacian are closed form (the exact oracle of the tests and the reproductions).

    ``means`` ``(K, D)``, ``variances`` ``(K, D)`` (> 0), ``weights`` ``(K,)`` (>= 0, normalised here).
    ``score``, ``log_prob``, ``laplacian`` take ``x`` ``(N, D)`` and a float ``t`` (``t_min`` ≈ data).
    """

    def __init__(self, means: Tensor, variances: Tensor, weights: Tensor, schedule: Schedule) -> None:
        if not isinstance(schedule, (VPSchedule, EDMSchedule)):
            raise TypeError(f"schedule must be a VPSchedule or EDMSchedule, got {type(schedule).__name__}")
        self.schedule = schedule
        means = check_tensor(means, "means", ndim=2, non_empty=True, max_abs=1e8)
        variances = check_tensor(variances, "variances", shape=tuple(means.shape), max_abs=1e8)
        if bool((variances <= 0).any()):
            raise ValueError(f"variances must be > 0, got min {float(variances.min()):g}")
        weights = check_tensor(weights, "weights", shape=(len(means),))
        if bool((weights < 0).any()) or float(weights.sum()) <= 0:
            raise ValueError("weights must be >= 0 with a positive sum")
        self.means = means
        self.variances = variances.to(means.dtype)
        self.weights = (weights / weights.sum()).to(means.dtype)

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    @classmethod
    def power_law(
        cls,
        dim: int,
        n_components: int,
        schedule: Schedule,
        mean_norm: float = 3.0,
        var_range: tuple[float, float] = (1.0, 1e-3),
        jitter: float = 0.2,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> GaussianMixture:
        """Image-like mixture: equal weights, random means of norm ``mean_norm``, diagonal variances on a
        power law from ``var_range[0]`` down to ``var_range[1]`` (log-jittered by ``jitter`` per entry)."""
        dim = check_int(dim, "dim", low=1)
        n_components = check_int(n_components, "n_components", low=1)
        if not isinstance(var_range, (tuple, list)) or len(var_range) != 2:
            raise TypeError(f"var_range must be a pair of positive floats, got {var_range!r}")
        hi = check_float(var_range[0], "var_range[0]", low=0.0, low_open=True)
        lo = check_float(var_range[1], "var_range[1]", low=0.0, low_open=True)
        g = make_generator(seed)
        mu = torch.randn(n_components, dim, generator=g, dtype=torch.float64)
        mu = mu / mu.norm(dim=1, keepdim=True) * float(mean_norm)
        base = torch.logspace(math.log10(hi), math.log10(lo), dim, dtype=torch.float64)
        var = base * torch.exp(
            float(jitter) * torch.randn(n_components, dim, generator=g, dtype=torch.float64)
        )
        return cls(mu.to(dtype), var.to(dtype), torch.ones(n_components, dtype=dtype), schedule)

    def _marginal(self, t: float) -> tuple[Tensor, Tensor]:
        a, s = self.schedule.alpha(t), self.schedule.sigma(t)
        return a * self.means, a * a * self.variances + s * s

    def _parts(self, x: Tensor, t: float) -> tuple[Tensor, Tensor, Tensor]:
        """Per-component log-terms ``(N, K)`` (with the log-weights), the marginal means ``(K, D)`` and
        variances ``(K, D)``; quadratic forms by matrix products (no ``(N, K, D)`` tensor). ``|x|`` is
        bounded by 1e8 because the quadratic forms overflow beyond."""
        x = check_tensor(x, "x", shape=(None, self.dim), non_empty=True, max_abs=1e8)
        t = check_float(t, "t", low=0.0, high=self.schedule.t_max, low_open=True)
        m, v = self._marginal(t)
        m, v = m.to(x.dtype), v.to(x.dtype)
        iv = 1.0 / v
        quad = (x * x) @ iv.T - 2.0 * x @ (m * iv).T + (m * m * iv).sum(1)[None]
        logn = -0.5 * quad - 0.5 * torch.log(2 * math.pi * v).sum(-1)[None]
        return logn + torch.log(self.weights.to(x.dtype))[None], m, v

    def log_prob(self, x: Tensor, t: float) -> Tensor:
        """``log p_t(x)`` ``(N,)``."""
        logc, _, _ = self._parts(x, t)
        return torch.logsumexp(logc, dim=1)

    def responsibilities(self, x: Tensor, t: float) -> Tensor:
        """Posterior component probabilities ``(N, K)`` under ``p_t``."""
        logc, _, _ = self._parts(x, t)
        return torch.softmax(logc, dim=1)

    def score(self, x: Tensor, t: float) -> Tensor:
        """``∇ log p_t(x) = Σ_k w_k(x) (α μ_k - x) / v_k`` ``(N, D)``."""
        logc, m, v = self._parts(x, t)
        w = torch.softmax(logc, dim=1)
        return w @ (m / v) - x * (w @ (1.0 / v))

    def laplacian(self, x: Tensor, t: float) -> Tensor:
        """``Δ log p_t(x) = Σ_k w_k (‖(x - α μ_k)/v_k‖² - Σ 1/v_k) - ‖s‖²`` ``(N,)``."""
        logc, m, v = self._parts(x, t)
        w = torch.softmax(logc, dim=1)
        iv, iv2 = 1.0 / v, 1.0 / (v * v)
        s = w @ (m * iv) - x * (w @ iv)
        g2 = (x * x) @ iv2.T - 2.0 * x @ (m * iv2).T + (m * m * iv2).sum(1)[None]  # (N, K)
        per = g2 - iv.sum(1)[None]
        return (w * per).sum(1) - (s * s).sum(1)

    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> Tensor:
        """``n`` draws from the data distribution ``p_0`` (the mixture itself) ``(n, D)``."""
        n = check_int(n, "n", low=1)
        g = make_generator(seed, generator)
        k = torch.multinomial(self.weights, n, replacement=True, generator=g)
        eps = torch.randn(n, self.dim, generator=g, dtype=self.means.dtype)
        return self.means[k] + eps * self.variances[k].sqrt()
