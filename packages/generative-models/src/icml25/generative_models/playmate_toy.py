"""Playmate: Flexible Control of Portrait Animation via 3D-Implicit Space Guided Diffusion — ICML 2025, P41: a synthetic talking-face generator.

:class:`SyntheticTalkingFaces` draws parametric talking-face motion at realistic raw scales for CPU-scale
checks of :mod:`icml25.generative_models.playmate` (no pixels; the renderer that turns keypoints into frames
is not included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from icml25.kernels.checks import check_int

__all__ = ["SyntheticTalkingFaces"]


# ------------------------------------------------------------------------------------------ synthetic faces
def _template(k: int) -> np.ndarray:
    """A frontal 20-point face template (brows, eyes, nose, mouth, contour), unit-ish scale."""
    pts = [(-0.35, 0.45), (-0.15, 0.5), (0.15, 0.5), (0.35, 0.45),  # brows 0-3
           (-0.3, 0.3), (-0.15, 0.3), (0.15, 0.3), (0.3, 0.3),  # eyes 4-7
           (0.0, 0.15), (-0.08, 0.0), (0.08, 0.0),  # nose 8-10
           (0.0, -0.2), (0.0, -0.3), (-0.2, -0.25), (0.2, -0.25),  # upper lip 11, lower lip 12, corners 13-14
           (-0.5, 0.1), (-0.4, -0.3), (0.0, -0.55), (0.4, -0.3), (0.5, 0.1)]  # contour 15-19, chin 17  # fmt: skip
    xy = np.array(pts[:k], dtype=np.float64)
    z = 0.1 * (1 - xy[:, 0] ** 2)[:, None]
    return np.concatenate([xy, z], 1)


def _smooth(noise: np.ndarray, width: int) -> np.ndarray:
    """Hann-window smoothing along axis 1 (time)."""
    from scipy.ndimage import convolve1d

    kernel = np.hanning(2 * width + 3)[1:-1]
    return convolve1d(noise, kernel / kernel.sum(), axis=1, mode="nearest")


@dataclass(frozen=True)
class TalkingFaceBatch:
    """Sequences drawn by :class:`SyntheticTalkingFaces` (``F = n_prev + T`` frames)."""

    codes: Tensor
    """``[N, F, 3K + 7]`` packed raw motion."""
    audio: Tensor
    """``[N, F, A]`` audio features."""
    envelope: Tensor
    """``[N, F]`` audio energy envelope in ``[0, 1]``."""
    ref: Tensor
    """``[N, 3K]`` flattened canonical keypoints of each sequence's identity."""
    emotion: Tensor
    """``[N]`` emotion ids."""
    identity: Tensor
    """``[N]`` identity ids."""


