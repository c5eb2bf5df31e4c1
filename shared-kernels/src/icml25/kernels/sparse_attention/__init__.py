"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: the sparse attention ops.

The kernel family ``icml25.kernels.sparse_attention``, serving SpargeAttn (P01): block-sparse INT8 flash
attention with training-free two-stage sparsity (Zhang et al., ICML 2025):

* :func:`predict_block_mask` — stage 1: which (Q-block, K-block) tiles to compute, from pooled blocks,
  cumulative-mass (``cdf_threshold`` τ) or ``topk`` selection, and the self-similarity judge (θ).
* :func:`block_sparse_attention` — stage 2 for a given block mask: flash attention over the active tiles
  only, INT8 Q (one scale per warp of rows, or per block) and K (mean-smoothed, one scale per block),
  exp2 online softmax, λ skip of negligible PV products.
* :func:`sparge_attention` — both stages; optionally returns :class:`SpargeStats`.

Inputs are ``q [B, H, Lq, d]``, ``k, v [B, Hkv, Lk, d]`` (``layout="HND"``) or ``[B, L, H, d]``
(``layout="NHD"``); ``H % Hkv == 0`` (GQA). Hyper-parameters θ, τ, topk, λ are floats or per-head ``[H]``
tensors. λ (``pv_threshold``) is in log2 units; ``None``/``inf`` disables the skip. Inference only (no
autograd). Dispatch: Triton for CUDA tensors, the PyTorch reference otherwise (see
:func:`icml25.kernels.select_backend`). The Triton path never reads a device value on the host (no
``.item()``/``bool(tensor)``/``nonzero``) unless ``return_stats=True``: one ``sparge_attention`` call is the
torch mean of K plus three Triton launches (see ``triton.py``; ``_inspect.py`` records them).

Layout of this module: :func:`_prepare` validates and normalises the arguments of every public op once
(tensors to HND, backend, block sizes, hyper-parameters, scale) into a :class:`_Call`; the steps below it
(``_stats_pass``, ``_select_lut``, ``_operands``, ``_forward``) each run one Triton launch or its
reference counterpart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from icml25.kernels._dispatch import select_backend
from icml25.kernels.checks import check_tensor
from icml25.kernels.sparse_attention import batched, reference
from icml25.kernels.sparse_attention.reference import (
    BlockStats,
    causal_block_valid,
    dense_attention_reference,
    mask_to_lut,
    num_blocks,
    relative_l1,
)

__all__ = [
    "SpargeStats",
    "block_sparse_attention",
    "dense_attention_reference",
    "mask_to_lut",
    "predict_block_mask",
    "relative_l1",
    "sparge_attention",
]

_LAYOUTS = ("HND", "NHD")
_MAX_TRITON_D = 256


@dataclass
class SpargeStats:
    """What the sparse op skipped.

    Attributes:
        sparsity: stage-1 sparsity, ``1 - kept / valid`` blocks over the whole batch (``valid`` is the
            causally valid block count under ``is_causal``, i.e. relative to the lower triangle).
        head_sparsity: ``[H]`` stage-1 sparsity of each head (averaged over the batch).
        pv_skip_fraction: fraction of the *computed* tiles whose PV product the λ test skipped.
        kept_blocks, valid_blocks, skipped_pv_tiles: the raw counts.
        l1: relative L1 error against dense attention when requested (``compute_l1=True``), else ``None``.
    """

    sparsity: float
    head_sparsity: torch.Tensor
    pv_skip_fraction: float
    kept_blocks: int
    valid_blocks: int
    skipped_pv_tiles: int
    l1: float | None = None


# --------------------------------------------------------------------------------------------- checks
# Everything here reads only shapes, dtypes, devices and host values, except the value checks marked
# "reference path": reading a device tensor's values would synchronise the host with the GPU, so the Triton
# path skips them (NaN/Inf inputs, out-of-range per-head tensors already on the device).


