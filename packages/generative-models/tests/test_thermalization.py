"""Tests for P02 Thermalizer: DDPM formulas, heterogeneous denoising, rollout, KS/L96 solvers, reproduction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from icml25.generative_models.systems import (
    KSETDRK4,
    energy_spectrum,
    ks_simulate,
    lorenz96_simulate,
    lorenz96_tendency,
)
from icml25.generative_models.thermalizer import (
    MLP,
    LevelMLP,
    PeriodicConvNet1d,
    ResidualEmulator,
    SpectralLevelHead1d,
    Thermalizer,
    choose_levels,
    cosine_beta_schedule,
    periodic_symmetry_augment,
    select_levels,
    spectral_reference,
    spectrum_rmse,
    stability_band,
    stable_mask,
    thermalized_rollout,
)

# --------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------


class GaussianOracle(nn.Module):
    """Exact ε-predictor for data μ = N(0, I): x_k ~ N(0, I), so E[ε | x_k] = sqrt(1 − ᾱ_k)·x_k."""

    def __init__(self, alpha_bar: torch.Tensor):
        super().__init__()
        self.register_buffer("alpha_bar", alpha_bar)
        self.calls = 0

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return (1.0 - self.alpha_bar[k]).sqrt()[:, None] * x


class ConstantLevel(nn.Module):
    """Level head that reports a fixed level and records that it never sees NaN."""

    def __init__(self, T: int, level: int):
        super().__init__()
        self.T, self.level = T, level

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert torch.isfinite(x).all(), "NaN fed to the classifier"
        logits = torch.zeros(x.shape[0], self.T)
        logits[:, self.level] = 1.0
        return logits


def oracle_thermalizer(T: int = 100, level: int = 0, d: int = 8) -> Thermalizer:
    th = Thermalizer(nn.Identity(), ConstantLevel(T, level), T=T, time_conditioned=True)
    th.eps_net = GaussianOracle(th.alpha_bar.clone())
    return th


# --------------------------------------------------------------------------------------------------------
# DDPM schedule and formulas
# --------------------------------------------------------------------------------------------------------


def test_cosine_schedule_closed_form():
    T, s = 1000, 0.008
    betas = cosine_beta_schedule(T, s)
    f = [math.cos(((t / T + s) / (1 + s)) * math.pi / 2) ** 2 for t in range(T + 1)]
    expect = torch.tensor([min(1 - f[t + 1] / f[t], 0.999) for t in range(T)], dtype=torch.float64)
    torch.testing.assert_close(betas, expect, rtol=1e-10, atol=1e-12)
    th = Thermalizer(nn.Identity(), nn.Identity(), T=T)
    ab = th.alpha_bar.double()
    assert (ab[1:] < ab[:-1]).all() and float(th.betas.max()) <= 0.999 + 1e-7
    # ᾱ_k = f(k+1)/f(0) before clipping bites (the reference's indexing).
    torch.testing.assert_close(
        ab[:900], torch.tensor(f[1:901], dtype=torch.float64) / f[0], rtol=1e-5, atol=1e-6
    )
    assert abs(float(ab[0]) - 1.0) < 1e-4
    # Paper's scale: level 10 ≈ 0.025 noise std, level 4 ≈ 0.014 (at T = 1000).
    assert float((1 - ab[10]).sqrt()) == pytest.approx(0.025, abs=0.003)
    assert float((1 - ab[4]).sqrt()) == pytest.approx(0.014, abs=0.003)


def test_forward_noising_of_zero_has_std_sqrt_one_minus_alpha_bar():
    th = Thermalizer(nn.Identity(), nn.Identity(), T=100)
    k = torch.tensor([0, 5, 50, 99])
    noise = torch.randn(4, 20000, generator=torch.Generator().manual_seed(0))
    xk = th.q_sample(torch.zeros(4, 20000), k, noise)
    torch.testing.assert_close(xk, (1 - th.alpha_bar[k]).sqrt()[:, None] * noise)
    torch.testing.assert_close(xk.std(1), (1 - th.alpha_bar[k]).sqrt(), rtol=0.03, atol=0)


def test_posterior_matches_gaussian_bayes_and_reverse_step_with_true_eps():
    th = Thermalizer(nn.Identity(), nn.Identity(), T=50)
    g = torch.Generator().manual_seed(1)
    x0, eps = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    k = torch.tensor([1, 2, 7, 20, 33, 49])
    xk = th.q_sample(x0, k, eps)
    mean, std = th.posterior(x0, xk, k)
    # Independent derivation: x_{k-1} ~ N(sqrt(ᾱ_{k-1}) x0, 1-ᾱ_{k-1}); x_k | x_{k-1} ~ N(sqrt(α_k) x_{k-1}, β_k).
    abp, a, b = th.alpha_bar[k - 1].double(), th.alphas[k].double(), th.betas[k].double()
    prec = 1 / (1 - abp) + a / b
    m = (
        abp.sqrt()[:, None] * x0.double() / (1 - abp)[:, None] + a.sqrt()[:, None] * xk.double() / b[:, None]
    ) / prec[:, None]
    torch.testing.assert_close(mean.double(), m, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(std[:, 0].double() ** 2, 1 / prec, rtol=1e-4, atol=1e-9)
    # A reverse step with the true ε and z = 0 is the posterior mean.
    th.eps_net = _Const(eps)
    torch.testing.assert_close(th.reverse_step(xk, k, torch.zeros_like(xk)), mean, rtol=1e-4, atol=1e-5)


class _Const(nn.Module):
    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value


# --------------------------------------------------------------------------------------------------------
# Heterogeneous denoising
# --------------------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    levels=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    stop=st.integers(-1, 12),
    forward=st.booleans(),
)
def test_denoise_counts_identity_and_batch_independence(levels, stop, forward):
    th = oracle_thermalizer(T=40)
    B, d = len(levels), 3
    g = torch.Generator().manual_seed(len(levels) * 100 + stop)
    x = torch.randn(B, d, generator=g) * 2.0
    lv = torch.tensor(levels)
    noise = torch.randn(max(levels) + 1, B, d, generator=g)
    out, n = th.denoise(x, lv, stop, forward_diffuse=forward, noise=noise)
    assert n.tolist() == [max(k - stop, 0) for k in levels]
    untouched = lv <= stop
    assert torch.equal(out[untouched], x[untouched])  # bitwise identity
    for b in range(B):  # heterogeneous batch == each element alone under the same draws
        ob, nb = th.denoise(
            x[b : b + 1],
            lv[b : b + 1],
            stop,
            forward_diffuse=forward,
            noise=noise[: levels[b] + 1, b : b + 1],
        )
        torch.testing.assert_close(out[b : b + 1], ob, rtol=1e-5, atol=1e-6)
        assert int(nb) == int(n[b])


def test_oracle_thermalization_pulls_inflated_state_towards_typical_norm():
    d, T = 256, 100
    th = oracle_thermalizer(T=T)
    x = torch.randn(8, d, generator=torch.Generator().manual_seed(0))
    x = x / x.norm(dim=1, keepdim=True) * math.sqrt(d) * 1.5
    out, n = th.denoise(x, torch.full((8,), 60), stop=0, generator=torch.Generator().manual_seed(1))
    before = (x.norm(dim=1) - math.sqrt(d)).abs()
    after = (out.norm(dim=1) - math.sqrt(d)).abs()
    assert (after < 0.25 * before).all(), (before, after)
    assert n.tolist() == [60] * 8


# --------------------------------------------------------------------------------------------------------
# Rollout
# --------------------------------------------------------------------------------------------------------


def test_plain_rollout_matches_manual_loop_and_batch_of_one():
    torch.manual_seed(0)
    emu = ResidualEmulator(MLP(6, 6, 16, 2)).eval()
    x0 = torch.randn(3, 6)
    res = thermalized_rollout(emu, None, x0, 7)
    x = x0
    with torch.no_grad():
        for n in range(1, 8):
            x = emu(x)
            torch.testing.assert_close(res.states[:, n], x)
    assert (res.levels == -1).all() and (res.n_denoise_steps == 0).all() and (res.aborted_at == -1).all()
    one = thermalized_rollout(emu, None, x0[:1], 7)
    torch.testing.assert_close(one.states[0], res.states[0])


def test_rollout_fires_only_above_s_init_and_counts_steps():
    T = 50
    th = oracle_thermalizer(T=T, level=9)
    emu = nn.Identity()
    x0 = torch.randn(2, 8)
    res = thermalized_rollout(
        emu, th, x0, 5, s_init=6, s_stop=2, noise_limit=None, generator=torch.Generator().manual_seed(0)
    )
    assert (res.levels[:, 1:] == 9).all() and (res.n_denoise_steps[:, 1:] == 7).all()
    assert float(res.fired[:, 1:].float().mean()) == 1.0
    # s_init at the top level: the denoiser is never called.
    th.eps_net.calls = 0
    res = thermalized_rollout(emu, th, x0, 5, s_init=T - 1, s_stop=2, noise_limit=None)
    assert th.eps_net.calls == 0 and (res.n_denoise_steps == 0).all()
    torch.testing.assert_close(res.states[:, -1], x0)


def test_rollout_aborts_nan_and_noise_limit_elements_only():
    class NaNOnFirst(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            y[x[:, 0] > 100] = float("nan")
            return y

    th = oracle_thermalizer(T=50, level=0)
    x0 = torch.zeros(3, 4)
    x0[1, 0] = 1000.0
    res = thermalized_rollout(
        NaNOnFirst(), th, x0, 4, s_init=6, s_stop=2
    )  # ConstantLevel asserts finite input
    assert res.aborted_at.tolist() == [-1, 1, -1]
    assert torch.isnan(res.states[1, 1:]).all() and torch.isfinite(res.states[[0, 2]]).all()
    over = oracle_thermalizer(T=50, level=30)
    res = thermalized_rollout(nn.Identity(), over, torch.zeros(2, 4), 3, s_init=6, s_stop=2, noise_limit=20)
    assert res.aborted_at.tolist() == [1, 1] and (res.levels[:, 1] == 30).all()


def test_rollout_bad_inputs():
    th = oracle_thermalizer(T=50)
    x0 = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"emulator output shape \(2, 3\).*input shape \(2, 4\)"):
        thermalized_rollout(lambda x: x[:, :3], th, x0, 2)
    with pytest.raises(ValueError, match="s_stop must be < s_init"):
        thermalized_rollout(nn.Identity(), th, x0, 2, s_init=4, s_stop=4)
    with pytest.raises(ValueError, match="s_init must be an int in"):
        thermalized_rollout(nn.Identity(), th, x0, 2, s_init=50)
    with pytest.raises(ValueError, match="x0 must be finite"):
        thermalized_rollout(nn.Identity(), th, torch.full((1, 4), float("nan")), 2)
    with pytest.raises(ValueError, match="n_steps"):
        thermalized_rollout(nn.Identity(), th, x0, 0)
    with pytest.raises(TypeError, match="thermalizer"):
        thermalized_rollout(nn.Identity(), "nope", x0, 2)
    with pytest.raises(ValueError, match="noise_limit"):
        thermalized_rollout(nn.Identity(), th, x0, 2, s_init=10, s_stop=4, noise_limit=5)
    with pytest.warns(UserWarning, match="3x"):
        thermalized_rollout(nn.Identity(), th, x0 * 10, 1, noise_limit=None)
    with pytest.raises(ValueError, match="schedule"):
        Thermalizer(nn.Identity(), nn.Identity(), T=10, schedule="quadratic")


# --------------------------------------------------------------------------------------------------------
# Systems
# --------------------------------------------------------------------------------------------------------


def test_ks_conserves_mean_and_linear_modes_are_exact():
    solver = KSETDRK4(L=22.0, N=64, dt=0.25)
    rng = np.random.default_rng(0)
    u = rng.normal(size=(3, 64)) + 0.7  # non-zero mean
    v = solver.step(u, 40)
    np.testing.assert_allclose(v.mean(-1), u.mean(-1), atol=1e-10)
    # A tiny single mode evolves linearly: amplitude × exp((q² − q⁴) t).
    x = np.arange(64) * 22.0 / 64
    q = 2 * np.pi * 2 / 22.0
    u = 1e-8 * np.cos(q * x)
    np.testing.assert_allclose(solver.step(u, 8), u * np.exp((q**2 - q**4) * 2.0), rtol=1e-6, atol=1e-15)


def test_ks_etdrk4_is_fourth_order():
    u0 = ks_simulate(1, 1, dt=0.25, substeps=4, spinup=50, seed=3)[:, 0].astype(np.float64)

    def solve(dt: float) -> np.ndarray:
        return KSETDRK4(dt=dt).step(u0, round(2.0 / dt))

    ref = solve(1 / 256)
    e1, e2, e3 = (np.abs(solve(dt) - ref).max() for dt in (1 / 8, 1 / 16, 1 / 32))
    # Measured ratios 9.0 then 10.2: high order, approaching 16 (4th order) as dt shrinks (stiff pre-asymptotic).
    assert 7 < e1 / e2 < e2 / e3 < 20, (e1, e2, e3)
    assert e1 < 5e-5


def test_ks_matches_known_statistics():
    # Energy spectrum peaks near the most unstable wavenumber q = 1/√2 (k = 2..3 at L = 22), and the
    # leading Lyapunov exponent at L = 22 is ≈ 0.043–0.048 (Cvitanović et al. 2010; Edson et al. 2019).
    u = ks_simulate(8, 400, dt=0.25, substeps=4, spinup=100, seed=0)
    assert int(np.argmax(energy_spectrum(u).mean(0))) in (2, 3)
    solver = KSETDRK4(dt=0.25)
    a = u[:, -1].astype(np.float64)
    d0 = 1e-7
    pert = np.random.default_rng(1).normal(size=a.shape)
    b = a + d0 * pert / np.linalg.norm(pert, axis=1, keepdims=True)
    log_growth, t_total = 0.0, 0.0
    for _ in range(300):  # renormalise every 2 time units
        a, b = solver.step(a, 8), solver.step(b, 8)
        dist = np.linalg.norm(b - a, axis=1, keepdims=True)
        log_growth += np.log(dist[:, 0] / d0)
        b = a + (b - a) * d0 / dist
        t_total += 2.0
    lyap = float(np.mean(log_growth / t_total))
    assert 0.03 < lyap < 0.065, lyap


def test_lorenz96_energy_identity_and_statistics():
    x = np.random.default_rng(0).normal(size=(5, 20))
    # The advection term conserves Σx²: Σ x·[(x_{k+1} − x_{k−2}) x_{k−1}] = 0.
    np.testing.assert_allclose((x * (lorenz96_tendency(x, 0.0) + x)).sum(-1), 0.0, atol=1e-10)
    traj = lorenz96_simulate(4, 400, K=20, seed=0)
    assert 2.0 < traj.mean() < 2.7 and 3.3 < traj.std() < 4.0  # F = 8 climatology (mean ≈ 2.3, std ≈ 3.6)


def test_system_bad_inputs():
    with pytest.raises(ValueError, match="N must be an even"):
        KSETDRK4(N=63)
    with pytest.raises(ValueError, match="u0 must have shape"):
        ks_simulate(2, 3, u0=np.zeros((2, 10)))
    with pytest.raises(ValueError, match="n_steps"):
        lorenz96_simulate(2, 0)


def test_residual_emulator_starts_as_identity_and_learns_a_linear_map():
    traj = torch.zeros(8, 30, 4)
    traj[:, 0] = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)) * 3 + 1
    for n in range(1, 30):
        traj[:, n] = 0.9 * traj[:, n - 1] + 0.1  # x_{n+1} = 0.9 x_n + 0.1
    emu = ResidualEmulator(MLP(4, 4, 32, 2, zero_out=True))
    torch.testing.assert_close(emu(traj[:, 0]), traj[:, 0])
    emu.fit(traj, n_iter=600, batch_size=64, lr=3e-3)
    with torch.no_grad():
        err = (emu(traj[:, :-1]) - traj[:, 1:]).pow(2).mean()
    assert float(err) < 1e-3 * float((traj[:, :-1] - traj[:, 1:]).pow(2).mean()) + 1e-4


def test_residual_emulator_multi_step_loss():
    # rollout = 2: the loss is the mean of the one- and two-step MSEs of the autoregressive prediction,
    # so a map that is exact for one step is exact for both, and a rejected rollout leaves no trace.
    traj = torch.zeros(4, 12, 3)
    traj[:, 0] = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)) + 2
    for n in range(1, 12):
        traj[:, n] = 0.8 * traj[:, n - 1]
    torch.manual_seed(0)
    emu = ResidualEmulator(MLP(3, 3, 32, 2, zero_out=True))
    emu.fit(traj, n_iter=400, batch_size=32, lr=3e-3, rollout=2)
    with torch.no_grad():
        two = emu(emu(traj[:, :-2]))
    scale = float(traj[:, 2:].pow(2).mean())
    assert float((two - traj[:, 2:]).pow(2).mean()) < 1e-3 * scale
    before = {k: v.clone() for k, v in emu.state_dict().items()}
    with pytest.raises(ValueError, match=r"at least rollout \+ 1 = 13 steps"):
        emu.fit(traj, n_iter=2, rollout=12)
    with pytest.raises(ValueError, match="rollout must be an int >= 1"):
        emu.fit(traj, n_iter=2, rollout=0)
    assert all(torch.equal(before[k], v) for k, v in emu.state_dict().items())


# --------------------------------------------------------------------------------------------------------
# Symmetries and conserved mean
# --------------------------------------------------------------------------------------------------------


def test_periodic_augment_is_a_ks_symmetry_and_keeps_pairs_aligned():
    solver = KSETDRK4(L=22.0, N=64, dt=0.25)
    u = torch.from_numpy(ks_simulate(4, 1, dt=0.25, substeps=4, spinup=20, seed=5)[:, 0].astype(np.float64))
    pair = torch.stack([u, torch.from_numpy(solver.step(u.numpy(), 4))], 1)  # (4, 2, 64): (u_n, u_{n+1})
    aug = periodic_symmetry_augment(pair, torch.Generator().manual_seed(3))
    # Shift + reflection u(x) -> -u(-x) commute with the KS flow: stepping the transformed state gives the
    # transformed next state (to solver rounding), so augmented pairs are exact training pairs.
    np.testing.assert_allclose(solver.step(aug[:, 0].numpy(), 4), aug[:, 1].numpy(), atol=1e-9)
    # It is an isometry with a per-element sign: energies are unchanged.
    torch.testing.assert_close(aug.pow(2).sum(-1), pair.pow(2).sum(-1))


def test_spectral_level_head_is_shift_and_reflection_invariant():
    torch.manual_seed(0)
    head = SpectralLevelHead1d(32, 10)
    x = torch.randn(5, 32)
    ref = head(x)
    torch.testing.assert_close(head(torch.roll(x, 7, -1)), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(head(-torch.flip(x, (-1,))), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("depth", "growth", "field"), [(4, 1, 17), (5, 2, 37), (6, 2, 64)])
def test_periodic_convnet_receptive_field_and_shift_equivariance(depth, growth, field):
    torch.manual_seed(0)
    net = PeriodicConvNet1d(8, depth, 5, dilation_growth=growth)
    x = torch.randn(3, 64, requires_grad=True)
    net(x)[0, 0].backward()
    assert int((x.grad[0].abs() > 0).sum()) == field  # 1 + 4·(2 + Σ growthⁱ), capped at the domain
    y = x.detach()
    torch.testing.assert_close(net(torch.roll(y, 5, -1)), torch.roll(net(y), 5, -1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="dilation_growth"):
        PeriodicConvNet1d(8, depth, 5, dilation_growth=0)


def test_mean_free_thermalizer_and_mean_conserving_emulator_keep_the_spatial_mean():
    torch.manual_seed(0)
    th = Thermalizer(LevelMLP(16, 32, 3), MLP(16, 50, 32, 2), T=50, mean_free=True)
    x = torch.randn(6, 16) + torch.linspace(-2, 2, 6)[:, None]
    out, n = th.denoise(
        x, torch.tensor([0, 3, 10, 20, 30, 49]), 2, generator=torch.Generator().manual_seed(1)
    )
    # Forward diffusion scales the mean by sqrt(ᾱ_k); each reverse step divides it by sqrt(α_i): the
    # mean ends at sqrt(ᾱ_stop) times its start (levels <= stop are untouched).
    shrink = torch.where(n > 0, th.alpha_bar[2].sqrt(), torch.tensor(1.0))
    torch.testing.assert_close(out.mean(-1), x.mean(-1) * shrink, rtol=1e-4, atol=1e-4)
    loss, _ = th.loss(torch.randn(8, 16) * 2)
    assert torch.isfinite(loss)
    emu = ResidualEmulator(MLP(16, 16, 32, 2), conserve_mean=True)
    with torch.no_grad():
        torch.testing.assert_close(emu(x).mean(-1), x.mean(-1), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------------
# Reproduction
# --------------------------------------------------------------------------------------------------------


def test_spectral_level_head_recovers_injected_level_on_held_out_ks_snapshots():
    # The library's SpectralLevelHead1d (not the reproduction's head, which test_quick_reproduction checks
    # as trained by the run), trained with the DDPM loss on clean KS snapshots only, recovers the level
    # injected into held-out snapshots (brief: within ±2 at >= 80%).
    torch.manual_seed(0)
    train = ks_simulate(8, 200, dt=0.25, substeps=4, spinup=100, seed=11).reshape(-1, 64)
    held = torch.from_numpy(ks_simulate(4, 50, dt=0.25, substeps=4, spinup=100, seed=12).reshape(-1, 64))
    T = 100
    th = Thermalizer(LevelMLP(64, 32, 2), SpectralLevelHead1d(64, T, 128), T=T, mean_free=True)
    th.fit(train, n_iter=800, batch_size=64, lr=2e-3, ema_decay=None, augment=periodic_symmetry_augment)
    gen = torch.Generator().manual_seed(0)
    for k in (0, 2, 5, 10):  # the levels around s_stop..s_init where the rollout decides
        noise = th.project(torch.randn(held.shape, generator=gen))
        noisy = th.denormalize(th.q_sample(th.normalize(held), torch.full((held.shape[0],), k), noise))
        acc = float(((th.noise_level(noisy) - k).abs() <= 2).float().mean())
        assert acc >= 0.8, (k, acc)


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    from icml25.generative_models.experiments.thermalization import run

    return run(quick=True, seed=0, out_dir=tmp_path_factory.mktemp("p02"))


def test_quick_reproduction(quick_report):

    m = quick_report.metrics
    # Recorded expectation (catalog.toml: expect = "miss"): the quick run misses its spectrum gate
    # (thermalized spectrum RMSE > 2x the truth's) and holds the claim's checks. Another CPU's vector kernels
    # round differently, which the chaotic rollouts turn into another realisation, so the test asserts the
    # claim-relevant checks, not the exact set of failed ones: with (s_init, s_stop) = (5, 1) and the 2-step
    # rollout emulator the firing rate is 0.12-0.29 over seeds 0-4 (AVX-512 Xeon; 0.13-0.26 under
    # ATEN_CPU_CAPABILITY=default), under its 50% bound, but it is a sanity check, not the claim (with the
    # one-step emulator the sweep's pick, (4, 1), went over it: 0.517 on the Xeon, 0.47 on an AMD EPYC, seed 0).
    firing = "firing rate in [0.1%, 50%]"
    assert quick_report.passed is False
    assert "spectrum RMSE <= 2x truth" in quick_report.failed_checks
    assert set(quick_report.failed_checks) <= {"spectrum RMSE <= 2x truth", firing}
    assert len(quick_report.checks) == 5 and firing in quick_report.checks
    # The held checks, with the numbers behind them: the precondition (the plain emulator fails) and the
    # central ordering (thermalized rollouts stable far more often than the plain emulator's).
    assert m["baseline_fail_fraction"] >= 0.5
    assert m["stable_fraction"] >= 0.7 and m["stable_fraction"] >= m["baseline_stable_fraction"] + 0.4
    assert m["mse_first5"] <= 1.5 * m["baseline_mse_first5"]
    assert m["spectrum_rmse"] > 2 * m["truth_spectrum_rmse"]
    # The thermalizer intervenes, and not at every step (a head that always or never detects noise fails).
    assert 0.001 <= m["fire_rate"] < 1.0 and m["mean_denoise_steps_when_fired"] >= 1.0
    # The level head the run uses (ConvLevelHead1d, trained inside the run) on held-out test snapshots,
    # within ±2 of the injected level: the brief's >= 80% holds at k = 0 and 2 (at k = 5 and 10 it is
    # missed at the quick budget: measured 0.33 / 0.69 at seed 0 on an AMD EPYC; the rollout decides there).
    assert m["level_acc_pm2_k0"] >= 0.8 and m["level_acc_pm2_k2"] >= 0.8
    assert len(quick_report.figures) == 1 and quick_report.figures[0].stat().st_size > 1000


@pytest.mark.slow
def test_full_reproduction_matches_its_recorded_known_miss():
    """The catalog records a known miss in full (results/P02.json, seed 0): only the spectrum gate fails
    (0.1651 vs the bound 0.1637 on the recording Xeon); the plain emulator fails on every IC and every
    thermalized rollout stays stable through H = 3000."""
    from icml25.generative_models.experiments.thermalization import run

    report = run(quick=False, seed=0)
    m = report.metrics
    assert report.passed is False
    assert report.failed_checks == ["spectrum RMSE <= 2x truth"]
    assert m["baseline_fail_fraction"] >= 0.5
    assert m["stable_fraction"] >= 0.8 and m["stable_fraction"] >= m["baseline_stable_fraction"] + 0.4
    assert m["spectrum_rmse"] > 2 * m["truth_spectrum_rmse"]


def test_quick_gate_fails_for_a_thermalizer_that_never_fires(monkeypatch):
    """Broken variant: an untrained thermalizer whose classifier always reports level 0, so it never
    denoises; the rollouts are the plain emulator's and the stability ordering must fail."""
    from icml25.generative_models.experiments.thermalization import run

    monkeypatch.setattr(Thermalizer, "fit", lambda self, *args, **kwargs: self.eval())
    monkeypatch.setattr(Thermalizer, "noise_level", lambda self, x: torch.zeros(x.shape[0], dtype=torch.long))
    report = run(quick=True, seed=0)
    m = report.metrics
    assert report.passed is False
    assert m["fire_rate"] == 0.0 and m["stable_fraction"] == m["baseline_stable_fraction"]
    name = "thermalized stable fraction >= 0.7 and >= plain emulator's + 0.4"
    assert report.checks[name] is False
    assert set(report.failed_checks) == {name, "spectrum RMSE <= 2x truth", "firing rate in [0.1%, 50%]"}


