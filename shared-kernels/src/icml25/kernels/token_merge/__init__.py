"""ToMA: Token Merge with Attention for Diffusion Models — ICML 2025, P26: token-merge ops.

Dense, GPU-friendly token merging (Lu et al., ICML 2025; official code ``WenboLuu/ToMA``): destinations
chosen per tile by greedy facility-location (submodular) maximisation, merged by an attention-like soft
assignment and unmerged by its transpose, all batched matmuls with no sort or scatter. The semantics are in
:mod:`icml25.kernels.token_merge.reference`. Public ops:

* :func:`facility_location_greedy` — greedy facility location over each group of tokens ``[G, n, C]`` ->
  ``[G, k]``. Reference (any device) or Triton (CUDA, one program per tile, ``n <= 256``).
* :func:`tile_soft_merge` — ``(merged [G, d, Cv], A [G, d, n])``: soft assignment ``A`` (softmax over
  destinations) and the merged states ``(A / rowsum A) · values``. Reference or Triton (fused).
* :func:`soft_unmerge` — ``Aᵀ · y`` (a block-diagonal ``bmm``, torch only).
* :func:`soft_merge_matrices` — the explicit merge and unmerge matrices ``(M, U)``.
* :func:`facility_location_objective` — ``F(S) = Σ_i max_{j∈S} cos(x_i, x_j)`` per group.
* :func:`bipartite_soft_matching_2d` — the ToMeSD baseline (argsort + gather + ``scatter_reduce``).

Inputs are checked for NaN/Inf by default (``check_finite=True``, one host sync; a NaN would silently change
which tokens are selected); pass ``check_finite=False`` on a hot path whose inputs are known finite.
Forward only (the selection is discrete; token merging is an inference-time method).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.token_merge.reference import (
    bipartite_soft_matching_2d_reference,
    facility_location_bruteforce,
    facility_location_greedy_reference,
    facility_location_objective_reference,
    tile_soft_merge_reference,
)

__all__ = [
    "MAX_TRITON_TILE",
    "bipartite_soft_matching_2d",
    "bipartite_soft_matching_2d_reference",
    "facility_location_bruteforce",
    "facility_location_greedy",
    "facility_location_greedy_reference",
    "facility_location_objective",
    "facility_location_objective_reference",
    "soft_merge_matrices",
    "soft_unmerge",
    "tile_soft_merge",
    "tile_soft_merge_reference",
]

MAX_TRITON_TILE = 256
"""Largest group (tokens per tile ``n``, and destinations ``d``) the Triton kernels take in one program."""


# ----------------------------------------------------------------------------------------- validation
def _tokens(name: str, x: object, form: str = "[G, n, C]") -> torch.Tensor:
    """A floating tensor ``form`` (3-D) with C >= 1 features (finiteness is checked apart, on request)."""
    x = check_tensor(x, name, ndim=3, finite=False)
    if x.shape[2] == 0:
        raise ValueError(f"{name} {form} must have at least one feature (C >= 1), got shape {tuple(x.shape)}")
    return x


def _check_idx(dst_idx: object, x: torch.Tensor) -> torch.Tensor:
    G, n, _ = x.shape
    if not isinstance(dst_idx, torch.Tensor):
        raise TypeError(f"dst_idx must be an integer torch.Tensor [G, d], got {type(dst_idx).__name__}")
    if dst_idx.is_floating_point() or dst_idx.is_complex() or dst_idx.dtype == torch.bool:
        raise TypeError(
            f"dst_idx must be an integer tensor [G, d] of token indices, got dtype {dst_idx.dtype}"
        )
    if dst_idx.ndim != 2 or dst_idx.shape[0] != G:
        raise ValueError(
            f"dst_idx must have shape [G, d] with G = {G} (x.shape[0]), got {tuple(dst_idx.shape)}"
        )
    if dst_idx.shape[1] == 0:
        raise ValueError(
            f"dst_idx must hold at least one destination per group (d >= 1), got {tuple(dst_idx.shape)}"
        )
    if dst_idx.device != x.device:
        raise ValueError(f"dst_idx must be on the device of x ({x.device}), got {dst_idx.device}")
    if dst_idx.numel() and not bool(((dst_idx >= 0) & (dst_idx < n)).all()):
        raise ValueError(
            f"dst_idx must hold token indices in [0, n) = [0, {n}) (n = x.shape[1]), got values in "
            f"[{int(dst_idx.min())}, {int(dst_idx.max())}]"
        )
    return dst_idx.to(torch.int64)


def _check_values(values: object, x: torch.Tensor) -> torch.Tensor:
    if values is None:
        return x
    v = _tokens("values", values, "[G, n, Cv]")
    if v.shape[:2] != x.shape[:2]:
        raise ValueError(
            f"values must have the leading dims [G, n] = {list(x.shape[:2])} of x, got shape {tuple(v.shape)}"
        )
    if v.device != x.device:
        raise ValueError(f"values must be on the device of x ({x.device}), got {v.device}")
    return v


# -------------------------------------------------------------------------------------------- ops
def facility_location_greedy(
    x: torch.Tensor, k: int, *, check_finite: bool = True, backend: str | None = None
) -> torch.Tensor:
    """Greedy facility-location selection of ``k`` tokens in each group (ToMA's destination choice).

    Maximises ``F(S) = Σ_i max_{j∈S} cos(x_i, x_j)`` greedily: first the token with the largest summed
    similarity, then repeatedly the token with the largest gain ``Σ_i relu(cos(x_i, x_v) − m_i)``. F is
    monotone submodular, so the pick is within ``1 − 1/e`` of the best ``k``-subset (of ``F + n``, which
    is non-negative). Ties go to the lowest index.

    Args:
        x: [G, n, C] floating tokens (G groups, e.g. tiles × batch); cosine similarity, so the scale of each
            token does not matter (an all-zero token has similarity 0 with everything).
        k: destinations per group, ``1 <= k <= n``.
        check_finite: reject NaN/Inf in ``x`` (one host sync).
        backend: ``"auto"``/``"reference"``/``"triton"``; see :func:`icml25.kernels.select_backend`. The
            Triton path needs ``n <= MAX_TRITON_TILE``.

    Returns:
        int64 ``[G, k]`` token indices in selection order (distinct within a group).
    """
    x = _tokens("x", x)
    k = check_int(k, "k", low=1)
    if k > x.shape[1]:
        raise ValueError(f"k = {k} exceeds the number of tokens per group n = {x.shape[1]} (x.shape[1])")
    if check_finite:
        check_tensor(x, "x", dtype=None)
    which = select_backend(x, backend=backend)
    if which == "triton" and x.shape[0]:
        if x.shape[1] > MAX_TRITON_TILE:
            raise ValueError(
                f"x has n = {x.shape[1]} tokens per group, above the Triton tile limit MAX_TRITON_TILE = "
                f"{MAX_TRITON_TILE}; use smaller tiles or backend='reference'"
            )
        from icml25.kernels.token_merge import triton as tri

        return tri.facility_location_fwd(x, k)
    return facility_location_greedy_reference(x, k)


def facility_location_objective(
    x: torch.Tensor, idx: torch.Tensor, *, check_finite: bool = True
) -> torch.Tensor:
    """``F(S) = Σ_i max_{j∈S} cos(x_i, x_j)`` of the selection ``idx [G, k]`` in each group of ``x [G, n, C]``.

    Returns float32 ``[G]`` (torch ops only).
    """
    x = _tokens("x", x)
    if check_finite:
        check_tensor(x, "x", dtype=None)
    return facility_location_objective_reference(x, _idx_named(idx, x))


def _idx_named(idx: object, x: torch.Tensor) -> torch.Tensor:
    """dst_idx's checks, with the argument called ``idx`` in the messages."""
    try:
        return _check_idx(idx, x)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("dst_idx", "idx")) from None


