"""VIMTS: visual MAE for irregular multivariate time series — ICML 2025, P35: patching, TTCN, graph completion, MAE forecaster.

"VIMTS: Visual Masked Autoencoders for Irregular Multivariate Time Series Forecasting", ICML 2025 (arXiv 2505.22815; official code ``WHU-HZY/VIMTS``, ``IMTS/lib/models/visionts``;
data pipeline and TTCN from ``usail-hkust/t-PatchGNN``).

Pipeline (per sample, ``N`` channels, history ``[0, T_h)``, queries in ``(T_h, T_h + T_f]``):

1. :func:`patchify_irregular` cuts each channel's observations into ``M = ceil((T_h − s)/stride) + 1``
   half-open windows ``[t0 + m·stride, t0 + m·stride + s)``.
2. :class:`LearnableTimeEmbedding` ``φ(t) = [w0·t + b0, sin(W t + b)]`` and :class:`TTCN` (a generated
   per-observation filter, masked softmax over the window's observations, weighted sum, ReLU) turn each
   window into one token; a learnable channel embedding is added and a 0/1 "window observed" flag appended.
3. :class:`AdaptiveGCN` fills weak windows from other channels (adaptive adjacency per window from node
   embeddings shifted by gated projections of the tokens, diffusion GCN, residual, ``[h, h_gcn]``).
4. A linear patch embedding replaces the MAE's convolution; the per-channel token sequences (channels in the
   batch) go through the MAE's encoder blocks (with random masking in self-supervised pre-training) and its
   decoder blocks, with ``P = ceil((T_f − s)/stride) + 1`` mask tokens appended for the future windows.
5. Patch2Point: the value at query time ``q`` is an MLP of the decoder latent of ``q``'s window and ``φ(q)``.

The MAE is any ViT-MAE: a ``transformers`` ``ViTMAEForPreTraining`` (e.g. P25's :func:`small_vit_mae`, or
wrapped in P25's :class:`HFViTMAEAdapter`), a ``models_mae``-style module (``blocks``, ``norm``,
``decoder_embed``, ``decoder_blocks``, ``decoder_norm``, ``mask_token``, ``cls_token``; also inside P25's
:class:`FacebookMAEAdapter`) or, with ``mae=None``, a small pure-torch pre-norm ViT-MAE. Its blocks are used
in place (VIMTS trains them); its pixel patch embedding and pixel head are not used. Nothing is downloaded.

Differences from the official code, on purpose: node embeddings are created on the module's device (the
official code calls ``.cuda()``) and anomaly detection is never switched on globally; times enter the time
embedding divided by ``T_h + T_f`` (the t-PatchGNN pipeline scales time to ``[0, 1]`` upstream); padded
observation slots are zeroed before the TTCN so that an empty window gives the finite token ``ReLU(bias)``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "TTCN",
    "VIMTS",
    "AdaptiveGCN",
    "IMTSBatch",
    "LearnableTimeEmbedding",
    "PatchedIMTS",
    "fit_vimts",
    "imts_from_arrays",
    "imts_from_long",
    "imts_masked_mse",
    "patchify_irregular",
    "query_patch_index",
    "seq_sincos_pos_embed",
]

FinetuneType = Literal["norm", "attn", "mlp", "bias", "all", "freeze"]
_FINETUNE = {
    "norm": r"norm",
    "attn": r"attn|attention",
    "mlp": r"mlp|intermediate|fc\d|linear\d|\.output\.dense",
    "bias": r"bias",
}
_NEG = -1e8
_MAX_ABS = 1e6


# ---------------------------------------------------------------------------------------- validation
def _mask01(m: Any, name: str, shape: tuple[int, ...]) -> Tensor:
    """A boolean or 0/1 mask of ``shape`` (1 = observed), as float32."""
    return check_tensor(m, name, shape=shape, dtype=("bool", "int", "float"), finite=False, binary=True).to(
        torch.float32
    )


# ---------------------------------------------------------------------------------------------- data
@dataclass
class IMTSBatch:
    """A padded batch of irregular multivariate series.

    ``times``, ``values``, ``mask``: ``(B, L, N)`` history observations (``mask`` 1 = observed; ``times``
    may also be ``(B, L)``, shared by the channels); ``query_times``, ``query_mask``: ``(B, Q, N)`` (or
    ``(B, Q)``) future query times; ``targets``: ``(B, Q, N)`` values at the queries (may hold NaN where
    ``query_mask`` is 0) or ``None`` for prediction. Unobserved history values may be NaN.
    """

    times: Tensor
    values: Tensor
    mask: Tensor
    query_times: Tensor
    query_mask: Tensor
    targets: Tensor | None = None

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def index(self, idx: Tensor | slice) -> IMTSBatch:
        """The sub-batch of samples ``idx``."""
        return IMTSBatch(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[idx]
                            for f in fields(self)})  # fmt: skip


def _check_batch(batch: Any, *, need_targets: bool) -> IMTSBatch:
    """Validate and normalise a batch (times broadcast to ``(B, L, N)``, masks float, NaN zeroed)."""
    if not isinstance(batch, IMTSBatch):
        raise TypeError(f"batch must be an IMTSBatch, got {type(batch).__name__}")
    v = check_tensor(batch.values, "batch.values", ndim=3, finite=False, non_empty=True)
    B, L, N = v.shape
    m = _mask01(batch.mask, "batch.mask", (B, L, N))
    t = check_tensor(batch.times, "batch.times", ndim=(2, 3), non_empty=True)
    if t.dim() == 2:
        t = t[..., None].expand(-1, -1, N)
    if tuple(t.shape) != (B, L, N):
        raise ValueError(
            f"batch.times must have shape {(B, L, N)} or {(B, L)} (like values), got {tuple(batch.times.shape)}"
        )
    bad = ~torch.isfinite(v) & (m > 0)
    if bad.any():
        raise ValueError(
            f"batch.values must be finite where batch.mask is 1; got {int(bad.sum())} NaN/Inf observed values"
        )
    big = (v.abs() > _MAX_ABS) & (m > 0)
    if big.any():
        raise ValueError(
            f"batch.values must be at most {_MAX_ABS:g} in magnitude (scale the data, e.g. to [0, 1] as t-PatchGNN "
            f"does); got max |value| {float(v[m > 0].abs().max()):.3g}"
        )
    qt = check_tensor(batch.query_times, "batch.query_times", ndim=(2, 3), non_empty=True)
    if qt.shape[0] != B:
        raise ValueError(
            f"batch.query_times must have B = {B} rows (like values), got shape {tuple(qt.shape)}"
        )
    if qt.dim() == 2:
        qt = qt[..., None].expand(-1, -1, N)
    Q = qt.shape[1]
    if tuple(qt.shape) != (B, Q, N):
        raise ValueError(
            f"batch.query_times must have shape {(B, Q, N)} or {(B, Q)}, got {tuple(batch.query_times.shape)}"
        )
    qm = _mask01(batch.query_mask, "batch.query_mask", (B, Q, N))
    y = batch.targets
    if y is None:
        if need_targets:
            raise ValueError("batch.targets must be given (B, Q, N) for a loss, got None")
    else:
        y = check_tensor(y, "batch.targets", ndim=3, finite=False, non_empty=True)
        if tuple(y.shape) != (B, Q, N):
            raise ValueError(
                f"batch.targets must have shape {(B, Q, N)} (like query_times), got {tuple(y.shape)}"
            )
        bad = ~torch.isfinite(y) & (qm > 0)
        if bad.any():
            raise ValueError(
                f"batch.targets must be finite where batch.query_mask is 1; got {int(bad.sum())} NaN/Inf"
            )
        if ((y.abs() > _MAX_ABS) & (qm > 0)).any():
            raise ValueError(
                f"batch.targets must be at most {_MAX_ABS:g} in magnitude (scale the data); got larger values"
            )
        y = torch.where(qm > 0, y, torch.zeros_like(y))
    v = torch.where(m > 0, v, torch.zeros_like(v))
    return IMTSBatch(t, v, m, qt, qm, y)


@dataclass
class PatchedIMTS:
    """Observations grouped into windows: ``times``, ``values``, ``mask`` ``(B, N, M, K)`` (``K`` = the most
    observations any window holds; padded slots have mask 0, value 0, time 0), ``observed`` ``(B, N, M)``
    (1 when the window holds an observation) and ``starts`` ``(M,)`` window start times."""

    times: Tensor
    values: Tensor
    mask: Tensor
    observed: Tensor
    starts: Tensor


def n_windows(span: float, window: float, stride: float) -> int:
    """``ceil((span − window)/stride) + 1`` windows (at least 1)."""
    return max(1, math.ceil((span - window) / stride - 1e-9) + 1)


def patchify_irregular(
    batch: IMTSBatch,
    window: float,
    stride: float | None = None,
    t0: float = 0.0,
    history: float | None = None,
) -> PatchedIMTS:
    """Group history observations into ``M`` half-open windows ``[t0 + m·stride, t0 + m·stride + window)``.

    ``history`` (default: the latest observed time − ``t0``, rounded up to one window) sets
    ``M = ceil((history − window)/stride) + 1``. With ``stride == window`` every observation lands in exactly
    one window; with ``stride < window`` windows overlap and an observation may sit in several.
    """
    b = _check_batch(batch, need_targets=False)
    s = check_float(window, "window", low=0.0, low_open=True)
    st = s if stride is None else check_float(stride, "stride", low=0.0, low_open=True)
    t0 = check_float(t0, "t0")
    if history is None:
        obs_t = torch.where(b.mask > 0, b.times, torch.full_like(b.times, t0))
        history = max(float(obs_t.max()) - t0 + 1e-9, s)
    h = check_float(history, "history", low=0.0, low_open=True)
    if s > h:
        raise ValueError(f"window must be <= history ({h:g}), got {s:g}")
    M = n_windows(h, s, st)
    starts = t0 + st * torch.arange(M, dtype=b.times.dtype)
    t = b.times.permute(0, 2, 1)  # (B, N, L)
    inside = (t[:, :, None, :] >= starts[:, None]) & (t[:, :, None, :] < starts[:, None] + s)
    member = inside & (b.mask.permute(0, 2, 1)[:, :, None, :] > 0)  # (B, N, M, L)
    K = max(1, int(member.sum(-1).max()))
    order = torch.sort((~member).to(torch.int8), dim=-1, stable=True).indices[..., :K]  # members first
    sel = torch.gather(member, -1, order).to(b.values.dtype)
    gather = lambda x: torch.gather(x.permute(0, 2, 1)[:, :, None, :].expand(-1, -1, M, -1), -1, order) * sel  # noqa: E731
    return PatchedIMTS(gather(b.times), gather(b.values), sel, (sel.sum(-1) > 0).to(sel.dtype), starts)


def query_patch_index(query_times: Tensor, start: float, stride: float, n_patches: int) -> Tensor:
    """Window index ``floor((q − start)/stride)`` of each query, clipped to ``[0, n_patches − 1]`` (long)."""
    st = check_float(stride, "stride", low=0.0, low_open=True)
    check_tensor(query_times, "query_times", ndim=range(1, 6), non_empty=True)
    idx = torch.floor((query_times - check_float(start, "start")) / st)
    return idx.clamp(0, check_int(n_patches, "n_patches", low=1) - 1).long()


# ------------------------------------------------------------------------------------------- modules
class LearnableTimeEmbedding(nn.Module):
    """``φ(t) = [w0·t + b0, sin(W t + b)]``: ``(...,)`` times → ``(..., te_dim)``."""

    def __init__(self, te_dim: int = 5) -> None:
        super().__init__()
        self.te_dim = check_int(te_dim, "te_dim", low=2)
        self.linear = nn.Linear(1, 1)
        self.periodic = nn.Linear(1, self.te_dim - 1)

    def forward(self, t: Tensor) -> Tensor:
        t = t[..., None]
        return torch.cat([self.linear(t), torch.sin(self.periodic(t))], -1)


class TTCN(nn.Module):
    """Transformable time-aware convolution: ``(..., K, F)`` observations + ``(..., K)`` mask → ``(..., D)``.

    A 3-layer MLP generates an ``F × D`` filter per observation; a masked softmax over the ``K`` slots
    (padded slots get −1e8) weights the observations; ``h = ReLU(Σ_k Σ_f softmax_k(W)[k, f, d]·z_k[f] + bias)``.
    Permutation-invariant in the slots; padded slots are zeroed and carry no weight unless the window is
    empty (then ``h = ReLU(bias)``).
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.in_dim, self.out_dim = check_int(in_dim, "in_dim", low=1), check_int(out_dim, "out_dim", low=1)
        self.filter_generator = nn.Sequential(
            nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim), nn.ReLU(),
            nn.Linear(out_dim, in_dim * out_dim),
        )  # fmt: skip
        self.bias = nn.Parameter(torch.randn(1, out_dim))

    def forward(self, z: Tensor, mask: Tensor) -> Tensor:
        m = mask[..., None]
        z = z * m
        w = self.filter_generator(z)  # (..., K, F·D)
        w = torch.where(m > 0, w, torch.full_like(w, _NEG))
        w = torch.softmax(w, dim=-2).unflatten(-1, (self.out_dim, self.in_dim))  # (..., K, D, F)
        out = (w * z[..., None, :]).sum((-3, -1))
        return torch.relu(out + self.bias.reshape((1,) * (out.dim() - 1) + (-1,)))


