"""A First-order Generative Bilevel Optimization Framework for Diffusion Models — ICML 2025, P30: bilevel tuning.

First-order (penalty / value-function) hypergradients for diffusion hyperparameters: the entropy strength λ
of reward fine-tuning with an inference-only lower-level solver, and the noise schedule of training.

Xiao et al., ICML 2025 (arXiv 2502.08808; official code ``afmsaif/bilevel_diffusion``).

*Entropy strength (fine-tuning).* The lower level is ``p_λ = argmax_p E_p[r₂] - λ KL(p ‖ p_pre)``, whose
solution is the Gibbs tilt ``p_λ ∝ p_pre e^{r₂/λ}``; the upper level is ``f(λ) = -E_{p_λ}[r₁]``. With
``g(λ, p) = -E_p r₂ + λ KL(p ‖ p_pre)`` the penalty value function
``V_γ(λ) = min_p [f(p)/γ + g(λ, p)] - min_p g(λ, p)`` has, by Danskin's theorem, the derivative
``dV_γ/dλ = KL(p_{λ,γ} ‖ p_pre) - KL(p_λ ‖ p_pre)`` with ``p_{λ,γ} ∝ p_pre e^{(r₂ + r₁/γ)/λ}``; and
``γ dV_γ/dλ = df/dλ + O(1/γ)``, ``df/dλ = Cov_{p_λ}(r₁, r₂)/λ²``. Both tilts are sampled without training
(:class:`GuidedSDESampler`: a frozen score plus reward guidance, exact (Doob), naive, or the official
code's target matching, the KL by Girsanov's theorem ``½ ∫ g(t)² E‖h_t‖² dt`` (:func:`girsanov_kl`) or the
official est2 proxy; or :class:`ExactTiltSampler` on a Gaussian mixture), or the
KLs come from pre-trained samples by self-normalised importance sampling (:func:`gibbs_tilt_kl_is`).
:class:`EntropyStrengthTuner` runs the outer loop (the reference's projected step, or a step in log λ).

*Noise schedule (training from scratch).* :class:`LearnableCosineSchedule` is the reference's cosine
schedule with learnable ``(start, end, τ, ε)``; :class:`NoiseScheduleBilevel` trains ``θ_y`` on the
denoising loss ``g`` and ``θ_z`` on ``f/γ + g`` (``f`` an upper metric of generated samples, its gradient
by two-point Gaussian smoothing, :func:`zo_gradient`) and moves the schedule along
``ZO∇_ψ f/γ + ∇_ψ g(ψ, θ_z) - ∇_ψ g(ψ, θ_y)``.

*Exact oracle.* A Gaussian mixture (:class:`icml25.generative_models.common.mixtures.GaussianMixture`, shared
with density guidance, as the VP schedule and :func:`sliced_wasserstein` are) tilted by a reward ``bᵀx - q‖x‖² + c₀`` (:class:`QuadraticReward`) is a
Gaussian mixture again (:func:`gibbs_tilt`): its log-partition, KL (:func:`tilt_kl`) and the upper
objective are closed form, and the exact guidance of every diffused marginal is the difference of two
mixture scores. :class:`RewardGuidedDenoiser` wraps any ε-prediction network (a diffusers ``UNet2DModel``)
so that guidance runs under any diffusers scheduler; ``LearnableCosineSchedule.betas()`` feeds
``DDPMScheduler(trained_betas=...)``.
"""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from icml25.generative_models.common.metrics import sliced_wasserstein
from icml25.generative_models.common.mixtures import GaussianMixture
from icml25.generative_models.common.schedules import VPSchedule, time_grid
from icml25.kernels.checks import check_choice, check_float, check_int, check_tensor
from icml25.kernels.optim import Adam
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "EntropyStrengthTuner",
    "ExactTiltSampler",
    "GibbsTilt",
    "GuidedSDESampler",
    "LearnableCosineSchedule",
    "NoiseScheduleBilevel",
    "QuadraticReward",
    "RewardGuidedDenoiser",
    "TiltDraw",
    "ddim_sample",
    "gibbs_tilt",
    "gibbs_tilt_kl_is",
    "girsanov_kl",
    "sliced_wasserstein",
    "tilt_kl",
    "upper_objective",
    "zo_gradient",
]

RewardFn = Callable[[Tensor], Tensor]


# ---------------------------------------------------------------------------------------------- validation
# Generic rules come from icml25.kernels.checks; this helper adds only what a reward's output must be.


def _reward_out(r: object, x: Tensor, name: str) -> Tensor:
    """A reward's output must be a finite ``(N,)`` tensor for ``x`` of shape ``(N, D)``."""
    if not isinstance(r, Tensor):
        raise TypeError(f"{name} must return a torch.Tensor of shape ({len(x)},), got {type(r).__name__}")
    if r.shape != (len(x),):
        raise ValueError(
            f"{name} must return a tensor of shape ({len(x)},) (one reward per sample), got {tuple(r.shape)}"
        )
    if not bool(torch.isfinite(r).all()):
        n_bad = int((~torch.isfinite(r)).sum())
        raise ValueError(
            f"{name} must return finite values; got {n_bad} non-finite of shape {tuple(r.shape)}"
        )
    return r


# ------------------------------------------------------------------------------------------------ rewards


class QuadraticReward:
    """``r(x) = bᵀx - q ‖x‖² + c₀`` for ``x`` ``(N, D)``: linear (``q = 0``, the lower reward of the toy) or
    an isotropic concave quadratic (``-‖x - c‖² = QuadraticReward.neg_sq_distance(c)``, the upper reward).
    Sums and non-negative multiples stay quadratic, so Gibbs tilts of Gaussian mixtures stay closed form."""

    def __init__(self, b: Tensor, q: float = 0.0, c0: float = 0.0) -> None:
        self.b = check_tensor(b, "b", ndim=1, non_empty=True, max_abs=1e8).to(torch.float64)
        self.q = check_float(q, "q", low=0.0)
        self.c0 = check_float(c0, "c0")
        if self.q > 1e8 or abs(self.c0) > 1e12:
            raise ValueError(f"q must be <= 1e8 and |c0| <= 1e12, got q={self.q:g}, c0={self.c0:g}")

    @classmethod
    def linear(cls, a: Tensor) -> QuadraticReward:
        """``r(x) = aᵀx``."""
        return cls(a)

    @classmethod
    def neg_sq_distance(cls, c: Tensor) -> QuadraticReward:
        """``r(x) = -‖x - c‖² = 2cᵀx - ‖x‖² - ‖c‖²``."""
        c = check_tensor(c, "c", ndim=1, non_empty=True, max_abs=1e6).to(torch.float64)
        return cls(2.0 * c, 1.0, -float((c * c).sum()))

    @property
    def dim(self) -> int:
        return len(self.b)

    def _x(self, x: Tensor) -> Tensor:
        # bounded by 1e15: its squares must not overflow
        return check_tensor(x, "x", shape=(None, self.dim), non_empty=True, max_abs=1e15)

    def __call__(self, x: Tensor) -> Tensor:
        x = self._x(x)
        b = self.b.to(x.dtype)
        return x @ b - self.q * (x * x).sum(1) + self.c0

    def grad(self, x: Tensor) -> Tensor:
        """``∇r(x) = b - 2 q x`` ``(N, D)``."""
        x = self._x(x)
        return self.b.to(x.dtype)[None] - 2.0 * self.q * x

    def __add__(self, other: QuadraticReward) -> QuadraticReward:
        if not isinstance(other, QuadraticReward) or other.dim != self.dim:
            return NotImplemented
        return QuadraticReward(self.b + other.b, self.q + other.q, self.c0 + other.c0)

    def __mul__(self, w: float) -> QuadraticReward:
        w = check_float(w, "w", low=0.0)
        return QuadraticReward(self.b * w, self.q * w, self.c0 * w)

    __rmul__ = __mul__

    def expectation(self, mixture: GaussianMixture) -> float:
        """``E[r(x)]`` under the mixture's data distribution (closed form)."""
        if mixture.dim != self.dim:
            raise ValueError(f"mixture must have dim {self.dim}, got {mixture.dim}")
        m, v, w = mixture.means.double(), mixture.variances.double(), mixture.weights.double()
        per = m @ self.b - self.q * ((m * m).sum(1) + v.sum(1))
        return float((w * per).sum()) + self.c0

    def __repr__(self) -> str:
        return f"QuadraticReward(b={self.b.tolist()}, q={self.q:g}, c0={self.c0:g})"