def _qkv(name: str, x: object) -> torch.Tensor:
    """A floating 4-D tensor ([B, H, L, d] for HND, [B, L, H, d] for NHD) with every dimension >= 1."""
    x = check_tensor(x, name, ndim=4, finite=False)
    if x.numel() == 0:
        # Lk = 0 leaves softmax with no key to normalise over, d = 0 makes the default scale 1/sqrt(d)
        # undefined; an empty batch or head axis has nothing to attend. None of them has a defined output.
        raise ValueError(
            f"{name} must have every dimension >= 1 (B, H, L and the head dim d), got shape {tuple(x.shape)}"
        )
    return x


def _to_hnd(layout: str, *xs: torch.Tensor) -> list[torch.Tensor]:
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
    return [x.transpose(1, 2) if layout == "NHD" else x for x in xs]


def _check_qk(q: torch.Tensor, k: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = _qkv("q", q), _qkv("k", k)
    q, k = _to_hnd(layout, q, k)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch size B, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim d, got {q.shape[-1]} and {k.shape[-1]}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"the number of query heads must be divisible by the number of key/value heads (GQA), "
            f"got Hq={q.shape[1]} and Hkv={k.shape[1]}"
        )
    if q.device != k.device:
        raise ValueError(f"q and k must be on the same device, got {q.device} and {k.device}")
    return q, k


def _check_v(q: torch.Tensor, k: torch.Tensor, v: object, layout: str) -> torch.Tensor:
    (v,) = _to_hnd(layout, _qkv("v", v))
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)} (HND), got {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if v.device != q.device:
        raise ValueError(f"v must be on the device of q ({q.device}), got {v.device}")
    return v


def _check_blocks(block_q: int, block_k: int, backend: str, d: int) -> None:
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"{name} must be a positive int, got {b!r}")
        if backend == "triton" and (b < 16 or b & (b - 1)):
            raise ValueError(f"{name} must be a power of two >= 16 for the Triton backend, got {b}")
    if backend == "triton" and not 1 <= d <= _MAX_TRITON_D:
        raise ValueError(
            f"head dim d must be <= {_MAX_TRITON_D} for the Triton backend, got d={d}; "
            "use backend='reference' or split the heads"
        )


def _check_min_length(q: torch.Tensor, block_q: int) -> None:
    if q.shape[-2] < block_q:
        raise ValueError(
            f"stage-1 prediction needs Lq >= block_q={block_q} (at least one full query block), got "
            f"Lq={q.shape[-2]}; use dense attention for short queries (e.g. decoding with Lq=1), a smaller "
            "block_q, or pad q and pass an explicit scale"
        )


Hyper = float | torch.Tensor  # a validated hyper-parameter: a host float or an fp32 [H] tensor on the device