class AdaptiveGCN(nn.Module):
    """Cross-channel compensation: ``(B, N, M, H)`` → ``(B, N, M, 2H)`` = ``[h, h + GCN(h)]``.

    Per layer and window: ``E1' = E1 + gate1 · Linear(h)``, ``E2' = E2 + gate2 · Linear(h)`` with
    ``gate = ReLU(tanh(Linear([h, E])))``, ``A = rowsoftmax(ReLU(E1' E2'))`` ``(B, M, N, N)``, then a
    diffusion GCN of order ``hop`` (``out_v = Σ_n A[n, v] x_n``, as Graph WaveNet's ``nconv``), and a
    residual to the input after the last layer. ``use_gcn=False`` in :class:`VIMTS` gives ``[h, h]``.
    """

    def __init__(self, n_channels: int, hid_dim: int, node_dim: int = 5, n_layers: int = 3, hop: int = 1,
                 *, seed: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.N, self.H = check_int(n_channels, "n_channels", low=1), check_int(hid_dim, "hid_dim", low=1)
        self.k, self.n_layers, self.hop = (
            check_int(node_dim, "node_dim", low=1),
            check_int(n_layers, "n_layers", low=1),
            check_int(hop, "hop", low=1),
        )
        g = make_generator(0 if seed is None else seed)
        self.nodevec1 = nn.Parameter(torch.randn(self.N, self.k, generator=g))
        self.nodevec2 = nn.Parameter(torch.randn(self.k, self.N, generator=g))
        H, k = self.H, self.k
        self.lin1 = nn.ModuleList(nn.Linear(H, k) for _ in range(n_layers))
        self.lin2 = nn.ModuleList(nn.Linear(H, k) for _ in range(n_layers))
        self.gate1 = nn.ModuleList(
            nn.Sequential(nn.Linear(H + k, 1), nn.Tanh(), nn.ReLU()) for _ in range(n_layers)
        )
        self.gate2 = nn.ModuleList(
            nn.Sequential(nn.Linear(H + k, 1), nn.Tanh(), nn.ReLU()) for _ in range(n_layers)
        )
        self.mix = nn.ModuleList(nn.Linear((hop + 1) * H, H) for _ in range(n_layers))

    def adjacency(self, h: Tensor, layer: int = 0) -> Tensor:
        """``(B, M, N, N)`` row-stochastic adjacency of ``layer`` for tokens ``h`` ``(B, N, M, H)``."""
        B, N, M, _ = h.shape
        e1 = self.nodevec1[None, :, None, :].expand(B, N, M, self.k)
        e2 = self.nodevec2.t()[None, :, None, :].expand(B, N, M, self.k)
        e1 = e1 + self.gate1[layer](torch.cat([h, e1], -1)) * self.lin1[layer](h)
        e2 = e2 + self.gate2[layer](torch.cat([h, e2], -1)) * self.lin2[layer](h)
        logits = torch.einsum("bnmk,bvmk->bmnv", e1, e2)
        return torch.softmax(torch.relu(logits), dim=-1)

    def forward(self, h: Tensor) -> Tensor:
        x = h
        for layer in range(self.n_layers):
            a = self.adjacency(x, layer)
            outs, cur = [x], x
            for _ in range(self.hop):
                cur = torch.einsum("bnmh,bmnv->bvmh", cur, a)
                outs.append(cur)
            x = self.mix[layer](torch.cat(outs, -1))
        return torch.cat([h, x + h], -1)


class _TorchBlock(nn.Module):
    """Pre-norm ViT block (``x + attn(norm1(x))``, ``x + mlp(norm2(x))``)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class _TorchViTMAE(nn.Module):
    """A small ``models_mae``-style ViT-MAE in plain torch (used when ``mae=None``)."""

    def __init__(
        self, dim: int = 64, depth: int = 4, heads: int = 4, dec_dim: int = 64, dec_depth: int = 2
    ) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim).normal_(std=0.02))
        self.blocks = nn.ModuleList(_TorchBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.decoder_embed = nn.Linear(dim, dec_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec_dim).normal_(std=0.02))
        self.decoder_blocks = nn.ModuleList(_TorchBlock(dec_dim, heads) for _ in range(dec_depth))
        self.decoder_norm = nn.LayerNorm(dec_dim, eps=1e-6)


def _extract_mae(mae: Any) -> dict[str, Any]:
    """The ViT-MAE parts VIMTS uses: cls/mask tokens, encoder/decoder blocks and norms, decoder embed."""
    inner = getattr(mae, "model", None) if hasattr(mae, "reconstruct") else None  # P25 adapters
    m = inner if isinstance(inner, nn.Module) else mae
    if hasattr(m, "vit") and hasattr(m, "decoder"):  # transformers ViTMAEForPreTraining
        vit, dec = m.vit, m.decoder
        blocks = getattr(vit, "layers", None) or getattr(getattr(vit, "encoder", None), "layer", None)
        parts = {"cls_token": vit.embeddings.cls_token, "blocks": blocks, "norm": vit.layernorm,
                 "decoder_embed": dec.decoder_embed, "mask_token": dec.mask_token,
                 "decoder_blocks": dec.decoder_layers, "decoder_norm": dec.decoder_norm}  # fmt: skip
    elif all(hasattr(m, a) for a in ("blocks", "norm", "decoder_embed", "decoder_blocks", "decoder_norm")):
        parts = {a: getattr(m, a) for a in ("cls_token", "blocks", "norm", "decoder_embed", "mask_token",
                                            "decoder_blocks", "decoder_norm")}  # fmt: skip
    else:
        raise TypeError(
            "mae must be a ViT-MAE with a decoder: a transformers ViTMAEForPreTraining (or P25's HFViTMAEAdapter), "
            f"a models_mae-style module (blocks, norm, decoder_embed, decoder_blocks, decoder_norm), or None; got "
            f"{type(mae).__name__}"
        )
    width = int(parts["cls_token"].shape[-1])
    dec_in = int(parts["decoder_embed"].in_features)
    if dec_in != width:
        raise TypeError(
            f"mae's encoder width ({width}, cls token) must match its decoder_embed input ({dec_in}): the patch "
            "embedding writes tokens of the encoder width"
        )
    norm_w = getattr(parts["norm"], "normalized_shape", (width,))
    if tuple(norm_w) != (width,):
        raise TypeError(f"mae's encoder norm width {tuple(norm_w)} must match the encoder width {width}")
    return parts


def seq_sincos_pos_embed(dim: int, n: int, rows: int | None = None) -> Tensor:
    """``(1 + n, dim)`` 2-D sin-cos positions of ``n`` tokens laid out column-major on a ``rows × ceil(n/rows)``
    grid (token ``i`` at row ``i % rows``, column ``i // rows``, as a VisionTS image), with a zero row for
    the cls token first. ``rows=None`` is the 1-D layout (``n × 1``)."""
    dim, n = check_int(dim, "dim", low=4), check_int(n, "n", low=1)
    if dim % 4:
        raise ValueError(f"dim must be a multiple of 4 for 2-D sin-cos positions, got {dim}")
    r = n if rows is None else check_int(rows, "rows", low=1)
    i = torch.arange(n, dtype=torch.float64)
    row, col = i % r, torch.div(i, r, rounding_mode="floor")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    parts = []
    for pos in (row, col):
        out = pos[:, None] * omega[None]
        parts += [torch.sin(out), torch.cos(out)]
    emb = torch.cat([parts[0], parts[1], parts[2], parts[3]], -1)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), emb]).float()


def _run_block(block: nn.Module, x: Tensor) -> Tensor:
    out = block(x)
    return out[0] if isinstance(out, (tuple, list)) else out


class VIMTS(nn.Module):
    """VIMTS forecaster for irregular multivariate series (see the module docstring).

    ``n_channels`` N; ``history`` T_h and ``horizon`` T_f in the data's time unit; ``window`` s and ``stride``
    (default s); ``mae`` a ViT-MAE (see :func:`_extract_mae`; ``None``: a pure-torch one of width 64, 4 + 2
    blocks); ``periodicity`` sets the 2-D positional layout (``periodicity // window`` rows; ``None``: 1-D);
    ``use_gcn=False`` replaces the graph completion by the identity (``[h, h]``). ``seed`` seeds the
    initialisation (``None``: PyTorch's global generator, the ``nn.Module`` convention).
    """

    def __init__(
        self,
        n_channels: int,
        history: float,
        horizon: float,
        window: float,
        stride: float | None = None,
        mae: nn.Module | None = None,
        hid_dim: int = 32,
        te_dim: int = 5,
        node_dim: int = 5,
        gcn_layers: int = 3,
        periodicity: float | None = None,
        use_gcn: bool = True,
        hop: int = 1,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.n_channels = check_int(n_channels, "n_channels", low=1)
        self.history, self.horizon = (
            check_float(history, "history", low=0.0, low_open=True),
            check_float(horizon, "horizon", low=0.0, low_open=True),
        )
        self.window = check_float(window, "window", low=0.0, low_open=True)
        self.stride = self.window if stride is None else check_float(stride, "stride", low=0.0, low_open=True)
        if self.window > self.history:
            raise ValueError(f"window must be <= history ({self.history:g}), got {self.window:g}")
        self.hid_dim, self.te_dim = check_int(hid_dim, "hid_dim", low=2), check_int(te_dim, "te_dim", low=2)
        self.use_gcn = bool(use_gcn)
        self.periodicity = (
            None if periodicity is None else check_float(periodicity, "periodicity", low=0.0, low_open=True)
        )
        self.M = n_windows(self.history, self.window, self.stride)
        self.P = n_windows(self.horizon, self.window, self.stride)
        with isolated_rng(seed) if seed is not None else _nullcontext():
            self.time_embedding = LearnableTimeEmbedding(self.te_dim)
            self.ttcn = TTCN(1 + self.te_dim, self.hid_dim - 1)
            self.channel_embedding = nn.Parameter(torch.randn(self.n_channels, self.hid_dim - 1))
            mae = _TorchViTMAE() if mae is None else mae
            parts = _extract_mae(mae)
            self.mae = nn.Module()
            for k, v in parts.items():
                setattr(self.mae, k, v)
            width = int(parts["cls_token"].shape[-1])
            dec = int(parts["decoder_embed"].out_features)
            self.mae.gcn = AdaptiveGCN(self.n_channels, self.hid_dim, node_dim, gcn_layers, hop,
                                       seed=0 if seed is None else seed)  # fmt: skip
            self.mae.patch_embed = nn.Linear(2 * self.hid_dim, width)
            nn.init.xavier_uniform_(self.mae.patch_embed.weight)
            nn.init.zeros_(self.mae.patch_embed.bias)
            rows = None if self.periodicity is None else max(1, int(self.periodicity // self.window))
            self.mae.pos_embed = nn.Parameter(self._pos(width, self.M, rows)[None])
            self.mae.decoder_pos_embed = nn.Parameter(self._pos(dec, self.M + self.P, rows)[None])
            self.head = nn.Sequential(nn.Linear(dec + self.te_dim, dec), nn.ReLU(), nn.Linear(dec, 1))
        self.width, self.decoder_width = width, dec

    @staticmethod
    def _pos(dim: int, n: int, rows: int | None) -> Tensor:
        if dim % 4:
            return torch.zeros(1 + n, dim)
        return seq_sincos_pos_embed(dim, n, rows)

    # ------------------------------------------------------------------------------------ internals
    def _check(self, batch: Any, need_targets: bool) -> IMTSBatch:
        b = _check_batch(batch, need_targets=need_targets)
        N = b.values.shape[2]
        if N != self.n_channels:
            raise ValueError(
                f"batch must have n_channels = {self.n_channels} channels (the model's per-channel embeddings), got {N}"
            )
        out = ((b.times < 0) | (b.times >= self.history)) & (b.mask > 0)
        if out.any():
            raise ValueError(
                f"batch.times of observed history values must lie in [0, history) = [0, {self.history:g}); got "
                f"{int(out.sum())} outside"
            )
        return b

    def tokens(self, batch: IMTSBatch) -> Tensor:
        """Per-window tokens after TTCN, channel embedding and flag: ``(B, N, M, hid_dim)``."""
        p = patchify_irregular(batch, self.window, self.stride, 0.0, self.history)
        scale = self.history + self.horizon
        z = torch.cat([p.values[..., None], self.time_embedding(p.times / scale)], -1)  # (B, N, M, K, F)
        h = self.ttcn(z, p.mask) + self.channel_embedding[None, :, None, :]
        return torch.cat([h, p.observed[..., None]], -1)

    def compensate(self, h: Tensor) -> Tensor:
        """Graph completion ``(B, N, M, H)`` → ``(B, N, M, 2H)`` (``[h, h]`` when ``use_gcn=False``)."""
        return self.mae.gcn(h) if self.use_gcn else torch.cat([h, h], -1)

    def _encode(self, batch: IMTSBatch, mask_ratio: float | None, generator: torch.Generator | None):
        h = self.compensate(self.tokens(batch))
        B, N, M, _ = h.shape
        x = self.mae.patch_embed(h).reshape(B * N, M, -1) + self.mae.pos_embed[:, 1:]
        keep_idx = restore = None
        if mask_ratio is not None:
            n_keep = round(M * (1 - mask_ratio))
            noise = torch.rand(B * N, M, generator=generator).to(x.device)
            shuffle = torch.argsort(noise, dim=1)
            restore = torch.argsort(shuffle, dim=1)
            keep_idx = shuffle[:, :n_keep]
            x = torch.gather(x, 1, keep_idx[..., None].expand(-1, -1, x.shape[-1]))
        cls = (self.mae.cls_token + self.mae.pos_embed[:, :1]).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], 1)
        for blk in self.mae.blocks:
            x = _run_block(blk, x)
        x = self.mae.decoder_embed(self.mae.norm(x))
        if mask_ratio is not None:
            fill = self.mae.mask_token.expand(x.shape[0], M + 1 - x.shape[1], -1)
            y = torch.cat([x[:, 1:], fill], 1)
            y = torch.gather(y, 1, restore[..., None].expand(-1, -1, y.shape[-1]))
            mask = torch.ones(B * N, M, device=x.device)
            mask[:, : keep_idx.shape[1]] = 0
            mask = torch.gather(mask, 1, restore)
        else:
            y = torch.cat([x[:, 1:], self.mae.mask_token.expand(x.shape[0], self.P, -1)], 1)
            mask = None
        x = torch.cat([x[:, :1], y], 1) + self.mae.decoder_pos_embed[:, : y.shape[1] + 1]
        for blk in self.mae.decoder_blocks:
            x = _run_block(blk, x)
        latent = self.mae.decoder_norm(x)[:, 1:]  # (B·N, L', D)
        return latent.reshape(B, N, -1, latent.shape[-1]), mask

    def _readout(self, latent: Tensor, times: Tensor, patch: Tensor) -> Tensor:
        """Values ``(B, Q, N)`` at ``times`` ``(B, Q, N)`` from the latents ``(B, N, L', D)`` of ``patch``."""
        idx = patch.permute(0, 2, 1)[..., None].expand(-1, -1, -1, latent.shape[-1])
        lat = torch.gather(latent, 2, idx)  # (B, N, Q, D)
        te = self.time_embedding(times.permute(0, 2, 1) / (self.history + self.horizon))
        return self.head(torch.cat([lat, te], -1))[..., 0].permute(0, 2, 1)

    # ----------------------------------------------------------------------------------- public API
    def forecast(self, batch: IMTSBatch) -> Tensor:
        """Values ``(B, Q, N)`` at the query times (padded queries give finite, meaningless values).

        Observed query times must lie in ``(history, history + horizon]``.
        """
        b = self._check(batch, need_targets=False)
        qt = b.query_times
        bad = ((qt <= self.history) | (qt > self.history + self.horizon)) & (b.query_mask > 0)
        if bad.any():
            lo, hi = float(qt[b.query_mask > 0].min()), float(qt[b.query_mask > 0].max())
            raise ValueError(
                f"batch.query_times must lie in (history, history + horizon] = ({self.history:g}, "
                f"{self.history + self.horizon:g}] where query_mask is 1; got {int(bad.sum())} outside (range {lo:g}..{hi:g})"
            )
        latent, _ = self._encode(b, None, None)
        patch = self.M + query_patch_index(qt, self.history, self.stride, self.P)
        return self._readout(latent, qt, patch)

    def forecast_loss(self, batch: IMTSBatch) -> Tensor:
        """Masked MSE of :meth:`forecast` on the observed targets (per channel, then over channels with data)."""
        b = self._check(batch, need_targets=True)
        return imts_masked_mse(self.forecast(b), b.targets, b.query_mask)

    def ssl_loss(self, batch: IMTSBatch, mask_ratio: float = 0.6, *, generator: torch.Generator | None = None,
                 seed: int | None = None) -> Tensor:  # fmt: skip
        """Masked-window reconstruction: MSE on the observed history points inside masked windows."""
        r = check_float(mask_ratio, "mask_ratio", low=0.0, high=1.0, high_open=True)
        b = self._check(batch, need_targets=False)
        latent, mask = self._encode(b, r, make_generator(seed, generator))
        B, _, N = b.values.shape
        patch = query_patch_index(b.times, 0.0, self.stride, self.M)  # (B, L, N)
        pred = self._readout(latent, b.times, patch)
        masked = torch.gather(mask.reshape(B, N, self.M), 2, patch.permute(0, 2, 1)).permute(0, 2, 1)
        return imts_masked_mse(pred, b.values, b.mask * masked)

    def set_finetune(self, mode: FinetuneType) -> list[nn.Parameter]:
        """Set ``requires_grad`` for fine-tuning and return the trainable parameters.

        Every parameter outside the MAE module (time/channel embeddings, TTCN, head) is trainable; inside it
        (ViT blocks, norms, tokens, GCN, patch embedding, positions) ``"norm"`` keeps names containing
        "norm", ``"attn"`` attention, ``"mlp"`` MLPs, ``"bias"`` biases, ``"all"`` everything, ``"freeze"``
        nothing (the official ``run_models.py`` sets).
        """
        if mode not in ("all", "freeze", *_FINETUNE):
            raise ValueError(f"mode must be one of norm/attn/mlp/bias/all/freeze, got {mode!r}")
        mae_ids = {id(p) for p in self.mae.parameters()}
        for p in self.parameters():
            p.requires_grad_(id(p) not in mae_ids or mode == "all")
        if mode in _FINETUNE:
            for name, p in self.mae.named_parameters():
                if re.search(_FINETUNE[mode], name):
                    p.requires_grad_(True)
        return [p for p in self.parameters() if p.requires_grad]


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


# ------------------------------------------------------------------------------------------ metrics
def imts_masked_mse(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """MSE over entries with ``mask`` 1, averaged per channel (last axis) then over channels with data.

    ``mask`` is boolean or holds only 0 and 1 (a fractional or negative weight raises: it would silently
    weight the error).

    NaN/Inf in ``target`` or ``pred`` where ``mask`` is 0 never propagate. Returns 0 when nothing is masked in.
    """
    check_tensor(pred, "pred", finite=False)
    check_tensor(target, "target", finite=False)
    check_tensor(mask, "mask", dtype=("bool", "int", "float"), finite=False, binary=True)
    if pred.shape != target.shape or mask.shape != pred.shape:
        raise ValueError(
            f"pred, target and mask must share a shape, got {tuple(pred.shape)}, {tuple(target.shape)}, {tuple(mask.shape)}"
        )
    m = mask.to(pred.dtype)
    for name, x in (("pred", pred), ("target", target)):
        x = torch.where(m > 0, x, torch.zeros_like(x))
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} must be finite where mask is 1")
        if (x.abs() > 1e18).any():
            raise ValueError(
                f"{name} must be at most 1e18 in magnitude where mask is 1 (its square overflows)"
            )
    diff = torch.where(
        m > 0, pred - torch.where(m > 0, target, torch.zeros_like(target)), torch.zeros_like(pred)
    )
    se = (diff**2).reshape(-1, pred.shape[-1]).sum(0)
    cnt = m.reshape(-1, pred.shape[-1]).sum(0)
    has = cnt > 0
    if not has.any():
        return pred.sum() * 0.0
    return (se[has] / cnt[has]).mean()


# ---------------------------------------------------------------------------------------- training
def fit_vimts(
    model: VIMTS,
    train: IMTSBatch,
    val: IMTSBatch | None = None,
    *,
    stage: Literal["ssl", "finetune"],
    steps: int,
    lr: float = 1e-4,
    batch_size: int = 32,
    mask_ratio: float = 0.6,
    finetune_type: FinetuneType = "norm",
    cosine: bool = True,
    patience: int = 15,
    eval_every: int = 50,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Train ``model`` in place with Adam: ``stage="ssl"`` (all parameters, :meth:`VIMTS.ssl_loss`) or
    ``"finetune"`` (:meth:`VIMTS.set_finetune` ``finetune_type``, :meth:`VIMTS.forecast_loss`).

    ``steps`` mini-batches of ``batch_size`` samples (drawn with a local generator seeded by ``seed``),
    cosine decay to 0 when ``cosine``; every ``eval_every`` steps the ``val`` loss is computed, the best
    state kept and training stopped after ``patience`` evaluations without improvement. Returns
    ``{"train": per-step losses, "val": per-evaluation losses}``. Inputs are validated before training.
    """
    if not isinstance(model, VIMTS):
        raise TypeError(f"model must be a VIMTS, got {type(model).__name__}")
    if stage not in ("ssl", "finetune"):
        raise ValueError(f"stage must be 'ssl' or 'finetune', got {stage!r}")
    steps, bs = check_int(steps, "steps", low=1), check_int(batch_size, "batch_size", low=1)
    lr = check_float(lr, "lr", low=0.0, low_open=True)
    patience, eval_every = check_int(patience, "patience", low=1), check_int(eval_every, "eval_every", low=1)
    need = stage == "finetune"
    train = model._check(train, need)
    if val is not None:
        val = model._check(val, need)
    if stage == "ssl":
        check_float(mask_ratio, "mask_ratio", low=0.0, high=1.0, high_open=True)
        for p in model.parameters():
            p.requires_grad_(True)
        params = list(model.parameters())
    else:
        params = model.set_finetune(finetune_type)
    g = make_generator(seed)
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps)) if cosine else 1.0
    )

    def loss_of(b: IMTSBatch) -> Tensor:
        return model.ssl_loss(b, mask_ratio, generator=g) if stage == "ssl" else model.forecast_loss(b)

    hist: dict[str, list[float]] = {"train": [], "val": []}
    best, best_state, bad = math.inf, None, 0
    n = len(train)
    model.train()
    for step in range(steps):
        idx = torch.randperm(n, generator=g)[: min(bs, n)]
        loss = loss_of(train.index(idx))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        hist["train"].append(float(loss.detach()))
        if val is not None and ((step + 1) % eval_every == 0 or step + 1 == steps):
            model.eval()
            with torch.no_grad():
                vl = float(loss_of(val))
            model.train()
            hist["val"].append(vl)
            if vl < best:
                best, bad = vl, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                bad += 1
                if bad >= patience:
                    break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return hist


# -------------------------------------------------------------------------------------- converters
def imts_from_arrays(X: Any, times: Any, history: float, horizon: float) -> IMTSBatch:
    """A batch from PyPOTS-style NaN-masked arrays: ``X`` ``(n, T, C)`` (NaN = missing) at ``times`` ``(T,)`` or
    ``(n, T)``; observations with ``t < history`` form the history, ``history < t <= history + horizon`` the
    queries/targets (``targets`` keep NaN where missing, ``query_mask`` 0 there)."""
    x = torch.as_tensor(np.asarray(X, dtype=np.float64))
    if x.dim() != 3 or any(s == 0 for s in x.shape):
        raise ValueError(f"X must be a non-empty (n, T, C) array, got shape {tuple(x.shape)}")
    if torch.isinf(x).any():
        raise ValueError(
            f"X must hold finite values or NaN (missing); got {int(torch.isinf(x).sum())} Inf values"
        )
    if (torch.nan_to_num(x).abs() > _MAX_ABS).any():
        raise ValueError(f"X must be at most {_MAX_ABS:g} in magnitude (scale the data); got larger values")
    t = torch.as_tensor(np.asarray(times, dtype=np.float64))
    if t.dim() == 1:
        t = t[None].expand(x.shape[0], -1)
    if tuple(t.shape) != tuple(x.shape[:2]):
        raise ValueError(
            f"times must have shape (T,) = ({x.shape[1]},) or (n, T) = {tuple(x.shape[:2])}, got {tuple(t.shape)}"
        )
    if not torch.isfinite(t).all():
        raise ValueError("times must be finite")
    h, f = (
        check_float(history, "history", low=0.0, low_open=True),
        check_float(horizon, "horizon", low=0.0, low_open=True),
    )
    obs = ~torch.isnan(x)
    hist = (t < h)[..., None] & torch.ones_like(obs)
    fut = ((t > h) & (t <= h + f))[..., None] & torch.ones_like(obs)
    Lh = int((t < h).sum(1).max())
    Lf = int(((t > h) & (t <= h + f)).sum(1).max())
    if Lh == 0 or Lf == 0:
        raise ValueError(
            f"times must have points before history={h:g} and in ({h:g}, {h + f:g}]; got {Lh} and {Lf}"
        )

    def take(sel: Tensor, L: int) -> tuple[Tensor, Tensor, Tensor]:
        order = torch.sort((~sel[..., 0]).to(torch.int8), dim=1, stable=True).indices[:, :L]
        tt = torch.gather(t, 1, order)
        xv = torch.gather(x, 1, order[..., None].expand(-1, -1, x.shape[2]))
        mm = torch.gather(obs & sel, 1, order[..., None].expand(-1, -1, x.shape[2]))
        return tt.float(), xv.float(), mm.float()

    ht, hv, hm = take(hist, Lh)
    qt, qv, qm = take(fut, Lf)
    qt = torch.where(qm.sum(-1) > 0, qt, torch.full_like(qt, h + f))
    return IMTSBatch(ht, torch.nan_to_num(hv), hm, qt, qm, qv)


def imts_from_long(df: Any, n_channels: int, history: float, horizon: float, *, id_col: str = "id",
                   time_col: str = "time", channel_col: str = "channel", value_col: str = "value") -> IMTSBatch:  # fmt: skip
    """A batch from a long table (pandas ``DataFrame`` or dict of columns) ``id, time, channel, value``;
    ``channel`` holds integers in ``[0, n_channels)``. Samples in the order of their first appearance."""
    N = check_int(n_channels, "n_channels", low=1)
    try:
        cols = {c: np.asarray(df[c]) for c in (id_col, time_col, channel_col, value_col)}
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"df must have columns {id_col!r}, {time_col!r}, {channel_col!r}, {value_col!r}"
        ) from exc
    ids, tt = cols[id_col], cols[time_col].astype(np.float64)
    ch, vv = cols[channel_col], cols[value_col].astype(np.float64)
    if len(ids) == 0:
        raise ValueError("df must have at least one row, got 0")
    if not np.issubdtype(ch.dtype, np.integer) or ch.min() < 0 or ch.max() >= N:
        raise ValueError(
            f"df[{channel_col!r}] must hold integers in [0, {N}), got {ch.dtype} in [{ch.min()}, {ch.max()}]"
        )
    if not (np.isfinite(tt).all() and np.isfinite(vv).all()):
        raise ValueError(f"df[{time_col!r}] and df[{value_col!r}] must be finite")
    uid = list(dict.fromkeys(ids.tolist()))
    pos = {u: i for i, u in enumerate(uid)}
    # one row per (sample, distinct time) -> the (n, T, C) NaN layout
    samples = [sorted(set(tt[ids == u].tolist())) for u in uid]
    T = max(len(s) for s in samples)
    X = np.full((len(uid), T, N), np.nan)
    times = np.full((len(uid), T), float(history) + float(horizon) + 1.0)  # padding: outside both spans
    for i, s in enumerate(samples):
        times[i, : len(s)] = s
    tindex = [{v: j for j, v in enumerate(s)} for s in samples]
    for u, t, c, v in zip(ids.tolist(), tt.tolist(), ch.tolist(), vv.tolist()):
        i = pos[u]
        X[i, tindex[i][t], c] = v
    return imts_from_arrays(X, times, history, horizon)
