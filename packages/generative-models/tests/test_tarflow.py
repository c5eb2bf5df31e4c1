"""Tests for P33 TarFlow: exact invertibility/log-det/density checks, sampling and guidance, denoising
closed forms, bad inputs, and the quick reproduction's thresholds."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.generative_models.tarflow import TarFlow, tarflow_loss

# Random test inputs (randn) may exceed the data range; the range warning itself is tested below.
pytestmark = pytest.mark.filterwarnings("ignore:x has values far outside")


def _randomise(model: TarFlow, std: float = 0.1, seed: int = 0) -> TarFlow:
    """Give the zero-initialised output layers random weights so blocks are non-trivial maps."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            for p in (block.proj_out.weight, block.proj_out.bias):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)
    return model


def _tiny(dtype: torch.dtype = torch.float64, std: float = 0.1, **kw) -> TarFlow:
    args = dict(
        in_channels=1, img_size=8, patch_size=2, width=16, num_blocks=2, layers_per_block=1, head_dim=8
    )
    args.update(kw)
    torch.manual_seed(0)
    return _randomise(TarFlow(**args).to(dtype), std=std)


# ---- exactness -------------------------------------------------------------------------------------


@pytest.mark.parametrize("nvp", [True, False])
@pytest.mark.parametrize("num_blocks", [1, 2, 3])
def test_forward_inverse_identity_float64(nvp: bool, num_blocks: int) -> None:
    model = _tiny(nvp=nvp, num_blocks=num_blocks, num_classes=3)
    x = torch.rand(6, 1, 8, 8, dtype=torch.float64) * 2 - 1
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    z, _ = model(x, y)
    assert (z - model.patchify(x)).abs().max() > 1e-2  # the map is not trivially the identity
    assert (model.inverse(z, y) - x).abs().max() < 1e-5
    # and the other way round: forward(inverse(z)) = z
    z2 = torch.randn(4, model.num_tokens, model.token_dim, dtype=torch.float64) * 0.5
    assert (model(model.inverse(z2, y[:4]), y[:4])[0] - z2).abs().max() < 1e-5


def test_forward_inverse_identity_float32() -> None:
    model = _tiny(torch.float32)
    x = torch.rand(8, 1, 8, 8) * 2 - 1
    z, _ = model(x)
    assert (model.inverse(z) - x).abs().max() < 1e-4


