"""Playmate: Flexible Control of Portrait Animation via 3D-Implicit Space Guided Diffusion — ICML 2025, P41: audio-to-motion flow-matching DiT in an implicit-keypoint space.

Ma et al., ICML 2025 (arXiv 2502.07203; the official repository ``Playmate111/Playmate`` holds only a README,
no code or weights). Playmate generates *motion*, not pixels: per frame, the LivePortrait-style implicit 3D
keypoints ``x_d = s · (x_c R(yaw, pitch, roll) + δ_exp) + t`` of a face-reenactment model. This module holds
the motion-space core:

* :func:`compose_keypoints`: the keypoint formula above (LivePortrait layout: ``K × 3`` canonical
  keypoints, expression deformation ``δ_exp`` ``K × 3``, rotation (yaw, pitch, roll) in degrees,
  translation, scale);
* :func:`pack_motion` / :func:`unpack_motion`: the per-frame motion code ``[δ_exp (3K), rot (3), trans (3),
  scale (1)]``;
* :class:`MotionNormalizer`: the motion-decoupling step, a separate mean–std per attribute (expression,
  rotation, translation, scale; ``mode="attribute"``) so that the small expression offsets and the large
  pose angles reach the diffusion model at comparable scales (``mode="global"``: one joint scale, the
  un-normalised ablation);
* :class:`AudioToMotionDiT`: stage 1, a flow-matching diffusion transformer (adaLN-zero blocks) over the
  ``T`` frames of a clip, conditioned on windowed audio features, the reference identity and an optional
  previous clip; audio is dropped during training for classifier-free guidance;
* :class:`EmotionControlBranch`: stage 2, a ControlNet-like trainable copy of the first DiT blocks that
  takes an emotion label and adds zero-initialised residuals to the frozen stage-1 stream;
* :func:`guided_velocity` / :func:`sample_motion`: CFG over audio and emotion, Euler sampling, and pose
  replaced by a driving sequence (inpainted along the flow path);
* the training stages, :func:`~icml25.generative_models.playmate_training.train_stage1` /
  :func:`~icml25.generative_models.playmate_training.train_stage2` (in
  :mod:`icml25.generative_models.playmate_training`), and
  :class:`~icml25.generative_models.playmate_toy.SyntheticTalkingFaces`, a parametric talking-face generator
  for CPU-scale checks (in :mod:`icml25.generative_models.playmate_toy`; no pixels: the renderer that turns
  keypoints into frames is not included). Both are re-exported here.

Details the paper does not pin down (normalisation statistics, control-branch design, CFG scales) are our
choices and stay configurable.
"""

from __future__ import annotations

import copy
import importlib
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from icml25.generative_models.playmate_toy import SyntheticTalkingFaces as SyntheticTalkingFaces
from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

if TYPE_CHECKING:
    from icml25.generative_models.playmate_training import train_stage1 as train_stage1
    from icml25.generative_models.playmate_training import train_stage2 as train_stage2

__all__ = [
    "AudioToMotionDiT",
    "EmotionControlBranch",
    "MotionNormalizer",
    "compose_keypoints",
    "guided_velocity",
    "mouth_opening",
    "pack_motion",
    "sample_motion",
    "unpack_motion",
]

ATTRIBUTES = ("exp", "rot", "trans", "scale")
_MAX_ABS = 1e6


def motion_dim(n_keypoints: int) -> int:
    """Width ``D = 3K + 7`` of the packed per-frame motion code."""
    return 3 * n_keypoints + 7


def _slices(n_keypoints: int) -> dict[str, slice]:
    k3 = 3 * n_keypoints
    return {
        "exp": slice(0, k3),
        "rot": slice(k3, k3 + 3),
        "trans": slice(k3 + 3, k3 + 6),
        "scale": slice(k3 + 6, k3 + 7),
    }


# ------------------------------------------------------------------------------------------ keypoints
def _rotation_matrix(rot: Tensor) -> Tensor:
    """``[..., 3]`` (yaw, pitch, roll) in degrees -> ``[..., 3, 3]`` matrix ``R`` applied as ``x @ R``.

    LivePortrait's convention: ``R = (R_z(roll) R_y(yaw) R_x(pitch))ᵀ``.
    """
    yaw, pitch, roll = (torch.deg2rad(rot[..., i]) for i in range(3))
    one, zero = torch.ones_like(yaw), torch.zeros_like(yaw)
    cx, sx, cy, sy, cz, sz = pitch.cos(), pitch.sin(), yaw.cos(), yaw.sin(), roll.cos(), roll.sin()
    rx = torch.stack([one, zero, zero, zero, cx, -sx, zero, sx, cx], -1).unflatten(-1, (3, 3))
    ry = torch.stack([cy, zero, sy, zero, one, zero, -sy, zero, cy], -1).unflatten(-1, (3, 3))
    rz = torch.stack([cz, -sz, zero, sz, cz, zero, zero, zero, one], -1).unflatten(-1, (3, 3))
    return (rz @ ry @ rx).transpose(-1, -2)


