"""Tests of P13 SLWS: the layer-wise shuffle (restoration, schedules, frequencies, residual stream,
per-sample permutations), the VimTiny backbone, the transformers Mamba integration, bad inputs and the
quick reproduction with its broken variant."""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import replace

import pytest
import torch
from torch import nn

from icml25.llm_efficiency import (
    StochasticLayerShuffle,
    VimTiny,
    apply_slws,
    constant_shuffle_schedule,
    linear_shuffle_schedule,
    shuffle_forward,
)
from icml25.llm_efficiency.experiments import slws as exp


def _x(B=3, L=7, d=4, seed=0):
    return torch.randn(B, L, d, generator=torch.Generator().manual_seed(seed))


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


class CumSum(nn.Module):
    """An order-dependent layer: a cumulative sum over the sequence."""

    def forward(self, x):
        return torch.cumsum(x, dim=1)


class ResidualBlock(nn.Module):
    """The pre-norm Mamba API: (hidden, residual) -> (hidden', residual'), order dependent."""

    def forward(self, hidden, residual=None):
        residual = hidden if residual is None else residual + hidden
        return torch.cumsum(residual, dim=1) * 0.1, residual


# ---------------------------------------------------------------------------------------- §7 restoration
def test_identity_layer_prob_one_is_bit_exact():
    x = _x()
    out = shuffle_forward(nn.Identity(), x, prob=1.0, training=True, generator=_gen())
    assert torch.equal(out, x)


def test_positionwise_layer_equals_unshuffled():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    x = _x(L=11)
    for per_sample in (False, True):
        out = shuffle_forward(mlp, x, prob=1.0, training=True, generator=_gen(1), per_sample=per_sample)
        torch.testing.assert_close(out, mlp(x), rtol=0, atol=1e-6)


def test_order_dependent_layer_equals_cumsum_of_permuted_then_restored():
    x = _x(L=9)
    out = shuffle_forward(CumSum(), x, prob=1.0, training=True, generator=_gen(2))
    g = _gen(2)
    assert bool(torch.rand((), generator=g) < 1.0)  # the Bernoulli draw comes first
    perm = torch.randperm(9, generator=g)
    expected = torch.cumsum(x[:, perm], dim=1)[:, torch.argsort(perm)]
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert not torch.allclose(out, torch.cumsum(x, dim=1))


def test_residual_stream_is_permuted_and_restored_consistently():
    x, r = _x(L=8, seed=3), _x(L=8, seed=4)
    h, res = shuffle_forward(ResidualBlock(), x, prob=1.0, training=True, residual=r, generator=_gen(5))
    g = _gen(5)
    torch.rand((), generator=g)
    perm = torch.randperm(8, generator=g)
    inv = torch.argsort(perm)
    eh, er = ResidualBlock()(x[:, perm], residual=r[:, perm])
    torch.testing.assert_close(h, eh[:, inv], rtol=0, atol=0)
    torch.testing.assert_close(res, er[:, inv], rtol=0, atol=0)
    torch.testing.assert_close(res, x + r, rtol=0, atol=0)  # the residual sum is token-wise: order restored


def test_per_sample_permutations_are_independent_and_restored():
    B, L = 6, 10
    x = torch.arange(L, dtype=torch.float32).view(1, L, 1).expand(B, L, 1).contiguous()
    seen = {}

    def spy(t):
        seen["perm"] = t[..., 0].long().clone()
        return t * 2

    out = shuffle_forward(spy, x, prob=1.0, training=True, generator=_gen(6), per_sample=True)
    perms = seen["perm"]
    assert all(sorted(p.tolist()) == list(range(L)) for p in perms)
    assert len({tuple(p.tolist()) for p in perms}) == B  # each row its own permutation
    torch.testing.assert_close(out, x * 2, rtol=0, atol=0)
    shuffle_forward(spy, x, prob=1.0, training=True, generator=_gen(6))  # official: one for the batch
    assert len({tuple(p.tolist()) for p in seen["perm"]}) == 1


def test_keep_first_pins_the_class_token():
    x = torch.arange(6, dtype=torch.float32).view(1, 6, 1).expand(4, 6, 1).contiguous()
    seen = {}

    def spy(t):
        seen["t"] = t.clone()
        return t

    for seed in range(5):
        shuffle_forward(spy, x, prob=1.0, training=True, generator=_gen(seed), per_sample=True, keep_first=1)
        assert torch.all(seen["t"][:, 0, 0] == 0)