@settings(max_examples=12, deadline=None)
@given(
    channels=st.integers(1, 2),
    patch=st.sampled_from([1, 2]),
    hp=st.integers(1, 3),
    wp=st.integers(1, 3),
    num_blocks=st.integers(1, 3),
    nvp=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_invertibility_property(channels, patch, hp, wp, num_blocks, nvp, seed) -> None:
    torch.manual_seed(seed)
    model = TarFlow(channels, (hp * patch, wp * patch), patch, 8, num_blocks, 1, head_dim=4, nvp=nvp)
    model = _randomise(model.double(), seed=seed)
    x = torch.randn(3, channels, hp * patch, wp * patch, dtype=torch.float64) * 0.5
    z, logdet = model(x)
    assert z.shape == (3, hp * wp, channels * patch * patch)
    assert (model.inverse(z) - x).abs().max() < 1e-8
    if not nvp:
        assert logdet.abs().max() == 0  # volume preserving


def test_logdet_matches_bruteforce_jacobian() -> None:
    # 8 tokens x 2 dims (D = 16): 2 channels, 2x4 image, patch 1.
    model = _tiny(in_channels=2, img_size=(2, 4), patch_size=1, num_blocks=3)
    x = torch.randn(3, 2, 2, 4, dtype=torch.float64) * 0.7
    _, logdet = model(x)
    for b in range(3):
        jac = torch.autograd.functional.jacobian(
            lambda v: model(v.view(1, 2, 2, 4))[0].flatten(), x[b].flatten()
        )
        assert jac.shape == (16, 16)
        assert torch.allclose(torch.linalg.slogdet(jac)[1], logdet[b], atol=1e-8)


def test_logdet_is_a_per_sample_sum() -> None:
    # One block with a constant log-scale c on every token but token 0: log|det| = -c (N - 1) d exactly.
    model = TarFlow(1, 8, 2, 16, 1, 1, head_dim=8).double()
    c = 0.3
    with torch.no_grad():
        model.blocks[0].proj_out.bias[: model.token_dim] = c
    _, logdet = model(torch.randn(2, 1, 8, 8, dtype=torch.float64))
    assert torch.allclose(logdet, torch.full((2,), -c * 15 * 4, dtype=torch.float64))


def test_one_block_2d_density_integrates_to_one_and_matches_samples() -> None:
    # A 1x2 "image" with patch 1: two scalar tokens, z1 = x1, z2 = (x2 - b(x1)) exp(-a(x1)).
    torch.manual_seed(1)
    model = _randomise(TarFlow(1, (1, 2), 1, 8, 1, 1, head_dim=4).double(), std=0.3, seed=1)
    # Midpoint rule on cells of width h whose boundaries include the box edges used below.
    h = 0.1
    grid = -9.0 + h / 2 + h * torch.arange(180, dtype=torch.float64)
    g1, g2 = torch.meshgrid(grid, grid, indexing="ij")
    pts = torch.stack([g1.flatten(), g2.flatten()], 1).view(-1, 1, 1, 2)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the grid lies far outside [-1, 1] on purpose
        dens = model.log_prob(pts).exp().view(len(grid), len(grid))
    assert abs(dens.sum().item() * h * h - 1.0) < 1e-3
    # The density is not a standard normal ...
    std_normal = torch.exp(-0.5 * (g1**2 + g2**2)) / (2 * math.pi)
    assert (dens - std_normal).abs().max() > 0.01
    # ... and box probabilities under the density match the frequencies of exact samples.
    n = 40_000
    samples = model.sample(n, generator=torch.Generator().manual_seed(0)).view(-1, 2)
    for lo1, hi1, lo2, hi2 in [(-1, 0, -1, 0), (0, 1, -2, 2), (-3, 3, 0.5, 3)]:
        in_box = (g1 >= lo1) & (g1 < hi1) & (g2 >= lo2) & (g2 < hi2)
        p = dens[in_box].sum().item() * h * h
        s1, s2 = samples[:, 0], samples[:, 1]
        freq = ((s1 >= lo1) & (s1 < hi1) & (s2 >= lo2) & (s2 < hi2)).double().mean().item()
        assert abs(p - freq) < 4 * math.sqrt(p * (1 - p) / n) + 0.02 * p


def test_zero_init_is_identity_with_standard_normal_density() -> None:
    model = TarFlow(1, 8, 2, 16, 2, 1, head_dim=8).double()
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64) * 0.5
    z, logdet = model(x)
    assert torch.equal(z, model.patchify(x))
    assert torch.equal(logdet, torch.zeros(5, dtype=torch.float64))
    ref = torch.distributions.Normal(0.0, 1.0).log_prob(x).flatten(1).sum(1)
    assert torch.allclose(model.log_prob(x), ref, atol=1e-10)
    bpd = model.nll_bits_per_dim(x)
    assert torch.allclose(bpd, (-ref / 64 + math.log(128)) / math.log(2), atol=1e-10)


def test_loss_is_per_dim_nll_without_constant() -> None:
    model = _tiny()
    x = torch.randn(7, 1, 8, 8, dtype=torch.float64) * 0.5
    loss = tarflow_loss(model.eval(), x)
    expected = -model.log_prob(x).mean() / 64 - 0.5 * math.log(2 * math.pi)
    assert torch.allclose(loss, expected, atol=1e-10)


def test_patchify_matches_unfold_and_roundtrips() -> None:
    model = TarFlow(3, (4, 6), 2, 16, 1, 1, head_dim=8)
    x = torch.randn(2, 3, 4, 6)
    tokens = model.patchify(x)
    assert torch.equal(tokens, F.unfold(x, 2, stride=2).transpose(1, 2))
    assert torch.equal(model.unpatchify(tokens), x)


def test_causality_of_conditioner() -> None:
    model = _tiny(num_blocks=1)
    block = model.blocks[0]
    u = torch.randn(2, 16, 4, dtype=torch.float64)
    a, b = block.conditioner(u)
    for j in [0, 5, 14]:
        u2 = u.clone()
        u2[:, j] += 1.0
        a2, b2 = block.conditioner(u2)
        assert torch.equal(a2[:, : j + 1], a[:, : j + 1]) and torch.equal(b2[:, : j + 1], b[:, : j + 1])
        assert (a2[:, j + 1 :] - a[:, j + 1 :]).abs().amax(-1).min() > 0  # every later token sees it
    assert torch.equal(a[:, 0], torch.zeros_like(a[:, 0])) and torch.equal(b[:, 0], torch.zeros_like(b[:, 0]))