def test_level_selection_rule():
    # {pair: (stable fraction, firing rate, spectrum RMSE)}
    scores = {
        (2, 0): (1.0, 0.60, 0.10),  # best spectrum but fires too often: inadmissible
        (4, 1): (1.0, 0.30, 0.20),  # admissible, fully stable, best admissible spectrum -> chosen
        (6, 2): (1.0, 0.05, 0.40),
        (8, 3): (0.9, 0.01, 0.05),  # best spectrum among the admissible, but less stable
        (10, 4): (1.0, 0.0, 0.30),  # never fires: inadmissible
    }
    assert choose_levels(scores) == (4, 1)
    # Stability comes first, then spectrum; with nothing admissible every pair competes.
    assert choose_levels({(6, 2): (0.5, 0.1, 0.1), (8, 3): (1.0, 0.1, 0.9)}) == (8, 3)
    assert choose_levels({(2, 0): (1.0, 0.9, 0.3), (10, 4): (1.0, 0.0, 0.2)}) == (10, 4)
    with pytest.raises(ValueError, match="scores must be a non-empty"):
        choose_levels({})


def test_select_levels_scores_every_candidate():
    th = oracle_thermalizer(T=50, level=5)  # constant k̂ = 5: fires iff s_init < 5
    x0 = torch.randn(3, 8) * 0.5
    kw = dict(band=(1e-3, 1e3), log_ref=np.zeros(5), modes=np.arange(5), noise_limit=None, seed=0)
    best, scores = select_levels(nn.Identity(), th, x0, [(6, 2), (4, 1)], horizon=6, window=3, **kw)
    assert set(scores) == {(6, 2), (4, 1)} and best in scores
    assert scores[(6, 2)][:2] == (1.0, 0.0) and scores[(4, 1)][:2] == (1.0, 1.0)
    with pytest.raises(ValueError, match="candidates must be a non-empty"):
        select_levels(nn.Identity(), th, x0, [], horizon=6, window=3, **kw)
    with pytest.raises(ValueError, match=r"window must be in \(0, horizon=6\], got 7"):
        select_levels(nn.Identity(), th, x0, [(6, 2)], horizon=6, window=7, **kw)


