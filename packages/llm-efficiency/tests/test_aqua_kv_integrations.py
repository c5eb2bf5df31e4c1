"""AQUA-KV (P36) with the transformers models a practitioner brings: Mistral-style configs, the quantizer
group checked against the KV width, and logging of the calibration."""

from __future__ import annotations

import logging
import re
import warnings

import pytest
import torch

pytest.importorskip("transformers")
from transformers import DynamicCache, MistralConfig, MistralForCausalLM

from icml25.kernels.rng import isolated_rng
from icml25.llm_efficiency.aqua_kv import (
    AquaCodec,
    AquaKVCache,
    AquaPredictors,
    HiggsQuantizer,
    PassthroughQuantizer,
    UniformQuantizer,
    calibrate_predictors,
    capture_kv,
    reconstruction_error,
    stored_bits,
)

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
C = 32  # kv_dim of the tiny Mistral below: 2 kv heads x head_dim 16 (GQA: 4 query heads)
SMALL_GRID = {"grid_samples": 20_000, "grid_iters": 10}  # a cheaper k-means grid for HIGGS in these tests


def higgs(n: int, group: int) -> HiggsQuantizer:
    return HiggsQuantizer(2, n, group, **SMALL_GRID)


def mistral(sliding_window: int | None, layers: int = 3) -> MistralForCausalLM:
    cfg = MistralConfig(
        hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=128, max_position_embeddings=256, sliding_window=sliding_window,
    )  # fmt: skip
    with isolated_rng(0):
        return MistralForCausalLM(cfg).eval()


def feed(model, ids, cache, step):
    return torch.cat(
        [
            model(input_ids=ids[:, s : s + step], past_key_values=cache, use_cache=True).logits
            for s in range(0, ids.shape[1], step)
        ],
        1,
    )


def identity_cache(model, **kw) -> AquaKVCache:
    n = model.config.num_hidden_layers
    kw = {"prefix_size": 4, "buffer_size": 16, **kw}
    return AquaKVCache(
        model.config, AquaPredictors.zeros(n, C), PassthroughQuantizer(None), PassthroughQuantizer(None), **kw
    )


IDS = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("sliding_window", "step"), [(None, 7), (8, 1), (8, 7)])
def test_mistral_identity_cache_equals_uncompressed(sliding_window, step) -> None:
    """With identity quantizers the AQUA-KV cache is the uncompressed cache: RoPE undo/redo, GQA head
    layout and (with a window of 8 over 40 tokens) the sliding-window mask all agree with transformers."""
    model = mistral(sliding_window)
    ref = model(input_ids=IDS).logits
    cache = identity_cache(model)
    got = feed(model, IDS, cache, step)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        got, feed(model, IDS, DynamicCache(config=model.config), step), atol=1e-5, rtol=0
    )
    assert cache.get_seq_length() == 40 and len(cache.chunks) == 2  # chunks at 16 and 32 buffered tokens
    assert cache.layout.num_kv_heads == 2 and cache.layout.head_dim == 16


def test_capture_of_a_sliding_window_model_keeps_every_token_pre_rope() -> None:
    """capture_kv sees all T keys (not the last `sliding_window`), rotated back to pre-RoPE: layer 0's are
    exactly k_proj(input_layernorm(embeddings)), and identical with or without the window."""
    windowed, full = mistral(8), mistral(None)
    (k_w, v_w), (k_f, _) = capture_kv(windowed, [IDS[:1]])[0], capture_kv(full, [IDS[:1]])[0]
    assert [k.shape for k in k_w] == [(36, C)] * 3  # 40 tokens minus the 4-token prefix
    attn0 = windowed.model.layers[0]
    with torch.no_grad():
        h = attn0.input_layernorm(windowed.model.embed_tokens(IDS[:1]))[0, 4:]
        torch.testing.assert_close(k_w[0], attn0.self_attn.k_proj(h), atol=1e-5, rtol=0)
        torch.testing.assert_close(v_w[0], attn0.self_attn.v_proj(h), atol=1e-6, rtol=0)
    torch.testing.assert_close(k_w[0], k_f[0], atol=0, rtol=0)


def test_mistral_sliding_window_really_masks() -> None:
    """The window matters for these 40 tokens (so the test above checks the masked path)."""
    windowed, full = mistral(8), mistral(None)
    assert (windowed(input_ids=IDS).logits - full(input_ids=IDS).logits).abs().max() > 1e-3


