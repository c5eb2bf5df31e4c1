"""Thermalizer: Stable autoregressive neural emulation of spatiotemporal chaos — ICML 2025, P02: models, training, rollouts.

Pedersen, Zanna & Bruna (arXiv 2503.18731; code ``Chris-Pedersen/thermalizer``). An autoregressive
emulator ``x_{n+1} = x_n + f_θ(x_n)`` of a chaotic system drifts off the invariant measure μ as small
errors compound, and eventually blows up. A *thermalizer* — a DDPM trained on clean snapshots of μ, whose
network also classifies the noise level of its input — is run alongside the emulator: after every step
the classifier estimates how far the state is from μ, expressed as a diffusion level k̂; when k̂ exceeds
``s_init`` the state is forward-diffused to level k̂ and pulled back to level ``s_stop`` by k̂ − s_stop
ancestral reverse steps. The two models are trained independently; the thermalizer is used only at
inference, so any ``nn.Module`` emulator can be wrapped.

Conventions (shared with the reference code): levels are ``k = 0..T-1``; with the cosine schedule
``f(t) = cos²(((t/T + s)/(1 + s))·π/2)``, ``β_k = min(1 − f(k+1)/f(k), 0.999)`` and
``ᾱ_k = Π_{j≤k}(1 − β_j)``, so level 0 already carries a little noise. A reverse step *at level i* maps
``x_i → x_{i−1}`` with the posterior ``q(x_{i−1} | x_i, x̂_0(ε̂))``; the step at i = 0 returns the
clean estimate (no noise).

Shapes: states are ``(B, *event)`` (e.g. ``(B, K)`` for Lorenz-96, ``(B, N)`` for 1D KS); levels are
``(B,)`` int64. Both models take states in physical units and normalise internally by the training data's
``field_mean`` / ``field_std`` (stored as buffers by ``fit``).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.generative_models.systems import energy_spectrum
from icml25.kernels.checks import check_float, check_int
from icml25.kernels.experiment import progress
from icml25.kernels.rng import make_generator

__all__ = [
    "MLP",
    "ConvLevelHead1d",
    "LevelMLP",
    "PeriodicConvNet1d",
    "ResidualEmulator",
    "RolloutResult",
    "SpectralLevelHead1d",
    "Thermalizer",
    "choose_levels",
    "cosine_beta_schedule",
    "periodic_symmetry_augment",
    "select_levels",
    "spectral_reference",
    "spectrum_rmse",
    "stability_band",
    "stable_mask",
    "thermalized_rollout",
]


# ----------------------------------------------------------------------------------------------------------
# Noise schedule
# ----------------------------------------------------------------------------------------------------------


def cosine_beta_schedule(T: int, s: float = 0.008, max_beta: float = 0.999) -> Tensor:
    """Cosine schedule of Nichol & Dhariwal (2021), as used by the Thermalizer.

    Args:
        T: number of noise levels.
        s: offset that keeps β small near level 0.
        max_beta: clip of β (prevents the singular β = 1 at the last level).

    Returns:
        betas, float64 tensor of shape ``(T,)`` with ``β_k = min(1 − f(k+1)/f(k), max_beta)``.
    """
    if isinstance(T, bool) or not isinstance(T, int) or T < 2:
        raise ValueError(f"T must be an int >= 2, got {T!r}")
    for name, v, hi in (("s", s, math.inf), ("max_beta", max_beta, 1.0)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v <= hi) or math.isnan(v):
            raise ValueError(f"{name} must be a finite number in [0, {hi}], got {v!r}")
        if v == math.inf:
            raise ValueError(f"{name} must be finite, got {v!r}")
    t = torch.arange(T + 1, dtype=torch.float64)
    f = torch.cos(((t / T + s) / (1.0 + s)) * math.pi / 2.0) ** 2
    return torch.clamp(1.0 - f[1:] / f[:-1], 0.0, max_beta)


def _linear_beta_schedule(T: int) -> Tensor:
    # Ho et al. (2020), rescaled so that T levels span the same total noise as their T = 1000 schedule.
    scale = 1000.0 / T
    return torch.linspace(scale * 1e-4, min(scale * 0.02, 0.999), T, dtype=torch.float64)


def _expand(coef: Tensor, like: Tensor) -> Tensor:
    """Index-gathered per-element coefficient ``(B,)`` reshaped to broadcast against ``(B, *event)``."""
    return coef.reshape(coef.shape[0], *([1] * (like.dim() - 1))).to(like.dtype)


# ----------------------------------------------------------------------------------------------------------
# Small networks (CPU-sized defaults for the reproduction; any nn.Module with the same call works)
# ----------------------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """``depth``-layer SiLU MLP ``(B, d_in) -> (B, d_out)``; the last layer starts at zero if ``zero_out``.

    Zero-initialising the output of a residual emulator makes it start as the identity map, which is the
    usual trick for stable one-step training.
    """

    def __init__(self, d_in: int, d_out: int, hidden: int = 128, depth: int = 2, zero_out: bool = False):
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        dims = [d_in] + [hidden] * (depth - 1) + [d_out]
        layers: list[nn.Module] = []
        for i in range(depth):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i < depth - 1:
                layers.append(nn.SiLU())
        self.net = nn.Sequential(*layers)
        if zero_out:
            nn.init.zeros_(self.net[-1].weight)
            nn.init.zeros_(self.net[-1].bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class LevelMLP(nn.Module):
    """ε-network for vector states ``(B, d)``, optionally conditioned on the diffusion level.

    With ``n_levels=None`` (the paper's choice) it is called as ``net(x)`` and must infer the level from
    ``x``; with ``n_levels=T`` it is called as ``net(x, k)`` and adds a learned level embedding to every
    hidden layer, which trains faster on CPU.
    """

    def __init__(self, dim: int, hidden: int = 256, depth: int = 3, n_levels: int | None = None):
        super().__init__()
        if depth < 2:
            raise ValueError(f"depth must be >= 2, got {depth}")
        self.inp = nn.Linear(dim, hidden)
        self.hidden = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(depth - 2))
        self.out = nn.Linear(hidden, dim)
        self.embed = None if n_levels is None else nn.Embedding(n_levels, hidden)

    def forward(self, x: Tensor, k: Tensor | None = None) -> Tensor:
        emb = 0.0 if self.embed is None or k is None else self.embed(k)
        h = F.silu(self.inp(x) + emb)
        for layer in self.hidden:
            h = h + F.silu(layer(h) + emb)  # residual hidden blocks: deeper nets train stably
        return self.out(h)


class PeriodicConvNet1d(nn.Module):
    """Residual 1D CNN with circular padding, ``(B, N) -> (B, N)``; optionally level-conditioned.

    Used both as the KS emulator increment (``zero_out=True``) and as the thermalizer's ε-network.
    ``dilation_growth > 1`` dilates the hidden blocks geometrically (1, g, g², ...), so a few layers see the
    whole periodic domain (receptive field ``1 + (kernel − 1)·(2 + Σ gⁱ)`` points).
    """

    def __init__(
        self,
        width: int = 32,
        depth: int = 3,
        kernel: int = 5,
        n_levels: int | None = None,
        zero_out: bool = False,
        dilation_growth: int = 1,
    ):
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"kernel must be odd (same-size circular padding), got {kernel}")
        if isinstance(dilation_growth, bool) or not isinstance(dilation_growth, int) or dilation_growth < 1:
            raise ValueError(f"dilation_growth must be an int >= 1, got {dilation_growth!r}")
        pad = kernel // 2
        self.inp = nn.Conv1d(1, width, kernel, padding=pad, padding_mode="circular")
        self.blocks = nn.ModuleList(
            nn.Conv1d(width, width, kernel, padding=pad * g, dilation=g, padding_mode="circular")
            for g in (dilation_growth**i for i in range(max(depth - 2, 0)))
        )
        self.out = nn.Conv1d(width, 1, kernel, padding=pad, padding_mode="circular")
        self.embed = None if n_levels is None else nn.Embedding(n_levels, width)
        if zero_out:
            nn.init.zeros_(self.out.weight)
            nn.init.zeros_(self.out.bias)

    def forward(self, x: Tensor, k: Tensor | None = None) -> Tensor:
        emb = 0.0 if self.embed is None or k is None else self.embed(k)[:, :, None]
        h = F.gelu(self.inp(x[:, None, :]) + emb)
        for conv in self.blocks:
            h = h + F.gelu(conv(h) + emb)
        return self.out(h)[:, 0, :]


class ConvLevelHead1d(nn.Module):
    """Noise-level classifier for 1D periodic fields ``(B, N) -> (B, T)`` logits.

    Mirrors the paper's bottleneck head at 1D scale: strided circular convolutions, then flatten and two
    linear layers. Per-point noise shows up mostly in the high wavenumbers, so the first layers keep full
    resolution.
    """

    def __init__(self, n_points: int, n_levels: int, width: int = 32, kernel: int = 5, hidden: int = 128):
        super().__init__()
        if n_points % 8:
            raise ValueError(f"n_points must be divisible by 8, got {n_points}")
        pad = kernel // 2

        def conv(cin: int, cout: int, stride: int) -> nn.Conv1d:
            return nn.Conv1d(cin, cout, kernel, stride=stride, padding=pad, padding_mode="circular")

        self.convs = nn.ModuleList(
            [conv(1, width, 1), conv(width, width, 2), conv(width, width, 2), conv(width, width, 2)]
        )
        self.fc1 = nn.Linear(width * n_points // 8, hidden)
        self.fc2 = nn.Linear(hidden, n_levels)

    def forward(self, x: Tensor) -> Tensor:
        h = x[:, None, :]
        for conv in self.convs:
            h = F.gelu(conv(h))
        return self.fc2(F.gelu(self.fc1(h.flatten(1))))


class SpectralLevelHead1d(nn.Module):
    """Noise-level classifier for 1D periodic fields on their log power spectrum, ``(B, N) -> (B, T)``.

    Gaussian noise at level k adds ``(1 − ᾱ_k)`` to every Fourier mode's power, while a dissipative
    system's invariant measure has almost no power at high wavenumbers; so the log power spectrum
    identifies the level directly, and it is invariant to translations and reflections by construction.
    On KS it is ~10x cheaper to train than :class:`ConvLevelHead1d` and more accurate on clean-plus-noise
    inputs (±2 accuracy ≥ 0.99 at k ≤ 5), but in P02 rollouts it flags the emulator's errors less often
    and did not stabilise them, so the reproduction uses the convolutional head (the paper's head is a
    convolutional bottleneck of its U-Net).
    """

    def __init__(self, n_points: int, n_levels: int, hidden: int = 128, depth: int = 3, floor: float = 1e-6):
        super().__init__()
        if n_points < 2:
            raise ValueError(f"n_points must be >= 2, got {n_points}")
        self.floor = float(floor)
        self.mlp = MLP(n_points // 2 + 1, n_levels, hidden, depth)

    def forward(self, x: Tensor) -> Tensor:
        power = torch.fft.rfft(x, dim=-1).abs().pow(2) / x.shape[-1]  # (B, N // 2 + 1)
        return self.mlp(torch.log(power + self.floor))


def periodic_symmetry_augment(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Random circular shift and reflection ``u(x) -> −u(−x)`` of periodic 1D fields (KS symmetries).

    Each batch element gets its own transform, applied identically to all its leading event dimensions
    (so a ``(B, 2, N)`` stack of consecutive states stays a valid pair).

    Args:
        x: ``(B, ..., N)``.
        generator: RNG for the shifts and reflections.

    Returns:
        transformed fields, same shape as ``x``.
    """
    b, n = x.shape[0], x.shape[-1]
    shift = torch.randint(0, n, (b,), generator=generator, device=x.device)
    flip = torch.rand(b, generator=generator, device=x.device) < 0.5
    idx = (torch.arange(n, device=x.device)[None, :] + shift[:, None]) % n
    idx = torch.where(flip[:, None], (-idx) % n, idx)  # reflection x -> -x, after the shift
    sign = torch.where(flip, -1.0, 1.0).to(x.dtype)
    lead = (1,) * (x.dim() - 2)
    out = torch.gather(x, -1, idx.reshape(b, *lead, n).expand_as(x))
    return out * sign.reshape(b, *lead, 1)


# ----------------------------------------------------------------------------------------------------------
# Emulator
# ----------------------------------------------------------------------------------------------------------


def _field_stats(data: Tensor) -> tuple[float, float]:
    return float(data.mean()), float(data.std())


def _as_float_tensor(name: str, x: object, min_dim: int) -> Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating point, got dtype {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    return x


def _check_training_data(name: str, x: object, min_dim: int) -> Tensor:
    """Float32 training data, validated before any state is touched: non-empty, finite, not constant."""
    data = _as_float_tensor(name, x, min_dim).float()
    if data.numel() == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(data.shape)}")
    n_bad = int((~torch.isfinite(data)).sum())
    if n_bad:
        raise ValueError(
            f"{name} must be finite; got {int(torch.isnan(data).sum())} NaN and "
            f"{int(torch.isinf(data).sum())} Inf values in a tensor of shape {tuple(data.shape)}"
        )
    std = float(data.std()) if data.numel() > 1 else 0.0
    if not std > 0 or not math.isfinite(std):
        raise ValueError(
            f"{name} must not be constant (its std sets the normalisation), got std={std} over shape "
            f"{tuple(data.shape)}"
        )
    return data


def _check_states(name: str, x: object) -> Tensor:
    """States ``(B, *event)`` for inference: a float tensor with B >= 1, finite."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, *event), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating point, got dtype {x.dtype}")
    if x.dim() < 2 or x.numel() == 0:
        raise ValueError(f"{name} must have shape (B, *event) with no empty axis, got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(
            f"{name} must be finite; got {int(torch.isnan(x).sum())} NaN and {int(torch.isinf(x).sum())} "
            f"Inf values in a tensor of shape {tuple(x.shape)}"
        )
    return x


class ResidualEmulator(nn.Module):
    """Residual emulator ``x_{n+1} = x_n + s·net((x_n − m)/s)`` (+ ``σ·s·ε`` if stochastic).

    Args:
        net: maps normalised states ``(B, *event)`` to increments of the same shape.
        sigma: std of the additive Gaussian noise per step in normalised units (None: deterministic).
        field_mean, field_std: normalisation ``m``, ``s`` (set from data by :meth:`fit`).
        conserve_mean: remove the spatial mean of each increment, so the emulator conserves the mean
            over the last axis exactly (as KS does); the reference code's Kolmogorov thermalizer class
            does the same to its emulator's increments.
    """

    def __init__(
        self,
        net: nn.Module,
        sigma: float | None = None,
        field_mean: float = 0.0,
        field_std: float = 1.0,
        conserve_mean: bool = False,
    ):
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be an nn.Module, got {type(net).__name__}")
        if sigma is not None and not sigma >= 0:
            raise ValueError(f"sigma must be None or >= 0, got {sigma!r}")
        self.net = net
        self.sigma = sigma
        self.conserve_mean = bool(conserve_mean)
        self.register_buffer("field_mean", torch.tensor(check_float(field_mean, "field_mean")))
        self.register_buffer(
            "field_std", torch.tensor(check_float(field_std, "field_std", low=0.0, low_open=True))
        )

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One emulator step; ``x``: ``(B, *event)`` -> ``(B, *event)``.

        ``generator`` drives the step noise of a stochastic emulator (``sigma``); None draws from torch's
        global generator, as ``torch.randn`` does.
        """
        xn = (x - self.field_mean) / self.field_std
        yn = xn + self.increment(xn)
        if self.sigma:
            yn = yn + self.sigma * torch.randn(
                yn.shape, generator=generator, dtype=yn.dtype, device=yn.device
            )
        return yn * self.field_std + self.field_mean

    def increment(self, xn: Tensor) -> Tensor:
        """``net(xn)`` on normalised states, mean-free over the last axis if ``conserve_mean``."""
        d = self.net(xn)
        return d - d.mean(-1, keepdim=True) if self.conserve_mean else d

    def fit(
        self,
        trajectories: Tensor | np.ndarray,
        n_iter: int = 2000,
        batch_size: int = 64,
        lr: float = 5e-4,
        weight_decay: float = 0.0,
        seed: int = 0,
        progress: bool = False,
        augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
        rollout: int = 1,
        input_noise: float = 0.0,
    ) -> ResidualEmulator:
        """Train with the MSE of the next ``rollout`` states predicted autoregressively (default: one step).

        With ``rollout = 1`` this is the one-step MSE on consecutive pairs; with ``rollout = r`` the
        emulator is applied r times from ``x_n`` (gradients through the whole chain) and the loss is the
        mean of the r per-step MSEs against ``x_{n+1..n+r}``, as the official code's
        ``RolloutResidualSystem`` does (its KS notebook trains over 5 states, its Kolmogorov emulators
        over 2): the later steps see the emulator's own errors, which teaches it to damp them.

        Args:
            trajectories: ``(n_traj, n_steps, *event)`` in physical units, consecutive emulator steps
                (``n_steps > rollout``).
            n_iter: optimiser steps (AdamW, cosine-decayed learning rate).
            augment: optional symmetry transform of a ``(b, rollout + 1, *event)`` batch of windows of
                consecutive states, called with the training generator (e.g.
                :func:`periodic_symmetry_augment`).
            rollout: predicted steps per training window (int >= 1).
            input_noise: std, in normalised units, of Gaussian noise added to the starting state of each
                window (default 0: none; the official code's ``add_noise`` option). Clean trajectories of a
                dissipative system carry almost no power at high wavenumbers, so an emulator trained on
                them alone never learns what to do with the small-scale errors it makes itself; noisy
                inputs with clean targets teach it to damp them.

        Returns:
            self (trained, in eval mode), with ``field_mean``/``field_std`` set from ``trajectories``.
        """
        # Validate everything before touching any state: a rejected fit leaves the emulator unchanged.
        data = _check_training_data("trajectories", trajectories, 3)
        rollout = check_int(rollout, "rollout", low=1)
        input_noise = check_float(input_noise, "input_noise", low=0.0)
        if data.shape[1] < rollout + 1:
            raise ValueError(
                f"trajectories need at least rollout + 1 = {rollout + 1} steps, got shape {tuple(data.shape)}"
            )
        n_iter, batch_size = check_int(n_iter, "n_iter", low=1), check_int(batch_size, "batch_size", low=1)
        lr = check_float(lr, "lr", low=0.0, low_open=True)
        weight_decay = check_float(weight_decay, "weight_decay", low=0.0)
        mean, std = _field_stats(data)
        with torch.no_grad():
            was_training = self.training
            self.eval()
            try:
                probe = self.increment((data[:1, 0] - mean) / std)
            except RuntimeError as exc:
                raise ValueError(
                    f"trajectories of event shape {tuple(data.shape[2:])} do not fit net: {exc}"
                ) from exc
            finally:
                self.train(was_training)
        if probe.shape != data[:1, 0].shape:
            raise ValueError(
                f"net must return increments of the event shape {tuple(data.shape[2:])}, got {tuple(probe.shape[1:])}"
            )
        self.field_mean.fill_(mean)
        self.field_std.fill_(std)
        data = (data - mean) / std
        n_win = data.shape[1] - rollout  # windows (x_n, ..., x_{n+rollout}) per trajectory
        windows = torch.stack([data[:, j : j + n_win] for j in range(rollout + 1)], 2)
        windows = windows.reshape(-1, rollout + 1, *data.shape[2:])
        gen = make_generator(seed)
        opt = torch.optim.AdamW(self.net.parameters(), lr=lr, weight_decay=weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_iter)
        self.train()
        for _ in _progress(range(n_iter), progress, "emulator"):
            batch = windows[torch.randint(0, windows.shape[0], (batch_size,), generator=gen)]
            if augment is not None:
                batch = augment(batch, gen)
            x, loss = batch[:, 0], 0.0
            if input_noise:
                x = x + input_noise * torch.randn(x.shape, generator=gen, dtype=x.dtype)
            for j in range(1, rollout + 1):
                x = x + self.increment(x)
                loss = loss + F.mse_loss(x, batch[:, j])
            loss = loss / rollout
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        return self.eval()


def _progress(it: range, enabled: bool, desc: str):
    """The house progress bar (``tqdm.auto``, quiet in CI / without a TTY) when ``enabled``, else ``it``."""
    return progress(it, desc=desc) if enabled else it


# ----------------------------------------------------------------------------------------------------------
# Thermalizer: DDPM ε-network + noise-level classifier
# ----------------------------------------------------------------------------------------------------------


def _head_classes(level_head: nn.Module) -> int | None:
    """The class count of a head whose last registered leaf module is an ``nn.Linear`` (else None)."""
    leaves = [m for m in level_head.modules() if not any(True for _ in m.children())]
    return leaves[-1].out_features if leaves and isinstance(leaves[-1], nn.Linear) else None


class Thermalizer(nn.Module):
    """DDPM on the invariant measure with a noise-level classifier head.

    Args:
        eps_net: ε-predictor on normalised states; called ``eps_net(x_k)`` (paper: no level input) or
            ``eps_net(x_k, k)`` when ``time_conditioned``. Output shape = input shape ``(B, *event)``.
        level_head: classifier ``(B, *event) -> (B, T)`` logits over noise levels. It may share modules
            with ``eps_net`` (e.g. a U-Net bottleneck); parameters are deduplicated by the optimiser.
        T: number of diffusion levels.
        schedule: ``"cosine"`` (paper), ``"linear"``, or a tensor of T betas (e.g. a diffusers
            ``DDPMScheduler(...).betas``).
        lambda_cls: weight of the cross-entropy term in :meth:`loss`.
        time_conditioned: whether ``eps_net`` takes the level as a second argument.
        mean_free: diffuse within the zero-mean subspace of the last axis: every Gaussian draw and ε̂ are
            projected to zero spatial mean, so denoising from level k to ``stop`` only rescales a state's
            (normalised) mean by ``sqrt(ᾱ_stop)`` ≈ 1. Use it when the system conserves its spatial mean
            (KS): μ then lives on that subspace, and an unconstrained ε̂ lets the mean random-walk over
            thousands of thermalizations.
        field_mean, field_std: normalisation of physical states (set from data by :meth:`fit`).
    """

    def __init__(
        self,
        eps_net: nn.Module,
        level_head: nn.Module,
        T: int = 1000,
        schedule: str | Tensor = "cosine",
        lambda_cls: float = 1.0,
        time_conditioned: bool = False,
        mean_free: bool = False,
        field_mean: float = 0.0,
        field_std: float = 1.0,
    ):
        super().__init__()
        for name, mod in (("eps_net", eps_net), ("level_head", level_head)):
            if not isinstance(mod, nn.Module):
                raise TypeError(f"{name} must be an nn.Module, got {type(mod).__name__}")
        if isinstance(T, bool) or not isinstance(T, int) or T < 2:
            raise ValueError(f"T must be an int >= 2 (number of diffusion levels), got {T!r}")
        n_classes = _head_classes(level_head)
        if n_classes is not None and n_classes != T:
            raise ValueError(
                f"level_head must output T={T} logits (one per noise level), but its last layer is "
                f"nn.Linear(..., out_features={n_classes})"
            )
        if isinstance(schedule, Tensor):
            betas = schedule.detach().to(torch.float64).flatten()
            if betas.numel() != T or not bool(((betas > 0) & (betas < 1)).all()):
                raise ValueError(
                    f"schedule tensor must hold T={T} betas in (0, 1), got shape {tuple(betas.shape)}"
                )
        elif schedule == "cosine":
            betas = cosine_beta_schedule(T)
        elif schedule == "linear":
            betas = _linear_beta_schedule(T)
        else:
            raise ValueError(f"schedule must be 'cosine', 'linear' or a tensor of betas, got {schedule!r}")
        if not lambda_cls >= 0:
            raise ValueError(f"lambda_cls must be >= 0, got {lambda_cls!r}")
        self.eps_net = eps_net
        self.level_head = level_head
        self.T = T
        self.lambda_cls = float(lambda_cls)
        self.time_conditioned = bool(time_conditioned)
        self.mean_free = bool(mean_free)
        alphas = 1.0 - betas
        alpha_bar = torch.cumprod(alphas, 0)
        alpha_bar_prev = torch.cat([torch.ones(1, dtype=torch.float64), alpha_bar[:-1]])
        # Posterior std of q(x_{k-1} | x_k, x_0); zero at k = 0 where the step returns the clean estimate.
        post_var = betas * (1.0 - alpha_bar_prev) / (1.0 - alpha_bar)
        post_var[0] = 0.0
        for name, val in {
            "betas": betas,
            "alphas": alphas,
            "alpha_bar": alpha_bar,
            "alpha_bar_prev": alpha_bar_prev,
            "posterior_std": post_var.sqrt(),
        }.items():
            self.register_buffer(name, val.float())
        self.register_buffer("field_mean", torch.tensor(check_float(field_mean, "field_mean")))
        self.register_buffer(
            "field_std", torch.tensor(check_float(field_std, "field_std", low=0.0, low_open=True))
        )

    # -- units ---------------------------------------------------------------------------------------------
    def normalize(self, x: Tensor) -> Tensor:
        return (x - self.field_mean) / self.field_std

    def denormalize(self, x: Tensor) -> Tensor:
        return x * self.field_std + self.field_mean

    # -- DDPM formulas (normalised units) ------------------------------------------------------------------
    def q_sample(self, x0: Tensor, k: Tensor, noise: Tensor) -> Tensor:
        """Forward process ``x_k = sqrt(ᾱ_k)·x0 + sqrt(1 − ᾱ_k)·ε``; ``x0``, ``noise``: ``(B, *event)``."""
        ab = self.alpha_bar[k]
        return _expand(ab.sqrt(), x0) * x0 + _expand((1.0 - ab).sqrt(), x0) * noise

    def posterior(self, x0: Tensor, xk: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Closed-form ``q(x_{k−1} | x_k, x_0)``: mean ``(B, *event)`` and std ``(B, 1, ...)``."""
        ab, abp, beta, alpha = self.alpha_bar[k], self.alpha_bar_prev[k], self.betas[k], self.alphas[k]
        c0 = beta * abp.sqrt() / (1.0 - ab)
        ck = (1.0 - abp) * alpha.sqrt() / (1.0 - ab)
        return _expand(c0, x0) * x0 + _expand(ck, xk) * xk, _expand(self.posterior_std[k], xk)

    def predict_eps(self, xk: Tensor, k: Tensor) -> Tensor:
        """ε̂(x_k) on normalised states; ``k`` (``(B,)``) is passed only to a time-conditioned net."""
        eps = self.eps_net(xk, k) if self.time_conditioned else self.eps_net(xk)
        return self.project(eps)

    def project(self, x: Tensor) -> Tensor:
        """Remove the mean over the last axis when ``mean_free`` (identity otherwise)."""
        return x - x.mean(-1, keepdim=True) if self.mean_free else x

    def reverse_step(self, xk: Tensor, k: Tensor, z: Tensor) -> Tensor:
        """One ancestral step ``x_k -> x_{k−1}`` (normalised units); ``z`` is the injected N(0, I) draw."""
        eps = self.predict_eps(xk, k)
        beta, alpha, ab = self.betas[k], self.alphas[k], self.alpha_bar[k]
        mean = (xk - _expand(beta / (1.0 - ab).sqrt(), xk) * eps) / _expand(alpha.sqrt(), xk)
        return mean + _expand(self.posterior_std[k], xk) * z

    # -- classifier ----------------------------------------------------------------------------------------
    def _check_logits(self, logits: Tensor, b: int) -> Tensor:
        if not isinstance(logits, Tensor) or tuple(logits.shape) != (b, self.T):
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(f"level_head must return logits of shape (B, T) = ({b}, {self.T}), got {got}")
        return logits

    def level_logits(self, x: Tensor) -> Tensor:
        """Logits ``(B, T)`` of the noise level of physical states ``x`` ``(B, *event)``.

        A state shape that ``level_head`` cannot take (before :meth:`fit` fixes the event shape) is a
        ``ValueError`` naming ``x``."""
        try:
            logits = self.level_head(self.normalize(x))
        except RuntimeError as err:  # a shape mismatch inside level_head (matmul / conv sizes)
            raise ValueError(
                f"x of shape {tuple(x.shape)} does not fit level_head (expected (B, *event) as it was built "
                f"for): {err}"
            ) from None
        return self._check_logits(logits, x.shape[0])

    @torch.no_grad()
    def noise_level(self, x: Tensor) -> Tensor:
        """Detected noise level ``k̂ = argmax logits`` per element, int64 ``(B,)``.

        ``x`` must be finite: a NaN/Inf state has no noise level (``ValueError``; argmax over NaN logits
        would silently report level 0, "clean"). :func:`thermalized_rollout` aborts such elements instead.
        """
        self._check_event("x", _check_states("x", x))
        return self.level_logits(x).argmax(dim=-1)

    @torch.no_grad()
    def level_accuracy(
        self,
        x: Tensor,
        levels: Sequence[int],
        tolerance: int = 2,
        generator: torch.Generator | None = None,
    ) -> dict[int, float]:
        """How well the classifier recovers a known noise level: clean states noised to each level.

        For every ``k`` in ``levels`` the clean states ``x`` are forward-diffused to level k (the same
        ``q(x_k | x)`` that :meth:`loss` trains on, projected when ``mean_free``) and the fraction whose
        detected level :meth:`noise_level` lies within ``±tolerance`` of k is reported. This is the
        classifier the rollout uses to decide when (k̂ > s_init) and how much (k̂ − s_stop steps) to denoise.

        Args:
            x: clean physical states ``(B, *event)``, finite (e.g. held-out snapshots of μ).
            levels: the levels to test, ints in ``[0, T)``.
            tolerance: accepted ``|k̂ − k|`` (int >= 0).
            generator: RNG of the injected noise (one ``(B, *event)`` draw per level, in order).

        Returns:
            ``{k: accuracy in [0, 1]}`` in the order of ``levels``.
        """
        self._check_event("x", _check_states("x", x))
        if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence) or not levels:
            raise ValueError(f"levels must be a non-empty sequence of ints in [0, {self.T}), got {levels!r}")
        levels = [_check_level("levels[i]", k, 0, self.T) for k in levels]
        tolerance = check_int(tolerance, "tolerance", low=0)
        xn = self.normalize(x)
        out: dict[int, float] = {}
        for k in levels:
            kk = torch.full((x.shape[0],), k, dtype=torch.long, device=x.device)
            noise = self.project(torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device))
            noisy = self.denormalize(self.q_sample(xn, kk, noise))
            out[k] = float(((self.noise_level(noisy) - k).abs() <= tolerance).float().mean())
        return out

    def _check_event(self, name: str, x: Tensor) -> Tensor:
        """After :meth:`fit`, states must have the event shape of the training snapshots."""
        event = getattr(self, "_event_shape", None)
        if event is not None and tuple(x.shape[1:]) != event:
            raise ValueError(
                f"{name} must have shape (B, {', '.join(map(str, event))}), got {tuple(x.shape)}"
            )
        return x

    # -- training ------------------------------------------------------------------------------------------
    def loss(
        self, x0: Tensor, level_weights: Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        """DDPM ε-MSE + ``lambda_cls``·cross-entropy of the level head, on clean physical snapshots.

        Args:
            x0: clean snapshots ``(B, *event)`` in physical units.
            level_weights: optional ``(T,)`` non-negative sampling weights of k (default uniform); use it
                to oversample the small levels where the rollout's classifier must be accurate.
            generator: RNG for k and ε.

        Returns:
            the scalar loss and ``{"mse", "ce", "acc"}`` (classifier accuracy on this batch).
        """
        x0 = self.normalize(x0)
        b = x0.shape[0]
        if level_weights is None:
            k = torch.randint(0, self.T, (b,), generator=generator, device=x0.device)
        else:
            k = torch.multinomial(level_weights.to(x0.device, torch.float64), b, True, generator=generator)
        eps = self.project(torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype))
        xk = self.q_sample(x0, k, eps)
        mse = F.mse_loss(self.predict_eps(xk, k), eps)
        logits = self._check_logits(self.level_head(xk), b)
        ce = F.cross_entropy(logits, k)
        acc = (logits.argmax(-1) == k).float().mean()
        return mse + self.lambda_cls * ce, {"mse": mse.item(), "ce": ce.item(), "acc": acc.item()}

    def fit(
        self,
        snapshots: Tensor | np.ndarray,
        n_iter: int = 4000,
        batch_size: int = 128,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        ema_decay: float | None = 0.995,
        level_weights: Tensor | None = None,
        seed: int = 0,
        progress: bool = False,
        augment: Callable[[Tensor, torch.Generator], Tensor] | None = None,
    ) -> Thermalizer:
        """Train on clean snapshots of μ only (never on emulator output), AdamW + grad-clip 1 + EMA.

        Args:
            snapshots: ``(n, *event)`` physical-unit samples of the invariant measure.
            n_iter, batch_size, lr, weight_decay: optimisation (cosine-decayed learning rate).
            ema_decay: decay of the parameter EMA loaded at the end (None: keep the raw weights).
            level_weights: see :meth:`loss`.
            augment: optional symmetry transform of a ``(b, *event)`` batch of snapshots, called with the
                training generator (e.g. :func:`periodic_symmetry_augment`); μ must be invariant to it.

        Returns:
            self in eval mode, ``field_mean``/``field_std`` set from ``snapshots``.
        """
        # Validate everything before touching any state: a rejected fit leaves the model unchanged.
        data = _check_training_data("snapshots", snapshots, 2)
        n_iter, batch_size = check_int(n_iter, "n_iter", low=1), check_int(batch_size, "batch_size", low=1)
        lr = check_float(lr, "lr", low=0.0, low_open=True)
        weight_decay = check_float(weight_decay, "weight_decay", low=0.0)
        if ema_decay is not None and not (isinstance(ema_decay, (int, float)) and 0 <= ema_decay < 1):
            raise ValueError(f"ema_decay must be None or a number in [0, 1), got {ema_decay!r}")
        if level_weights is not None:
            lw = torch.as_tensor(level_weights, dtype=torch.float64)
            if lw.shape != (self.T,) or not bool(torch.isfinite(lw).all() & (lw >= 0).all()) or lw.sum() <= 0:
                raise ValueError(
                    f"level_weights must be a ({self.T},) tensor of finite weights >= 0 with a positive sum, "
                    f"got shape {tuple(lw.shape)}"
                )
        mean, std = _field_stats(data)
        self._probe_heads((data[:2] - mean) / std)
        self._event_shape = tuple(data.shape[1:])
        self.field_mean.fill_(mean)
        self.field_std.fill_(std)
        gen = make_generator(seed)
        params = list({id(p): p for p in self.parameters()}.values())
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_iter)
        ema = copy.deepcopy(self).requires_grad_(False) if ema_decay is not None else None
        self.train()
        for _ in _progress(range(n_iter), progress, "thermalizer"):
            batch = data[torch.randint(0, data.shape[0], (batch_size,), generator=gen)]
            if augment is not None:
                batch = augment(batch, gen)
            loss, _ = self.loss(batch, level_weights, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            if ema is not None:
                with torch.no_grad():
                    for pe, p in zip(ema.parameters(), self.parameters()):
                        pe.lerp_(p, 1.0 - ema_decay)
        if ema is not None:
            self.load_state_dict(ema.state_dict())
        return self.eval()

    @torch.no_grad()
    def _probe_heads(self, xn: Tensor) -> None:
        """Check the output shapes of both networks on a normalised batch, in eval mode (no state change)."""
        was_training = self.training
        self.eval()
        try:
            k = torch.zeros(xn.shape[0], dtype=torch.long, device=xn.device)
            try:
                eps = self.eps_net(xn, k) if self.time_conditioned else self.eps_net(xn)
                logits = self.level_head(xn)
            except RuntimeError as exc:
                raise ValueError(
                    f"snapshots of event shape {tuple(xn.shape[1:])} do not fit eps_net/level_head: {exc}"
                ) from exc
            if not isinstance(eps, Tensor) or eps.shape != xn.shape:
                got = tuple(eps.shape) if isinstance(eps, Tensor) else type(eps).__name__
                raise ValueError(f"eps_net must return the shape of its input {tuple(xn.shape)}, got {got}")
            self._check_logits(logits, xn.shape[0])
        finally:
            self.train(was_training)

    # -- inference -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def denoise(
        self,
        x: Tensor,
        levels: Tensor,
        stop: int,
        forward_diffuse: bool = True,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Heterogeneous denoising: element b goes from level ``levels[b]`` down to ``stop``.

        Elements with ``levels[b] ≤ stop`` are returned unchanged (bitwise). The others are (optionally)
        forward-diffused to their level, then take ancestral steps at ``i = levels[b], …, stop + 1``;
        the batch is processed from the highest level down, an element joining once ``i ≤ levels[b]``.

        Args:
            x: physical states ``(B, *event)``.
            levels: int64 ``(B,)`` in ``[0, T)``.
            stop: final level, ``-1 ≤ stop < T`` (−1 ends with the noiseless step at level 0).
            forward_diffuse: add ``q(x_k | x)`` noise first (paper default).
            generator: RNG for the injected noise.
            noise: optional explicit draws ``(k_max + 1, B, *event)``: ``noise[0]`` for the forward
                diffusion, ``noise[i]`` for the reverse step at level i; an element's result then does not
                depend on the rest of the batch (used to test the heterogeneous batching).

        Returns:
            denoised states ``(B, *event)`` and the number of reverse steps per element, int64 ``(B,)``
            (``max(levels − stop, 0)``).
        """
        self._check_event("x", _check_states("x", x))
        levels = torch.as_tensor(levels, device=x.device)
        if levels.dtype not in (torch.int64, torch.int32) or levels.shape != x.shape[:1]:
            raise ValueError(
                f"levels must be an integer tensor of shape ({x.shape[0]},), got {levels.dtype} {tuple(levels.shape)}"
            )
        levels = levels.long()
        if isinstance(stop, bool) or not isinstance(stop, int) or not -1 <= stop < self.T:
            raise ValueError(f"stop must be an int in [-1, {self.T}), got {stop!r}")
        if levels.numel() and (int(levels.min()) < 0 or int(levels.max()) >= self.T):
            raise ValueError(
                f"levels must lie in [0, {self.T}), got range [{int(levels.min())}, {int(levels.max())}]"
            )
        n_steps = (levels - stop).clamp(min=0)
        touched = n_steps > 0
        out = x.clone()
        if not bool(touched.any()):
            return out, n_steps
        k_max = int(levels.max())
        if noise is not None and (noise.shape[0] < k_max + 1 or noise.shape[1:] != x.shape):
            raise ValueError(
                f"noise must have shape ({k_max + 1}, {tuple(x.shape)}...), got {tuple(noise.shape)}"
            )

        def draw(i: int, mask: Tensor) -> Tensor:
            if noise is not None:
                return self.project(noise[i][mask])
            shape = (int(mask.sum()), *x.shape[1:])
            return self.project(torch.randn(shape, generator=generator, device=x.device, dtype=x.dtype))

        idx = touched.nonzero().squeeze(1)
        lv = levels[idx]
        xn = self.normalize(x[idx])
        if forward_diffuse:
            xn = self.q_sample(xn, lv, draw(0, touched))
        for i in range(k_max, stop, -1):
            sel = lv >= i  # elements whose chain has reached level i
            k = torch.full((int(sel.sum()),), i, dtype=torch.long, device=x.device)
            full_sel = torch.zeros_like(touched)
            full_sel[idx[sel]] = True
            xn[sel] = self.reverse_step(xn[sel], k, draw(i, full_sel))
        out[idx] = self.denormalize(xn)
        return out, n_steps


# ----------------------------------------------------------------------------------------------------------
# Thermalized rollout (Algorithm 1)
# ----------------------------------------------------------------------------------------------------------


@dataclass
class RolloutResult:
    """Outcome of :func:`thermalized_rollout` for B initial conditions over ``n_steps`` steps.

    Attributes:
        states: ``(B, n_steps + 1, *event)``; ``states[:, 0]`` is ``x0``. After an abort the offending
            state is kept at the abort step and later steps are NaN.
        levels: int64 ``(B, n_steps + 1)``: the classifier's k̂ after each emulator step (before
            thermalization); −1 where not classified (step 0, no thermalizer, aborted, non-finite).
        n_denoise_steps: int64 ``(B, n_steps + 1)``: reverse diffusion steps taken at each step.
        aborted_at: int64 ``(B,)``: first step at which the element was aborted (non-finite state, or
            ``k̂ > noise_limit``), −1 if never.
    """

    states: Tensor
    levels: Tensor
    n_denoise_steps: Tensor
    aborted_at: Tensor

    @property
    def energy(self) -> Tensor:
        """``mean(x²)`` over the event dimensions, ``(B, n_steps + 1)`` (NaN after an abort)."""
        return self.states.pow(2).flatten(2).mean(-1)

    @property
    def fired(self) -> Tensor:
        """Bool ``(B, n_steps + 1)``: whether thermalization ran at each step."""
        return self.n_denoise_steps > 0


def _check_level(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}), got {value!r}")
    return value


@torch.no_grad()
def thermalized_rollout(
    emulator: nn.Module | Callable[[Tensor], Tensor],
    thermalizer: Thermalizer | None,
    x0: Tensor,
    n_steps: int,
    s_init: int = 10,
    s_stop: int = 4,
    forward_diffuse: bool = True,
    noise_limit: int | None = 100,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> RolloutResult:
    """Autoregressive rollout of ``emulator`` with on-the-fly thermalization (paper's Algorithm 1).

    Per step n: ``x = emulator(x)``; elements whose state is non-finite are aborted (never shown to the
    classifier); ``k̂ = thermalizer.noise_level(x)``; elements with ``k̂ > noise_limit`` are aborted; the
    elements with ``k̂ > s_init`` are denoised from k̂ to ``s_stop`` (:meth:`Thermalizer.denoise`).
    Aborted elements are frozen; the others continue (the reference stops the whole batch instead).

    Args:
        emulator: any module/callable mapping states ``(B, *event) -> (B, *event)`` (the next state, not
            the increment; wrap increment nets in :class:`ResidualEmulator`). Its train/eval mode is
            left as given.
        thermalizer: a trained :class:`Thermalizer`, or None for the plain emulator (the baseline).
        x0: initial states ``(B, *event)``, physical units, finite.
        n_steps: number of emulator steps.
        s_init: thermalize when ``k̂ > s_init``; ``0 ≤ s_stop < s_init < T``.
        s_stop: level at which denoising stops.
        forward_diffuse: forward-diffuse to k̂ before the reverse chain (paper default True).
        noise_limit: abort an element when ``k̂ > noise_limit`` (None: never); must exceed ``s_init``.
        generator: RNG for the thermalizer's noise, and for the step noise of a stochastic
            :class:`ResidualEmulator` (other emulators draw their own noise).
        progress: show a tqdm bar.

    Returns:
        :class:`RolloutResult`.
    """
    if not callable(emulator):
        raise TypeError(f"emulator must be an nn.Module or callable, got {type(emulator).__name__}")
    if thermalizer is not None and not isinstance(thermalizer, Thermalizer):
        raise TypeError(f"thermalizer must be a Thermalizer or None, got {type(thermalizer).__name__}")
    if not isinstance(x0, Tensor):
        raise TypeError(f"x0 must be a torch.Tensor of shape (B, *event), got {type(x0).__name__}")
    if x0.dim() < 2 or x0.shape[0] < 1 or not x0.is_floating_point():
        raise ValueError(
            f"x0 must be a float tensor of shape (B, *event) with B >= 1, got {x0.dtype} {tuple(x0.shape)}"
        )
    if not bool(torch.isfinite(x0).all()):
        raise ValueError("x0 must be finite, got NaN/inf entries")
    if x0.numel() == 0:
        raise ValueError(f"x0 must have no empty axis, got shape {tuple(x0.shape)}")
    if thermalizer is not None:
        thermalizer._check_event("x0", x0)
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps must be a positive int, got {n_steps!r}")
    if thermalizer is not None:
        T = thermalizer.T
        s_init = _check_level("s_init", s_init, 0, T)
        s_stop = _check_level("s_stop", s_stop, 0, T)
        if s_stop >= s_init:
            raise ValueError(f"s_stop must be < s_init, got s_stop={s_stop}, s_init={s_init}")
        if noise_limit is not None and (
            isinstance(noise_limit, bool) or not isinstance(noise_limit, int) or noise_limit <= s_init
        ):
            raise ValueError(f"noise_limit must be None or an int > s_init={s_init}, got {noise_limit!r}")
        ratio = float(x0.std()) / float(thermalizer.field_std)
        if not 1 / 3 <= ratio <= 3:
            warnings.warn(
                f"x0 std {float(x0.std()):.3g} differs by more than 3x from the thermalizer's training "
                f"field_std {float(thermalizer.field_std):.3g}; are the states in the same units?",
                stacklevel=3,  # past the no_grad decorator, at the caller
            )

    B = x0.shape[0]
    states = torch.full((B, n_steps + 1, *x0.shape[1:]), float("nan"), dtype=x0.dtype, device=x0.device)
    states[:, 0] = x0
    levels = torch.full((B, n_steps + 1), -1, dtype=torch.long, device=x0.device)
    n_den = torch.zeros((B, n_steps + 1), dtype=torch.long, device=x0.device)
    aborted_at = torch.full((B,), -1, dtype=torch.long, device=x0.device)
    active = torch.arange(B, device=x0.device)  # indices of elements still being rolled out
    x = x0.clone()
    for n in _progress(range(1, n_steps + 1), progress, "rollout"):
        if active.numel() == 0:
            break
        y = emulator(x, generator=generator) if isinstance(emulator, ResidualEmulator) else emulator(x)
        if not isinstance(y, Tensor) or y.shape != x.shape:
            got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
            raise ValueError(f"emulator output shape {got} must equal its input shape {tuple(x.shape)}")
        keep = torch.isfinite(y).flatten(1).all(1)
        if thermalizer is not None and bool(keep.any()):
            kept = keep.nonzero().squeeze(1)
            k_hat = thermalizer.noise_level(y[kept])
            levels[active[kept], n] = k_hat
            if noise_limit is not None:
                over = k_hat > noise_limit
                keep[kept[over]] = False
            fire = (k_hat > s_init) & keep[kept]
            if bool(fire.any()):
                fi = kept[fire]
                y[fi], steps = thermalizer.denoise(y[fi], k_hat[fire], s_stop, forward_diffuse, generator)
                n_den[active[fi], n] = steps
        states[active, n] = y  # aborted elements keep their offending state at the abort step
        aborted_at[active[~keep]] = n
        active, x = active[keep], y[keep]
    return RolloutResult(states=states, levels=levels, n_denoise_steps=n_den, aborted_at=aborted_at)


# ----------------------------------------------------------------------------------------------------------
# Rollout diagnostics and the choice of (s_init, s_stop)
# ----------------------------------------------------------------------------------------------------------


def _as_float_array(name: str, x: object, min_dim: int, finite: bool = True) -> np.ndarray:
    """A float64 numpy copy of ``x`` (array or tensor) with at least ``min_dim`` axes and no empty axis."""
    if isinstance(x, Tensor):
        x = x.detach().cpu().numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch.Tensor, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    if x.ndim < min_dim or x.size == 0:
        raise ValueError(f"{name} must have at least {min_dim} axes, none empty; got shape {x.shape}")
    if finite and not np.isfinite(x).all():
        raise ValueError(
            f"{name} must be finite; got {int(np.isnan(x).sum())} NaN and {int(np.isinf(x).sum())} Inf "
            f"values in an array of shape {x.shape}"
        )
    return x.astype(np.float64)


def _check_band(band: object) -> tuple[float, float]:
    ok = isinstance(band, (tuple, list)) and len(band) == 2
    lo, hi = (float(band[0]), float(band[1])) if ok else (math.nan, math.nan)
    if not (ok and math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise ValueError(
            f"band must be a pair (low, high) of finite energies with 0 <= low < high, got {band!r}"
        )
    return lo, hi


def stability_band(trajectories: np.ndarray | Tensor, q: float = 0.001) -> tuple[float, float]:
    """Energy band ``[0.5·quantile_q, 1.5·quantile_{1−q}]`` of true energies (the stability criterion).

    A rollout is *stable* while it is finite and its energy ``mean(x²)`` over the event dimensions stays in
    this band of the true system's energies (:func:`stable_mask`).

    Args:
        trajectories: true states ``(n_traj, n_steps, *event)``, finite, not all zero.
        q: lower quantile (``0 < q < 0.5``; default 0.1%, so the band spans 0.5·q_0.1% to 1.5·q_99.9%).

    Returns:
        ``(low, high)`` energies.
    """
    x = _as_float_array("trajectories", trajectories, 3)
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q < 0.5:
        raise ValueError(f"q must be a number in (0, 0.5), got {q!r}")
    with np.errstate(over="ignore"):
        energy = (x**2).reshape(x.shape[0], x.shape[1], -1).mean(-1)
    if not np.isfinite(energy).all():
        raise ValueError(
            f"trajectories are too large: their energy mean(x²) overflows (max |x| = {np.abs(x).max():.3g})"
        )
    lo, hi = 0.5 * float(np.quantile(energy, q)), 1.5 * float(np.quantile(energy, 1.0 - q))
    if not hi > 0:
        raise ValueError("trajectories must not be all zero (their energy band would be empty)")
    return lo, hi


def stable_mask(energy: np.ndarray | Tensor, band: tuple[float, float]) -> np.ndarray:
    """Per-rollout stability: energy finite and inside ``band`` at every step.

    Args:
        energy: ``(B, n_steps)`` energies of B rollouts (e.g. ``RolloutResult.energy[:, 1:]``); NaN/Inf
            entries (a blown-up or aborted rollout) count as unstable.
        band: ``(low, high)`` from :func:`stability_band`.

    Returns:
        bool array ``(B,)``.
    """
    e = _as_float_array("energy", energy, 2, finite=False)
    if e.ndim != 2:
        raise ValueError(f"energy must have shape (B, n_steps), got {e.shape}")
    lo, hi = _check_band(band)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(e) & (e >= lo) & (e <= hi)
    return ok.all(axis=1)


def spectral_reference(
    trajectories: np.ndarray | Tensor, rel_floor: float = 1e-3
) -> tuple[np.ndarray, np.ndarray]:
    """Climatological log energy spectrum of periodic 1D fields and its energetic modes.

    Args:
        trajectories: true states ``(n_traj, n_steps, N)``, finite.
        rel_floor: a mode is *energetic* when its mean power is at least ``rel_floor`` × the peak
            (``0 < rel_floor < 1``); below that the spectrum of a thermalized rollout is dominated by the
            ``s_stop``-level noise the algorithm leaves by construction.

    Returns:
        ``log_ref`` ``(N // 2 + 1,)`` (log of the time- and trajectory-averaged power; modes with zero
        power get ``-inf``) and ``modes``, the int64 indices of the energetic modes.
    """
    x = _as_float_array("trajectories", trajectories, 3)
    if x.ndim != 3:
        raise ValueError(f"trajectories must have shape (n_traj, n_steps, N), got {x.shape}")
    if isinstance(rel_floor, bool) or not isinstance(rel_floor, (int, float)) or not 0 < rel_floor < 1:
        raise ValueError(f"rel_floor must be a number in (0, 1), got {rel_floor!r}")
    if not np.ptp(x, axis=-1).max() > 0:
        raise ValueError("trajectories must not be constant in space (no power on any non-zero mode)")
    try:
        clim = energy_spectrum(x).mean(0)
    except ValueError as exc:  # overflow of a huge field: name the argument
        raise ValueError(f"trajectories: {exc}") from None
    with np.errstate(divide="ignore"):
        log_ref = np.log(clim)
    return log_ref, np.nonzero(clim >= rel_floor * clim.max())[0]


def spectrum_rmse(segments: np.ndarray | Tensor, log_ref: np.ndarray, modes: np.ndarray) -> np.ndarray:
    """Per-segment RMSE of the log energy spectrum against a reference, over the chosen modes.

    Args:
        segments: ``(B, W, N)`` windows of B rollouts (or true trajectories); the spectrum of each is
            averaged over its W steps. A segment with a non-finite or huge (``|x| >= 1e6``) entry, i.e. a
            blown-up rollout, gets ``inf``; so does one with zero power on a compared mode (a collapsed,
            e.g. constant, state: log 0).
        log_ref: ``(N // 2 + 1,)`` reference log spectrum (:func:`spectral_reference`), finite on ``modes``.
        modes: int indices of the compared modes (non-empty, in ``[0, N // 2]``).

    Returns:
        float64 ``(B,)``; ``inf`` marks blown-up segments (documented, not an error).
    """
    seg = _as_float_array("segments", segments, 3, finite=False)
    if seg.ndim != 3:
        raise ValueError(f"segments must have shape (B, W, N), got {seg.shape}")
    ref = np.asarray(log_ref)
    m = np.asarray(modes)
    n_modes = seg.shape[-1] // 2 + 1
    if ref.dtype.kind != "f" or ref.shape != (n_modes,):
        raise ValueError(f"log_ref must be a float array of shape ({n_modes},), got {ref.dtype} {ref.shape}")
    if m.dtype.kind not in "iu" or m.ndim != 1 or m.size == 0 or m.min() < 0 or m.max() >= n_modes:
        raise ValueError(f"modes must be a non-empty 1D int array in [0, {n_modes}), got {modes!r}")
    if not (np.abs(ref[m]) < 1e4).all():  # log powers: |log p| < 1e4 covers every float64 power
        raise ValueError(
            f"log_ref must hold finite log powers (|value| < 1e4) on modes, got {ref[m].tolist()}"
        )
    out = np.full(seg.shape[0], np.inf)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(seg).all(axis=(1, 2)) & (np.abs(seg) < 1e6).all(axis=(1, 2))
    if ok.any():
        spec = energy_spectrum(seg[ok])[:, m]
        with np.errstate(divide="ignore"):
            out[ok] = np.sqrt(((np.log(spec) - ref[m]) ** 2).mean(-1))
    return out


def choose_levels(scores: dict[tuple[int, int], tuple[float, float, float]]) -> tuple[int, int]:
    """The selection rule of :func:`select_levels` on ``{(s_init, s_stop): (stable, firing, spectrum RMSE)}``.

    Admissible pairs fire on 0.1%–50% of steps (the algorithm's intended regime: it corrects rarely, but
    does act); all pairs compete if none is. Among them the highest stable fraction wins, then the lowest
    spectrum RMSE; a remaining tie goes to the earlier pair in ``scores``.
    """
    if not isinstance(scores, dict) or not scores:
        raise ValueError(
            f"scores must be a non-empty {{(s_init, s_stop): (stable, firing, rmse)}} dict, got {scores!r}"
        )
    for pair, v in scores.items():
        if not (isinstance(v, tuple) and len(v) == 3 and not any(math.isnan(float(t)) for t in v)):
            raise ValueError(
                f"scores[{pair!r}] must be a (stable, firing, rmse) tuple without NaN, got {v!r}"
            )
    admissible = {c: v for c, v in scores.items() if 0.001 <= v[1] <= 0.5} or scores
    return min(admissible, key=lambda c: (-admissible[c][0], admissible[c][2]))


def select_levels(
    emulator: nn.Module | Callable[[Tensor], Tensor],
    thermalizer: Thermalizer,
    ics: Tensor,
    candidates: Sequence[tuple[int, int]],
    *,
    horizon: int,
    window: int,
    band: tuple[float, float],
    log_ref: np.ndarray,
    modes: np.ndarray,
    noise_limit: int | None = 100,
    seed: int = 0,
) -> tuple[tuple[int, int], dict[tuple[int, int], tuple[float, float, float]]]:
    """Choose ``(s_init, s_stop)`` by a thermalized-rollout sweep from training states.

    The official code's sweep (``scripts/therm_inference/therm_sweep.py``) rolls out every pair of a grid
    and keeps the one whose rollouts are most like the true system; here, for each candidate pair the
    ``ics`` are rolled out for ``horizon`` steps (:func:`thermalized_rollout`, the same seed for every
    pair) and scored by the stable fraction (:func:`stable_mask`), the firing rate and the median
    spectrum RMSE of the last ``window`` steps (:func:`spectrum_rmse`); :func:`choose_levels` picks.
    Use training states only, so the choice never sees the test trajectories.

    Args:
        emulator, thermalizer: as for :func:`thermalized_rollout`.
        ics: initial states ``(B, N)`` taken from training trajectories.
        candidates: non-empty sequence of ``(s_init, s_stop)`` pairs with ``0 <= s_stop < s_init < T``.
        horizon: rollout length; window: scored final steps, ``0 < window <= horizon``.
        band: energy band (:func:`stability_band`); log_ref, modes: spectrum reference
            (:func:`spectral_reference`).
        noise_limit: as for :func:`thermalized_rollout`.
        seed: seed of the thermalizer's noise.

    Returns:
        the chosen pair and ``{pair: (stable fraction, firing rate, median spectrum RMSE)}`` (rounded to
        3, 4 and 4 decimals).
    """
    _check_states("ics", ics)
    if ics.dim() != 2:
        raise ValueError(f"ics must have shape (B, N) (periodic 1D fields), got {tuple(ics.shape)}")
    if not isinstance(thermalizer, Thermalizer):
        raise TypeError(f"thermalizer must be a Thermalizer, got {type(thermalizer).__name__}")
    thermalizer._check_event("ics", ics)
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence) or not candidates:
        raise ValueError(f"candidates must be a non-empty list of (s_init, s_stop), got {candidates!r}")
    horizon = check_int(horizon, "horizon", low=1)
    if isinstance(window, bool) or not isinstance(window, int) or not 0 < window <= horizon:
        raise ValueError(f"window must be in (0, horizon={horizon}], got {window!r}")
    _check_band(band)
    for pair in candidates:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"candidates must hold (s_init, s_stop) pairs, got {pair!r}")
    scores: dict[tuple[int, int], tuple[float, float, float]] = {}
    for si, ss in candidates:
        res = thermalized_rollout(
            emulator,
            thermalizer,
            ics,
            horizon,
            s_init=si,
            s_stop=ss,
            noise_limit=noise_limit,
            generator=make_generator(seed),
        )
        stable = float(stable_mask(res.energy[:, 1:], band).mean())
        fire = float(res.fired[:, 1:].float().mean())
        rmse = float(np.median(spectrum_rmse(res.states[:, -window:], log_ref, modes)))
        scores[(si, ss)] = (round(stable, 3), round(fire, 4), round(rmse, 4))
    return choose_levels(scores), scores
