"""Normalizing Flows are Capable Generative Models — ICML 2025, P33: the affine coupling flow baseline.

A compact RealNVP/Glow-style flow (Dinh et al., 2017; Kingma & Dhariwal, 2018), the family TarFlow is
compared with: ``levels`` scales, each a 2x2 squeeze (space to channels) followed by ``steps_per_level``
steps of

    ActNorm -> invertible 1x1 convolution -> affine coupling,

where the coupling keeps the first half of the channels ``x_a`` and maps the second half as
``x_b * exp(s(x_a)) + t(x_a)`` with ``s = scale * tanh(.)`` (RealNVP's bounded log-scale) and a small CNN
conditioner whose last layer is zero-initialised, so the flow starts as an orthogonal map (log-det 0).
Every step is exactly invertible with an exact log-determinant; all dimensions go through every level (no
factor-out), so the latent has the data's dimension ``D`` and a standard-normal prior.

Shapes: ``B`` batch, ``C x H x W`` image (``H, W`` divisible by ``2**levels``), latent
``(B, C 4^L, H / 2^L, W / 2^L)`` with ``L = levels``.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_int, check_size2d, check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["CouplingFlow"]


def _squeeze(x: Tensor) -> Tensor:
    """``(B, C, H, W)`` -> ``(B, 4C, H/2, W/2)`` (each 2x2 block becomes 4 channels)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4)
    return x.reshape(b, 4 * c, h // 2, w // 2)


def _unsqueeze(x: Tensor) -> Tensor:
    """The inverse of :func:`_squeeze`."""
    b, c, h, w = x.shape
    x = x.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(b, c // 4, 2 * h, 2 * w)


class _ActNorm(nn.Module):
    """Per-channel affine ``(x + bias) * exp(log_scale)``, initialised to the identity (no data init)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.log_scale = nn.Parameter(torch.zeros(1, channels, 1, 1))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        logdet = self.log_scale.sum() * x.shape[2] * x.shape[3]
        return (x + self.bias) * self.log_scale.exp(), logdet.expand(x.shape[0])

    def inverse(self, z: Tensor) -> Tensor:
        return z * torch.exp(-self.log_scale) - self.bias


class _InvConv1x1(nn.Module):
    """Glow's invertible 1x1 convolution, initialised to a random orthogonal matrix."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        q, r = torch.linalg.qr(torch.randn(channels, channels))
        self.weight = nn.Parameter(q * torch.sign(torch.diagonal(r)))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        logdet = torch.linalg.slogdet(self.weight)[1] * x.shape[2] * x.shape[3]
        return F.conv2d(x, self.weight[:, :, None, None]), logdet.expand(x.shape[0])

    def inverse(self, z: Tensor) -> Tensor:
        return F.conv2d(z, torch.linalg.inv(self.weight)[:, :, None, None])


class _AffineCoupling(nn.Module):
    """``(x_a, x_b) -> (x_a, x_b * exp(s(x_a)) + t(x_a))`` with ``s = scale * tanh(raw)``."""

    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.split = channels // 2
        out = channels - self.split
        self.net = nn.Sequential(
            nn.Conv2d(self.split, hidden, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(hidden, hidden, 1),
            nn.ReLU(),
            nn.Conv2d(hidden, 2 * out, 3, padding=1),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        self.scale = nn.Parameter(torch.ones(1, out, 1, 1))

    def _params(self, x_a: Tensor) -> tuple[Tensor, Tensor]:
        raw, t = self.net(x_a).chunk(2, dim=1)
        return self.scale * torch.tanh(raw), t

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x_a, x_b = x[:, : self.split], x[:, self.split :]
        log_s, t = self._params(x_a)
        return torch.cat([x_a, x_b * log_s.exp() + t], 1), log_s.flatten(1).sum(1)

    def inverse(self, z: Tensor) -> Tensor:
        z_a, z_b = z[:, : self.split], z[:, self.split :]
        log_s, t = self._params(z_a)
        return torch.cat([z_a, (z_b - t) * torch.exp(-log_s)], 1)


class CouplingFlow(nn.Module):
    """Multi-scale affine coupling flow (RealNVP/Glow style) on images, exact likelihood.

    Args:
        in_channels: ``C``.
        img_size: ``H = W`` (int) or ``(H, W)``, divisible by ``2**levels``.
        hidden: channels of each coupling's CNN conditioner (3x3 -> 1x1 -> 3x3 convolutions).
        steps_per_level: flow steps (ActNorm, 1x1 convolution, coupling) after each squeeze.
        levels: number of 2x2 squeezes.
        seed: seed of the parameter initialisation (a seeded fork of torch's global generator, the caller's
            stream untouched); None initialises from the global generator like any ``nn.Module``.

    Example:
        >>> flow = CouplingFlow(1, 8, hidden=16, steps_per_level=2, levels=2, seed=0)
        >>> x = torch.rand(4, 1, 8, 8) * 2 - 1
        >>> flow.log_prob(x).shape
        torch.Size([4])
        >>> flow.sample(3, seed=0).shape
        torch.Size([3, 1, 8, 8])
    """

    def __init__(
        self,
        in_channels: int,
        img_size: int | tuple[int, int],
        hidden: int,
        steps_per_level: int = 4,
        levels: int = 2,
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        check_int(in_channels, "in_channels", low=1)
        check_int(hidden, "hidden", low=1)
        check_int(steps_per_level, "steps_per_level", low=1)
        check_int(levels, "levels", low=1)
        height, width = check_size2d(img_size, "img_size")
        factor = 2**levels
        if height < 1 or width < 1 or height % factor or width % factor:
            raise ValueError(
                f"img_size must be positive and divisible by 2**levels={factor}, got {(height, width)}"
            )
        self.in_channels = in_channels
        self.img_size = (height, width)
        self.levels = levels
        self.hidden = hidden
        self.latent_shape = (in_channels * 4**levels, height // factor, width // factor)
        with isolated_rng(seed) if seed is not None else contextlib.nullcontext():
            self.steps = nn.ModuleList()
            for level in range(levels):
                channels = in_channels * 4 ** (level + 1)
                self.steps.append(
                    nn.ModuleList(
                        nn.ModuleList(
                            [_ActNorm(channels), _InvConv1x1(channels), _AffineCoupling(channels, hidden)]
                        )
                        for _ in range(steps_per_level)
                    )
                )

    @property
    def data_dim(self) -> int:
        """``D = C H W``."""
        return self.in_channels * self.img_size[0] * self.img_size[1]

    def _check_x(self, x: object, name: str = "x") -> Tensor:
        return check_tensor(x, name, shape=(None, self.in_channels, *self.img_size))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Images ``(B, C, H, W)`` -> latent ``z`` ``(B, *latent_shape)`` and log|det dz/dx| ``(B,)`` (a sum)."""
        z = self._check_x(x)
        logdet = z.new_zeros(z.shape[0])
        for level in self.steps:
            z = _squeeze(z)
            for step in level:
                for layer in step:
                    z, ld = layer(z)
                    logdet = logdet + ld
        return z, logdet

    @torch.no_grad()
    def inverse(self, z: Tensor) -> Tensor:
        """Latent ``z`` ``(B, *latent_shape)`` -> images ``(B, C, H, W)``."""
        if not isinstance(z, Tensor) or z.dim() != 4 or tuple(z.shape[1:]) != self.latent_shape:
            shape = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
            raise ValueError(
                f"z must be a tensor of shape (B, {', '.join(map(str, self.latent_shape))}), got {shape}"
            )
        x = z
        for level in reversed(self.steps):
            for step in reversed(level):
                for layer in reversed(step):
                    x = layer.inverse(x)
            x = _unsqueeze(x)
        return x

    def log_prob(self, x: Tensor) -> Tensor:
        """Exact log-density of ``x`` ``(B, C, H, W)`` in nats, per sample ``(B,)`` (standard-normal prior)."""
        z, logdet = self(x)
        return -0.5 * (z.pow(2).flatten(1).sum(1) + self.data_dim * math.log(2 * math.pi)) + logdet

    def nll_bits_per_dim(self, x: Tensor, n_bins: int = 256) -> Tensor:
        """``(-log p(x) / D + log(n_bins / 2)) / ln 2`` ``(B,)``: bits/dim with bins of width ``2 / n_bins``
        on ``[-1, 1]`` data, the convention of :meth:`TarFlow.nll_bits_per_dim`."""
        check_int(n_bins, "n_bins", low=2)
        return (-self.log_prob(x) / self.data_dim + math.log(n_bins / 2)) / math.log(2)

    @torch.no_grad()
    def sample(
        self,
        n: int,
        temperature: float = 1.0,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Draw ``n`` images ``(n, C, H, W)``: ``z ~ N(0, temperature^2 I)``, then :meth:`inverse`.

        ``generator`` (or a fresh one seeded with ``seed``; neither: nondeterministic) draws the prior
        noise; the global generator is never used.
        """
        check_int(n, "n", low=1)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a float >= 0, got {temperature!r}")
        param = next(self.parameters())
        gen = make_generator(seed, generator, device=param.device)
        z = torch.randn(n, *self.latent_shape, generator=gen, device=param.device, dtype=param.dtype)
        return self.inverse(z * temperature)