def test_eval_mode_and_prob_zero_equal_the_bare_model():
    torch.manual_seed(0)
    layers = nn.ModuleList([CumSum(), nn.Linear(4, 4), CumSum()])
    x = _x()

    def run(ls):
        h = x
        for layer in ls:
            h = layer(h)
        return h

    bare = run(layers)
    wrapped = StochasticLayerShuffle(layers, 1.0, "constant", generator=_gen())
    wrapped.eval()
    assert torch.equal(run(wrapped), bare)
    zero = StochasticLayerShuffle(wrapped.unwrap(), 0.0, generator=_gen()).train()
    assert torch.equal(run(zero), bare)


def test_vimtiny_eval_identical_with_and_without_wrapper_and_train_differs():
    plain = VimTiny(d_model=16, depth=3, d_state=4, drop_path=0.0, seed=0)
    shuf = VimTiny(
        d_model=16, depth=3, d_state=4, drop_path=0.0, shuffle_rate=1.0, schedule="constant", seed=0
    )
    for (k, a), b in zip(plain.state_dict().items(), shuf.state_dict().values()):  # same init from the seed
        assert torch.equal(a, b), k
    x = torch.rand(4, 1, 8, 8, generator=_gen(7))
    plain.eval(), shuf.eval()
    with torch.no_grad():
        assert torch.equal(plain(x), shuf(x))
        plain.train(), shuf.train()
        assert not torch.allclose(plain(x), shuf(x))  # every layer shuffles an order-dependent scan
    assert shuf.layers.probs == [1.0, 1.0, 1.0]


def test_vimtiny_gradients_flow_through_shuffled_layers():
    m = VimTiny(d_model=8, depth=2, d_state=2, shuffle_rate=1.0, schedule="constant", seed=1).train()
    loss = m(torch.rand(3, 1, 8, 8, generator=_gen(8))).logsumexp(-1).sum()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


# ------------------------------------------------------------------------------------------- schedules
def test_linear_schedule_endpoints_and_monotone():
    s = linear_shuffle_schedule(24, 0.5)
    assert s[0] == 0.0 and s[-1] == 0.5 and len(s) == 24
    assert all(a <= b for a, b in itertools.pairwise(s))
    assert s == pytest.approx([0.5 * i / 23 for i in range(24)], abs=1e-12)
    assert linear_shuffle_schedule(1, 0.3) == [0.0]
    assert constant_shuffle_schedule(3, 0.2) == [0.2, 0.2, 0.2]
    assert StochasticLayerShuffle([nn.Identity()] * 3, 0.4, lambda n, p: [p / 2] * n).probs == [0.2] * 3