def tile_soft_merge(
    x: torch.Tensor,
    dst_idx: torch.Tensor,
    values: torch.Tensor | None = None,
    *,
    scale: float = 1000.0,
    check_finite: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ToMA's attention-like soft merge in each group: ``A = softmax_dst(τ · X̂[S] X̂ᵀ)``, ``merged = (A / rowsum A) v``.

    Args:
        x: [G, n, C] tokens defining the assignment (cosine similarity to the destinations).
        dst_idx: [G, d] integer destination indices in ``[0, n)`` (e.g. :func:`facility_location_greedy`).
        values: [G, n, Cv] states to merge (ToMA merges the raw hidden states); None: ``x`` itself.
        scale: softmax temperature τ > 0 (ToMA's ``attention_scale``, default 1000: nearly hard but dense).
            The softmax runs in float32.
        check_finite: reject NaN/Inf in ``x`` and ``values`` (one host sync).
        backend: as in :func:`facility_location_greedy`; Triton needs ``n, d <= MAX_TRITON_TILE``.

    Returns:
        ``(merged [G, d, Cv] in values' dtype, A [G, d, n] float32)``; each column of ``A`` sums to 1, so
        :func:`soft_unmerge` (``Aᵀ y``) is a convex combination of destinations for every token.
    """
    x = _tokens("x", x)
    idx = _check_idx(dst_idx, x)
    v = _check_values(values, x)
    tau = check_float(scale, "scale", low=0.0, low_open=True)
    if check_finite:
        check_tensor(x, "x", dtype=None)
        if values is not None:
            check_tensor(v, "values", dtype=None)
    which = select_backend(x, v, idx, backend=backend)
    if which == "triton" and x.shape[0]:
        if max(x.shape[1], idx.shape[1]) > MAX_TRITON_TILE:
            raise ValueError(
                f"x has n = {x.shape[1]} tokens and dst_idx d = {idx.shape[1]} destinations per group; the "
                f"Triton tile limit is MAX_TRITON_TILE = {MAX_TRITON_TILE}; use backend='reference'"
            )
        from icml25.kernels.token_merge import triton as tri

        merged, A = tri.tile_soft_merge_fwd(x, idx, v, tau)
        return merged.to(v.dtype), A
    return tile_soft_merge_reference(x, idx, v, tau)


def soft_unmerge(y: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Unmerge ``y [G, d, Cv]`` with ``Aᵀ`` (``A [G, d, n]`` from :func:`tile_soft_merge`) -> ``[G, n, Cv]``.

    A plain batched matmul in float32, returned in y's dtype; NaN/Inf in ``y`` propagate to the tokens
    that use them (values are not inspected: a hot-path linear op).
    """
    if not isinstance(y, torch.Tensor) or not isinstance(A, torch.Tensor):
        bad = "y" if not isinstance(y, torch.Tensor) else "A"
        raise TypeError(f"{bad} must be a torch.Tensor (y [G, d, Cv], A [G, d, n])")
    for name, t in (("y", y), ("A", A)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.ndim != 3:
            raise ValueError(f"{name} must be 3-D (y [G, d, Cv], A [G, d, n]), got shape {tuple(t.shape)}")
    if y.shape[:2] != A.shape[:2]:
        raise ValueError(
            f"y must have the leading dims [G, d] = {list(A.shape[:2])} of A, got shape {tuple(y.shape)}"
        )
    return (A.float().transpose(1, 2) @ y.float()).to(y.dtype)


def soft_merge_matrices(
    x: torch.Tensor, dst_idx: torch.Tensor, *, scale: float = 1000.0, check_finite: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The explicit merge and unmerge matrices ``M = A / rowsum(A)`` ``[G, d, n]`` (rows sum to 1) and
    ``U = Aᵀ`` ``[G, n, d]`` (rows sum to 1), float32; arguments as :func:`tile_soft_merge`."""
    x = _tokens("x", x)
    idx = _check_idx(dst_idx, x)
    tau = check_float(scale, "scale", low=0.0, low_open=True)
    if check_finite:
        check_tensor(x, "x", dtype=None)
    # values = an empty feature axis would be rejected; the merge of the identity is not needed for A
    _, A = tile_soft_merge(x, idx, x[..., :1], scale=tau, check_finite=False, backend=backend)
    return A / A.sum(dim=2, keepdim=True), A.transpose(1, 2)


def bipartite_soft_matching_2d(
    metric: torch.Tensor,
    h: int,
    w: int,
    r: int,
    *,
    sx: int = 2,
    sy: int = 2,
    no_rand: bool = False,
    generator: torch.Generator | None = None,
    check_finite: bool = True,
) -> tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """ToMeSD's random 2-D bipartite soft matching (the baseline ToMA replaces); torch ops only.

    Args:
        metric: [B, N, C] tokens on an ``h × w`` row-major grid (``N = h · w``) defining similarity.
        h, w: grid height and width in tokens.
        r: tokens to remove (merged into their most similar destination), ``0 <= r``; capped at the
            number of sources ``N − (h // sy)(w // sx)``.
        sx, sy: destination cell size (ToMeSD default 2 × 2: one random destination per cell).
        no_rand: always the top-left token of each cell.
        generator: torch generator of the random destination draw (None: torch's global generator, the
            ToMeSD behaviour).
        check_finite: reject NaN/Inf in ``metric``.

    Returns:
        ``(merge, unmerge)`` closures; ``merge(x [B, N, c], mode="mean") -> [B, N − r, c]``,
        ``unmerge(y [B, N − r, c]) -> [B, N, c]``.
    """
    metric = _tokens("metric", metric, "[B, N, C]")
    h, w = check_int(h, "h", low=1), check_int(w, "w", low=1)
    r = check_int(r, "r", low=0)
    sx, sy = check_int(sx, "sx", low=1), check_int(sy, "sy", low=1)
    if metric.shape[1] != h * w:
        raise ValueError(f"metric must have N = h · w = {h * w} tokens, got shape {tuple(metric.shape)}")
    if sx > w or sy > h:
        raise ValueError(f"the cell (sy, sx) = ({sy}, {sx}) must fit in the grid (h, w) = ({h}, {w})")
    if not isinstance(no_rand, bool):
        raise TypeError(f"no_rand must be a bool, got {no_rand!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if check_finite:
        check_tensor(metric, "metric", dtype=None)
    return bipartite_soft_matching_2d_reference(metric, h, w, sx, sy, r, no_rand=no_rand, generator=generator)
