"""AsymRnR: Video DiT Acceleration with Asymmetric Reduction and Restoration — ICML 2025, P21: token reduction.
Asymmetric token reduction and restoration around attention.

Sun, Tu, Liao, Jin, Tao, ICML 2025 (arXiv 2412.11706; official code ``wenhao728/AsymRnR``). Training-free:
in each attention call the video tokens on an ``(F, H, W)`` grid are split into one random *destination*
per spatiotemporal chunk of ``stride`` and the remaining *sources* (:func:`spatiotemporal_split`); each
source is matched to its most similar destination per head (:func:`match_tokens`, the
:func:`icml25.kernels.nn_match.nearest_neighbor` op, negative squared distance by default); the most
similar sources are dropped (``replace``: their destination stands in) or averaged into it (``mean``),
keeping ``⌊N(1 − ρ)⌋`` tokens (:func:`reduce_tokens`). Queries and keys/values are reduced
**independently** (:func:`asymrnr_attention`: the K/V matching is computed on V and reused for K), and the
query side is restored afterwards (:func:`restore_tokens`: each dropped query copies its destination's
output). Text tokens are never reduced.

How much to reduce comes from a per-(feature, block, step) redundancy schedule (:class:`RnRSchedule`): tiers
0–9 (higher = more redundant) from a calibration run of the unmodified model
(:class:`RedundancyRecorder`, :func:`calibrate_redundancy`), mapped to ratios by thresholds (the largest
ratio whose threshold is ≤ the tier) and the official conflict rule between hidden-state (``h``) and
q/v reduction. :class:`MatchCache` reuses the split and matching for ``cache_steps`` denoising steps.

The diffusers integration (``AsymRnRProcessor``, ``apply_asymrnr``, ``set_step``, CogVideoX) is in
:mod:`icml25.generative_models.asymrnr.diffusers_processor` (optional ``diffusers`` extra).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from icml25.kernels.checks import check_choice, check_float, check_int, check_ints
from icml25.kernels.nn_match import METRICS, check_token_values, check_tokens, nearest_neighbor

__all__ = [
    "FEATURES",
    "MatchCache",
    "MatchResult",
    "RedundancyRecorder",
    "RestoreInfo",
    "RnRSchedule",
    "TokenSplit",
    "apply_asymrnr",
    "asymrnr_attention",
    "asymrnr_step_callback",
    "calibrate_asymrnr",
    "calibrate_redundancy",
    "match_tokens",
    "reduce_tokens",
    "reduced_length",
    "remove_asymrnr",
    "restore_tokens",
    "rnr_apply",
    "set_step",
    "spatiotemporal_split",
    "tiers_from_statistic",
]

FEATURES = ("h", "q", "k", "v")
"""Reducible features: hidden states (before the projections), queries, keys, values."""
MODES = ("replace", "mean")


# ------------------------------------------------------------------------------------------ validation
def _fraction(ratio: object, name: str) -> float:
    """A fraction of tokens removed, in [0, 1)."""
    return check_float(ratio, name, low=0.0, high=1.0, high_open=True)


def _check_tokens(name: str, x: object, n: int) -> torch.Tensor:
    x = check_tokens(x, name)
    if x.shape[-2] != n:
        raise ValueError(
            f"{name} has {x.shape[-2]} tokens (dim -2) but the split's grid F*H*W has {n}; slice off the "
            f"text tokens (text_len) or pass the grid of this sequence"
        )
    return x


# ------------------------------------------------------------------------------------------------ split
@dataclass(frozen=True)
class TokenSplit:
    """Destination and source token positions of one spatiotemporal split of ``n`` video tokens.

    ``dst_idx [n_dst]``: one destination per chunk (sorted by chunk); ``src_idx [n - n_dst]``: the rest
    (ascending). Together a permutation of ``range(n)``.
    """

    dst_idx: torch.Tensor
    src_idx: torch.Tensor
    grid: tuple[int, int, int]
    stride: tuple[int, int, int]

    @property
    def n(self) -> int:
        return self.dst_idx.numel() + self.src_idx.numel()

    @property
    def n_dst(self) -> int:
        return self.dst_idx.numel()


def spatiotemporal_split(
    grid: tuple[int, int, int],
    stride: tuple[int, int, int] = (2, 2, 2),
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> TokenSplit:
    """One random destination per ``stride`` chunk of the ``(F, H, W)`` token grid (row-major tokens).

    When a grid side is not divisible by its stride, the chunk grid is shifted by a random offset in
    ``[0, (−side) mod stride]`` (the grid padded on both ends), so the partial chunks move between calls;
    each chunk holding at least one token gets exactly one destination, uniform among its tokens.

    Raises:
        ValueError: a grid side < 1, or a stride side < 1 or larger than the grid side.
    """
    grid, stride = check_ints(grid, "grid", length=3), check_ints(stride, "stride", length=3)
    for i, (g, s) in enumerate(zip(grid, stride)):
        if g < 1:
            raise ValueError(f"grid must have sides >= 1, got {grid}")
        if s < 1 or s > g:
            raise ValueError(
                f"stride must have sides in [1, grid side]; got stride {stride} for grid {grid} (axis {i})"
            )
    dev = torch.device(device) if device is not None else torch.device("cpu")
    gdev = generator.device if generator is not None else torch.device("cpu")
    pad = [(-g) % s for g, s in zip(grid, stride)]
    offset = [int(torch.randint(p + 1, (1,), generator=generator, device=gdev)) if p else 0 for p in pad]
    coords = torch.meshgrid(*[torch.arange(g) for g in grid], indexing="ij")
    n_chunks = [(g + p) // s for g, p, s in zip(grid, pad, stride)]
    cidx = [(c.reshape(-1) + o) // s for c, o, s in zip(coords, offset, stride)]
    chunk = (cidx[0] * n_chunks[1] + cidx[1]) * n_chunks[2] + cidx[2]  # [N]
    key = torch.rand(chunk.numel(), generator=generator, device=gdev).cpu()
    order = torch.argsort(chunk.double() * 2.0 + key.double())  # by chunk, random within a chunk
    first = torch.ones_like(chunk, dtype=torch.bool)
    sorted_chunk = chunk[order]
    first[1:] = sorted_chunk[1:] != sorted_chunk[:-1]
    is_dst = torch.zeros_like(first)
    is_dst[order[first]] = True
    ar = torch.arange(chunk.numel())
    return TokenSplit(ar[is_dst].to(dev)[chunk[is_dst].argsort()], ar[~is_dst].to(dev), grid, stride)


# ------------------------------------------------------------------------------------------------ match
@dataclass(frozen=True)
class MatchResult:
    """Each source's nearest destination and the sources ordered least similar first.

    ``nearest_dst [..., n_src]``: index into the split's destinations; ``order [..., n_src]``: source
    positions (into ``split.src_idx``) sorted by similarity, least similar first (stable);
    ``similarity [..., n_src]``: the metric's value (``−‖x − y‖²`` for euclidean).
    """

    nearest_dst: torch.Tensor
    order: torch.Tensor
    similarity: torch.Tensor


def match_tokens(
    x: torch.Tensor, split: TokenSplit, metric: str = "euclidean", *, backend: str | None = None
) -> MatchResult:
    """Match every source token of ``x [..., N, C]`` to its most similar destination (per leading index).

    ``metric``: ``"euclidean"`` (the reference's default, negative squared distance), ``"cosine"``, ``"dot"``
    or ``"random"`` (a random destination and order; an ablation of the reference). The nearest-neighbour
    search streams over blocks (:func:`icml25.kernels.nn_match.nearest_neighbor`; Triton on CUDA).
    """
    if not isinstance(split, TokenSplit):
        raise TypeError(f"split must be a TokenSplit (spatiotemporal_split), got {type(split).__name__}")
    metric = check_choice(metric, "metric", (*METRICS, "random"))
    x = _check_tokens("x", x, split.n)
    check_token_values(x, "x", "euclidean" if metric == "random" else metric)
    dst = x.index_select(-2, split.dst_idx.to(x.device))
    src = x.index_select(-2, split.src_idx.to(x.device))
    if metric == "random":
        lead = src.shape[:-1]
        nearest = torch.randint(max(split.n_dst, 1), lead, device=x.device)
        sim = torch.rand(lead, device=x.device)
    else:
        sim, nearest = nearest_neighbor(src, dst, metric=metric, check_finite=False, backend=backend)
    order = torch.argsort(sim, dim=-1, stable=True)  # least similar first
    return MatchResult(nearest, order, sim)


# ---------------------------------------------------------------------------------- reduce / restore
def reduced_length(n: int, n_dst: int, ratio: float) -> int:
    """Tokens kept at ``ratio``: ``n_keep + n_dst`` with ``n_keep = max(0, ⌊n(1 − ρ)⌋ − n_dst)``."""
    n_keep = min(n - n_dst, max(0, int(n * (1.0 - ratio)) - n_dst))
    return n_keep + n_dst


@dataclass(frozen=True)
class RestoreInfo:
    """What :func:`restore_tokens` needs: positions of the kept sources, the destinations and the dropped
    sources with their matched destination (``[..., ·]`` per leading index of the reduced tensor)."""

    kept_pos: torch.Tensor
    dst_idx: torch.Tensor
    reduced_pos: torch.Tensor
    reduced_dst: torch.Tensor
    n: int

    @property
    def n_kept(self) -> int:
        return self.kept_pos.shape[-1]

    def counts(self) -> torch.Tensor:
        """Tokens each reduced position stands for ``[..., n_kept + n_dst]`` (1 + its dropped sources)."""
        lead = self.reduced_dst.shape[:-1]
        out = torch.ones(*lead, self.n_kept + self.dst_idx.numel(), device=self.reduced_dst.device)
        add = torch.ones_like(self.reduced_dst, dtype=out.dtype)
        return out.scatter_add(-1, self.reduced_dst + self.n_kept, add)


def _expand_idx(idx: torch.Tensor, lead: torch.Size, c: int) -> torch.Tensor:
    return idx.reshape(*idx.shape[:-1], idx.shape[-1], 1).expand(*lead, idx.shape[-1], c)


def reduce_tokens(
    x: torch.Tensor, split: TokenSplit, match: MatchResult, ratio: float, mode: str = "replace"
) -> tuple[torch.Tensor, RestoreInfo]:
    """Keep the ``n_keep`` least similar sources and the destinations: ``[..., n_keep + n_dst, C]``.

    ``mode="replace"`` drops the other sources (their destination stands in); ``"mean"`` averages them into
    their destination (``scatter_reduce`` mean, the destination included). ``match`` may have fewer
    leading dims than ``x`` (then it is broadcast, e.g. a per-batch matching applied to every head).
    """
    ratio = _fraction(ratio, "ratio")
    mode = check_choice(mode, "mode", MODES)
    x = _check_tokens("x", x, split.n)
    n_src, c = split.src_idx.numel(), x.shape[-1]
    n_keep = reduced_length(split.n, split.n_dst, ratio) - split.n_dst
    lead = x.shape[:-2]
    if not isinstance(match, MatchResult):
        raise TypeError(f"match must be a MatchResult (match_tokens), got {type(match).__name__}")
    m_lead = match.order.shape[:-1]
    if match.order.shape[-1] != n_src or tuple(lead[: len(m_lead)]) != tuple(m_lead):
        raise ValueError(
            f"x must have the leading dims {list(m_lead)} of the matching (then any more), got shape "
            f"{tuple(x.shape)}; the matching has {match.order.shape[-1]} sources, the split {n_src}"
        )
    order = match.order.to(x.device)
    while order.ndim < x.ndim - 1:  # broadcast a per-batch matching over the inner dims (heads)
        order = order.unsqueeze(-2)
    order = order.expand(*lead, n_src)
    nearest = match.nearest_dst.to(x.device)
    while nearest.ndim < x.ndim - 1:
        nearest = nearest.unsqueeze(-2)
    nearest = nearest.expand(*lead, n_src)
    src_idx = split.src_idx.to(x.device)
    kept_pos = src_idx[order[..., :n_keep]]  # [..., n_keep] token positions
    red = order[..., n_keep:]
    reduced_pos = src_idx[red]
    reduced_dst = nearest.gather(-1, red)
    dst_idx = split.dst_idx.to(x.device)
    kept = x.gather(-2, _expand_idx(kept_pos, lead, c))
    dst = x.index_select(-2, dst_idx)
    if mode == "mean" and red.shape[-1]:
        dropped = x.gather(-2, _expand_idx(reduced_pos, lead, c))
        dst = dst.scatter_reduce(
            -2, _expand_idx(reduced_dst, lead, c), dropped, reduce="mean", include_self=True
        )
    info = RestoreInfo(kept_pos, dst_idx, reduced_pos, reduced_dst, split.n)
    return torch.cat([kept, dst], dim=-2), info


def restore_tokens(y: torch.Tensor, info: RestoreInfo) -> torch.Tensor:
    """Full-length ``[..., N, C]`` from reduced outputs ``y [..., n_keep + n_dst, C]``.

    Kept sources and destinations go back to their positions; each dropped source copies its matched
    destination's output.
    """
    if not isinstance(info, RestoreInfo):
        raise TypeError(f"info must be the RestoreInfo of reduce_tokens, got {type(info).__name__}")
    n_red = info.n_kept + info.dst_idx.numel()
    if not isinstance(y, torch.Tensor) or y.ndim < 2 or y.shape[-2] != n_red:
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"y must be [..., {n_red}, C] (the reduced length of info), got {got}")
    lead, c = y.shape[:-2], y.shape[-1]
    i_lead = info.kept_pos.shape[:-1]
    if tuple(lead[: len(i_lead)]) != tuple(i_lead) or len(lead) < len(i_lead):
        raise ValueError(
            f"y must have the leading dims {list(i_lead)} of the reduced tokens, got shape {tuple(y.shape)}"
        )
    kept, dst = y[..., : info.n_kept, :], y[..., info.n_kept :, :]
    out = y.new_empty(*lead, info.n, c)
    kp = info.kept_pos.expand(*lead, info.n_kept)
    rp = info.reduced_pos.expand(*lead, info.reduced_pos.shape[-1])
    rd = info.reduced_dst.expand(*lead, info.reduced_dst.shape[-1])
    out.scatter_(-2, _expand_idx(kp, lead, c), kept)
    out.index_copy_(-2, info.dst_idx, dst)
    out.scatter_(-2, _expand_idx(rp, lead, c), dst.gather(-2, _expand_idx(rd, lead, c)))
    return out


def rnr_apply(
    x: torch.Tensor,
    fn: Callable[[torch.Tensor], torch.Tensor],
    split: TokenSplit,
    match: MatchResult,
    ratio: float,
    mode: str = "replace",
) -> torch.Tensor:
    """Reduce ``x``, apply a token-wise-shaped ``fn`` (e.g. projections + attention + out-projection of a
    block, the reference's ``h`` reduction), restore: ``restore(fn(reduce(x)))``."""
    xr, info = reduce_tokens(x, split, match, ratio, mode)
    return restore_tokens(fn(xr), info)


# -------------------------------------------------------------------------------------------- cache
class MatchCache:
    """Reuse the split and matching of each key for ``cache_steps`` denoising steps.

    :meth:`get` recomputes when the key is new or ``step`` has left the window ``[s0, s0 + cache_steps)`` of
    its last computation (the reference resets every ``similarity_reuse_steps`` calls; with one call per key
    and step, recomputation happens exactly at steps 0, c, 2c, ...). ``recomputed`` logs ``(key, step)``.
    """

    def __init__(self, cache_steps: int = 5, generator: torch.Generator | None = None) -> None:
        check_int(cache_steps, "cache_steps", low=1)  # steps a matching is reused
        self.cache_steps = cache_steps
        self.generator = generator
        self._store: dict[object, tuple[int, TokenSplit, MatchResult]] = {}
        self.recomputed: list[tuple[object, int]] = []

    def get(
        self,
        key: object,
        step: int,
        x: torch.Tensor,
        grid: tuple[int, int, int],
        stride: tuple[int, int, int],
        metric: str = "euclidean",
    ) -> tuple[TokenSplit, MatchResult]:
        grid = check_ints(grid, "grid", length=3)
        _check_tokens("x", x, math.prod(grid))
        hit = self._store.get(key)
        if hit is not None and hit[0] <= step < hit[0] + self.cache_steps:
            return hit[1], hit[2]
        start = step - step % self.cache_steps
        split = spatiotemporal_split(grid, stride, generator=self.generator, device=x.device)
        match = match_tokens(x, split, metric)
        self._store[key] = (start, split, match)
        self.recomputed.append((key, step))
        return split, match

    def clear(self) -> None:
        self._store.clear()
        self.recomputed.clear()


# ---------------------------------------------------------------------------------------- attention
def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def asymrnr_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grid: tuple[int, int, int],
    *,
    ratio_q: float = 0.0,
    ratio_kv: float = 0.0,
    stride: tuple[int, int, int] = (2, 2, 2),
    text_len: int = 0,
    text_first: bool = True,
    metric: str = "euclidean",
    mode: str = "replace",
    log_count_bias: bool = False,
    cache: MatchCache | None = None,
    cache_key: object = None,
    step: int = 0,
    generator: torch.Generator | None = None,
    attention: Callable[..., torch.Tensor] | None = None,
    check_finite: bool = True,
) -> torch.Tensor:
    """Attention with queries and keys/values reduced independently, the query side restored.

    Args:
        q, k, v: ``[B, H, L, d]`` with ``L = text_len + F·H·W``; text tokens first (CogVideoX) or last
            (``text_first=False``: HunyuanVideo, Mochi) are never reduced.
        grid: ``(F, H, W)`` of the video tokens (row-major).
        ratio_q, ratio_kv: fractions of video queries / keys-values removed, each in ``[0, 1)``.
        stride: destination chunk size.
        metric: matching similarity (:func:`match_tokens`); the K/V matching is computed on V, reused for K.
        mode: ``"replace"`` (default) or ``"mean"`` (:func:`reduce_tokens`; queries always ``replace``-restore).
        log_count_bias: add ``log(count)`` of each reduced key to the logits (off in the reference).
        cache, cache_key, step: reuse the split and matching (``cache_key`` plus ``"q"``/``"kv"``).
        generator: the split's randomness without a cache.
        attention: ``attention(q, k, v, bias)``; default ``scaled_dot_product_attention``.
        check_finite: reject NaN/Inf and float32-overflowing tokens in q, k, v (one host sync).

    Returns:
        ``[B, H, L, d]``, equal to plain attention when both ratios are 0.
    """
    ratio_q, ratio_kv = (
        _fraction(ratio_q, "ratio_q"),
        _fraction(ratio_kv, "ratio_kv"),
    )
    grid = check_ints(grid, "grid", length=3)
    n = math.prod(grid)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be a floating-point torch.Tensor [B, H, L, d], got {got}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D [B, H, L, d], got shape {tuple(t.shape)}")
        if t.shape[-1] == 0:
            raise ValueError(f"{name} must have a head dim d >= 1, got shape {tuple(t.shape)}")
        if check_finite:
            check_token_values(t, name, hint=" (pass check_finite=False to skip this check)")
    for name, t in (("k", k), ("v", v)):
        if t.shape[:2] != q.shape[:2] or t.shape[-1] != q.shape[-1]:
            raise ValueError(
                f"{name} must have q's batch, heads and head dim {tuple(q.shape[:2])}, d = {q.shape[-1]}; got shape {tuple(t.shape)}"
            )
    L = q.shape[-2]
    if L != text_len + n or k.shape[-2] != L or v.shape[-2] != L:
        raise ValueError(
            f"q, k, v must have text_len + F*H*W = {text_len} + {n} = {text_len + n} tokens (dim -2), got "
            f"{L}, {k.shape[-2]}, {v.shape[-2]}"
        )
    attn = attention or _sdpa
    if ratio_q == 0.0 and ratio_kv == 0.0:
        return attn(q, k, v, None)

    def parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if text_first:
            return t[..., :text_len, :], t[..., text_len:, :]
        return t[..., n:, :], t[..., :n, :]

    def join(text: torch.Tensor, vid: torch.Tensor) -> torch.Tensor:
        return torch.cat([text, vid] if text_first else [vid, text], dim=-2)

    def matching(name: str, x: torch.Tensor) -> tuple[TokenSplit, MatchResult]:
        if cache is not None:
            return cache.get((cache_key, name), step, x, grid, stride, metric)
        split = spatiotemporal_split(grid, stride, generator=generator, device=x.device)
        return split, match_tokens(x, split, metric)

    tq, vq = parts(q)
    tk, vk = parts(k)
    tv, vv = parts(v)
    bias = None
    if ratio_kv > 0.0:
        split_kv, m_kv = matching("kv", vv)
        vk, info_kv = reduce_tokens(vk, split_kv, m_kv, ratio_kv, mode)
        vv, _ = reduce_tokens(vv, split_kv, m_kv, ratio_kv, mode)
        if log_count_bias:
            logc = info_kv.counts().log().to(q.dtype)  # [B, H, n_kv']
            zeros = logc.new_zeros(*logc.shape[:-1], text_len)
            bias = torch.cat([zeros, logc] if text_first else [logc, zeros], dim=-1)[..., None, :]
    info_q = None
    if ratio_q > 0.0:
        split_q, m_q = matching("q", vq)
        vq, info_q = reduce_tokens(vq, split_q, m_q, ratio_q, "replace")
    out = attn(join(tq, vq), join(tk, vk), join(tv, vv), bias)
    if info_q is None:
        return out
    t_out, v_out = _parts_reduced(out, text_len, text_first)
    return join(t_out, restore_tokens(v_out, info_q))


def _parts_reduced(out: torch.Tensor, text_len: int, text_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a (reduced) sequence into its text and video parts."""
    if text_first:
        return out[..., :text_len, :], out[..., text_len:, :]
    return out[..., out.shape[-2] - text_len :, :], out[..., : out.shape[-2] - text_len, :]


# ------------------------------------------------------------------------------------------- schedule
def _thresholds(name: str, value: object) -> dict[int, float]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping tier -> ratio (e.g. {{6: 0.4, 7: 0.8}}), got {value!r}")
    out = {}
    for t, r in value.items():
        t = check_int(t, f"{name} key (a tier)", low=0, high=9)
        out[t] = _fraction(r, f"{name}[{t}]")
    return out


@dataclass
class RnRSchedule:
    """Per-(feature, block, step) redundancy tiers and the tier -> ratio thresholds of each feature.

    ``tiers[f]``: int64 ``[num_blocks, num_steps]`` in 0..9 (higher = more redundant) for ``f`` in
    ``FEATURES``; ``thresholds[f]``: ``{tier: ratio}``; a feature's ratio is the largest ratio whose threshold
    is ≤ its tier (0 when none). The official CogVideoX-2B "base" setting is ``q {6: 0.4, 7: 0.8}``,
    ``v {8: 0.3}``. :meth:`ratios` applies the official conflict rule.
    """

    tiers: dict[str, torch.Tensor]
    thresholds: dict[str, dict[int, float]] = field(default_factory=dict)
    num_blocks: int | None = None
    num_steps: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tiers, Mapping) or not self.tiers:
            raise TypeError(
                f"tiers must be a non-empty mapping feature -> [num_blocks, num_steps] tensor, got {self.tiers!r}"
            )
        shape = None
        clean = {}
        for f, t in self.tiers.items():
            check_choice(f, "tiers key", FEATURES)
            t = torch.as_tensor(t)
            if t.dtype.is_floating_point or t.dtype == torch.bool or t.ndim != 2:
                raise ValueError(
                    f"tiers[{f!r}] must be an integer [num_blocks, num_steps] tensor, got {t.dtype} {tuple(t.shape)}"
                )
            if t.numel() and (int(t.min()) < 0 or int(t.max()) > 9):
                raise ValueError(
                    f"tiers[{f!r}] must hold tiers in 0..9, got [{int(t.min())}, {int(t.max())}]"
                )
            want = (self.num_blocks, self.num_steps)
            if shape is None:
                shape = tuple(t.shape)
            if tuple(t.shape) != shape or any(w is not None and w != s for w, s in zip(want, t.shape)):
                raise ValueError(
                    f"tiers[{f!r}] must have shape (num_blocks, num_steps) = "
                    f"{tuple(w if w is not None else s for w, s in zip(want, shape))}, got {tuple(t.shape)}"
                )
            clean[f] = t.to(torch.int64)
        self.tiers = clean
        self.num_blocks, self.num_steps = shape
        self.thresholds = {f: _thresholds(f"thresholds[{f!r}]", v) for f, v in self.thresholds.items()}
        for f in self.thresholds:
            check_choice(f, "thresholds key", FEATURES)

    def ratio(self, feature: str, block: int, step: int) -> float:
        """The raw ratio of one feature (no conflict rule): max ratio over thresholds ≤ tier."""
        if feature not in self.tiers or not self.thresholds.get(feature):
            return 0.0
        tier = int(self.tiers[feature][block, min(step, self.num_steps - 1)])
        return max([r for t, r in self.thresholds[feature].items() if t <= tier], default=0.0)

    def ratios(self, block: int, step: int) -> dict[str, float]:
        """``{"h", "q", "k", "v"}`` ratios after the official conflict rule.

        If q or v conflicts with a nonzero h, h is disabled when the q/v reduction is the more efficient one
        (its h-equivalent ``0.5x − 0.07`` for q, ``0.4x − 0.01`` for v exceeds the h ratio); otherwise the q/v
        reduction is skipped. V implies K (the same matching); K alone only when h and v are off.
        """
        if not (0 <= block < self.num_blocks):
            raise ValueError(f"block must be in [0, {self.num_blocks}), got {block}")
        r = {f: self.ratio(f, block, step) for f in FEATURES}
        for f, slope, icpt in (("q", 0.5, -0.07), ("v", 0.4, -0.01)):
            if r["h"] > 0 and r[f] > 0:
                if slope * r[f] + icpt > r["h"]:
                    r["h"] = 0.0
                else:
                    r[f] = 0.0
        if r["v"] > 0:
            r["k"] = r["v"]
        elif r["h"] > 0:
            r["k"] = 0.0
        return r

    def save(self, path: str | Path) -> None:
        """Write the tiers as safetensors (keys h/q/k/v, int64 ``[num_blocks, num_steps]``, the reference's format)."""
        try:
            from safetensors.torch import save_file
        except ImportError as exc:  # pragma: no cover - safetensors comes with icml25-kernels
            raise ImportError("RnRSchedule files are safetensors: pip install safetensors") from exc

        save_file({f: t.contiguous() for f, t in self.tiers.items()}, str(path))

    @classmethod
    def from_safetensors(
        cls,
        path: str | Path,
        thresholds: Mapping[str, Mapping[int, float]],
        num_blocks: int | None = None,
        num_steps: int | None = None,
    ) -> RnRSchedule:
        """Load tiers saved by :meth:`save` or shipped by the official code (``schedulers/*.safetensors``)."""
        try:
            from safetensors.torch import load_file
        except ImportError as exc:  # pragma: no cover - safetensors comes with icml25-kernels
            raise ImportError("RnRSchedule files are safetensors: pip install safetensors") from exc

        return cls(
            dict(load_file(str(path))), {f: dict(v) for f, v in thresholds.items()}, num_blocks, num_steps
        )


def tiers_from_statistic(stat: torch.Tensor) -> torch.Tensor:
    """Deciles of a redundancy statistic over all its (block, step) entries -> tiers 0..9 (higher = larger)."""
    flat = stat.double().flatten()
    if flat.numel() == 0:
        return torch.zeros_like(stat, dtype=torch.int64)
    ranks = flat.argsort().argsort().double()
    return torch.floor(10.0 * ranks / flat.numel()).clamp(0, 9).to(torch.int64).reshape(stat.shape)


class RedundancyRecorder:
    """Collects a redundancy statistic per (feature, block, step) during a calibration run.

    For features ``x [..., N, C]`` on a grid, the statistic is ``1 − mean_src ‖x_s − y_nn(s)‖² / mean ‖x‖²``
    (relative nearest-destination distance under a fresh split; close to 1 for smooth, redundant tokens).
    The official code ships precomputed tiers; its statistic is not published, so this choice (deciles of
    the relative nearest-destination distance) is ours.
    """

    def __init__(self, num_blocks: int, num_steps: int, stride=(2, 2, 2), seed: int = 0) -> None:
        self.num_blocks, self.num_steps, self.stride = (
            num_blocks,
            num_steps,
            check_ints(stride, "stride", length=3),
        )
        self.stats = {
            f: torch.full((num_blocks, num_steps), float("nan"), dtype=torch.float64) for f in FEATURES
        }
        self.generator = torch.Generator().manual_seed(seed)

    def record(
        self, feature: str, block: int, step: int, x: torch.Tensor, grid: tuple[int, int, int]
    ) -> float:
        feature = check_choice(feature, "feature", FEATURES)
        x = _check_tokens("x", x, math.prod(check_ints(grid, "grid", length=3)))
        if x.numel() == 0:
            raise ValueError(
                f"x must hold at least one token sequence with features, got shape {tuple(x.shape)}"
            )
        check_token_values(x, "x")
        split = spatiotemporal_split(grid, self.stride, generator=self.generator, device=x.device)
        m = match_tokens(x.detach().float(), split, "euclidean")
        rel = float((-m.similarity).mean() / x.detach().float().square().sum(-1).mean().clamp_min(1e-30))
        self.stats[feature][block, step] = 1.0 - rel
        return 1.0 - rel

    def schedule(self, thresholds: Mapping[str, Mapping[int, float]]) -> RnRSchedule:
        """Deciles of each recorded feature's statistic -> an :class:`RnRSchedule` (K takes V's tiers)."""
        tiers = {}
        for f, s in self.stats.items():
            if bool(torch.isnan(s).all()):
                continue
            if bool(torch.isnan(s).any()):
                raise ValueError(f"feature {f!r} was recorded for only some (block, step) entries")
            tiers[f] = tiers_from_statistic(s)
        if "v" in tiers and "k" not in tiers:
            tiers["k"] = tiers["v"].clone()
        return RnRSchedule(
            tiers, {f: dict(v) for f, v in thresholds.items()}, self.num_blocks, self.num_steps
        )


def calibrate_redundancy(
    run_fn: Callable[[RedundancyRecorder], None],
    num_blocks: int,
    num_steps: int,
    thresholds: Mapping[str, Mapping[int, float]],
    stride: tuple[int, int, int] = (2, 2, 2),
    seed: int = 0,
) -> RnRSchedule:
    """Calibrate a schedule from one run of the unmodified model.

    ``run_fn(recorder)`` runs the model and calls ``recorder.record(feature, block, step, x, grid)`` for the
    features to schedule (the diffusers integration does this from its attention processors).
    """
    rec = RedundancyRecorder(num_blocks, num_steps, stride, seed)
    run_fn(rec)
    return rec.schedule(thresholds)


def warn_stuck_step() -> None:
    """Warn that the denoising step was never advanced (the schedule and cache stay at step 0)."""
    warnings.warn(
        "AsymRnR: set_step was never called, so the schedule and matching cache stay at step 0; pass "
        "callback_on_step_end=asymrnr_step_callback to the pipeline or call set_step(transformer, i)",
        stacklevel=3,
    )


# ------------------------------------------------------------------- diffusers (lazy, optional extra)
def apply_asymrnr(transformer, schedule, stride=(2, 2, 2), cache_steps=5, mode="replace", metric="euclidean", generator=None):  # fmt: skip
    """Patch a diffusers ``CogVideoXTransformer3DModel`` with AsymRnR attention processors.

    See :func:`icml25.generative_models.asymrnr.diffusers_processor.apply_asymrnr` (needs the ``diffusers``
    extra). Returns the shared state (schedule, grid, step, matching cache).
    """
    from icml25.generative_models.asymrnr import diffusers_processor as dp

    return dp.apply_asymrnr(transformer, schedule, stride, cache_steps, mode, metric, generator)


def remove_asymrnr(transformer) -> None:
    """Restore the original attention processors of a patched transformer (diffusers extra)."""
    from icml25.generative_models.asymrnr import diffusers_processor as dp

    dp.remove_asymrnr(transformer)


def set_step(transformer, step_index: int) -> None:
    """Set the denoising step used by the schedule and the matching cache of a patched transformer."""
    from icml25.generative_models.asymrnr import diffusers_processor as dp

    dp.set_step(transformer, step_index)


def asymrnr_step_callback(pipe, step_index, timestep, callback_kwargs):
    """``callback_on_step_end`` for diffusers pipelines: advances :func:`set_step` after each step."""
    from icml25.generative_models.asymrnr import diffusers_processor as dp

    return dp.asymrnr_step_callback(pipe, step_index, timestep, callback_kwargs)


def calibrate_asymrnr(transformer, run, num_steps, thresholds, stride=(2, 2, 2), seed=0) -> RnRSchedule:
    """Calibrate a schedule from one run of an unpatched CogVideoX transformer (diffusers extra); see
    :func:`icml25.generative_models.asymrnr.diffusers_processor.calibrate_asymrnr`."""
    from icml25.generative_models.asymrnr import diffusers_processor as dp

    return dp.calibrate_asymrnr(transformer, run, num_steps, thresholds, stride, seed)