def test_empirical_shuffle_frequency_within_three_sigma():
    depth, n = 5, 2000
    counts = [0] * depth

    class Probe(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.i = i

        def forward(self, x):
            counts[self.i] += int(not torch.equal(x, base))
            return x

    base = torch.arange(16, dtype=torch.float32).view(1, 16, 1)
    stack = StochasticLayerShuffle([Probe(i) for i in range(depth)], 0.8, generator=_gen(9)).train()
    for _ in range(n):
        for layer in stack:
            layer(base)
    for p, c in zip(stack.probs, counts):
        # a shuffle draw can return the identity permutation (prob 1/16!): negligible
        sigma = math.sqrt(max(n * p * (1 - p), 1e-12))
        assert abs(c - n * p) <= 3 * sigma + 1e-9, (p, c)


# ------------------------------------------------------------------------------------ HF integration
def _tiny_mamba(cls_name="MambaModel"):
    transformers = pytest.importorskip("transformers")
    config = transformers.MambaConfig(
        vocab_size=32, hidden_size=16, state_size=4, num_hidden_layers=3, expand=2, conv_kernel=4
    )
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(config)


def test_hf_mamba_model_layers_wrapped_eval_identical_train_restored():
    from icml25.llm_efficiency.slws import apply_slws_hf

    bare = _tiny_mamba()
    model = _tiny_mamba()
    ids = torch.randint(0, 32, (2, 9), generator=_gen(10))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the (B, L) mask is permuted with the tokens
    apply_slws_hf(model, 1.0, "constant", generator=_gen(11))
    assert isinstance(model.layers, StochasticLayerShuffle)
    bare.eval(), model.eval()
    with torch.no_grad():
        assert torch.equal(
            model(ids, attention_mask=mask).last_hidden_state,
            bare(ids, attention_mask=mask).last_hidden_state,
        )
        model.train(), bare.train()
        got = model(ids, attention_mask=mask).last_hidden_state
        # by hand: each block on the permuted tokens (and mask), outputs gathered back
        g = _gen(11)
        h = bare.embeddings(ids)
        for blk in bare.layers:
            torch.rand((), generator=g)
            perm = torch.randperm(9, generator=g)
            h = blk(h[:, perm], attention_mask=mask[:, perm])[:, torch.argsort(perm)]
        torch.testing.assert_close(got, bare.norm_f(h), rtol=1e-6, atol=1e-6)
        assert not torch.allclose(got, bare(ids, attention_mask=mask).last_hidden_state, atol=1e-4)
    with pytest.raises(ValueError, match="cache is not None while training"):
        model(ids, use_cache=True)


def test_hf_causal_lm_warns_and_generic_path():
    from icml25.llm_efficiency.slws import apply_slws_hf

    lm = _tiny_mamba("MambaForCausalLM")
    with pytest.warns(UserWarning, match="destroys autoregressive semantics"):
        apply_slws_hf(lm, 0.5)
    assert isinstance(lm.backbone.layers, StochasticLayerShuffle)
    assert lm.backbone.layers.probs[0] == 0.0 and lm.backbone.layers.probs[-1] == 0.5
    with pytest.raises(ValueError, match="already wrapped"):
        apply_slws(lm, "backbone.layers")
    with pytest.raises(TypeError, match="PreTrainedModel"):
        apply_slws_hf(nn.Linear(2, 2))


# -------------------------------------------------------------------------------------- §8 bad inputs
def test_bad_inputs_raise_clear_errors():
    x = _x()
    with pytest.raises(ValueError, match=r"max_rate must be a finite float in \[0, 1\], got 1.5"):
        linear_shuffle_schedule(4, 1.5)
    with pytest.raises(ValueError, match=r"max_rate must be a finite float in \[0, 1\]"):
        StochasticLayerShuffle([nn.Identity()], -0.1)
    with pytest.raises(ValueError, match=r"x must be a \(B, L, d\) token sequence, got shape \(3, 7\)"):
        shuffle_forward(nn.Identity(), x[..., 0], prob=1.0, training=True)
    with pytest.warns(UserWarning, match=r"L = 1 tokens .* nothing to permute"):
        out = shuffle_forward(nn.Identity(), x[:, :1], prob=1.0, training=True, generator=_gen())
    assert torch.equal(out, x[:, :1])
    with pytest.raises(ValueError, match="SLWS requires sequence-preserving layers"):
        shuffle_forward(lambda t: t.mean(1, keepdim=True), x, prob=1.0, training=True, generator=_gen())
    with pytest.raises(ValueError, match="keep_first must be < L = 7"):
        shuffle_forward(nn.Identity(), x, prob=1.0, training=True, keep_first=7)
    with pytest.raises(ValueError, match="inference_params is not None while training"):
        shuffle_forward(lambda t, inference_params=None: t, x, prob=1.0, training=True, inference_params={})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shuffle_forward(lambda t, cache=None: t, x, prob=1.0, training=False, cache={})  # eval: allowed
    with pytest.raises(ValueError, match=r"schedule must be one of \['constant', 'linear'\]"):
        StochasticLayerShuffle([nn.Identity()], 0.5, "cosine")
    with pytest.raises(ValueError, match=r"schedule must give one probability per layer \(2\), got 1"):
        StochasticLayerShuffle([nn.Identity(), nn.Identity()], 0.5, [0.1])
    with pytest.raises(ValueError, match=r"layers_attr 'blocks' must name an nn\.ModuleList"):
        apply_slws(VimTiny(d_model=8, depth=1, d_state=2, seed=0), "blocks")
    with pytest.raises(TypeError, match=r"prob must be a finite float in \[0, 1\]"):
        shuffle_forward(nn.Identity(), x, prob="0.5", training=True)
    with pytest.raises(ValueError, match=r"images must have shape \[B, 1, 8, 8\]"):
        VimTiny(d_model=8, depth=1, d_state=2, seed=0)(torch.rand(2, 1, 6, 6))


def test_causal_model_warning_on_generic_model():
    class TinyCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Identity()])

        def generate(self):  # a generation API: the model is autoregressive
            return None

    with pytest.warns(UserWarning, match="destroys autoregressive semantics"):
        apply_slws(TinyCausalLM())


