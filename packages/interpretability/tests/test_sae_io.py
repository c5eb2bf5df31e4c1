"""SAE persistence and training feedback (P22 toolkit): ``save``/``load`` round-trip every SAE class bit for
bit through safetensors + JSON, with clear errors on bad folders; ``train_sae`` logs one line per phase and
shows its progress bar by default only in a terminal, once a fit has run a few seconds."""

from __future__ import annotations

import copy
import io
import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

import icml25.interpretability.sae.training as training_module
from icml25.interpretability.sae import (
    ActivationNormalizer,
    BatchTopKSAE,
    MatryoshkaKSAE,
    MatryoshkaSAE,
    ReLUSAE,
    SparseAutoencoder,
    TopKSAE,
    train_sae,
)
from icml25.kernels.rng import global_rng_state

D, N = 6, 20
_X = torch.randn(64, D, generator=torch.Generator().manual_seed(1))

MODELS = {
    "topk": lambda: TopKSAE(
        D, N, 3, aux_k=4, aux_coef=0.1, dead_after=5, loss_kind="mse", init_norm=0.5, seed=1
    ),
    "batchtopk": lambda: BatchTopKSAE(D, N, 3, threshold_momentum=0.9, seed=1),
    "relu": lambda: ReLUSAE(D, N, l1_coef=0.01, seed=1),
    "msae_uw": lambda: MatryoshkaKSAE(D, N, ks=[2, 5, N], seed=1),
    "msae_rw_k0": lambda: MatryoshkaSAE(D, N, ks=2, weighting="RW", seed=1),
    "msae_custom": lambda: MatryoshkaKSAE(D, N, ks=[2, 4], weighting=[0.25, 0.75], seed=1),
    "msae_float64": lambda: MatryoshkaKSAE(D, N, ks=[3, N], seed=1).double(),
}


def _trained(kind: str) -> SparseAutoencoder:
    """A model whose parameters and buffers all differ from a fresh one (a few steps, a learned threshold)."""
    model = MODELS[kind]()
    train_sae(model, _X.to(model.W_enc.dtype), steps=6, batch_size=16, lr=1e-2, seed=0, progress=False)
    model.samples_since_fired.copy_(torch.arange(N) % 3 * 7)  # some latents "dead" (dead_after=5 for AuxK)
    return model


