"""Tests of P22 (Matryoshka-over-k SAE) and the shared SAE toolkit in icml25.interpretability.sae."""

from __future__ import annotations

import itertools
import json
import math
import struct
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.interpretability.sae import (
    ActivationNormalizer,
    BatchTopKSAE,
    MatryoshkaKSAE,
    MatryoshkaSAE,
    ReLUSAE,
    TopKSAE,
    from_saelens,
    fvu_auc_log2k,
    level_weights,
    msae_loss,
    nesting_list,
    nmse,
    pareto_curve,
    sae_metrics,
    sparse_dictionary_data,
    to_saelens,
    topk_relu,
    train_sae,
)
from icml25.interpretability.sae.saelens import SAELENS_FORMAT_VERSION, to_saelens_sae
from icml25.kernels.rng import global_rng_state


def _perturbed(model, seed=0, scale=0.3):
    """Give a freshly initialised model non-trivial biases so that tests exercise them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.b_enc.copy_(scale * torch.randn(model.d_sae, generator=g))
        model.b_dec.copy_(scale * torch.randn(model.d_in, generator=g))
        model.W_dec.mul_(1 + torch.rand(model.d_sae, 1, generator=g))  # unequal row norms
    return model


# ------------------------------------------------------------------------------------------------ top-k
def test_topk_keeps_exactly_k_entries_with_ties_and_relu_values():
    pre = torch.tensor([[1.0, 1.0, 1.0, 1.0, -2.0], [0.0, 0.0, 0.0, 0.0, 0.0], [3.0, -1.0, 2.0, -5.0, 1.0]])
    values, idx = topk_relu(pre, 3)
    assert values.shape == idx.shape == (3, 3)
    assert all(len(set(row.tolist())) == 3 for row in idx)  # k distinct indices even with ties
    torch.testing.assert_close(values, pre.gather(1, idx).relu())
    assert torch.equal(values[2].sort().values, torch.tensor([1.0, 2.0, 3.0]))


def test_encode_cap_has_k_nonzeros_when_preactivations_are_positive():
    torch.manual_seed(0)
    sae = TopKSAE(8, 32, k=4)
    with torch.no_grad():
        sae.b_enc.fill_(10.0)  # every pre-activation positive
    x = torch.randn(16, 8)
    for k in (1, 4, 7, 32):
        z = sae.encode(x, k)
        assert torch.all((z != 0).sum(-1) == k)
    assert torch.all((sae.encode(x) != 0).sum(-1) == 4)


# -------------------------------------------------------------------------------------------- MSAE core
def test_single_level_msae_equals_topk_sae_loss_and_grads():
    torch.manual_seed(0)
    topk = _perturbed(TopKSAE(12, 48, k=6))
    msae = MatryoshkaKSAE(12, 48, ks=[6])
    msae.load_state_dict(topk.state_dict())
    x = torch.randn(32, 12)
    l1, _ = topk.loss(x)
    l2, _ = msae.loss(x)
    torch.testing.assert_close(l1, l2, rtol=1e-6, atol=1e-7)
    g1 = torch.autograd.grad(l1, list(topk.parameters()))
    g2 = torch.autograd.grad(l2, list(msae.parameters()))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_nested_supports_and_relu_top_level():
    torch.manual_seed(1)
    msae = _perturbed(MatryoshkaKSAE(10, 40, ks=[2, 5, 11, 40]))
    x = torch.randn(25, 10)
    recons, latents = msae.forward_levels(x)
    assert len(recons) == len(latents) == 4
    for small, big in itertools.pairwise(latents):
        assert torch.all((small != 0) <= (big != 0))  # supp(z_{k_i}) ⊆ supp(z_{k_{i+1}})
    pre = msae.pre_activations(x)
    torch.testing.assert_close(latents[-1], pre.relu())
    for k, z, r in zip(msae.ks, latents, recons):
        assert torch.all((z != 0).sum(-1) <= k)
        torch.testing.assert_close(r, msae.decode(z), rtol=1e-5, atol=1e-5)  # prefix decode = dense decode
        torch.testing.assert_close(r, msae(x, k), rtol=1e-5, atol=1e-5)  # and = inference-time cap


@settings(max_examples=20, deadline=None)
@given(
    d=st.integers(1, 6),
    n=st.integers(2, 24),
    ks=st.lists(st.integers(1, 24), min_size=1, max_size=4, unique=True),
    seed=st.integers(0, 1000),
)
def test_property_msae_levels_equal_separate_topk_models(d, n, ks, seed):
    ks = sorted(min(k, n) for k in set(ks))
    ks = sorted(set(ks))
    torch.manual_seed(seed)
    msae = _perturbed(MatryoshkaKSAE(d, n, ks=ks), seed)
    x = torch.randn(7, d, dtype=torch.float32)
    recons, _ = msae.forward_levels(x)
    for k, r in zip(ks, recons):
        single = TopKSAE(d, n, k)
        single.load_state_dict(msae.state_dict())
        ref = single(x)
        # ties between equal pre-activations can pick different (equal-valued) latents: compare errors
        torch.testing.assert_close(r, ref, rtol=1e-4, atol=1e-4)


def test_level_weights_and_nesting_list():
    assert level_weights("UW", 4) == [1.0, 1.0, 1.0, 1.0]
    assert level_weights("RW", 4) == [4.0, 3.0, 2.0, 1.0]  # heaviest on the smallest k
    assert level_weights([0.5, 2.0], 2) == [0.5, 2.0]
    assert nesting_list(64, 6144) == [64, 128, 256, 512, 1024, 2048, 4096, 6144]
    assert nesting_list(4, 256) == [4, 8, 16, 32, 64, 128, 256]
    assert MatryoshkaKSAE(8, 64, ks=16).ks == [16, 32, 64]
    assert MatryoshkaSAE is MatryoshkaKSAE


def test_msae_loss_is_weighted_mean_of_level_nmse():
    torch.manual_seed(2)
    x = torch.randn(9, 5)
    recons = [x + 0.1 * i * torch.randn(9, 5) for i in range(1, 4)]
    w = [3.0, 2.0, 1.0]
    per_level = [((r - x) ** 2).mean(1).div((x**2).mean(1)).mean() for r in recons]
    expected = sum(wi * li for wi, li in zip(w, per_level)) / 6.0
    torch.testing.assert_close(msae_loss(recons, x, w), expected)
    torch.testing.assert_close(
        msae_loss(recons, x, w, kind="mse"), sum(wi * ((r - x) ** 2).mean() for wi, r in zip(w, recons)) / 6
    )
    msae = MatryoshkaKSAE(5, 20, ks=[2, 4, 20], weighting="RW")
    loss, _ = msae.loss(x)
    rec, _ = msae.forward_levels(x)
    torch.testing.assert_close(loss, msae_loss(rec, x, [3.0, 2.0, 1.0]))


# ---------------------------------------------------------------------------------- decoder normalisation
def test_decoder_normalisation_keeps_outputs_and_projection_is_orthogonal():
    torch.manual_seed(3)
    msae = _perturbed(MatryoshkaKSAE(6, 30, ks=[3, 30]))
    x = torch.randn(20, 6)
    before = msae(x)  # uncapped ReLU level
    msae.normalize_decoder_()
    torch.testing.assert_close(msae.W_dec.norm(dim=1), torch.ones(30), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(msae(x), before, rtol=1e-5, atol=1e-5)
    # With equal row norms (the init), top-k selection is unchanged too.
    topk = TopKSAE(6, 30, k=4)
    before_k = topk(x)
    topk.normalize_decoder_()
    torch.testing.assert_close(topk(x), before_k, rtol=1e-5, atol=1e-5)
    loss, _ = msae.loss(x)
    loss.backward()
    msae.project_decoder_grad_()
    dots = (msae.W_dec.grad * msae.W_dec).sum(dim=1)
    assert dots.abs().max() < 1e-6


# -------------------------------------------------------------------------------------------- metrics
def test_metric_identities():
    torch.manual_seed(4)
    x = torch.randn(50, 16)
    z = torch.relu(torch.randn(50, 32))
    m = sae_metrics(x, x, z)
    assert m["fvu"] == 0.0
    assert m["cosine"] == pytest.approx(1.0, abs=1e-12)
    assert m["explained_variance_batch"] == pytest.approx(1.0)
    per_sample_mean = x.mean(dim=1, keepdim=True).expand_as(x)
    assert sae_metrics(x, per_sample_mean, z)["fvu"] == pytest.approx(1.0, abs=1e-12)
    batch_mean = x.mean(dim=0, keepdim=True).expand_as(x)
    assert sae_metrics(x, batch_mean, z)["explained_variance_batch"] == pytest.approx(0.0, abs=1e-12)
    zs = torch.zeros(50, 32)
    zs[:, :3] = 1.0
    m = sae_metrics(x, x, zs)
    assert m["l0"] == 3.0
    assert m["sparsity"] == pytest.approx(1 - 3 / 32)
    assert m["dead_frac"] == pytest.approx(29 / 32)
    assert fvu_auc_log2k([4, 8, 16], [1.0, 0.5, 0.5]) == pytest.approx(0.75 + 0.5)


def test_pareto_curve_streams_like_one_batch():
    torch.manual_seed(5)
    sae = _perturbed(ReLUSAE(8, 24))
    X = torch.randn(101, 8)
    a = pareto_curve(sae, X, [3, None], batch_size=17)
    b = pareto_curve(sae, X, [3, None], batch_size=1000)
    for ra, rb in zip(a, b):
        assert ra["k"] == rb["k"]
        for key in ("fvu", "cosine", "l0", "dead_frac", "explained_variance_batch"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-9, abs=1e-12)
    z = sae.encode(X, 3)
    assert a[0]["fvu"] == pytest.approx(sae_metrics(X, sae.decode(z), z)["fvu"], rel=1e-6)


def test_normalizers():
    X, _ = sparse_dictionary_data(500, d=16, n_features=40, max_active=8, seed=0)
    msae = ActivationNormalizer("msae").fit(X)
    Xn = msae.transform(X)
    assert Xn.mean(0).abs().max() < 1e-5
    # scale = sqrt(d) / E||x - mu||^2  (the official code's mean *squared* norm)
    expected = math.sqrt(16) / float((X - X.mean(0)).pow(2).sum(1).mean())
    assert msae.scale_ == pytest.approx(expected, rel=1e-6)
    torch.testing.assert_close(msae.inverse_transform(Xn), X, rtol=1e-5, atol=1e-5)
    sl = ActivationNormalizer("saelens").fit(X)
    assert float(sl.transform(X).norm(dim=1).mean()) == pytest.approx(4.0, rel=1e-5)


def test_normalizer_not_fitted_is_scikit_learns_not_fitted_error():
    from sklearn.exceptions import NotFittedError

    message = r"^This ActivationNormalizer instance is not fitted yet \(no mean_, scale_\); call 'fit'"
    for method in ("transform", "inverse_transform"):
        with pytest.raises(NotFittedError, match=message) as err:
            getattr(ActivationNormalizer(), method)(torch.zeros(2, 3))
        assert isinstance(err.value, ValueError)  # what callers caught before
    with pytest.raises(NotFittedError, match=message):
        to_saelens(TopKSAE(3, 8, k=2, seed=0), normalizer=ActivationNormalizer())


def test_seeded_init_and_training_leave_the_global_rng_alone():
    before = global_rng_state()
    msae = MatryoshkaKSAE(12, 40, ks=[2, 8, 40], seed=3)
    topk = TopKSAE(12, 40, k=8, seed=3)
    assert global_rng_state() == before
    # One seed, one initial dictionary across the zoo (the reproduction relies on it).
    assert torch.equal(msae.W_dec, topk.W_dec) and torch.equal(msae.W_enc, topk.W_enc)
    assert not torch.equal(TopKSAE(12, 40, k=8, seed=4).W_dec, topk.W_dec)
    torch.manual_seed(3)  # seed=None draws from torch's global generator, like nn.Linear: the same stream
    assert torch.equal(TopKSAE(12, 40, k=8).W_dec, topk.W_dec)
    X = torch.randn(64, 12, generator=torch.Generator().manual_seed(0))
    before = global_rng_state()
    by_seed = train_sae(TopKSAE(12, 40, 4, seed=0), X, steps=3, batch_size=16, seed=5, progress=False)
    gen = torch.Generator().manual_seed(5)
    by_gen = train_sae(TopKSAE(12, 40, 4, seed=0), X, steps=3, batch_size=16, generator=gen, progress=False)
    assert global_rng_state() == before and by_seed["loss"] == by_gen["loss"]


# --------------------------------------------------------------------------------------- other SAEs
def test_batch_topk_training_and_threshold_inference():
    torch.manual_seed(6)
    sae = BatchTopKSAE(8, 32, k=3)
    x = torch.randn(10, 8)
    sae.train()
    with torch.no_grad():
        sae.b_enc.fill_(5.0)
    assert int((sae.encode(x) != 0).sum()) == 30  # B·k over the batch, not k per row
    sae.eval()
    with pytest.warns(UserWarning, match="batch of size 1"):
        sae.encode(x[:1])
    sae.loss(x)  # one training-statistics update learns the threshold
    theta = float(sae.threshold)
    assert theta > 0
    pre = sae.pre_activations(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(sae.encode(x[:1]), (pre[:1].relu() * (pre[:1] > theta)))


def test_auxk_loss_feeds_only_dead_latents():
    torch.manual_seed(7)
    sae = TopKSAE(8, 32, k=2, aux_k=4, dead_after=1)
    x = torch.randn(16, 8)
    with torch.no_grad():
        sae.samples_since_fired.zero_()
    pre = sae.pre_activations(x)
    assert float(sae.auxk_loss(pre, torch.randn(16, 8))) == 0.0  # nobody dead
    dead = torch.zeros(32, dtype=torch.bool)
    dead[:10] = True
    with torch.no_grad():
        sae.samples_since_fired[dead] = 5
    aux = sae.auxk_loss(sae.pre_activations(x), torch.randn(16, 8))
    assert float(aux.detach()) > 0
    (g_enc,) = torch.autograd.grad(aux, [sae.W_enc])
    assert g_enc[:, ~dead].abs().max() == 0
    assert g_enc[:, dead].abs().max() > 0
    _loss, logs = sae.loss(x)
    assert "aux" in logs


def test_training_reduces_loss_and_accepts_streams():
    X, _ = sparse_dictionary_data(2048, d=16, n_features=48, mean_active=3, max_active=8, seed=1)
    X = ActivationNormalizer("msae").fit_transform(X)
    torch.manual_seed(0)
    msae = MatryoshkaKSAE(16, 64, ks=[2, 8, 64])
    logs = train_sae(msae, X, steps=40, batch_size=128, lr=3e-3, progress=False)
    assert logs["loss"][-1] < 0.5 * logs["loss"][0]
    # constant for 80% of the steps (32), then linear decay to 0: the last step runs at lr / 8
    assert logs["lr"][31] == 3e-3 and logs["lr"][-1] == pytest.approx(3e-3 / 8)
    torch.testing.assert_close(msae.W_dec.norm(dim=1), torch.ones(64), rtol=1e-5, atol=1e-5)
    topk = TopKSAE(16, 64, k=4)
    stream = (X[i : i + 128] for i in range(0, 1536, 128))
    logs = train_sae(topk, stream, lr=3e-3, progress=False)
    assert len(logs["loss"]) == 12
    assert logs["loss"][-1] < logs["loss"][0]


# ---------------------------------------------------------------------------------------- SAELens
def _saelens_forward(state: dict, cfg: dict, x: torch.Tensor) -> torch.Tensor:
    """SAELens inference semantics (documented layout), written independently of from_saelens."""
    assert cfg["normalize_activations"] == "none"
    sae_in = x - state["b_dec"] * cfg["apply_b_dec_to_input"]
    pre = sae_in @ state["W_enc"] + state["b_enc"]
    if cfg["architecture"] == "topk":
        v, i = torch.topk(pre, cfg["k"], dim=-1)
        z = torch.zeros_like(pre).scatter(-1, i, v.relu())
    elif cfg["architecture"] == "jumprelu":
        z = pre * (pre > state["threshold"])
    else:
        z = pre.relu()
    return z @ state["W_dec"] + state["b_dec"]


@pytest.mark.parametrize("kind", ["topk", "msae", "msae_capped", "relu", "batchtopk"])
def test_saelens_round_trip_and_semantics(kind):
    torch.manual_seed(8)
    model = {
        "topk": lambda: TopKSAE(12, 40, k=5),
        "msae": lambda: MatryoshkaKSAE(12, 40, ks=[2, 8, 40]),
        "msae_capped": lambda: MatryoshkaKSAE(12, 40, ks=[2, 8, 40]),
        "relu": lambda: ReLUSAE(12, 40),
        "batchtopk": lambda: BatchTopKSAE(12, 40, k=4),
    }[kind]()
    _perturbed(model)
    x = torch.randn(30, 12)
    if kind == "batchtopk":
        model.loss(x)
    model.eval()
    k = 6 if kind == "msae_capped" else None
    state, cfg = to_saelens(model, k=k)
    assert cfg["architecture"] == {"topk": "topk", "msae_capped": "topk", "batchtopk": "jumprelu"}.get(
        kind, "standard"
    )
    assert state["W_enc"].shape == (12, 40) and state["W_dec"].shape == (40, 12)
    assert cfg["d_in"] == 12 and cfg["d_sae"] == 40 and cfg["apply_b_dec_to_input"] is True
    expected = model(x, k)
    torch.testing.assert_close(_saelens_forward(state, cfg, x), expected, rtol=1e-5, atol=1e-5)
    back = from_saelens(state, cfg)
    torch.testing.assert_close(back(x), expected, rtol=1e-5, atol=1e-5)
    if kind == "msae":
        assert isinstance(back, MatryoshkaKSAE) and back.ks == [2, 8, 40]


def test_saelens_export_folds_the_normalizer_and_import_handles_legacy_cfgs():
    torch.manual_seed(9)
    X = 3.0 + 2.0 * torch.randn(64, 12)
    norm = ActivationNormalizer("msae").fit(X)
    model = _perturbed(MatryoshkaKSAE(12, 40, ks=[4, 40])).eval()
    state, cfg = to_saelens(model, k=4, normalizer=norm)
    expected = norm.inverse_transform(model(norm.transform(X), 4))  # raw activations in and out
    torch.testing.assert_close(_saelens_forward(state, cfg, X), expected, rtol=1e-4, atol=1e-4)
    # Legacy (< v6) keys, no b_dec subtraction, and expected_average_only_in with its factor.
    topk = _perturbed(TopKSAE(12, 40, k=3)).eval()
    st, _ = to_saelens(topk)
    legacy = {"d_in": 12, "d_sae": 40, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 3}}
    legacy_state = dict(st, b_enc=st["b_enc"] - st["b_dec"] @ st["W_enc"])
    loaded = from_saelens(legacy_state, {**legacy, "apply_b_dec_to_input": False})
    torch.testing.assert_close(loaded(X), topk(X), rtol=1e-4, atol=1e-4)
    s = 0.25
    scaled = {
        "W_enc": st["W_enc"] / s,
        "b_enc": st["b_enc"],
        "W_dec": st["W_dec"] * s,
        "b_dec": st["b_dec"] * s,
    }
    loaded = from_saelens(
        scaled, {**legacy, "normalize_activations": "expected_average_only_in"}, norm_scaling_factor=s
    )
    torch.testing.assert_close(loaded(X), topk(X), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="norm_scaling_factor"):
        from_saelens(scaled, {**legacy, "normalize_activations": "expected_average_only_in"})


# SAELens' on-disk layout (sae-lens 6.54, read from its source: saes/sae.py SAE.save_model / load_from_disk,
# loading/pretrained_sae_loaders.py sae_lens_disk_loader): a folder with ``cfg.json`` and
# ``sae_weights.safetensors``; the config class of cfg["architecture"] takes the fields below (other keys
# are dropped), the weights are the inference SAE's parameters, cast to cfg["dtype"].
_SAELENS_BASE_FIELDS = {
    "d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input", "normalize_activations",
    "reshape_activations", "metadata",
}  # fmt: skip
_SAELENS_FIELDS = {
    "standard": _SAELENS_BASE_FIELDS,
    "topk": _SAELENS_BASE_FIELDS | {"k", "rescale_acts_by_decoder_norm"},
    "jumprelu": _SAELENS_BASE_FIELDS,
}
_SAELENS_PARAMS = {
    "standard": {"W_enc", "b_enc", "W_dec", "b_dec"},
    "topk": {"W_enc", "b_enc", "W_dec", "b_dec"},
    "jumprelu": {"W_enc", "b_enc", "W_dec", "b_dec", "threshold"},
}
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16"}


def _write_safetensors(path, tensors: dict[str, torch.Tensor]) -> None:
    """The safetensors format: u64 little-endian header size, JSON header, then the raw little-endian data."""
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }  # fmt: skip
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(chunks))


def _read_safetensors(path) -> dict[str, torch.Tensor]:
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    header.pop("__metadata__", None)
    np_dtypes = {"F32": np.float32, "F64": np.float64, "F16": np.float16}
    out = {}
    for name, info in header.items():
        lo, hi = info["data_offsets"]
        arr = np.frombuffer(blob[8 + n + lo : 8 + n + hi], dtype=np_dtypes[info["dtype"]])
        out[name] = torch.from_numpy(arr.copy()).reshape(info["shape"])
    return out


@pytest.mark.parametrize("kind", ["topk", "msae", "msae_capped", "batchtopk"])
def test_saelens_on_disk_format(kind, tmp_path):
    """Export, save in SAELens' folder layout, reload with SAELens' rules: same SAE, without sae-lens."""
    torch.manual_seed(10)
    model, k = {
        "topk": (TopKSAE(12, 40, k=5), None),
        "msae": (MatryoshkaKSAE(12, 40, ks=[2, 40]), None),
        "msae_capped": (MatryoshkaKSAE(12, 40, ks=[2, 40]), 7),
        "batchtopk": (BatchTopKSAE(12, 40, k=4), None),
    }[kind]
    _perturbed(model)
    x = torch.randn(9, 12)
    if kind == "batchtopk":
        model.loss(torch.randn(30, 12))  # learns the inference threshold
    model.eval()
    state, cfg = to_saelens(model, k=k)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))  # must be JSON as it stands
    _write_safetensors(tmp_path / "sae_weights.safetensors", state)

    loaded_cfg = json.loads((tmp_path / "cfg.json").read_text())
    arch = loaded_cfg["architecture"]
    assert set(loaded_cfg) - {"architecture"} == _SAELENS_FIELDS[arch]  # every field read, none dropped
    assert loaded_cfg["dtype"] in {"float32", "float64", "float16", "bfloat16"}
    assert loaded_cfg["normalize_activations"] == "none" and loaded_cfg["reshape_activations"] == "none"
    if arch == "topk":
        assert loaded_cfg["k"] == (k or model.k) and loaded_cfg["rescale_acts_by_decoder_norm"] is False
    weights = _read_safetensors(tmp_path / "sae_weights.safetensors")
    assert set(weights) == _SAELENS_PARAMS[arch]
    assert weights["W_enc"].shape == (12, 40) and weights["W_dec"].shape == (40, 12)
    assert weights["b_enc"].shape == (40,) and weights["b_dec"].shape == (12,)
    for name, t in weights.items():
        assert torch.equal(t, state[name]), name  # the values survive the file, bit for bit
    # SAELens' forward on the reloaded files, and our importer, both give the model's output.
    torch.testing.assert_close(_saelens_forward(weights, loaded_cfg, x), model(x, k), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(from_saelens(weights, loaded_cfg)(x), model(x, k), rtol=1e-5, atol=1e-5)


# SAELens' config path of SAE.load_from_disk (sae-lens 6.x, read from its source: loading/
# pretrained_sae_loaders.py handle_config_defaulting / handle_pre_6_0_config, saes/sae.py SAEConfig.from_dict):
# a cfg without "sae_lens_version" (top level or in metadata) is taken as pre-6.0 and its metadata is
# rebuilt from these top-level LLM keys only; otherwise metadata is kept as written (SAEMetadata(**metadata)).
_SAELENS_LLM_METADATA_KEYS = {
    "model_name", "hook_name", "model_class_name", "hook_head_index", "model_from_pretrained_kwargs",
    "prepend_bos", "exclude_special_tokens", "neuronpedia_id", "context_size", "seqpos_slice", "dataset_path",
    "sae_lens_version", "sae_lens_training_version", "hook_name_out", "hook_head_index_out",
}  # fmt: skip


def _saelens_loaded_cfg(cfg_json: dict) -> dict:
    version = cfg_json.get("sae_lens_version") or (cfg_json.get("metadata") or {}).get("sae_lens_version")
    cfg = {
        k: v for k, v in cfg_json.items() if k in _SAELENS_FIELDS[cfg_json["architecture"]] | {"architecture"}
    }
    if not version or int(str(version).split(".")[0]) < 6:
        cfg["metadata"] = {k: v for k, v in cfg_json.items() if k in _SAELENS_LLM_METADATA_KEYS}
    return cfg


@pytest.mark.parametrize("weighting", ["UW", "RW", [3.0, 1.0, 0.5]])
def test_saelens_loader_keeps_the_msae_levels(weighting, tmp_path):
    model = _perturbed(MatryoshkaKSAE(12, 40, ks=[2, 8, 40], weighting=weighting, seed=11)).eval()
    state, cfg = to_saelens(model)
    assert cfg["metadata"]["sae_lens_version"] == SAELENS_FORMAT_VERSION == "6.0.0"
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    loaded = _saelens_loaded_cfg(json.loads((tmp_path / "cfg.json").read_text()))
    assert loaded["metadata"]["msae_ks"] == [2, 8, 40]
    before = global_rng_state()
    back = from_saelens(state, loaded)
    assert global_rng_state() == before  # the rebuilt model's weights come from the file, not the global RNG
    assert isinstance(back, MatryoshkaKSAE) and back.ks == model.ks and back.weights == model.weights
    x = torch.randn(9, 12, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(back(x), model(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(back.loss(x)[0], model.loss(x)[0], rtol=1e-5, atol=1e-6)  # training resumes
    # Without the version, SAELens' loader drops our metadata and the import falls back to a plain ReLU SAE.
    unversioned = {**cfg, "metadata": {k: v for k, v in cfg["metadata"].items() if k != "sae_lens_version"}}
    assert "msae_ks" not in _saelens_loaded_cfg(unversioned)["metadata"]
    assert type(from_saelens(state, _saelens_loaded_cfg(unversioned))) is ReLUSAE


def test_saelens_round_trip_through_sae_lens(tmp_path):
    """With sae-lens installed: SAE.save_model / SAE.load_from_disk keep the MSAE levels and the outputs."""
    sae_lens = pytest.importorskip("sae_lens")
    model = _perturbed(MatryoshkaKSAE(12, 40, ks=[2, 8, 40], weighting="RW", seed=12)).eval()
    to_saelens_sae(model).save_model(tmp_path)
    loaded = sae_lens.SAE.load_from_disk(tmp_path)
    assert loaded.cfg.metadata["msae_ks"] == [2, 8, 40]
    x = torch.randn(9, 12, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-5)
    back = from_saelens(dict(loaded.state_dict()), loaded.cfg.to_dict())
    assert isinstance(back, MatryoshkaKSAE) and back.ks == [2, 8, 40] and back.weighting == "RW"
    torch.testing.assert_close(back(x), model(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ bad inputs
def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 32\], got 33"):
        TopKSAE(8, 32, k=33)
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 32\], got 0"):
        TopKSAE(8, 32, k=0)
    with pytest.raises(ValueError, match=r"ks\[1\] must be an int in \[1, 32\], got 64"):
        MatryoshkaKSAE(8, 32, ks=[4, 64])
    with pytest.warns(UserWarning, match="sorted, de-duplicated"):
        assert MatryoshkaKSAE(8, 32, ks=[16, 4, 4, 32]).ks == [4, 16, 32]
    with pytest.raises(ValueError, match="one weight per level"):
        MatryoshkaKSAE(8, 32, ks=[4, 32], weighting=[1.0])
    with pytest.raises(ValueError, match="weighting must be one of"):
        MatryoshkaKSAE(8, 32, ks=[4, 32], weighting="XW")
    sae = MatryoshkaKSAE(8, 32, ks=[4, 32])
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., d_in=8\], got \(5, 7\)"):
        sae(torch.randn(5, 7))
    with pytest.raises(ValueError, match="x must be finite"):
        sae.loss(torch.full((3, 8), float("nan")))
    with pytest.raises(TypeError, match="floating-point"):
        sae(torch.ones(3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"d_in=8"):
        sae(torch.tensor(1.0))
    assert sae(torch.randn(2, 3, 8)).shape == (2, 3, 8)  # [..., d] is flattened and restored
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 32\]"):
        sae.encode(torch.randn(2, 8), k=40)
    with pytest.raises(ValueError, match="steps must be given"):
        train_sae(sae, torch.randn(10, 8))
    with pytest.raises(ValueError, match="kind must be one of"):
        msae_loss([torch.zeros(2, 8)], torch.ones(2, 8), [1.0], kind="l2")
    with pytest.raises(ValueError, match="z must be a tensor of shape"):
        sae.decode(torch.zeros(2, 31))
    with pytest.raises(ValueError, match="BatchTopKSAE without a learned threshold"):
        to_saelens(BatchTopKSAE(8, 32, 4))
    assert float(nmse(torch.zeros(2, 3), torch.zeros(2, 3))) == 0.0  # no division by zero


# ------------------------------------------------------------------------------------ reproduction
@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    from icml25.interpretability.experiments.matryoshka_sae import run

    return run(quick=True, seed=0, out_dir=tmp_path_factory.mktemp("p22"))


def test_quick_reproduction_passes(quick_report):
    r = quick_report
    m = r.metrics
    assert r.paper == "P22"
    # Our CPU-scale quick bars: AUC ratio <= 0.95, FVU@8 ratio <= 1.5 (cosine reported, not gated).
    assert r.checks == {
        "AUC(FVU vs log2 k, k=4..64): MSAE-UW <= 0.95 x best TopK": True,
        "FVU@8(MSAE-UW) <= 1.5 x TopK-8": True,
    }
    assert m["auc_ratio_msae_uw_vs_best_topk"] <= 0.95
    assert m["fvu_k8_ratio_msae_uw_vs_topk8"] <= 1.5
    assert m["msae_uw_cosine_uncapped"] >= 0.95
    assert r.passed
    # A single-k TopK degrades away from its training k; MSAE does not.
    assert m["topk8_fvu_k64"] > m["topk8_fvu_k8"]
    assert m["msae_uw_fvu_k64"] < m["msae_uw_fvu_k8"] < m["msae_uw_fvu_k4"]
    assert [p.name for p in r.figures] == ["p22_matryoshka_sae_pareto.png"]
    assert r.figures[0].stat().st_size > 10_000


def test_threshold_text_is_the_recorded_rule():
    from icml25.interpretability.experiments import matryoshka_sae

    assert matryoshka_sae.threshold(quick=True) == (
        "AUC(FVU vs log2 k, k=4..64): MSAE-UW <= 0.95 x best TopK; FVU@8(MSAE-UW) <= 1.5 x TopK-8"
    )
    assert matryoshka_sae.threshold(quick=False) == (
        "AUC(FVU vs log2 k, k=4..64): MSAE-UW <= 0.85 x best TopK; FVU@8(MSAE-UW) <= 1.3 x TopK-8; "
        "MSAE beats ReLU SAE at matched L0; uncapped MSAE cosine >= 0.95"
    )