def test_apply_slws_on_a_sequential_block_stack():
    torch.manual_seed(0)
    model = nn.Module()
    model.blocks = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    x = _x()
    ref = model.blocks(x)
    apply_slws(model, "blocks", 1.0, "constant", generator=_gen())
    torch.testing.assert_close(model.blocks.train()(x), ref, rtol=0, atol=1e-6)  # token-wise: restored


# ------------------------------------------------------------------------------------------- reproduction
@pytest.fixture(scope="module")
def quick_report():
    return exp.run(quick=True, seed=0)


def test_quick_reproduction_passes(quick_report):
    assert quick_report.passed is True, quick_report.checks
    m = quick_report.metrics
    assert m["eval_max_diff"] == 0.0 and m["restore_err"] == 0.0 and m["loss_decrease_min"] > 0


def test_broken_variant_without_order_restoration_fails_the_gate():
    setting = replace(exp.QUICK, n_train=200, depth=2, epochs=1, n_test=50)
    report = exp._run(setting, seed=0, restore=False)
    assert report.passed is False
    assert report.checks["token order restored (max diff <= 1e-06)"] is False
    assert report.metrics["restore_err"] > 0.1


def test_full_preconditions_make_an_underfit_baseline_inconclusive():
    """The plan's §12 gate: a full run whose baseline stays below 99% train accuracy on a seed measures
    nothing (inconclusive, whatever the checks say); quick mode has no pre-condition."""
    assert exp.preconditions(exp.QUICK) == []
    (pre,) = exp.preconditions(exp.FULL)
    assert pre.name == "baseline (no SLWS) train accuracy >= 99% on every seed"
    assert pre({"train_acc_none_min_seed": 99.0}) is True
    assert pre({"train_acc_none_min_seed": 98.95}) is False


def test_full_setting_is_the_plans_fashion_mnist_overfitting_regime():
    f = exp.FULL
    assert (f.dataset, f.n_train, f.n_test, f.d_model, f.depth, f.n_seeds) == (
        "fashion-mnist",
        2000,
        None,
        64,
        6,
        3,
    )
    assert f.min_train_acc == 99.0 and f.min_gain == 1.0 and f.min_wins == 2


def test_fashion_mnist_split_is_a_stratified_subset_and_the_full_test_set():
    from icml25.kernels.datasets import load_fashion_mnist

    try:
        load_fashion_mnist(split="test", verify=False)
    except FileNotFoundError:
        pytest.skip("Fashion-MNIST files not installed (apt-get install dataset-fashion-mnist)")
    Xtr, ytr, Xte, yte = exp.load_split(2000, None, "fashion-mnist")
    assert yte.shape == (10_000,)
    assert Xtr.shape == (2000, 1, 28, 28) and Xte.shape == (10_000, 1, 28, 28)
    assert torch.equal(torch.bincount(ytr), torch.full((10,), 200))
    assert 0.0 <= float(Xtr.min()) and float(Xtr.max()) <= 1.0
    with pytest.raises(ValueError, match="dataset"):
        exp.load_split(20, None, "mnist")


@pytest.mark.slow
def test_full_reproduction_is_the_recorded_known_miss():
    """The full run (3 paired seeds on Fashion-MNIST; 5,011 CPU-s, results/P13.json): the baseline overfits
    (the pre-condition), SLWS wins every seed and narrows the gap, but the mean gain misses the 1-point bar."""
    report = exp.run(quick=False, seed=0)
    assert not report.inconclusive, report.failed_preconditions
    assert report.failed_checks == ["mean paired accuracy gain SLWS - none >= 1 points"], report.summary()
    assert 0 < report.metrics["gain_mean"] < 1 and report.metrics["wins"] == 3
    assert report.metrics["eval_max_diff"] == 0.0 and report.metrics["restore_err"] == 0.0


def test_threshold_text_matches_checks():
    assert "mean paired accuracy gain SLWS - none >= 1 points" in exp.threshold(quick=False)
    assert "SLWS > none in >= 2 of 3 seeds" in exp.threshold(quick=False)
    quick = exp.threshold(quick=True)
    assert "training loss decreases in both arms" in quick
    assert "SLWS accuracy" not in quick and "SLWS accuracy" not in exp.threshold(quick=False)
    assert "training loss decreases" not in exp.threshold(quick=False)
