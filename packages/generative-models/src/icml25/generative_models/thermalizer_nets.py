"""Thermalizer: Stable autoregressive neural emulation of spatiotemporal chaos — ICML 2025, P02: the small networks and the emulator.

CPU-sized networks for the reproduction (any ``nn.Module`` with the same call works in their place): the
ε-networks and increment nets :class:`MLP`, :class:`LevelMLP` and :class:`PeriodicConvNet1d`, the noise-level
heads :class:`ConvLevelHead1d` and :class:`SpectralLevelHead1d`, the KS symmetry augmentation
:func:`periodic_symmetry_augment`, and :class:`ResidualEmulator`, the autoregressive emulator that the
thermalizer (:mod:`icml25.generative_models.thermalizer_model`) stabilises, with its training loop. The
method is :mod:`icml25.generative_models.thermalizer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.rng import make_generator

__all__ = [
    "MLP",
    "ConvLevelHead1d",
    "LevelMLP",
    "PeriodicConvNet1d",
    "ResidualEmulator",
    "SpectralLevelHead1d",
    "periodic_symmetry_augment",
]


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
        dilation_growth = check_int(dilation_growth, "dilation_growth", low=1)
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
        if sigma is not None:
            sigma = check_float(sigma, "sigma", low=0.0)
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
        if isinstance(trajectories, np.ndarray):
            trajectories = torch.from_numpy(np.ascontiguousarray(trajectories))
        data = check_tensor(trajectories, "trajectories", non_empty=True).float()
        if data.dim() < 3:
            raise ValueError(
                f"trajectories must have shape (n_traj, n_steps, *event), got {tuple(data.shape)}"
            )
        std = float(data.std()) if data.numel() > 1 else 0.0
        if not std > 0 or not math.isfinite(std):  # the std sets the normalisation
            raise ValueError(
                f"trajectories must not be constant, got std={std} over shape {tuple(data.shape)}"
            )
        rollout = check_int(rollout, "rollout", low=1)
        input_noise = check_float(input_noise, "input_noise", low=0.0)
        if data.shape[1] < rollout + 1:
            raise ValueError(
                f"trajectories need at least rollout + 1 = {rollout + 1} steps, got shape {tuple(data.shape)}"
            )
        n_iter, batch_size = check_int(n_iter, "n_iter", low=1), check_int(batch_size, "batch_size", low=1)
        lr = check_float(lr, "lr", low=0.0, low_open=True)
        weight_decay = check_float(weight_decay, "weight_decay", low=0.0)
        mean = float(data.mean())
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
        for _ in progress_bar(range(n_iter), desc="emulator") if progress else range(n_iter):
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
