"""AQUA-KV (P36): exact checks of quantizers, ridge predictors, the transformers cache, and the quick reproduction."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from icml25.kernels.hadamard_grid import grid_decode, grid_encode
from icml25.kernels.quantization import unpack_codes
from icml25.kernels.rng import global_rng_state
from icml25.llm_efficiency.aqua_kv import (
    AquaCodec,
    AquaKVCache,
    AquaPredictors,
    HiggsCodes,
    HiggsQuantizer,
    PassthroughQuantizer,
    UniformQuantizer,
    calibrate_predictors,
    capture_kv,
    evaluate_kv_compression,
    fit_ridge,
    make_gaussian_grid,
    reconstruction_error,
    stored_bits,
)
from icml25.llm_efficiency.aqua_kv.quantizers import _planes

# transformers 5 renames past_key_values -> cache; the issue asks for past_key_values, which still works
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
FAST = settings(deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow])
C = 64  # kv_dim of the tiny models below


def llama(layers: int = 3, kv_heads: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=kv_heads,
        intermediate_size=128, vocab_size=128, max_position_embeddings=256,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return llama()


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, 72), generator=torch.Generator().manual_seed(1))


def feed(model: torch.nn.Module, ids: torch.Tensor, cache: object, step: int) -> torch.Tensor:
    out = [
        model(input_ids=ids[:, s : s + step], past_key_values=cache, use_cache=True).logits
        for s in range(0, ids.shape[1], step)
    ]
    return torch.cat(out, 1)


# ----------------------------------------------------------------------------------------------------
# quantizers
# ----------------------------------------------------------------------------------------------------
def test_gaussian_grid_distortion_and_determinism() -> None:
    grid = make_gaussian_grid(2, 16)
    assert torch.equal(grid, make_gaussian_grid(2, 16)) and grid.shape == (16, 2)
    z = torch.randn(100_000, 2, generator=torch.Generator().manual_seed(5))
    mse = float(torch.cdist(z, grid).min(-1).values.pow(2).mean() / 2)
    # 2 bits per coordinate: 2-D Lloyd (~0.105) beats the scalar 2-bit Lloyd-Max quantizer (0.1175).
    assert 0.095 < mse < 0.1175


def test_higgs_round_trip_error_and_bits() -> None:
    q = HiggsQuantizer(d=2, n=16, group=64)
    x = torch.randn(512, 128, generator=torch.Generator().manual_seed(0)) * 3
    codes = q.quantize(x)
    rel = float(((q.dequantize(codes) - x) ** 2).sum() / (x**2).sum())
    assert rel == pytest.approx(0.107, rel=0.2)  # measured 0.107 (≈ the grid's Gaussian distortion)
    assert q.bits_per_value == 4 / 2 + 16 / 64
    # bits reported == bits stored: 4-bit indices packed in int32 words + one float16 norm per group
    assert (
        codes.nbits == 32 * codes.planes[0].numel() + 16 * codes.scale.numel() == 512 * 128 * q.bits_per_value
    )
    idx = unpack_codes(codes.planes[0], 4, 64)
    assert int(idx.min()) >= 0 and int(idx.max()) < 16


@FAST
@given(log_n=st.integers(2, 16))
def test_index_planes_cover_bits(log_n: int) -> None:
    planes = _planes(log_n)
    assert sum(planes) == log_n and all(w in (2, 3, 4, 8) for w in planes)


@pytest.mark.parametrize("n", [4, 64, 512])
def test_higgs_plane_packing_round_trip(n: int) -> None:
    q = HiggsQuantizer(d=2, n=n, group=32, grid_samples=20_000, grid_iters=10)
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(n))  # 48 -> padded to 64
    codes = q.quantize(x)
    assert codes.shape == (64, 48)
    # The bit planes hold exactly the encoder's grid indices: unpacking and re-joining them gives them back.
    idx, scale = grid_encode(torch.nn.functional.pad(x, (0, 16)), q.grid, 32)
    n_codes = 64 // 2
    joined, shift = torch.zeros(64, n_codes, dtype=torch.int64), 0
    for packed, w in zip(codes.planes, codes.plane_bits):
        joined |= unpack_codes(packed, w, n_codes).to(torch.int64) << shift
        shift += w
    assert shift == int(math.log2(n)) and torch.equal(joined, idx.reshape(64, n_codes).to(torch.int64))
    assert torch.equal(codes.scale, scale)
    # Decoding the packed codes gives the values the grid decoder gives for those indices, bit for bit,
    # cropped to the unpadded width.
    decoded = q.dequantize(codes)
    assert torch.equal(decoded, grid_decode(idx, scale, q.grid, 32)[:, :48])
    # ... which approximate x (better than the all-zero reconstruction; accuracy is tested above).
    assert float(((decoded - x) ** 2).mean()) < float((x**2).mean())
    assert stored_bits(codes) == 64 * (32 * sum(p.shape[1] for p in codes.planes) + 16 * 2)


def test_uniform_and_passthrough_bits() -> None:
    x = torch.randn(10, 128)
    u = UniformQuantizer(bits=2, group=64)
    assert stored_bits(u.quantize(x)) == 10 * 128 * u.bits_per_value == 10 * 128 * 2.5
    assert float(((u.quantize_dequantize(x) - x) ** 2).mean()) < float((x**2).mean())
    p = PassthroughQuantizer(None)
    assert torch.equal(p.quantize_dequantize(x), x) and stored_bits(p.quantize(x)) == 10 * 128 * 32
    assert stored_bits(PassthroughQuantizer().quantize(x)) == 10 * 128 * 16


def test_quantizer_bad_inputs() -> None:
    with pytest.raises(ValueError, match="d must be >= 1 and divide group"):
        HiggsQuantizer(d=3, n=16, group=64)
    with pytest.raises(ValueError, match=r"n must be a power of two in \[4, 65536\]"):
        HiggsQuantizer(d=2, n=2**17, group=64)
    with pytest.raises(ValueError, match=r"n must be a power of two"):
        HiggsQuantizer(d=2, n=24, group=64)
    with pytest.raises(ValueError, match="group must be a power of two"):
        HiggsQuantizer(d=2, n=16, group=96)
    with pytest.raises(ValueError, match="x must have shape"):
        HiggsQuantizer(d=2, n=16, group=64).quantize(torch.randn(64))
    with pytest.raises(ValueError, match="bits must be one of"):
        UniformQuantizer(bits=5)


# ----------------------------------------------------------------------------------------------------
# predictors
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["official", "centred"])
def test_ridge_zero_equals_lstsq(form) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(300, 12)), rng.normal(size=(300, 5))
    w, b = fit_ridge(torch.tensor(x), torch.tensor(y), ridge=0.0, ridge_form=form)
    coef = np.linalg.lstsq(np.c_[x, np.ones(300)], y, rcond=None)[0]
    np.testing.assert_allclose(w.numpy(), coef[:-1], atol=1e-5)
    np.testing.assert_allclose(b.numpy(), coef[-1], atol=1e-5)
    w2, _ = fit_ridge(torch.tensor(x), torch.tensor(y), ridge=10.0, ridge_form=form)
    assert float(w2.norm()) < float(w.norm())  # damping shrinks the weights


def _offset_data() -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets far from zero mean, so the two ridge forms differ visibly."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 6)) + 3.0
    y = x @ rng.normal(size=(6, 4)) + 5.0 + 0.1 * rng.normal(size=(400, 4))
    return x, y


def test_official_ridge_is_the_closed_form_with_a_ones_column() -> None:
    """The default equals fit_linear_regression(fit_intercept=True) of the official code: [W; b] solves
    (X1'X1 + r * mean diag(X1'X1) * I) [W; b] = X1'Y with X1 = [x, 1]; the intercept is damped too."""
    x, y = _offset_data()
    x1 = np.c_[x, np.ones(len(x))]
    gram = x1.T @ x1
    want = np.linalg.solve(gram + 0.1 * np.diag(gram).mean() * np.eye(7), x1.T @ y)
    w, b = fit_ridge(torch.tensor(x), torch.tensor(y), ridge=0.1)
    w_off, b_off = fit_ridge(torch.tensor(x), torch.tensor(y), ridge=0.1, ridge_form="official")
    assert torch.equal(w, w_off) and torch.equal(b, b_off)  # official is the default
    np.testing.assert_allclose(w.numpy(), want[:-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), want[-1], rtol=1e-5, atol=1e-6)