def _check_hyper(name: str, value: object, num_heads: int, device: torch.device, backend: str, *, low: float,
                 high: float, low_open: bool = False) -> Hyper:  # fmt: skip
    """A float stays a host float (checked for free); a per-head tensor becomes fp32 ``[H]`` on ``device``.

    A tensor's values are checked on the reference path, or when it must be copied to ``device`` anyway;
    a tensor already on the device of a Triton call is used unchecked (reading it would sync).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise TypeError(
            f"{name} must be a float or a per-head tensor of length H={num_heads}, got {type(value).__name__}"
        )
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() != num_heads:
        raise ValueError(
            f"{name} must be a float or a per-head tensor of length H={num_heads}, got shape {tuple(value.shape)}"
        )
    interval = f"{'(' if low_open else '['}{low}, {high}]"
    if not isinstance(value, torch.Tensor):
        v = float(value)
        if math.isnan(v) or (v <= low if low_open else v < low) or v > high:
            raise ValueError(f"{name} must lie in {interval}, got {v}")
        return v
    t = value.float().reshape(-1)
    if backend == "reference" or t.device != device:
        bad = torch.isnan(t) | (t <= low if low_open else t < low) | (t > high)
        if bool(bad.any()):
            raise ValueError(f"{name} must lie in {interval}, got {t.tolist()}")
    return t.to(device).expand(num_heads).contiguous()


def _selection(
    topk: object, cdf_threshold: object, num_heads: int, device: torch.device, backend: str
) -> tuple[Hyper | None, Hyper | None]:
    if (topk is None) == (cdf_threshold is None):
        raise ValueError(
            "pass exactly one of topk and cdf_threshold (set cdf_threshold=None to use topk), got "
            f"topk={topk!r}, cdf_threshold={cdf_threshold!r}"
        )
    kw = {"low": 0.0, "high": 1.0, "low_open": True}
    if topk is not None:
        return _check_hyper("topk", topk, num_heads, device, backend, **kw), None
    return None, _check_hyper("cdf_threshold", cdf_threshold, num_heads, device, backend, **kw)


def _pv_lambda(pv_threshold: object, num_heads: int, device: torch.device, backend: str) -> Hyper | None:
    if pv_threshold is None:
        return None
    return _check_hyper("pv_threshold", pv_threshold, num_heads, device, backend, low=0.0, high=math.inf)


def _scale(scale: float | None, d: int) -> float:
    if scale is None:
        return reference.default_scale(d)
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise ValueError(f"scale must be a positive finite float or None, got {scale!r}")
    return float(scale)


def _per_head(value: Hyper | None, num_heads: int, device: torch.device) -> torch.Tensor | None:
    """The reference path's form of a hyper-parameter: an fp32 ``[H]`` tensor (``None`` stays ``None``)."""
    return None if value is None else reference.per_head(value, num_heads, device)


def _check_block_mask(block_mask: object, expected: tuple[int, int, int, int]) -> None:
    if not isinstance(block_mask, torch.Tensor) or block_mask.dtype != torch.bool:
        got = block_mask.dtype if isinstance(block_mask, torch.Tensor) else type(block_mask).__name__
        raise TypeError(f"block_mask must be a bool tensor of shape {expected}, got {got}")
    if tuple(block_mask.shape) != expected:
        raise ValueError(
            f"block_mask must have shape [B, H, nq, nk] = {expected}, got {tuple(block_mask.shape)}"
        )