def compose_keypoints(canonical: Tensor, exp: Tensor, rot: Tensor, trans: Tensor, scale: Tensor) -> Tensor:
    """Driving keypoints ``x_d = s · (x_c R(yaw, pitch, roll) + δ_exp) + t`` (LivePortrait's transform).

    Args:
        canonical: ``[..., K, 3]`` identity-specific canonical keypoints ``x_c`` (broadcast over frames).
        exp: ``[..., K, 3]`` expression deformation ``δ_exp``.
        rot: ``[..., 3]`` head rotation (yaw, pitch, roll) in degrees.
        trans: ``[..., 3]`` translation ``t`` (LivePortrait applies only ``t_x, t_y``: pass ``t_z = 0``).
        scale: ``[..., 1]`` scale ``s`` (same number of dimensions as ``rot``).

    Returns:
        ``[..., K, 3]`` keypoints (leading dimensions broadcast).
    """
    canonical = check_tensor(canonical, "canonical", non_empty=True, max_abs=_MAX_ABS)
    exp = check_tensor(exp, "exp", non_empty=True, max_abs=_MAX_ABS)
    rot = check_tensor(rot, "rot", non_empty=True, max_abs=1e4)
    trans = check_tensor(trans, "trans", non_empty=True, max_abs=_MAX_ABS)
    scale = check_tensor(scale, "scale", non_empty=True, max_abs=_MAX_ABS)
    for name, x in (("canonical", canonical), ("exp", exp)):
        if x.ndim < 2 or x.shape[-1] != 3:
            raise ValueError(f"{name} must have shape [..., K, 3], got {tuple(x.shape)}")
    if canonical.shape[-2] != exp.shape[-2]:
        raise ValueError(
            f"exp must have as many keypoints as canonical ({canonical.shape[-2]}), got {exp.shape[-2]}"
        )
    for name, x in (("rot", rot), ("trans", trans)):
        if x.ndim < 1 or x.shape[-1] != 3:
            raise ValueError(f"{name} must have shape [..., 3], got {tuple(x.shape)}")
    if scale.ndim != rot.ndim or scale.shape[-1] != 1:
        raise ValueError(
            f"scale must have shape [..., 1] with as many dimensions as rot ({rot.ndim}), got {tuple(scale.shape)}"
        )
    scale = scale[..., 0]
    lead = exp.shape[:-2]
    for name, x in (("rot", rot.shape[:-1]), ("trans", trans.shape[:-1]), ("scale", scale.shape)):
        try:
            torch.broadcast_shapes(x, lead)
        except RuntimeError as exc:
            raise ValueError(
                f"{name} must broadcast to exp's leading shape {tuple(lead)}, got {tuple(x)}"
            ) from exc
    try:
        torch.broadcast_shapes(canonical.shape, exp.shape)
    except RuntimeError as exc:
        raise ValueError(
            f"canonical must broadcast against exp {tuple(exp.shape)}, got {tuple(canonical.shape)}"
        ) from exc
    r = _rotation_matrix(rot)
    return scale[..., None, None] * (canonical @ r + exp) + trans[..., None, :]


def pack_motion(motion: Mapping[str, Tensor]) -> Tensor:
    """Pack ``{"exp": [..., T, K, 3], "rot": [..., T, 3], "trans": [..., T, 3], "scale": [..., T, 1]}``
    into the motion code ``[..., T, 3K + 7]`` (order: expression, rotation, translation, scale)."""
    if not isinstance(motion, Mapping):
        raise TypeError(f"motion must be a mapping with keys {ATTRIBUTES}, got {type(motion).__name__}")
    missing = [k for k in ATTRIBUTES if k not in motion]
    if missing:
        raise ValueError(f"motion must have keys {ATTRIBUTES}, missing {missing}")
    exp = check_tensor(motion["exp"], "exp", non_empty=True, max_abs=_MAX_ABS)
    if exp.ndim < 3 or exp.shape[-1] != 3:
        raise ValueError(f"exp must have shape [..., T, K, 3], got {tuple(exp.shape)}")
    lead = exp.shape[:-2]
    parts = [exp.flatten(-2)]
    for name, width in (("rot", 3), ("trans", 3), ("scale", 1)):
        x = check_tensor(motion[name], name, non_empty=True, max_abs=1e4 if name == "rot" else _MAX_ABS)
        if tuple(x.shape) != (*lead, width):
            raise ValueError(f"{name} must have shape {(*lead, width)}, got {tuple(x.shape)}")
        parts.append(x.to(exp.dtype))
    return torch.cat(parts, -1)