def test_centred_ridge_is_the_closed_form_on_centred_data() -> None:
    """ridge_form="centred": (Xc'Xc + r * mean diag(Xc'Xc) * I) W = Xc'Yc, b = mean(y) - mean(x) W (the
    intercept is not penalised); it differs from the official form on off-centre data."""
    x, y = _offset_data()
    xc, yc = x - x.mean(0), y - y.mean(0)
    gram = xc.T @ xc
    w_want = np.linalg.solve(gram + 0.1 * np.diag(gram).mean() * np.eye(6), xc.T @ yc)
    b_want = y.mean(0) - x.mean(0) @ w_want
    w, b = fit_ridge(torch.tensor(x), torch.tensor(y), ridge=0.1, ridge_form="centred")
    np.testing.assert_allclose(w.numpy(), w_want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), b_want, rtol=1e-5, atol=1e-6)
    w_off, b_off = fit_ridge(torch.tensor(x), torch.tensor(y), ridge=0.1)
    assert float((b - b_off).abs().max()) > 0.1 and float((w - w_off).abs().max()) > 0.01


def test_ridge_form_validation() -> None:
    x, y = torch.randn(10, 3), torch.randn(10, 2)
    with pytest.raises(ValueError, match="ridge_form must be one of"):
        fit_ridge(x, y, ridge_form="uncentred")