def _assert_same_model(a: SparseAutoencoder, b: SparseAutoencoder) -> None:
    assert type(a) is type(b) and a.config() == b.config()
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key
    x = _X[:9].to(a.W_enc.dtype)
    a.eval(), b.eval()
    for k in (None, 2):
        assert torch.equal(a.encode(x, k), b.encode(x, k))
        assert torch.equal(a(x, k), b(x, k))
    z = a.encode(x)
    assert torch.equal(a.decode(z), b.decode(z))
    ca, cb = copy.deepcopy(a), copy.deepcopy(b)  # loss advances the counters (and BatchTopK's threshold)
    assert torch.equal(ca.loss(x)[0], cb.loss(x)[0])
    assert all(torch.equal(u, v) for u, v in zip(ca.state_dict().values(), cb.state_dict().values()))


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_save_load_round_trips_bit_exactly(kind, tmp_path):
    model = _trained(kind)
    if isinstance(model, BatchTopKSAE):
        assert float(model.threshold) > 0  # a learned inference threshold, saved as a buffer
    folder = model.save(tmp_path / "sae")
    assert folder == tmp_path / "sae"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    header = json.loads((folder / "config.json").read_text())
    assert header["class"] == type(model).__name__ and header["config"] == model.config()
    assert header["dtype"] == ("float64" if kind == "msae_float64" else "float32")
    assert header["format"] == "icml25.interpretability.sae" and header["version"] == 1
    assert set(load_file(str(folder / "model.safetensors"))) == set(model.state_dict())
    # the config rebuilds the architecture: type(m)(**m.config())
    assert type(model)(**model.config(), seed=0).config() == model.config()

    before = global_rng_state()
    loaded = SparseAutoencoder.load(folder)  # the base class rebuilds whichever class was saved
    assert global_rng_state() == before  # building the model drew its throwaway init privately
    assert not loaded.training
    _assert_same_model(model, loaded)
    _assert_same_model(model, type(model).load(str(folder)))  # own class, str path
    again = loaded.save(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert (again / "config.json").read_text() == (folder / "config.json").read_text()


def test_config_keeps_the_hyper_parameters():
    assert MODELS["topk"]().config() == {
        "d_in": D, "d_sae": N, "loss_kind": "mse", "init_norm": 0.5, "k": 3, "aux_k": 4, "aux_coef": 0.1,
        "dead_after": 5,
    }  # fmt: skip
    assert MODELS["msae_rw_k0"]().config()["ks"] == [2, 4, 8, 16, N]
    assert MODELS["msae_custom"]().config()["weighting"] == [0.25, 0.75]
    assert MODELS["batchtopk"]().config()["threshold_momentum"] == 0.9
    assert MODELS["relu"]().config()["l1_coef"] == 0.01


def test_normalizer_is_saved_with_the_model(tmp_path):
    model = _trained("msae_uw")
    raw = _X * 3.0 + 1.5
    norm = ActivationNormalizer("msae").fit(raw)
    model.save(tmp_path / "with", normalizer=norm)
    back = SparseAutoencoder.load_normalizer(tmp_path / "with")
    assert back is not None and back.method == "msae" and back.scale_ == norm.scale_
    assert torch.equal(back.mean_, norm.mean_) and torch.equal(back.transform(raw), norm.transform(raw))
    _assert_same_model(model, MatryoshkaKSAE.load(tmp_path / "with"))  # the extra tensor is not a weight
    model.save(tmp_path / "without")
    assert SparseAutoencoder.load_normalizer(tmp_path / "without") is None
    with pytest.raises(TypeError, match="normalizer must be an ActivationNormalizer, got str"):
        model.save(tmp_path / "bad", normalizer="msae")
    with pytest.raises(ValueError, match="not fitted"):
        model.save(tmp_path / "bad", normalizer=ActivationNormalizer())
    with pytest.raises(ValueError, match=r"normalizer was fitted on d=3 features, model has d_in=6"):
        model.save(tmp_path / "bad", normalizer=ActivationNormalizer().fit(torch.randn(8, 3)))


def _edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    header = json.loads(path.read_text())
    for key, value in changes.items():
        if key.startswith("config__"):
            header["config"][key.removeprefix("config__")] = value
        else:
            header[key] = value
    path.write_text(json.dumps(header))


def test_load_errors_are_clear(tmp_path):
    model = _trained("topk")
    folder = model.save(tmp_path / "topk")
    with pytest.raises(FileNotFoundError, match="does not exist: expected a folder written by"):
        SparseAutoencoder.load(tmp_path / "nowhere")
    with pytest.raises(NotADirectoryError, match="got the file"):
        SparseAutoencoder.load(folder / "config.json")
    with pytest.raises(NotADirectoryError, match="must be a folder"):
        model.save(folder / "config.json")
    with pytest.raises(TypeError, match=r"path must be a str or os.PathLike folder, got int"):
        SparseAutoencoder.load(3)
    # a saved SAE of another class
    with pytest.raises(ValueError, match=r"holds a TopKSAE, not a ReLUSAE: load it with TopKSAE.load"):
        ReLUSAE.load(folder)
    with pytest.raises(ValueError, match="not a MatryoshkaKSAE"):
        MatryoshkaKSAE.load(folder)

    def broken(name, edit):
        copy = model.save(tmp_path / name)
        edit(copy)
        return copy

    # the config and the tensors disagree
    wide = broken("wide", lambda f: _edit_config(f, config__d_in=D + 1))
    with pytest.raises(
        ValueError, match=r"tensor 'W_dec' has shape \(20, 6\), but the config \(TopKSAE, d_in=7"
    ):
        TopKSAE.load(wide)
    relu = broken(
        "relu_cfg", lambda f: _edit_config(f, **{"class": "ReLUSAE", "config": ReLUSAE(D, N).config()})
    )
    assert isinstance(SparseAutoencoder.load(relu), ReLUSAE)  # same tensors: a consistent ReLU SAE
    batch = broken("batch_cfg", lambda f: _edit_config(f, **{"class": "BatchTopKSAE"}))
    with pytest.raises(
        ValueError, match=r"config that BatchTopKSAE rejects: .*unexpected keyword argument 'aux_k'"
    ):
        SparseAutoencoder.load(batch)
    with pytest.raises(
        ValueError, match=r"config that TopKSAE rejects: k must be an int in \[1, 20\], got 99"
    ):
        SparseAutoencoder.load(broken("big_k", lambda f: _edit_config(f, config__k=99)))
    with pytest.raises(ValueError, match="unknown SAE class 'GPT2'"):
        SparseAutoencoder.load(broken("unknown", lambda f: _edit_config(f, **{"class": "GPT2"})))
    with pytest.raises(ValueError, match="dtype must be one of"):
        SparseAutoencoder.load(broken("dtype", lambda f: _edit_config(f, dtype="int8")))

    def drop_tensor(f):
        tensors = load_file(str(f / "model.safetensors"))
        del tensors["b_enc"]
        tensors["extra"] = torch.zeros(2)
        save_file(tensors, str(f / "model.safetensors"))

    with pytest.raises(ValueError, match=r"missing \['b_enc'\], unexpected \['extra'\]"):
        SparseAutoencoder.load(broken("drop", drop_tensor))
    # not this format at all
    with pytest.raises(ValueError, match=r"must have format 'icml25.interpretability.sae', got 'other'"):
        SparseAutoencoder.load(broken("format", lambda f: _edit_config(f, format="other")))
    with pytest.raises(ValueError, match=r"format version 2; .* reads versions 1..1"):
        SparseAutoencoder.load(broken("version", lambda f: _edit_config(f, version=2)))
    with pytest.raises(ValueError, match="is not valid JSON"):
        SparseAutoencoder.load(broken("json", lambda f: (f / "config.json").write_text("{")))
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        SparseAutoencoder.load(broken("st", lambda f: (f / "model.safetensors").write_bytes(b"junk")))
    with pytest.raises(FileNotFoundError, match=r"has no model.safetensors"):
        SparseAutoencoder.load(broken("nofile", lambda f: (f / "model.safetensors").unlink()))


# ------------------------------------------------------------------------------- logging and progress
def test_training_logs_one_line_per_phase(caplog):
    model = MatryoshkaKSAE(D, N, ks=[2, N], seed=0)
    with caplog.at_level(logging.DEBUG, logger="icml25.interpretability"):
        train_sae(model, _X, steps=40, batch_size=16, seed=0, progress=False, desc="P22 test")
    messages = [r.getMessage() for r in caplog.records if r.name == "icml25.interpretability.sae.training"]
    assert len(messages) == 3 and all(r.levelno == logging.INFO for r in caplog.records)  # nothing per step
    assert (
        messages[0]
        == "P22 test: training MatryoshkaKSAE (d_in=6, d_sae=20) for 40 steps, batch 16, lr 0.0001"
    )
    assert messages[1].startswith("P22 test: step 32, loss ") and messages[1].endswith(
        "linear LR decay to 0 from here"
    )
    assert messages[2].startswith("P22 test: done, 40 steps, 10 epochs, final loss ")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="icml25.interpretability"):  # a stream, no LR decay phase
        train_sae(model, iter([_X[:16], _X[16:32]]), decay_start=1.0, progress=False)
    messages = [r.getMessage() for r in caplog.records if r.name == "icml25.interpretability.sae.training"]
    assert len(messages) == 2 and "for all stream steps, batch as streamed" in messages[0]
    assert messages[1].startswith("MatryoshkaKSAE: done, 2 steps, final loss ")


