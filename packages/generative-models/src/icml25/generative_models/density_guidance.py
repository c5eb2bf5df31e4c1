"""Devil is in the Details: Density Guidance for Detail-Aware Generation with Flow Models — ICML 2025, P49: DG.

Density guidance, its stochastic variant, prior guidance and the score-alignment check.

Karczewski, Heinonen & Garg, ICML 2025 (arXiv 2502.05807; official code ``Aalto-QuML/density-guidance``,
JAX). For a diffusion model with forward SDE ``dx = f(t) x dt + g(t) dW`` and score ``s_t = ∇ log p_t``, the
probability-flow ODE (PF-ODE) drift is ``u_t(x) = f(t) x - ½ g(t)² s_t(x)``, integrated from ``t_max`` down
to ``t_min``. Along any flow ``dx/dt = ũ_t(x)`` the log-density of the marginal changes at the rate

    d/dt log p_t(x_t) = -div u_t(x_t) + <s_t(x_t), ũ_t(x_t) - u_t(x_t)>          (:func:`log_density_rate`)

Density Guidance (DG) is the smallest change of the drift that makes this rate equal to a prescribed
``b_t(x)``: ``ũ = u + (div u + b) / ‖s‖² · s``. The paper's quantile schedule
``b^q_t = -div u - ½ g² √(2D) Φ⁻¹(q) / σ_t²`` cancels the divergence, so DG is the PF-ODE with a rescaled
score, ``ũ = f x - ½ g² η s`` with ``η = 1 + √(2D) Φ⁻¹(q) / ‖σ_t s‖²`` (:func:`density_guided_drift`):
``q = 0.5`` is the PF-ODE, ``q > 0.5`` raises the samples' log-density (smoother), ``q < 0.5`` lowers it
(more detail). Stochastic DG adds noise ``φ(t) P dW`` projected orthogonally to the score and compensates
its Itô term, ``η = 1 + (√(2D) Φ⁻¹(q) - σ² φ̃² Δ log p) / ‖σ s‖²`` with ``φ = φ̃ g``. Prior Guidance (the
baseline) rescales the latent to the norm ``χ_D⁻¹(1 - q) σ_T`` and runs the PF-ODE. Score alignment:
``a_t = <s_t(x_t), v_t>`` with ``v = ∂x_t/∂x_T · x_T`` obeys ``da/dt = -<∇ div u, v>``; integrated from
``a_T = -‖x_T‖²/σ_T²`` it gives the sign of ``d log p_0(x_0) / d(latent scale)`` without the data score.

Time convention: ``t`` increases from data to noise (``t_min`` ≈ 0 to ``t_max``); samplers step from
``t_max`` down to ``t_min`` on a grid uniform in log-SNR (as the reference) or in ``log t``. The reference
runs log-SNR ``λ`` upwards, where the drift reads ``f x + ½ g² η s``: the same ODE. Every function takes
``score_fn(x, t) -> ∇ log p_t(x)`` with ``x`` of shape ``(N, *event)`` and a float ``t``; adapters turn an
ε-prediction (:func:`eps_to_score`) or a denoiser (:func:`denoiser_to_score`) into one. An exact oracle,
:class:`GaussianMixture` (closed-form score, log-density and Laplacian of every marginal), and a small
trainable ε-network (:class:`ScoreMLP`, :func:`train_score_model`) come with the module.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from scipy import stats
from torch import Tensor, nn

from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "DriftTerms",
    "EDMSchedule",
    "GaussianMixture",
    "SampleResult",
    "ScoreMLP",
    "VPSchedule",
    "denoiser_to_score",
    "density_guidance_sample",
    "density_guided_drift",
    "eps_to_score",
    "exact_laplacian",
    "guidance_offset",
    "hutchinson_laplacian",
    "log_density_rate",
    "pf_ode_drift",
    "pf_ode_log_density",
    "pf_ode_sample",
    "prior_guidance_sample",
    "rescale_latents",
    "score_alignment",
    "stochastic_density_guidance_sample",
    "time_grid",
    "train_score_model",
]

ScoreFn = Callable[[Tensor, float], Tensor]
LaplacianArg = Callable[[Tensor, float], Tensor] | str | None

# ---------------------------------------------------------------------------------------------- validation


def _check_float(name: str, value: object, low: float | None = None, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if low is not None and (v < low or (low_open and v == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {v:g}")
    return v


def _check_q(q: object, name: str = "q") -> float:
    v = _check_float(name, q)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name} must be a quantile in the open interval (0, 1), got {v:g}")
    return v


def _check_steps(n_steps: object, name: str = "n_steps") -> int:
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(n_steps).__name__}")
    if n_steps < 2:
        raise ValueError(f"{name} must be >= 2, got {int(n_steps)}")
    return int(n_steps)


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {int(value)}")
    return int(value)


def _check_x(x: object, name: str) -> Tensor:
    """A finite, non-empty floating-point tensor of shape ``(N, *event)``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (N, *event), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (N, *event) with at least 2 dims, got {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        n_nan, n_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        raise ValueError(
            f"{name} must be finite; got {n_nan} NaN and {n_inf} Inf values in a tensor of shape "
            f"{tuple(x.shape)}"
        )
    return x


def _check_huge(x: Tensor, name: str, sched: VPSchedule | EDMSchedule) -> None:
    """Reject states whose squared norm overflows (a latent or sample cannot be 1e30 σ_max away)."""
    peak = float(x.detach().abs().amax())
    limit = 1e6 * max(1.0, sched.sigma(sched.t_max))
    if peak > limit:
        raise ValueError(f"{name} must have max |x| <= {limit:.3g} (1e6 x the prior scale), got {peak:.3g}")


def _check_time(t: object, sched: VPSchedule | EDMSchedule) -> float:
    v = _check_float("t", t)
    if not 0.0 < v <= sched.t_max:
        raise ValueError(f"t must be in (0, t_max={sched.t_max:g}], got {v:g}")
    return v


def _check_score_out(s: object, x: Tensor, what: str = "score_fn") -> Tensor:
    if not isinstance(s, Tensor):
        raise TypeError(f"{what} must return a torch.Tensor, got {type(s).__name__}")
    if s.shape != x.shape:
        raise ValueError(
            f"{what} must return a tensor of the input's shape {tuple(x.shape)}, got {tuple(s.shape)}"
        )
    if s.dtype != x.dtype:
        raise ValueError(f"{what} must return the input's dtype {x.dtype}, got {s.dtype}")
    return s


def _check_schedule(sched: object) -> VPSchedule | EDMSchedule:
    if not isinstance(sched, (VPSchedule, EDMSchedule)):
        raise TypeError(f"schedule must be a VPSchedule or EDMSchedule, got {type(sched).__name__}")
    return sched


def _check_callable(name: str, fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be callable (x, t) -> tensor, got {type(fn).__name__}")


def _check_laplacian_arg(laplacian: object, allow_none: bool = True) -> None:
    if laplacian is None and allow_none:
        return
    if isinstance(laplacian, str):
        if laplacian not in ("exact", "hutchinson"):
            raise ValueError(f"laplacian must be 'exact', 'hutchinson' or a callable, got {laplacian!r}")
        return
    if not callable(laplacian):
        raise TypeError(
            f"laplacian must be 'exact', 'hutchinson' or a callable, got {type(laplacian).__name__}"
        )


def _bsum(a: Tensor) -> Tensor:
    """Sum over every non-batch axis: ``(N, *event) -> (N,)``."""
    return a.reshape(a.shape[0], -1).sum(1)


def _bview(c: Tensor, like: Tensor) -> Tensor:
    """A per-sample ``(N,)`` tensor shaped to broadcast against ``(N, *event)``."""
    return c.reshape(-1, *([1] * (like.dim() - 1)))


# ----------------------------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class VPSchedule:
    """Variance-preserving SDE with a linear β: ``β(t) = β_min + t (β_max - β_min)`` on ``[t_min, t_max]``.

    ``x_t = α_t x_0 + σ_t ε`` with ``α_t = exp(-½ ∫β)``, ``σ_t² = 1 - α_t²``; ``f = -β/2``, ``g² = β``
    (Song et al.'s VP-SDE; the paper's CIFAR-10 model).
    """

    beta_min: float = 0.1
    beta_max: float = 20.0
    t_min: float = 1e-3
    t_max: float = 1.0

    def __post_init__(self) -> None:
        _check_float("beta_min", self.beta_min, 0.0, low_open=True)
        _check_float("beta_max", self.beta_max, 0.0, low_open=True)
        _check_float("t_min", self.t_min, 0.0, low_open=True)
        _check_float("t_max", self.t_max, 0.0, low_open=True)
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

    ``x_t = x_0 + t ε``: ``α = 1``, ``f = 0``, ``g² = dσ²/dt = 2t`` (Karras et al.; the paper's EDM2 model).
    """

    sigma_min: float = 0.002
    sigma_max: float = 80.0

    def __post_init__(self) -> None:
        _check_float("sigma_min", self.sigma_min, 0.0, low_open=True)
        _check_float("sigma_max", self.sigma_max, 0.0, low_open=True)
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
    reference's grid), in ``log t`` (``"log_t"``) or in ``t`` (``"uniform"``)."""
    sched = _check_schedule(schedule)
    n = _check_steps(n_steps)
    lo, hi = sched.t_min, sched.t_max
    if spacing == "log_snr":
        lam = np.linspace(sched.log_snr(hi), sched.log_snr(lo), n + 1)
        ts = [sched.t_of_log_snr(float(v)) for v in lam]
    elif spacing == "log_t":
        ts = np.exp(np.linspace(math.log(hi), math.log(lo), n + 1)).tolist()
    elif spacing == "uniform":
        ts = np.linspace(hi, lo, n + 1).tolist()
    else:
        raise ValueError(f"spacing must be 'log_snr', 'log_t' or 'uniform', got {spacing!r}")
    ts[0], ts[-1] = hi, lo  # exact end points
    return [float(t) for t in ts]


def _prior_warning(sched: Schedule) -> None:
    snr = math.exp(sched.log_snr(sched.t_max))
    if snr > 1e-3:
        warnings.warn(
            f"the schedule's SNR at t_max is {snr:.3g} > 1e-3: sigma_T is not >> the data scale, so the "
            "prior is not N(0, sigma_T^2 I) and latent norms / log p_T are off",
            RuntimeWarning,
            stacklevel=3,
        )


# ------------------------------------------------------------------------------------------ score adapters


def eps_to_score(eps_fn: Callable[[Tensor, float], Tensor], schedule: Schedule) -> ScoreFn:
    """The score ``s_t(x) = -ε̂(x, t) / σ_t`` of an ε-prediction model ``eps_fn(x, t)``."""
    _check_callable("eps_fn", eps_fn)
    sched = _check_schedule(schedule)

    def score(x: Tensor, t: float) -> Tensor:
        x = _check_x(x, "x")
        _check_huge(x, "x", sched)
        t = _check_time(t, sched)
        return _check_score_out(eps_fn(x, t), x, "eps_fn") / -sched.sigma(t)

    return score


def denoiser_to_score(denoiser: Callable[[Tensor, float], Tensor], schedule: Schedule) -> ScoreFn:
    """The score ``s_t(x) = (α_t D(x, t) - x) / σ_t²`` of a denoiser ``D(x, t) ≈ E[x_0 | x_t = x]`` (EDM:
    ``(D - x) / σ²``)."""
    _check_callable("denoiser", denoiser)
    sched = _check_schedule(schedule)

    def score(x: Tensor, t: float) -> Tensor:
        x = _check_x(x, "x")
        _check_huge(x, "x", sched)
        t = _check_time(t, sched)
        return (sched.alpha(t) * _check_score_out(denoiser(x, t), x, "denoiser") - x) / sched.sigma(t) ** 2

    return score


# ------------------------------------------------------------------------------------------- Laplacians


def exact_laplacian(score_fn: ScoreFn, x: Tensor, t: float, create_graph: bool = False) -> Tensor:
    """``Δ log p_t(x) = tr ∇s_t(x)`` per sample ``(N,)`` by autograd (one vectorised backward per event
    dimension: for small ``D``). ``create_graph=True`` keeps it differentiable in ``x``."""
    _check_callable("score_fn", score_fn)
    x = _check_x(x, "x")
    t = _check_float("t", t)
    d = x[0].numel()
    with torch.enable_grad():
        xi = x if (create_graph and x.requires_grad) else x.detach().requires_grad_(True)
        s = _check_score_out(score_fn(xi, t), x).reshape(len(x), d)
        eye = torch.eye(d, dtype=x.dtype, device=x.device).unsqueeze(1).expand(d, len(x), d)
        (rows,) = torch.autograd.grad(s, xi, eye, is_grads_batched=True, create_graph=create_graph)
        # rows[j] = ∂s_j/∂x (N, *event); take the diagonal ∂s_j/∂x_j.
        diag = rows.reshape(d, len(x), d).diagonal(dim1=0, dim2=2)  # (N, d)
    return diag.sum(1)


def hutchinson_laplacian(
    score_fn: ScoreFn,
    x: Tensor,
    t: float,
    n_probes: int = 1,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    create_graph: bool = False,
) -> Tensor:
    """Unbiased Hutchinson estimate ``mean_k ε_kᵀ ∇s_t(x) ε_k`` of ``Δ log p_t(x)`` per sample ``(N,)``, with
    Rademacher probes from ``generator`` (or ``seed``; one vector-Jacobian product per probe)."""
    _check_callable("score_fn", score_fn)
    x = _check_x(x, "x")
    t = _check_float("t", t)
    k = _check_int("n_probes", n_probes, 1)
    gen = make_generator(seed, generator, device=x.device)
    total = torch.zeros(len(x), dtype=x.dtype, device=x.device)
    with torch.enable_grad():
        xi = x if (create_graph and x.requires_grad) else x.detach().requires_grad_(True)
        s = _check_score_out(score_fn(xi, t), x)
        for _ in range(k):
            eps = torch.randint(0, 2, x.shape, generator=gen, device=x.device).to(x.dtype) * 2 - 1
            (jt_eps,) = torch.autograd.grad(s, xi, eps, retain_graph=True, create_graph=create_graph)
            total = total + _bsum(jt_eps * eps)
    return total / k


def _laplacian(
    laplacian: LaplacianArg, score_fn: ScoreFn, x: Tensor, t: float, gen: torch.Generator | None
) -> Tensor:
    if laplacian == "exact":
        return exact_laplacian(score_fn, x, t)
    if laplacian == "hutchinson":
        return hutchinson_laplacian(score_fn, x, t, generator=gen)
    out = laplacian(x, t)
    if not isinstance(out, Tensor) or out.shape != (len(x),):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"laplacian must return a per-sample tensor of shape ({len(x)},), got {got}")
    return out.to(x.dtype)


# ---------------------------------------------------------------------------------------------- drifts


def pf_ode_drift(score_fn: ScoreFn, x: Tensor, t: float, schedule: Schedule) -> Tensor:
    """The PF-ODE drift ``u_t(x) = f(t) x - ½ g(t)² s_t(x)``, shape of ``x`` ``(N, *event)``."""
    _check_callable("score_fn", score_fn)
    sched = _check_schedule(schedule)
    x = _check_x(x, "x")
    _check_huge(x, "x", sched)
    t = _check_time(t, sched)
    s = _check_score_out(score_fn(x, t), x)
    return sched.f(t) * x - 0.5 * sched.g2(t) * s


class DriftTerms(NamedTuple):
    """What :func:`density_guided_drift` returns: the guided ``drift`` and the ``score`` ``(N, *event)``,
    the score scale ``eta`` ``(N,)`` of the ODE part (without the noise compensation) and the Laplacian
    ``(N,)`` when it was computed (else None)."""

    drift: Tensor
    score: Tensor
    eta: Tensor
    laplacian: Tensor | None


_EPS_NORM = 1e-12


def density_guided_drift(
    score_fn: ScoreFn,
    x: Tensor,
    t: float,
    schedule: Schedule,
    q: float,
    noise_scale: float = 0.0,
    laplacian: LaplacianArg = "hutchinson",
    eta_range: tuple[float, float] | None = None,
    generator: torch.Generator | None = None,
) -> DriftTerms:
    """Density-guided drift ``f x - ½ g² η s`` at time ``t`` for quantile ``q`` (paper eq. for ``b^q``).

    ``η = 1 + √(2D) Φ⁻¹(q) / ‖σ_t s‖²`` (ODE), minus ``σ_t² φ̃² Δ log p / ‖σ_t s‖²`` when ``noise_scale``
    ``φ̃ > 0`` (stochastic DG with diffusion ``φ̃ g``; ``Δ log p`` from ``laplacian``: ``"hutchinson"`` (one
    Rademacher probe from ``generator``, the reference), ``"exact"`` or a callable ``(x, t) -> (N,)``).
    ``‖σ s‖²`` is clamped below at 1e-12 with a warning (near a mode the score vanishes); ``eta_range``
    optionally clips ``η`` (default None: no clipping, as the reference). ``q = 0.5`` and ``φ̃ = 0`` give
    exactly :func:`pf_ode_drift`.
    """
    _check_callable("score_fn", score_fn)
    sched = _check_schedule(schedule)
    x = _check_x(x, "x")
    _check_huge(x, "x", sched)
    t = _check_time(t, sched)
    q = _check_q(q)
    phi = _check_float("noise_scale", noise_scale, 0.0)
    if phi > 0:
        _check_laplacian_arg(laplacian, allow_none=False)
    if eta_range is not None:
        lo, hi = (_check_float("eta_range", v) for v in eta_range)
        if not lo < hi:
            raise ValueError(f"eta_range must be (low, high) with low < high, got {eta_range!r}")
    return _dg_terms(score_fn, x, t, sched, q, phi, laplacian, eta_range, generator)


def _dg_terms(
    score_fn: ScoreFn,
    x: Tensor,
    t: float,
    sched: Schedule,
    q: float,
    phi: float,
    laplacian: LaplacianArg,
    eta_range: tuple[float, float] | None,
    generator: torch.Generator | None,
) -> DriftTerms:
    s = _check_score_out(score_fn(x, t), x)
    d = x[0].numel()
    sig2 = sched.sigma(t) ** 2
    quant = math.sqrt(2.0 * d) * float(stats.norm.ppf(q))
    norm2 = sig2 * _bsum(s * s)
    if bool((norm2 < _EPS_NORM).any()):
        warnings.warn(
            f"|sigma_t s_t(x)|^2 < {_EPS_NORM:g} for {int((norm2 < _EPS_NORM).sum())} samples at t={t:g}: the "
            "score vanishes (a mode); the denominator of eta is clamped",
            RuntimeWarning,
            stacklevel=3,
        )
        norm2 = norm2.clamp_min(_EPS_NORM)
    eta = 1.0 + quant / norm2
    if eta_range is not None:
        eta = eta.clamp(float(eta_range[0]), float(eta_range[1]))
    lap = None
    eta_total = eta
    if phi > 0:
        lap = _laplacian(laplacian, score_fn, x, t, generator)
        eta_total = eta - sig2 * phi**2 * lap / norm2
    drift = sched.f(t) * x - 0.5 * sched.g2(t) * (_bview(eta_total, x) * s)
    return DriftTerms(drift, s, eta, lap)


def log_density_rate(
    score: Tensor, laplacian: Tensor, x: Tensor, t: float, schedule: Schedule, drift: Tensor
) -> Tensor:
    """``d/dt log p_t(x_t)`` along ``dx/dt = drift``: ``-div u + <s, drift - u>`` with ``div u = D f -
    ½ g² Δ log p`` and ``u`` the PF-ODE drift; ``score``, ``x``, ``drift`` ``(N, *event)``, ``laplacian``
    ``(N,)``; returns ``(N,)``."""
    sched = _check_schedule(schedule)
    x = _check_x(x, "x")
    t = _check_time(t, sched)
    for name, a in (("score", score), ("drift", drift), ("x", x)):
        _check_x(a, name)
        if float(a.detach().abs().amax()) > 1e150:
            raise ValueError(
                f"{name} must have max |value| <= 1e150 (its square overflows), got {float(a.abs().amax()):.3g}"
            )
        if a.shape != x.shape:
            raise ValueError(f"{name} must have the shape of x {tuple(x.shape)}, got {tuple(a.shape)}")
    _check_x(laplacian.reshape(-1, 1) if isinstance(laplacian, Tensor) else laplacian, "laplacian")
    if laplacian.shape != (len(x),):
        raise ValueError(f"laplacian must have shape ({len(x)},), got {tuple(laplacian.shape)}")
    if float(laplacian.detach().abs().amax()) > 1e150:
        raise ValueError(
            f"laplacian must have max |value| <= 1e150, got {float(laplacian.detach().abs().amax()):.3g}"
        )
    d = x[0].numel()
    u = sched.f(t) * x - 0.5 * sched.g2(t) * score
    div_u = d * sched.f(t) - 0.5 * sched.g2(t) * laplacian
    return -div_u + _bsum(score * (drift - u))


def guidance_offset(schedule: Schedule, q: float, dim: int, times: Sequence[float]) -> float:
    """``Σ_k c_q(t_k) (t_{k+1} - t_k)`` with ``c_q = -½ g² √(2D) Φ⁻¹(q) / σ²``: the part of the prescribed
    log-density change ``∫ b^q dt`` (Euler on ``times``) that does not depend on the sample."""
    sched = _check_schedule(schedule)
    q = _check_q(q)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be a positive int, got {dim!r}")
    raw = np.asarray(times.detach().cpu() if isinstance(times, Tensor) else times)
    if raw.dtype.kind not in "fiu":
        raise TypeError(f"times must be a sequence of floats, got dtype {raw.dtype}")
    arr = raw.astype(np.float64)
    if arr.ndim != 1 or len(arr) < 2:
        raise ValueError(f"times must be a 1-D grid of at least 2 points, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("times must be finite")
    if not (np.diff(arr) < 0).all() or arr[-1] <= 0 or arr[0] > sched.t_max:
        raise ValueError(
            f"times must decrease strictly within (0, t_max={sched.t_max:g}], got {arr.tolist()[:4]}..."
        )
    ts = arr.tolist()
    quant = math.sqrt(2.0 * dim) * float(stats.norm.ppf(q))
    return float(
        sum(-0.5 * sched.g2(a) * quant / sched.sigma(a) ** 2 * (b - a) for a, b in itertools.pairwise(ts))
    )


# --------------------------------------------------------------------------------------------- samplers


@dataclass
class SampleResult:
    """A sampler's output: samples ``x`` ``(N, *event)`` at ``t_min``, the start ``x_T`` after any rescaling,
    the grid ``times`` (decreasing, ``n_steps + 1``), ``logp_change`` ``(N,)``: the solver-accumulated
    prescribed change ``∫ b dt`` of ``log p_t(x_t)`` from ``t_max`` to ``t_min`` (``b = b^q`` of density
    guidance; ``-div u`` for the PF-ODE and prior guidance; None when no ``laplacian`` was given),
    ``logp_path`` ``(n_steps + 1, N)`` its running value, and ``tracked`` ``(n_steps + 1, N)``: ``track(x_t, t)``
    at every grid time (None without ``track``)."""

    x: Tensor
    x_T: Tensor
    times: list[float]
    logp_change: Tensor | None
    logp_path: Tensor | None
    tracked: Tensor | None


def rescale_latents(x_T: Tensor, schedule: Schedule, quantile: float = 0.5) -> Tensor:
    """Latents rescaled to the norm ``χ_D⁻¹(quantile) σ_T`` (0.5: the median norm of ``N(0, σ_T² I)``)."""
    sched = _check_schedule(schedule)
    x_T = _check_x(x_T, "x_T")
    _check_huge(x_T, "x_T", sched)
    quantile = _check_q(quantile, "quantile")
    d = x_T[0].numel()
    norms = _bsum(x_T * x_T).sqrt()
    if bool((norms == 0).any()):
        raise ValueError("x_T must have non-zero rows: a zero latent has no direction to rescale")
    target = float(stats.chi.ppf(quantile, df=d)) * sched.sigma(sched.t_max)
    return x_T * _bview(target / norms, x_T)


def _project_orthogonal(noise: Tensor, s: Tensor) -> Tensor:
    """``P noise = noise - ŝ <ŝ, noise>``: the noise with its component along the score removed."""
    return noise - s * _bview(_bsum(s * noise) / _bsum(s * s).clamp_min(1e-300), s)


def _run_sampler(
    score_fn: ScoreFn,
    x: Tensor,
    sched: Schedule,
    q: float,
    n_steps: int,
    spacing: str,
    laplacian: LaplacianArg,
    track: Callable[[Tensor, float], Tensor] | None,
    noise_fn: Callable[[float], float] | None,
    gen: torch.Generator | None,
    eta_range: tuple[float, float] | None,
    guided: bool = True,
    accumulate: bool | None = None,
) -> SampleResult:
    times = time_grid(sched, n_steps, spacing)
    d = x[0].numel()
    quant = math.sqrt(2.0 * d) * float(stats.norm.ppf(q))
    x_T = x
    if accumulate is None:
        accumulate = laplacian is not None
    acc = torch.zeros(len(x), dtype=x.dtype, device=x.device) if accumulate else None
    path = [acc.clone()] if acc is not None else None
    tracked = [track(x, times[0]).detach().reshape(len(x))] if track is not None else None
    plain = not guided
    for a, b in itertools.pairwise(times):
        dt = b - a  # negative
        phi = 0.0 if noise_fn is None else float(noise_fn(a))
        if phi < 0 or not math.isfinite(phi):
            raise ValueError(f"noise_scale_fn must return a finite value >= 0, got {phi} at t={a:g}")
        with torch.no_grad():
            if plain:
                s = _check_score_out(score_fn(x, a), x)
                drift = sched.f(a) * x - 0.5 * sched.g2(a) * s
            else:
                terms = _dg_terms(
                    score_fn, x, a, sched, q, phi, laplacian if phi > 0 else None, eta_range, gen
                )
                drift = terms.drift
        if acc is not None:
            lap = None if plain else terms.laplacian
            if lap is None:
                lap = _laplacian(laplacian, score_fn, x, a, gen).detach()
            # Prescribed rate b^q = -div u - ½ g² √(2D) Φ⁻¹(q) / σ² (equal to the general rate of the ODE
            # part of the drift while eta is not clipped).
            rate = (
                -(d * sched.f(a) - 0.5 * sched.g2(a) * lap) - 0.5 * sched.g2(a) * quant / sched.sigma(a) ** 2
            )
            acc = acc + rate * dt
            path.append(acc.clone())
        x = x + drift * dt
        if phi > 0:
            noise = torch.randn(x.shape, generator=gen, dtype=x.dtype, device=x.device)
            proj = _project_orthogonal(noise, terms.score)
            x = x + phi * math.sqrt(sched.g2(a) * -dt) * proj
        if not bool(torch.isfinite(x).all()):
            raise FloatingPointError(
                f"the sampler produced non-finite states at t={b:g}; use q nearer 0.5, more steps or eta_range"
            )
        if tracked is not None:
            tracked.append(track(x, b).detach().reshape(len(x)))
    return SampleResult(
        x=x,
        x_T=x_T,
        times=times,
        logp_change=acc,
        logp_path=torch.stack(path) if path is not None else None,
        tracked=torch.stack(tracked) if tracked is not None else None,
    )


def _probe(score_fn: ScoreFn, x: Tensor, t: float, name: str) -> None:
    """Call ``score_fn`` once on ``x`` so that a shape it rejects is reported under the caller's name."""
    try:
        with torch.no_grad():
            _check_score_out(score_fn(x, t), x)
    except ValueError as err:
        raise ValueError(f"{name} of shape {tuple(x.shape)} is rejected by score_fn: {err}") from err


def _sampler_prelude(score_fn: object, x_T: object, schedule: object, n_steps: object, track: object):
    _check_callable("score_fn", score_fn)
    sched = _check_schedule(schedule)
    x = _check_x(x_T, "x_T")
    _check_huge(x, "x_T", sched)
    _probe(score_fn, x, sched.t_max, "x_T")
    _check_steps(n_steps)
    if track is not None:
        _check_callable("track", track)
    _prior_warning(sched)
    return sched, x


def pf_ode_sample(
    score_fn: ScoreFn,
    x_T: Tensor,
    schedule: Schedule,
    n_steps: int = 64,
    spacing: str = "log_snr",
    laplacian: LaplacianArg = None,
    track: Callable[[Tensor, float], Tensor] | None = None,
) -> SampleResult:
    """Euler PF-ODE sampling from latents ``x_T`` ``(N, *event)`` (no rescaling): the unguided baseline.

    With ``laplacian`` (``"exact"``, ``"hutchinson"`` or a callable ``(x, t) -> Δ log p_t``) the result
    carries the accumulated ``∫ -div u dt``; ``track(x, t) -> (N,)`` is recorded at every grid time.
    """
    sched, x = _sampler_prelude(score_fn, x_T, schedule, n_steps, track)
    _check_laplacian_arg(laplacian)
    return _run_sampler(score_fn, x, sched, 0.5, n_steps, spacing, laplacian, track, None, None, None, False)


def density_guidance_sample(
    score_fn: ScoreFn,
    x_T: Tensor,
    schedule: Schedule,
    q: float,
    n_steps: int = 64,
    rescale_to_median: bool = True,
    spacing: str = "log_snr",
    laplacian: LaplacianArg = None,
    track: Callable[[Tensor, float], Tensor] | None = None,
    eta_range: tuple[float, float] | None = None,
) -> SampleResult:
    """Density-guided sampling (the reference's ``density_guidance_sampler``): rescale ``x_T`` to the median
    norm ``χ_D⁻¹(0.5) σ_T`` (``rescale_to_median``), then Euler on the DG-ODE of quantile ``q``.

    ``laplacian`` as in :func:`pf_ode_sample` accumulates the prescribed ``∫ b^q dt``, which the true
    ``log p_{t_min}(x) - log p_{t_max}(x_T)`` matches to solver accuracy. ``q = 0.5`` without rescaling
    gives :func:`pf_ode_sample` bit for bit.
    """
    sched, x = _sampler_prelude(score_fn, x_T, schedule, n_steps, track)
    q = _check_q(q)
    _check_laplacian_arg(laplacian)
    if rescale_to_median:
        x = rescale_latents(x, sched, 0.5)
    return _run_sampler(score_fn, x, sched, q, n_steps, spacing, laplacian, track, None, None, eta_range)


def stochastic_density_guidance_sample(
    score_fn: ScoreFn,
    x_T: Tensor,
    schedule: Schedule,
    q: float,
    noise_scale_fn: Callable[[float], float],
    n_steps: int = 128,
    rescale_to_median: bool = True,
    spacing: str = "log_snr",
    laplacian: LaplacianArg = "hutchinson",
    track: Callable[[Tensor, float], Tensor] | None = None,
    accumulate: bool = False,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> SampleResult:
    """Stochastic density guidance: Euler–Maruyama on ``dx = ũ^SDE dt + φ̃(t) g(t) P dW̄`` with the noise
    projected orthogonally to the score (``P = I - ŝŝᵀ``) and ``ũ^SDE`` the DG drift whose ``η`` also
    compensates the noise's Itô term (the projection's own small drift is neglected, as in the reference).

    ``noise_scale_fn(t) -> φ̃ >= 0`` (e.g. ``lambda t: 0.3 * (t < 0.3)``); ``laplacian`` gives ``Δ log p``
    where ``φ̃ > 0`` (``"hutchinson"``: one probe, the reference). ``accumulate=True`` also records the
    prescribed ``∫ b^q dt`` (with the same ``laplacian``). Noise from ``generator`` (or ``seed``).
    """
    sched, x = _sampler_prelude(score_fn, x_T, schedule, n_steps, track)
    q = _check_q(q)
    _check_callable("noise_scale_fn", noise_scale_fn)
    _check_laplacian_arg(laplacian, allow_none=False)
    gen = make_generator(seed, generator, device=x.device)
    if rescale_to_median:
        x = rescale_latents(x, sched, 0.5)
    return _run_sampler(
        score_fn, x, sched, q, n_steps, spacing, laplacian, track, noise_scale_fn, gen, None,
        accumulate=bool(accumulate),
    )  # fmt: skip


def prior_guidance_sample(
    score_fn: ScoreFn,
    x_T: Tensor,
    schedule: Schedule,
    q: float,
    n_steps: int = 64,
    spacing: str = "log_snr",
    laplacian: LaplacianArg = None,
    track: Callable[[Tensor, float], Tensor] | None = None,
) -> SampleResult:
    """Prior Guidance (the baseline): rescale ``x_T`` to the norm ``χ_D⁻¹(1 - q) σ_T`` and run the PF-ODE.

    ``q`` means what it means for DG (higher ``q``: smaller latent, higher density); the reference labels
    the same latent by ``q_ref = 1 - q``, the CDF of its norm.
    """
    sched, x = _sampler_prelude(score_fn, x_T, schedule, n_steps, track)
    q = _check_q(q)
    _check_laplacian_arg(laplacian)
    x = rescale_latents(x, sched, 1.0 - q)
    return _run_sampler(score_fn, x, sched, 0.5, n_steps, spacing, laplacian, track, None, None, None, False)


def pf_ode_log_density(
    score_fn: ScoreFn,
    x0: Tensor,
    schedule: Schedule,
    n_steps: int = 256,
    laplacian: LaplacianArg = "exact",
    spacing: str = "log_snr",
    method: str = "heun",
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> Tensor:
    """``log p_{t_min}(x0)`` ``(N,)`` by encoding with the PF-ODE from ``t_min`` up to ``t_max``:
    ``log N(x_T; 0, σ_T² I) + ∫ div u dt`` (the reference's ``pf_ode_encoder_with_logp``), with ``Δ log p``
    from ``laplacian`` (``"exact"`` autograd trace, ``"hutchinson"`` one probe per evaluation, or a
    callable). ``method``: ``"heun"`` (second order, trapezoidal divergence integral; default) or
    ``"euler"``."""
    _check_callable("score_fn", score_fn)
    sched = _check_schedule(schedule)
    x = _check_x(x0, "x0")
    _check_huge(x, "x0", sched)
    _probe(score_fn, x, sched.t_min, "x0")
    n_steps = _check_steps(n_steps)
    _check_laplacian_arg(laplacian, allow_none=False)
    if method not in ("heun", "euler"):
        raise ValueError(f"method must be 'heun' or 'euler', got {method!r}")
    _prior_warning(sched)
    gen = make_generator(seed, generator, device=x.device)
    times = time_grid(sched, n_steps, spacing)[::-1]
    d = x[0].numel()

    def field(y: Tensor, t: float) -> tuple[Tensor, Tensor]:
        lap = _laplacian(laplacian, score_fn, y, t, gen).detach()
        with torch.no_grad():
            s = _check_score_out(score_fn(y, t), y)
            return sched.f(t) * y - 0.5 * sched.g2(t) * s, d * sched.f(t) - 0.5 * sched.g2(t) * lap

    total = torch.zeros(len(x), dtype=x.dtype, device=x.device)
    for a, b in itertools.pairwise(times):
        dt = b - a  # positive
        u, div = field(x, a)
        if method == "euler":
            x, total = x + u * dt, total + div * dt
        else:
            u2, div2 = field(x + u * dt, b)
            x, total = x + 0.5 * (u + u2) * dt, total + 0.5 * (div + div2) * dt
    sig_T = sched.sigma(sched.t_max)
    log_prior = -0.5 * _bsum(x * x) / sig_T**2 - d * (math.log(sig_T) + 0.5 * math.log(2 * math.pi))
    return log_prior + total


def score_alignment(
    score_fn: ScoreFn,
    x_T: Tensor,
    schedule: Schedule,
    n_steps: int = 128,
    spacing: str = "log_snr",
    laplacian: Callable[[Tensor, float], Tensor] | str = "exact",
) -> Tensor:
    """Score alignment ``a_0 = <∇ log p_0(x_0), ∂x_0/∂x_T · x_T>`` ``(N,)`` along the PF-ODE from ``x_T``.

    Integrates ``x``, the tangent ``v`` (``dv/dt = J_u v``, a JVP of ``score_fn``) and
    ``da/dt = -<∇ div u, v> = ½ g² <∇Δ log p, v>`` from ``a_T = -‖x_T‖²/σ_T²`` (Euler). ``a_0 < 0`` means
    score alignment holds at ``x_T``: scaling the latent up lowers ``log p_0`` of the sample. ``laplacian``:
    ``"exact"`` (autograd, small ``D``), ``"hutchinson"`` (fixed probes per step) or a differentiable
    callable ``(x, t) -> (N,)`` (closed form). ``score_fn`` must be a pure torch function (``torch.func``).
    """
    _check_callable("score_fn", score_fn)
    sched = _check_schedule(schedule)
    x = _check_x(x_T, "x_T").detach()
    _check_huge(x, "x_T", sched)
    _probe(score_fn, x, sched.t_max, "x_T")
    n_steps = _check_steps(n_steps)
    _check_laplacian_arg(laplacian, allow_none=False)
    _prior_warning(sched)
    times = time_grid(sched, n_steps, spacing)
    v = x.clone()
    a_val = -_bsum(x * x) / sched.sigma(sched.t_max) ** 2
    gen = make_generator(0, None, device=x.device)
    for a, b in itertools.pairwise(times):
        dt = b - a
        s, js_v = torch.func.jvp(lambda y, _t=a: score_fn(y, _t), (x,), (v,))
        _check_score_out(s, x)
        with torch.enable_grad():
            xi = x.detach().requires_grad_(True)
            if laplacian == "exact":
                lap = exact_laplacian(score_fn, xi, a, create_graph=True)
            elif laplacian == "hutchinson":
                lap = hutchinson_laplacian(score_fn, xi, a, n_probes=1, generator=gen, create_graph=True)
            else:
                lap = laplacian(xi, a)
            (grad_lap,) = torch.autograd.grad(lap.sum(), xi)
        a_val = a_val + 0.5 * sched.g2(a) * _bsum(grad_lap * v) * dt
        new_v = v + (sched.f(a) * v - 0.5 * sched.g2(a) * js_v) * dt
        x = (x + (sched.f(a) * x - 0.5 * sched.g2(a) * s) * dt).detach()
        v = new_v.detach()
    return a_val.detach()


# ---------------------------------------------------------------------------------------- exact oracle


class GaussianMixture:
    """A Gaussian mixture with diagonal covariances, diffused by ``schedule``: every marginal
    ``p_t = Σ_k π_k N(α_t μ_k, diag(α_t² v_k + σ_t²))`` is a mixture too, so the score, log-density and
    Laplacian are closed form (the exact oracle of the tests and the reproduction).

    ``means`` ``(K, D)``, ``variances`` ``(K, D)`` (> 0), ``weights`` ``(K,)`` (>= 0, normalised here).
    ``score``, ``log_prob``, ``laplacian`` take ``x`` ``(N, D)`` and a float ``t`` (``t_min`` ≈ data).
    """

    def __init__(self, means: Tensor, variances: Tensor, weights: Tensor, schedule: Schedule) -> None:
        self.schedule = _check_schedule(schedule)
        means = _check_x(means, "means")
        variances = _check_x(variances, "variances")
        if means.dim() != 2 or variances.shape != means.shape:
            raise ValueError(
                f"means and variances must both have shape (K, D), got {tuple(means.shape)} and "
                f"{tuple(variances.shape)}"
            )
        if bool((variances <= 0).any()):
            raise ValueError(f"variances must be > 0, got min {float(variances.min()):g}")
        for name, a in (("means", means), ("variances", variances)):
            if float(a.abs().amax()) > 1e8:
                raise ValueError(f"{name} must have max |value| <= 1e8, got {float(a.abs().amax()):.3g}")
        if not isinstance(weights, Tensor) or weights.shape != (len(means),):
            got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
            raise ValueError(f"weights must be a tensor of shape ({len(means)},), got {got}")
        weights = _check_x(weights.reshape(-1, 1), "weights").reshape(-1)
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
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if isinstance(n_components, bool) or not isinstance(n_components, int) or n_components < 1:
            raise ValueError(f"n_components must be a positive int, got {n_components!r}")
        hi, lo = float(var_range[0]), float(var_range[1])
        if not (hi > 0 and lo > 0):
            raise ValueError(f"var_range must be two positive floats, got {var_range!r}")
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
        variances ``(K, D)``; quadratic forms by matrix products (no ``(N, K, D)`` tensor)."""
        x = _check_x(x, "x")
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (N, {self.dim}), got {tuple(x.shape)}")
        if float(x.detach().abs().amax()) > 1e8:
            raise ValueError(
                f"x must have max |x| <= 1e8 (its quadratic forms overflow), got {float(x.detach().abs().amax()):.3g}"
            )
        m, v = self._marginal(_check_time(t, self.schedule))
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
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        g = make_generator(seed, generator)
        k = torch.multinomial(self.weights, n, replacement=True, generator=g)
        eps = torch.randn(n, self.dim, generator=g, dtype=self.means.dtype)
        return self.means[k] + eps * self.variances[k].sqrt()


# ------------------------------------------------------------------------------------ small trained model


class ScoreMLP(nn.Module):
    """A small ε-prediction network ``ε̂(x, t)`` for flat data ``(N, D)``: an MLP on ``[x, sin/cos(log-SNR
    features)]`` (``hidden`` units, ``layers`` hidden layers, SiLU). Use ``eps_to_score(model, schedule)``."""

    def __init__(
        self, dim: int, schedule: Schedule, hidden: int = 256, layers: int = 3, seed: int = 0
    ) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden must be a positive int, got {hidden!r}")
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ValueError(f"layers must be a positive int, got {layers!r}")
        self.schedule = _check_schedule(schedule)
        self.dim = dim
        self.register_buffer("freqs", torch.arange(1, 9, dtype=torch.float32) * 0.25)
        with isolated_rng(seed):
            mods: list[nn.Module] = [nn.Linear(dim + 16, hidden), nn.SiLU()]
            for _ in range(layers - 1):
                mods += [nn.Linear(hidden, hidden), nn.SiLU()]
            mods.append(nn.Linear(hidden, dim))
            self.net = nn.Sequential(*mods)

    def _features(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        lam = torch.as_tensor(t, dtype=torch.float64)
        sched = self.schedule
        lo, hi = sched.log_snr(sched.t_max), sched.log_snr(sched.t_min)
        z = ((lam - lo) / (hi - lo) * 2 - 1).to(dtype)[:, None] * self.freqs.to(dtype) * math.pi
        return torch.cat([torch.sin(z), torch.cos(z)], dim=1)

    def forward(self, x: Tensor, t: float | Tensor) -> Tensor:
        """``ε̂(x, t)`` ``(N, D)`` for ``x`` ``(N, D)`` and a float ``t`` (or per-sample times ``(N,)``)."""
        x = _check_x(x, "x")
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (N, {self.dim}), got {tuple(x.shape)}")
        if float(x.detach().abs().amax()) > 1e6:
            raise ValueError(f"x must have max |x| <= 1e6, got {float(x.detach().abs().amax()):.3g}")
        if not isinstance(t, Tensor):
            t = _check_time(t, self.schedule)
        if isinstance(t, Tensor):
            lam = torch.tensor([self.schedule.log_snr(float(v)) for v in t.reshape(-1)], dtype=torch.float64)
        else:
            lam = torch.full((len(x),), self.schedule.log_snr(float(t)), dtype=torch.float64)
        lam = lam.expand(len(x)) if lam.numel() == 1 else lam
        feats = self._features(lam.to(x.device), x.dtype)
        return self.net(torch.cat([x, feats], dim=1))


def train_score_model(
    model: ScoreMLP,
    data: Tensor,
    steps: int = 2000,
    batch_size: int = 256,
    lr: float = 2e-3,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> list[float]:
    """Denoising score matching (ε-MSE) of ``model`` on ``data`` ``(N, D)`` with times uniform in log-SNR
    over the model's schedule; Adam with cosine decay. Returns the loss per step (the global RNG is not
    touched: draws come from ``generator`` / ``seed``). Validates before changing the model."""
    if not isinstance(model, ScoreMLP):
        raise TypeError(f"model must be a ScoreMLP, got {type(model).__name__}")
    data = _check_x(data, "data")
    if data.dim() != 2 or data.shape[1] != model.dim:
        raise ValueError(f"data must have shape (N, {model.dim}), got {tuple(data.shape)}")
    if float(data.std()) == 0.0:
        raise ValueError("data must not be constant, got std=0.0")
    if float(data.abs().max()) > 1e6:
        raise ValueError(f"data must have max |x| <= 1e6, got {float(data.abs().max()):.3g}")
    steps = _check_int("steps", steps, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    lr = _check_float("lr", lr, 0.0, low_open=True)
    g = make_generator(seed, generator)
    sched = model.schedule
    lo, hi = sched.log_snr(sched.t_max), sched.log_snr(sched.t_min)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    lr_sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    data = data.to(next(model.parameters()).dtype)
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(data), (batch_size,), generator=g)
        x0 = data[idx]
        lam = lo + (hi - lo) * torch.rand(batch_size, generator=g, dtype=torch.float64)
        alpha2 = torch.sigmoid(lam)
        a, s = alpha2.sqrt().to(x0.dtype)[:, None], (1 - alpha2).sqrt().to(x0.dtype)[:, None]
        eps = torch.randn(x0.shape, generator=g, dtype=x0.dtype)
        xt = a * x0 + s * eps
        feats = model._features(lam, x0.dtype)
        pred = model.net(torch.cat([xt, feats], dim=1))
        loss = ((pred - eps) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lr_sched.step()
        losses.append(float(loss.detach()))
    return losses
