"""ToMA: Token Merge with Attention for Diffusion Models — ICML 2025, P26: tiled token merging for attention.

Lu, Zheng, Xia & Wang, "ToMA: Token Merge with Attention for Diffusion Models", ICML 2025 (arXiv
2509.10918; official code ``WenboLuu/ToMA``). The image tokens ``x [B, N, C]`` of an ``H × W`` grid are split
into ``num_tiles`` square tiles; in every tile ToMA keeps ``d = ⌊n(1 − ratio)⌋`` destinations chosen by greedy
facility location, merges with ``M = A / rowsum(A)`` where ``A = softmax_dst(τ · X̂[S] X̂ᵀ)`` and unmerges
with ``Aᵀ``. Attention then runs on ``D = T·d`` tokens instead of ``N``. Every step is a dense batched op
(:mod:`icml25.kernels.token_merge`: Triton on CUDA, the torch reference elsewhere).

* :func:`tile_tokens` / :func:`untile_tokens` — grid -> tiles and back (views only).
* :func:`facility_location_select`, :func:`toma_merge_matrices` — the two steps on tiles ``[G, n, C]``.
* :func:`toma_fns` — a :class:`ToMAPlan` (``merge``, ``unmerge``, ``log_sizes``) for any model's tokens.
* :class:`ToMAState` — reuse of the plans across steps and blocks (recompute every ``recompute_every``
  steps, only in the first block of each token count).
* :func:`apply_toma` / :func:`remove_toma` — patch the self-attention of diffusers ``BasicTransformerBlock``
  s (UNet2DConditionModel, Transformer2DModel, PixArt, DiT) through their attention processors; needs
  ``pip install 'icml25-generative-models[diffusers]'`` (imported lazily).
* :func:`tomesd_fns` — the ToMeSD baseline (random 2×2-grid bipartite matching, argsort + scatter).

Unlike the official code, destinations are selected for each batch element (the official
``local_tile_wise_facility`` selects on element 0 and shares it, wrong for mixed-prompt batches).
``proportional_attention`` (an additive ``log(size)`` key bias for merged tokens) is an option that the
official code does not have.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from icml25.kernels import token_merge as _tm
from icml25.kernels.checks import check_float, check_int, check_ints, check_tensor

__all__ = [
    "ToMAPlan",
    "ToMAState",
    "apply_toma",
    "facility_location_select",
    "remove_toma",
    "tile_tokens",
    "toma_fns",
    "toma_merge_matrices",
    "tomesd_fns",
    "untile_tokens",
]

Selection = Literal["facility_location", "random"]


# ----------------------------------------------------------------------------------------- validation
def _ratio(ratio: object) -> float:
    """The fraction of tokens removed, in [0, 1)."""
    return check_float(ratio, "ratio", low=0.0, high=1.0, high_open=True)


def _batch_tokens(x: object, name: str = "x") -> torch.Tensor:
    """A floating tensor [B, N, C] with N >= 1 tokens and C >= 1 features (NaN is not checked here)."""
    x = check_tensor(x, name, ndim=3, finite=False)
    if x.shape[1] == 0 or x.shape[2] == 0:
        raise ValueError(f"{name} must have N >= 1 tokens and C >= 1 features, got shape {tuple(x.shape)}")
    return x


def _resolve_hw(hw: object, N: int) -> tuple[int, int]:
    if hw is None:
        side = math.isqrt(N)
        if side * side != N:
            raise ValueError(
                f"hw=None needs a square token grid, but N = {N} (x.shape[1]) is not a perfect square; "
                "pass hw=(H, W) with H * W = N"
            )
        return side, side
    H, W = check_ints(hw, "hw", length=2)
    if H < 1 or W < 1 or H * W != N:
        raise ValueError(f"hw = ({H}, {W}) must be positive with H * W = N = {N} (x.shape[1])")
    return H, W


def _tiles_per_side(num_tiles: object, H: int, W: int) -> int:
    nt = check_int(num_tiles, "num_tiles", low=1)
    t = math.isqrt(nt)
    if t * t != nt:
        raise ValueError(f"num_tiles must be a perfect square (t × t tiles), got {nt}")
    if H % t or W % t:
        raise ValueError(
            f"num_tiles = {nt} ({t} × {t} tiles) must divide the grid: its side {t} must divide H = {H} and "
            f"W = {W}"
        )
    return t


# ------------------------------------------------------------------------------------------- tiling
def tile_tokens(
    x: torch.Tensor, hw: tuple[int, int] | None, num_tiles: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the ``H × W`` row-major token grid into ``num_tiles = t²`` square tiles.

    Args:
        x: [B, N, C] tokens, ``N = H · W``.
        hw: ``(H, W)``; None: a square grid (``N`` must be a perfect square).
        num_tiles: ``t²`` with ``t`` dividing ``H`` and ``W``.

    Returns:
        ``(tiles [B, T, n, C], perm [N])`` with ``T = t²``, ``n = (H/t)(W/t)``, tiles in row-major order and
        tokens row-major within a tile: ``tiles.reshape(B, N, C) == x[:, perm]``.
    """
    x = _batch_tokens(x)
    N = x.shape[1]
    H, W = _resolve_hw(hw, N)
    t = _tiles_per_side(num_tiles, H, W)
    th, tw = H // t, W // t
    perm = torch.arange(N, device=x.device).reshape(t, th, t, tw).permute(0, 2, 1, 3).reshape(-1)
    return _tile_view(x, H, W, t), perm


