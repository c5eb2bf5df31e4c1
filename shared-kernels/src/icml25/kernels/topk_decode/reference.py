"""Sparse top-k decode, reference implementation (plain PyTorch, the specification and test oracle).

A top-k sparse autoencoder keeps, per sample, ``k`` latent activations ``values[b, j]`` at latent indices
``idx[b, j]``. Decoding is the weighted sum of the selected decoder rows::

    out[b] = sum_j values[b, j] * W_dec[idx[b, j]]                       # [B, d]

which costs O(B·k·d) instead of the O(B·n·d) of the dense ``z @ W_dec``. ``F.embedding_bag`` in ``"sum"``
mode with ``per_sample_weights`` is exactly this operation, and autograd differentiates it w.r.t. both the
values and the table.

The *prefix* variant serves nested-k (Matryoshka-over-k) SAEs: with the top ``k_max`` entries sorted by
decreasing activation, the level-``k_i`` reconstruction uses the first ``k_i`` entries, so all levels are
prefix sums of the same weighted rows. Summing each segment ``[k_{i-1}, k_i)`` once (one ``embedding_bag``
with one bag per segment) and accumulating over levels gives all L reconstructions for the cost of one
``k_max`` decode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def topk_decode_reference(values: torch.Tensor, idx: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """``out[b] = Σ_j values[b, j] · W_dec[idx[b, j]]``.

    Args:
        values: [B, k] float activations.
        idx: [B, k] int64 latent indices in ``[0, n)``.
        W_dec: [n, d] decoder rows.

    Returns:
        [B, d] in the dtype of ``W_dec``.
    """
    if values.shape[1] == 0:  # embedding_bag rejects empty bags of width 0 in 2-D mode
        return W_dec.new_zeros(values.shape[0], W_dec.shape[1])
    return F.embedding_bag(idx, W_dec, per_sample_weights=values.to(W_dec.dtype), mode="sum")


def topk_decode_prefix_reference(
    values: torch.Tensor, idx: torch.Tensor, W_dec: torch.Tensor, ks: Sequence[int]
) -> torch.Tensor:
    """All nested-prefix decodes: ``out[l, b] = Σ_{j < ks[l]} values[b, j] · W_dec[idx[b, j]]``.

    Args:
        values: [B, k_max] activations, ordered so that every prefix is a level (e.g. ``torch.topk`` sorted).
        idx: [B, k_max] int64 latent indices.
        W_dec: [n, d] decoder rows.
        ks: L strictly increasing prefix lengths, ``1 <= ks[0] < ... < ks[-1] <= k_max``.

    Returns:
        [L, B, d].
    """
    B, _ = values.shape
    L, k_last = len(ks), ks[-1]
    if B == 0:
        return W_dec.new_zeros(L, 0, W_dec.shape[1])
    # One embedding_bag over B·L bags: bag (b, l) is the segment [ks[l-1], ks[l]) of row b. Rows are
    # contiguous in the flattened [B, k_last] layout, so the bag offsets are b·k_last + ks[l-1].
    starts = torch.tensor([0, *ks[:-1]], device=idx.device)
    offsets = (torch.arange(B, device=idx.device)[:, None] * k_last + starts[None, :]).reshape(-1)
    seg = F.embedding_bag(
        idx[:, :k_last].reshape(-1),
        W_dec,
        offsets,
        mode="sum",
        per_sample_weights=values[:, :k_last].reshape(-1).to(W_dec.dtype),
    )
    # Level l is the sum of segments 0..l: a cumulative sum over the level axis.
    return seg.view(B, L, -1).cumsum(dim=1).transpose(0, 1)


def dense_decode(values: torch.Tensor, idx: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """The obvious baseline and oracle: scatter into a dense [B, n] code, then ``z @ W_dec``."""
    z = torch.zeros(values.shape[0], W_dec.shape[0], dtype=W_dec.dtype, device=W_dec.device)
    z = z.scatter_add(1, idx, values.to(W_dec.dtype))  # scatter_add: repeated indices add up, as in the op
    return z @ W_dec