def unpack_motion(codes: Tensor, n_keypoints: int) -> dict[str, Tensor]:
    """Inverse of :func:`pack_motion`: ``[..., T, 3K + 7]`` -> the attribute dictionary."""
    k = check_int(n_keypoints, "n_keypoints", low=1)
    codes = check_tensor(codes, "codes", non_empty=True, max_abs=_MAX_ABS)
    if codes.ndim < 2 or codes.shape[-1] != motion_dim(k):
        raise ValueError(
            f"codes must have shape [..., T, {motion_dim(k)}] for {k} keypoints, got {tuple(codes.shape)}"
        )
    s = _slices(k)
    return {
        "exp": codes[..., s["exp"]].unflatten(-1, (k, 3)),
        "rot": codes[..., s["rot"]],
        "trans": codes[..., s["trans"]],
        "scale": codes[..., s["scale"]],
    }


def mouth_opening(exp: Tensor, upper: int, lower: int) -> Tensor:
    """Mouth opening ``δ_exp[upper, y] − δ_exp[lower, y]`` from ``exp`` ``[..., K, 3]`` -> ``[...]``."""
    exp = check_tensor(exp, "exp", non_empty=True, max_abs=_MAX_ABS)
    if exp.ndim < 2 or exp.shape[-1] != 3:
        raise ValueError(f"exp must have shape [..., K, 3], got {tuple(exp.shape)}")
    k = exp.shape[-2]
    for name, i in (("upper", upper), ("lower", lower)):
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= int(i) < k:
            raise ValueError(f"{name} must be a keypoint index in [0, {k}), got {i!r}")
    return exp[..., upper, 1] - exp[..., lower, 1]


# ------------------------------------------------------------------------------------------ normaliser
class MotionNormalizer:
    """Per-attribute mean–std normalisation of packed motion codes (Playmate's motion decoupling).

    ``mode="attribute"``: a mean per dimension and **one std per attribute** (expression, rotation,
    translation, scale), pooled over that attribute's dimensions, so every attribute reaches the model with
    unit scale while the relative geometry inside an attribute is kept. ``mode="global"``: one mean and one
    std shared by all dimensions (jointly scaled codes; the ablation). Attributes with zero spread are
    rejected.

    Fitted attributes: ``mean_`` ``[D]``, ``std_`` ``[D]``.
    """

    def __init__(self, n_keypoints: int, mode: str = "attribute") -> None:
        self.n_keypoints = check_int(n_keypoints, "n_keypoints", low=1)
        if mode not in ("attribute", "global"):
            raise ValueError(f"mode must be 'attribute' or 'global', got {mode!r}")
        self.mode = mode

    @property
    def dim(self) -> int:
        return motion_dim(self.n_keypoints)

    def _check(self, name: str, x: Tensor) -> Tensor:
        x = check_tensor(x, name, non_empty=True, max_abs=_MAX_ABS)
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"{name} must have shape [..., T, {self.dim}], got {tuple(x.shape)}")
        return x

    def fit(self, codes: Tensor) -> MotionNormalizer:
        """Fit the statistics on ``codes`` ``[N, T, D]`` (or any ``[..., D]``)."""
        codes = self._check("codes", codes)
        flat = codes.reshape(-1, self.dim).double()
        if flat.shape[0] < 2:
            raise ValueError(f"codes must hold at least 2 frames, got {flat.shape[0]}")
        mean = flat.mean(0)
        centred = flat - mean
        std = torch.empty(self.dim, dtype=torch.float64)
        groups = (
            _slices(self.n_keypoints).items() if self.mode == "attribute" else [("codes", slice(0, self.dim))]
        )
        for name, sl in groups:
            s = float(centred[:, sl].pow(2).mean().sqrt())
            if not s > 0:
                raise ValueError(f"codes must vary within attribute {name!r} to be normalised; got std={s}")
            std[sl] = s
        if self.mode == "global":
            mean = torch.full_like(mean, float(flat.mean()))
            std[:] = float((flat - flat.mean()).pow(2).mean().sqrt())
        self.mean_ = mean.to(codes.dtype)
        self.std_ = std.to(codes.dtype)
        return self

    def _fitted(self) -> None:
        if not hasattr(self, "mean_"):
            raise ValueError("MotionNormalizer is not fitted: call fit(...) first")

    def transform(self, codes: Tensor) -> Tensor:
        """``(codes − mean) / std``, same shape."""
        self._fitted()
        codes = self._check("codes", codes)
        return (codes - self.mean_.to(codes)) / self.std_.to(codes)

    def inverse_transform(self, z: Tensor) -> Tensor:
        """``z · std + mean``, same shape."""
        self._fitted()
        z = self._check("z", z)
        return z * self.std_.to(z) + self.mean_.to(z)


