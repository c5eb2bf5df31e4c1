"""Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with Auxiliary Dynamics — ICML 2025, P46: the CD-KF, the mean-covariance bound, rate optimal control and scheduling.

Ahdab et al., "Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with
Auxiliary Dynamics", ICML 2025 (arXiv 2507.11240; no official code was released, so the details below are
our reading of the paper).

Model: a linear SDE ``dx = A x dt + L dβ`` (spectral density ``Qc``) observed by sensors ``y = H_i x + v_i``,
``v_i ~ N(0, R_i(u))``, whose measurement times are Poisson processes with rates ``λ_i(t)``; ``u`` is an
auxiliary state with ``du/dt = g(u, w)``.

- :func:`cdkf_filter`: the continuous-discrete Kalman filter (exact Van Loan prediction between
  measurements, Kalman updates at them) on irregular multi-sensor data.
- :func:`mean_cov_bound`: the deterministic, differentiable upper bound ``P̄(t)`` on ``E[P(t)]``:
  ``dP̄/dt = A P̄ + P̄ Aᵀ + L Qc Lᵀ − Σ_i λ_i(t) P̄ H_iᵀ (H_i P̄ H_iᵀ + R_i(ū))⁻¹ H_i P̄`` (the update map is
  matrix-concave, so Jensen plus the order-preserving Riccati flow give ``E[P(t)] ≼ P̄(t)``), integrated by
  RK4 with piecewise-constant rates, symmetrised after every step, differentiable by torch autograd.
- :func:`control_objective` / :func:`optimize_rates`: finite-horizon optimal control of the rates
  ``λ = λ_max · sigmoid(θ)`` (and the auxiliary controls ``w``) by direct transcription:
  ``J = ∫ ω(t) tr(W P̄) dt + tr(W_T P̄(T)) + Σ_i c_i ∫ λ_i dt + ∫ ℓ(ū, w) dt``.
- :func:`deterministic_schedule` (the k-th measurement at the first t with ``Λ_i(t) ≥ k − offset``) and
  :func:`poisson_schedule` turn rates into measurement times; :func:`monte_carlo` runs the CD-KF
  covariance recursion (and optionally filtering on simulated data) over many sampled schedules.

Layout: this module holds the Kalman step and the bound; the models live in :mod:`icml25.rl.cdkf_models`,
the optimal control in :mod:`icml25.rl.cdkf_control`, the schedules, the filter and the Monte Carlo check in
:mod:`icml25.rl.cdkf_schedules` and the shared input validation in :mod:`icml25.rl.cdkf_validation`; every
public name is re-exported here.

The bound is evaluated along the *mean* auxiliary trajectory ``ū``; with a nonlinear ``R(u)`` and a
stochastic ``u`` that is a further approximation (here ``u`` follows a deterministic ODE, so ``ū = u``).
All matrices are float64.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from icml25.kernels.checks import check_int
from icml25.rl.cdkf_models import (
    AuxDynamics,
    AuxPath,
    LinearSDE,
    Sensor,
    aux_trajectory,
    sensor_list,
)
from icml25.rl.cdkf_validation import MAX_ABS as MAX_ABS  # re-exported: the old public constant
from icml25.rl.cdkf_validation import (
    ArrayLike,
    aux_on_grid,
    initial_covariance,
    rate_matrix,
    real_tensor,
    require_covariance,
    time_grid,
    warn_unstable,
)

if TYPE_CHECKING:
    from icml25.rl.cdkf_control import ObjectiveTerms, RateSchedule, control_objective, optimize_rates
    from icml25.rl.cdkf_schedules import (
        FilterResult,
        MonteCarloResult,
        cdkf_filter,
        deterministic_schedule,
        monte_carlo,
        poisson_schedule,
    )

__all__ = [
    "AuxDynamics",
    "AuxPath",
    "FilterResult",
    "LinearSDE",
    "MonteCarloResult",
    "ObjectiveTerms",
    "RateSchedule",
    "Sensor",
    "aux_trajectory",
    "cdkf_filter",
    "control_objective",
    "deterministic_schedule",
    "kalman_update",
    "mean_cov_bound",
    "monte_carlo",
    "optimize_rates",
    "poisson_schedule",
]

_DT = torch.float64
_MAX_H_LAMBDA = 2.0


# ------------------------------------------------------------------------------------- the Kalman step
def kalman_update(P: ArrayLike, H: ArrayLike, R: ArrayLike) -> torch.Tensor:
    """The update map ``U(P) = P − P Hᵀ (H P Hᵀ + R)⁻¹ H P`` (Joseph-stabilised, symmetrised), ``(n, n)``."""
    P_t = real_tensor(P, "P", 2)
    H_t = real_tensor(H, "H", (1, 2))
    H_t = H_t[None, :] if H_t.ndim == 1 else H_t
    R_t = real_tensor(R, "R", (0, 1, 2))
    R_t = R_t.reshape(1, 1) if R_t.numel() == 1 else R_t
    n, m = P_t.shape[0], H_t.shape[0]
    if P_t.shape != (n, n) or H_t.shape[1] != n or R_t.shape != (m, m):
        raise ValueError(
            f"P must be (n, n), H (m, n) and R (m, m); got P {tuple(P_t.shape)}, H {tuple(H_t.shape)}, R {tuple(R_t.shape)}"
        )
    require_covariance(P_t, "P", definite=False)
    require_covariance(R_t, "R", definite=True)
    return _update(P_t, H_t, R_t)


def _update(P: torch.Tensor, H: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    S = H @ P @ H.mT + R
    K = torch.linalg.solve(S, H @ P).mT
    I_KH = torch.eye(P.shape[0], dtype=_DT) - K @ H
    out = I_KH @ P @ I_KH.mT + K @ R @ K.mT
    return 0.5 * (out + out.mT)


# ------------------------------------------------------------------------------------------ the bound
def _riccati_rhs(
    P: torch.Tensor, A: torch.Tensor, Q: torch.Tensor, Hs: torch.Tensor, Rs: torch.Tensor, lam: torch.Tensor
) -> torch.Tensor:
    """``A P + P Aᵀ + Q − Σ_i λ_i P H_iᵀ (H_i P H_iᵀ + R_i)⁻¹ H_i P`` with stacked ``Hs`` ``(S, m, n)``."""
    AP = A @ P
    HP = Hs @ P  # (S, m, n)
    S = HP @ Hs.mT + Rs  # (S, m, m)
    gain = HP / S if S.shape[-1] == 1 else torch.linalg.solve(S, HP)
    red = (lam[:, None, None] * (HP.mT @ gain)).sum(0)
    return AP + AP.mT + Q - red


def _stack_sensors(sensors: list[Sensor]) -> list[tuple[list[int], torch.Tensor]]:
    """Group sensors by measurement dimension: ``[(indices, Hs (S_g, m, n))]``."""
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(sensors):
        groups.setdefault(s.m, []).append(i)
    return [(idx, torch.stack([sensors[i].H for i in idx])) for idx in groups.values()]


def _integrate_bound_reference(
    sde: LinearSDE,
    sensors: list[Sensor],
    lam: torch.Tensor,
    t: torch.Tensor,
    P0: torch.Tensor,
    aux_traj: torch.Tensor | None,
    substeps: int,
) -> torch.Tensor:
    A, Q = sde.A, sde.Q
    groups = _stack_sensors(sensors)
    any_aux = any(s.depends_on_aux for s in sensors)
    const_R = (
        [torch.stack([sensors[i]._noise(None) for i in idx]) for idx, _ in groups] if not any_aux else None
    )

    def rhs(P: torch.Tensor, lam_k: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
        out = None
        for g, (idx, Hs) in enumerate(groups):
            Rs = const_R[g] if const_R is not None else torch.stack([sensors[i]._noise(u) for i in idx])
            part = _riccati_rhs(P, A, Q, Hs, Rs, lam_k[idx])
            out = part if out is None else out + part - (A @ P + P @ A.mT + Q)
        return out  # type: ignore[return-value]

    P = P0
    out = [P]
    for k in range(t.numel() - 1):
        h = (t[k + 1] - t[k]) / substeps
        for j in range(substeps):
            if aux_traj is not None:
                a, b = aux_traj[k], aux_traj[k + 1]
                f0, f1 = j / substeps, (j + 1) / substeps
                u0, u1 = a + f0 * (b - a), a + f1 * (b - a)
                um = 0.5 * (u0 + u1)
            else:
                u0 = um = u1 = None
            k1 = rhs(P, lam[k], u0)
            k2 = rhs(P + 0.5 * h * k1, lam[k], um)
            k3 = rhs(P + 0.5 * h * k2, lam[k], um)
            k4 = rhs(P + h * k3, lam[k], u1)
            P = P + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
            P = 0.5 * (P + P.mT)
        out.append(P)
    Ps = torch.stack(out)
    _check_bound_result(Ps.detach())
    return Ps


def _check_bound_result(Pd: torch.Tensor) -> None:
    if not bool(torch.isfinite(Pd).all()):
        raise ValueError(
            "the bound ODE diverged (non-finite covariance): the system is unstable over this horizon or the "
            "RK4 step is too large for these rates; use a smaller T, more grid points or a larger substeps"
        )
    low = float(torch.linalg.eigvalsh(Pd).min())
    if low < -1e-8 * max(1.0, float(Pd.abs().max())):
        raise ValueError(
            f"the bound lost positive semidefiniteness (eigenvalue {low:.3g}): the ODE is stiff at these rates "
            "(large λ P / R); use more grid points or a larger substeps"
        )


class _BoundODE(torch.autograd.Function):
    """RK4 of the bound ODE in numpy with its exact discrete adjoint (the gradient of the discretised map).

    Inputs: ``lam`` ``(M, S)``, ``Rst`` ``(N or 1, 4, S, m, m)`` (the noise at the 4 RK4 stages of each of
    the ``N = M · substeps`` steps, or one broadcast value), ``P0`` ``(n, n)``. Output ``(M+1, n, n)``.
    A pure-torch version (:func:`_integrate_bound_reference`) is the test oracle.
    """

    @staticmethod
    def forward(ctx, lam, Rst, P0, A, Q, Hs, h, substeps):  # type: ignore[override]
        lam_n, R_n, P = lam.detach().numpy(), Rst.detach().numpy(), P0.detach().numpy().copy()
        R_n = np.broadcast_to(R_n, (R_n.shape[0], 4, *R_n.shape[2:]))
        M, S = lam_n.shape
        n, m = P.shape[0], Hs.shape[1]
        HsT = Hs.transpose(0, 2, 1)
        N = M * substeps
        X = np.empty((N, 4, n, n))
        Kt = np.empty((N, 4, S, m, n))
        G = np.empty((N, 4, S, n, n))
        out = np.empty((M + 1, n, n))
        out[0] = P
        scalar = m == 1

        def f(Xs: np.ndarray, lk: np.ndarray, R: np.ndarray, q: int, s: int) -> np.ndarray:
            HP = Hs @ Xs
            Sm = HP @ HsT + R
            kt = HP / Sm if scalar else np.linalg.solve(Sm, HP)
            g = HP.transpose(0, 2, 1) @ kt
            X[q, s], Kt[q, s], G[q, s] = Xs, kt, g
            AX = A @ Xs
            return AX + AX.T + Q - (lk @ g.reshape(S, -1)).reshape(n, n)

        q = 0
        with np.errstate(all="ignore"):
            for k in range(M):
                hk, lk = h[k], lam_n[k]
                for _ in range(substeps):
                    Rq = R_n[q if R_n.shape[0] > 1 else 0]
                    k1 = f(P, lk, Rq[0], q, 0)
                    k2 = f(P + 0.5 * hk * k1, lk, Rq[1], q, 1)
                    k3 = f(P + 0.5 * hk * k2, lk, Rq[2], q, 2)
                    k4 = f(P + hk * k3, lk, Rq[3], q, 3)
                    P = P + hk / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
                    P = 0.5 * (P + P.T)
                    q += 1
                out[k + 1] = P
        ctx.saved = (X, Kt, G, lam_n, A, Hs, h, substeps, R_n.shape[0] > 1)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        X, Kt, G, lam_n, A, Hs, h, substeps, full_R = ctx.saved
        g_out = grad_out.detach().numpy()
        M, S = lam_n.shape
        n = A.shape[0]
        eye = np.eye(n)
        g_lam = np.zeros_like(lam_n)
        g_R = np.zeros((X.shape[0], 4, S, Kt.shape[3], Kt.shape[3])) if full_R else None
        AT = A.T

        def vjp(C: np.ndarray, q: int, s: int, lk: np.ndarray, k: int) -> np.ndarray:
            Cs = 0.5 * (C + C.T)
            kt = Kt[q, s]
            I_KH = eye - kt.transpose(0, 2, 1) @ Hs  # (S, n, n)
            red = Cs[None] - I_KH.transpose(0, 2, 1) @ Cs @ I_KH
            g_lam[k] -= G[q, s].reshape(S, -1) @ Cs.ravel()
            if g_R is not None:
                g_R[q, s] = lk[:, None, None] * (kt @ Cs @ kt.transpose(0, 2, 1))
            return AT @ Cs + Cs @ A - (lk @ red.reshape(S, -1)).reshape(n, n)

        a = g_out[M].copy()
        q = X.shape[0] - 1
        for k in range(M - 1, -1, -1):
            hk, lk = h[k], lam_n[k]
            for _ in range(substeps):
                a = 0.5 * (a + a.T)
                Pb = a.copy()
                x4 = vjp(hk / 6.0 * a, q, 3, lk, k)
                Pb += x4
                x3 = vjp(hk / 3.0 * a + hk * x4, q, 2, lk, k)
                Pb += x3
                x2 = vjp(hk / 3.0 * a + 0.5 * hk * x3, q, 1, lk, k)
                Pb += x2
                Pb += vjp(hk / 6.0 * a + 0.5 * hk * x2, q, 0, lk, k)
                a = Pb
                q -= 1
            a = a + g_out[k]
        gR = torch.from_numpy(g_R) if g_R is not None else None
        return torch.from_numpy(g_lam), gR, torch.from_numpy(a), None, None, None, None, None


def _padded_sensors(sensors: list[Sensor]) -> tuple[np.ndarray, int]:
    """``Hs`` ``(S, m_max, n)`` with zero rows padding the smaller sensors (their noise is padded by I)."""
    m = max(s.m for s in sensors)
    n = sensors[0].H.shape[1]
    Hs = np.zeros((len(sensors), m, n))
    for i, s in enumerate(sensors):
        Hs[i, : s.m] = s.H.numpy()
    return Hs, m


def _stage_noise(
    sensors: list[Sensor], aux_traj: torch.Tensor | None, M: int, substeps: int, m: int
) -> torch.Tensor:
    """Noise at the RK4 stages ``(N, 4, S, m, m)`` (``(1, 1, S, m, m)`` when no sensor depends on ``u``)."""

    def pad(R: torch.Tensor, mi: int) -> torch.Tensor:
        if mi == m:
            return R
        out = torch.eye(m, dtype=_DT).clone()
        return out.index_put((torch.arange(mi)[:, None], torch.arange(mi)[None, :]), R)

    if aux_traj is None or not any(s.depends_on_aux for s in sensors):
        return torch.stack([pad(s._noise(None), s.m) for s in sensors])[None, None]
    a, b = aux_traj[:-1, None, :], aux_traj[1:, None, :]  # (M, 1, k)
    fr = torch.arange(substeps + 1, dtype=_DT)[None, :, None] / substeps
    u_pts = a + fr * (b - a)  # (M, substeps+1, k)
    u0, u1 = u_pts[:, :-1].reshape(M * substeps, -1), u_pts[:, 1:].reshape(M * substeps, -1)
    um = 0.5 * (u0 + u1)
    per_sensor = []
    for s in sensors:
        if not s.depends_on_aux:
            per_sensor.append(pad(s._noise(None), s.m).expand(M * substeps, 4, m, m))
            continue
        r0 = torch.stack([pad(s._noise(u), s.m) for u in u0])
        rm = torch.stack([pad(s._noise(u), s.m) for u in um])
        r1 = torch.stack([pad(s._noise(u), s.m) for u in u1])
        per_sensor.append(torch.stack([r0, rm, rm, r1], dim=1))
    return torch.stack(per_sensor, dim=2)


def integrate_bound(
    sde: LinearSDE,
    sensors: list[Sensor],
    lam: torch.Tensor,
    t: torch.Tensor,
    P0: torch.Tensor,
    aux_traj: torch.Tensor | None,
    substeps: int,
) -> torch.Tensor:
    """The bound ``(M+1, n, n)`` by RK4 (``substeps`` per interval), differentiable in ``lam``, ``P0`` and
    (through ``R(u)``) ``aux_traj``."""
    Hs, m = _padded_sensors(sensors)
    M = t.numel() - 1
    # RK4 is stable for h |J| < 2.78 on the real axis; the update term's Jacobian is at most ~Σ λ_i and the
    # drift's 2 ρ(A): take enough substeps that h (Σ λ_i + 2 ρ(A)) <= 2 on every interval.
    rho = float(torch.linalg.eigvals(sde.A).abs().max())
    stiff = float(((t[1:] - t[:-1]) * (lam.detach().sum(1) + 2 * rho)).max())
    substeps = max(substeps, math.ceil(stiff / _MAX_H_LAMBDA))
    Rst = _stage_noise(sensors, aux_traj, M, substeps, m)
    h = ((t[1:] - t[:-1]) / substeps).numpy()
    Ps = _BoundODE.apply(lam, Rst, P0, sde.A.numpy(), sde.Q.numpy(), Hs, h, substeps)
    _check_bound_result(Ps.detach())
    return Ps


def mean_cov_bound(
    sde: LinearSDE,
    sensors: Sequence[Sensor],
    rates: ArrayLike,
    t_grid: ArrayLike,
    P0: ArrayLike,
    aux_traj: ArrayLike | None = None,
    substeps: int = 1,
) -> torch.Tensor:
    """The upper bound ``P̄(t_k)`` ``(M+1, n, n)`` on the mean CD-KF covariance under Poisson measurements.

    Args:
        sde: the state model.
        sensors: ``S`` sensors.
        rates: ``(M, S)`` Poisson rates, constant on each interval of ``t_grid`` (``(M,)`` when ``S = 1``);
            gradients flow through it.
        t_grid: ``(M+1,)`` strictly increasing times, ``t_grid[0]`` the start (``P̄ = P0`` there).
        P0: ``(n, n)`` positive semidefinite initial covariance.
        aux_traj: ``(M+1, k)`` mean auxiliary trajectory (required when a sensor's ``R`` depends on it),
            linearly interpolated inside the intervals.
        substeps: RK4 steps per grid interval, at least; more are taken automatically where the rates make
            the ODE stiff (``h (Σ_i λ_i + 2 ρ(A)) <= 2`` on every interval, ``ρ`` the spectral radius).
    """
    if not isinstance(sde, LinearSDE):
        raise TypeError(f"sde must be a LinearSDE; got {type(sde).__name__}")
    sens = sensor_list(sensors, sde.n)
    t = time_grid(t_grid)
    lam = rate_matrix(rates, t.numel() - 1, len(sens))
    P = initial_covariance(P0, sde.n)
    u = aux_on_grid(aux_traj, sens, t.numel())
    sub = check_int(substeps, "substeps", low=1)
    warn_unstable(sde.A, float(t[-1] - t[0]))
    return integrate_bound(sde, sens, lam, t, P, u, sub)


# ------------------------------------------------------------------------------------------ re-exports
_MOVED = {
    **dict.fromkeys(
        ("ObjectiveTerms", "RateSchedule", "control_objective", "optimize_rates"), "icml25.rl.cdkf_control"
    ),
    **dict.fromkeys(
        (
            "FilterResult",
            "MonteCarloResult",
            "cdkf_filter",
            "deterministic_schedule",
            "monte_carlo",
            "poisson_schedule",
        ),
        "icml25.rl.cdkf_schedules",
    ),
}


def __getattr__(name: str) -> Any:
    """The control and the filter (PEP 562): imported on first access, since both modules import this one
    (an import at the top would be circular)."""
    if name in _MOVED:
        value = getattr(importlib.import_module(_MOVED[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