# --------------------------------------------------------------------------------------------------------
# Rollout diagnostics (library functions behind the reproduction's checks)
# --------------------------------------------------------------------------------------------------------


def test_stability_band_and_stable_mask():
    # Energies mean(x²) of 2 trajectories x 500 steps are exactly 1, 2, ..., 1000 (in a random order), so
    # the band is [0.5·q_0.1%, 1.5·q_99.9%] of that set.
    energy = np.random.default_rng(0).permutation(np.arange(1.0, 1001.0)).reshape(2, 500)
    traj = np.sqrt(energy)[..., None] * np.ones(4)  # (2, 500, 4), every point x² = energy
    lo, hi = stability_band(traj)
    assert lo == pytest.approx(0.5 * np.quantile(np.arange(1.0, 1001.0), 0.001))
    assert hi == pytest.approx(1.5 * np.quantile(np.arange(1.0, 1001.0), 0.999))
    e = np.array([[1.0, 5.0, 9.0], [1.0, np.nan, 2.0], [1.0, 2.0, 1e9], [0.1, 1.0, 1.0]])
    assert stable_mask(e, (0.5, 10.0)).tolist() == [True, False, False, False]
    assert stable_mask(torch.tensor(e), (0.5, 10.0)).tolist() == [True, False, False, False]
    with pytest.raises(ValueError, match="band must be a pair"):
        stable_mask(e, (10.0, 0.5))
    with pytest.raises(ValueError, match=r"energy must have shape \(B, n_steps\)"):
        stable_mask(e[..., None], (0.5, 10.0))
    with pytest.raises(ValueError, match="trajectories must be finite"):
        stability_band(np.full((2, 3, 4), np.nan))


