"""VCT: Training Consistency Models with Variational Noise Coupling — ICML 2025, P37: iCT with a learned coupling.

Consistency training (CT) pairs every data point with independent noise; VCT lets a small encoder
``q_φ(ε | x) = N(μ_φ(x), diag σ_φ(x)²)`` *emit* the corrupting noise, with a VAE-style KL to ``N(0, I)`` so
that one-step sampling from the prior still works.

Silvestri, Ambrogioni, Lai, Takida, Mitsufuji, ICML 2025 (arXiv 2502.18197; official code ``sony/vct``).

*Kernels* (``t`` plays the role of σ): :class:`VEKernel` ``x_t = x + t ε`` and :class:`LinearKernel`
(the reference's ``conditional_ot``, a flow-matching interpolation) ``x_t = (1 - t/σ_max) x + t ε``, each
with the boundary-condition scalings ``(c_in, c_skip, c_out)`` so that ``D(x, σ_min) = x`` exactly.

*Consistency function* (:class:`ConsistencyModel`): ``D(x_t, t) = c_skip x_t + c_out F_θ(c_in x_t, ln(t)/4)``
for any EDM-style network ``F(x, c_noise, class_labels)`` (:class:`ToyMLP` for vectors,
:class:`DiffusersUNetNet` for a diffusers ``UNet2DModel``).

*Training* (:class:`ImprovedConsistencyTraining`, the iCT recipe): the exponential discretisation
curriculum ``N(k) = min(s0 2^⌊k/K'⌋, s1) + 1``, Karras σ grid (ρ = 7), lognormal index sampling by erf
differences, pseudo-Huber loss ``sqrt(Δ² + c²) - c`` (``c = 0.00054 √d``) weighted by ``1/(σ_{i+1} - σ_i)``,
the stop-gradient target sharing the student's dropout masks, and for ``coupling='vae'`` the KL weighted
by ``kl_scale / (σ_{N-1} - σ_{N-2})``. Baselines: ``'independent'`` and minibatch ``'ot'`` coupling
(:func:`ot_coupling`, an exact assignment).

*Sampling* (:func:`consistency_sample`; also ``sample``): ``x̂ = D(σ_max z, σ_max)`` from the prior; each further step re-noises ``x̂`` to
a mid time with the encoder's noise (the prior's when no encoder is given) and denoises again.
"""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_choice, check_float, check_int, check_tensor
from icml25.kernels.optim import Adam
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "ConsistencyModel",
    "DiffusersUNetNet",
    "ImprovedConsistencyTraining",
    "LinearKernel",
    "NoiseEncoder",
    "ToyMLP",
    "VEKernel",
    "consistency_sample",
    "gaussian_kl",
    "karras_sigmas",
    "ot_coupling",
    "pseudo_huber",
]

COUPLINGS = ("independent", "ot", "vae")
KERNELS = ("ve", "linear")


# Generic rules come from icml25.kernels.checks; the helpers below add only what is specific to consistency
# models' arguments (a noise range, a batch of states, per-sample noise levels).


def _sigmas(sigma_min: object, sigma_max: object, sigma_data: object) -> tuple[float, float, float]:
    lo = check_float(sigma_min, "sigma_min", low=0.0, low_open=True)
    hi = check_float(sigma_max, "sigma_max", low=0.0, low_open=True)
    sd = check_float(sigma_data, "sigma_data", low=0.0, low_open=True)
    if lo >= hi:
        raise ValueError(f"sigma_min must be < sigma_max, got sigma_min={lo:g} >= sigma_max={hi:g}")
    return lo, hi, sd


def _state(x: object, name: str, limit: float = 1e6) -> Tensor:
    """A finite, non-empty float tensor ``(N, *event)`` with ``max |x| <= limit`` (squares must not overflow)."""
    x = check_tensor(x, name, non_empty=True, max_abs=limit)
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (N, *event) with at least 2 dims, got {tuple(x.shape)}")
    return x