def _combine(lower: RewardFn, upper: RewardFn, w: float) -> RewardFn:
    """The penalty reward ``r₂ + w r₁`` (closed form when both are quadratic)."""
    if w == 0.0:
        return lower
    if isinstance(lower, QuadraticReward) and isinstance(upper, QuadraticReward):
        return lower + upper * w

    def reward(x: Tensor) -> Tensor:
        return lower(x) + w * upper(x)

    return reward


def _reward_grad(reward: RewardFn, x: Tensor) -> Tensor:
    if isinstance(reward, QuadraticReward):
        return reward.grad(x)
    with torch.enable_grad():
        xi = x.detach().requires_grad_(True)
        r = _reward_out(reward(xi), xi, "reward")
        (g,) = torch.autograd.grad(r.sum(), xi)
    return g.detach()


# ------------------------------------------------------------------------------------------ exact oracle


class GibbsTilt(NamedTuple):
    """The tilt ``p ∝ p_pre e^{r/λ}`` of a mixture: itself a mixture, and ``log Z = log E_pre[e^{r/λ}]``."""

    mixture: GaussianMixture
    log_partition: float


def _mixture(mixture: object) -> GaussianMixture:
    if not isinstance(mixture, GaussianMixture):
        raise TypeError(f"mixture must be a GaussianMixture, got {type(mixture).__name__}")
    return mixture


def _quadratic(reward: object, dim: int, name: str = "reward") -> QuadraticReward:
    """A reward whose Gibbs tilt of a ``dim``-dimensional mixture is closed form."""
    if not isinstance(reward, QuadraticReward):
        raise TypeError(
            f"{name} must be a QuadraticReward for a closed-form tilt, got {type(reward).__name__}"
        )
    if reward.dim != dim:
        raise ValueError(f"{name} must have dim {dim} (the mixture's), got {reward.dim}")
    return reward


def gibbs_tilt(mixture: GaussianMixture, reward: QuadraticReward, lam: float) -> GibbsTilt:
    """Exact tilt of a diagonal Gaussian mixture by ``e^{r/λ}``, ``r = bᵀx - q‖x‖² + c₀``.

    Component ``k``: precision ``1/v_k + 2q/λ``, mean ``v'_k (μ_k/v_k + b/λ)``, weight ``∝ π_k Z_k`` with
    ``Z_k = E_{N(μ_k, v_k)}[e^{(bᵀx - q‖x‖²)/λ}]``; the diffusion schedule is kept, so every marginal of the
    tilt (and hence the exact guidance ``∇ log p^λ_t - ∇ log p_t``) is closed form too."""
    mixture = _mixture(mixture)
    reward = _quadratic(reward, mixture.dim)
    lam = check_float(lam, "lam", low=1e-8, high=1e8)
    mu, v, pi = mixture.means.double(), mixture.variances.double(), mixture.weights.double()
    b, q = reward.b / lam, reward.q / lam
    prec = 1.0 / v + 2.0 * q
    h = mu / v + b[None]
    log_zk = 0.5 * (h * h / prec).sum(1) - 0.5 * (mu * mu / v).sum(1) - 0.5 * torch.log(v * prec).sum(1)
    logw = torch.log(pi) + log_zk
    log_z = float(torch.logsumexp(logw, 0)) + reward.c0 / lam
    if not math.isfinite(log_z):
        raise ValueError(f"the tilt by reward/lam overflows at lam={lam:g}: log-partition {log_z}")
    tilted = GaussianMixture(
        (h / prec).to(mixture.means.dtype),
        (1.0 / prec).to(mixture.means.dtype),
        torch.softmax(logw, 0).to(mixture.means.dtype),
        mixture.schedule,
    )
    return GibbsTilt(tilted, log_z)


def tilt_kl(mixture: GaussianMixture, reward: QuadraticReward, lam: float) -> float:
    """Exact ``KL(p_pre e^{r/λ}/Z ‖ p_pre) = E_tilt[r]/λ - log Z``."""
    tilt = gibbs_tilt(mixture, reward, lam)
    return reward.expectation(tilt.mixture) / check_float(lam, "lam", low=1e-8, high=1e8) - tilt.log_partition


def upper_objective(
    mixture: GaussianMixture, lower: QuadraticReward, upper: QuadraticReward, lam: float
) -> float:
    """Exact upper objective ``f(λ) = -E_{p_λ}[r₁]`` with ``p_λ ∝ p_pre e^{r₂/λ}``."""
    tilt = gibbs_tilt(mixture, lower, lam)
    return -_quadratic(upper, mixture.dim, "upper").expectation(tilt.mixture)


# ---------------------------------------------------------------------------------------- KL estimators


def gibbs_tilt_kl_is(scores: Tensor, lam: float) -> Tensor:
    """Self-normalised importance-sampling estimate of ``KL(p_pre e^{s/λ}/Z ‖ p_pre)`` from rewards
    ``s_i = s(x_i)`` of pre-trained samples ``x_i ~ p_pre``: ``Σ w_i s_i/λ - log mean_i e^{s_i/λ}`` with
    ``w ∝ e^{s/λ}`` (a scalar tensor; consistent, but its effective sample size collapses for small λ)."""
    scores = check_tensor(scores, "scores", ndim=1)
    if len(scores) < 2:
        raise ValueError(f"scores must have shape (N,) with N >= 2 samples, got {tuple(scores.shape)}")
    lam = check_float(lam, "lam", low=1e-8, high=1e8)
    z = scores.double() / lam
    if float(z.abs().max()) > 1e12:
        raise ValueError(f"scores/lam must have max |value| <= 1e12, got {float(z.abs().max()):.3g}")
    w = torch.softmax(z, 0)
    return ((w * z).sum() - (torch.logsumexp(z, 0) - math.log(len(z)))).to(scores.dtype)


