"""Interpreting CLIP with Hierarchical Sparse Autoencoders (MSAE) — ICML 2025, P22: the Matryoshka-over-k SAE.

MSAE (Zaigrajew, Baniecki, Biecek) trains one TopK SAE at several nested sparsity levels at once: a single
set of pre-activations is cut with ``TopK_{k_1} ⊂ ... ⊂ TopK_{k_L}`` (the last level usually ``k_L = n``,
i.e. plain ReLU), each level is decoded, and the loss is the weighted mean of the levels' reconstruction
errors. The model then reconstructs well at *every* k, so it can be capped at inference anywhere between
very sparse and uncapped ReLU.

This nests over the **number of active latents k** — not over dictionary prefixes as in the "Matryoshka
SAEs" of Bussmann et al. (2025); hence the name ``MatryoshkaKSAE`` (``MatryoshkaSAE`` is an alias).

Efficiency: ``torch.topk`` is taken once at the largest sparse level with sorted output, so every level is a
prefix of the same sorted entries and all sparse reconstructions come from one prefix decode
(:func:`icml25.kernels.topk_decode.topk_decode_prefix`, O(B·k_max·d)); the dense ReLU level (k = n) is a
plain matmul.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from icml25.interpretability.sae.base import SparseAutoencoder, scatter_latents
from icml25.interpretability.sae.losses import reconstruction_loss
from icml25.kernels.checks import check_int
from icml25.kernels.topk_decode import topk_decode_prefix

WEIGHTINGS = ("UW", "RW")


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


def nesting_list(k0: int, d_sae: int) -> list[int]:
    """MSAE's default levels: ``k0, 2·k0, 4·k0, ...`` below ``d_sae``, then ``d_sae`` (the ReLU level).

    >>> nesting_list(64, 6144)
    [64, 128, 256, 512, 1024, 2048, 4096, 6144]
    """
    check_int(d_sae, "d_sae", low=1)
    check_int(k0, "k0", low=1, high=d_sae)
    ks = []
    k = k0
    while k < d_sae:
        ks.append(k)
        k *= 2
    return [*ks, d_sae]


def level_weights(weighting: str | Sequence[float], n_levels: int) -> list[float]:
    """Level weights: ``"UW"`` → all 1; ``"RW"`` → ``L, L−1, ..., 1`` (the largest weight on the smallest k).

    The official ``train.py`` comment says RW favours large k; the code (``reversed(range(1, L+1))``)
    gives the heaviest weight to the smallest k, which is what is implemented here. A sequence is used as
    given (length L, non-negative, positive sum).
    """
    if isinstance(weighting, str):
        key = weighting.upper()
        if key == "UW":
            return [1.0] * n_levels
        if key == "RW":
            return [float(n_levels - i) for i in range(n_levels)]
        raise ValueError(f"weighting must be one of {WEIGHTINGS} or a sequence of floats, got {weighting!r}")
    w = [float(v) for v in weighting]
    if len(w) != n_levels:
        raise ValueError(f"weighting must have one weight per level ({n_levels}), got {len(w)}: {w}")
    if any(v < 0 for v in w) or sum(w) <= 0:
        raise ValueError(f"weighting must be non-negative with a positive sum, got {w}")
    return w


def _resolve_ks(ks: Sequence[int] | int, d_sae: int) -> list[int]:
    if isinstance(ks, int) and not isinstance(ks, bool):
        return nesting_list(ks, d_sae)
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Sequence) or len(ks) == 0:
        raise TypeError(f"ks must be an int k0 or a non-empty sequence of ints, got {ks!r}")
    vals = [check_int(v, f"ks[{i}]", low=1, high=d_sae) for i, v in enumerate(ks)]
    clean = sorted(set(vals))
    if clean != vals:
        warnings.warn(
            f"ks {vals} is not strictly increasing: using sorted, de-duplicated {clean}", stacklevel=3
        )
    return clean


class MatryoshkaKSAE(SparseAutoencoder):
    """MSAE: a TopK SAE trained at nested k levels ``k_1 < ... < k_L`` with a weighted NMSE over levels.

    Level i latents: ``z_i = ReLU(TopK_{k_i}(pre))`` (for ``k_i = d_sae``: ``ReLU(pre)``), reconstruction
    ``x̂_i = z_i @ W_dec + b_dec``; loss ``Σ_i w_i NMSE(x̂_i, x) / Σ_i w_i``. Default inference is uncapped
    (ReLU); ``encode(x, k)`` / ``forward(x, k)`` cap at any k.

    Args:
        d_in, d_sae: sizes.
        ks: nesting list (sorted and de-duplicated with a warning if needed), or an int ``k0`` for MSAE's
            default ``nesting_list(k0, d_sae)``.
        weighting: ``"UW"`` (uniform), ``"RW"`` (reverse: heavier on small k) or explicit level weights.
        loss_kind: ``"nmse"`` (ICML code, default) or ``"mse"``.
        init_norm, seed: as in :class:`SparseAutoencoder` (``seed`` gives reproducible initial weights
            without touching the global random state).
    """

    default_lr = 1e-4

    def __init__(
        self,
        d_in: int,
        d_sae: int,
        ks: Sequence[int] | int = 64,
        weighting: str | Sequence[float] = "UW",
        *,
        loss_kind: str = "nmse",
        init_norm: float = 0.1,
        seed: int | None = None,
    ) -> None:
        super().__init__(d_in, d_sae, loss_kind=loss_kind, init_norm=init_norm, seed=seed)
        self.ks = _resolve_ks(ks, self.d_sae)
        self.weights = level_weights(weighting, len(self.ks))
        self.weighting = weighting if isinstance(weighting, str) else "custom"
        # Levels below d_sae go through the sparse prefix decode; a k = d_sae level is dense ReLU.
        self.sparse_ks = [k for k in self.ks if k < self.d_sae]

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return pre.relu()

    def _levels(
        self, pre: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
        """Reconstructions of all levels [B, d] from pre-activations [B, n], plus the sorted top-k_max code."""
        recons: list[torch.Tensor] = []
        values = idx = None
        if self.sparse_ks:
            # Sorted top-k once: level k_i is the first k_i entries (nested supports by construction).
            values, idx = torch.topk(pre, self.sparse_ks[-1], dim=-1, sorted=True)
            values = values.relu()
            prefix = topk_decode_prefix(values, idx, self.W_dec, self.sparse_ks) + self.b_dec
            recons.extend(prefix.unbind(0))
        if len(self.sparse_ks) < len(self.ks):
            recons.append(pre.relu() @ self.W_dec + self.b_dec)
        return recons, values, idx

    def forward_levels(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Reconstructions ``[..., d_in]`` and dense latents ``[..., d_sae]`` of every level (smallest k first)."""
        x2, lead = self._flatten(x)
        pre = self.pre_activations(x2)
        recons, values, idx = self._levels(pre)
        latents = []
        for k in self.sparse_ks:
            assert values is not None and idx is not None
            latents.append(scatter_latents(values[:, :k], idx[:, :k], self.d_sae))
        if len(self.sparse_ks) < len(self.ks):
            latents.append(pre.relu())
        return (
            [r.reshape(*lead, self.d_in) for r in recons],
            [z.reshape(*lead, self.d_sae) for z in latents],
        )

    def loss(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        x2 = self._batch(x)
        pre = self.pre_activations(x2)
        recons, _, _ = self._levels(pre)
        loss = msae_loss(recons, x2, self.weights, self.loss_kind)
        with torch.no_grad():
            # Dead-latent statistics follow the least sparse level, as in the official code.
            self._update_fired(
                (pre > 0).any(dim=0) if self.ks[-1] == self.d_sae else self._fired_top(pre), len(x2)
            )
        return loss, {"recon": float(loss.detach())}

    def _fired_top(self, pre: torch.Tensor) -> torch.Tensor:
        values, idx = torch.topk(pre, self.ks[-1], dim=-1)
        fired = torch.zeros(self.d_sae, dtype=torch.bool, device=pre.device)
        fired[idx[values > 0]] = True
        return fired

    def config(self) -> dict[str, Any]:
        weighting = list(self.weights) if self.weighting == "custom" else self.weighting
        return {**super().config(), "ks": list(self.ks), "weighting": weighting}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ks={self.ks}, weighting={self.weighting!r}"


#: The issue's name for the same model (nested over k; not Bussmann et al.'s dictionary-prefix Matryoshka).
MatryoshkaSAE = MatryoshkaKSAE