class SyntheticTalkingFaces:
    """Parametric talking faces at realistic raw scales (no pixels).

    Per sequence: an identity (canonical keypoints = template + per-identity offsets), an audio energy
    envelope (smoothed noise through a sigmoid, with pauses) and ``audio_dim`` features = a fixed random
    linear mix of the envelope and ``n_nuisance`` independent smooth signals plus noise; the mouth opens in
    proportion to the envelope (upper lip up, lower lip and chin down; opening std ≈ 0.01); the emotion
    (0 neutral, 1 happy, 2 sad, 3 angry, ...) adds a constant class-specific offset to brows and mouth
    corners; head pose is a smooth random walk independent of audio and emotion (rotation in degrees, std ≈
    10; translation ≈ 0.1; scale ≈ 1).
    """

    UPPER_LIP, LOWER_LIP = 11, 12

    def __init__(self, n_identities: int = 40, n_emotions: int = 4, audio_dim: int = 16, n_nuisance: int = 7,
                 *, n_keypoints: int = 20, seed: int = 0) -> None:  # fmt: skip
        self.n_identities = check_int(n_identities, "n_identities", low=1)
        self.n_emotions = check_int(n_emotions, "n_emotions", low=1)
        self.audio_dim = check_int(audio_dim, "audio_dim", low=1)
        self.n_nuisance = check_int(n_nuisance, "n_nuisance", low=0)
        if self.audio_dim < self.n_nuisance + 1:
            raise ValueError(
                f"audio_dim must be >= n_nuisance + 1 = {self.n_nuisance + 1}, got {self.audio_dim}"
            )
        self.n_keypoints = check_int(n_keypoints, "n_keypoints", low=20)
        if self.n_keypoints != 20:
            raise ValueError(f"n_keypoints must be 20 (the template's layout), got {self.n_keypoints}")
        rng = np.random.default_rng(seed)
        self.template = _template(self.n_keypoints)
        self.canonical = self.template[None] + 0.03 * rng.standard_normal(
            (self.n_identities, self.n_keypoints, 3)
        )
        self.mix = rng.standard_normal((self.audio_dim, 1 + self.n_nuisance)) / math.sqrt(1 + self.n_nuisance)
        off = np.zeros((max(self.n_emotions, 4), self.n_keypoints, 3))
        off[1, [13, 14], 1], off[1, 13, 0], off[1, 14, 0] = 0.015, -0.008, 0.008  # happy: corners up and out
        off[2, [13, 14], 1], off[2, [1, 2], 1] = -0.012, 0.01  # sad: corners down, inner brows up
        off[3, [0, 1, 2, 3], 1], off[3, 1, 0], off[3, 2, 0] = (
            -0.012,
            0.006,
            -0.006,
        )  # angry: brows down and in
        for e in range(4, self.n_emotions):
            off[e] = (
                0.012 * rng.standard_normal((self.n_keypoints, 3)) * (rng.random((self.n_keypoints, 1)) < 0.3)
            )
        self.emotion_offsets = off[: self.n_emotions]

    def sample(self, n: int, n_frames: int, *, seed: int = 0, emotion: int | None = None) -> TalkingFaceBatch:
        """``n`` sequences of ``n_frames`` frames (all emotions uniformly unless ``emotion`` is fixed)."""
        n = check_int(n, "n", low=1)
        f = check_int(n_frames, "n_frames", low=2)
        if emotion is not None and (isinstance(emotion, bool) or not isinstance(emotion, (int, np.integer))
                                    or not 0 <= emotion < self.n_emotions):  # fmt: skip
            raise ValueError(f"emotion must be an id in [0, {self.n_emotions}), got {emotion!r}")
        rng = np.random.default_rng(seed)
        k = self.n_keypoints
        z = _smooth(rng.standard_normal((n, f)), 3)
        env = 1 / (1 + np.exp(-4 * (z / z.std() - 0.2)))
        gate = _smooth((rng.random((n, f)) > 0.15).astype(float), 2)
        env = np.clip(env * gate, 0, 1)
        nuis = (
            _smooth(rng.standard_normal((n, f, self.n_nuisance)), 3)
            if self.n_nuisance
            else np.zeros((n, f, 0))
        )
        nuis = nuis / (nuis.std() + 1e-12) * 0.3 if self.n_nuisance else nuis
        src = np.concatenate([env[..., None], nuis], -1)
        audio = src @ self.mix.T + 0.02 * rng.standard_normal((n, f, self.audio_dim))
        emo = rng.integers(0, self.n_emotions, n) if emotion is None else np.full(n, emotion)
        ident = rng.integers(0, self.n_identities, n)
        exp = np.repeat(self.emotion_offsets[emo][:, None], f, 1).copy()
        exp[:, :, self.UPPER_LIP, 1] += 0.006 * env
        exp[:, :, self.LOWER_LIP, 1] -= 0.02 * env
        exp[:, :, 17, 1] -= 0.012 * env
        exp += 0.0005 * rng.standard_normal(exp.shape)
        rot = (
            8 * rng.standard_normal((n, 1, 3))
            + np.cumsum(_smooth(rng.standard_normal((n, f, 3)), 2), 1) * 1.5
        )
        trans = (
            0.08 * rng.standard_normal((n, 1, 3))
            + np.cumsum(_smooth(rng.standard_normal((n, f, 3)), 2), 1) * 0.01
        )
        scale = (
            1 + 0.05 * rng.standard_normal((n, 1, 1)) + 0.002 * np.cumsum(rng.standard_normal((n, f, 1)), 1)
        )
        codes = np.concatenate([exp.reshape(n, f, 3 * k), rot, trans, scale], -1)
        as_t = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
        return TalkingFaceBatch(codes=as_t(codes), audio=as_t(audio), envelope=as_t(env),
                                ref=as_t(self.canonical[ident].reshape(n, 3 * k)),
                                emotion=torch.as_tensor(emo, dtype=torch.long),
                                identity=torch.as_tensor(ident, dtype=torch.long))  # fmt: skip