# ------------------------------------------------------------------------------------------ networks
def _timestep_embedding(t: Tensor, width: int) -> Tensor:
    half = width // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=t.dtype, device=t.device) / half)
    args = 1000.0 * t[:, None] * freqs[None]
    return torch.cat([args.cos(), args.sin()], -1)


class _DiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-zero modulation by the conditioning vector ``c``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.ada = nn.Linear(width, 6 * width)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, h: Tensor, c: Tensor) -> Tensor:
        s1, b1, g1, s2, b2, g2 = self.ada(nn.functional.silu(c))[:, None].chunk(6, -1)
        y = self.norm1(h) * (1 + s1) + b1
        h = h + g1 * self.attn(y, y, y, need_weights=False)[0]
        y = self.norm2(h) * (1 + s2) + b2
        return h + g2 * self.mlp(y)


class AudioToMotionDiT(nn.Module):
    """Stage 1: flow-matching velocity network over a clip of normalised motion codes.

    Tokens: one per frame, ``in_proj(x_t) + audio window(audio) + position``; an optional prefix of
    ``n_prev`` previous-clip frames (learned null tokens when absent or dropped). Conditioning vector
    ``c = MLP(time) + ref_proj(ref)`` modulates every block (adaLN-zero); the output head is zero-initialised.
    Audio features are windowed per frame by a 1-D convolution of ``2·audio_window + 1`` frames.

    Args:
        motion_dim: ``D`` of the motion code (``3K + 7``).
        audio_dim: ``A`` audio features per frame (e.g. a wav2vec2 hidden size).
        ref_dim: ``R`` of the reference/identity vector (e.g. ``3K`` flattened canonical keypoints).
        n_frames: ``T`` frames per clip (max length of the position table).
        width, depth, heads: transformer size.
        n_prev: previous-clip frames used for continuity (0: none).
        audio_window: half-width of the audio window in frames.
        seed: initialisation seed (isolated from the global generator).
    """

    def __init__(self, motion_dim: int, audio_dim: int, ref_dim: int, n_frames: int, *, width: int = 96,
                 depth: int = 4, heads: int = 4, n_prev: int = 0, audio_window: int = 2, seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.motion_dim = check_int(motion_dim, "motion_dim", low=1)
        self.audio_dim = check_int(audio_dim, "audio_dim", low=1)
        self.ref_dim = check_int(ref_dim, "ref_dim", low=1)
        self.n_frames = check_int(n_frames, "n_frames", low=1)
        self.width = check_int(width, "width", low=2)
        self.depth = check_int(depth, "depth", low=1)
        heads = check_int(heads, "heads", low=1)
        if self.width % heads or self.width % 2:
            raise ValueError(f"width must be even and divisible by heads ({heads}), got {self.width}")
        self.n_prev = check_int(n_prev, "n_prev", low=0)
        self.audio_window = check_int(audio_window, "audio_window", low=0)
        with isolated_rng(seed):
            w = self.width
            self.in_proj = nn.Linear(self.motion_dim, w)
            self.audio_proj = nn.Conv1d(
                self.audio_dim, w, 2 * self.audio_window + 1, padding=self.audio_window
            )
            self.null_audio = nn.Parameter(torch.randn(w) * 0.02)
            self.ref_proj = nn.Linear(self.ref_dim, w)
            self.pos = nn.Parameter(torch.randn(self.n_prev + self.n_frames, w) * 0.02)
            self.prev_type = nn.Parameter(torch.randn(w) * 0.02)
            self.null_prev = nn.Parameter(torch.randn(w) * 0.02)
            self.time_mlp = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w))
            self.blocks = nn.ModuleList(_DiTBlock(w, heads) for _ in range(self.depth))
            self.norm_out = nn.LayerNorm(w, elementwise_affine=False)
            self.ada_out = nn.Linear(w, 2 * w)
            self.out = nn.Linear(w, self.motion_dim)
            for lin in (self.ada_out, self.out):
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)

    def check_inputs(
        self, x: Tensor, t: Tensor | float, audio: Tensor, ref: Tensor, prev: Tensor | None
    ) -> tuple:
        """Validate one call's inputs; returns ``(x, t [B], audio, ref, prev)``."""
        x = check_tensor(x, "x", ndim=3, non_empty=True, max_abs=_MAX_ABS)
        b, n_t, d = x.shape
        if d != self.motion_dim:
            raise ValueError(f"x must have {self.motion_dim} motion channels, got shape {tuple(x.shape)}")
        if n_t > self.n_frames:
            raise ValueError(f"x must have at most n_frames={self.n_frames} frames, got {n_t}")
        audio = check_tensor(audio, "audio", ndim=3, non_empty=True, max_abs=_MAX_ABS)
        if audio.shape[0] != b or audio.shape[2] != self.audio_dim:
            raise ValueError(f"audio must have shape [{b}, T, {self.audio_dim}], got {tuple(audio.shape)}")
        if audio.shape[1] != n_t:
            raise ValueError(
                f"audio must have one feature frame per motion frame: audio has {audio.shape[1]} frames, "
                f"the motion clip has {n_t}"
            )
        ref = check_tensor(ref, "ref", ndim=2, non_empty=True, max_abs=_MAX_ABS)
        if tuple(ref.shape) != (b, self.ref_dim):
            raise ValueError(f"ref must have shape [{b}, {self.ref_dim}], got {tuple(ref.shape)}")
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            t = torch.full((b,), float(t), dtype=x.dtype)
        t = check_tensor(t, "t", ndim=1, non_empty=True, max_abs=_MAX_ABS)
        if t.shape[0] != b or bool((t < 0).any() | (t > 1).any()):
            raise ValueError(f"t must be a [{b}] tensor of times in [0, 1], got shape {tuple(t.shape)}")
        if prev is not None:
            prev = check_tensor(prev, "prev", ndim=3, non_empty=True, max_abs=_MAX_ABS)
            if tuple(prev.shape) != (b, self.n_prev, self.motion_dim) or self.n_prev == 0:
                raise ValueError(
                    f"prev must have shape [{b}, n_prev={self.n_prev}, {self.motion_dim}] (n_prev > 0), "
                    f"got {tuple(prev.shape)}"
                )
        return x, t, audio, ref, prev

    def embed(self, x: Tensor, t: Tensor, audio: Tensor, ref: Tensor, prev: Tensor | None = None,
              audio_mask: Tensor | None = None, prev_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
        """Tokens ``h0`` ``[B, n_prev + T, W]`` and conditioning ``c`` ``[B, W]`` (inputs already validated).

        ``audio_mask`` / ``prev_mask`` ``[B]`` bool: False replaces that sample's audio / previous clip by
        the learned null embedding (classifier-free dropout).
        """
        b, n_t, _ = x.shape
        h = self.in_proj(x)
        a = self.audio_proj(audio.transpose(1, 2)).transpose(1, 2)
        if audio_mask is not None:
            a = torch.where(audio_mask[:, None, None], a, self.null_audio.to(a))
        h = h + a
        if self.n_prev:
            if prev is None:
                p = self.null_prev.expand(b, self.n_prev, -1)
            else:
                p = self.in_proj(prev)
                if prev_mask is not None:
                    p = torch.where(prev_mask[:, None, None], p, self.null_prev.to(p))
            h = torch.cat([p + self.prev_type, h], 1)
        h = h + self.pos[: self.n_prev + n_t]
        c = self.time_mlp(_timestep_embedding(t, self.width)) + self.ref_proj(ref)
        return h, c

    def head(self, h: Tensor, c: Tensor) -> Tensor:
        """Velocity ``[B, T, D]`` from the final tokens (previous-clip prefix dropped)."""
        shift, sc = self.ada_out(nn.functional.silu(c))[:, None].chunk(2, -1)
        return self.out(self.norm_out(h[:, self.n_prev :]) * (1 + sc) + shift)

    def forward(self, x: Tensor, t: Tensor | float, audio: Tensor, ref: Tensor, prev: Tensor | None = None,
                audio_mask: Tensor | None = None, residuals: list[Tensor] | None = None) -> Tensor:  # fmt: skip
        """Velocity ``v(x_t, t | audio, ref, prev)`` ``[B, T, D]``.

        Args:
            x: ``[B, T, D]`` normalised motion at flow time ``t`` (0 = noise, 1 = data).
            t: ``[B]`` times in ``[0, 1]`` or a float.
            audio: ``[B, T, A]`` audio features, one frame per motion frame.
            ref: ``[B, R]`` reference identity vector.
            prev: ``[B, n_prev, D]`` normalised previous-clip motion, or None.
            audio_mask: ``[B]`` bool, False drops that sample's audio (the CFG unconditional branch).
            residuals: per-block additive residuals ``[B, n_prev + T, W]`` from a control branch.
        """
        x, t, audio, ref, prev = self.check_inputs(x, t, audio, ref, prev)
        h, c = self.embed(x, t, audio, ref, prev, audio_mask)
        return self.run_blocks(h, c, residuals)

    def run_blocks(self, h: Tensor, c: Tensor, residuals: list[Tensor] | None = None) -> Tensor:
        """Blocks and head on embedded tokens; ``residuals[i]`` is added after block ``i``."""
        for i, blk in enumerate(self.blocks):
            h = blk(h, c)
            if residuals is not None and i < len(residuals):
                h = h + residuals[i]
        return self.head(h, c)


class EmotionControlBranch(nn.Module):
    """Stage 2: a ControlNet-like emotion branch on a frozen :class:`AudioToMotionDiT`.

    A trainable copy of the DiT's first ``n_blocks`` blocks (initialised from the stage-1 weights) reads the
    stage-1 tokens plus a zero-initialised projection of the emotion embedding; each copied block's output
    passes through a zero-initialised linear layer and is added as a residual after the matching stage-1
    block. Before training, every residual is exactly zero, so the combined model equals stage 1. The label
    ``n_emotions`` is the null emotion (classifier-free dropout and guidance).

    Args:
        dit: the stage-1 model (its weights are copied, not shared; freeze it with ``requires_grad_(False)``).
        n_emotions: number of emotion classes (MEAD: 8).
        n_blocks: how many leading blocks the branch copies (default all).
        seed: initialisation seed of the new layers.
    """

    def __init__(
        self, dit: AudioToMotionDiT, n_emotions: int, n_blocks: int | None = None, *, seed: int = 0
    ) -> None:
        super().__init__()
        if not isinstance(dit, AudioToMotionDiT):
            raise TypeError(f"dit must be an AudioToMotionDiT, got {type(dit).__name__}")
        self.n_emotions = check_int(n_emotions, "n_emotions", low=1)
        n_blocks = dit.depth if n_blocks is None else check_int(n_blocks, "n_blocks", low=1)
        if n_blocks > dit.depth:
            raise ValueError(f"n_blocks must be <= the DiT's depth {dit.depth}, got {n_blocks}")
        w = dit.width
        with isolated_rng(seed):
            self.blocks = nn.ModuleList(copy.deepcopy(dit.blocks[i]) for i in range(n_blocks))
            self.blocks.requires_grad_(True)
            self.embedding = nn.Embedding(self.n_emotions + 1, w)
            self.zero_in = nn.Linear(w, w)
            self.zero_out = nn.ModuleList(nn.Linear(w, w) for _ in range(n_blocks))
            for lin in (self.zero_in, *self.zero_out):
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)

    def check_emotion(self, emotion: Tensor | int, batch: int) -> Tensor:
        """``emotion`` as a ``[batch]`` long tensor of ids in ``[0, n_emotions]`` (``n_emotions`` = null)."""
        if isinstance(emotion, (int, np.integer)) and not isinstance(emotion, bool):
            emotion = torch.full((batch,), int(emotion), dtype=torch.long)
        if not isinstance(emotion, Tensor):
            raise TypeError(f"emotion must be an int or a tensor of ints, got {type(emotion).__name__}")
        if emotion.is_floating_point() or emotion.dtype == torch.bool:
            raise TypeError(f"emotion must hold integer ids, got dtype {emotion.dtype}")
        if emotion.ndim != 1 or emotion.shape[0] != batch:
            raise ValueError(f"emotion must have shape [{batch}], got {tuple(emotion.shape)}")
        bad = (emotion < 0) | (emotion > self.n_emotions)
        if bool(bad.any()):
            raise ValueError(
                f"emotion must be an id in [0, {self.n_emotions - 1}] (or {self.n_emotions} for none); got unknown "
                f"id {int(emotion[bad][0])}"
            )
        return emotion.long()

    def forward(self, h0: Tensor, c: Tensor, emotion: Tensor) -> list[Tensor]:
        """Residuals ``[B, L, W]`` per copied block from stage-1 tokens ``h0`` ``[B, L, W]``, ``c`` ``[B, W]``
        and ``emotion`` ``[B]`` ids."""
        e = self.embedding(emotion)
        h = h0 + self.zero_in(e)[:, None]
        ce = c + e
        out = []
        for blk, proj in zip(self.blocks, self.zero_out):
            h = blk(h, ce)
            out.append(proj(h))
        return out