def test_mistral_generate_and_calibration_end_to_end() -> None:
    model = mistral(8)
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=0)
    ref = model.generate(prompt, **kw)
    fp16 = AquaKVCache(model.config, AquaPredictors.zeros(3, C), PassthroughQuantizer(), PassthroughQuantizer(),
                       prefix_size=4, buffer_size=8)  # fmt: skip
    assert torch.equal(model.generate(prompt, past_key_values=fp16, **kw), ref)
    assert len(fp16.chunks) >= 3
    # calibrated predictors beat plain quantization on held-out sequences (keys and values, layers >= 1)
    q = higgs(16, 32)
    data = [torch.randint(0, 128, (8, 48), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    preds, report = calibrate_predictors(model, data, q, PassthroughQuantizer(), progress=False)
    assert preds.kv_dim == C and len(report.key_recon_rel_mse_valid) == 3
    kv = capture_kv(model, [torch.randint(0, 128, (4, 48), generator=torch.Generator().manual_seed(9))])
    k_aqua, v_aqua = reconstruction_error(kv, preds, q, PassthroughQuantizer())
    k_none, v_none = reconstruction_error(kv, AquaPredictors.zeros(3, C), q, PassthroughQuantizer())
    assert sum(k_aqua[1:]) < sum(k_none[1:]) and sum(v_aqua[1:]) < sum(v_none[1:])
    cache = AquaKVCache(model.config, preds, q, PassthroughQuantizer(), prefix_size=4, buffer_size=8)
    out = model.generate(prompt, past_key_values=cache, **kw)
    assert out.shape == ref.shape and torch.equal(out[:, :12], prompt)
    # stored bits: 16-bit layer 0, HIGGS on layers 1-2. A row of c = 32 has 16 four-bit codes, which the
    # packer stores in one 32-code chunk: 128 + 16 (norm) bits per 32 values = 4.5, not the nominal 2.5
    assert q.bits_per_value == 2.5 and q.padded_bits_per_value(C) == 4.5
    assert cache.compressed_bits_per_value() == pytest.approx((16 + 2 * 4.5) / 3)


def test_group_wider_than_the_kv_width_is_rejected() -> None:
    model = mistral(None)
    wide = higgs(16, 128)
    assert wide.padded_bits_per_value(C) == pytest.approx((128 * 2 + 16) / 32)  # 8.5 b/v, not 2.125
    msg = re.escape(
        "quantizer.group=128 exceeds the KV width c=32 (num_key_value_heads * head_dim): every row would be "
        "zero-padded to 128 values, 8.5 bits per value instead of 2.125; use group <= 32, e.g. "
        "HiggsQuantizer(d=2, n=16, group=32)"
    )
    with pytest.raises(ValueError, match=msg):
        AquaKVCache(model.config, AquaPredictors.zeros(3, C), wide, PassthroughQuantizer())
    with pytest.raises(ValueError, match=r"first_layer_quantizer\.group=64 exceeds the KV width c=32"):
        AquaKVCache(model.config, AquaPredictors.zeros(3, C), higgs(16, 32), higgs(256, 64))
    with pytest.raises(ValueError, match=r"quantizer\.group=128 exceeds the KV width c=32"):
        calibrate_predictors(model, [IDS], wide, PassthroughQuantizer(), progress=False)
    with pytest.raises(ValueError, match=r"quantizer\.group=128 exceeds the KV width c=32"):
        reconstruction_error(
            capture_kv(model, [IDS]), AquaPredictors.zeros(3, C), wide, PassthroughQuantizer()
        )
    with pytest.raises(
        ValueError, match=r"quantizer.group=64 must divide the KV width c=32 .* and not exceed it"
    ):
        AquaCodec(AquaPredictors.zeros(3, C), UniformQuantizer(2, 64), PassthroughQuantizer())
    with pytest.raises(ValueError, match=r"quantizer.group=64 must divide the KV width c=96"):
        AquaCodec(AquaPredictors.zeros(3, 96), UniformQuantizer(2, 64), PassthroughQuantizer())
    # a group that fits but does not divide c pads only the last group: valid, with a warning giving the cost
    with pytest.warns(
        UserWarning, match=r"group=64 does not divide the KV width c=96: .* 128 values, 3 bits per"
    ):
        AquaCodec(AquaPredictors.zeros(3, 96), higgs(16, 64), PassthroughQuantizer())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AquaCodec(AquaPredictors.zeros(3, C), higgs(16, 32), UniformQuantizer(4, 32))


def test_calibration_logs_each_layer(caplog) -> None:
    model = mistral(None)
    with caplog.at_level(logging.DEBUG, logger="icml25.llm_efficiency.aqua_kv"):
        _, report = calibrate_predictors(model, [IDS[:, :24]] * 4, higgs(16, 32), PassthroughQuantizer())
    messages = [r.getMessage() for r in caplog.records if r.name == "icml25.llm_efficiency.aqua_kv.calibrate"]
    assert sum(m.startswith("captured KV of a batch (2, 24)") for m in messages) == 4
    assert messages[4] == (
        f"AQUA-KV calibration: 3 layers, c=32, {report.n_train_tokens} train / {report.n_valid_tokens} valid "
        "tokens (all), official ridge, fit on reconstructed inputs"
    )
    layers = [m for m in messages if m.startswith("layer ")]
    assert len(layers) == 3 and layers[0].startswith("layer 0: K pred relMSE train nan")
    assert f"valid {report.key_pred_rel_mse_valid[2]:.4g}" in layers[2]
    with pytest.raises(TypeError, match="progress must be True, False or None, got str 'yes'"):
        calibrate_predictors(model, [IDS], higgs(16, 32), PassthroughQuantizer(), progress="yes")


@pytest.mark.parametrize(
    ("c", "group", "n"),
    [(32, 32, 16), (32, 128, 16), (64, 64, 16), (96, 64, 16), (192, 128, 256), (40, 8, 16)],
)
def test_padded_bits_per_value_is_what_quantize_stores(c, group, n) -> None:
    q = HiggsQuantizer(2, n, group, grid_samples=5000, grid_iters=2)
    assert stored_bits(q.quantize(torch.randn(3, c))) == q.padded_bits_per_value(c) * 3 * c