def test_zero_predictors_reduce_to_plain_quantization() -> None:
    q = HiggsQuantizer(d=2, n=16, group=64)
    codec = AquaCodec(AquaPredictors.zeros(3, C), q, PassthroughQuantizer(None))
    gen = torch.Generator().manual_seed(2)
    ks, vs = (
        [torch.randn(40, C, generator=gen) for _ in range(3)],
        [torch.randn(40, C, generator=gen) for _ in range(3)],
    )
    prev = None
    for layer in range(3):
        (ck, cv), prev = codec.encode_layer(layer, ks[layer], vs[layer], prev)
        if layer:
            for got, x in ((ck, ks[layer]), (cv, vs[layer])):
                want = q.quantize(x)
                assert all(torch.equal(a, b) for a, b in zip(got.planes, want.planes))
                assert torch.equal(got.scale, want.scale)
            torch.testing.assert_close(prev[0], q.quantize_dequantize(ks[layer]))


def test_predictors_save_load_and_config_mismatch(tmp_path, model) -> None:
    preds, _ = calibrate_predictors(
        model,
        [torch.randint(0, 128, (4, 40))],
        HiggsQuantizer(2, 16, 64),
        PassthroughQuantizer(),
        progress=False,
    )
    path = tmp_path / "p.pt"
    preds.save(path)
    back = AquaPredictors.load(path)
    for layer in (1, 2):
        assert torch.equal(back.key[layer].weight, preds.key[layer].weight)
        assert torch.equal(back.value[layer].bias, preds.value[layer].bias)
    assert back.meta["fit_inputs"] == "reconstructed" and preds.num_parameters() == 2 * (
        C * C + C + 2 * C * C + C
    )
    with pytest.raises(ValueError, match="fitted for 4 layers, the model has 3"):
        AquaKVCache(
            model.config, AquaPredictors.zeros(4, C), HiggsQuantizer(2, 16, 64), PassthroughQuantizer()
        )
    with pytest.raises(ValueError, match="kv_dim c=32"):
        AquaKVCache(
            model.config, AquaPredictors.zeros(3, 32), HiggsQuantizer(2, 16, 64), PassthroughQuantizer()
        )


def test_predictors_leave_the_global_rng_untouched(tmp_path, model) -> None:
    """calibrate_predictors, zeros() and load() build their nn.Linear layers without the random init:
    library code never draws from the caller's global torch generator."""
    data = [torch.randint(0, 128, (4, 40), generator=torch.Generator().manual_seed(3))]
    before = global_rng_state()
    preds, _ = calibrate_predictors(
        model, data, HiggsQuantizer(2, 16, 64), PassthroughQuantizer(), progress=False
    )
    preds.save(tmp_path / "p.pt")
    AquaPredictors.load(tmp_path / "p.pt")
    AquaPredictors.zeros(3, C)
    assert global_rng_state() == before


