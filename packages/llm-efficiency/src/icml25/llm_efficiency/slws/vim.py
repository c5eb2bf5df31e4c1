"""Stochastic Layer-Wise Shuffle for Vision Mamba — ICML 2025, P13: a small bidirectional Vision Mamba (Vim).

The backbone SLWS regularises (Huang et al., ICML 2025; official code ``huangzizheng01/ShuffleMamba``:
``models_shuffle.py`` ``VisionMamba`` and ``mamba_custom.py``, after Vim, Zhu et al. 2024), in plain
PyTorch on the selective scan of :mod:`icml25.kernels.selective_scan` (reference on CPU, Triton on CUDA):

* patch embedding (a ``p × p`` stride-``p`` convolution), a class token at index 0, a learned positional
  embedding added once at the input (before any shuffle);
* ``depth`` pre-norm blocks with the Mamba ``(hidden, residual) -> (hidden, residual)`` API: ``residual =
  residual + drop_path(hidden)``, ``hidden = mixer(RMSNorm(residual))``; drop-path rates linear in depth;
* :class:`BiMambaMixer`: the bidirectional Mamba mixer (``bimamba`` v2): ``in_proj`` to ``(x, z)``, then for
  the sequence and its reverse, each with its own causal depthwise conv, ``x_proj``, ``dt_proj``, ``A`` and
  ``D``, a selective scan gated by ``silu(z)``; the two outputs averaged (the official ``if_devide_out``)
  and ``out_proj``;
* a final ``residual + drop_path(hidden)``, RMSNorm, and a linear head on token 0 (the class token).

``shuffle_rate > 0`` wraps the blocks with :class:`~icml25.llm_efficiency.slws.StochasticLayerShuffle`.
Not here: the fused add-norm kernels and the register tokens of ``models_reg.py``.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from icml25.kernels.checks import check_float, check_int
from icml25.kernels.rng import isolated_rng
from icml25.kernels.selective_scan import selective_scan
from icml25.llm_efficiency.slws.shuffle import Schedule, StochasticLayerShuffle

__all__ = ["BiMambaMixer", "VimBlock", "VimTiny"]


class RMSNorm(nn.Module):
    """``x / rms(x) · weight`` over the last dim (Mamba's RMSNorm, eps 1e-5)."""

    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _Direction(nn.Module):
    """One scan direction of the mixer: causal depthwise conv, ``x_proj``, ``dt_proj``, ``A_log``, ``D``."""

    def __init__(self, d_inner: int, d_state: int, d_conv: int, dt_rank: int) -> None:
        super().__init__()
        self.d_state, self.dt_rank = d_state, dt_rank
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_inner, bias=True)
        # Mamba's initialisation: dt_proj weight ±dt_rank^-0.5, softplus(bias) log-uniform in [1e-3, 0.1],
        # A = -[1..N] per channel (S4D-real), D = 1.
        nn.init.uniform_(self.dt_proj.weight, -(dt_rank**-0.5), dt_rank**-0.5)
        dt = torch.exp(torch.rand(d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(
            min=1e-4
        )
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log = nn.Parameter(
            torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1)
        )
        self.D = nn.Parameter(torch.ones(d_inner))

    def forward(self, x: torch.Tensor, z: torch.Tensor, backend: str | None) -> torch.Tensor:
        """``x, z [B, E, L]`` -> gated scan output ``[B, E, L]``."""
        L = x.shape[-1]
        x = F.silu(self.conv1d(x)[..., :L])
        dbl = self.x_proj(x.transpose(1, 2))  # [B, L, R + 2N]
        dt, Bm, Cm = torch.split(dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = (dt @ self.dt_proj.weight.t()).transpose(1, 2)  # [B, E, L], bias added inside (delta_bias)
        A = -torch.exp(self.A_log.float())
        return selective_scan(
            x, dt.contiguous(), A, Bm.transpose(1, 2).contiguous(), Cm.transpose(1, 2).contiguous(),
            self.D.float(), z, self.dt_proj.bias.float(), delta_softplus=True, backend=backend,
        )  # fmt: skip


class BiMambaMixer(nn.Module):
    """The bidirectional Mamba mixer of Vim / ShuffleMamba (``bimamba_type="v2"``, outputs averaged).

    Args:
        d_model: token width d.
        d_state: SSM state size N (Mamba 16; ours 8).
        expand: inner width ``E = expand · d``.
        d_conv: causal depthwise convolution width (Mamba 4).
        dt_rank: rank of the Δ projection; None: ``ceil(d / 16)``.
        backend: selective-scan backend (``None``: Triton on CUDA, the reference elsewhere).

    ``forward(x [B, L, d]) -> [B, L, d]``.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        expand: int = 2,
        d_conv: int = 4,
        dt_rank: int | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        d_model = check_int(d_model, "d_model", low=1)
        d_state = check_int(d_state, "d_state", low=1)
        expand = check_int(expand, "expand", low=1)
        d_conv = check_int(d_conv, "d_conv", low=1)
        dt_rank = math.ceil(d_model / 16) if dt_rank is None else check_int(dt_rank, "dt_rank", low=1)
        d_inner = expand * d_model
        self.backend = backend
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.fwd = _Direction(d_inner, d_state, d_conv, dt_rank)
        self.bwd = _Direction(d_inner, d_state, d_conv, dt_rank)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xz = self.in_proj(x).transpose(1, 2)  # [B, 2E, L]
        u, z = xz.chunk(2, dim=1)
        y_f = self.fwd(u, z, self.backend)
        y_b = self.bwd(u.flip(-1), z.flip(-1), self.backend).flip(-1)
        return self.out_proj(((y_f + y_b) / 2).transpose(1, 2))


def _drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Stochastic depth per sample (timm's ``drop_path``; torch's global generator, like dropout)."""
    if rate == 0.0 or not training:
        return x
    keep = (torch.rand(x.shape[0], 1, 1, device=x.device) >= rate).to(x.dtype)
    return x * keep / (1.0 - rate)


class VimBlock(nn.Module):
    """A pre-norm Vim block with the Mamba ``(hidden, residual)`` API.

    ``forward(hidden [B, L, d], residual=None) -> (mixer(norm(residual')), residual')`` with
    ``residual' = residual + drop_path(hidden)`` (``hidden`` when ``residual`` is None).
    """

    def __init__(self, d_model: int, mixer: nn.Module, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm = RMSNorm(d_model)
        self.mixer = mixer
        self.drop_path = check_float(drop_path, "drop_path", low=0, high=1)

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = (
            hidden if residual is None else residual + _drop_path(hidden, self.drop_path, self.training)
        )
        return self.mixer(self.norm(residual)), residual


class VimTiny(nn.Module):
    """A small bidirectional Vision Mamba classifier (class token at index 0, head on token 0).

    Args:
        image_size: square input side (sklearn digits: 8).
        patch_size: patch side; ``(image_size / patch_size)²`` patch tokens plus the class token.
        in_chans: input channels. num_classes: classes of the head.
        d_model, depth, d_state, expand: width, blocks, SSM state, mixer expansion.
        drop_path: the last block's drop-path rate (linear in depth from 0, official rule).
        shuffle_rate: SLWS maximum rate P; 0 builds a plain model (no wrapper).
        schedule, per_sample, keep_first, generator: SLWS options (:class:`StochasticLayerShuffle`).
        seed: initialise the parameters under ``isolated_rng(seed)`` (the caller's global generator is
            untouched); None uses the global generator (PyTorch convention).
        backend: selective-scan backend.

    ``forward(images [B, C, H, W]) -> logits [B, num_classes]``; :meth:`forward_features` gives the
    normalised token sequence ``[B, L + 1, d]``.
    """

    def __init__(
        self,
        image_size: int = 8,
        patch_size: int = 2,
        in_chans: int = 1,
        num_classes: int = 10,
        d_model: int = 64,
        depth: int = 6,
        d_state: int = 8,
        expand: int = 2,
        drop_path: float = 0.1,
        shuffle_rate: float = 0.0,
        schedule: Schedule = "linear",
        *,
        per_sample: bool = False,
        keep_first: int = 0,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        image_size = check_int(image_size, "image_size", low=1)
        patch_size = check_int(patch_size, "patch_size", low=1)
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be divisible by patch_size ({patch_size})")
        in_chans = check_int(in_chans, "in_chans", low=1)
        num_classes = check_int(num_classes, "num_classes", low=1)
        d_model = check_int(d_model, "d_model", low=1)
        depth = check_int(depth, "depth", low=1)
        drop_path = check_float(drop_path, "drop_path", low=0, high=1)
        shuffle_rate = check_float(shuffle_rate, "shuffle_rate", low=0, high=1)
        self.image_size, self.in_chans = image_size, in_chans
        self.n_patches = (image_size // patch_size) ** 2
        with isolated_rng(seed) if seed is not None else contextlib.nullcontext():
            self.patch_embed = nn.Conv2d(in_chans, d_model, patch_size, stride=patch_size)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
            self.pos_embed = nn.Parameter(torch.zeros(1, self.n_patches + 1, d_model))
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
            nn.init.trunc_normal_(self.cls_token, std=1e-6)
            rates = [float(r) for r in torch.linspace(0.0, drop_path, depth)]
            blocks = nn.ModuleList(
                VimBlock(d_model, BiMambaMixer(d_model, d_state, expand, backend=backend), r) for r in rates
            )
            self.final_drop_path = rates[-1]
            self.norm_f = RMSNorm(d_model)
            self.head = nn.Linear(d_model, num_classes)
        self.layers: nn.ModuleList = (
            StochasticLayerShuffle(
                blocks,
                shuffle_rate,
                schedule,
                per_sample=per_sample,
                keep_first=keep_first,
                generator=generator,
            )
            if shuffle_rate > 0
            else blocks
        )

    def _check_images(self, images: object) -> torch.Tensor:
        if not isinstance(images, torch.Tensor):
            raise TypeError(f"images must be a torch.Tensor [B, C, H, W], got {type(images).__name__}")
        if not images.is_floating_point():
            raise TypeError(f"images must be a floating-point tensor [B, C, H, W], got dtype {images.dtype}")
        s, c = self.image_size, self.in_chans
        if images.ndim != 4 or tuple(images.shape[1:]) != (c, s, s):
            raise ValueError(f"images must have shape [B, {c}, {s}, {s}], got {tuple(images.shape)}")
        if images.shape[0] == 0:
            raise ValueError("images must hold at least one image (B >= 1), got an empty batch")
        return images

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """``images [B, C, H, W]`` -> the final normalised tokens ``[B, n_patches + 1, d]`` (class token first)."""
        images = self._check_images(images)
        x = self.patch_embed(images.to(self.pos_embed.dtype)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        hidden, residual = x, None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual=residual)
        residual = residual + _drop_path(hidden, self.final_drop_path, self.training)
        return self.norm_f(residual)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, num_classes]`` from the class token (index 0)."""
        return self.head(self.forward_features(images)[:, 0])