# ---- sampling ------------------------------------------------------------------------------------


def test_kv_cache_inverse_equals_naive_inverse() -> None:
    # (Random conditioners are kept small: a random autoregressive inverse can blow up exponentially.)
    model = _tiny(std=0.05, num_blocks=3, layers_per_block=2, num_classes=4)
    z = torch.randn(3, 16, 4, dtype=torch.float64) * 0.5
    y = torch.tensor([0, 3, 1])
    for kw in [{}, {"guidance": 1.5}, {"guidance": 2.0, "annealed": True, "attn_temp": 1.7}]:
        fast = model.inverse(z, y, **kw)
        slow = model.inverse(z, y, use_cache=False, **kw)
        assert fast.isfinite().all()
        assert (fast - slow).abs().max() < 1e-10


def test_guidance_zero_is_bitwise_unguided_and_guidance_changes_samples() -> None:
    model = _tiny(torch.float32, num_classes=3)
    y = torch.tensor([0, 1, 2, 1])
    plain = model.sample(4, y, generator=torch.Generator().manual_seed(3))
    zero = model.sample(4, y, guidance=0.0, annealed=True, generator=torch.Generator().manual_seed(3))
    assert torch.equal(plain, zero)
    guided = model.sample(4, y, guidance=2.0, generator=torch.Generator().manual_seed(3))
    annealed = model.sample(4, y, guidance=2.0, annealed=True, generator=torch.Generator().manual_seed(3))
    assert (guided - plain).abs().max() > 1e-3 and (annealed - guided).abs().max() > 1e-4
    # Unconditional models guide with a raised attention temperature on the unconditional branch.
    unc = _tiny(torch.float32)
    a = unc.sample(2, generator=torch.Generator().manual_seed(0))
    b = unc.sample(2, guidance=1.0, attn_temp=2.0, generator=torch.Generator().manual_seed(0))
    assert (a - b).abs().max() > 1e-4


def test_guidance_formula_against_two_branch_outputs() -> None:
    # With one block, the first inverted token uses (a, b) from token 0 alone: check a_c + w (a_c - a_u).
    model = _tiny(num_blocks=1, num_classes=2)
    z = torch.randn(2, 16, 4, dtype=torch.float64)
    y = torch.tensor([1, 0])
    w = 0.7
    a_c, b_c = model.blocks[0].conditioner(z, y)
    a_u, b_u = model.blocks[0].conditioner(z, None)
    a, b = a_c + w * (a_c - a_u), b_c + w * (b_c - b_u)
    x = model.patchify(model.inverse(z, y, guidance=w))
    assert torch.allclose(x[:, 1], z[:, 1] * a[:, 1].exp() + b[:, 1], atol=1e-12)
    assert torch.equal(x[:, 0], z[:, 0])


def test_sample_temperature_and_labels() -> None:
    model = _tiny(num_classes=3)
    y = torch.tensor([2, 2])
    cold = model.sample(2, y, temperature=0.0)
    assert torch.allclose(cold, model.inverse(torch.zeros(2, 16, 4, dtype=torch.float64), y))
    # Label -1 ("dropped") and y=None both use the mean class embedding.
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    assert torch.equal(model.log_prob(x, torch.tensor([-1, -1])), model.log_prob(x))
    assert not torch.allclose(model.log_prob(x, y), model.log_prob(x))
    # label_drop=1 drops every label: the loss equals the unconditional loss.
    model.eval()
    assert torch.allclose(tarflow_loss(model, x, y, label_drop=1.0), tarflow_loss(model, x))


def test_volume_preserving_prior_ema() -> None:
    model = TarFlow(1, 8, 2, 16, 2, 1, head_dim=8, nvp=False)
    x = torch.randn(32, 1, 8, 8) * 0.5
    tarflow_loss(model.train(), x)
    z, _ = model(x)
    assert torch.allclose(model.prior_var, 0.9 + 0.1 * z.pow(2).mean(0), atol=1e-6)
    nvp = TarFlow(1, 8, 2, 16, 2, 1, head_dim=8)
    tarflow_loss(nvp.train(), x)
    assert torch.equal(nvp.prior_var, torch.ones(16, 4))


