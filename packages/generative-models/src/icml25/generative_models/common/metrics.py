"""Sample-quality metrics shared by the generative-model reproductions.

:func:`sliced_wasserstein` compares two sample sets through random 1-D projections (bilevel diffusion P30,
variational consistency training P37, URAE P28); :func:`high_freq_energy` measures the detail of small
grey-scale images by their discrete Laplacian (TarFlow P33, density guidance P49).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from icml25.kernels.checks import check_int, check_tensor
from icml25.kernels.rng import make_generator

__all__ = ["high_freq_energy", "sliced_wasserstein"]


def sliced_wasserstein(
    x: Tensor, y: Tensor, n_proj: int = 128, generator: torch.Generator | None = None, seed: int | None = 0
) -> float:
    """Sliced 1-Wasserstein distance between sample sets ``x`` ``(N, D)`` and ``y`` ``(M, D)``: the mean over
    ``n_proj`` random unit directions of the 1-D W1 between projections (quantiles on a common grid).
    Entries are bounded by 1e15 in magnitude (the projections' quantiles lose all precision beyond)."""
    x = check_tensor(x, "x", ndim=2, non_empty=True, max_abs=1e15)
    y = check_tensor(y, "y", ndim=2, non_empty=True, max_abs=1e15)
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"x and y must have shapes (N, D) and (M, D), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    n_proj = check_int(n_proj, "n_proj", low=1)
    g = make_generator(seed, generator)
    d = torch.randn(x.shape[1], n_proj, generator=g, dtype=torch.float64)
    d = d / d.norm(dim=0, keepdim=True)
    qs = torch.linspace(0.0, 1.0, max(len(x), len(y)), dtype=torch.float64)
    px = torch.quantile(x.double() @ d, qs, dim=0)
    py = torch.quantile(y.double() @ d, qs, dim=0)
    return float((px - py).abs().mean())


def high_freq_energy(x: np.ndarray | Tensor) -> float:
    """HF energy: the mean squared 4-neighbour discrete Laplacian over the interior pixels of
    ``(n, 1, H, W)`` images (white noise of std ``s`` adds ``20 s^2``)."""
    if isinstance(x, Tensor):
        x = x.detach().cpu().numpy()
    img = np.asarray(x, dtype=np.float64)
    if img.ndim != 4 or img.shape[1] != 1 or img.shape[0] < 1 or min(img.shape[2:]) < 3:
        raise ValueError(f"x must have shape (n, 1, H, W) with n >= 1 and H, W >= 3, got {img.shape}")
    img = img[:, 0]
    lap = (
        img[:, :-2, 1:-1] + img[:, 2:, 1:-1] + img[:, 1:-1, :-2] + img[:, 1:-1, 2:] - 4.0 * img[:, 1:-1, 1:-1]
    )
    return float(np.mean(lap**2))