def untile_tokens(x_tiles: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`tile_tokens`: ``x_tiles [B, T, n, C]`` and its ``perm [N]`` -> ``[B, N, C]``."""
    if not isinstance(x_tiles, torch.Tensor) or x_tiles.ndim != 4:
        got = tuple(x_tiles.shape) if isinstance(x_tiles, torch.Tensor) else type(x_tiles).__name__
        raise ValueError(f"x_tiles must be a 4-D tensor [B, T, n, C], got {got}")
    if not isinstance(perm, torch.Tensor) or perm.ndim != 1 or perm.is_floating_point():
        raise TypeError("perm must be the 1-D integer permutation returned by tile_tokens")
    B, T, n, C = x_tiles.shape
    if perm.numel() != T * n:
        raise ValueError(f"perm has {perm.numel()} entries, but x_tiles holds T · n = {T * n} tokens")
    if not torch.equal(perm.sort().values.cpu(), torch.arange(perm.numel())):
        raise ValueError("perm must be a permutation of 0 .. N-1 (the one returned by tile_tokens)")
    flat = x_tiles.reshape(B, T * n, C)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return flat[:, inv.to(flat.device)]


def _untile_view(y: torch.Tensor, H: int, W: int, t: int) -> torch.Tensor:
    """View-only inverse of the tiling in :func:`tile_tokens` (``y [B, T, n, C]`` -> ``[B, N, C]``)."""
    B, _, _, C = y.shape
    th, tw = H // t, W // t
    return y.reshape(B, t, t, th, tw, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H * W, C)


# --------------------------------------------------------------------------------- selection, merge
def facility_location_select(x: torch.Tensor, k: int, *, backend: str | None = None) -> torch.Tensor:
    """Greedy facility-location destinations of each tile: ``x [G, n, C]`` -> int64 ``[G, k]``.

    See :func:`icml25.kernels.token_merge.facility_location_greedy` (cosine similarity, ``1 − 1/e`` optimal).
    """
    return _tm.facility_location_greedy(x, k, backend=backend)


def toma_merge_matrices(
    x: torch.Tensor, dst_idx: torch.Tensor, scale: float = 1000.0, *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """ToMA's merge and unmerge matrices of each tile: ``M [G, d, n]`` (rows sum to 1), ``U = Aᵀ [G, n, d]``
    (rows sum to 1), float32, from ``x [G, n, C]`` and ``dst_idx [G, d]``; ``scale`` is τ > 0."""
    return _tm.soft_merge_matrices(x, dst_idx, scale=scale, backend=backend)


@dataclass
class ToMAPlan:
    """One merge pattern: tiles of an ``H × W`` grid, the destinations of each tile and the soft assignment.

    Attributes:
        hw: ``(H, W)``; t: tiles per side; batch: B.
        dst_idx: int64 [B·T, d] destinations per tile (tile-local indices).
        A: float32 [B·T, d, n] soft assignment (columns sum to 1).
    """

    hw: tuple[int, int]
    t: int
    batch: int
    dst_idx: torch.Tensor
    A: torch.Tensor

    @property
    def n_tokens(self) -> int:
        """N = H · W (tokens before merging)."""
        return self.hw[0] * self.hw[1]

    @property
    def n_merged(self) -> int:
        """D = T · d (tokens after merging)."""
        return self.t * self.t * self.A.shape[1]

    def _check(self, x: object, n_tok: int, name: str) -> torch.Tensor:
        x = _batch_tokens(x, name)
        if x.shape[0] != self.batch or x.shape[1] != n_tok:
            raise ValueError(
                f"{name} must have shape [B, {n_tok}, C] with B = {self.batch} (the plan's), got {tuple(x.shape)}"
            )
        return x

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, N, Cv]`` -> ``[B, D, Cv]``: every destination the weighted mean of its soft members."""
        x = self._check(x, self.n_tokens, "x")
        T = self.t * self.t
        tiles = _tile_view(x, *self.hw, self.t).reshape(self.batch * T, -1, x.shape[-1])
        M = self.A / self.A.sum(dim=2, keepdim=True)
        out = (M.to(x.device) @ tiles.float()).to(x.dtype)
        return out.reshape(self.batch, -1, x.shape[-1])

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        """``y [B, D, Cv]`` -> ``[B, N, Cv]`` with ``U = Aᵀ`` per tile (rows of U sum to 1)."""
        y = self._check(y, self.n_merged, "y")
        T, d = self.t * self.t, self.A.shape[1]
        full = _tm.soft_unmerge(y.reshape(self.batch * T, d, y.shape[-1]), self.A.to(y.device))
        return _untile_view(full.reshape(self.batch, T, -1, y.shape[-1]), *self.hw, self.t)

    def log_sizes(self) -> torch.Tensor:
        """``log(rowsum A)`` ``[B, D]``: the soft size of each merged token (the proportional-attention bias)."""
        return self.A.sum(dim=2).clamp_min(1e-6).log().reshape(self.batch, -1)


def _tile_view(x: torch.Tensor, H: int, W: int, t: int) -> torch.Tensor:
    B, _, C = x.shape
    th, tw = H // t, W // t
    return x.reshape(B, t, th, t, tw, C).permute(0, 1, 3, 2, 4, 5).reshape(B, t * t, th * tw, C)


def toma_fns(
    x: torch.Tensor,
    hw: tuple[int, int] | None = None,
    *,
    ratio: float = 0.5,
    num_tiles: int = 16,
    scale: float = 1000.0,
    selection: Selection = "facility_location",
    seed: int = 0,
    backend: str | None = None,
) -> ToMAPlan:
    """Build ToMA's merge pattern from the (normed) hidden states ``x [B, N, C]``.

    Args:
        x: [B, N, C] image tokens of an ``H × W`` row-major grid (text tokens are never merged: pass only
            the image tokens).
        hw: ``(H, W)``; None: a square grid.
        ratio: fraction of tokens removed, in [0, 1); each tile keeps ``d = ⌊n (1 − ratio)⌋ >= 1``
            destinations (the official rounding, so ``D`` can fall slightly below ``N (1 − ratio)``).
        num_tiles: ``t²`` square tiles, ``t`` dividing H and W (official default 256).
        scale: softmax temperature τ > 0 (official ``attention_scale`` 1000).
        selection: ``"facility_location"`` (ToMA) or ``"random"`` (uniform random destinations per tile:
            the ablation of the selection step).
        seed: the random destinations' seed (``selection="random"`` only).
        backend: kernel backend (see :func:`icml25.kernels.select_backend`).

    Returns:
        :class:`ToMAPlan` with ``merge``, ``unmerge`` and ``log_sizes``.
    """
    x = _batch_tokens(x)
    B, N, C = x.shape
    H, W = _resolve_hw(hw, N)
    r = _ratio(ratio)
    tau = check_float(scale, "scale", low=0.0, low_open=True)
    t = _tiles_per_side(num_tiles, H, W)
    if selection not in ("facility_location", "random"):
        raise ValueError(f"selection must be 'facility_location' or 'random', got {selection!r}")
    n = (H // t) * (W // t)
    d = math.floor(n * (1.0 - r) + 1e-9)
    if d < 1:
        raise ValueError(
            f"ratio = {r} leaves d = floor(n (1 - ratio)) = 0 destinations in tiles of n = {n} tokens; use "
            "fewer tiles (num_tiles) or a smaller ratio"
        )
    check_tensor(x, "x", dtype=None)  # NaN/inf: one aminmax pass
    tiles = _tile_view(x, H, W, t).reshape(B * t * t, n, C)
    if selection == "facility_location":
        dst = _tm.facility_location_greedy(tiles, d, check_finite=False, backend=backend)
    else:
        g = torch.Generator().manual_seed(check_int(seed, "seed", low=0))
        dst = torch.rand(B * t * t, n, generator=g).argsort(dim=1)[:, :d].to(x.device)
    _, A = _tm.tile_soft_merge(tiles, dst, tiles[..., :1], scale=tau, check_finite=False, backend=backend)
    return ToMAPlan((H, W), t, B, dst, A)


def tomesd_fns(
    x: torch.Tensor,
    hw: tuple[int, int] | None = None,
    *,
    ratio: float = 0.5,
    sx: int = 2,
    sy: int = 2,
    seed: int | None = 0,
) -> tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """The ToMeSD baseline (Bolya & Hoffman 2023, ``dbolya/tomesd``): one random destination per ``sy × sx``
    cell, ``r = ⌊ratio · N⌋`` sources merged into their most similar destination by mean, unmerge by copy.

    Args:
        x: [B, N, C] tokens (the similarity metric); hw: ``(H, W)`` or None (square).
        ratio: in [0, 1); capped by ToMeSD at the number of sources (``1 − 1/(sx·sy)`` of the tokens).
        sx, sy: destination cell; seed: the destination draw (None: the top-left token of every cell).

    Returns:
        ``(merge, unmerge)``: ``merge(v [B, N, c], mode="mean") -> [B, N − r, c]``; ``unmerge`` the inverse.
    """
    x = _batch_tokens(x)
    H, W = _resolve_hw(hw, x.shape[1])
    r = int(x.shape[1] * _ratio(ratio))
    check_tensor(x, "x", dtype=None)  # NaN/inf: one aminmax pass
    gen = (
        None if seed is None else torch.Generator(device=x.device).manual_seed(check_int(seed, "seed", low=0))
    )
    return _tm.bipartite_soft_matching_2d(
        x, H, W, r, sx=sx, sy=sy, no_rand=seed is None, generator=gen, check_finite=False
    )


# ------------------------------------------------------------------------------------------- reuse
class ToMAState:
    """Reuse of merge plans across denoising steps and blocks (the official ``flux_scheduler`` bookkeeping).

    A plan is (re)built at the first request of a step that is a multiple of ``recompute_every`` (and
    whenever no plan for the key exists); later blocks with the same key in the step, and later steps
    until the next scheduled one, reuse it. Keys group blocks that share a pattern (the patch uses the
    token count and batch size: the blocks of one resolution).

    Args:
        recompute_every: steps between recomputations (official ``merge_step_interval`` 3).
        merge_steps: steps at which merging is on (None: every step).

    Attributes:
        step: the current step (advanced by :meth:`advance`, by the diffusers patch at every model call).
        recomputes: list of ``(step, key)`` for every plan built.
    """

    def __init__(self, recompute_every: int = 3, merge_steps: Collection[int] | None = None) -> None:
        self.recompute_every = check_int(recompute_every, "recompute_every", low=1)
        if merge_steps is not None:
            if isinstance(merge_steps, (str, bytes)) or not isinstance(merge_steps, Collection):
                raise TypeError(f"merge_steps must be a collection of ints or None, got {merge_steps!r}")
            merge_steps = frozenset(check_int(s, "merge_steps[i]", low=0) for s in merge_steps)
        self.merge_steps = merge_steps
        self.step = 0
        self.plans: dict[Hashable, tuple[int, Any]] = {}
        self.recomputes: list[tuple[int, Hashable]] = []

    def merging(self) -> bool:
        """Whether merging is on at the current step."""
        return self.merge_steps is None or self.step in self.merge_steps

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The plan of ``key`` at the current step, built with ``build()`` when due."""
        cached = self.plans.get(key)
        due = cached is None or (self.step % self.recompute_every == 0 and cached[0] != self.step)
        if due:
            self.plans[key] = (self.step, build())
            self.recomputes.append((self.step, key))
        return self.plans[key][1]

    def advance(self) -> None:
        """Move to the next step."""
        self.step += 1

    def reset(self) -> None:
        """Forget every plan and restart at step 0 (a new generation)."""
        self.step = 0
        self.plans.clear()
        self.recomputes.clear()


# --------------------------------------------------------------------------- diffusers integration
def apply_toma(
    model_or_pipe: Any,
    ratio: float = 0.5,
    num_tiles: int = 16,
    attention_scale: float = 1000.0,
    recompute_every: int = 3,
    *,
    merge_steps: Collection[int] | None = None,
    min_tokens: int = 0,
    proportional_attention: bool = False,
    backend: str | None = None,
) -> ToMAState:
    """Patch the self-attention (``attn1``) of every diffusers ``BasicTransformerBlock`` of a model or pipeline.

    Each patched attention merges its input tokens with ToMA, runs the original attention processor on the
    ``D`` merged tokens and unmerges the output; the block's residual add stays at full length. Cross-
    attention (text tokens) is untouched. Plans are shared per token count and reused across steps
    (:class:`ToMAState`; one model call = one step). The grid of every block comes from the model input's
    spatial size (ToMeSD's rule, ``downsample = ceil(sqrt(N0 / N))``); a block whose grid ``num_tiles`` does
    not divide uses the largest square tiling ``t' <= t`` that does. Applying again replaces the settings
    (idempotent); :func:`remove_toma` restores the original processors (bit-identical outputs).

    Args:
        model_or_pipe: a diffusers model (``UNet2DConditionModel``, ``Transformer2DModel``, ...) or a pipeline
            with ``.unet`` / ``.transformer``.
        ratio: fraction of tokens removed, in [0, 1); 0 disables merging (outputs exactly unpatched).
        num_tiles: tiles per grid, a perfect square (official default 256 for 64×64 latent grids).
        attention_scale: τ > 0 of the soft assignment.
        recompute_every: steps between plan recomputations.
        merge_steps: steps with merging on (None: all).
        min_tokens: blocks with fewer tokens are not merged (small grids cost more than they save).
        proportional_attention: add ``log(size)`` of each merged token to its attention logits (not in the
            official code).
        backend: kernel backend.

    Returns:
        The :class:`ToMAState` (``model._toma_state``).

    Raises:
        TypeError: the model has no supported block. ValueError: bad settings.
    """
    _ratio(ratio)
    check_int(num_tiles, "num_tiles", low=1)
    if math.isqrt(num_tiles) ** 2 != num_tiles:
        raise ValueError(f"num_tiles must be a perfect square (t × t tiles), got {num_tiles}")
    check_float(attention_scale, "attention_scale", low=0.0, low_open=True)
    check_int(min_tokens, "min_tokens", low=0)
    if not isinstance(proportional_attention, bool):
        raise TypeError(f"proportional_attention must be a bool, got {proportional_attention!r}")
    state = ToMAState(recompute_every, merge_steps)
    from icml25.generative_models.toma import diffusers_patch

    config = {
        "ratio": float(ratio),
        "num_tiles": int(num_tiles),
        "scale": float(attention_scale),
        "min_tokens": int(min_tokens),
        "proportional_attention": proportional_attention,
        "backend": backend,
    }
    return diffusers_patch.apply(model_or_pipe, state, config)


def remove_toma(model_or_pipe: Any) -> Any:
    """Undo :func:`apply_toma`: the original attention processors and no hook (bit-identical outputs).

    A model that was never patched is returned unchanged.
    """
    from icml25.generative_models.toma import diffusers_patch

    return diffusers_patch.remove(model_or_pipe)
