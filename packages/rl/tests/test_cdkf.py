"""P46 CD-KF scheduling: exact checks of the filter, the mean-covariance bound, its gradient and the schedules."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.rl import cdkf
from icml25.rl.cdkf import (
    AuxDynamics,
    LinearSDE,
    Sensor,
    aux_trajectory,
    cdkf_filter,
    control_objective,
    deterministic_schedule,
    kalman_update,
    mean_cov_bound,
    monte_carlo,
    optimize_rates,
    poisson_schedule,
)

D = torch.float64


def _osc() -> LinearSDE:
    """A damped oscillator with full-rank diffusion (a 2-D test model besides the Matérn SDE)."""
    return LinearSDE([[0.0, 1.0], [-2.0, -0.5]], np.eye(2), np.diag([0.1, 0.5]))


def _kf(sde: LinearSDE, H: np.ndarray, R: np.ndarray, dt: float, ys: np.ndarray, m0, P0):
    """A plain discrete Kalman filter with the Van Loan discretisation (the oracle)."""
    F, Qd = (a.numpy() for a in sde.discretize(dt))
    m, P = np.array(m0, float), np.array(P0, float)
    means, covs = [], []
    for y in ys:
        m, P = F @ m, F @ P @ F.T + Qd
        S = H @ P @ H.T + R
        K = P @ H.T @ np.linalg.inv(S)
        m, P = m + K @ (y - H @ m), P - K @ S @ K.T
        means.append(m)
        covs.append(P)
    return np.array(means), np.array(covs)


# ------------------------------------------------------------------------------------ models and steps
def test_matern32_stationary_covariance_and_lyapunov_vs_scipy() -> None:
    scipy_linalg = pytest.importorskip("scipy.linalg")
    sde = LinearSDE.matern32(1.0, 1.0)
    np.testing.assert_allclose(sde.lyapunov_steady_state().numpy(), np.diag([1.0, 3.0]), atol=1e-12)
    osc = _osc()
    ref = scipy_linalg.solve_continuous_lyapunov(osc.A.numpy(), -osc.Q.numpy())
    np.testing.assert_allclose(osc.lyapunov_steady_state().numpy(), ref, rtol=1e-12, atol=1e-14)


def test_van_loan_discretisation_is_exact() -> None:
    scipy_linalg = pytest.importorskip("scipy.linalg")
    sde = _osc()
    F, Qd = sde.discretize(0.37)
    np.testing.assert_allclose(F.numpy(), scipy_linalg.expm(0.37 * sde.A.numpy()), rtol=1e-12)
    Pinf = sde.lyapunov_steady_state().numpy()
    # Stationarity: P∞ = F P∞ Fᵀ + Qd exactly.
    np.testing.assert_allclose(Qd.numpy(), Pinf - F.numpy() @ Pinf @ F.numpy().T, atol=1e-12)
    Fb, Qb = sde.discretize(np.array([0.0, 0.37]))
    assert Fb.shape == (2, 2, 2)
    np.testing.assert_allclose(Fb[0].numpy(), np.eye(2), atol=1e-15)
    np.testing.assert_allclose(Qb[1].numpy(), Qd.numpy(), atol=1e-15)


def test_update_is_concave_scalar_and_matrix() -> None:
    rng = np.random.default_rng(0)
    # Scalar: U(P) = P R / (P + R); E[U(P)] <= U(E[P]).
    for _ in range(50):
        p, r = rng.gamma(2.0, 1.0, size=200), rng.uniform(0.01, 2.0)
        assert np.mean(p * r / (p + r)) <= np.mean(p) * r / (np.mean(p) + r) + 1e-12
    # Matrix (Loewner): U(E[P]) - E[U(P)] is positive semidefinite.
    H, R = np.array([[1.0, 0.5]]), np.array([[0.3]])
    for _ in range(20):
        Ps = [(lambda B: B @ B.T)(rng.normal(size=(2, 3))) for _ in range(30)]
        mean_u = np.mean([kalman_update(P, H, R).numpy() for P in Ps], axis=0)
        gap = kalman_update(np.mean(Ps, axis=0), H, R).numpy() - mean_u
        assert np.linalg.eigvalsh(gap).min() >= -1e-12


# ------------------------------------------------------------------------------------------- the filter
def test_cdkf_on_a_uniform_grid_matches_the_discrete_kf() -> None:
    sde = _osc()
    H, R = np.array([[1.0, 0.0]]), np.array([[0.05]])
    dt, K = 0.25, 40
    rng = np.random.default_rng(1)
    ys = rng.normal(size=(K, 1))
    times = dt * np.arange(1, K + 1)
    m0, P0 = np.array([0.3, -0.2]), np.eye(2)
    res = cdkf_filter(sde, [Sensor(H, R)], [times], [ys], m0, P0)
    means, covs = _kf(sde, H, R, dt, ys, m0, P0)
    np.testing.assert_allclose(res.means, means, atol=1e-10)
    np.testing.assert_allclose(res.covs, covs, atol=1e-10)
    np.testing.assert_array_equal(res.sensor, np.zeros(K, int))


def test_cdkf_steady_state_matches_scipy_dare() -> None:
    scipy_linalg = pytest.importorskip("scipy.linalg")
    sde = LinearSDE.matern32()
    H, R, dt = np.array([[1.0, 0.0]]), np.array([[0.2]]), 0.3
    times = dt * np.arange(1, 301)
    res = cdkf_filter(sde, [Sensor(H, R)], [times], [np.zeros((300, 1))], np.zeros(2), np.eye(2))
    F, Qd = (a.numpy() for a in sde.discretize(dt))
    prior = scipy_linalg.solve_discrete_are(F.T, H.T, Qd, R)
    post = prior - prior @ H.T @ np.linalg.solve(H @ prior @ H.T + R, H @ prior)
    np.testing.assert_allclose(res.covs[-1], post, rtol=1e-9)


def test_cdkf_merges_sensors_in_time_order() -> None:
    sde = _osc()
    s1, s2 = Sensor([1.0, 0.0], 0.1), Sensor([0.0, 1.0], 0.3)
    t1, t2 = np.array([0.2, 0.9]), np.array([0.5])
    res = cdkf_filter(
        sde, [s1, s2], [t1, t2], [np.array([0.1, 0.2]), np.array([[0.3]])], np.zeros(2), np.eye(2)
    )
    np.testing.assert_allclose(res.times, [0.2, 0.5, 0.9])
    np.testing.assert_array_equal(res.sensor, [0, 1, 0])
    # By hand: predict / update in that order.
    P = np.eye(2)
    t_prev = 0.0
    for t, H, R in ((0.2, s1.H, 0.1), (0.5, s2.H, 0.3), (0.9, s1.H, 0.1)):
        F, Qd = (a.numpy() for a in sde.discretize(t - t_prev))
        P = kalman_update(F @ P @ F.T + Qd, H, R).numpy()
        t_prev = t
    np.testing.assert_allclose(res.covs[-1], P, atol=1e-12)


# -------------------------------------------------------------------------------------------- the bound
def test_zero_rates_give_the_open_loop_lyapunov_solution() -> None:
    a, q, p0, T = -0.5, 1.3, 0.2, 2.0
    sde = LinearSDE([[a]], [[1.0]], [[q]])
    t = np.linspace(0.0, T, 101)
    P = mean_cov_bound(sde, [Sensor([1.0], 0.1)], np.zeros((100, 1)), t, [[p0]])[:, 0, 0].numpy()
    exact = np.exp(2 * a * t) * p0 + q * (np.exp(2 * a * t) - 1) / (2 * a)
    np.testing.assert_allclose(P, exact, rtol=1e-8)
    # Matrix case: F P0 Fᵀ + Qd.
    osc = _osc()
    Pm = mean_cov_bound(osc, [Sensor([1.0, 0.0], 0.1)], np.zeros(100), t, np.eye(2)).numpy()
    F, Qd = (x.numpy() for x in osc.discretize(T))
    np.testing.assert_allclose(Pm[-1], F @ F.T + Qd, atol=1e-6)


def test_constant_rate_bound_reaches_the_scalar_closed_form_steady_state() -> None:
    a, q, r, lam = -0.3, 1.0, 0.2, 4.0
    sde = LinearSDE([[a]], [[1.0]], [[q]])
    t = np.linspace(0.0, 15.0, 601)
    P = mean_cov_bound(sde, [Sensor([1.0], r)], np.full(600, lam), t, [[1.0]])[-1, 0, 0].item()
    # (2a p + q)(p + r) = λ p²  ->  (2a − λ) p² + (2a r + q) p + q r = 0, positive root.
    roots = np.roots([2 * a - lam, 2 * a * r + q, q * r])
    assert P == pytest.approx(roots[roots > 0][0], rel=1e-9)


def test_bound_is_symmetric_positive_definite_at_every_step() -> None:
    sde = LinearSDE.matern32()
    t = np.linspace(0.0, 10.0, 101)
    rates = np.random.default_rng(0).uniform(0.0, 20.0, size=(100, 2))
    P = mean_cov_bound(
        sde, [Sensor([1.0, 0.0], 0.01), Sensor([1.0, 0.0], 0.2)], rates, t, np.diag([1.0, 3.0]), substeps=4
    )
    assert torch.equal(P, P.mT)
    assert torch.linalg.eigvalsh(P).min() > 0


def test_adjoint_matches_the_torch_reference_with_aux_and_mixed_sensor_sizes() -> None:
    sde = _osc()
    g = torch.Generator().manual_seed(0)
    sens = [
        Sensor([1.0, 0.0], 0.05),
        Sensor(np.eye(2), lambda u: 0.02 * (1 + u[0] ** 2) * torch.eye(2, dtype=D), cost=0.1),
    ]
    t = torch.linspace(0.0, 1.0, 6, dtype=D)
    lam = (3 * torch.rand(5, 2, generator=g, dtype=D)).requires_grad_()
    u = torch.randn(6, 1, generator=g, dtype=D).requires_grad_()
    P0 = torch.eye(2, dtype=D).requires_grad_()
    wts = torch.randn(6, 2, 2, generator=g, dtype=D)
    outs = []
    for fn in (cdkf.integrate_bound, cdkf._integrate_bound_reference):
        P = fn(sde, sens, lam, t, P0, u, 2)
        outs.append((P.detach(), *torch.autograd.grad((P * wts).sum(), [lam, u, P0])))
    sym = [lambda x: x, lambda x: x, lambda x: x, lambda x: 0.5 * (x + x.mT)]  # P0 enters symmetric
    for f, a, b in zip(sym, *outs, strict=True):
        torch.testing.assert_close(f(a), f(b), rtol=1e-10, atol=1e-12)


def test_autograd_gradient_matches_finite_differences() -> None:
    sde = LinearSDE.matern32()
    sens = [
        Sensor([1.0, 0.0], lambda u: 0.01 * (1 + u[:1] ** 2).reshape(1, 1), cost=0.1),
        Sensor([1.0, 0.0], 0.2, cost=0.1),
    ]
    aux = AuxDynamics.integrator([2.0], 0.1)
    t = torch.linspace(0.0, 2.0, 9, dtype=D)
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(8, 2, generator=g, dtype=D)
    w = 0.3 * torch.randn(8, 1, generator=g, dtype=D)

    def J(th: torch.Tensor, ww: torch.Tensor) -> torch.Tensor:
        return control_objective(
            sde, sens, 20 * torch.sigmoid(th), t, np.diag([1.0, 3.0]), W=np.diag([1.0, 0.0]), W_T=np.eye(2),
            time_weight=lambda tt: 1 + tt, aux=aux, aux_controls=ww,
        ).total  # fmt: skip

    th, ww = theta.clone().requires_grad_(), w.clone().requires_grad_()
    g_th, g_w = torch.autograd.grad(J(th, ww), [th, ww])
    eps = 1e-6
    for grad, base, which in ((g_th, theta, 0), (g_w, w, 1)):
        fd = torch.zeros_like(base)
        for idx in np.ndindex(*base.shape):
            e = torch.zeros_like(base)
            e[idx] = eps
            args_p = (theta + e, w) if which == 0 else (theta, w + e)
            args_m = (theta - e, w) if which == 0 else (theta, w - e)
            fd[idx] = (J(*args_p) - J(*args_m)) / (2 * eps)
        torch.testing.assert_close(grad, fd, rtol=1e-4, atol=1e-8)


def test_objective_terms_by_hand() -> None:
    sde = LinearSDE.matern32()
    sens = [Sensor([1.0, 0.0], 0.01, cost=1.0), Sensor([1.0, 0.0], 0.2, cost=0.1)]
    t = np.linspace(0.0, 2.0, 21)
    rates = np.tile([0.5, 2.0], (20, 1))
    terms = control_objective(sde, sens, rates, t, np.diag([1.0, 3.0]), W_T=np.eye(2))
    assert terms.rate.item() == pytest.approx(2.0 * (0.5 * 1.0 + 2.0 * 0.1))
    tr = torch.diagonal(terms.bound, dim1=1, dim2=2).sum(1).numpy()
    assert terms.estimation.item() == pytest.approx(float((0.5 * (tr[1:] + tr[:-1]) * np.diff(t)).sum()))
    assert terms.terminal.item() == pytest.approx(tr[-1])
    assert terms.total.item() == pytest.approx((terms.estimation + terms.terminal + terms.rate).item())


# ------------------------------------------------------------------------------------------- schedules
@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.0, 8.0), min_size=3, max_size=12),
    st.sampled_from([0.0, 0.25, 0.5]),
)
def test_deterministic_schedule_counts_and_levels(rates: list[float], offset: float) -> None:
    t = np.linspace(0.0, 3.0, len(rates) + 1)
    r = np.array(rates)
    (times,) = deterministic_schedule(r, t, offset)
    Lam_T = float((r * np.diff(t)).sum())
    assert times.size == math.floor(Lam_T + offset + 1e-12)
    if offset == 0.5:
        assert times.size == int(np.floor(Lam_T + 0.5 + 1e-12))  # round half up
    assert np.all(np.diff(times) >= 0) and (times.size == 0 or (times[0] >= 0 and times[-1] <= 3.0))
    cum = np.concatenate([[0.0], np.cumsum(r * np.diff(t))])
    np.testing.assert_allclose(
        np.interp(times, t, cum), np.maximum(np.arange(1, times.size + 1) - offset, 0), atol=1e-9
    )


def test_deterministic_schedule_of_a_constant_rate_is_a_uniform_grid() -> None:
    (times,) = deterministic_schedule(np.full(10, 2.0), np.linspace(0.0, 5.0, 11))
    np.testing.assert_allclose(times, (np.arange(1, 11) - 0.5) / 2.0, atol=1e-12)


def test_poisson_schedule_counts() -> None:
    t = np.linspace(0.0, 4.0, 5)
    rates = np.array([[1.0, 0.0], [0.0, 3.0], [2.0, 0.0], [0.5, 1.0]])
    rng = np.random.default_rng(0)
    counts = np.zeros((2000, 2, 4))
    for k in range(2000):
        for i, ti in enumerate(poisson_schedule(rates, t, rng)):
            assert np.all(np.diff(ti) >= 0)
            counts[k, i] = np.histogram(ti, bins=t)[0]
    np.testing.assert_allclose(counts.mean(0), rates.T, atol=0.1)
    assert counts[:, 0, 1].sum() == 0 and counts[:, 1, 0].sum() == 0  # zero rate -> no measurement
    a, b = poisson_schedule(rates, t, 5), poisson_schedule(rates, t, 5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------ Monte Carlo
def _two_sensors() -> list[Sensor]:
    return [Sensor([1.0, 0.0], 0.01, cost=1.0), Sensor([1.0, 0.0], 0.2, cost=0.1)]


def test_monte_carlo_stays_under_the_bound_and_a_wrong_bound_is_caught() -> None:
    sde = LinearSDE.matern32()
    P0 = sde.lyapunov_steady_state()
    t = np.linspace(0.0, 5.0, 51)
    rates = np.tile([0.3, 3.0], (50, 1))
    bound = np.trace(mean_cov_bound(sde, _two_sensors(), rates, t, P0).numpy(), axis1=1, axis2=2)
    mc = monte_carlo(sde, _two_sensors(), rates, t, P0, n_runs=200, seed=0)
    assert np.all(mc.mean <= bound + 2 * mc.se + 1e-9)
    assert (mc.mean / bound)[10:].mean() < 0.99  # Jensen's gap is real
    # A bound with the update term of three times the rates is overconfident: the check catches it.
    wrong = np.trace(mean_cov_bound(sde, _two_sensors(), 3 * rates, t, P0).numpy(), axis1=1, axis2=2)
    assert np.mean(mc.mean <= wrong + 2 * mc.se) < 0.5


def test_deterministic_monte_carlo_equals_the_filter_and_mse_matches_trace() -> None:
    sde = LinearSDE.matern32()
    P0 = sde.lyapunov_steady_state()
    t = np.linspace(0.0, 4.0, 21)
    rates = np.tile([0.5, 2.0], (20, 1))
    sens = _two_sensors()
    mc = monte_carlo(sde, sens, rates, t, P0, n_runs=150, schedule="deterministic", simulate=True, seed=3)
    times = deterministic_schedule(rates, t)
    res = cdkf_filter(sde, sens, times, [np.zeros(x.size) for x in times], np.zeros(2), P0, t_end=4.0)
    # tr P after the last measurement, propagated to t = 4.
    F, Qd = (a.numpy() for a in sde.discretize(4.0 - res.times[-1]))
    assert mc.traces[0, -1] == pytest.approx(np.trace(F @ res.covs[-1] @ F.T + Qd), rel=1e-10)
    assert np.ptp(mc.traces, axis=0).max() == 0.0
    # For a linear-Gaussian model the filter MSE equals tr P: the integrals agree within 3 SE.
    err = mc.integral(errors=True)
    assert abs(err.mean() - mc.integral()[0]) < 3 * err.std() / np.sqrt(err.size)


# -------------------------------------------------------------------------------------- optimal control
def test_optimize_rates_improves_the_objective_and_respects_the_limits() -> None:
    sde = LinearSDE.matern32()
    t = np.linspace(0.0, 5.0, 21)
    weight = np.where(t >= 3.0, 1.0, 0.05)
    sched = optimize_rates(
        sde, _two_sensors(), 5.0, 20.0, M=20, W=np.diag([1.0, 0.0]), time_weight=weight, steps=60
    )
    assert sched.history[-1] < 0.8 * sched.history[0]
    assert sched.rates.min() >= 0 and sched.rates.max() <= 20.0
    # The optimiser measures where the weight is.
    assert sched.rates[12:, 1].mean() > 3 * sched.rates[:8, 1].mean()
    const = optimize_rates(
        sde, _two_sensors(), 5.0, 20.0, M=20, W=np.diag([1.0, 0.0]), time_weight=weight, steps=60, n_pieces=1
    )
    assert np.ptp(const.rates, axis=0).max() == 0.0
    assert sched.objective < const.objective


def test_aux_optimisation_moves_the_sensor_toward_zero_noise() -> None:
    sde = LinearSDE.matern32()
    sens = [
        Sensor([1.0, 0.0], lambda u: 0.01 * (1 + u[:1] ** 2).reshape(1, 1), cost=0.1),
        Sensor([1.0, 0.0], 0.2, cost=0.1),
    ]
    aux = AuxDynamics.integrator([2.0], 0.1)
    sched = optimize_rates(sde, sens, 5.0, 20.0, M=10, W=np.diag([1.0, 0.0]), aux=aux, steps=40)
    assert abs(sched.aux_traj[-1, 0]) < 1.5 < sched.aux_traj[0, 0]
    u = aux_trajectory(aux, sched.aux_controls, sched.t_grid)
    np.testing.assert_allclose(u.numpy(), sched.aux_traj)
    assert sched.aux_path.at(0.0).item() == pytest.approx(2.0)


def test_aux_trajectory_rk4_is_exact_for_an_integrator() -> None:
    aux = AuxDynamics.integrator([1.0, -1.0])
    t = np.linspace(0.0, 1.0, 5)
    w = np.tile([0.5, 2.0], (4, 1))
    np.testing.assert_allclose(aux_trajectory(aux, w, t).numpy()[-1], [1.5, 1.0], atol=1e-14)


# ------------------------------------------------------------------------------------------- bad inputs
def test_bad_model_shapes_raise() -> None:
    with pytest.raises(ValueError, match="A must be square"):
        LinearSDE(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="R must have shape"):
        Sensor(np.eye(2), np.eye(3))
    sde = LinearSDE.matern32()
    with pytest.raises(ValueError, match=r"sensors\[0\].H"):
        mean_cov_bound(sde, [Sensor([1.0, 0.0, 0.0], 0.1)], np.ones(3), np.arange(4.0), np.eye(2))


def test_model_arrays_go_through_the_shared_checks() -> None:
    """A, H, R, ... pass through icml25.kernels.checks: its messages, and float64 copies of valid input."""
    with pytest.raises(ValueError, match=r"^A must be finite \(no NaN or inf\), got 1 NaN and 0 inf values"):
        LinearSDE([[0.0, 1.0], [float("nan"), -1.0]])
    with pytest.raises(ValueError, match=r"^A must have entries of magnitude <= 1e\+08, got max 1e\+09"):
        LinearSDE([[0.0, 1.0], [-1e9, -1.0]])
    with pytest.raises(TypeError, match=r"^A must be a float or int array, got .* dtype bool"):
        LinearSDE(np.eye(2, dtype=bool))
    with pytest.raises(TypeError, match=r"^A must be a float or int tensor, got .* dtype torch.complex64"):
        LinearSDE(torch.eye(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"^A must have 2 dimension\(s\), got torch.Tensor of shape \(4,\)"):
        LinearSDE(np.zeros(4))
    a = LinearSDE([[0, 1], [-2, -3]]).A
    assert a.dtype == torch.float64 and a.tolist() == [[0.0, 1.0], [-2.0, -3.0]]


def test_non_pd_R_and_non_psd_P0_raise() -> None:
    with pytest.raises(ValueError, match="R must be positive definite"):
        Sensor([1.0, 0.0], -0.1)
    with pytest.raises(ValueError, match="R must be positive definite"):
        Sensor(np.eye(2), np.diag([1.0, 0.0]))
    with pytest.raises(ValueError, match="R must be symmetric"):
        Sensor(np.eye(2), [[1.0, 0.5], [0.0, 1.0]])
    with pytest.raises(ValueError, match="P0 must be positive semidefinite"):
        mean_cov_bound(
            LinearSDE.matern32(), _two_sensors(), np.ones((3, 2)), np.arange(4.0), np.diag([1.0, -0.1])
        )
    bad_fn = Sensor([1.0, 0.0], lambda u: -torch.ones(1, 1, dtype=D))
    with pytest.raises(ValueError, match="positive definite"):
        mean_cov_bound(
            LinearSDE.matern32(), [bad_fn], np.ones(3), np.arange(4.0), np.eye(2), aux_traj=np.zeros(4)
        )


def test_negative_rates_and_nonpositive_lam_max_raise() -> None:
    sde = LinearSDE.matern32()
    with pytest.raises(ValueError, match="rates must be >= 0"):
        mean_cov_bound(sde, _two_sensors(), -np.ones((3, 2)), np.arange(4.0), np.eye(2))
    with pytest.raises(ValueError, match="rates must be >= 0"):
        deterministic_schedule(-np.ones(3), np.arange(4.0))
    for bad in (0.0, -1.0, [1.0, 0.0]):
        with pytest.raises(ValueError, match="lam_max must be > 0"):
            optimize_rates(sde, _two_sensors(), 1.0, bad, M=2, steps=1, init_rate=0.5)


def test_non_increasing_time_grid_raises() -> None:
    sde = LinearSDE.matern32()
    for grid in ([0.0, 1.0, 1.0, 2.0], [0.0, 2.0, 1.0, 3.0]):
        with pytest.raises(ValueError, match="t_grid must be strictly increasing"):
            mean_cov_bound(sde, _two_sensors(), np.ones((3, 2)), grid, np.eye(2))
        with pytest.raises(ValueError, match="t_grid must be strictly increasing"):
            poisson_schedule(np.ones(3), grid, 0)


def test_unstable_A_with_a_long_horizon_warns() -> None:
    sde = LinearSDE([[0.5]], [[1.0]], [[1.0]])
    with pytest.warns(RuntimeWarning, match="smaller T or a log-Cholesky"):
        mean_cov_bound(sde, [Sensor([1.0], 0.1)], np.ones(20), np.linspace(0, 20, 21), [[1.0]], substeps=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean_cov_bound(sde, [Sensor([1.0], 0.1)], np.ones(2), np.linspace(0, 2, 3), [[1.0]])


def test_measurement_times_outside_the_horizon_raise() -> None:
    sde = LinearSDE.matern32()
    with pytest.raises(ValueError, match=r"times\[0\] must lie in \[0, 2\]"):
        cdkf_filter(
            sde,
            [Sensor([1.0, 0.0], 0.1)],
            [np.array([0.5, 2.5])],
            [np.zeros(2)],
            np.zeros(2),
            np.eye(2),
            t_end=2.0,
        )
    with pytest.raises(ValueError, match=r"times\[0\] must lie in"):
        cdkf_filter(sde, [Sensor([1.0, 0.0], 0.1)], [np.array([-0.1])], [np.zeros(1)], np.zeros(2), np.eye(2))


def test_diverging_bound_raises_a_clear_error() -> None:
    sde = LinearSDE([[3.0]], [[1.0]], [[1.0]])
    with pytest.raises(ValueError, match="smaller T"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mean_cov_bound(sde, [Sensor([1.0], 0.1)], np.zeros(10), np.linspace(0, 300, 11), [[1.0]])


def test_the_split_modules_are_one_api() -> None:
    """The models, the control and the filter live in their own modules (issue 82); the old path and the area
    namespace give the same objects."""
    import icml25.rl as rl
    from icml25.rl import cdkf_control, cdkf_models, cdkf_schedules

    for module in (cdkf_models, cdkf_control, cdkf_schedules):
        for name in module.__all__:
            if name in cdkf.__all__:
                assert getattr(cdkf, name) is getattr(module, name) is getattr(rl, name)
    assert set(cdkf.__all__) <= {*cdkf_models.__all__, *cdkf_control.__all__, *cdkf_schedules.__all__} | {
        "kalman_update",
        "mean_cov_bound",
    }
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cdkf.nope  # noqa: B018