def test_calibration_fits_linear_structure() -> None:
    # Random-init tiny Llama: keys of adjacent layers are near-linear maps of one residual stream.
    m = llama(layers=3)
    data = [torch.randint(0, 128, (8, 64), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    q = HiggsQuantizer(2, 16, 64)
    preds, rep = calibrate_predictors(m, data, q, PassthroughQuantizer(), progress=False)
    assert (
        math.isnan(rep.key_pred_rel_mse_valid[0]) and rep.n_valid_tokens == 2 * 64
    )  # 2 of 16 sequences held out, every token (official calibration)
    assert max(rep.key_pred_rel_mse_valid[1:]) < 0.5 and max(rep.value_pred_rel_mse_valid[1:]) < 0.5
    assert min(rep.key_equiv_bits_valid[1:]) > 0.5
    kv = capture_kv(m, [torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(9))])
    k_aqua, v_aqua = reconstruction_error(kv, preds, q, PassthroughQuantizer())
    k_none, v_none = reconstruction_error(kv, AquaPredictors.zeros(3, C), q, PassthroughQuantizer())
    assert np.mean(k_aqua[1:]) < np.mean(k_none[1:]) and np.mean(v_aqua[1:]) < np.mean(v_none[1:])


def _weights(preds: AquaPredictors) -> list[torch.Tensor]:
    return [p for lin in [*preds.key.values(), *preds.value.values()] for p in (lin.weight, lin.bias)]


def test_calibration_tokens_and_ridge_form(model) -> None:
    """The default is the official calibration (every token, official ridge); "after_prefix" equals
    calibrating on a capture without the prefix; with prefix_size=0 both token sets are the same fit."""
    data = [torch.randint(0, 128, (8, 40), generator=torch.Generator().manual_seed(4))]
    q, q0 = HiggsQuantizer(2, 16, 64), PassthroughQuantizer()
    everything = capture_kv(model, data, prefix_size=0)
    assert everything.prefix_size == 0 and everything[0][0][0].shape == (40, C)

    def fit(**kw) -> tuple[AquaPredictors, object]:
        return calibrate_predictors(model, None, q, q0, progress=False, **kw)

    default, rep = fit(captured=everything)
    official, _ = calibrate_predictors(
        model, data, q, q0, calibration_tokens="all", ridge_form="official", progress=False
    )
    assert rep.n_train_tokens + rep.n_valid_tokens == 8 * 40
    assert all(torch.equal(a, b) for a, b in zip(_weights(default), _weights(official)))
    assert default.meta["calibration_tokens"] == "all" and default.meta["ridge_form"] == "official"

    after, rep_after = fit(captured=everything, calibration_tokens="after_prefix", ridge_form="centred")
    direct, _ = fit(
        captured=capture_kv(model, data, prefix_size=4),
        calibration_tokens="after_prefix",
        ridge_form="centred",
    )
    assert rep_after.n_train_tokens + rep_after.n_valid_tokens == 8 * 36
    assert all(torch.equal(a, b) for a, b in zip(_weights(after), _weights(direct)))
    assert not all(torch.equal(a, b) for a, b in zip(_weights(after), _weights(default)))

    for form in ("official", "centred"):
        all_0, _ = fit(captured=everything, prefix_size=0, calibration_tokens="all", ridge_form=form)
        after_0, _ = fit(
            captured=everything, prefix_size=0, calibration_tokens="after_prefix", ridge_form=form
        )
        assert all(torch.equal(a, b) for a, b in zip(_weights(all_0), _weights(after_0)))


def test_calibration_bad_inputs(model) -> None:
    q = HiggsQuantizer(2, 16, 64)
    with pytest.raises(ValueError, match="longer than prefix_size=4"):
        calibrate_predictors(
            model, [torch.randint(0, 128, (2, 4))], q, PassthroughQuantizer(),
            calibration_tokens="after_prefix", progress=False,
        )  # fmt: skip
    with pytest.raises(ValueError, match="longer than prefix_size=4"):  # the same from a full capture
        calibrate_predictors(
            model, None, q, PassthroughQuantizer(), calibration_tokens="after_prefix", progress=False,
            captured=capture_kv(model, [torch.randint(0, 128, (2, 4))], prefix_size=0),
        )  # fmt: skip
    ok = [torch.randint(0, 128, (2, 20))]
    with pytest.raises(ValueError, match="calibration_tokens must be one of"):
        calibrate_predictors(model, ok, q, PassthroughQuantizer(), calibration_tokens="sinks")
    with pytest.raises(ValueError, match="ridge_form must be one of"):
        calibrate_predictors(model, ok, q, PassthroughQuantizer(), ridge_form="ridge")
    with pytest.raises(TypeError, match="captured must be the CapturedKV"):
        calibrate_predictors(model, None, q, PassthroughQuantizer(), captured=list(capture_kv(model, ok, 0)))
    with pytest.raises(ValueError, match=r"captured dropped the first 4 tokens .*prefix_size=0"):
        calibrate_predictors(model, None, q, PassthroughQuantizer(), captured=capture_kv(model, ok))
    with pytest.raises(ValueError, match="no layer-0 policy"):
        calibrate_predictors(model, [torch.randint(0, 128, (2, 20))], q, None, progress=False)
    with pytest.raises(ValueError, match="fit_inputs"):
        calibrate_predictors(
            model, [torch.randint(0, 128, (2, 20))], q, PassthroughQuantizer(), fit_inputs="x"
        )


# ----------------------------------------------------------------------------------------------------
# the cache
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 7, 16])
def test_identity_quantizer_cache_equals_dynamic_cache(model, ids, step) -> None:
    ids = ids[:, :40]  # 4 prefix tokens, chunks written at 16+ buffered tokens, a partial buffer at the end
    ref = model(input_ids=ids).logits
    cache = AquaKVCache(
        model.config,
        AquaPredictors.zeros(3, C),
        PassthroughQuantizer(None),
        PassthroughQuantizer(None),
        prefix_size=4,
        buffer_size=16,
    )
    got = feed(model, ids, cache, step)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert cache.get_seq_length() == 40 and len(cache.chunks) >= 1


