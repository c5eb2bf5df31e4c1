"""Playmate: Flexible Control of Portrait Animation via 3D-Implicit Space Guided Diffusion — ICML 2025, P41: the two training stages.

:func:`train_stage1` trains the audio-to-motion DiT (:class:`icml25.generative_models.playmate.AudioToMotionDiT`)
with the rectified-flow objective on normalised motion codes; :func:`train_stage2` trains only the emotion
branch (:class:`icml25.generative_models.playmate.EmotionControlBranch`) on the frozen stage-1 model. The
method is :mod:`icml25.generative_models.playmate`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from icml25.generative_models.playmate import AudioToMotionDiT, EmotionControlBranch, MotionNormalizer
from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import make_generator

__all__ = ["train_stage1", "train_stage2"]

_MAX_ABS = 1e6  # the largest |value| of a raw motion, audio or reference input (as in the method's module)


# ------------------------------------------------------------------------------------------ training
def _check_training(dit, normalizer, codes, audio, ref, steps, batch_size, lr):
    if not isinstance(dit, AudioToMotionDiT):
        raise TypeError(f"dit must be an AudioToMotionDiT, got {type(dit).__name__}")
    if not isinstance(normalizer, MotionNormalizer):
        raise TypeError(f"normalizer must be a fitted MotionNormalizer, got {type(normalizer).__name__}")
    normalizer._fitted()
    codes = check_tensor(codes, "codes", ndim=3, non_empty=True, max_abs=_MAX_ABS)
    n, n_tot, d = codes.shape
    if d != dit.motion_dim or normalizer.dim != d:
        raise ValueError(f"codes must have {dit.motion_dim} channels (the DiT's and normaliser's), got {d}")
    if n_tot != dit.n_prev + dit.n_frames:
        raise ValueError(
            f"codes must hold n_prev + n_frames = {dit.n_prev + dit.n_frames} frames per sequence, got {n_tot}"
        )
    audio = check_tensor(audio, "audio", ndim=3, non_empty=True, max_abs=_MAX_ABS)
    if tuple(audio.shape) != (n, dit.n_frames, dit.audio_dim):
        raise ValueError(
            f"audio must have shape [{n}, n_frames={dit.n_frames}, {dit.audio_dim}] (one frame per motion "
            f"frame of the clip), got {tuple(audio.shape)}"
        )
    ref = check_tensor(ref, "ref", ndim=2, non_empty=True, max_abs=_MAX_ABS)
    if tuple(ref.shape) != (n, dit.ref_dim):
        raise ValueError(f"ref must have shape [{n}, {dit.ref_dim}], got {tuple(ref.shape)}")
    return (
        codes,
        audio,
        ref,
        check_int(steps, "steps", low=1),
        check_int(batch_size, "batch_size", low=1),
        check_float(lr, "lr", low=1e-8, high=1.0),
    )


def _flow_batch(dit, normalizer, codes, audio, ref, idx, g, p_drop_audio, p_drop_prev):
    z = normalizer.transform(codes[idx])
    prev, x1 = z[:, : dit.n_prev], z[:, dit.n_prev :]
    b = x1.shape[0]
    x0 = torch.randn(x1.shape, generator=g, dtype=x1.dtype)
    t = torch.rand(b, generator=g, dtype=x1.dtype)
    xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * x1
    audio_mask = torch.rand(b, generator=g) >= p_drop_audio
    prev_mask = torch.rand(b, generator=g) >= p_drop_prev
    return xt, t, x1 - x0, audio[idx], ref[idx], (prev if dit.n_prev else None), audio_mask, prev_mask


def train_stage1(dit: AudioToMotionDiT, normalizer: MotionNormalizer, codes: Tensor, audio: Tensor, ref: Tensor, *,
                 steps: int = 1000, batch_size: int = 64, lr: float = 1e-3, p_drop_audio: float = 0.1,
                 p_drop_prev: float = 0.5, seed: int = 0) -> list[float]:  # fmt: skip
    """Train the stage-1 DiT with the rectified-flow objective ``‖v(x_t, t) − (x_1 − x_0)‖²`` on normalised
    codes; audio (and the previous clip) are dropped per sample for classifier-free guidance.

    Args:
        codes: ``[N, n_prev + T, D]`` raw packed motion (the first ``n_prev`` frames are the previous clip).
        audio: ``[N, T, A]`` audio features of the clip frames; ``ref``: ``[N, R]``.

    Returns:
        The training loss per step.
    """
    codes, audio, ref, steps, batch_size, lr = _check_training(
        dit, normalizer, codes, audio, ref, steps, batch_size, lr
    )
    p_drop_audio = check_float(p_drop_audio, "p_drop_audio", low=0.0, high=1.0)
    p_drop_prev = check_float(p_drop_prev, "p_drop_prev", low=0.0, high=1.0)
    g = make_generator(seed)
    dit.train()
    opt = torch.optim.AdamW([p for p in dit.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, codes.shape[0], (min(batch_size, codes.shape[0]),), generator=g)
        xt, t, target, a, r, prev, am, pm = _flow_batch(
            dit, normalizer, codes, audio, ref, idx, g, p_drop_audio, p_drop_prev
        )
        h, c = dit.embed(xt, t, a, r, prev, am, pm)
        loss = (dit.run_blocks(h, c) - target).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    dit.eval()
    return losses


def train_stage2(branch: EmotionControlBranch, dit: AudioToMotionDiT, normalizer: MotionNormalizer, codes: Tensor,
                 audio: Tensor, ref: Tensor, emotion: Tensor, *, steps: int = 1000, batch_size: int = 64,
                 lr: float = 1e-3, p_drop_audio: float = 0.1, p_drop_emotion: float = 0.1, p_drop_prev: float = 0.5,
                 seed: int = 0) -> list[float]:  # fmt: skip
    """Train only the emotion branch; the stage-1 DiT is frozen (``requires_grad_(False)``, its weights stay
    bit-identical). Emotion ids are dropped to the null id with ``p_drop_emotion`` for guidance.

    Args:
        emotion: ``[N]`` integer emotion ids in ``[0, n_emotions)``; the rest as in :func:`train_stage1`.

    Returns:
        The training loss per step.
    """
    if not isinstance(branch, EmotionControlBranch):
        raise TypeError(f"branch must be an EmotionControlBranch, got {type(branch).__name__}")
    codes, audio, ref, steps, batch_size, lr = _check_training(
        dit, normalizer, codes, audio, ref, steps, batch_size, lr
    )
    emotion = branch.check_emotion(emotion, codes.shape[0])
    if bool((emotion == branch.n_emotions).any()):
        raise ValueError(
            f"emotion must be a real class in [0, {branch.n_emotions - 1}] for training, got the null id"
        )
    p_drop_audio = check_float(p_drop_audio, "p_drop_audio", low=0.0, high=1.0)
    p_drop_emotion = check_float(p_drop_emotion, "p_drop_emotion", low=0.0, high=1.0)
    p_drop_prev = check_float(p_drop_prev, "p_drop_prev", low=0.0, high=1.0)
    g = make_generator(seed)
    dit.requires_grad_(False)
    dit.eval()
    branch.train()
    opt = torch.optim.AdamW(branch.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, codes.shape[0], (min(batch_size, codes.shape[0]),), generator=g)
        xt, t, target, a, r, prev, am, pm = _flow_batch(
            dit, normalizer, codes, audio, ref, idx, g, p_drop_audio, p_drop_prev
        )
        emo = torch.where(
            torch.rand(idx.shape[0], generator=g) < p_drop_emotion, branch.n_emotions, emotion[idx]
        )
        h, c = dit.embed(xt, t, a, r, prev, am, pm)
        loss = (dit.run_blocks(h, c, branch(h, c, emo)) - target).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    branch.eval()
    return losses