def girsanov_kl(guidance_drifts: Sequence[Tensor], g2: Tensor, dt: Tensor) -> Tensor:
    """Girsanov KL of a guided reverse SDE from the unguided one: ``½ Σ_k g²(t_k) E‖h_k‖² Δt_k``.

    ``guidance_drifts``: the guidance added to the score at each step, ``(N, D)`` each (the drift changes by
    ``g² h``); ``g2``, ``dt``: ``(K,)`` squared diffusion and positive step lengths. A path-space KL, hence
    an upper bound of the KL between the samples' laws, equal to it for exact (Doob) guidance."""
    if isinstance(guidance_drifts, Tensor) or not isinstance(guidance_drifts, Sequence):
        raise TypeError(
            f"guidance_drifts must be a list of (N, D) tensors, got {type(guidance_drifts).__name__}"
        )
    if len(guidance_drifts) == 0:
        raise ValueError("guidance_drifts must hold at least one step, got an empty list")
    for name, a in (("g2", g2), ("dt", dt)):
        if not isinstance(a, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (K,), got {type(a).__name__}")
        check_tensor(a, name, shape=(len(guidance_drifts),), non_empty=True)
        if bool((a < 0).any()) or bool((a > 1e12).any()):
            raise ValueError(
                f"{name} must lie in [0, 1e12], got min {float(a.min()):g}, max {float(a.max()):g}"
            )
    total = torch.zeros((), dtype=torch.float64)
    for k, h in enumerate(guidance_drifts):
        h = check_tensor(h, f"guidance_drifts[{k}]", non_empty=True, max_abs=1e100)
        if h.dim() < 2:
            raise ValueError(f"guidance_drifts[{k}] must have shape (N, D), got {tuple(h.shape)}")
        total = total + 0.5 * float(g2[k]) * (h.double() ** 2).reshape(len(h), -1).sum(1).mean() * float(
            dt[k]
        )
    if not math.isfinite(float(total)):
        raise ValueError(f"girsanov_kl overflowed: guidance drifts too large (total {float(total)})")
    return total


# --------------------------------------------------------------------------------- lower-level solvers


class TiltDraw(NamedTuple):
    """Samples ``x`` ``(n, D)`` of ``p ∝ p_pre e^{r/λ}`` and the solver's estimate of ``KL(p ‖ p_pre)``."""

    x: Tensor
    kl: Tensor


class ExactTiltSampler:
    """Draws from the exact Gibbs tilt of a Gaussian mixture by a :class:`QuadraticReward`.

    ``kl="plugin"``: ``mean_i r(x_i)/λ - log Z`` on the samples (the log-density ratio is exact, so only
    the expectation is Monte Carlo); ``kl="exact"``: the closed form (noise-free hypergradients). Calls with
    the same ``seed`` share their random numbers (common random numbers for ``KL_γ - KL_0``)."""

    def __init__(self, mixture: GaussianMixture, kl: Literal["plugin", "exact"] = "plugin") -> None:
        self.mixture = _mixture(mixture)
        self.kl = check_choice(kl, "kl", ("plugin", "exact"))

    def __call__(self, reward: QuadraticReward, lam: float, n: int, seed: int | None = None) -> TiltDraw:
        n = check_int(n, "n", low=1)
        tilt = gibbs_tilt(self.mixture, reward, lam)
        x = tilt.mixture.sample(n, seed=seed)
        if self.kl == "exact":
            kl = reward.expectation(tilt.mixture) / lam - tilt.log_partition
        else:
            kl = float(reward(x).double().mean()) / lam - tilt.log_partition
        return TiltDraw(x, torch.tensor(kl, dtype=torch.float64))


class GuidedSDESampler:
    """Inference-only lower-level solver: the VP reverse SDE of a frozen score with reward guidance.

    ``dx = [f x - g² (s_t(x) + h_t(x))] dt + g dW̄`` (Euler–Maruyama from ``t_max`` down to ``t_min``, then a
    Tweedie denoising step). ``guidance`` picks the guidance ``h``:

    * ``"naive"``: ``h = ∇r(x_t)/λ`` at every t (it over-shifts, because the exact guidance vanishes as
      t → t_max);
    * ``"exact"``: the Doob guidance ``∇ log E[e^{r(x₀)/λ} | x_t]``, closed form for a :class:`GaussianMixture`
      ``mixture`` and a :class:`QuadraticReward` (the samples then follow the tilt up to discretisation);
    * ``"target"``: the official code's target matching (``gradguided_sdpipeline.py``, the look-ahead
      gradient guidance of Guo et al. 2024): the reward is linearised per sample at the previous round's
      output, ``r ≈ gᵢᵀx + bᵢ`` (zero in the first round), and
      ``h = (strength/λ) (target - r̂(x̂₀(x_t))) ∇_{x_t} r̂(x̂₀(x_t))`` through the Tweedie estimate
      ``x̂₀ = (x_t + σ_t² s_t(x_t))/α_t`` (autograd through ``score_fn``); ``rounds`` rounds of sampling and
      re-linearisation with the same noise, the last one returned (``rounds=1``: the unguided first round). The official loss is a mean over its
      batch of 5 (each sample's guidance divided by 5); here it is per sample, so ``strength`` is the
      official ``--guidance`` at batch size 1.

    ``kl``: ``"girsanov"`` (default): ``½ Σ g² E‖h‖² Δt`` of the guidance actually added
    (:func:`girsanov_kl`, accumulated over the steps); ``"guidance_norm"``: the official est2 proxy, the
    mean over steps and samples of the unsquared norm of the guidance before its strength factor
    (``‖h‖ λ/strength``; not a KL)."""

    def __init__(
        self,
        score_fn: Callable[[Tensor, float], Tensor],
        schedule: VPSchedule,
        dim: int,
        n_steps: int = 200,
        guidance: Literal["naive", "exact", "target"] = "naive",
        mixture: GaussianMixture | None = None,
        spacing: str = "uniform",
        target: float = 0.0,
        strength: float = 1.0,
        rounds: int = 3,
        kl: Literal["girsanov", "guidance_norm"] = "girsanov",
    ) -> None:
        if not callable(score_fn):
            raise TypeError(
                f"score_fn must be callable (x, t) -> (N, D) score, got {type(score_fn).__name__}"
            )
        if not isinstance(schedule, VPSchedule):
            raise TypeError(f"schedule must be a VPSchedule, got {type(schedule).__name__}")
        self.score_fn, self.schedule = score_fn, schedule
        self.dim = check_int(dim, "dim", low=1)
        self.n_steps = check_int(n_steps, "n_steps", low=2)
        self.guidance = check_choice(guidance, "guidance", ("naive", "exact", "target"))
        if guidance == "exact":
            self.mixture = _mixture(mixture)
            if self.mixture.dim != self.dim:
                raise ValueError(f"mixture must have dim {self.dim}, got {self.mixture.dim}")
        else:
            self.mixture = mixture
        self.target = check_float(target, "target")
        self.strength = check_float(strength, "strength", low=0.0, low_open=True)
        self.rounds = check_int(rounds, "rounds", low=1)  # 1: the first round alone, unguided
        self.kl = check_choice(kl, "kl", ("girsanov", "guidance_norm"))
        self.times = time_grid(schedule, self.n_steps, spacing)

    def __call__(self, reward: RewardFn, lam: float, n: int, seed: int | None = None) -> TiltDraw:
        if not callable(reward):
            raise TypeError(f"reward must be callable (x) -> (N,) rewards, got {type(reward).__name__}")
        lam = check_float(lam, "lam", low=1e-8, high=1e8)
        n = check_int(n, "n", low=1)
        if self.guidance == "target":
            return self._target_rounds(reward, lam, n, seed)
        tilted = gibbs_tilt(self.mixture, reward, lam).mixture if self.guidance == "exact" else None

        def guide(x: Tensor, t: float, s: Tensor) -> Tensor:
            if tilted is not None:
                return tilted.score(x, t) - s
            return _reward_grad(reward, x) / lam

        return self._integrate(guide, n, seed, lam)

    def _target_rounds(self, reward: RewardFn, lam: float, n: int, seed: int | None) -> TiltDraw:
        """The official loop: sample, linearise the reward at the samples, sample again with the same noise."""
        sched, beta = self.schedule, self.strength / lam
        grads = bias = None

        def guide(x: Tensor, t: float, s: Tensor) -> Tensor:
            if grads is None:  # the official first round: zero reward gradients and biases, no guidance
                return torch.zeros_like(x)
            with torch.enable_grad():
                xi = x.detach().requires_grad_(True)
                x0 = (xi + sched.sigma(t) ** 2 * self.score_fn(xi, t)) / sched.alpha(t)
                r_hat = (grads * x0).sum(1) + bias
                (g,) = torch.autograd.grad(0.5 * ((self.target - r_hat) ** 2).sum(), xi)
            return -beta * g.detach()

        for _ in range(self.rounds):
            draw = self._integrate(guide, n, seed, lam)
            x = draw.x
            grads = _reward_grad(reward, x)
            bias = _reward_out(reward(x), x, "reward").detach().to(x.dtype) - (grads * x).sum(1)
        return draw

    def _integrate(
        self, guide: Callable[[Tensor, float, Tensor], Tensor], n: int, seed: int | None, lam: float
    ) -> TiltDraw:
        sched, gen = self.schedule, make_generator(seed)
        unit = lam / (self.strength if self.guidance == "target" else 1.0)  # h per unit of its strength
        x = torch.randn(n, self.dim, generator=gen, dtype=torch.float64) * sched.sigma(sched.t_max)
        kl = torch.zeros((), dtype=torch.float64)
        for a, b in itertools.pairwise(self.times):
            dt = a - b
            s = self.score_fn(x, a)
            h = guide(x, a, s)
            if self.kl == "girsanov":
                kl = kl + 0.5 * sched.g2(a) * (h * h).sum(1).mean() * dt
            else:
                kl = kl + h.norm(dim=1).mean() * unit / self.n_steps
            drift = sched.f(a) * x - sched.g2(a) * (s + h)
            x = (
                x
                - drift * dt
                + math.sqrt(sched.g2(a) * dt) * torch.randn(x.shape, generator=gen, dtype=x.dtype)
            )
        t0 = sched.t_min
        s = self.score_fn(x, t0)
        x = (x + sched.sigma(t0) ** 2 * (s + guide(x, t0, s))) / sched.alpha(t0)
        return TiltDraw(x, kl)


# ----------------------------------------------------------------------------------- entropy strength λ


class EntropyStrengthTuner:
    """First-order bilevel tuning of the entropy strength λ of reward fine-tuning.

    Each :meth:`step` draws ``p_λ`` (lower reward ``r₂``) and ``p_{λ,γ}`` (reward ``r₂ + r₁/γ``) with the
    same seed, forms the penalty hypergradient ``γ (KL_γ - KL₀)`` (an estimate of ``df/dλ``) and updates λ:
    ``step_rule="projected"``: ``λ ← max(λ - lr γ ĝ, lam_min)`` (the reference's step, scaled by γ so
    that ``lr`` keeps its meaning when γ changes); ``"log"``: ``λ ← λ exp(-lr γ λ ĝ)`` (gradient descent in
    log λ; it moves from a flat start such as the reference's λ₀ = 5). KLs: ``kl_estimator="sampler"`` uses
    the solver's own estimate (Girsanov for :class:`GuidedSDESampler`, plug-in for :class:`ExactTiltSampler`);
    ``"is"`` self-normalised importance sampling of ``pre_samples`` (:func:`gibbs_tilt_kl_is`).

    ``sampler(reward, lam, n, seed) -> TiltDraw``; ``lower_reward``, ``upper_reward``: ``(N, D) -> (N,)``.
    ``gamma_end``: γ grows linearly from ``gamma`` to it over ``n_iters`` of :meth:`run` (the penalty's
    O(1/γ) bias shrinks). ``sign=-1`` flips the hypergradient (the deliberately broken variant of the tests).
    """

    def __init__(
        self,
        sampler: Callable[[RewardFn, float, int, int | None], TiltDraw],
        lower_reward: RewardFn,
        upper_reward: RewardFn,
        gamma: float = 1.0,
        lr: float = 0.1,
        lam0: float = 5.0,
        kl_estimator: Literal["sampler", "is"] = "sampler",
        step_rule: Literal["projected", "log"] = "projected",
        n_samples: int = 512,
        lam_min: float = 1e-3,
        pre_samples: Tensor | None = None,
        gamma_end: float | None = None,
        max_log_step: float = 1.0,
        seed: int = 0,
        sign: float = 1.0,
    ) -> None:
        if not callable(sampler):
            raise TypeError(
                f"sampler must be callable (reward, lam, n, seed) -> TiltDraw, got {type(sampler).__name__}"
            )
        if not callable(lower_reward):
            raise TypeError(
                f"lower_reward must be callable (x) -> (N,) rewards, got {type(lower_reward).__name__}"
            )
        if not callable(upper_reward):
            raise TypeError(
                f"upper_reward must be callable (x) -> (N,) rewards, got {type(upper_reward).__name__}"
            )
        self.gamma = check_float(gamma, "gamma", low=0.0, low_open=True)
        self.gamma_end = (
            None if gamma_end is None else check_float(gamma_end, "gamma_end", low=0.0, low_open=True)
        )
        self.lr = check_float(lr, "lr", low=0.0, low_open=True)
        self.lam = check_float(lam0, "lam0", low=1e-8, high=1e8)
        self.kl_estimator = check_choice(kl_estimator, "kl_estimator", ("sampler", "is"))
        self.step_rule = check_choice(step_rule, "step_rule", ("projected", "log"))
        self.n_samples = check_int(n_samples, "n_samples", low=2)
        self.lam_min = check_float(lam_min, "lam_min", low=1e-8, high=1e8)
        self.max_log_step = check_float(max_log_step, "max_log_step", low=0.0, low_open=True)
        if self.lam < self.lam_min:
            raise ValueError(f"lam0 must be >= lam_min={self.lam_min:g}, got {self.lam:g}")
        if kl_estimator == "is":
            if pre_samples is None:
                raise ValueError(
                    "pre_samples must be given (samples of p_pre, shape (N, D)) when kl_estimator='is'"
                )
            pre_samples = check_tensor(pre_samples, "pre_samples", ndim=2, non_empty=True, max_abs=1e15)
            if len(pre_samples) < 2:
                raise ValueError(
                    f"pre_samples must hold N >= 2 samples, got shape {tuple(pre_samples.shape)}"
                )
            self._pre_r2 = _reward_out(lower_reward(pre_samples), pre_samples, "lower_reward")
            self._pre_r1 = _reward_out(upper_reward(pre_samples), pre_samples, "upper_reward")
        self.pre_samples = pre_samples
        self.sampler, self.lower, self.upper = sampler, lower_reward, upper_reward
        self.seed = check_int(seed, "seed", low=0)
        self.sign = check_float(sign, "sign")
        self.iteration = 0
        self.history: list[dict[str, float]] = []
        self._checked_sampler = False

    def _draw(self, draw: object, what: str) -> TiltDraw:
        """The sampler's output for ``what`` as a :class:`TiltDraw` of ``(n, D)`` samples and a finite KL."""
        if not isinstance(draw, tuple) or len(draw) != 2:
            raise TypeError(f"sampler must return a TiltDraw(x, kl), got {type(draw).__name__} for {what}")
        x, kl = draw
        x = check_tensor(x, f"sampler output x ({what})", ndim=2, non_empty=True)
        kl = torch.as_tensor(kl, dtype=torch.float64)
        if kl.numel() != 1 or not math.isfinite(float(kl)):
            raise ValueError(f"sampler output kl ({what}) must be a finite scalar, got {kl}")
        return TiltDraw(x, kl.reshape(()))

    def _warn_if_lam_blind(self, lam: float, seed: int) -> None:
        m = min(self.n_samples, 64)
        a = self._draw(self.sampler(self.lower, lam, m, seed), "the lambda check").x
        b = self._draw(self.sampler(self.lower, 2.0 * lam, m, seed), "the lambda check").x
        if a.shape == b.shape and torch.allclose(a, b):
            warnings.warn(
                f"sampler output does not depend on lam (same seed, lam={lam:g} and {2 * lam:g} gave the "
                "same samples): the guidance strength must be base/lam",
                RuntimeWarning,
                stacklevel=3,
            )

    def current_gamma(self, n_iters: int | None = None) -> float:
        """γ at the current iteration (linear from ``gamma`` to ``gamma_end`` over ``n_iters``)."""
        if self.gamma_end is None or not n_iters or n_iters < 2:
            return self.gamma
        frac = min(self.iteration / (n_iters - 1), 1.0)
        return self.gamma + frac * (self.gamma_end - self.gamma)

    def hypergradient(
        self, lam: float, gamma: float | None = None, seed: int | None = None
    ) -> dict[str, float]:
        """``{grad, kl_gamma, kl_0, upper}`` at ``lam`` without updating: ``grad = γ (KL_γ - KL₀)``,
        ``upper`` the Monte Carlo ``f = -mean r₁`` on the ``p_λ`` samples (``nan`` with ``"is"``)."""
        lam = check_float(lam, "lam", low=1e-8, high=1e8)
        gamma = self.gamma if gamma is None else check_float(gamma, "gamma", low=0.0, low_open=True)
        seed = self.seed if seed is None else check_int(seed, "seed", low=0)
        pen = _combine(self.lower, self.upper, 1.0 / gamma)
        if self.kl_estimator == "is":
            assert self.pre_samples is not None
            kl0 = float(gibbs_tilt_kl_is(self._pre_r2, lam))
            klg = float(gibbs_tilt_kl_is(self._pre_r2 + self._pre_r1 / gamma, lam))
            w = torch.softmax(self._pre_r2.double() / lam, 0)
            upper = -float((w * self._pre_r1.double()).sum())
        else:
            d0 = self._draw(self.sampler(self.lower, lam, self.n_samples, seed), "the lower tilt")
            dg = self._draw(self.sampler(pen, lam, self.n_samples, seed), "the penalty tilt")
            kl0, klg = float(d0.kl), float(dg.kl)
            upper = -float(_reward_out(self.upper(d0.x), d0.x, "upper_reward").double().mean())
        grad = self.sign * gamma * (klg - kl0)
        return {"grad": grad, "kl_gamma": klg, "kl_0": kl0, "upper": upper, "gamma": gamma}

    def step(self, n_iters: int | None = None) -> dict[str, float]:
        """One outer iteration; returns ``{lam, grad, kl_gamma, kl_0, upper, gamma, lam_next}``."""
        seed = self.seed + self.iteration
        if not self._checked_sampler and self.kl_estimator == "sampler":
            self._warn_if_lam_blind(self.lam, seed)
            self._checked_sampler = True
        out = self.hypergradient(self.lam, self.current_gamma(n_iters), seed)
        lam = self.lam
        if self.step_rule == "projected":
            new = max(lam - self.lr * out["grad"], self.lam_min)
        else:
            step = max(-self.max_log_step, min(self.max_log_step, self.lr * lam * out["grad"]))
            new = max(lam * math.exp(-step), self.lam_min)
        self.lam = min(new, 1e8)
        self.iteration += 1
        rec = {"lam": lam, **out, "lam_next": self.lam}
        self.history.append(rec)
        return rec

    def run(self, n_iters: int) -> list[dict[str, float]]:
        """``n_iters`` outer steps; returns their records (also kept in ``history``)."""
        n_iters = check_int(n_iters, "n_iters", low=1)
        return [self.step(n_iters) for _ in range(n_iters)]

    def lam_hat(self, last: int = 10) -> float:
        """Geometric mean of the last ``last`` iterates (λ after each step): the Polyak-averaged estimate."""
        last = check_int(last, "last", low=1)
        if not self.history:
            raise ValueError("EntropyStrengthTuner is not fitted: call run(...) first")
        lams = [h["lam_next"] for h in self.history[-last:]]
        return float(np.exp(np.mean(np.log(lams))))


# --------------------------------------------------------------------------------------- noise schedule


class LearnableCosineSchedule(nn.Module):
    """The reference's cosine schedule with learnable ``(start, end, τ, ε)`` on integer steps ``0..T``:
    ``t' = t (end - start) + start``, ``f(t) = cos(((t'/T + ε)/(1 + ε)) π/2)^{2τ}``, ``ᾱ_t = f(t)/f(0)``,
    ``β_t = min(1 - ᾱ_t/ᾱ_{t-1}, max_beta)``; ``(0, 1, 1, 0.008)`` is Nichol & Dhariwal's cosine schedule.
    :meth:`clamp_` projects onto start ∈ [0, 1], end ∈ (start, 1], τ ≥ 1, ε ∈ [0, 1]."""

    def __init__(
        self, T: int = 100, start: float = 0.0, end: float = 1.0, tau: float = 1.0, eps: float = 0.008,
        max_beta: float = 0.999,
    ) -> None:  # fmt: skip
        super().__init__()
        self.T = check_int(T, "T", low=2)
        vals = {"start": start, "end": end, "tau": tau, "eps": eps}
        for k, v in vals.items():
            check_float(v, k)
        if not (0.0 <= start <= 1.0 and start < end <= 1.0 and tau >= 1.0 and 0.0 <= eps <= 1.0):
            raise ValueError(
                "schedule parameters must satisfy start in [0, 1], end in (start, 1], tau >= 1, eps in [0, 1]; "
                f"got start={start:g}, end={end:g}, tau={tau:g}, eps={eps:g}"
            )
        self.max_beta = check_float(max_beta, "max_beta", low=0.0, low_open=True)
        if self.max_beta >= 1.0:
            raise ValueError(f"max_beta must be < 1, got {self.max_beta:g}")
        for k, v in vals.items():
            setattr(self, k, nn.Parameter(torch.tensor(float(v), dtype=torch.float64)))

    def params(self) -> list[nn.Parameter]:
        """``[start, end, tau, eps]`` (the order of the reference's per-parameter learning rates)."""
        return [self.start, self.end, self.tau, self.eps]

    def _f(self) -> Tensor:
        t = torch.arange(self.T + 1, dtype=torch.float64)
        tp = t * (self.end - self.start) + self.start
        return torch.cos(((tp / self.T + self.eps) / (1.0 + self.eps)) * math.pi / 2.0).clamp_min(0.0) ** (
            2.0 * self.tau
        )

    def betas(self) -> Tensor:
        """``(T,)`` betas (differentiable in the parameters); feed ``DDPMScheduler(trained_betas=...)``."""
        f = self._f()
        return torch.clamp(1.0 - f[1:] / f[:-1].clamp_min(1e-300), 0.0, self.max_beta)

    def alphas_cumprod(self) -> Tensor:
        """``(T + 1,)``: ``ᾱ_0 = 1`` then ``Π (1 - β)``, consistent with :meth:`betas` (clip included)."""
        return torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1.0 - self.betas(), 0)])

    @torch.no_grad()
    def clamp_(self) -> LearnableCosineSchedule:
        """Project onto the feasible set (the reference's clamps), in place."""
        self.start.clamp_(0.0, 1.0)
        self.end.clamp_(min(float(self.start) + 1e-3, 1.0), 1.0)
        if float(self.end) <= float(self.start):
            self.start.copy_(self.end - 1e-3)
        self.tau.clamp_(min=1.0)
        self.eps.clamp_(0.0, 1.0)
        return self

    def check_terminal(self) -> float:
        """``ᾱ_T``; warns when it is above 0.1 (the prior is then far from N(0, I))."""
        ab = float(self.alphas_cumprod()[-1].detach())
        if ab > 0.1:
            warnings.warn(
                f"the schedule's alpha_bar_T is {ab:.3g} > 0.1: x_T is not close to N(0, I)",
                RuntimeWarning,
                stacklevel=2,
            )
        return ab


