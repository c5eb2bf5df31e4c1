"""SAE evaluation metrics: FVU and explained variance named apart, sparsity, Pareto curves over k.

Two variance-based scores are reported and named apart, because the literature mixes them:

* ``fvu`` (MSAE): per-sample fraction of variance unexplained, ``var_f(x − x̂) / var_f(x)`` with the
  variance taken over the *features* of each sample, averaged over samples (the official function called
  ``explained_variance`` returns this FVU);
* ``explained_variance_batch`` (SAELens): ``1 − Σ_b ‖x_b − x̂_b‖² / Σ_b ‖x_b − x̄‖²`` with ``x̄`` the batch mean.

``sparsity`` is the MSAE "fraction of zero latents" (their "80% sparsity"), ``l0`` the mean number of
active latents per sample, ``dead_frac`` the fraction of latents that never fire on the data.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from icml25.interpretability.sae.base import SparseAutoencoder


class _MetricSums:
    """Streaming sums so that metrics over many batches equal the metrics over their concatenation."""

    def __init__(self, d_sae: int) -> None:
        self.n = 0
        self.fvu = 0.0
        self.cos = 0.0
        self.l0 = 0.0
        self.sq_err = 0.0
        self.sq_x = 0.0
        self.sum_x: torch.Tensor | None = None
        self.fired = torch.zeros(d_sae, dtype=torch.bool)

    @torch.no_grad()
    def add(self, x: torch.Tensor, x_hat: torch.Tensor, z: torch.Tensor) -> None:
        x, x_hat, z = x.double(), x_hat.double(), z.double()
        resid = x - x_hat
        var_x = x.var(dim=-1, unbiased=False)
        var_r = resid.var(dim=-1, unbiased=False)
        self.fvu += float((var_r / var_x.clamp_min(1e-30)).sum())
        self.cos += float(torch.nn.functional.cosine_similarity(x, x_hat, dim=-1, eps=1e-30).sum())
        self.l0 += float((z != 0).sum())
        self.sq_err += float(resid.pow(2).sum())
        self.sq_x += float(x.pow(2).sum())
        s = x.sum(dim=0).cpu()
        self.sum_x = s if self.sum_x is None else self.sum_x + s
        self.fired |= (z != 0).any(dim=0).cpu()
        self.n += x.shape[0]

    def result(self) -> dict[str, float]:
        n, d_sae = self.n, self.fired.numel()
        assert self.sum_x is not None
        total = self.sq_x - float(self.sum_x.pow(2).sum()) / n  # Σ‖x − x̄‖²
        l0 = self.l0 / n
        return {
            "fvu": self.fvu / n,
            "explained_variance_batch": 1.0 - self.sq_err / total if total > 0 else math.nan,
            "cosine": self.cos / n,
            "mse": self.sq_err / (n * self.sum_x.numel()),
            "l0": l0,
            "sparsity": 1.0 - l0 / d_sae,
            "dead_frac": 1.0 - float(self.fired.float().mean()),
        }


def _check_pair(x: torch.Tensor, x_hat: torch.Tensor, z: torch.Tensor) -> None:
    for name, t in (("x", x), ("x_hat", x_hat), ("z", z)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.ndim != 2 or x.shape != x_hat.shape:
        raise ValueError(f"x and x_hat must both be [B, d], got {tuple(x.shape)} and {tuple(x_hat.shape)}")
    if z.ndim != 2 or z.shape[0] != x.shape[0]:
        raise ValueError(f"z must be [B={x.shape[0]}, d_sae], got {tuple(z.shape)}")
    if x.shape[0] == 0:
        raise ValueError("x must hold at least one sample, got an empty batch")
    if z.shape[1] == 0:
        raise ValueError(f"z must have at least one latent column [B, d_sae >= 1], got {tuple(z.shape)}")
    for name, t in (("x", x), ("x_hat", x_hat), ("z", z)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(
                f"{name} must be finite, got {int((~torch.isfinite(t)).sum())} NaN/Inf values in shape {tuple(t.shape)}"
            )


def sae_metrics(x: torch.Tensor, x_hat: torch.Tensor, z: torch.Tensor) -> dict[str, float]:
    """Reconstruction and sparsity metrics of one evaluation set.

    Args:
        x: [B, d] inputs; x_hat: [B, d] reconstructions; z: [B, d_sae] latents.

    Returns:
        ``fvu``, ``explained_variance_batch``, ``cosine``, ``mse``, ``l0``, ``sparsity``, ``dead_frac``.
    """
    _check_pair(x, x_hat, z)
    acc = _MetricSums(z.shape[1])
    acc.add(x, x_hat, z)
    return acc.result()


@torch.no_grad()
def pareto_curve(
    model: SparseAutoencoder, X: torch.Tensor, ks: Sequence[int | None], batch_size: int = 4096
) -> list[dict[str, float | int | None]]:
    """Metrics of ``model`` on ``X`` [N, d_in] capped at each inference k (``None``: the model's default).

    Returns one dict per k: ``{"k": k, **sae_metrics}`` (computed in streaming over batches).
    """
    if not isinstance(model, SparseAutoencoder):
        raise TypeError(f"model must be a SparseAutoencoder, got {type(model).__name__}")
    X2, _ = model._flatten(X, "X")
    if X2.shape[0] == 0:
        raise ValueError("X must hold at least one sample, got an empty tensor")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    was_training = model.training
    model.eval()
    rows: list[dict[str, float | int | None]] = []
    try:
        for k in ks:
            acc = _MetricSums(model.d_sae)
            for xb in X2.split(batch_size):
                z = model.encode(xb, k)
                acc.add(xb, model.decode(z), z)
            rows.append({"k": k, **acc.result()})
    finally:
        model.train(was_training)
    return rows


def fvu_auc_log2k(ks: Sequence[int], fvus: Sequence[float]) -> float:
    """Area under the FVU-vs-log₂k curve (trapezoid rule), e.g. over k ∈ {4, 8, 16, 32, 64}."""
    if len(ks) != len(fvus) or len(ks) < 2:
        raise ValueError(f"ks and fvus must have the same length >= 2, got {len(ks)} and {len(fvus)}")
    xs = [math.log2(k) for k in ks]
    if any(b <= a for a, b in itertools.pairwise(xs)):
        raise ValueError(f"ks must be strictly increasing, got {list(ks)}")
    return sum((b - a) * (fa + fb) / 2 for a, b, fa, fb in zip(xs, xs[1:], fvus, fvus[1:]))
