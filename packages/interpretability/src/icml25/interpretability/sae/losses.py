"""Interpreting CLIP with Hierarchical Sparse Autoencoders (MSAE) — ICML 2025, P22: SAE training losses.

All losses take flattened batches ``[B, d]`` and return a scalar. The reconstruction error of the MSAE
ICML code is the *per-sample* normalised MSE ``‖x̂ − x‖² / ‖x − mean_input‖²`` averaged over the batch
(``mean_input = 0`` for mean-centred inputs); the refactored ``main`` branch of the official repository
uses the plain MSE instead. Both are available (``kind="nmse" | "mse"``); the reproduction pins NMSE.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def msae_loss(
    recons: Sequence[torch.Tensor],
    x: torch.Tensor,
    weights: Sequence[float] | torch.Tensor,
    kind: str = "nmse",
) -> torch.Tensor:
    """Matryoshka-over-k loss ``Σ_i w_i · L(x̂_i, x) / Σ_i w_i``.

    Args:
        recons: L reconstructions, each [B, d] (one per nesting level, smallest k first).
        x: [B, d] the (preprocessed) input.
        weights: L non-negative level weights (UW: all 1; RW: L, L-1, ..., 1).
        kind: ``"nmse"`` or ``"mse"``.
    """
    w = torch.as_tensor(weights, dtype=x.dtype, device=x.device)
    if w.ndim != 1 or w.numel() != len(recons):
        raise ValueError(f"weights must have one entry per level ({len(recons)}), got shape {tuple(w.shape)}")
    if bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {w.tolist()}")
    total = sum(wi * reconstruction_loss(r, x, kind) for wi, r in zip(w, recons))
    return total / w.sum()


def normalized_l1(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """MSAE's sparsity penalty of the ReLU SAE: ``mean_b Σ_j |z_bj| / ‖x_b‖`` (scale-free L1)."""
    return (z.abs().sum(dim=-1) / x.norm(dim=-1).clamp_min(_EPS)).mean()