def zo_gradient(
    f: Callable[[Tensor], float],
    psi: Tensor,
    delta: float = 0.01,
    n_dirs: int = 1,
    mode: Literal["one", "two"] = "two",
    f_prev: float | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> Tensor:
    """Zeroth-order gradient of ``f`` at ``psi`` by Gaussian smoothing: ``u ~ N(0, I)``,
    ``[f(ψ + δu) - f(ψ - δu)]/(2δ) u`` (``mode="two"``) or ``[f(ψ + δu) - f_prev]/δ u`` (``"one"``, reusing
    the previous value), averaged over ``n_dirs`` directions. Unbiased for the smoothed ``f``."""
    if not callable(f):
        raise TypeError(f"f must be callable (psi) -> float, got {type(f).__name__}")
    psi = check_tensor(psi, "psi", ndim=1, non_empty=True, max_abs=1e15)
    delta = check_float(delta, "delta", low=0.0, low_open=True)
    n_dirs = check_int(n_dirs, "n_dirs", low=1)
    mode = check_choice(mode, "mode", ("one", "two"))
    if mode == "one":
        if f_prev is None:
            raise ValueError("f_prev must be given (the previous value of f) when mode='one'")
        f_prev = check_float(f_prev, "f_prev")
    g = make_generator(seed, generator)
    out = torch.zeros_like(psi)
    for _ in range(n_dirs):
        u = torch.randn(psi.shape, generator=g, dtype=psi.dtype)
        fp = float(f(psi + delta * u))
        fm = float(f(psi - delta * u)) if mode == "two" else None
        if not math.isfinite(fp) or (fm is not None and not math.isfinite(fm)):
            raise ValueError(f"f must return finite values, got {fp} / {fm}")
        coef = (fp - fm) / (2 * delta) if fm is not None else (fp - f_prev) / delta
        out = out + coef * u
    return out / n_dirs


def _eps_call(model: Callable[..., Any], x: Tensor, t: Tensor) -> Tensor:
    out = model(x, t)
    return out.sample if hasattr(out, "sample") else out


@torch.no_grad()
def ddim_sample(
    model: Callable[[Tensor, Tensor], Tensor],
    alphas_cumprod: Tensor,
    x_T: Tensor,
    n_steps: int = 50,
    clip_x0: float | None = None,
) -> Tensor:
    """Deterministic DDIM (η = 0) from ``x_T`` with an ε-model ``model(x, t_int) -> ε̂`` and ``ᾱ`` of shape
    ``(T + 1,)`` (``ᾱ_0 = 1``) on ``n_steps`` evenly spaced steps of ``1..T``; ``clip_x0`` clamps the
    predicted ``x₀`` to ``[-clip_x0, clip_x0]`` (as image DDIM clamps to [-1, 1]; ``ᾱ_T ≈ 0`` makes the first
    prediction ill-conditioned)."""
    if not callable(model):
        raise TypeError(f"model must be callable (x, t) -> eps, got {type(model).__name__}")
    x = check_tensor(x_T, "x_T", non_empty=True, max_abs=1e6)  # a Gaussian latent
    if x.dim() < 2:
        raise ValueError(f"x_T must have shape (N, *event) with at least 2 dims, got {tuple(x.shape)}")
    ab = check_tensor(alphas_cumprod, "alphas_cumprod", ndim=1)
    if len(ab) < 2:
        raise ValueError(f"alphas_cumprod must have shape (T + 1,) with T >= 1, got {tuple(ab.shape)}")
    ab = ab.to(x.dtype)
    if bool((ab < 0).any()) or bool((ab > 1).any()):
        raise ValueError(
            f"alphas_cumprod must lie in [0, 1], got min {float(ab.min()):g}, max {float(ab.max()):g}"
        )
    n_steps = check_int(n_steps, "n_steps", low=1)
    if clip_x0 is not None:
        clip_x0 = check_float(clip_x0, "clip_x0", low=0.0, low_open=True)
    T = len(ab) - 1
    steps = sorted({round(float(v)) for v in np.linspace(T, 1, min(n_steps, T))}, reverse=True)
    for i, t in enumerate(steps):
        prev = steps[i + 1] if i + 1 < len(steps) else 0
        try:
            eps = _eps_call(model, x, torch.full((len(x),), t, dtype=torch.long))
        except RuntimeError as err:
            raise ValueError(f"model failed on x_T-shaped input {tuple(x.shape)}: {err}") from err
        if not isinstance(eps, Tensor) or eps.shape != x.shape:
            got = tuple(eps.shape) if isinstance(eps, Tensor) else type(eps).__name__
            raise ValueError(f"model must return eps of x_T's shape {tuple(x.shape)}, got {got}")
        a_t, a_p = ab[t], ab[prev]
        x0 = (x - (1 - a_t).sqrt() * eps) / a_t.sqrt().clamp_min(1e-8)
        if clip_x0 is not None:
            x0 = x0.clamp(-clip_x0, clip_x0)
        x = a_p.sqrt() * x0 + (1 - a_p).sqrt() * eps
    return x


class NoiseScheduleBilevel:
    """Penalty bilevel optimisation of a learnable noise schedule ψ (paper §3.2, ``train_mnist_bilevel_ZO``).

    Two ε-networks from ``make_model()``: ``θ_y`` minimises the denoising loss ``g(ψ, θ)`` (ε-MSE with
    ``t ~ U{1..T}``), ``θ_z`` minimises ``f/γ + g`` with a zeroth-order ``∇_θ f`` (:func:`zo_gradient` over
    its flattened parameters). The schedule moves along ``ZO∇_ψ f(ψ, θ_z)/γ + ∇_ψ g(ψ, θ_z) - ∇_ψ g(ψ, θ_y)``
    (Adam, the reference's per-parameter rates ``lr_schedule`` for start, end, τ, ε), then is clamped.
    ``upper_metric(model, schedule) -> float`` scores generated samples (e.g. :func:`sliced_wasserstein` of
    :func:`ddim_sample` outputs to held-out data). The first ``warmup`` steps train ``θ_y`` only, then ``θ_z``
    starts from a copy of it. The ψ and θ draws of one step share their random numbers (``t``, ``ε``).
    """

    def __init__(
        self,
        make_model: Callable[[], nn.Module],
        schedule: LearnableCosineSchedule,
        upper_metric: Callable[[nn.Module, LearnableCosineSchedule], float],
        data: Tensor,
        gamma: float = 1.0,
        delta: float = 0.01,
        zo: Literal["one", "two"] = "two",
        inner_y: int = 1,
        inner_z: int = 1,
        lr: float = 1e-3,
        lr_schedule: Sequence[float] = (0.01, 0.01, 0.1, 0.001),
        batch_size: int = 128,
        warmup: int = 0,
        zo_theta: bool = True,
        seed: int = 0,
    ) -> None:
        if not callable(make_model):
            raise TypeError(f"make_model must be callable () -> nn.Module, got {type(make_model).__name__}")
        if not isinstance(schedule, LearnableCosineSchedule):
            raise TypeError(f"schedule must be a LearnableCosineSchedule, got {type(schedule).__name__}")
        if not callable(upper_metric):
            raise TypeError(
                f"upper_metric must be callable (model, schedule) -> float, got {type(upper_metric).__name__}"
            )
        data = check_tensor(data, "data", ndim=2, non_empty=True, max_abs=1e6)
        if len(data) < 2:
            raise ValueError(f"data must have shape (N, D) with N >= 2, got {tuple(data.shape)}")
        if float(data.std()) == 0.0:
            raise ValueError("data must not be constant, got std=0.0")
        self.gamma = check_float(gamma, "gamma", low=0.0, low_open=True)
        self.delta = check_float(delta, "delta", low=0.0, low_open=True)
        self.zo = check_choice(zo, "zo", ("one", "two"))
        self.inner_y, self.inner_z = (
            check_int(inner_y, "inner_y", low=1),
            check_int(inner_z, "inner_z", low=1),
        )
        lr = check_float(lr, "lr", low=0.0, low_open=True)
        if len(lr_schedule) != 4:
            raise ValueError(f"lr_schedule must hold 4 rates (start, end, tau, eps), got {len(lr_schedule)}")
        lrs = [check_float(v, f"lr_schedule[{i}]", low=0.0) for i, v in enumerate(lr_schedule)]
        self.batch_size = check_int(batch_size, "batch_size", low=2)
        self.warmup = check_int(warmup, "warmup", low=0)
        self.zo_theta = bool(zo_theta)
        schedule.check_terminal()  # warns when alpha_bar_T > 0.1
        self.schedule, self.upper_metric, self.data = schedule, upper_metric, data.double()
        with isolated_rng(check_int(seed, "seed", low=0)):
            self.model_y = make_model()
        if not isinstance(self.model_y, nn.Module):
            raise TypeError(f"make_model must return an nn.Module, got {type(self.model_y).__name__}")
        self.model_y.double()
        self.model_z = copy.deepcopy(self.model_y)
        self.opt_y = Adam(self.model_y.parameters(), lr=lr)
        self.opt_z = Adam(self.model_z.parameters(), lr=lr)
        self.opt_psi = [
            Adam([p], lr=r) if r > 0 else None for p, r in zip(schedule.params(), lrs, strict=True)
        ]
        self.gen = make_generator(seed + 1)
        self.iteration = 0
        self._f_prev: dict[str, float] = {}
        self.history: list[dict[str, float]] = []

    def denoising_loss(
        self, model: nn.Module, x0: Tensor, t: Tensor, eps: Tensor, alphas_cumprod: Tensor
    ) -> Tensor:
        """The lower objective ``g``: ``mean ‖ε̂(√ᾱ_t x₀ + √(1-ᾱ_t) ε, t) - ε‖²`` (differentiable in ψ via ᾱ)."""
        ab = alphas_cumprod[t][:, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        return ((_eps_call(model, xt, t) - eps) ** 2).sum(1).mean()

    def _draw(self) -> tuple[Tensor, Tensor, Tensor]:
        idx = torch.randint(len(self.data), (self.batch_size,), generator=self.gen)
        t = torch.randint(1, self.schedule.T + 1, (self.batch_size,), generator=self.gen)
        eps = torch.randn(self.batch_size, self.data.shape[1], generator=self.gen, dtype=torch.float64)
        return self.data[idx], t, eps

    def _metric(self, model: nn.Module) -> float:
        v = float(self.upper_metric(model, self.schedule))
        if not math.isfinite(v):
            raise ValueError(f"upper_metric must return a finite float, got {v}")
        return v

    def _zo(self, key: str, fn: Callable[[Tensor], float], psi: Tensor) -> Tensor:
        prev = self._f_prev.get(key)
        if self.zo == "one" and prev is None:
            prev = fn(psi)
        g = zo_gradient(fn, psi, self.delta, 1, self.zo, prev, generator=self.gen)
        if self.zo == "one":
            self._f_prev[key] = fn(psi)
        return g

    def _theta_zo(self) -> None:
        params = [p for p in self.model_z.parameters() if p.requires_grad]
        flat = torch.nn.utils.parameters_to_vector(params).detach()

        def f_theta(v: Tensor) -> float:
            torch.nn.utils.vector_to_parameters(v, params)
            return self._metric(self.model_z)

        g = self._zo("theta", f_theta, flat)
        torch.nn.utils.vector_to_parameters(flat, params)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = p.grad + g[offset : offset + n].reshape(p.shape) / self.gamma
            offset += n

    def step(self) -> dict[str, float]:
        """One outer step: ``inner_y`` steps on θ_y, ``inner_z`` on θ_z, one on ψ (after warm-up)."""
        ab = self.schedule.alphas_cumprod().detach()
        for _ in range(self.inner_y):
            x0, t, eps = self._draw()
            self.opt_y.zero_grad()
            self.denoising_loss(self.model_y, x0, t, eps, ab).backward()
            self.opt_y.step()
        rec: dict[str, float] = {"iteration": float(self.iteration)}
        if self.iteration < self.warmup:
            self.iteration += 1
            if self.iteration == self.warmup:
                self.model_z.load_state_dict(self.model_y.state_dict())
            self.history.append(rec)
            return rec
        for _ in range(self.inner_z):
            x0, t, eps = self._draw()
            self.opt_z.zero_grad()
            self.denoising_loss(self.model_z, x0, t, eps, ab).backward()
            if self.zo_theta:
                self._theta_zo()
            self.opt_z.step()
        grad = self.hypergradient()
        for opt, p, gp in zip(self.opt_psi, self.schedule.params(), grad, strict=True):
            if opt is not None:
                opt.step([gp.clone().reshape(p.shape)])
        self.schedule.clamp_()
        self.iteration += 1
        rec.update(
            {
                k: float(p.detach())
                for k, p in zip(("start", "end", "tau", "eps"), self.schedule.params(), strict=True)
            }
        )
        rec.update({f"grad_{k}": float(v) for k, v in zip(("start", "end", "tau", "eps"), grad, strict=True)})
        self.history.append(rec)
        return rec

    def hypergradient(self) -> Tensor:
        """``(4,)``: ``ZO∇_ψ f(ψ, θ_z)/γ + ∇_ψ g(ψ, θ_z) - ∇_ψ g(ψ, θ_y)`` on one shared batch."""
        params = self.schedule.params()
        x0, t, eps = self._draw()
        grads = []
        for model in (self.model_z, self.model_y):
            loss = self.denoising_loss(model, x0, t, eps, self.schedule.alphas_cumprod())
            grads.append(torch.stack(torch.autograd.grad(loss, params)))
        psi0 = torch.stack([p.detach().clone() for p in params])

        def f_psi(v: Tensor) -> float:
            with torch.no_grad():
                for p, val in zip(params, v, strict=True):
                    p.copy_(val)
                self.schedule.clamp_()
            return self._metric(self.model_z)

        zo = self._zo("psi", f_psi, psi0)
        with torch.no_grad():
            for p, val in zip(params, psi0, strict=True):
                p.copy_(val)
        return zo / self.gamma + grads[0] - grads[1]

    def run(self, n_steps: int) -> list[dict[str, float]]:
        """``n_steps`` outer steps; returns their records."""
        n_steps = check_int(n_steps, "n_steps", low=1)
        return [self.step() for _ in range(n_steps)]


# ----------------------------------------------------------------------------------- diffusers adapter


class RewardGuidedDenoiser(nn.Module):
    """Wraps an ε-prediction network so that its implied score gains reward guidance:
    ``ε'(x, t) = ε(x, t) - √(1 - ᾱ_t) h_t(x)`` (score ``s = -ε/√(1-ᾱ)``, so ``s' = s + h``), with
    ``h = ∇r(x)/λ`` (the reference's guidance strength base/λ; ``reward`` takes samples of the model's shape
    ``(N, ...)``) or a custom ``guidance(x, t) -> (N, ...)``.
    It runs under any diffusers scheduler (``DDPMScheduler``, ``DDIMScheduler``) in place of the UNet:
    ``alphas_cumprod`` is the scheduler's ``(T,)`` tensor indexed by the integer timestep. Returns what the
    wrapped model returns (a tensor, or an output object with ``.sample`` replaced)."""

    def __init__(
        self,
        model: Callable[..., Any],
        alphas_cumprod: Tensor,
        reward: RewardFn | None = None,
        lam: float = 1.0,
        guidance: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__()
        if not callable(model):
            raise TypeError(
                f"model must be callable (sample, timestep, ...) -> eps, got {type(model).__name__}"
            )
        if (reward is None) == (guidance is None):
            raise ValueError(
                "give exactly one of reward (x -> (N,) rewards) and guidance ((x, t) -> score term)"
            )
        if reward is not None:
            if not callable(reward):
                raise TypeError(f"reward must be callable (x) -> (N,) rewards, got {type(reward).__name__}")
        if guidance is not None:
            if not callable(guidance):
                raise TypeError(
                    f"guidance must be callable (x, t) -> score term, got {type(guidance).__name__}"
                )
        ab = check_tensor(torch.as_tensor(alphas_cumprod).reshape(-1), "alphas_cumprod", non_empty=True)
        if bool((ab <= 0).any()) or bool((ab > 1).any()):
            raise ValueError("alphas_cumprod must lie in (0, 1]")
        self.model = model
        self.register_buffer("alphas_cumprod", ab.double())
        self.reward, self.guidance = reward, guidance
        self.lam = check_float(lam, "lam", low=1e-8, high=1e8)

    def forward(self, sample: Tensor, timestep: Tensor | int, *args: Any, **kwargs: Any) -> Any:
        sample = check_tensor(sample, "sample", non_empty=True, max_abs=1e15)
        if sample.dim() < 2:
            raise ValueError(
                f"sample must have shape (N, *event) with at least 2 dims, got {tuple(sample.shape)}"
            )
        out = self.model(sample, timestep, *args, **kwargs)
        eps = out.sample if hasattr(out, "sample") else out
        t = torch.as_tensor(timestep, device=sample.device).reshape(-1)
        if t.numel() == 1:
            t = t.expand(len(sample))
        sig = (1.0 - self.alphas_cumprod.to(sample.device)[t.long()]).sqrt().to(sample.dtype)
        if self.guidance is not None:
            h = self.guidance(sample, t)
        else:
            flat = sample.reshape(len(sample), -1)
            h = (
                _reward_grad(lambda z: self.reward(z.reshape(sample.shape)), flat).reshape(sample.shape)
                / self.lam
            )
        new = eps - sig.reshape(-1, *([1] * (sample.dim() - 1))) * h.to(sample.dtype)
        if hasattr(out, "sample"):
            return type(out)(sample=new)
        return new