class _FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_defaults_on_in_a_terminal_after_a_delay(monkeypatch):
    assert train_sae.__kwdefaults__["progress"] is None
    with pytest.raises(TypeError, match="progress must be True, False or None, got str 'yes'"):
        train_sae(TopKSAE(D, N, 3, seed=0), _X, steps=2, progress="yes")

    def bar_output(progress, ci: bool) -> str:
        fake = _FakeTTY()
        monkeypatch.setattr("sys.stderr", fake)
        if ci:
            monkeypatch.setenv("CI", "true")
        else:
            monkeypatch.delenv("CI", raising=False)
        kwargs = {} if progress == "default" else {"progress": progress}
        train_sae(TopKSAE(D, N, 3, seed=0), _X, steps=3, batch_size=16, desc="SAE-bar", **kwargs)
        monkeypatch.undo()
        return fake.getvalue()

    assert "SAE-bar" in bar_output(True, ci=True)  # forced on, even in CI
    assert bar_output(False, ci=False) == ""
    assert bar_output("default", ci=True) == ""  # auto: quiet in CI
    assert bar_output("default", ci=False) == ""  # auto in a terminal: a short fit ends before the delay
    monkeypatch.setattr(training_module, "AUTO_PROGRESS_DELAY", 0.0)
    assert "SAE-bar" in bar_output("default", ci=False)  # auto in a terminal: shown once the delay passed