# ---- denoising -----------------------------------------------------------------------------------


def test_denoise_closed_form_isotropic_gaussian() -> None:
    # A volume-preserving flow at init is the identity; prior variance s^2 makes the model N(0, s^2 I).
    model = TarFlow(1, 8, 2, 16, 2, 1, head_dim=8, nvp=False).double()
    s2, sigma = 0.64, 0.3
    model.prior_var.fill_(s2)
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    assert torch.allclose(model.denoise(x, noise_std=sigma), x * (1 - sigma**2 / s2), atol=1e-12)
    assert torch.allclose(model.denoise(x, noise_std=sigma, step_scale=0.5), x * (1 - 0.5 * sigma**2 / s2))


def test_denoise_closed_form_affine_gaussian() -> None:
    # One affine block with constant log-scale c: token 0 ~ N(0, 1), the others ~ N(0, e^{2c}).
    model = TarFlow(1, 8, 2, 16, 1, 1, head_dim=8).double()
    c, sigma = 0.4, 0.25
    with torch.no_grad():
        model.blocks[0].proj_out.bias[: model.token_dim] = c
    var = torch.full((16, 4), math.exp(2 * c), dtype=torch.float64)
    var[0] = 1.0
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    expected = model.unpatchify(model.patchify(x) * (1 - sigma**2 / var))
    assert torch.allclose(model.denoise(x, noise_std=sigma), expected, atol=1e-12)


def test_score_matches_finite_differences() -> None:
    model = _tiny()
    x = torch.randn(1, 1, 8, 8, dtype=torch.float64) * 0.5
    grad = model.score(x)
    eps = 1e-6
    for idx in [(0, 0, 0, 0), (0, 0, 3, 5), (0, 0, 7, 7)]:
        e = torch.zeros_like(x)
        e[idx] = eps
        fd = (model.log_prob(x + e) - model.log_prob(x - e)).item() / (2 * eps)
        assert abs(fd - grad[idx].item()) < 1e-6


# ---- bad inputs ----------------------------------------------------------------------------------


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="img_size"):
        TarFlow(1, 9, 2, 16, 1, 1, head_dim=8)
    with pytest.raises(ValueError, match="head_dim"):
        TarFlow(1, 8, 2, 20, 1, 1, head_dim=8)
    with pytest.raises(TypeError, match="img_size"):
        TarFlow(1, "8", 2, 16, 1, 1, head_dim=8)
    with pytest.raises(ValueError, match="num_blocks"):
        TarFlow(1, 8, 2, 16, 0, 1, head_dim=8)
    with pytest.raises(TypeError, match="patch_size"):
        TarFlow(1, 8, 2.0, 16, 1, 1, head_dim=8)


def test_bad_call_arguments() -> None:
    model = TarFlow(1, 8, 2, 16, 2, 1, head_dim=8)
    cond = TarFlow(1, 8, 2, 16, 2, 1, head_dim=8, num_classes=3)
    x = torch.zeros(2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 1, 8, 8\)"):
        model.log_prob(torch.zeros(2, 3, 8, 8))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        model.log_prob(x.numpy())
    with pytest.raises(ValueError, match="unconditional"):
        model.log_prob(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="labels in"):
        cond.log_prob(x, torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="integer"):
        cond.log_prob(x, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="guidance"):
        cond.sample(2, torch.tensor([0, 1]), guidance=-1.0)
    with pytest.raises(ValueError, match="attn_temp"):
        model.sample(2, guidance=1.0)  # unconditional guidance needs a raised attention temperature
    with pytest.raises(ValueError, match="needs class labels"):
        cond.sample(2, guidance=1.0)
    with pytest.raises(ValueError, match="noise_std"):
        model.denoise(x, noise_std=-0.1)
    with pytest.raises(ValueError, match="z must be"):
        model.inverse(torch.zeros(2, 16, 3))
    with pytest.raises(ValueError, match="label_drop"):
        tarflow_loss(cond, x, torch.tensor([0, 1]), label_drop=1.5)


