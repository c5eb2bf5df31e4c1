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
ε-prediction (:func:`eps_to_score`) or a denoiser (:func:`denoiser_to_score`) into one. A small trainable
ε-network (:class:`ScoreMLP`, :func:`train_score_model`) comes with the module. The schedules
(:class:`VPSchedule`, :class:`EDMSchedule`, :func:`time_grid`) and the exact oracle :class:`GaussianMixture`
(closed-form score, log-density and Laplacian of every marginal) live in the area's common modules
(:mod:`icml25.generative_models.common`), shared with other papers; they are re-exported here.
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

from icml25.generative_models.common.mixtures import GaussianMixture
from icml25.generative_models.common.schedules import EDMSchedule, Schedule, VPSchedule, time_grid
from icml25.kernels.checks import check_choice, check_float, check_int, check_tensor
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
# Generic rules come from icml25.kernels.checks; the helpers below add only what is specific to a score-based
# sampler's arguments (a batch of states, a score's output, a schedule, the Laplacian option).


def _states(x: object, name: str, sched: Schedule | None = None) -> Tensor:
    """``x`` as a batch of states ``(N, *event)``: a finite, non-empty float tensor with at least 2 dims and,
    given ``sched``, ``max |x| <= 1e6 max(1, σ_max)`` (a latent or sample 1e30 σ_max away overflows its
    squared norm)."""
    limit = None if sched is None else 1e6 * max(1.0, sched.sigma(sched.t_max))
    x = check_tensor(x, name, non_empty=True, max_abs=limit)
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (N, *event) with at least 2 dims, got {tuple(x.shape)}")
    return x


def _score_out(s: object, x: Tensor, what: str = "score_fn") -> Tensor:
    """What ``what`` returned for ``x``: a tensor of ``x``'s shape and dtype (non-finite values are the
    samplers' to report, with the time step)."""
    if not isinstance(s, Tensor):
        raise TypeError(f"{what} must return a torch.Tensor, got {type(s).__name__}")
    if s.shape != x.shape:
        raise ValueError(
            f"{what} must return a tensor of the input's shape {tuple(x.shape)}, got {tuple(s.shape)}"
        )
    if s.dtype != x.dtype:
        raise ValueError(f"{what} must return the input's dtype {x.dtype}, got {s.dtype}")
    return s


def _schedule(schedule: object) -> Schedule:
    if not isinstance(schedule, (VPSchedule, EDMSchedule)):
        raise TypeError(f"schedule must be a VPSchedule or EDMSchedule, got {type(schedule).__name__}")
    return schedule


def _laplacian_arg(laplacian: object, allow_none: bool = True) -> None:
    if laplacian is None and allow_none:
        return
    if isinstance(laplacian, str):
        check_choice(laplacian, "laplacian", ("exact", "hutchinson"))
    elif not callable(laplacian):
        raise TypeError(
            f"laplacian must be 'exact', 'hutchinson' or a callable, got {type(laplacian).__name__}"
        )


def _bsum(a: Tensor) -> Tensor:
    """Sum over every non-batch axis: ``(N, *event) -> (N,)``."""
    return a.reshape(a.shape[0], -1).sum(1)


def _bview(c: Tensor, like: Tensor) -> Tensor:
    """A per-sample ``(N,)`` tensor shaped to broadcast against ``(N, *event)``."""
    return c.reshape(-1, *([1] * (like.dim() - 1)))


# ------------------------------------------------------------------------------------------- prior check


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
    if not callable(eps_fn):
        raise TypeError(f"eps_fn must be callable (x, t) -> tensor, got {type(eps_fn).__name__}")
    sched = _schedule(schedule)

    def score(x: Tensor, t: float) -> Tensor:
        x = _states(x, "x", sched)
        t = check_float(t, "t", low=0.0, high=sched.t_max, low_open=True)
        return _score_out(eps_fn(x, t), x, "eps_fn") / -sched.sigma(t)

    return score


def denoiser_to_score(denoiser: Callable[[Tensor, float], Tensor], schedule: Schedule) -> ScoreFn:
    """The score ``s_t(x) = (α_t D(x, t) - x) / σ_t²`` of a denoiser ``D(x, t) ≈ E[x_0 | x_t = x]`` (EDM:
    ``(D - x) / σ²``)."""
    if not callable(denoiser):
        raise TypeError(f"denoiser must be callable (x, t) -> tensor, got {type(denoiser).__name__}")
    sched = _schedule(schedule)

    def score(x: Tensor, t: float) -> Tensor:
        x = _states(x, "x", sched)
        t = check_float(t, "t", low=0.0, high=sched.t_max, low_open=True)
        return (sched.alpha(t) * _score_out(denoiser(x, t), x, "denoiser") - x) / sched.sigma(t) ** 2

    return score