def _times(t: object, x: Tensor, name: str = "t") -> Tensor:
    """A time: a float, or a finite tensor of shape () or (N,) matching ``x``."""
    if isinstance(t, Tensor):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a float or a floating-point tensor, got dtype {t.dtype}")
        if t.dim() > 1 or (t.dim() == 1 and t.shape[0] != x.shape[0]):
            raise ValueError(f"{name} must be a scalar or have shape ({x.shape[0]},), got {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise ValueError(f"{name} must be finite and >= 0, got {t.tolist()}")
        return t
    return torch.tensor(check_float(t, name, low=0.0))


def _bcast(t: Tensor, x: Tensor) -> Tensor:
    """``t`` of shape ``(N,)`` (or scalar) as ``(N, 1, ..., 1)`` against ``x``."""
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    if t.dim() == 0:
        t = t.expand(x.shape[0])
    return t.reshape(-1, *([1] * (x.dim() - 1)))


# ------------------------------------------------------------------------------------------------ kernels


class VEKernel:
    """Variance-exploding kernel ``x_t = x + t ε`` and its EDM scalings (``boundary=True``: ``D(x, σ_min) = x``)."""

    name = "ve"

    def __init__(self, sigma_min: float = 0.002, sigma_max: float = 80.0, sigma_data: float = 0.5) -> None:
        self.sigma_min, self.sigma_max, self.sigma_data = _sigmas(sigma_min, sigma_max, sigma_data)

    def _args(self, x: object, t: object, eps: object) -> tuple[Tensor, Tensor, Tensor]:
        x, eps = _state(x, "x"), _state(eps, "eps")
        if x.shape != eps.shape:
            raise ValueError(
                f"x and eps must have the same shape, got {tuple(x.shape)} and {tuple(eps.shape)}"
            )
        return x, _bcast(_times(t, x), x), eps

    def forward(self, x: Tensor, t: Tensor | float, eps: Tensor) -> Tensor:
        x, t, eps = self._args(x, t, eps)
        return x + t * eps

    __call__ = forward

    def scalings(self, t: Tensor, boundary: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        sd, s0 = self.sigma_data, (self.sigma_min if boundary else 0.0)
        c_in = 1.0 / torch.sqrt(sd**2 + t**2)
        c_skip = sd**2 / ((t - s0) ** 2 + sd**2)
        c_out = (t - s0) * sd * c_in
        return c_in, c_skip, c_out


class LinearKernel(VEKernel):
    """Linear interpolation ("cot") ``x_t = (1 - t/σ_max) x + t ε``; ``t > σ_max`` is clamped (warned once).

    Scalings as ``sony/vct`` ``kernels/conditional_ot.py``: ``c_in`` uses ``1 - t/σ_max`` and the boundary
    ``c_skip`` uses ``1 - (t - σ_min)/(σ_max - σ_min)``."""

    name = "linear"

    def __init__(self, sigma_min: float = 0.002, sigma_max: float = 80.0, sigma_data: float = 0.5) -> None:
        super().__init__(sigma_min, sigma_max, sigma_data)
        self._warned = False

    def _clamp(self, t: Tensor) -> Tensor:
        if bool((t > self.sigma_max).any()):
            if not self._warned:
                warnings.warn(
                    f"LinearKernel: t > sigma_max={self.sigma_max:g} is clamped to sigma_max", stacklevel=3
                )
                self._warned = True
            t = t.clamp(max=self.sigma_max)
        return t

    def forward(self, x: Tensor, t: Tensor | float, eps: Tensor) -> Tensor:
        x, t, eps = self._args(x, t, eps)
        t = self._clamp(t)
        return (1 - t / self.sigma_max) * x + t * eps

    __call__ = forward

    def scalings(self, t: Tensor, boundary: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        t = self._clamp(t)
        sd, lo, hi = self.sigma_data, self.sigma_min, self.sigma_max
        c_in = 1.0 / torch.sqrt(sd**2 * (1 - t / hi) ** 2 + t**2)
        if boundary:
            a = 1 - (t - lo) / (hi - lo)
            c_skip = sd**2 * a / ((t - lo) ** 2 + sd**2 * a**2)
            c_out = (t - lo) * sd * c_in
        else:
            a = 1 - t / hi
            c_skip = sd**2 * a / (t**2 + sd**2 * a**2)
            c_out = t * sd * c_in
        return c_in, c_skip, c_out


def _make_kernel(kernel: object, sigma_min: float, sigma_max: float, sigma_data: float) -> VEKernel:
    if isinstance(kernel, VEKernel):
        return kernel
    name = check_choice(kernel, "kernel", KERNELS)
    return (VEKernel if name == "ve" else LinearKernel)(sigma_min, sigma_max, sigma_data)


# ------------------------------------------------------------------------------------------------ networks


class ToyMLP(nn.Module):
    """EDM-style vector network ``F(x, c_noise, class_labels)``: an MLP (SiLU) on ``[x, sin/cos(2^k π c)]``."""

    def __init__(self, dim: int = 2, hidden: int = 256, depth: int = 3, n_freq: int = 8) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim", low=1)
        check_int(hidden, "hidden", low=1)
        check_int(depth, "depth", low=1)
        self.register_buffer("freqs", math.pi * 2.0 ** torch.arange(check_int(n_freq, "n_freq", low=1)))
        layers: list[nn.Module] = []
        width = dim + 2 * n_freq
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        layers.append(nn.Linear(width, dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor, c_noise: Tensor, class_labels: Tensor | None = None) -> Tensor:
        x = _state(x, "x")
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (N, {self.dim}), got {tuple(x.shape)}")
        if not isinstance(c_noise, Tensor) or not bool(torch.isfinite(c_noise).all()):
            raise ValueError("c_noise must be a finite tensor of shape () or (N,)")
        z = _bcast(c_noise, x[:, :1]).to(x.dtype) * self.freqs.to(x.dtype)
        return self.net(torch.cat([x, torch.sin(z), torch.cos(z)], 1))


class DiffusersUNetNet(nn.Module):
    """Wrap a diffusers ``UNet2DModel`` as ``F(x, c_noise, class_labels)`` (``c_noise`` as its timestep)."""

    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        if not callable(unet):
            raise TypeError(f"unet must be a diffusers UNet2DModel (callable), got {type(unet).__name__}")
        self.unet = unet

    def forward(self, x: Tensor, c_noise: Tensor, class_labels: Tensor | None = None) -> Tensor:
        t = _bcast(c_noise, x).reshape(-1)
        return self.unet(x, t, class_labels=class_labels).sample


class NoiseEncoder(nn.Module):
    """``q_φ(ε | x) = N(μ, diag σ²)``: a network ``E(x/σ_d, 0, labels)`` with ``2·C`` output channels (dim 1),
    split into ``μ`` and ``s``, ``σ = softplus(s)`` (``sony/vct`` ``models/cm_base.py``)."""

    def __init__(self, net: nn.Module, sigma_data: float = 0.5) -> None:
        super().__init__()
        if not callable(net):
            raise TypeError(f"net must be an nn.Module F(x, c_noise, labels), got {type(net).__name__}")
        self.net = net
        self.sigma_data = check_float(sigma_data, "sigma_data", low=0.0, low_open=True)
        self.dim: int | None = None  # the vector dimension of an MLP encoder (checked), else None

    def _valid_input(self, x: object, name: str) -> Tensor:
        x = _state(x, name)
        if self.dim is not None and (x.dim() != 2 or x.shape[1] != self.dim):
            raise ValueError(
                f"{name} must have shape (N, {self.dim}) for this MLP encoder, got {tuple(x.shape)}"
            )
        return x

    @classmethod
    def mlp(cls, dim: int = 2, hidden: int = 64, depth: int = 2, sigma_data: float = 0.5) -> NoiseEncoder:
        """The toy encoder ``dim → hidden^depth → 2·dim`` (SiLU)."""
        check_int(dim, "dim", low=1)
        layers: list[nn.Module] = []
        width = dim
        for _ in range(check_int(depth, "depth", low=1)):
            layers += [nn.Linear(width, check_int(hidden, "hidden", low=1)), nn.SiLU()]
            width = hidden
        layers.append(nn.Linear(width, 2 * dim))
        enc = cls(_VectorNet(nn.Sequential(*layers)), sigma_data)
        enc.dim = dim
        return enc

    def forward(self, x: Tensor, class_labels: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x = self._valid_input(x, "x")
        out = self.net(
            x / self.sigma_data, torch.zeros(x.shape[0], dtype=x.dtype, device=x.device), class_labels
        )
        if (
            not isinstance(out, Tensor)
            or out.shape[0] != x.shape[0]
            or out.shape[1:] != (2 * x.shape[1], *x.shape[2:])
        ):
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"encoder output must have shape (N, 2*C, ...) = {(x.shape[0], 2 * x.shape[1], *x.shape[2:])} "
                f"(mu and log-scale per data channel), got {got}"
            )
        mu, s = out.chunk(2, dim=1)
        return mu, F.softplus(s)

    def noise(self, x: Tensor, generator: torch.Generator | None = None, labels: Tensor | None = None):
        """The reparameterised coupled noise ``ε = μ + σ ε₀`` and ``(μ, σ)``."""
        mu, sigma = self(x, labels)
        eps0 = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        return mu + sigma * eps0, mu, sigma


class _VectorNet(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: Tensor, c_noise: Tensor, class_labels: Tensor | None = None) -> Tensor:
        return self.body(x)


def gaussian_kl(mu: Tensor, sigma: Tensor) -> Tensor:
    """``KL(N(μ, σ²) ‖ N(0, 1))`` summed over all but the batch dim (σ + 1e-8, as the reference)."""
    mu, sigma = _state(mu, "mu"), _state(sigma, "sigma")
    if mu.shape != sigma.shape:
        raise ValueError(
            f"mu and sigma must have the same shape, got {tuple(mu.shape)} and {tuple(sigma.shape)}"
        )
    if bool((sigma < 0).any()):
        raise ValueError(f"sigma must be >= 0, got min {float(sigma.min()):g}")
    s = sigma + 1e-8
    kl = 0.5 * (mu**2 + s**2 - 1.0) - torch.log(s)
    return kl.flatten(1).sum(1)


def pseudo_huber(delta: Tensor, c: float) -> Tensor:
    """Elementwise pseudo-Huber ``sqrt(Δ² + c²) - c``."""
    delta = _state(delta, "delta", 1e15)
    c = check_float(c, "c", low=0.0, low_open=True)
    return torch.sqrt(delta**2 + c**2) - c


# ------------------------------------------------------------------------------------------------ model


class ConsistencyModel(nn.Module):
    """``D(x_t, t) = c_skip(t) x_t + c_out(t) F_θ(c_in(t) x_t, ln(t)/4, labels)`` with boundary scalings."""

    def __init__(
        self,
        net: nn.Module,
        kernel: Literal["ve", "linear"] | VEKernel = "ve",
        sigma_min: float = 0.002,
        sigma_max: float = 80.0,
        sigma_data: float = 0.5,
    ) -> None:
        super().__init__()
        if not callable(net):
            raise TypeError(f"net must be an nn.Module F(x, c_noise, labels), got {type(net).__name__}")
        self.net = net
        self.kernel = _make_kernel(kernel, *_sigmas(sigma_min, sigma_max, sigma_data))
        self.sigma_min, self.sigma_max = self.kernel.sigma_min, self.kernel.sigma_max
        self.sigma_data = self.kernel.sigma_data

    def _valid_input(self, x: object, name: str, limit: float = 1e6) -> Tensor:
        x = _state(x, name, limit)
        if isinstance(self.net, ToyMLP) and (x.dim() != 2 or x.shape[1] != self.net.dim):
            raise ValueError(
                f"{name} must have shape (N, {self.net.dim}) for this ToyMLP, got {tuple(x.shape)}"
            )
        return x

    def denoise(self, x_t: Tensor, t: Tensor | float, labels: Tensor | None = None) -> Tensor:
        x_t = self._valid_input(x_t, "x_t", 1e6 * self.sigma_max)
        t = _bcast(_times(t, x_t), x_t)
        if bool((t < self.sigma_min).any()):
            raise ValueError(f"t must be >= sigma_min={self.sigma_min:g}, got min {float(t.min()):g}")
        c_in, c_skip, c_out = self.kernel.scalings(t)
        f = self.net(c_in * x_t, (torch.log(t) / 4).reshape(-1), labels)
        return c_skip * x_t + c_out * f

    forward = denoise


# ------------------------------------------------------------------------------------------------ iCT


def karras_sigmas(n: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0) -> Tensor:
    """``σ_i = (σ_min^{1/ρ} + i/(n-1) (σ_max^{1/ρ} - σ_min^{1/ρ}))^ρ``, ``i = 0 .. n-1`` (float64)."""
    n = check_int(n, "n", low=2)
    lo, hi, _ = _sigmas(sigma_min, sigma_max, 1.0)
    rho = check_float(rho, "rho", low=0.0, low_open=True)
    r = torch.arange(n, dtype=torch.float64) / (n - 1)
    return (lo ** (1 / rho) + r * (hi ** (1 / rho) - lo ** (1 / rho))) ** rho


def ot_coupling(x: Tensor, eps: Tensor) -> Tensor:
    """Minibatch OT: the permutation ``p`` minimising ``Σ_i ‖x_i - ε_{p_i}‖²`` (exact assignment)."""
    from scipy.optimize import linear_sum_assignment

    x, eps = _state(x, "x", 1e15), _state(eps, "eps", 1e15)
    if x.shape != eps.shape:
        raise ValueError(f"x and eps must have the same shape, got {tuple(x.shape)} and {tuple(eps.shape)}")
    cost = torch.cdist(x.detach().flatten(1).double(), eps.detach().flatten(1).double()) ** 2
    _, col = linear_sum_assignment(cost.cpu().numpy())
    return torch.as_tensor(col, dtype=torch.long, device=x.device)


class ImprovedConsistencyTraining:
    """iCT with independent, minibatch-OT or variational (``'vae'``) noise coupling (``sony/vct`` ``models/ict.py``).

    Args:
        model: the :class:`ConsistencyModel` trained.
        total_steps: training steps ``K`` of the curriculum.
        coupling: ``'independent'``, ``'ot'`` or ``'vae'`` (needs ``encoder``).
        encoder: the :class:`NoiseEncoder` of ``'vae'``.
        kl_scale: KL weight before the normalisation by the last interval ``σ_{N-1} - σ_{N-2}``, ≥ 0.
        s0, s1: initial and final discretisation counts (``s0 ≤ s1``).
        rho, p_mean, p_std: Karras ρ and the lognormal of the index distribution.
        loss: ``'huber'`` (pseudo-Huber) or ``'l2'``.
        detach_encoder: stop the consistency loss's gradient into the encoder (an ablation: only the KL
            then trains it, so the coupling collapses to the prior).
    """

    def __init__(
        self,
        model: ConsistencyModel,
        total_steps: int,
        coupling: Literal["independent", "ot", "vae"] = "vae",
        encoder: NoiseEncoder | None = None,
        kl_scale: float = 30.0,
        s0: int = 10,
        s1: int = 1280,
        rho: float = 7.0,
        p_mean: float = -1.1,
        p_std: float = 2.0,
        loss: Literal["huber", "l2"] = "huber",
        detach_encoder: bool = False,
    ) -> None:
        if not isinstance(model, ConsistencyModel):
            raise TypeError(f"model must be a ConsistencyModel, got {type(model).__name__}")
        self.model = model
        self.total_steps = check_int(total_steps, "total_steps", low=1)
        self.coupling = check_choice(coupling, "coupling", COUPLINGS)
        if self.coupling == "vae" and not isinstance(encoder, NoiseEncoder):
            raise ValueError(
                f"coupling='vae' needs encoder=NoiseEncoder(...) emitting 2*C channels, got {type(encoder).__name__}"
            )
        self.encoder = encoder if self.coupling == "vae" else None
        self.kl_scale = check_float(kl_scale, "kl_scale", low=0.0)
        self.s0, self.s1 = check_int(s0, "s0", low=1), check_int(s1, "s1", low=1)
        if self.s0 > self.s1:
            raise ValueError(f"s0 must be <= s1, got s0={self.s0} > s1={self.s1}")
        self.rho = check_float(rho, "rho", low=0.0, low_open=True)
        self.p_mean = check_float(p_mean, "p_mean")
        self.p_std = check_float(p_std, "p_std", low=0.0, low_open=True)
        self.loss_type = check_choice(loss, "loss", ("huber", "l2"))
        self.detach_encoder = bool(detach_encoder)

    # ---- schedule
    def n_scales(self, step: int) -> int:
        """``N(k) = min(s0 2^⌊k/K'⌋, s1) + 1``, ``K' = ⌊K / (log2⌊s1/s0⌋ + 1)⌋``."""
        step = check_int(step, "step", low=0)
        k_prime = max(1, math.floor(self.total_steps / (math.log2(math.floor(self.s1 / self.s0)) + 1)))
        return min(self.s0 * 2 ** (step // k_prime), self.s1) + 1

    def sigmas(self, step: int) -> Tensor:
        return karras_sigmas(self.n_scales(step), self.model.sigma_min, self.model.sigma_max, self.rho)

    def index_probs(self, sigmas: Tensor) -> Tensor:
        """``P(i) ∝ erf((ln σ_{i+1} - P_mean)/(√2 P_std)) - erf((ln σ_i - P_mean)/(√2 P_std))``, i < N-1."""
        z = torch.erf((torch.log(sigmas) - self.p_mean) / (math.sqrt(2) * self.p_std))
        p = z[1:] - z[:-1]
        return p / p.sum()

    def kl_weight(self, step: int) -> float:
        s = self.sigmas(step)
        return self.kl_scale / float(s[-1] - s[-2])

    # ---- noise
    def coupled_noise(
        self, x: Tensor, generator: torch.Generator | None = None, labels: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``(ε, KL per sample)``: ``ε ~ N(0, I)``; reordered by OT; or ``μ(x) + σ(x) ε₀`` with its KL."""
        if self.coupling == "vae":
            assert self.encoder is not None
            eps, mu, sigma = self.encoder.noise(x, generator, labels)
            if self.detach_encoder:
                eps = eps.detach()
            return eps, gaussian_kl(mu, sigma)
        eps = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        if self.coupling == "ot":
            eps = eps[ot_coupling(x, eps)]
        return eps, None

    def loss(
        self, x: Tensor, step: int, labels: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        """The batch-mean iCT(-VC) loss at training step ``step`` and its parts (``'consistency'``, ``'kl'``)."""
        x = self.model._valid_input(x, "x")
        sig = self.sigmas(step).to(x.dtype)
        idx = torch.multinomial(
            self.index_probs(sig.double()), x.shape[0], replacement=True, generator=generator
        )
        t, r = sig[idx + 1], sig[idx]
        eps, kl = self.coupled_noise(x, generator, labels)
        k = self.model.kernel
        x_t, x_r = k(x, t, eps), k(x, r, eps)
        with torch.random.fork_rng(devices=[]):  # the target branch redraws the student's dropout masks
            d_t = self.model.denoise(x_t, t, labels)
        with torch.no_grad():
            d_r = self.model.denoise(x_r, r, labels)
        w = _bcast(1.0 / (t - r), x)
        diff = d_t - d_r
        if self.loss_type == "huber":
            per = pseudo_huber(diff, 0.00054 * math.sqrt(x[0].numel()))
        else:
            per = diff**2
        cons = (w * per).flatten(1).sum(1)
        total = cons.mean()
        info: dict[str, Any] = {"consistency": cons.detach(), "n_scales": len(sig), "t": t, "r": r}
        if kl is not None:
            kw = self.kl_weight(step)
            total = total + kw * kl.mean()
            info.update(kl=kl.detach(), kl_weight=kw)
        else:
            info["kl"] = torch.zeros_like(cons.detach())
        return total, info

    def parameters(self) -> list[nn.Parameter]:
        ps = list(self.model.parameters())
        if self.encoder is not None:
            ps += list(self.encoder.parameters())
        return ps

    def fit(
        self,
        data: Tensor | Callable[[int, torch.Generator], Tensor],
        batch_size: int = 512,
        lr: float = 1e-4,
        ema_decay: float = 0.9999,
        grad_clip: float = 0.0,
        seed: int = 0,
        callback: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> ConsistencyModel:
        """Train ``total_steps`` steps of Adam on θ (and φ), minibatches drawn from ``data`` (a tensor, sampled
        with replacement, or ``fn(batch_size, generator)``); returns the EMA model (also ``self.ema``)."""
        if isinstance(data, Tensor):
            data = self.model._valid_input(data, "data")
            if self.encoder is not None:
                self.encoder._valid_input(data, "data")
        elif not callable(data):
            raise TypeError(
                f"data must be a tensor (N, *event) or a callable (n, generator), got {type(data).__name__}"
            )
        batch_size = check_int(batch_size, "batch_size", low=1)
        lr = check_float(lr, "lr", low=0.0, low_open=True)
        ema_decay = check_float(ema_decay, "ema_decay", low=0.0)
        if ema_decay >= 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay:g}")
        grad_clip = check_float(grad_clip, "grad_clip", low=0.0)
        g = make_generator(seed)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        params = self.parameters()
        opt = Adam(params, lr=lr)
        self.history: list[dict[str, float]] = []
        with isolated_rng(seed):
            for step in range(self.total_steps):
                if isinstance(data, Tensor):
                    x = data[torch.randint(len(data), (batch_size,), generator=g)]
                else:
                    x = data(batch_size, g)
                loss, info = self.loss(x, step, generator=g)
                opt.zero_grad()
                loss.backward()
                if grad_clip > 0:
                    nn.utils.clip_grad_norm_(params, grad_clip)
                opt.step()
                with torch.no_grad():
                    for pe, pm in zip(self.ema.parameters(), self.model.parameters(), strict=True):
                        pe.lerp_(pm, 1.0 - ema_decay)
                rec = {"loss": float(loss.detach()), "consistency": float(info["consistency"].mean()),
                       "kl": float(info["kl"].mean())}  # fmt: skip
                self.history.append(rec)
                if callback is not None:
                    callback(step, info)
        return self.ema


# ------------------------------------------------------------------------------------------------ sampling


@torch.no_grad()
def consistency_sample(
    model: ConsistencyModel,
    shape: Sequence[int],
    steps: int = 1,
    mid_t: Sequence[float] = (0.821,),
    encoder: NoiseEncoder | None = None,
    generator: torch.Generator | None = None,
    labels: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    coupling: Literal["independent", "ot"] = "independent",
) -> Tensor:
    """Consistency sampling: ``x̂ = D(σ_max z, σ_max)`` (the prior), then for each of the first ``steps - 1``
    times of ``mid_t`` re-noise ``x̂`` with the encoder's noise ``μ(x̂) + σ(x̂) ε₀`` (or ``N(0, I)`` without an
    encoder; ``coupling='ot'``: fresh noise reordered by :func:`ot_coupling` against ``x̂``, as the reference's
    OT baseline) and denoise again."""
    if not isinstance(model, ConsistencyModel):
        raise TypeError(f"model must be a ConsistencyModel, got {type(model).__name__}")
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(check_int(s, "shape", low=1) for s in shape)
    steps = check_int(steps, "steps", low=1)
    ts = [check_float(v, "mid_t") for v in mid_t]
    if any(not model.sigma_min < v < model.sigma_max for v in ts):
        raise ValueError(
            f"mid_t must lie in (sigma_min, sigma_max) = ({model.sigma_min:g}, {model.sigma_max:g}), got {ts}"
        )
    if any(b >= a for a, b in itertools.pairwise(ts)):
        raise ValueError(f"mid_t must be strictly decreasing, got {ts}")
    if steps - 1 > len(ts):
        raise ValueError(f"steps must be <= len(mid_t) + 1 = {len(ts) + 1}, got {steps}")
    coupling = check_choice(coupling, "coupling", ("independent", "ot"))
    if encoder is not None and not isinstance(encoder, NoiseEncoder):
        raise TypeError(f"encoder must be a NoiseEncoder or None, got {type(encoder).__name__}")
    g = make_generator(None, generator)
    z = torch.randn(shape, generator=g, dtype=dtype)
    k = model.kernel
    x_hat = model.denoise(k(torch.zeros_like(z), model.sigma_max, z), model.sigma_max, labels)
    for t in ts[: steps - 1]:
        if encoder is not None:
            eps = encoder.noise(x_hat, g, labels)[0]
        else:
            eps = torch.randn(shape, generator=g, dtype=dtype)
            if coupling == "ot":
                eps = eps[ot_coupling(x_hat, eps)]
        x_hat = model.denoise(k(x_hat, t, eps), t, labels)
    return x_hat


sample = consistency_sample
"""Alias of :func:`consistency_sample`."""