def test_identity_quantizer_gqa_qwen_without_head_dim() -> None:
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=128, max_position_embeddings=128)  # fmt: skip
    m = Qwen2ForCausalLM(cfg).eval()
    cfg = copy.deepcopy(cfg)
    cfg.head_dim = None  # as in many Qwen configs: the cache infers hidden / heads
    ids = torch.randint(0, 128, (1, 50), generator=torch.Generator().manual_seed(3))
    cache = AquaKVCache(
        cfg,
        AquaPredictors.zeros(2, 32),
        PassthroughQuantizer(None),
        PassthroughQuantizer(None),
        prefix_size=2,
        buffer_size=8,
    )
    torch.testing.assert_close(feed(m, ids, cache, 7), m(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_one_shot_prefill_returns_originals_and_reads_are_repeatable(model, ids) -> None:
    q = HiggsQuantizer(2, 16, 64)
    cache = AquaKVCache(
        model.config, AquaPredictors.zeros(3, C), q, PassthroughQuantizer(), prefix_size=4, buffer_size=16
    )
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
    # the write step returns the unquantized states, so a one-shot prefill is exact
    torch.testing.assert_close(logits, model(input_ids=ids).logits, atol=1e-5, rtol=0)
    first, second = cache.read_chunks(), cache.read_chunks()
    assert all(torch.equal(a, b) for la, lb in zip(first[0], second[0]) for a, b in zip(la, lb))
    # the next step attends to the compressed chunk: close to, but not equal to, the uncompressed model
    nxt = torch.randint(0, 128, (2, 1))
    got = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits
    full = model(input_ids=torch.cat([ids, nxt], 1)).logits[:, -1:]
    assert 0 < float((got - full).detach().abs().max()) < 0.5 * float(full.detach().abs().max())


def test_memory_bits_matches_analytic_and_packed_tensors(model, ids) -> None:
    q = HiggsQuantizer(2, 16, 64)  # 2.25 bits/value for c = 64
    cache = AquaKVCache(
        model.config, AquaPredictors.zeros(3, C), q, PassthroughQuantizer(), prefix_size=4, buffer_size=16
    )
    feed(model, ids, cache, 16)  # 72 tokens: 4 prefix, chunks of 28 and 16+... see below
    b, n_layers = ids.shape[0], 3
    chunk_tokens = sum(c.length for c in cache.chunks)
    buffered = 72 - 4 - chunk_tokens
    packed = 0
    for chunk in cache.chunks:
        for layer, (ck, cv) in enumerate(chunk.codes):
            for code in (ck, cv):
                if layer == 0:  # layer 0 kept in float16
                    packed += code[0].numel() * 16
                else:
                    assert isinstance(code, HiggsCodes)
                    packed += sum(p.numel() * 32 for p in code.planes) + code.scale.numel() * 16
    analytic_chunks = 2 * b * chunk_tokens * C * (16 + (n_layers - 1) * q.bits_per_value)
    fp_part = 2 * n_layers * b * (4 + buffered) * C * 32  # float32 model: prefix + buffer in float32
    assert packed == analytic_chunks
    assert cache.memory_bits() == packed + fp_part
    assert cache.num_values() == 2 * n_layers * b * 72 * C
    assert cache.compressed_bits_per_value() == pytest.approx((16 + 2 * q.bits_per_value) / 3)


def test_generate_greedy(model) -> None:
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=0)
    ref = model.generate(prompt, **kw)
    fp16 = AquaKVCache(
        model.config,
        AquaPredictors.zeros(3, C),
        PassthroughQuantizer(),
        PassthroughQuantizer(),
        prefix_size=4,
        buffer_size=8,
    )
    assert torch.equal(model.generate(prompt, past_key_values=fp16, **kw), ref)
    assert len(fp16.chunks) >= 3  # the chunks were really written and read back
    aqua = AquaKVCache(
        model.config,
        AquaPredictors.zeros(3, C),
        HiggsQuantizer(2, 16, 64),
        PassthroughQuantizer(),
        prefix_size=4,
        buffer_size=8,
    )
    out = model.generate(prompt, past_key_values=aqua, **kw)
    assert out.shape == ref.shape and torch.equal(out[:, :12], prompt)


def test_cache_bad_inputs(model) -> None:
    from transformers import GPT2Config

    z, q, p = AquaPredictors.zeros(3, C), HiggsQuantizer(2, 16, 64), PassthroughQuantizer()
    with pytest.raises(ValueError, match="Llama/Mistral/Qwen-style RoPE decoder"):
        AquaKVCache(GPT2Config(), z, q, p)
    with pytest.raises(ValueError, match="buffer_size must be an int >= 1, got 0"):
        AquaKVCache(model.config, z, q, p, buffer_size=0)
    with pytest.raises(ValueError, match="no layer-0 policy"):
        AquaKVCache(model.config, z, q)
    with pytest.raises(TypeError, match="predictors must be AquaPredictors"):
        AquaKVCache(model.config, {}, q, p)


def test_evaluate_kv_compression_orders_methods(model) -> None:
    data = [torch.randint(0, 128, (2, 64), generator=torch.Generator().manual_seed(7))]
    fp = evaluate_kv_compression(
        model,
        lambda: AquaKVCache(
            model.config,
            AquaPredictors.zeros(3, C),
            PassthroughQuantizer(None),
            PassthroughQuantizer(None),
            buffer_size=16,
        ),
        data,
    )
    assert fp["kl"] == pytest.approx(0.0, abs=1e-9) and fp["ppl"] == pytest.approx(
        fp["ppl_reference"], rel=1e-6
    )
    two = evaluate_kv_compression(
        model,
        lambda: AquaKVCache(
            model.config,
            AquaPredictors.zeros(3, C),
            UniformQuantizer(2, 64),
            PassthroughQuantizer(),
            buffer_size=16,
        ),
        data,
    )
    four = evaluate_kv_compression(
        model,
        lambda: AquaKVCache(
            model.config,
            AquaPredictors.zeros(3, C),
            UniformQuantizer(4, 64),
            PassthroughQuantizer(),
            buffer_size=16,
        ),
        data,
    )
    assert 0 < four["kl"] < two["kl"]


# ----------------------------------------------------------------------------------------------------
# reproduction
# ----------------------------------------------------------------------------------------------------
def test_quick_reproduction(tmp_path) -> None:
    from icml25.llm_efficiency.experiments.aqua_kv import run

    rep = run(quick=True, seed=0, out_dir=tmp_path)
    m = rep.metrics
    assert len(rep.checks) == 4 and all(rep.checks.values())
    assert (
        m["key_ratio"] <= 0.5 and m["value_ratio"] <= 0.5
    )  # measured 0.39 / 0.097 (0.40 / 0.10 before issue 85)
    assert m["kl_ratio"] <= 0.6  # measured 0.16 (0.20 before issue 85)
    assert m["broken_ratio"] > 1.1  # measured 1.28 (1.30 before issue 85)
    assert m["uniform_kl"] > m["kl"] and m["uniform_key_rel_mse"] > m["key_rel_mse"]
    assert m["quantizer_bits_per_value"] == 2.125
    assert rep.passed and rep.paper == "P36" and all(f.exists() for f in rep.figures)
