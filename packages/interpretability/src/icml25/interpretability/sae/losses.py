"""SAE training losses: normalised and plain reconstruction error, the scale-free L1 penalty.

All losses take flattened batches ``[B, d]`` and return a scalar. The reconstruction error of the MSAE
ICML code is the *per-sample* normalised MSE ``‖x̂ − x‖² / ‖x − mean_input‖²`` averaged over the batch
(``mean_input = 0`` for mean-centred inputs); the refactored ``main`` branch of the official repository
uses the plain MSE instead. Both are available (``kind="nmse" | "mse"``); the reproduction pins NMSE.
"""

from __future__ import annotations

import torch

RECON_KINDS = ("nmse", "mse")
_EPS = 1e-12


def nmse(x_hat: torch.Tensor, x: torch.Tensor, mean_input: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample normalised MSE ``mean_b ‖x̂_b − x_b‖² / ‖x_b − mean_input‖²`` for [B, d] inputs."""
    ref = x if mean_input is None else x - mean_input
    num = (x_hat - x).pow(2).mean(dim=-1)
    den = ref.pow(2).mean(dim=-1).clamp_min(_EPS)  # an all-zero sample would divide by zero
    return (num / den).mean()


def reconstruction_loss(x_hat: torch.Tensor, x: torch.Tensor, kind: str = "nmse") -> torch.Tensor:
    """``nmse`` (MSAE ICML branch, default) or ``mse`` (official refactored branch) between [B, d] tensors."""
    if kind == "nmse":
        return nmse(x_hat, x)
    if kind == "mse":
        return (x_hat - x).pow(2).mean()
    raise ValueError(f"kind must be one of {RECON_KINDS}, got {kind!r}")


def normalized_l1(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """MSAE's sparsity penalty of the ReLU SAE: ``mean_b Σ_j |z_bj| / ‖x_b‖`` (scale-free L1)."""
    return (z.abs().sum(dim=-1) / x.norm(dim=-1).clamp_min(_EPS)).mean()