@dataclass(frozen=True)
class _Call:
    """One validated op call: tensors in HND layout, the chosen backend, hyper-parameters in kernel form."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor | None  # None for predict_block_mask (no values)
    backend: str  # "reference" or "triton"
    block_q: int
    block_k: int
    q_group: int  # rows of Q sharing one INT8 scale
    scale: float  # softmax scale
    is_causal: bool
    topk: Hyper | None  # stage 1: exactly one of topk / cdf (None for block_sparse_attention)
    cdf: Hyper | None
    theta: Hyper | None  # stage 1: the self-similarity threshold θ
    lam: Hyper | None  # stage 2: λ of the PV skip (None: no skip)
    block_mask: torch.Tensor | None  # block_sparse_attention's mask, on the device of q

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]


_ABSENT = object()  # an argument the op does not take (v of predict_block_mask, block_mask of the others)


def _prepare(
    q: object,
    k: object,
    v: object = _ABSENT,
    *,
    layout: str,
    backend: str | None,
    block_q: int,
    block_k: int,
    scale: float | None,
    is_causal: bool,
    predict: bool,
    topk: object = None,
    cdf_threshold: object = None,
    sim_threshold: object = None,
    pv_threshold: object = None,
    qk_quant_gran: str | None = None,
    block_mask: object = _ABSENT,
) -> _Call:
    """Validate and normalise the arguments of a public op, once, in a fixed order.

    ``predict``: the op runs stage 1 (needs a full query block; ``topk``, ``cdf_threshold`` and
    ``sim_threshold`` are validated). ``qk_quant_gran=None``: one Q scale per block (stage-1 statistics
    only). ``v`` / ``block_mask`` are checked only when the op takes them. Only shapes, dtypes, devices and
    host values are read, except on the reference path (see the checks above): no host sync on Triton.
    """
    q, k = _check_qk(q, k, layout)
    tensors = [q, k]
    if v is not _ABSENT:
        v = _check_v(q, k, v, layout)
        tensors.append(v)
    chosen = select_backend(*tensors, backend=backend)
    d = q.shape[-1]
    _check_blocks(block_q, block_k, chosen, d)
    if predict:
        _check_min_length(q, block_q)
    q_group = block_q if qk_quant_gran is None else reference.q_quant_group(qk_quant_gran, block_q, d)
    if block_mask is not _ABSENT:
        nq, nk = num_blocks(q.shape[-2], block_q), num_blocks(k.shape[-2], block_k)
        _check_block_mask(block_mask, (q.shape[0], q.shape[1], nq, nk))
    if chosen == "reference":  # reading values on the Triton path would cost a device sync per call
        for name, x in zip("qkv", tensors):
            check_tensor(x, name, dtype=None)  # NaN/Inf: one aminmax pass
    H, dev = q.shape[1], q.device
    topk_h = cdf_h = theta = None
    if predict:
        topk_h, cdf_h = _selection(topk, cdf_threshold, H, dev, chosen)
        theta = _check_hyper("sim_threshold", sim_threshold, H, dev, chosen, low=-math.inf, high=math.inf)
    lam = _pv_lambda(pv_threshold, H, dev, chosen)
    sc = _scale(scale, d)
    return _Call(
        q=q, k=k, v=None if v is _ABSENT else v, backend=chosen, block_q=block_q, block_k=block_k,
        q_group=q_group, scale=sc, is_causal=bool(is_causal), topk=topk_h, cdf=cdf_h, theta=theta, lam=lam,
        block_mask=None if block_mask is _ABSENT else block_mask.to(dev),
    )  # fmt: skip


def _triton():
    from icml25.kernels.sparse_attention import triton as triton_impl  # lazy: triton is optional

    return triton_impl


# ---------------------------------------------------------------------------------------------- ops
# Each step below is one Triton launch on the Triton path (plus the torch mean of K), and plain PyTorch
# (reference.py) otherwise.


def _k_mean(k: torch.Tensor, smooth_k: bool) -> torch.Tensor | None:
    """K's token mean ``[B, Hkv, d]`` in fp32 (subtracted before quantizing K), or ``None`` without smoothing."""
    return k.mean(dim=-2, dtype=torch.float32) if smooth_k else None


def _stats_pass(
    c: _Call, *, quantize: bool, smooth_k: bool
) -> tuple[BlockStats, BlockStats, torch.Tensor | None]:
    """Block statistics of Q and K (pooled means, self-similarities), optionally their INT8 form, and K's mean.

    The reference path never quantizes here (its statistics are those of the unquantized tensors either
    way): :func:`_operands` builds its stage-2 operands, INT8 values already times their scales.
    """
    k_mean = _k_mean(c.k, smooth_k)
    q_mult = c.scale * reference.LOG2E
    if c.backend == "triton":
        q_stats, k_stats = _triton().qk_block_stats(
            c.q, c.k, k_mean, q_mult=q_mult, quantize=quantize, q_group=c.q_group, block_q=c.block_q,
            block_k=c.block_k,
        )  # fmt: skip
        return q_stats, k_stats, k_mean
    q_stats = reference.block_stats(c.q, c.block_q)
    k_stats = reference.block_stats(c.k, c.block_k, mean=k_mean)
    return q_stats, k_stats, k_mean