# ------------------------------------------------------------------------------------------ guidance, sampling
def _velocity(dit, branch, x, t, audio, ref, prev, audio_mask, emotion) -> Tensor:
    h, c = dit.embed(x, t, audio, ref, prev, audio_mask)
    residuals = branch(h, c, emotion) if branch is not None else None
    return dit.run_blocks(h, c, residuals)


def guided_velocity(dit: AudioToMotionDiT, x: Tensor, t: Tensor | float, audio: Tensor, ref: Tensor, *,
                    prev: Tensor | None = None, branch: EmotionControlBranch | None = None,
                    emotion: Tensor | int | None = None, cfg_audio: float = 2.0, cfg_emotion: float = 2.0) -> Tensor:  # fmt: skip
    """Classifier-free guided velocity ``[B, T, D]``.

    Without emotion: ``v = v(∅) + s_a (v(a) − v(∅))``. With an emotion ``e`` (needs ``branch``):
    ``v = v(∅, ∅) + s_a (v(a, ∅) − v(∅, ∅)) + s_e (v(a, e) − v(a, ∅))``. A scale of 1 returns the fully
    conditional prediction (the unconditional passes are skipped).
    """
    if not isinstance(dit, AudioToMotionDiT):
        raise TypeError(f"dit must be an AudioToMotionDiT, got {type(dit).__name__}")
    if branch is not None and not isinstance(branch, EmotionControlBranch):
        raise TypeError(f"branch must be an EmotionControlBranch or None, got {type(branch).__name__}")
    s_a = check_float(cfg_audio, "cfg_audio", low=0.0, high=100.0)
    s_e = check_float(cfg_emotion, "cfg_emotion", low=0.0, high=100.0)
    x, t, audio, ref, prev = dit.check_inputs(x, t, audio, ref, prev)
    b = x.shape[0]
    if emotion is not None and branch is None:
        raise ValueError("emotion needs branch=EmotionControlBranch(...); got branch=None")
    if branch is not None:
        emo = branch.check_emotion(branch.n_emotions if emotion is None else emotion, b)
        null = torch.full_like(emo, branch.n_emotions)
    else:
        emo = null = None
    on, off = torch.ones(b, dtype=torch.bool), torch.zeros(b, dtype=torch.bool)
    use_e = emotion is not None and s_e != 1.0
    use_a = s_a != 1.0
    # batch the passes: (audio, emotion), then (audio, ∅) when needed, then (∅, ∅) when needed
    xs, masks, emos = [x], [on], [emo]
    if use_e:
        xs, masks, emos = [*xs, x], [*masks, on], [*emos, null]
    if use_a:
        xs, masks, emos = [*xs, x], [*masks, off], [*emos, null]
    k = len(xs)
    rep = (lambda z: None if z is None else torch.cat([z] * k)) if k > 1 else (lambda z: z)
    v = _velocity(dit, branch, torch.cat(xs), rep(t), rep(audio), rep(ref), rep(prev), torch.cat(masks),
                  None if emo is None else torch.cat(emos))  # fmt: skip
    vs = list(v.split(b))
    v_ae = vs[0]
    v_a = vs[1] if use_e else v_ae
    if not use_a:
        # v(a, ∅) + s_e (v(a, e) − v(a, ∅)) with s_a = 1
        return v_a + s_e * (v_ae - v_a) if use_e else v_ae
    v_u = vs[-1]
    out = v_u + s_a * (v_a - v_u)
    if use_e:
        out = out + s_e * (v_ae - v_a)
    return out


