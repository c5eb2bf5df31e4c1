"""Playmate: Flexible Control of Portrait Animation via 3D-Implicit Space Guided Diffusion — ICML 2025, P41: wav2vec2 audio features from transformers.

Ma et al., ICML 2025 (arXiv 2502.07203). Playmate, like other audio-driven portrait methods, conditions its
motion DiT on wav2vec2 features resampled to the video frame rate. :func:`wav2vec2_frame_features` runs a
``transformers`` ``Wav2Vec2Model`` (optionally after a ``Wav2Vec2FeatureExtractor``) on raw waveforms and
linearly resamples one hidden layer to ``n_frames`` frames, the ``audio`` input of
:class:`~icml25.generative_models.playmate.AudioToMotionDiT`. :func:`tiny_wav2vec2` builds a small
randomly-initialised model from a config (no download), for tests and examples. Needs the ``hf`` extra.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

try:
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "Playmate's wav2vec2 audio features need transformers: pip install 'icml25-generative-models[hf]'"
    ) from exc

from icml25.kernels.checks import check_int, check_tensor
from icml25.kernels.rng import isolated_rng

__all__ = ["tiny_wav2vec2", "wav2vec2_frame_features"]


def tiny_wav2vec2(hidden_size: int = 32, num_layers: int = 2, *, seed: int = 0) -> Wav2Vec2Model:
    """A small randomly-initialised ``Wav2Vec2Model`` (3 conv layers, stride 5·4·4 = 80 samples = 5 ms at
    16 kHz) built from a config; nothing is downloaded."""
    for name, v in (("hidden_size", hidden_size), ("num_layers", num_layers)):
        check_int(v, name, low=1)
    if hidden_size % 4:
        raise ValueError(f"hidden_size must be divisible by 4 attention heads, got {hidden_size}")
    cfg = Wav2Vec2Config(hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=4,
                         intermediate_size=2 * hidden_size, conv_dim=(32, 32, 32), conv_stride=(5, 4, 4),
                         conv_kernel=(10, 8, 8), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                         do_stable_layer_norm=True, feat_extract_norm="layer")  # fmt: skip
    with isolated_rng(seed):
        model = Wav2Vec2Model(cfg)
    return model.eval()


def wav2vec2_frame_features(model: Wav2Vec2Model, waveform: Tensor | np.ndarray, n_frames: int, *,
                            feature_extractor: Wav2Vec2FeatureExtractor | None = None, sampling_rate: int = 16_000,
                            layer: int | None = None) -> Tensor:  # fmt: skip
    """Per-video-frame audio features ``[B, n_frames, H]`` from waveforms ``[B, S]`` (or ``[S]``).

    Args:
        model: a ``transformers`` wav2vec2-style model returning ``hidden_states``.
        waveform: raw audio, float, ``[B, S]`` or ``[S]``.
        n_frames: video frames the clip spans (the hidden states are linearly resampled to this length).
        feature_extractor: optional ``Wav2Vec2FeatureExtractor`` (zero-mean unit-variance normalisation).
        sampling_rate: the waveform's rate (must match the extractor's).
        layer: which entry of ``hidden_states`` to use (None: ``last_hidden_state``, after the final norm).
    """
    if not hasattr(model, "config") or not callable(model):
        raise TypeError(f"model must be a transformers wav2vec2 model, got {type(model).__name__}")
    n_frames = check_int(n_frames, "n_frames", low=1)
    if isinstance(waveform, np.ndarray):
        waveform = torch.from_numpy(waveform)
    waveform = check_tensor(waveform, "waveform", ndim=(1, 2), non_empty=True)
    if waveform.ndim == 1:
        waveform = waveform[None]
    if waveform.shape[1] < 400:
        raise ValueError(
            f"waveform must hold at least 400 samples (25 ms at 16 kHz), got {waveform.shape[1]}"
        )
    x = waveform.float()
    if feature_extractor is not None:
        if not isinstance(feature_extractor, Wav2Vec2FeatureExtractor):
            raise TypeError(
                f"feature_extractor must be a Wav2Vec2FeatureExtractor, got {type(feature_extractor).__name__}"
            )
        x = feature_extractor(list(x.numpy()), sampling_rate=sampling_rate, return_tensors="pt").input_values
    with torch.no_grad():
        out = model(x, output_hidden_states=layer is not None)
    if layer is None:
        h = out.last_hidden_state
    else:
        hs = out.hidden_states
        layer = check_int(layer, "layer")
        if not -len(hs) <= layer < len(hs):
            raise ValueError(f"layer must index the model's {len(hs)} hidden states, got {layer!r}")
        h = hs[layer]
    return torch.nn.functional.interpolate(h.transpose(1, 2), size=n_frames, mode="linear",
                                           align_corners=True).transpose(1, 2)  # fmt: skip
