"""Tests for P37 VCT: the kernels' boundary conditions, the iCT schedule (discretisation curriculum, Karras grid,
erf index distribution against lognormal mass), the KL against torch.distributions, the loss against an
independent re-computation, gradient routing (encoder gets gradients, the target branch none), shared dropout
masks, OT coupling against brute force, one/two-step sampling, the bad inputs of the brief, and the quick
reproduction's verdict (and a broken variant's failure)."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm
from torch import nn

from icml25.generative_models.experiments import vct as exp
from icml25.generative_models.vct import (
    ConsistencyModel,
    ImprovedConsistencyTraining,
    LinearKernel,
    NoiseEncoder,
    ToyMLP,
    VEKernel,
    consistency_sample,
    gaussian_kl,
    karras_sigmas,
    ot_coupling,
    pseudo_huber,
)
from icml25.kernels.experiment import torch_threads


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


def _model(kernel="ve", hidden=16, dropout=0.0) -> ConsistencyModel:
    torch.manual_seed(0)
    net = ToyMLP(2, hidden, 2)
    if dropout:
        net.net.insert(2, nn.Dropout(dropout))
    return ConsistencyModel(net, kernel)


def _trainer(coupling="vae", **kw) -> ImprovedConsistencyTraining:
    enc = NoiseEncoder.mlp(2, 8, 1) if coupling == "vae" else None
    return ImprovedConsistencyTraining(_model(), 100, coupling, enc, **kw)


X = torch.randn(6, 2, generator=torch.Generator().manual_seed(1))


# ---- kernels and boundary condition ---------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["ve", "linear"])
def test_boundary_condition_is_exact(kernel) -> None:
    m = _model(kernel)
    assert torch.equal(m.denoise(X, m.sigma_min), X)
    _c_in, c_skip, c_out = m.kernel.scalings(torch.tensor(m.sigma_min))
    assert float(c_skip) == 1.0 and float(c_out) == 0.0


def test_kernel_endpoints() -> None:
    eps = torch.randn_like(X)
    for k in (VEKernel(), LinearKernel()):
        assert torch.equal(k(X, 0.0, eps), X)
    lin = LinearKernel()
    assert torch.allclose(lin(X, 80.0, eps), 80.0 * eps)
    # the non-boundary scalings are EDM's: c_skip = σ_d²/(t² + σ_d²), c_out = t σ_d/√(σ_d² + t²) (VE)
    t = torch.tensor(1.3)
    _c_in, c_skip, c_out = VEKernel().scalings(t, boundary=False)
    assert float(c_skip) == pytest.approx(0.25 / (1.69 + 0.25))
    assert float(c_out) == pytest.approx(1.3 * 0.5 / math.sqrt(1.94))


def test_linear_kernel_clamps_and_warns_once() -> None:
    lin = LinearKernel()
    eps = torch.randn_like(X)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = lin(X, 100.0, eps)
        lin(X, 120.0, eps)
    assert len([x for x in w if "clamped" in str(x.message)]) == 1
    assert torch.allclose(a, 80.0 * eps)


# ---- schedule ---------------------------------------------------------------------------------------------


def test_sigma_grid_and_curriculum() -> None:
    s = karras_sigmas(11)
    assert float(s[0]) == pytest.approx(0.002, rel=1e-12) and float(s[-1]) == pytest.approx(80.0, rel=1e-12)
    assert bool((s[1:] > s[:-1]).all())
    tr = ImprovedConsistencyTraining(_model(), 8000, "independent", s0=10, s1=160)
    assert tr.n_scales(0) == 11
    assert tr.n_scales(7999) == 161
    # K' = floor(8000/(log2(16) + 1)) = 1600: doubling every 1600 steps
    assert [tr.n_scales(k) for k in (1599, 1600, 3200, 6400)] == [11, 21, 41, 161]


def test_index_distribution_matches_lognormal_mass() -> None:
    tr = _trainer()
    sig = karras_sigmas(1281)
    p = tr.index_probs(sig)
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
    ls = np.log(sig.numpy())
    mass = norm.cdf(ls[1:], -1.1, 2.0) - norm.cdf(ls[:-1], -1.1, 2.0)
    np.testing.assert_allclose(p.numpy(), mass / mass.sum(), rtol=1e-8, atol=1e-14)


def test_kl_weight_is_normalised_by_last_interval() -> None:
    tr = _trainer(kl_scale=30.0)
    s = tr.sigmas(0)
    assert tr.kl_weight(0) == pytest.approx(30.0 / float(s[-1] - s[-2]))


# ---- KL, loss, gradients ------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(-3, 3), min_size=2, max_size=2), st.lists(st.floats(0.05, 3), min_size=2, max_size=2)
)
def test_kl_matches_torch_distributions(mu, sd) -> None:
    mu, sd = torch.tensor([mu], dtype=torch.float64), torch.tensor([sd], dtype=torch.float64)
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(mu, sd + 1e-8), torch.distributions.Normal(0.0, 1.0)
    )
    assert torch.allclose(gaussian_kl(mu, sd), ref.sum(1), atol=1e-10)
    assert float(gaussian_kl(mu, sd)) >= 0.0


def test_kl_zero_only_at_prior() -> None:
    assert float(gaussian_kl(torch.zeros(1, 3), torch.ones(1, 3))) == pytest.approx(0.0, abs=1e-6)
    assert float(gaussian_kl(torch.full((1, 3), 0.1), torch.ones(1, 3))) > 1e-3
    assert float(gaussian_kl(torch.zeros(1, 3), torch.full((1, 3), 0.9))) > 1e-3


def test_independent_loss_matches_reference_computation() -> None:
    tr = _trainer("independent")
    step, x = 30, X.clone()
    loss, info = tr.loss(x, step, generator=torch.Generator().manual_seed(5))
    # independent re-computation with the same draws
    g = torch.Generator().manual_seed(5)
    n = min(10 * 2 ** (step // math.floor(100 / (math.log2(128) + 1))), 1280) + 1
    lo, hi = 0.002 ** (1 / 7), 80.0 ** (1 / 7)
    sig = torch.tensor([(lo + i / (n - 1) * (hi - lo)) ** 7 for i in range(n)], dtype=torch.float64)
    cdf = torch.tensor(norm.cdf(np.log(sig.numpy()), -1.1, 2.0))
    idx = torch.multinomial((cdf[1:] - cdf[:-1]) / (cdf[-1] - cdf[0]), 6, replacement=True, generator=g)
    eps = torch.randn(x.shape, generator=g)
    t, r = sig[idx + 1].float()[:, None], sig[idx].float()[:, None]

    def d(xt, s):
        c_in = 1 / torch.sqrt(0.25 + s**2)
        c_skip = 0.25 / ((s - 0.002) ** 2 + 0.25)
        return c_skip * xt + (s - 0.002) * 0.5 * c_in * tr.model.net(c_in * xt, torch.log(s[:, 0]) / 4)

    c = 0.00054 * math.sqrt(2)
    diff = d(x + t * eps, t) - d(x + r * eps, r)
    ref = ((torch.sqrt(diff**2 + c**2) - c) / (t - r)).sum(1).mean()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert info["n_scales"] == n and float(info["kl"].sum()) == 0.0


def test_gradients_reach_encoder_and_skip_target_branch() -> None:
    tr = _trainer("vae")
    loss, info = tr.loss(X, 50, generator=torch.Generator().manual_seed(0))
    loss.backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in tr.encoder.parameters())
    g_full = [p.grad.clone() for p in tr.model.parameters()]
    # the same loss with the target computed by hand under no_grad gives the same θ-gradient
    tr.model.zero_grad()
    tr.encoder.zero_grad()
    t, r = info["t"], info["r"]
    g = torch.Generator().manual_seed(0)
    torch.multinomial(tr.index_probs(tr.sigmas(50)), 6, replacement=True, generator=g)
    eps, kl = tr.coupled_noise(X, g)
    d_t = tr.model.denoise(X + t[:, None] * eps, t)
    d_r = tr.model.denoise(X + r[:, None] * eps, r).detach()
    student_only = ((pseudo_huber(d_t - d_r, 0.00054 * math.sqrt(2)) / (t - r)[:, None]).sum(1)).mean()
    (student_only + tr.kl_weight(50) * kl.mean()).backward()
    for a, p in zip(g_full, tr.model.parameters(), strict=True):
        assert torch.allclose(a, p.grad, atol=1e-6)
    # a detached encoder gets gradients from the KL only
    tr2 = _trainer("vae", kl_scale=0.0, detach_encoder=True)
    tr2.loss(X, 50, generator=torch.Generator().manual_seed(0))[0].backward()
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in tr2.encoder.parameters())


def test_student_and_target_share_dropout_masks() -> None:
    m = _model(dropout=0.5)
    masks = []
    drop = m.net.net[2]
    drop.register_forward_hook(lambda mod, inp, out: masks.append((out != 0) | (inp[0] == 0)))
    tr = ImprovedConsistencyTraining(m, 100, "independent")
    tr.loss(X, 10, generator=torch.Generator().manual_seed(0))
    assert len(masks) == 2 and torch.equal(masks[0], masks[1])
    assert not bool(masks[0].all())  # dropout is active


def test_ot_coupling_is_the_optimal_permutation() -> None:
    g = torch.Generator().manual_seed(3)
    x, eps = torch.randn(6, 2, generator=g), torch.randn(6, 2, generator=g)
    perm = ot_coupling(x, eps)
    assert sorted(perm.tolist()) == list(range(6))
    best = min(itertools.permutations(range(6)), key=lambda p: float(((x - eps[list(p)]) ** 2).sum()))
    assert perm.tolist() == list(best)
    tr = _trainer("ot")
    e, _ = tr.coupled_noise(x, torch.Generator().manual_seed(0))
    raw = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.sort(e, 0).values, torch.sort(raw, 0).values)  # a permutation of the batch


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 12), st.integers(0, 10_000))
def test_ot_coupling_never_costs_more_than_identity(n, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    x, eps = torch.randn(n, 3, generator=g), torch.randn(n, 3, generator=g)
    perm = ot_coupling(x, eps)
    assert sorted(perm.tolist()) == list(range(n))
    assert float(((x - eps[perm]) ** 2).sum()) <= float(((x - eps) ** 2).sum()) + 1e-9


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 400), st.floats(-3, 3), st.floats(0.2, 4))
def test_index_distribution_is_a_distribution(n, p_mean, p_std) -> None:
    tr = ImprovedConsistencyTraining(_model(), 10, "independent", p_mean=p_mean, p_std=p_std)
    p = tr.index_probs(karras_sigmas(n))
    assert p.shape == (n - 1,) and bool((p >= 0).all())
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-9)


# ---- sampling -------------------------------------------------------------------------------------------------


class _CountingEncoder(NoiseEncoder):
    calls = 0

    def forward(self, x, class_labels=None):
        type(self).calls += 1
        return super().forward(x, class_labels)


def test_one_step_uses_prior_and_two_step_uses_encoder() -> None:
    m = _model()
    enc = _CountingEncoder.mlp(2, 8, 1)
    x1 = consistency_sample(m, (5, 2), 1, encoder=enc, generator=torch.Generator().manual_seed(0))
    z = torch.randn(5, 2, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(x1, m.denoise(80.0 * z, 80.0).detach())
    assert _CountingEncoder.calls == 0
    consistency_sample(m, (5, 2), 2, encoder=enc, generator=torch.Generator().manual_seed(0))
    assert _CountingEncoder.calls == 1


def test_two_step_ot_renoising_matches_manual() -> None:
    m = _model()
    out = consistency_sample(
        m, (5, 2), 2, mid_t=(0.5,), coupling="ot", generator=torch.Generator().manual_seed(0)
    )
    g = torch.Generator().manual_seed(0)
    x_hat = m.denoise(80.0 * torch.randn(5, 2, generator=g), 80.0).detach()
    eps = torch.randn(5, 2, generator=g)
    eps = eps[ot_coupling(x_hat, eps)]
    assert torch.allclose(out, m.denoise(x_hat + 0.5 * eps, 0.5).detach())
    with pytest.raises(ValueError, match=r"coupling must be one of \['independent', 'ot'\]"):
        consistency_sample(m, (5, 2), 2, coupling="vae")


def test_fit_reduces_loss_and_returns_ema() -> None:
    tr = _trainer("vae")
    tr.total_steps = 60
    ema = tr.fit(exp.two_gaussians, 64, lr=1e-3, ema_decay=0.9, grad_clip=200.0, seed=0)
    assert isinstance(ema, ConsistencyModel) and len(tr.history) == 60
    assert all(math.isfinite(h["loss"]) for h in tr.history)
    assert np.mean([h["kl"] for h in tr.history[-10:]]) < 1.0


# ---- bad inputs -----------------------------------------------------------------------------------------------


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"coupling must be one of \['independent', 'ot', 'vae'\]"):
        ImprovedConsistencyTraining(_model(), 10, "gaussian")
    with pytest.raises(ValueError, match=r"kernel must be one of \['ve', 'linear'\]"):
        ConsistencyModel(ToyMLP(), "vp")
    with pytest.raises(ValueError, match="coupling='vae' needs encoder"):
        ImprovedConsistencyTraining(_model(), 10, "vae")
    bad = NoiseEncoder(ToyMLP(2, 8, 1))  # 2 output channels, not 4
    with pytest.raises(ValueError, match=r"encoder output must have shape \(N, 2\*C"):
        ImprovedConsistencyTraining(_model(), 10, "vae", bad).loss(X, 0)
    with pytest.raises(ValueError, match=r"kl_scale must be a finite float in \[0\.0, inf\), got -1\.0"):
        _trainer(kl_scale=-1.0)
    with pytest.raises(ValueError, match="sigma_min must be < sigma_max"):
        ConsistencyModel(ToyMLP(), "ve", sigma_min=1.0, sigma_max=0.5)
    with pytest.raises(ValueError, match="s0 must be <= s1"):
        _trainer(s0=20, s1=10)
    m = _model()
    with pytest.raises(ValueError, match=r"mid_t must lie in \(sigma_min, sigma_max\)"):
        consistency_sample(m, (3, 2), 2, mid_t=(100.0,))
    with pytest.raises(ValueError, match="mid_t must be strictly decreasing"):
        consistency_sample(m, (3, 2), 3, mid_t=(0.5, 1.0))
    with pytest.raises(ValueError, match="steps must be <= len"):
        consistency_sample(m, (3, 2), 3, mid_t=(0.821,))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        _trainer().loss(np.zeros((3, 2)), 0)


def test_rejected_fit_keeps_state() -> None:
    tr = _trainer("vae")
    before = [p.clone() for p in tr.parameters()]
    with pytest.raises(ValueError, match="ema_decay must be in"):
        tr.fit(exp.two_gaussians, 8, ema_decay=1.5)
    with pytest.raises(TypeError, match="data must be a tensor"):
        tr.fit("data", 8)
    assert all(torch.equal(a, b) for a, b in zip(before, tr.parameters(), strict=True))
    assert not hasattr(tr, "history")


# ---- reproduction ---------------------------------------------------------------------------------------------


def _full_metrics(vc_gap: float, vc_sw2: float) -> dict[str, float]:
    """Metrics that meet every mechanism check, with an independent run at gap 0.4 and sliced W2 0.2."""
    return {
        "vc_gap_ema_mean": vc_gap, "baseline_independent_gap_ema_mean": 0.4,
        "vc_sw2_ema_mean": vc_sw2, "baseline_independent_sw2_ema_mean": 0.2,
        "vc_abs_mean_mu_max": 0.01, "vc_total_var_min": 0.8, "vc_total_var_max": 0.9,
        "vc_separation_min": 0.3, "baseline_independent_separation": 0.02,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("vc_gap", "vc_sw2", "failing"),
    [
        (0.2, 0.15, []),  # at the gap bar, under the sliced-W2 bar
        (0.21, 0.1, ["gap mass"]),  # gap mass just above 0.5x
        (0.1, 0.17, ["sliced W2"]),  # sliced W2 just above 0.8x
        (0.4, 0.2, ["gap mass", "sliced W2"]),  # no better than independent coupling
    ],
)
def test_full_gate_tests_the_sample_quality_ordering(vc_gap, vc_sw2, failing) -> None:
    """Full mode gates VC's one-step samples against independent coupling's; quick mode has no baseline arm
    and gates the mechanism only."""
    results = {c.name: c(_full_metrics(vc_gap, vc_sw2)) for c in exp.checks(exp.FULL)}
    assert sorted(k for k, ok in results.items() if not ok) == sorted(
        k for k in results for f in failing if f in k
    )
    assert not any("independent coupling's" in c.name for c in exp.checks(exp.QUICK))


def test_quick_reproduction_passes() -> None:
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.checks
    assert report.metrics["vc_separation_min"] >= 0.15
    # the gated aggregate noise pools the last 200 steps' encoders; the last encoder alone is reported
    reported = {"vc_total_var_last_x_s0", "vc_total_var_last_y_s0", "vc_abs_mean_mu_last_s0"}
    assert reported <= set(report.metrics)


def test_quick_broken_variant_fails() -> None:
    """Each quick run trains for 2,000 steps, so the broken variant is a test of its own (the 20 s budget)."""
    broken = exp.evaluate(exp.QUICK, seed=0, detach_encoder=True)  # encoder gets the KL gradient only
    assert not broken.passed
    failed = [k for k, v in broken.checks.items() if not v]
    assert len(failed) == 1 and "data-dependent" in failed[0]
    assert abs(broken.metrics["vc_separation_min"]) < 0.05


def test_prior_checks_pool_the_window_in_quick_only() -> None:
    """Full gates the encoder after the last step (the planned estimator); quick pools its last steps."""
    full = [c.name for c in exp.checks(exp.FULL) if "N(0, I)" in c.name]
    quick = [c.name for c in exp.checks(exp.QUICK) if "N(0, I)" in c.name]
    assert len(full) == len(quick) == 2
    assert not any("pooled" in n for n in full)
    assert all(f"pooled over the last {exp.QUICK.prior_window} steps" in n for n in quick)
    assert exp.FULL.prior_window == 0 and 0 < exp.QUICK.prior_window < exp.QUICK.steps


@pytest.mark.slow
def test_full_reproduction_is_the_recorded_known_miss() -> None:
    """The full run (about 14 min of CPU; recorded: one-step gap mass 0.783 vs independent 0.6655, 3 seeds)
    misses exactly the two sample-quality gates while every mechanism check holds."""
    report = exp.run(quick=False, seed=0)
    assert report.passed is False
    assert sorted(report.failed_checks) == sorted(
        c.name for c in exp.checks(exp.FULL) if "coupling's" in c.name
    )
    assert report.metrics["vc_gap_ema_mean"] > report.metrics["baseline_independent_gap_ema_mean"] * 0.5
    assert report.metrics["vc_separation_min"] >= 0.15