def test_spectrum_rmse_against_a_known_spectrum():
    # Single-mode fields a·cos(2πmx/N) have power a²N/4 at mode m; a reference built from amplitude 1 and
    # segments of amplitude e gives a log-power error of exactly 2·log e on that mode.
    n, x = 16, np.arange(16)
    ref_traj = np.cos(2 * np.pi * 3 * x / n) + 0.5 * np.cos(2 * np.pi * 5 * x / n)
    log_ref, modes = spectral_reference(np.broadcast_to(ref_traj, (2, 4, n)).copy())
    assert modes.tolist() == [3, 5]
    seg = np.stack([np.broadcast_to(ref_traj, (3, n)), np.broadcast_to(np.e * ref_traj, (3, n))])
    blown = np.full((1, 3, n), np.nan)
    out = spectrum_rmse(np.concatenate([seg, blown]), log_ref, modes)
    np.testing.assert_allclose(out[:2], [0.0, 2.0], atol=1e-12)
    assert out[2] == np.inf  # a blown-up rollout is infinitely far from the climatology
    with pytest.raises(ValueError, match="modes must be a non-empty"):
        spectrum_rmse(seg, log_ref, np.array([9]))
    with pytest.raises(ValueError, match=r"log_ref must be a float array of shape \(9,\)"):
        spectrum_rmse(seg, log_ref[:5], modes)


