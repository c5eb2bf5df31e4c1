"""P06 K²VAE: exact checks of the Kalman filter, the Koopman operator, the KL and the metrics; shapes and
equivariances; the §8 bad inputs; the quick reproduction and a broken variant that fails it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from icml25.generative_models.forecasting import (
    K2VAE,
    DifferentiableKalmanFilter,
    K2VAEForecaster,
    KoopmanOperator,
    RevIN,
    crps_from_samples,
    gaussian_crps,
    interval_coverage,
    kl_to_standard_normal,
    nmae,
    weighted_quantile_loss,
)
from icml25.generative_models.forecasting import k2vae as k2mod

SMALL = {"patch_len": 8, "latent_dim": 6, "hidden_dim": 16, "hidden_layers": 1, "d_model": 8, "n_heads": 2}


def _kf(dim: int, **kw) -> DifferentiableKalmanFilter:
    torch.manual_seed(0)
    return DifferentiableKalmanFilter(dim, **kw).double()


# ------------------------------------------------------------------------------------------ Kalman
def test_kalman_matches_scalar_numpy_filter() -> None:
    kf = _kf(1)
    q, r = 0.3, 0.7
    with torch.no_grad():
        kf.L_Q.fill_(q**0.5)
        kf.L_R.fill_(r**0.5)
    rng = np.random.default_rng(0)
    y, u, x0 = rng.normal(size=(3, 6)), rng.normal(size=(3, 6)), rng.normal(size=3)
    states, covs = kf(torch.tensor(x0)[:, None], torch.tensor(y)[..., None], torch.tensor(u)[..., None])
    for b in range(3):
        x, P = x0[b], 1.0
        for t in range(6):
            xp, Pp = x + u[b, t], P + q
            g = Pp / (Pp + r)
            x, P = xp + g * (y[b, t] - xp), (1 - g) ** 2 * Pp + g * g * r
            assert abs(states[b, t, 0].item() - x) < 1e-6
            assert abs(covs[t, 0, 0].item() - P) < 1e-6


def test_kalman_matches_brute_force_gaussian_posterior() -> None:
    """Filtered mean/cov of x_t = the exact posterior of the joint linear-Gaussian model given y_1..y_t."""
    d, S = 2, 4
    kf = _kf(d, init="randn")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        kf.H.copy_(
            torch.randn(d, d, generator=g, dtype=torch.float64) + 2 * torch.eye(d, dtype=torch.float64)
        )
        kf.L_Q.copy_(torch.tril(torch.randn(d, d, generator=g, dtype=torch.float64)) + torch.eye(d))
        kf.L_R.copy_(torch.tril(torch.randn(d, d, generator=g, dtype=torch.float64)) + torch.eye(d))
    x0 = torch.randn(1, d, generator=g, dtype=torch.float64)
    y = torch.randn(1, S, d, generator=g, dtype=torch.float64)
    u = torch.randn(1, S, d, generator=g, dtype=torch.float64)
    states, covs = kf(x0, y, u)
    Fm, Bm, Hm, Q, R = (m.detach().numpy() for m in (kf.F, kf.B, kf.H, kf.Q, kf.R))
    # Joint of (x_1..x_S) as a linear map of (x_0 ~ N(x0, I), w_1..w_S) plus the control mean.
    n_src = d * (S + 1)
    Amap, mean = [], []
    Ax, m = np.zeros((d, n_src)), x0.numpy()[0]
    Ax[:, :d] = np.eye(d)
    for t in range(S):
        Ax = Fm @ Ax
        Ax[:, d * (t + 1) : d * (t + 2)] += np.eye(d)
        m = Fm @ m + Bm @ u.numpy()[0, t]
        Amap.append(Ax.copy())
        mean.append(m.copy())
    Csrc = np.zeros((n_src, n_src))
    Csrc[:d, :d] = np.eye(d)
    for t in range(S):
        Csrc[d * (t + 1) : d * (t + 2), d * (t + 1) : d * (t + 2)] = Q
    Ax_all = np.concatenate(Amap)  # (S d, n_src)
    mx = np.concatenate(mean)
    Cx = Ax_all @ Csrc @ Ax_all.T
    Hb = np.kron(np.eye(S), Hm)
    Cy = Hb @ Cx @ Hb.T + np.kron(np.eye(S), R)
    Cxy = Cx @ Hb.T
    yv = y.numpy()[0].reshape(-1)
    for t in range(S):
        k = d * (t + 1)
        sl = slice(d * t, d * (t + 1))
        gain = Cxy[sl, :k] @ np.linalg.inv(Cy[:k, :k])
        post_m = mx[sl] + gain @ (yv[:k] - (Hb @ mx)[:k])
        post_C = Cx[sl, sl] - gain @ Cxy[sl, :k].T
        np.testing.assert_allclose(states[0, t].detach().numpy(), post_m, atol=1e-8)
        np.testing.assert_allclose(covs[t].detach().numpy(), post_C, atol=1e-8)


def test_kalman_covariance_symmetric_psd_and_zero_noise_measurement() -> None:
    kf = _kf(4, init="randn")
    g = torch.Generator().manual_seed(0)
    y = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    _, covs = kf(torch.zeros(2, 4, dtype=torch.float64), y)
    assert torch.equal(covs, covs.transpose(1, 2))
    assert torch.linalg.eigvalsh(covs).min() > 0
    with torch.no_grad():
        kf.L_R.mul_(1e-7)  # R -> 0 with H = I: the update returns the measurement
    states, _ = kf(
        torch.zeros(2, 4, dtype=torch.float64), y, torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    )
    torch.testing.assert_close(states, y, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------- Koopman
def _linear_latents(n_total: int, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    A = 0.95 * Q  # a stable rotation-like linear map (row convention z_{t+1} = z_t A)
    z = [torch.randn(2, d, generator=g, dtype=torch.float64)]
    for _ in range(n_total - 1):
        z.append(z[-1] @ A)
    return torch.stack(z, 1), A


@pytest.mark.parametrize("S", [3, 6, 13])
def test_static_koopman_recovers_linear_map_and_rollout(S: int) -> None:
    n = 6
    Z_all, A = _linear_latents(n + S)
    torch.manual_seed(0)
    op = KoopmanOperator(3, "static", ridge=1e-12)  # the lambda -> 0 limit: exact eDMD on exact data
    Z = Z_all[:, :n]
    Z_rec, Y, K = op(Z, S)
    torch.testing.assert_close(K, A.expand(2, 3, 3), atol=1e-4, rtol=0)
    torch.testing.assert_close(Z_rec[:, 1:], Z[:, 1:], atol=1e-8, rtol=0)
    torch.testing.assert_close(
        Y, Z_all[:, n : n + S], atol=1e-8, rtol=0
    )  # S <= n: K^S jump; S > n: K^n blocks


def test_koopman_modes_and_nan_fallback() -> None:
    torch.manual_seed(0)
    op = KoopmanOperator(3, "both")
    Kg = op.K_global.detach()
    torch.testing.assert_close(Kg @ Kg.T, torch.eye(3), atol=1e-5, rtol=0)  # orthogonal init
    Z = _linear_latents(6)[0].float()
    torch.testing.assert_close(op.operator(Z), op.local_operator(Z) + Kg, atol=1e-5, rtol=0)
    op.mode = "dynamic"
    assert torch.equal(op.operator(Z), Kg.expand(2, 3, 3))
    with torch.no_grad():
        op.K_global[0, 0] = float("nan")
    assert torch.equal(op.operator(Z), torch.eye(3).expand(2, 3, 3))


def test_kl_matches_torch_distributions() -> None:
    g = torch.Generator().manual_seed(0)
    M = torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    P = M @ M.transpose(1, 2) + 0.5 * torch.eye(5, dtype=torch.float64)
    mvn = torch.distributions.MultivariateNormal
    ref = torch.distributions.kl_divergence(
        mvn(torch.zeros(3, 5, dtype=torch.float64), P),
        mvn(torch.zeros(5, dtype=torch.float64), torch.eye(5, dtype=torch.float64)),
    ).mean()
    torch.testing.assert_close(kl_to_standard_normal(P), ref)


# ------------------------------------------------------------------------------------------ model
@pytest.mark.parametrize(("L", "H"), [(20, 13), (24, 40), (17, 5)])
def test_shapes_when_patch_does_not_divide(L: int, H: int) -> None:
    m = K2VAE(3, L, H, seed=0, **SMALL)
    x = torch.randn(2, L, 3, generator=torch.Generator().manual_seed(0))
    out = m(x)
    assert out.mean.shape == out.scale.shape == (2, H, 3) and out.x_rec.shape == (2, L, 3)
    assert out.prior_cov.shape == (m.n_future, 6, 6) and bool((out.scale > 0).all())
    assert m.sample(x, 7, latent_draws=3, seed=0).shape == (7, 2, H, 3)
    assert m.sample(x, 2, latent_draws=5, seed=0).shape == (2, 2, H, 3)
    loss = m.loss(x, torch.randn(2, H, 3))
    assert set(loss) == {"total", "rec", "mse", "nll", "kl"} and torch.isfinite(loss["total"])


def test_revin_roundtrip_and_forecast_equivariance() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, 3, generator=g, dtype=torch.float64)
    rv = RevIN(3).double()
    with torch.no_grad():
        rv.weight.copy_(torch.tensor([0.5, 2.0, -1.5]))
        rv.bias.copy_(torch.tensor([0.1, -0.3, 0.2]))
    mean, std = rv.stats(x)
    torch.testing.assert_close(rv.denormalize(rv.normalize(x, mean, std), mean, std), x)
    m = K2VAE(3, 32, 20, seed=0, **SMALL).double()
    a, b = (
        torch.tensor([3.0, 0.5, 7.0], dtype=torch.float64),
        torch.tensor([10.0, -2.0, 0.0], dtype=torch.float64),
    )
    s1 = m.sample(x, 5, seed=3)
    s2 = m.sample(a * x + b, 5, seed=3)
    torch.testing.assert_close(s2, a * s1 + b, atol=1e-3, rtol=1e-4)


def test_gain_transpose_flag_and_prior_noise() -> None:
    g = torch.Generator().manual_seed(0)
    x0, y = (
        torch.randn(2, 3, generator=g, dtype=torch.float64),
        torch.randn(2, 4, 3, generator=g, dtype=torch.float64),
    )
    kf1, kf2 = _kf(3, init="randn"), _kf(3, init="randn", gain_transpose=True)
    # With H = R = I the gain P(P + I)^-1 is symmetric: the official Gᵀ and the textbook G agree.
    torch.testing.assert_close(kf1(x0, y)[0], kf2(x0, y)[0])
    with torch.no_grad():
        for kf in (kf1, kf2):
            kf.H.copy_(torch.eye(3) + 0.5 * torch.arange(9.0).reshape(3, 3) / 9)
    assert not torch.allclose(kf1(x0, y)[0], kf2(x0, y)[0])  # a non-symmetric G: the two forms differ
    xs = torch.randn(2, 24, 2, generator=g)
    m3 = K2VAE(2, 24, 8, seed=0, latent_noise="prior", **SMALL)
    assert m3.sample(xs, 4, seed=0).shape == (4, 2, 8, 2)


def test_forecaster_learns_sine_and_is_reproducible() -> None:
    t = torch.arange(600, dtype=torch.float32)
    series = torch.stack([torch.sin(2 * np.pi * t / 16), torch.cos(2 * np.pi * t / 16)], 1) * 3 + 5
    fc = K2VAEForecaster(32, 16, steps=150, seed=0, **SMALL).fit(series)
    # the loss of one minibatch spikes now and then (51 vs a median of 1.27 at the last step with one
    # thread, not with two): compare the medians of the first and last 15 steps, not two single minibatches
    history = torch.tensor(fc.loss_history_)
    assert float(history[-15:].median()) < 0.5 * float(history[:15].median())
    s = fc.predict(series[-32:], num_samples=50)
    assert s.shape == (50, 16, 2)
    truth = torch.stack([torch.sin(2 * np.pi * (t[-1] + 1 + torch.arange(16)) / 16)] * 1, 1)[:, 0] * 3 + 5
    assert float((s.median(0).values[:, 0] - truth).abs().mean()) < 1.0
    fc2 = K2VAEForecaster(32, 16, steps=150, seed=0, **SMALL).fit(series)
    assert torch.equal(fc2.predict(series[-32:], num_samples=50), s)


# ---------------------------------------------------------------------------------------- metrics
def test_sample_crps_exact_and_against_closed_form_gaussian() -> None:
    g = torch.Generator().manual_seed(0)
    s = torch.randn(9, 4, generator=g, dtype=torch.float64)
    y = torch.randn(4, generator=g, dtype=torch.float64)
    brute = (s - y).abs().mean(0) - 0.5 * (s[:, None] - s[None]).abs().mean((0, 1))
    torch.testing.assert_close(crps_from_samples(s, y), brute)
    mu, sd = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, 0.3, 2.5])
    y = torch.tensor([0.0, -0.2, 5.0])
    big = mu + sd * torch.randn(200_000, 3, generator=g)
    torch.testing.assert_close(crps_from_samples(big, y), gaussian_crps(mu, sd, y), rtol=1e-2, atol=1e-3)


def test_coverage_and_quantile_metrics_on_known_samples() -> None:
    s = torch.arange(1, 101, dtype=torch.float64)[:, None].expand(100, 50)  # quantiles known exactly
    y = torch.linspace(1, 100, 50, dtype=torch.float64)
    assert interval_coverage(s, y, 0.8) == pytest.approx(float(((y >= 10.9) & (y <= 90.1)).double().mean()))
    # GluonTS median of 1..100: the sorted sample at round(99 * 0.5) = 50 (half to even), i.e. 51.
    assert nmae(s, y) == pytest.approx(float((y - 51.0).abs().sum() / y.abs().sum()))
    assert weighted_quantile_loss(s, y, [0.5]) == pytest.approx(nmae(s, y))


# --------------------------------------------------------------------------------- §8 bad inputs
def test_rejects_too_short_context() -> None:
    with pytest.raises(ValueError, match=r"context_len must be >= 2 \* patch_len = 48 .* got context_len=40"):
        K2VAE(2, 40, 24, patch_len=24)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_rejects_non_finite_context(value: float) -> None:
    m = K2VAE(2, 24, 8, seed=0, **SMALL)
    x = torch.randn(3, 24, 2)
    x[1, 5, 0] = value
    with pytest.raises(ValueError, match=r"x must be finite .* shape \(3, 24, 2\)"):
        m.sample(x, 4)
    with pytest.raises(ValueError, match=r"context must be finite"):
        K2VAEForecaster(24, 8, steps=1, **SMALL).fit(torch.randn(64, 2)).predict(x)


def test_warns_on_constant_channel() -> None:
    m = K2VAE(2, 24, 8, seed=0, **SMALL)
    x = torch.randn(3, 24, 2)
    x[0, :, 1] = 4.0
    with pytest.warns(RuntimeWarning, match="constant"):
        out = m.sample(x, 4, seed=0)
    assert torch.isfinite(out).all()


def test_rejects_wrong_channel_count() -> None:
    m = K2VAE(2, 24, 8, seed=0, **SMALL)
    with pytest.raises(ValueError, match=r"x must have n_vars=2 channels .* got shape \(3, 24, 5\)"):
        m(torch.randn(3, 24, 5))


@pytest.mark.parametrize("horizon", [0, -3])
def test_rejects_non_positive_horizon(horizon: int) -> None:
    with pytest.raises(ValueError, match=rf"horizon must be an int >= 1, got {horizon}"):
        K2VAE(2, 24, horizon, **SMALL)


def test_rejects_num_samples_below_one() -> None:
    m = K2VAE(2, 24, 8, seed=0, **SMALL)
    with pytest.raises(ValueError, match="num_samples must be an int >= 1, got 0"):
        m.sample(torch.randn(3, 24, 2), 0)


def test_rejects_unknown_koopman_mode() -> None:
    with pytest.raises(ValueError, match=r"koopman_mode must be one of .* got 'local'"):
        K2VAE(2, 24, 8, koopman_mode="local", **SMALL)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"koopman_mode must be one of .* got 'local'"):
        K2VAEForecaster(24, 8, koopman_mode="local", patch_len=8)


def test_rejected_fit_keeps_state() -> None:
    from icml25.kernels import testing as kt

    fc = K2VAEForecaster(24, 8, steps=2, **SMALL).fit(torch.randn(64, 2))
    model, before = fc.model_, kt.snapshot_state(fc.model_)
    scaler, hist = (fc.mean_.clone(), fc.scale_.clone()), list(fc.loss_history_)
    bad = torch.randn(64, 2)
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="series must be finite"):
        fc.fit(bad)
    assert fc.model_ is model and kt.states_equal(before, kt.snapshot_state(fc.model_))
    assert torch.equal(fc.mean_, scaler[0]) and torch.equal(fc.scale_, scaler[1]) and fc.loss_history_ == hist


# ----------------------------------------------------------------------------- reproduction gate
def test_quick_reproduction_passes() -> None:
    from icml25.generative_models.experiments import k2vae as exp

    report = exp.run(quick=True, seed=0)
    assert report.passed, report.summary() if hasattr(report, "summary") else report
    assert report.metrics["k2vae_crps"] < report.metrics["baseline_climatology_crps"]


def test_quick_gate_fails_for_context_blind_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: each series' Koopman-Kalman latent path is swapped with another series' (batch roll),
    so the forecast no longer follows its own context; it ties climatology and fails both quick checks."""
    from icml25.generative_models.experiments import k2vae as exp

    encode = k2mod.K2VAE.encode

    def misaligned(self: K2VAE, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = encode(self, x)
        out["mu"] = torch.roll(out["mu"], max(1, x.shape[0] // 2), 0)
        return out

    monkeypatch.setattr(k2mod.K2VAE, "encode", misaligned)
    report = exp.run(quick=True, seed=0)
    assert report.passed is False
    # with the loss on the denormalised outputs the misaligned model also fails to lower its loss by 30%
    assert report.failed_checks == [
        "K2VAE loss drop >= 0.3",
        "K2VAE CRPS <= (climatology CRPS + oracle CRPS) / 2",
    ]


@pytest.mark.slow
def test_full_run_matches_its_recorded_known_miss() -> None:
    """The catalog records a known miss in full (1,500 steps, 3 seeds; about 7 CPU-minutes on one core):
    K2VAE beats neither the GRU nor 0.85 x seasonal-naive, and its ratio to the GRU grows with the horizon;
    the 80% coverage holds, and over the first 24 steps K2VAE still beats seasonal-naive."""
    from icml25.generative_models.experiments import k2vae as exp

    report = exp.run(quick=False, seed=0)
    assert report.passed is False
    assert [name for name, ok in report.checks.items() if not ok] == [
        "K2VAE CRPS <= 0.85 x seasonal-naive CRPS",
        "K2VAE CRPS <= 1 x GRU CRPS",
        "K2VAE/GRU CRPS ratio at H=192 < ratio at H=24",
    ]
    assert report.metrics["k2vae_crps_h24"] < report.metrics["baseline_seasonal_naive_crps_h24"]
