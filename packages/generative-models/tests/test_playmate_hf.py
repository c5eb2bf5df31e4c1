"""P41 transformers integration: wav2vec2 features (a tiny random Wav2Vec2Model built from a config, the real
Wav2Vec2FeatureExtractor) resampled to video frames drive the audio-to-motion DiT."""

from __future__ import annotations

import pytest
import torch

from icml25.generative_models import playmate as pm

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("icml25.generative_models.playmate_hf")


def test_wav2vec2_features_drive_the_motion_dit() -> None:
    model = hf.tiny_wav2vec2(hidden_size=32, seed=0)
    assert isinstance(model, transformers.Wav2Vec2Model)
    g = torch.Generator().manual_seed(0)
    wave = torch.randn(2, 8000, generator=g)  # 0.5 s at 16 kHz -> 12 frames at 25 fps
    fe = transformers.Wav2Vec2FeatureExtractor(sampling_rate=16_000, do_normalize=True)
    feats = hf.wav2vec2_frame_features(model, wave, 12, feature_extractor=fe)
    assert feats.shape == (2, 12, 32) and bool(torch.isfinite(feats).all())
    # endpoints of the linear resampling are the first and last wav2vec2 frames
    x = fe(list(wave.numpy()), sampling_rate=16_000, return_tensors="pt").input_values
    with torch.no_grad():
        last = model(x).last_hidden_state
    torch.testing.assert_close(feats[:, 0], last[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(feats[:, -1], last[:, -1], rtol=1e-5, atol=1e-5)
    first = hf.wav2vec2_frame_features(model, wave, 12, feature_extractor=fe, layer=0)
    assert first.shape == (2, 12, 32) and not torch.allclose(first, feats)
    faces = pm.SyntheticTalkingFaces(audio_dim=8, n_nuisance=2, seed=0)
    codes = faces.sample(2, 12, seed=0).codes
    norm = pm.MotionNormalizer(20).fit(codes)
    dit = pm.AudioToMotionDiT(67, 32, 60, 12, width=16, depth=1, heads=2, seed=0)
    ref = torch.randn(2, 60, generator=g)
    out = pm.sample_motion(dit, feats, ref, normalizer=norm, steps=3, seed=0)
    assert out["exp"].shape == (2, 12, 20, 3)
    with pytest.raises(ValueError, match="audio must have one feature frame per motion frame"):
        dit(torch.zeros(2, 10, 67), 0.5, feats, ref)


def test_wav2vec2_frame_features_rejects_bad_waveforms() -> None:
    model = hf.tiny_wav2vec2()
    with pytest.raises(ValueError, match="waveform must be finite"):
        hf.wav2vec2_frame_features(model, torch.full((1, 1000), float("nan")), 4)
    with pytest.raises(ValueError, match="waveform must hold at least 400 samples"):
        hf.wav2vec2_frame_features(model, torch.zeros(1, 100), 4)
    with pytest.raises(ValueError, match=r"n_frames must be an int >= 1, got 0"):
        hf.wav2vec2_frame_features(model, torch.zeros(1, 1000), 0)
    with pytest.raises(TypeError, match="n_frames must be an int"):
        hf.wav2vec2_frame_features(model, torch.zeros(1, 1000), 4.0)
    with pytest.raises(ValueError, match=r"waveform must have 1 or 2 dimension"):
        hf.wav2vec2_frame_features(model, torch.zeros(1, 1, 1000), 4)
