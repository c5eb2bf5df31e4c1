"""Tests for P28 URAE: the SVD split (exact reconstruction, the minor/major singular values, unchanged outputs at
initialisation, Linear and conv layers), the exact rank-2r LoRA export against the trained adapted model, the
plain-LoRA baseline, fusing, the flow-matching step against an independent re-computation, the guidance rule's
check, the bad inputs, and the quick reproduction's verdict (and a broken variant's failure)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from icml25.generative_models.experiments import urae as exp
from icml25.generative_models.urae import (
    LoRALinear,
    SVDComponentLinear,
    apply_lora_adapters,
    apply_svd_adapters,
    check_guidance_for_adaptation,
    export_peft_lora_state_dict,
    flow_matching_finetune_step,
    merge_adapters,
    peft_lora_config,
)
from icml25.kernels.experiment import torch_threads


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.attn = nn.ModuleDict(
            {"to_q": nn.Linear(24, 10), "to_k": nn.Linear(24, 10), "to_out": nn.Linear(10, 7)}
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv(x)).mean((2, 3)).repeat(1, 4)
        return self.attn["to_out"](self.attn["to_q"](h) * self.attn["to_k"](h))


def _net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


X = torch.randn(5, 3, 4, 4, generator=torch.Generator().manual_seed(1))


def _train(model: nn.Module, params, steps: int = 10) -> None:
    opt = torch.optim.Adam(params, lr=0.02)
    for _ in range(steps):
        loss = (model(X) - 1).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


# ---- the SVD split -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("component", ["minor", "major"])
def test_split_reconstructs_weight_and_holds_the_right_singular_values(component) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(12, 9).double()
    w = lin.weight.detach().clone()
    ad = SVDComponentLinear(lin, 3, component)
    ba = ad.lora_B @ ad.lora_A
    assert torch.allclose(ad.base.weight + ba, w, atol=1e-12)
    s = torch.linalg.svdvals(w)
    sba = torch.linalg.svdvals(ba)
    assert torch.linalg.matrix_rank(ba) == 3
    expected = s[-3:] if component == "minor" else s[:3]
    assert torch.allclose(sba[:3], expected, atol=1e-10)
    # the residual holds the complementary singular values, so W_residual ⟂ BA in the Frobenius sense
    assert torch.allclose(
        torch.linalg.svdvals(ad.base.weight)[:6], s[:6] if component == "minor" else s[3:9], atol=1e-10
    )
    assert abs(float((ad.base.weight * ba).sum().detach())) < 1e-10
    # B = U diag(√S), A = diag(√S) Vᵀ: both factors carry the same singular values
    assert torch.allclose(torch.linalg.svdvals(ad.lora_B), expected.sqrt(), atol=1e-10)
    assert torch.allclose(torch.linalg.svdvals(ad.lora_A), expected.sqrt(), atol=1e-10)


@pytest.mark.parametrize("component", ["minor", "major"])
def test_outputs_unchanged_after_apply_and_only_factors_train(component) -> None:
    model, ref = _net(), _net()
    params = apply_svd_adapters(
        model, ["conv", "to_q", "to_k", "to_out"], rank=2, component=component, reshape_conv=True
    )
    assert torch.allclose(model(X), ref(X), atol=1e-5)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        f"{m}.{f}" for m in ("conv", "attn.to_q", "attn.to_k", "attn.to_out") for f in ("lora_A", "lora_B")
    }
    assert len(params) == 8 and all(p.requires_grad for p in params)
    assert not model.attn["to_q"].base.bias.requires_grad and not model.conv.base.weight.requires_grad


def test_minor_weight_split_matches_explicit_svd_for_conv() -> None:
    torch.manual_seed(3)
    conv = nn.Conv2d(4, 5, 3).double()
    w = conv.weight.detach().clone()
    ad = SVDComponentLinear(conv, 2, reshape_conv=True)
    u, s, vh = torch.linalg.svd(w.reshape(5, 36), full_matrices=False)
    minor = u[:, -2:] @ torch.diag(s[-2:]) @ vh[-2:]
    assert torch.allclose(ad.base.weight.reshape(5, 36), w.reshape(5, 36) - minor, atol=1e-12)
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    assert torch.allclose(ad(x), nn.functional.conv2d(x, w, conv.bias), atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(out_f=st.integers(2, 9), in_f=st.integers(2, 9), data=st.data())
def test_property_split_is_exact_and_output_invariant(out_f, in_f, data) -> None:
    rank = data.draw(st.integers(1, min(out_f, in_f) - 1))
    component = data.draw(st.sampled_from(["minor", "major"]))
    torch.manual_seed(out_f * 31 + in_f)
    lin = nn.Linear(in_f, out_f).double()
    w = lin.weight.detach().clone()
    ad = SVDComponentLinear(lin, rank, component)
    x = torch.randn(3, in_f, dtype=torch.float64)
    assert torch.allclose(ad(x), x @ w.T + lin.bias, atol=1e-10)
    assert torch.allclose(ad.effective_weight(), w, atol=1e-10)
    assert torch.count_nonzero(ad.delta_weight()) == 0
    up, down = ad.to_lora_factors()
    assert up.shape == (out_f, 2 * rank) and down.shape == (2 * rank, in_f)


# ---- export, LoRA baseline, fusing -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["minor", "major", "lora"])
def test_exported_lora_reproduces_the_trained_model_exactly(kind) -> None:
    model, original = _net(), _net()
    targets = ["conv", "to_q", "to_k", "to_out"]
    if kind == "lora":
        params = apply_lora_adapters(
            model, targets, rank=2, reshape_conv=True, generator=torch.Generator().manual_seed(0)
        )
    else:
        params = apply_svd_adapters(model, targets, rank=2, component=kind, reshape_conv=True)
    _train(model, params)
    assert not torch.allclose(model(X), original(X), atol=1e-3)  # training moved the model
    sd = export_peft_lora_state_dict(model)
    # apply the exported LoRA by hand to the ORIGINAL weights: W + up @ down (scale alpha / r = 1)
    cfg = peft_lora_config(model)
    assert cfg["r"] == cfg["lora_alpha"] == 4
    rebuilt = copy.deepcopy(original)
    for name in cfg["target_modules"]:
        layer = rebuilt.get_submodule(name)
        up = sd[f"base_model.model.{name}.lora_B.weight"].flatten(1)
        down = sd[f"base_model.model.{name}.lora_A.weight"].flatten(1)
        ad = model.get_submodule(name)
        assert torch.allclose((up @ down).reshape(layer.weight.shape), ad.delta_weight(), atol=1e-6)
        with torch.no_grad():
            layer.weight += (up @ down).reshape(layer.weight.shape)
    assert torch.allclose(rebuilt(X), model(X), atol=1e-5)
    # the naive save (A, B without the conversion) applied to the vanilla model is wrong for the SVD split
    if kind != "lora":
        naive = copy.deepcopy(original)
        with torch.no_grad():
            w = naive.attn["to_q"].weight
            w += model.attn["to_q"].lora_B @ model.attn["to_q"].lora_A
        assert not torch.allclose(naive(X), model(X), atol=1e-3)


def test_lora_baseline_init_is_peft_gaussian_and_zero_delta() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(400, 300)
    w = lin.weight.detach().clone()
    ad = LoRALinear(lin, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ad.base.weight, w) and torch.count_nonzero(ad.lora_B) == 0
    assert abs(float(ad.lora_A.detach().std()) - 1 / 8) < 0.005  # peft "gaussian": N(0, 1/r)
    assert torch.count_nonzero(ad.delta_weight()) == 0


def test_merge_adapters_fuses_exactly() -> None:
    model = _net()
    params = apply_svd_adapters(model, ["to_q", "to_out"], rank=3)
    _train(model, params)
    before = model(X).detach()
    merge_adapters(model)
    assert isinstance(model.attn["to_q"], nn.Linear) and isinstance(model.attn["to_out"], nn.Linear)
    assert torch.allclose(model(X), before, atol=1e-5)
    # a second adaptation stage (the 4K stage on the fused 2K model) starts from the fused weights
    apply_svd_adapters(model, ["to_q"], rank=2)
    assert torch.allclose(model(X), before, atol=1e-5)


def test_regex_target_modules_as_peft() -> None:
    model = _net()
    apply_svd_adapters(model, r"attn\.to_(q|k)", rank=2)
    assert isinstance(model.attn["to_q"], SVDComponentLinear) and isinstance(
        model.attn["to_k"], SVDComponentLinear
    )
    assert isinstance(model.attn["to_out"], nn.Linear)


# ---- flow-matching step and the guidance rule -------------------------------------------------------------


class GuidedToy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = {"guidance_embeds": True}
        self.lin = nn.Linear(4, 2)
        self.seen: list[torch.Tensor] = []

    def forward(self, x, t, c, g):
        self.seen.append(g)
        return self.lin(torch.cat([x, t[:, None], g[:, None]], 1)) + c


def test_flow_matching_step_matches_independent_computation() -> None:
    torch.manual_seed(0)
    model = GuidedToy()
    x0 = torch.randn(6, 2)
    loss = flow_matching_finetune_step(model, x0, 0.5, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    sigma = torch.rand(6, generator=g)
    eps = torch.randn(6, 2, generator=g)
    x_t = (1 - sigma[:, None]) * x0 + sigma[:, None] * eps
    pred = model.lin(torch.cat([x_t, sigma[:, None], torch.ones(6, 1)], 1)) + 0.5
    assert torch.allclose(loss, ((pred - (eps - x0)) ** 2).mean(), atol=1e-6)
    assert torch.equal(model.seen[0], torch.ones(6))  # the rule: g = 1 is fed
    # with an optimizer the step updates the parameters and returns a detached loss
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = model.lin.weight.detach().clone()
    out = flow_matching_finetune_step(model, x0, 0.5, optimizer=opt, max_grad_norm=1.0)
    assert not out.requires_grad and not torch.equal(model.lin.weight, w)


def test_guidance_check_warns_and_rejects() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_guidance_for_adaptation({"guidance_embeds": True}, 1.0)
        check_guidance_for_adaptation({"guidance_embeds": False}, None)
    with pytest.warns(UserWarning, match=r"guidance=3.5 during adaptation .* feed guidance=1.0"):
        check_guidance_for_adaptation({"guidance_embeds": True}, 3.5)
    with pytest.raises(ValueError, match=r"guidance must be a finite value >= 0, got -1.0"):
        check_guidance_for_adaptation({"guidance_embeds": True}, -1.0)
    with pytest.raises(ValueError, match=r"guidance must be None for a model without a guidance embedding"):
        check_guidance_for_adaptation({"guidance_embeds": False}, 1.0)
    with pytest.raises(ValueError, match=r"guidance must be a number \(1.0\) .* got None"):
        check_guidance_for_adaptation({"guidance_embeds": True}, None)
    with pytest.raises(
        TypeError, match="model_config must be a mapping or object with a boolean 'guidance_embeds'"
    ):
        check_guidance_for_adaptation({}, 1.0)
    with pytest.warns(UserWarning, match="guidance=3.5"):
        flow_matching_finetune_step(GuidedToy(), torch.randn(4, 2), 0.0, guidance=3.5)


# ---- bad inputs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, -1, 6, 9])
def test_rank_out_of_range(rank) -> None:
    with pytest.raises(ValueError, match=rf"rank must satisfy 0 < rank < min\(out, in\) = 6 .* got {rank}"):
        SVDComponentLinear(nn.Linear(8, 6), rank)


def test_unmatched_targets_list_candidates_and_model_untouched() -> None:
    model, ref = _net(), _net()
    with pytest.raises(
        ValueError, match=r"match no module of the model; candidate layers: \['conv', 'attn.to_q'"
    ):
        apply_svd_adapters(model, ["to_v"], rank=2)
    with pytest.raises(TypeError, match="target_modules must be a regex string or a non-empty sequence"):
        apply_svd_adapters(model, [], rank=2)
    assert all(p.requires_grad for p in model.parameters())
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True)
    )


def test_conv_needs_reshape_conv_and_rejection_loses_nothing() -> None:
    model, ref = _net(), _net()
    with pytest.raises(
        TypeError, match=r"base must be an nn.Linear, or a convolution with reshape_conv=True .* got Conv2d"
    ):
        apply_svd_adapters(model, ["to_q", "conv"], rank=2)
    assert isinstance(model.attn["to_q"], nn.Linear)  # nothing replaced, nothing changed
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True)
    )
    with pytest.raises(TypeError, match=r"base must be an nn\.Linear or a convolution"):
        SVDComponentLinear(nn.LayerNorm(4), 1)
    with pytest.raises(ValueError, match="component must be 'minor' or 'major', got 'middle'"):
        SVDComponentLinear(nn.Linear(4, 4), 1, "middle")


def test_half_precision_warns_and_stays_close() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(16, 12).to(torch.bfloat16)
    w = lin.weight.detach().float().clone()
    with pytest.warns(UserWarning, match=r"base weight is torch.bfloat16: the SVD runs in float32"):
        ad = SVDComponentLinear(lin, 4)
    assert ad.lora_A.dtype == torch.bfloat16
    assert torch.allclose(ad.effective_weight().float(), w, atol=0.02)


def test_export_without_adapters_is_rejected() -> None:
    with pytest.raises(ValueError, match="model has no SVDComponentLinear/LoRALinear adapters"):
        export_peft_lora_state_dict(_net())


def test_finetune_step_rejects_bad_x0() -> None:
    with pytest.raises(ValueError, match=r"x0 must be finite"):
        flow_matching_finetune_step(GuidedToy(), torch.tensor([[float("nan"), 0.0]]), 0.0)
    with pytest.raises(ValueError, match=r"x0 must have shape \(N, \*event\)"):
        flow_matching_finetune_step(GuidedToy(), torch.zeros(3), 0.0)


# ---- reproduction ------------------------------------------------------------------------------------------


def test_quick_reproduction_passes() -> None:
    report = exp.run(quick=True)
    assert report.passed, report.summary() if hasattr(report, "summary") else report
    assert report.metrics["retained_gap_g35"] < report.metrics["retained_gap_g1"]
    assert "retained guidance gap" in exp.threshold(True) and "SWD" in exp.threshold(False)


def test_broken_variant_fails_quick_gate() -> None:
    report = exp.evaluate(exp.QUICK, broken=True)
    assert not report.passed


def test_full_threshold_gates_part_b_sanity_checks() -> None:
    text = exp.threshold(False)
    assert "every adapted model" in text and "clean-data training" in text
    assert "part B" not in exp.threshold(True)


@pytest.mark.slow
def test_full_run_passes_every_check() -> None:
    """The recorded expectation of the full run (part A 3 seeds, part B 5 seeds at 600 steps; about 21 min on
    one loaded core): all five checks hold, and every adapted model beats the unadapted one."""
    report = exp.run(quick=False, seed=0)
    assert report.passed, report.checks
    assert len(report.checks) == 5
    assert report.metrics["b_adapted_beat_unadapted"] == 1.0


def test_part_b_mmd_matches_brute_force_and_conv_flow_is_resolution_free() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 1, 2, 2, generator=g), torch.randn(4, 1, 2, 2, generator=g) + 1
    xf, yf = x.flatten(1).double(), y.flatten(1).double()
    z = torch.cat([xf, yf])
    d2 = [float(((a - b) ** 2).sum()) for a in z for b in z]
    h = float(torch.tensor([v for v in d2 if v > 0]).median())

    def k(a, b):
        return float(torch.exp(-((a - b) ** 2).sum() / h))

    kxx = sum(k(a, b) for i, a in enumerate(xf) for j, b in enumerate(xf) if i != j) / 20
    kyy = sum(k(a, b) for i, a in enumerate(yf) for j, b in enumerate(yf) if i != j) / 12
    kxy = sum(k(a, b) for a in xf for b in yf) / 20
    assert exp.mmd_rbf(x, y) == pytest.approx(kxx + kyy - 2 * kxy, abs=1e-10)
    net = exp.ConvFlow(4)
    for size in (8, 16):
        assert net(torch.zeros(2, 1, size, size), torch.tensor([0.1, 0.9])).shape == (2, 1, size, size)
