"""The causal-LM loss: next-token cross-entropy in the Hugging Face convention, shared by two papers.

MEAP (Zhuang et al., "Mask-Enhanced Autoregressive Prediction: Pay Less Attention to Learn More", catalog
P04) trains with ordinary next-token cross-entropy on corrupted inputs; the PENCIL experiment (Yang et al.,
"PENCIL: Long Thoughts with Short Memory", catalog P11) trains its reduced-trace models with the same loss.
:func:`causal_lm_loss` is that loss with labels aligned with the inputs and shifted inside, so it gives
exactly the ``.loss`` of a transformers causal LM called with ``labels=``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from icml25.kernels.checks import check_tensor

__all__ = ["causal_lm_loss"]


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean next-token cross-entropy of ``(B, L, V)`` logits against ``(B, L)`` labels (HF shift:
    position ``i`` predicts ``labels[:, i+1]``; ``ignore_index`` labels are skipped).

    Raises:
        TypeError: ``logits`` is not a floating-point tensor or ``labels`` not an integer one.
        ValueError: the shapes do not match (or ``L < 2``), ``logits`` holds NaN or inf, or a label is
            outside ``[0, V)`` and is not ``ignore_index``.
    """
    check_tensor(logits, "logits", dtype="float")
    lab = check_tensor(labels, "labels", ndim=2, dtype="int")
    if lab.shape[0] == 0 or lab.shape[1] < 2:
        raise ValueError(
            f"labels must have shape (batch, L) with batch >= 1 and L >= 2, got {tuple(lab.shape)}"
        )
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(lab.shape) or logits.shape[-1] == 0:
        raise ValueError(
            f"logits must have shape (B, L, V) matching labels {tuple(lab.shape)}, got {tuple(logits.shape)}"
        )
    bad = (lab != ignore_index) & ((lab < 0) | (lab >= logits.shape[-1]))
    if bool(bad.any()):
        raise ValueError(f"labels must be in [0, {logits.shape[-1]}) or ignore_index={ignore_index}")
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels[:, 1:].reshape(-1),
        ignore_index=ignore_index,
    )