# ------------------------------------------------------------------------------------------- Laplacians


def exact_laplacian(score_fn: ScoreFn, x: Tensor, t: float, create_graph: bool = False) -> Tensor:
    """``Δ log p_t(x) = tr ∇s_t(x)`` per sample ``(N,)`` by autograd (one vectorised backward per event
    dimension: for small ``D``). ``create_graph=True`` keeps it differentiable in ``x``."""
    if not callable(score_fn):
        raise TypeError(f"score_fn must be callable (x, t) -> tensor, got {type(score_fn).__name__}")
    x = _states(x, "x")
    t = check_float(t, "t")
    d = x[0].numel()
    with torch.enable_grad():
        xi = x if (create_graph and x.requires_grad) else x.detach().requires_grad_(True)
        s = _score_out(score_fn(xi, t), x).reshape(len(x), d)
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
    if not callable(score_fn):
        raise TypeError(f"score_fn must be callable (x, t) -> tensor, got {type(score_fn).__name__}")
    x = _states(x, "x")
    t = check_float(t, "t")
    k = check_int(n_probes, "n_probes", low=1)
    gen = make_generator(seed, generator, device=x.device)
    total = torch.zeros(len(x), dtype=x.dtype, device=x.device)
    with torch.enable_grad():
        xi = x if (create_graph and x.requires_grad) else x.detach().requires_grad_(True)
        s = _score_out(score_fn(xi, t), x)
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
    if not callable(score_fn):
        raise TypeError(f"score_fn must be callable (x, t) -> tensor, got {type(score_fn).__name__}")
    sched = _schedule(schedule)
    x = _states(x, "x", sched)
    t = check_float(t, "t", low=0.0, high=sched.t_max, low_open=True)
    s = _score_out(score_fn(x, t), x)
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
    if not callable(score_fn):
        raise TypeError(f"score_fn must be callable (x, t) -> tensor, got {type(score_fn).__name__}")
    sched = _schedule(schedule)
    x = _states(x, "x", sched)
    t = check_float(t, "t", low=0.0, high=sched.t_max, low_open=True)
    q = check_float(q, "q", low=0.0, high=1.0, low_open=True, high_open=True)
    phi = check_float(noise_scale, "noise_scale", low=0.0)
    if phi > 0:
        _laplacian_arg(laplacian, allow_none=False)
    if eta_range is not None:
        lo, hi = (check_float(v, "eta_range") for v in eta_range)
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
    s = _score_out(score_fn(x, t), x)
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
    sched = _schedule(schedule)
    x = _states(x, "x")
    t = check_float(t, "t", low=0.0, high=sched.t_max, low_open=True)
    for name, a in (("score", score), ("drift", drift), ("x", x)):  # bounded: their squares must not overflow
        check_tensor(a, name, max_abs=1e150)
        if a.shape != x.shape:
            raise ValueError(f"{name} must have the shape of x {tuple(x.shape)}, got {tuple(a.shape)}")
    check_tensor(laplacian, "laplacian", shape=(len(x),), max_abs=1e150)
    d = x[0].numel()
    u = sched.f(t) * x - 0.5 * sched.g2(t) * score
    div_u = d * sched.f(t) - 0.5 * sched.g2(t) * laplacian
    return -div_u + _bsum(score * (drift - u))


def guidance_offset(schedule: Schedule, q: float, dim: int, times: Sequence[float]) -> float:
    """``Σ_k c_q(t_k) (t_{k+1} - t_k)`` with ``c_q = -½ g² √(2D) Φ⁻¹(q) / σ²``: the part of the prescribed
    log-density change ``∫ b^q dt`` (Euler on ``times``) that does not depend on the sample."""
    sched = _schedule(schedule)
    q = check_float(q, "q", low=0.0, high=1.0, low_open=True, high_open=True)
    dim = check_int(dim, "dim", low=1)
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
    sched = _schedule(schedule)
    x_T = _states(x_T, "x_T", sched)
    quantile = check_float(quantile, "quantile", low=0.0, high=1.0, low_open=True, high_open=True)
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
                s = _score_out(score_fn(x, a), x)
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
            _score_out(score_fn(x, t), x)
    except ValueError as err:
        raise ValueError(f"{name} of shape {tuple(x.shape)} is rejected by score_fn: {err}") from err