def test_warnings() -> None:
    model = TarFlow(1, 8, 2, 16, 2, 1, head_dim=8)
    x = torch.full((2, 1, 8, 8), 0.5)
    with pytest.warns(UserWarning, match="unchanged"):
        out = model.denoise(x, noise_std=0.0)
    assert out is x
    with pytest.warns(UserWarning, match=r"outside \[-1, 1\]"):
        model.log_prob(x * 255)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.log_prob(x * 255)  # warned once per model
    with pytest.warns(UserWarning, match="fp32"):
        model.to(torch.bfloat16).log_prob(x.to(torch.bfloat16))


# ---- reproduction --------------------------------------------------------------------------------


def test_quick_reproduction(tmp_path) -> None:
    from icml25.generative_models.experiments.tarflow import threshold

    report = run_quick(out_dir=tmp_path)
    m = report.metrics
    assert report.paper == "P33"
    assert report.passed and len(report.checks) == 4 and all(report.checks.values())
    assert report.threshold == "; ".join(report.checks) == threshold(quick=True)
    # The headline's baseline is the one the NLL check compares with, under the same name.
    assert report.baseline == "baseline_full_gaussian_nll"
    assert "test NLL < full-covariance Gaussian NLL (baseline)" in report.checks
    assert m["test_nll_nats_per_dim"] < m["baseline_full_gaussian_nll"] < m["baseline_diag_gaussian_nll"]
    assert m["exact_inverse_max_err"] < 1e-4 and m["exact_logdet_max_err"] < 1e-4
    assert m["test_denoise_mse_ratio"] < 1.0  # the score step moves noisy test digits towards clean ones
    assert len(report.figures) == 1 and report.figures[0].exists() and report.figures[0].stat().st_size > 1000


def run_quick(**kwargs):
    from icml25.generative_models.experiments.tarflow import run

    return run(quick=True, seed=0, **kwargs)


class _NoCausalMask:
    """torch.nn.functional with the attention mask dropped: the conditioner sees the token it transforms."""

    def __getattr__(self, name: str):
        return getattr(F, name)

    @staticmethod
    def scaled_dot_product_attention(q, k, v, is_causal=False, **kwargs):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def test_quick_gate_fails_for_a_flow_without_its_autoregressive_mask(monkeypatch) -> None:
    """Broken variant: no causal mask. -sum(a) is then not the log-det, so the reported NLL means nothing;
    the exactness check catches it (the NLL checks alone need not)."""
    from icml25.generative_models import tarflow as tarflow_module
    from icml25.generative_models.experiments import tarflow as experiment

    monkeypatch.setattr(tarflow_module, "F", _NoCausalMask())
    monkeypatch.setitem(experiment._CONFIGS, True, {**experiment._CONFIGS[True], "steps": 100})
    report = run_quick()
    assert report.passed is False
    assert any(name.startswith("exact flow") for name in report.failed_checks)
    assert report.metrics["exact_logdet_max_err"] > 1e-2


def test_quick_gate_fails_for_an_untrained_flow(monkeypatch) -> None:
    """Broken variant: one optimiser step (the zero-initialised flow is the identity, N(0, I) density)."""
    from icml25.generative_models.experiments import tarflow as experiment

    monkeypatch.setitem(experiment._CONFIGS, True, {**experiment._CONFIGS[True], "steps": 1})
    report = run_quick()
    m = report.metrics
    assert report.passed is False
    assert not report.checks["test NLL < full-covariance Gaussian NLL (baseline)"]
    assert not report.checks["test NLL < diagonal Gaussian NLL"]
    assert m["test_nll_nats_per_dim"] > m["baseline_diag_gaussian_nll"] > m["baseline_full_gaussian_nll"]


@pytest.mark.slow
def test_full_reproduction_nll_and_sample_quality() -> None:
    from icml25.generative_models.experiments.tarflow import run

    report = run(quick=False, seed=0)
    m = report.metrics
    assert report.passed and len(report.checks) == 6
    assert m["test_nll_nats_per_dim"] <= m["baseline_full_gaussian_nll"] - 0.05
    assert m["test_nll_nats_per_dim"] < m["baseline_diag_gaussian_nll"]
    assert m["test_denoise_mse_ratio"] < 0.95
    assert m["hf_denoised"] < m["hf_raw"]
    assert m["classifier_conf_denoised"] > m["baseline_classifier_conf_full_gaussian"]
