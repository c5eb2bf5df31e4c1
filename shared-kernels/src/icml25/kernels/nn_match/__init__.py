"""AsymRnR: Video DiT Acceleration with Asymmetric Reduction and Restoration — ICML 2025, P21: NN matching.
Nearest-neighbour matching ops.

AsymRnR (Sun et al., ICML 2025; official code ``wenhao728/AsymRnR``) matches every source token to its most
similar destination token, per head, before reducing the sequence. For video transformers the dense
``Ns × Nd`` similarity matrix is the memory bottleneck (CogVideoX-5B: ~2.2k × 15.3k × 48 heads ≈ 6.4 GB in
float32), so the op here never materialises it outside the reference. Public ops:

* :func:`nearest_neighbor` — ``(similarity [..., Ns], index [..., Ns])`` of each source's most similar
  destination, metric ``"euclidean"`` (negative squared distance), ``"cosine"`` or ``"dot"``; batched over
  any leading dims (batch, heads). Backends: the chunked torch path (any device, peak memory
  ``chunk × chunk`` per leading index) or Triton (CUDA, a tiled running argmax).
* :func:`nearest_neighbor_reference` — the dense definition; :func:`nearest_neighbor_chunked_reference` —
  the streaming torch path; :func:`similarity_matrix_reference` — the dense matrix.

Ties go to the lowest destination index on every backend. Inputs are checked for NaN/Inf (a NaN would
silently change the matches) and for squared norms that overflow float32 (euclidean, dot) by default
(``check_finite=True``, one host sync). Forward only.
"""

from __future__ import annotations

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.checks import check_int, check_tensor
from icml25.kernels.nn_match.reference import (
    nearest_neighbor_chunked_reference,
    nearest_neighbor_reference,
    similarity_matrix_reference,
    unit_rows,
)

__all__ = [
    "METRICS",
    "SQUARED_NORM_LIMIT",
    "check_token_values",
    "check_tokens",
    "nearest_neighbor",
    "nearest_neighbor_chunked_reference",
    "nearest_neighbor_reference",
    "similarity_matrix_reference",
]

METRICS = ("euclidean", "cosine", "dot")
"""Similarity measures of :func:`nearest_neighbor` (``"euclidean"`` is ``−‖x − y‖²``)."""


def check_tokens(t: object, name: str) -> torch.Tensor:
    """``t`` as a floating-point ``[..., N, C]`` token tensor (``C >= 1``); values are not inspected.

    Raises ``TypeError``/``ValueError`` naming ``name``. The token reducers built on this op
    (:mod:`icml25.generative_models.asymrnr`) share it, so every entry point states the same form.
    """
    form = "[..., N, C]"
    t = check_tensor(t, name, finite=False)
    if t.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dims {form}, got shape {tuple(t.shape)}")
    if t.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one feature (C >= 1), got shape {tuple(t.shape)}")
    return t


SQUARED_NORM_LIMIT = 1e37
"""Largest squared row norm accepted for ``"euclidean"``/``"dot"``: ``‖x‖²`` and ``2⟨x, y⟩`` stay finite in
float32 (max ≈ 3.4e38)."""


def check_token_values(t: torch.Tensor, name: str, metric: str = "euclidean", *, hint: str = "") -> None:
    """Reject float tokens ``t [..., C]`` (rows along the last dim) whose matches would be silently wrong:
    NaN/Inf, or (unless ``metric="cosine"``, which normalises rows first) a squared row norm of
    :data:`SQUARED_NORM_LIMIT` or more. One host sync; the form is :func:`check_tokens`' job.

    ``hint`` is appended to the non-finite message (e.g. how the caller skips the check).
    """
    if not t.numel():
        return
    try:
        check_tensor(t, name)
    except ValueError as err:
        raise ValueError(f"{err}{hint}") from None
    if metric != "cosine":
        sq = float(t.double().square().sum(-1).max())
        if not sq < SQUARED_NORM_LIMIT:
            raise ValueError(
                f"{name} has a squared row norm {sq:.3g} that overflows float32 {metric} scores "
                f"(limit {SQUARED_NORM_LIMIT:g}); rescale the tokens or use metric='cosine'"
            )


def nearest_neighbor(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    metric: str = "euclidean",
    chunk: int = 1024,
    check_finite: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The most similar destination ``y`` of every source ``x`` and its similarity.

    Args:
        x: ``[..., Ns, C]`` source tokens (leading dims, e.g. batch and heads, as in ``y``).
        y: ``[..., Nd, C]`` destination tokens, ``Nd >= 1``.
        metric: ``"euclidean"`` (similarity ``−‖x − y‖²``, via ``‖x‖² − 2⟨x, y⟩ + ‖y‖²``), ``"cosine"`` or
            ``"dot"``.
        chunk: block size (sources and destinations) of the torch path; peak extra memory ``chunk²`` floats
            per leading index instead of ``Ns × Nd``.
        check_finite: reject NaN/Inf and float32-overflowing squared norms (one host sync).
        backend: ``"auto"``/``"reference"``/``"triton"``; see :func:`icml25.kernels.select_backend`.

    Returns:
        ``(similarity [..., Ns] float32, index [..., Ns] int64)``; ties go to the lowest destination index.
    """
    x = check_tokens(x, "x")
    y = check_tokens(y, "y")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    chunk = check_int(chunk, "chunk", low=1)  # block size of the torch path
    if x.shape[:-2] != y.shape[:-2] or x.shape[-1] != y.shape[-1]:
        raise ValueError(
            f"y must have the leading dims {list(x.shape[:-2])} and feature dim C = {x.shape[-1]} of x "
            f"(x {tuple(x.shape)} = [..., Ns, C]), got shape {tuple(y.shape)} (expected [..., Nd, C])"
        )
    if y.shape[-2] == 0 and x.shape[-2] > 0 and x[..., 0, 0].numel():
        raise ValueError(f"y must hold at least one destination (Nd >= 1), got shape {tuple(y.shape)}")
    if y.device != x.device:
        raise ValueError(f"y must be on the device of x ({x.device}), got {y.device}")
    if check_finite:
        hint = " (pass check_finite=False to skip this check)"
        check_token_values(x, "x", metric, hint=hint)
        check_token_values(y, "y", metric, hint=hint)
    lead, ns, nd, c = x.shape[:-2], x.shape[-2], y.shape[-2], x.shape[-1]
    which = select_backend(x, y, backend=backend)
    if which == "triton" and x.numel() and y.numel():
        from icml25.kernels.nn_match import triton as tri

        xs, ys = (x, y) if metric != "cosine" else (unit_rows(x), unit_rows(y))
        xs, ys = xs.reshape(-1, ns, c), ys.reshape(-1, nd, c)
        if metric == "euclidean":
            ysq = ys.float().square().sum(-1)
        else:
            ysq = torch.zeros(ys.shape[:2], device=ys.device)
        val, idx = tri.nearest_neighbor_fwd(xs, ys, ysq)
        if metric == "euclidean":
            val = (val - xs.float().square().sum(-1)).clamp_max(0.0)
        else:
            val = val * 0.5
        return val.reshape(*lead, ns), idx.reshape(*lead, ns)
    return nearest_neighbor_chunked_reference(x, y, metric, chunk)