def test_level_accuracy_of_an_exact_classifier():
    # A classifier that reads the noise level off the state's norm (data: zeros, so x_k has norm
    # sqrt((1 − ᾱ_k)·d)) is exact at every level; one stuck at level 0 is right only within the tolerance.
    T, d = 50, 65536

    class NormLevel(nn.Module):
        def __init__(self, sigmas: torch.Tensor):
            super().__init__()
            self.register_buffer("sigmas", sigmas)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.pow(2).mean(-1).sqrt()[:, None]
            return -(s - self.sigmas[None]).abs()

    th = Thermalizer(nn.Identity(), nn.Identity(), T=T)
    th.level_head = NormLevel((1 - th.alpha_bar).sqrt())
    x = torch.zeros(16, d)
    acc = th.level_accuracy(x, [0, 5, 20], tolerance=0, generator=torch.Generator().manual_seed(0))
    assert acc == {0: 1.0, 5: 1.0, 20: 1.0}
    stuck = oracle_thermalizer(T=T, level=0)
    assert stuck.level_accuracy(torch.randn(8, 8), [0, 2, 3], tolerance=2) == {0: 1.0, 2: 1.0, 3: 0.0}
    with pytest.raises(ValueError, match=r"levels\[0\] must be an int in \[0, 49\], got 50"):
        th.level_accuracy(x, [50])
    with pytest.raises(ValueError, match="tolerance must be an int >= 0"):
        th.level_accuracy(x, [1], tolerance=-1)


def test_library_calls_leave_the_global_rng_alone():
    from icml25.kernels.rng import global_rng_state

    emu = ResidualEmulator(MLP(8, 8, 16, 2), sigma=0.1)
    th = Thermalizer(MLP(8, 8, 16, 2), MLP(8, 20, 16, 2), T=20)
    data = torch.randn(4, 10, 8, generator=torch.Generator().manual_seed(0))
    before = global_rng_state()
    emu.fit(data, n_iter=2, batch_size=4, seed=1, augment=periodic_symmetry_augment)
    th.fit(data.reshape(-1, 8), n_iter=2, batch_size=4, seed=1, augment=periodic_symmetry_augment)
    res = thermalized_rollout(emu, th, data[:, 0], 3, s_init=3, s_stop=1, generator=torch.Generator())
    th.level_accuracy(data[:, 0], [1, 5], generator=torch.Generator())
    assert global_rng_state() == before
    assert res.states.shape == (4, 4, 8)


def test_experiment_module_command_line(capsys):
    from icml25.generative_models.experiments.thermalization import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--full" in out and "--seed" in out and "--out" in out