def sample_motion(dit: AudioToMotionDiT, audio: Tensor, ref: Tensor, *, normalizer: MotionNormalizer,
                  branch: EmotionControlBranch | None = None, emotion: Tensor | int | None = None,
                  pose: Mapping[str, Tensor] | None = None, prev: Tensor | None = None, cfg_audio: float = 2.0,
                  cfg_emotion: float = 2.0, steps: int = 20, seed: int | None = None,
                  generator: torch.Generator | None = None) -> dict[str, Tensor]:  # fmt: skip
    """Generate a clip of motion from audio with Euler steps of the guided flow (noise at t=0, data at t=1).

    Args:
        dit: stage-1 model; ``branch``/``emotion``: optional stage-2 emotion control.
        audio: ``[B, T, A]`` features, one frame per generated frame.
        ref: ``[B, R]`` reference identity.
        normalizer: the fitted :class:`MotionNormalizer` of the training codes.
        pose: optional driving pose ``{"rot": [B, T', 3], "trans": [B, T', 3], "scale": [B, T', 1]}`` with
            ``T' >= T`` (the first ``T`` frames are used): the pose dimensions follow the straight flow path
            to the driver during sampling (inpainting), so expression is generated given that pose, and the
            returned pose *is* the driver.
        prev: ``[B, n_prev, D]`` raw (un-normalised) previous-clip codes, or None.
        cfg_audio, cfg_emotion: guidance scales (1: none).
        steps: Euler steps.

    Returns:
        ``{"exp": [B, T, K, 3], "rot": [B, T, 3], "trans": [B, T, 3], "scale": [B, T, 1]}``.
    """
    if not isinstance(dit, AudioToMotionDiT):
        raise TypeError(f"dit must be an AudioToMotionDiT, got {type(dit).__name__}")
    if not isinstance(normalizer, MotionNormalizer):
        raise TypeError(f"normalizer must be a fitted MotionNormalizer, got {type(normalizer).__name__}")
    normalizer._fitted()
    if normalizer.dim != dit.motion_dim:
        raise ValueError(f"normalizer must describe {dit.motion_dim}-dim codes, got {normalizer.dim}")
    steps = check_int(steps, "steps", low=1)
    audio = check_tensor(audio, "audio", ndim=3, non_empty=True, max_abs=_MAX_ABS)
    b, n_t = audio.shape[:2]
    if n_t > dit.n_frames:
        raise ValueError(f"audio must have at most n_frames={dit.n_frames} frames, got {n_t}")
    g = make_generator(seed, generator)
    d, k = dit.motion_dim, normalizer.n_keypoints
    sl = _slices(k)
    pose_z = None
    if pose is not None:
        if not isinstance(pose, Mapping) or any(key not in pose for key in ("rot", "trans", "scale")):
            raise ValueError("pose must be a mapping with keys 'rot', 'trans' and 'scale'")
        raw = {}
        for key, width in (("rot", 3), ("trans", 3), ("scale", 1)):
            p = check_tensor(
                pose[key], f"pose[{key!r}]", ndim=3, non_empty=True, max_abs=1e4 if key == "rot" else _MAX_ABS
            )
            if p.shape[0] != b or p.shape[2] != width:
                raise ValueError(f"pose[{key!r}] must have shape [{b}, T, {width}], got {tuple(p.shape)}")
            if p.shape[1] < n_t:
                raise ValueError(
                    f"pose[{key!r}] must cover the clip: it has {p.shape[1]} frames, the clip has {n_t}"
                )
            raw[key] = p[:, :n_t].to(audio.dtype)
        full = torch.zeros(b, n_t, d, dtype=audio.dtype)
        full[..., sl["rot"]], full[..., sl["trans"]], full[..., sl["scale"]] = (
            raw["rot"],
            raw["trans"],
            raw["scale"],
        )
        pose_z = normalizer.transform(full)[..., k * 3 :]
    prev_z = None
    if prev is not None:
        prev_z = normalizer.transform(check_tensor(prev, "prev", ndim=3, non_empty=True, max_abs=_MAX_ABS))
    x0 = torch.randn(b, n_t, d, generator=g, dtype=audio.dtype)
    x = x0.clone()
    dt = 1.0 / steps
    with torch.no_grad():
        for i in range(steps):
            t = i * dt
            if pose_z is not None:
                x[..., k * 3 :] = (1 - t) * x0[..., k * 3 :] + t * pose_z
            v = guided_velocity(dit, x, t, audio, ref, prev=prev_z, branch=branch, emotion=emotion,
                                cfg_audio=cfg_audio, cfg_emotion=cfg_emotion)  # fmt: skip
            x = x + dt * v
    out = unpack_motion(normalizer.inverse_transform(x), k)
    if pose is not None:
        out.update(raw)
    return out


# The training stages import this module (their isinstance checks), so they are re-exported lazily (PEP 562).
_MOVED = {
    "train_stage1": "icml25.generative_models.playmate_training",
    "train_stage2": "icml25.generative_models.playmate_training",
}


def __getattr__(name: str) -> Any:
    """``train_stage1`` / ``train_stage2`` from :mod:`icml25.generative_models.playmate_training`, imported
    on first access."""
    if name in _MOVED:
        value = getattr(importlib.import_module(_MOVED[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