def _select_lut(
    c: _Call, q_stats: BlockStats, k_stats: BlockStats, *, attention_sink: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 1: ``(block mask, lut, count)``."""
    kw = {"scale": c.scale, "is_causal": c.is_causal, "attention_sink": attention_sink, "block_q": c.block_q,
          "block_k": c.block_k}  # fmt: skip
    if c.backend == "triton":
        return _triton().select_lut(
            q_stats, k_stats, sim_threshold=c.theta, cdf_threshold=c.cdf, topk=c.topk, **kw
        )
    H, dev = c.num_heads, q_stats.pooled.device
    mask = reference.select_blocks(
        q_stats.pooled, q_stats.selfsim, k_stats.pooled, k_stats.selfsim,
        sim_threshold=_per_head(c.theta, H, dev), cdf_threshold=_per_head(c.cdf, H, dev),
        topk=_per_head(c.topk, H, dev), **kw,
    )  # fmt: skip
    return (mask, *mask_to_lut(mask))


def _mask_lut(c: _Call) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A given block mask (``block_sparse_attention``): ``(mask & causal validity, lut, count)``."""
    if c.backend == "triton":
        return _triton().mask_to_lut(
            c.block_mask, is_causal=c.is_causal, block_q=c.block_q, block_k=c.block_k
        )
    mask = c.block_mask
    if c.is_causal:
        nq, nk = mask.shape[-2:]
        mask = mask & causal_block_valid(nq, nk, c.block_q, c.block_k, c.q.device)
    return (mask, *mask_to_lut(mask))


_Operands = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]


def _operands(
    c: _Call,
    q_stats: BlockStats | None,
    k_stats: BlockStats | None,
    k_mean: torch.Tensor | None,
    *,
    quantize_qk: bool,
) -> _Operands:
    """The forward kernel's ``(q_op, q_scale, k_op, k_scale)``: on Triton the INT8 ones of the (quantizing)
    stats pass or full-precision floats (Q pre-scaled, K smoothed with ``k_mean``); on the reference path
    fp32 operands, the INT8 ones already multiplied by their scales (:func:`batched.operands`)."""
    if c.backend == "reference":
        return batched.operands(
            c.q, c.k, scale=c.scale, k_mean=k_mean, quantize=quantize_qk, block_q=c.block_q,
            block_k=c.block_k, q_group=c.q_group,
        )  # fmt: skip
    if quantize_qk:
        return q_stats.x_int8, q_stats.scale, k_stats.x_int8, k_stats.scale
    return reference.quantize_qk(
        c.q, c.k, scale=c.scale, smooth_k=k_mean is not None, quantize=False, block_q=c.block_q,
        block_k=c.block_k, k_mean=k_mean,
    )  # fmt: skip