def _sampler_prelude(score_fn: object, x_T: object, schedule: object, n_steps: object, track: object):
    if not callable(score_fn):
        raise TypeError(f"score_fn must be callable (x, t) -> tensor, got {type(score_fn).__name__}")
    sched = _schedule(schedule)
    x = _states(x_T, "x_T", sched)
    _probe(score_fn, x, sched.t_max, "x_T")
    check_int(n_steps, "n_steps", low=2)
    if track is not None:
        if not callable(track):
            raise TypeError(f"track must be callable (x, t) -> tensor, got {type(track).__name__}")
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
    _laplacian_arg(laplacian)
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
    q = check_float(q, "q", low=0.0, high=1.0, low_open=True, high_open=True)
    _laplacian_arg(laplacian)
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
    q = check_float(q, "q", low=0.0, high=1.0, low_open=True, high_open=True)
    if not callable(noise_scale_fn):
        raise TypeError(f"noise_scale_fn must be callable (t) -> float, got {type(noise_scale_fn).__name__}")
    _laplacian_arg(laplacian, allow_none=False)
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
    q = check_float(q, "q", low=0.0, high=1.0, low_open=True, high_open=True)
    _laplacian_arg(laplacian)
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
    if not callable(score_fn):
        raise TypeError(f"score_fn must be callable (x, t) -> tensor, got {type(score_fn).__name__}")
    sched = _schedule(schedule)
    x = _states(x0, "x0", sched)
    _probe(score_fn, x, sched.t_min, "x0")
    n_steps = check_int(n_steps, "n_steps", low=2)
    _laplacian_arg(laplacian, allow_none=False)
    check_choice(method, "method", ("heun", "euler"))
    _prior_warning(sched)
    gen = make_generator(seed, generator, device=x.device)
    times = time_grid(sched, n_steps, spacing)[::-1]
    d = x[0].numel()

    def field(y: Tensor, t: float) -> tuple[Tensor, Tensor]:
        lap = _laplacian(laplacian, score_fn, y, t, gen).detach()
        with torch.no_grad():
            s = _score_out(score_fn(y, t), y)
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
    if not callable(score_fn):
        raise TypeError(f"score_fn must be callable (x, t) -> tensor, got {type(score_fn).__name__}")
    sched = _schedule(schedule)
    x = _states(x_T, "x_T", sched).detach()
    _probe(score_fn, x, sched.t_max, "x_T")
    n_steps = check_int(n_steps, "n_steps", low=2)
    _laplacian_arg(laplacian, allow_none=False)
    _prior_warning(sched)
    times = time_grid(sched, n_steps, spacing)
    v = x.clone()
    a_val = -_bsum(x * x) / sched.sigma(sched.t_max) ** 2
    gen = make_generator(0, None, device=x.device)
    for a, b in itertools.pairwise(times):
        dt = b - a
        s, js_v = torch.func.jvp(lambda y, _t=a: score_fn(y, _t), (x,), (v,))
        _score_out(s, x)
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


# ------------------------------------------------------------------------------------ small trained model


class ScoreMLP(nn.Module):
    """A small ε-prediction network ``ε̂(x, t)`` for flat data ``(N, D)``: an MLP on ``[x, sin/cos(log-SNR
    features)]`` (``hidden`` units, ``layers`` hidden layers, SiLU). Use ``eps_to_score(model, schedule)``."""

    def __init__(
        self, dim: int, schedule: Schedule, hidden: int = 256, layers: int = 3, seed: int = 0
    ) -> None:
        super().__init__()
        dim = check_int(dim, "dim", low=1)
        hidden = check_int(hidden, "hidden", low=1)
        layers = check_int(layers, "layers", low=1)
        self.schedule = _schedule(schedule)
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
        x = check_tensor(x, "x", shape=(None, self.dim), non_empty=True, max_abs=1e6)
        if not isinstance(t, Tensor):
            t = check_float(t, "t", low=0.0, high=self.schedule.t_max, low_open=True)
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
    data = check_tensor(data, "data", shape=(None, model.dim), non_empty=True, max_abs=1e6)
    if float(data.std()) == 0.0:
        raise ValueError("data must not be constant, got std=0.0")
    steps = check_int(steps, "steps", low=1)
    batch_size = check_int(batch_size, "batch_size", low=1)
    lr = check_float(lr, "lr", low=0.0, low_open=True)
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