def _forward(
    c: _Call, operands: _Operands, lut: torch.Tensor, count: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2 over the LUT: ``(o [B, H, Lq, d], skipped [B, H, nq])``."""
    kw = {"lq": c.q.shape[-2], "lk": c.k.shape[-2], "is_causal": c.is_causal, "block_q": c.block_q,
          "block_k": c.block_k}  # fmt: skip
    if c.backend == "triton":
        return _triton().sparse_flash_forward(*operands, c.v, lut, count, pv_threshold=c.lam, **kw)
    lam_t = _per_head(math.inf if c.lam is None else c.lam, c.num_heads, c.q.device)
    # The batched form of reference.sparse_flash_forward (no loop over tiles; the loop is its test oracle).
    return batched.sparse_flash_forward(*operands, c.v, lut, count, pv_threshold=lam_t, **kw)


def _summary(c: _Call, mask: torch.Tensor, count: torch.Tensor, skipped: torch.Tensor) -> SpargeStats:
    """Host-side summary (reads device counts: the only synchronising step, and only with return_stats)."""
    B, H, nq, nk = mask.shape
    valid_per_head = nq * nk
    if c.is_causal:
        valid_per_head = int(causal_block_valid(nq, nk, c.block_q, c.block_k, "cpu").sum())
    kept_h = mask.sum(dim=(0, 2, 3)).double()
    kept, valid, skipped_n = int(kept_h.sum()), B * H * valid_per_head, int(skipped.sum())
    return SpargeStats(
        sparsity=1.0 - kept / valid,
        head_sparsity=(1.0 - kept_h / (B * valid_per_head)).float().cpu(),
        pv_skip_fraction=skipped_n / max(int(count.sum()), 1),
        kept_blocks=kept,
        valid_blocks=valid,
        skipped_pv_tiles=skipped_n,
    )


def predict_block_mask(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    topk: float | torch.Tensor | None = None,
    cdf_threshold: float | torch.Tensor | None = 0.98,
    sim_threshold: float | torch.Tensor = 0.6,
    smooth_k: bool = True,
    attention_sink: bool = False,
    layout: str = "HND",
    block_q: int = 128,
    block_k: int = 64,
    backend: str | None = None,
) -> torch.Tensor:
    """Stage 1 of SpargeAttn: predict the block mask.

    Args:
        q: ``[B, H, Lq, d]`` (HND) queries, ``Lq >= block_q``.
        k: ``[B, Hkv, Lk, d]`` keys.
        is_causal: top-left causal masking (as ``scaled_dot_product_attention(is_causal=True)``).
        scale: softmax scale (default ``1/√d``), also applied to the pooled scores.
        topk: fraction in (0, 1] of K blocks kept per Q block (pass ``cdf_threshold=None``), or ``None``.
        cdf_threshold: τ in (0, 1]: keep the most probable K blocks whose cumulative pooled mass is ≤ τ.
        sim_threshold: θ: blocks with self-similarity ≤ θ are "non-similar" and computed densely.
        smooth_k: subtract the per-head token mean of K (softmax-invariant) before pooling.
        attention_sink: always keep K block 0.
        layout: ``"HND"`` or ``"NHD"``.
        block_q, block_k: tile sizes (official: 128 / 64).
        backend: ``"auto"``, ``"reference"`` or ``"triton"`` (see :func:`icml25.kernels.select_backend`).

    Returns:
        ``[B, H, nq, nk]`` bool block mask, ``nq = ceil(Lq/block_q)``, ``nk = ceil(Lk/block_k)``.
    """
    c = _prepare(
        q, k, layout=layout, backend=backend, block_q=block_q, block_k=block_k, scale=scale,
        is_causal=is_causal, predict=True, topk=topk, cdf_threshold=cdf_threshold, sim_threshold=sim_threshold,
    )  # fmt: skip
    q_stats, k_stats, _ = _stats_pass(c, quantize=False, smooth_k=smooth_k)
    mask, _, _ = _select_lut(c, q_stats, k_stats, attention_sink=attention_sink)
    return mask


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    pv_threshold: float | torch.Tensor | None = None,
    quantize_qk: bool = True,
    qk_quant_gran: str = "per_block",
    smooth_k: bool = True,
    layout: str = "HND",
    block_q: int = 128,
    block_k: int = 64,
    return_stats: bool = False,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, SpargeStats]:
    """Stage 2 of SpargeAttn: attention restricted to the tiles of ``block_mask``.

    Equals dense softmax attention whose score matrix is masked to the selected tiles (the masked-softmax
    oracle) when ``quantize_qk=False`` and ``pv_threshold=None``. Rows that see no allowed key output 0.

    Args:
        q: ``[B, H, Lq, d]`` (HND; NHD with ``layout="NHD"``).
        k, v: ``[B, Hkv, Lk, d]``.
        block_mask: ``[B, H, ceil(Lq/block_q), ceil(Lk/block_k)]`` bool (True = compute the tile).
        is_causal: top-left causal masking inside the tiles.
        scale: softmax scale (default ``1/√d``).
        pv_threshold: λ in log2 units (float or ``[H]``); ``None`` disables the PV skip.
        quantize_qk: INT8 Q/K (SageAttention) instead of full-precision QKᵀ.
        qk_quant_gran: ``"per_block"`` (default: one Q scale per Q block, as the official SpargeAttn
            launch) or ``"per_warp"`` (one per warp of rows, SageAttention's finer granularity); K: one
            scale per block.
        smooth_k: subtract K's token mean per head (exact for softmax; improves INT8 accuracy).
        return_stats: also return :class:`SpargeStats` (this reads counts back from the device).

    Returns:
        ``o`` shaped like ``q`` (same layout and dtype), or ``(o, stats)``.
    """
    c = _prepare(
        q, k, v, layout=layout, backend=backend, block_q=block_q, block_k=block_k, scale=scale,
        is_causal=is_causal, predict=False, pv_threshold=pv_threshold, qk_quant_gran=qk_quant_gran,
        block_mask=block_mask,
    )  # fmt: skip
    mask, lut, count = _mask_lut(c)
    if quantize_qk and c.backend == "triton":  # its stats launch also quantizes
        q_stats, k_stats, k_mean = _stats_pass(c, quantize=True, smooth_k=smooth_k)
    else:
        q_stats, k_stats, k_mean = None, None, _k_mean(c.k, smooth_k)
    o, skipped = _forward(c, _operands(c, q_stats, k_stats, k_mean, quantize_qk=quantize_qk), lut, count)
    (o,) = _to_hnd(layout, o)
    if not return_stats:
        return o
    return o, _summary(c, mask, count, skipped)


def sparge_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    topk: float | torch.Tensor | None = None,
    cdf_threshold: float | torch.Tensor | None = 0.98,
    sim_threshold: float | torch.Tensor = 0.6,
    pv_threshold: float | torch.Tensor | None = 50.0,
    quantize_qk: bool = True,
    qk_quant_gran: str = "per_block",
    smooth_k: bool = True,
    attention_sink: bool = False,
    layout: str = "HND",
    block_q: int = 128,
    block_k: int = 64,
    return_stats: bool = False,
    compute_l1: bool = False,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, SpargeStats]:
    """SpargeAttn: stage-1 block mask prediction, then sparse INT8 flash attention with the λ skip.

    On the Triton backend one call is four launches (K mean, Q/K statistics + INT8, stage 1 + LUT, sparse
    forward) and never synchronises with the host unless ``return_stats=True``; the NaN/Inf input check
    and the value check of per-head tensors already on the GPU run on the reference backend only.

    Args:
        q: ``[B, H, Lq, d]`` queries (``layout="NHD"``: ``[B, Lq, H, d]``), ``Lq >= block_q``.
        k, v: ``[B, Hkv, Lk, d]`` keys/values (``H % Hkv == 0``).
        is_causal, scale, topk, cdf_threshold, sim_threshold, smooth_k, attention_sink, layout,
            block_q, block_k, backend: as in :func:`predict_block_mask`.
        pv_threshold: λ (log2 units, float or ``[H]``); ``None`` disables the stage-2 skip.
        quantize_qk: INT8 Q/K; ``False`` computes QKᵀ in full precision.
        qk_quant_gran: ``"per_block"`` (default, official) or ``"per_warp"`` Q scales (see
            :func:`block_sparse_attention`).
        return_stats: also return :class:`SpargeStats`.
        compute_l1: with ``return_stats``, fill ``stats.l1`` (relative L1 vs dense attention; costs a
            dense pass).

    Returns:
        ``o`` shaped like ``q``, or ``(o, stats)``.

    Example:
        >>> q, k, v = (torch.randn(1, 2, 256, 64) for _ in range(3))
        >>> o = sparge_attention(q, k, v, cdf_threshold=1.0, sim_threshold=1.0, pv_threshold=None)
    """
    c = _prepare(
        q, k, v, layout=layout, backend=backend, block_q=block_q, block_k=block_k, scale=scale,
        is_causal=is_causal, predict=True, topk=topk, cdf_threshold=cdf_threshold, sim_threshold=sim_threshold,
        pv_threshold=pv_threshold, qk_quant_gran=qk_quant_gran,
    )  # fmt: skip
    # One stats pass yields both the stage-1 statistics and the INT8 operands of stage 2.
    q_stats, k_stats, k_mean = _stats_pass(c, quantize=quantize_qk, smooth_k=smooth_k)
    mask, lut, count = _select_lut(c, q_stats, k_stats, attention_sink=attention_sink)
    o, skipped = _forward(c, _operands(c, q_stats, k_stats, k_mean, quantize_qk=quantize_qk), lut, count)
    st = _summary(c, mask, count, skipped) if return_stats else None
    if st is not None and compute_l1:
        st.l1 = relative_l1(o, dense_attention_reference(c.q, c.k, c.v, is_causal=c.is_causal, scale=c.scale))
    (o,) = _to_hnd(layout, o)
    return o if st is None else (o, st)
