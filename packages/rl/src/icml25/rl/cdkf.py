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

The bound is evaluated along the *mean* auxiliary trajectory ``ū``; with a nonlinear ``R(u)`` and a
stochastic ``u`` that is a further approximation (here ``u`` follows a deterministic ODE, so ``ū = u``).
All matrices are float64.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from icml25.kernels.checks import check_array, check_int, check_tensor
from icml25.kernels.optim import Adam

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

MAX_ABS = 1e8
"""Largest accepted magnitude of a model entry, rate or time: beyond it the Riccati products overflow."""
_DT = torch.float64
_MAX_H_LAMBDA = 2.0
ArrayLike = torch.Tensor | np.ndarray | Sequence[float] | float


# ------------------------------------------------------------------------------------------ validation
def _real_tensor(
    x: object, name: str, ndim: int | tuple[int, ...], *, allow_empty: bool = False
) -> torch.Tensor:
    """``x`` (real float or integer) as a float64 tensor (keeps autograd) with a checked rank, size, finiteness
    and magnitude (at most ``MAX_ABS``: beyond it the float64 Riccati products overflow)."""
    if isinstance(x, torch.Tensor):
        check_tensor(x, name, dtype=("float", "int"), finite=False)
    else:
        x = torch.from_numpy(
            np.array(check_array(x, name, dtype=("float", "int"), finite=False), dtype=np.float64)
        )
    return check_tensor(x.to(_DT), name, ndim=ndim, non_empty=not allow_empty, max_abs=MAX_ABS)


def _scalar(x: object, name: str, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        if (
            isinstance(x, torch.Tensor)
            and x.numel() == 1
            and not x.dtype.is_complex
            and x.dtype != torch.bool
        ):
            x = float(x.detach())
        else:
            raise TypeError(f"{name} must be a real number; got {type(x).__name__}")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite; got {v}")
    if abs(v) > MAX_ABS:
        raise ValueError(f"{name} must be at most {MAX_ABS:g} in magnitude; got {v:.3g}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0; got {v}")
    if nonneg and v < 0:
        raise ValueError(f"{name} must be >= 0; got {v}")
    return v


def _check_cov(P: torch.Tensor, name: str, *, definite: bool) -> None:
    """Symmetric positive (semi)definite within float tolerance, else ``ValueError`` naming ``name``."""
    Pd = P.detach()
    scale = float(Pd.abs().max()) if Pd.numel() else 0.0
    tol = 1e-9 * max(scale, 1.0)
    if float((Pd - Pd.mT).abs().max()) > tol:
        raise ValueError(
            f"{name} must be symmetric; got max |{name} - {name}^T| = {float((Pd - Pd.mT).abs().max()):.3g}"
        )
    low = float(torch.linalg.eigvalsh(0.5 * (Pd + Pd.mT)).min())
    if definite and low <= 0:
        raise ValueError(f"{name} must be positive definite; got smallest eigenvalue {low:.3g}")
    if not definite and low < -tol:
        raise ValueError(f"{name} must be positive semidefinite; got smallest eigenvalue {low:.3g}")


def _time_grid(t_grid: ArrayLike, name: str = "t_grid") -> torch.Tensor:
    t = _real_tensor(t_grid, name, 1)
    if t.numel() < 2:
        raise ValueError(f"{name} must have at least 2 points; got {t.numel()}")
    if not bool((t[1:] > t[:-1]).all()):
        raise ValueError(
            f"{name} must be strictly increasing; got {t.numel()} points with a non-increasing step"
        )
    return t.detach()


def _rates(rates: ArrayLike, n_steps: int, n_sensors: int, name: str = "rates") -> torch.Tensor:
    r = _real_tensor(rates, name, (1, 2))
    if r.ndim == 1:
        r = r[:, None]
    if r.shape != (n_steps, n_sensors):
        raise ValueError(
            f"{name} must have shape (M, S) = ({n_steps}, {n_sensors}) (one rate per grid interval and sensor); "
            f"got {tuple(r.shape)}"
        )
    if bool((r.detach() < 0).any()):
        raise ValueError(f"{name} must be >= 0 (Poisson rates); got min {float(r.detach().min()):.3g}")
    return r


def _warn_unstable(A: torch.Tensor, horizon: float) -> None:
    growth = float(torch.linalg.eigvals(A.detach()).real.max()) * horizon
    if growth > 5.0:
        warnings.warn(
            f"A is unstable (max Re eig(A) * T = {growth:.3g}): the covariance grows like exp(2 * {growth:.3g}) "
            "over the horizon and may blow up; use a smaller T or a log-Cholesky parameterisation",
            RuntimeWarning,
            stacklevel=3,
        )


# -------------------------------------------------------------------------------------------- models
class LinearSDE:
    """``dx = A x dt + L dβ`` with ``E[dβ dβᵀ] = Qc dt``; ``A`` ``(n, n)``, ``L`` ``(n, s)``, ``Qc`` ``(s, s)``."""

    def __init__(self, A: ArrayLike, L: ArrayLike | None = None, Qc: ArrayLike | None = None) -> None:
        A_t = _real_tensor(A, "A", 2).detach()
        if A_t.shape[0] != A_t.shape[1]:
            raise ValueError(f"A must be square (n, n); got shape {tuple(A_t.shape)}")
        n = A_t.shape[0]
        L_t = torch.eye(n, dtype=_DT) if L is None else _real_tensor(L, "L", 2).detach()
        if L_t.shape[0] != n:
            raise ValueError(f"L must have n = {n} rows (shape (n, s)); got shape {tuple(L_t.shape)}")
        s = L_t.shape[1]
        Qc_t = torch.eye(s, dtype=_DT) if Qc is None else _real_tensor(Qc, "Qc", (0, 2)).detach()
        if Qc_t.ndim == 0:
            Qc_t = Qc_t.reshape(1, 1)
        if Qc_t.shape != (s, s):
            raise ValueError(f"Qc must have shape (s, s) = ({s}, {s}) to match L; got {tuple(Qc_t.shape)}")
        _check_cov(Qc_t, "Qc", definite=False)
        self.A, self.L, self.Qc = A_t, L_t, Qc_t
        self.Q = L_t @ Qc_t @ L_t.mT
        """The diffusion ``L Qc Lᵀ`` ``(n, n)``."""

    @property
    def n(self) -> int:
        """State dimension."""
        return int(self.A.shape[0])

    @classmethod
    def matern32(cls, lengthscale: float = 1.0, sigma: float = 1.0) -> LinearSDE:
        """The Matérn-3/2 GP prior as a 2-D SDE on ``(f, f')``: stationary covariance ``diag(σ², 3σ²/ℓ²)``."""
        ell = _scalar(lengthscale, "lengthscale", positive=True)
        sig = _scalar(sigma, "sigma", positive=True)
        lam = math.sqrt(3.0) / ell
        A = torch.tensor([[0.0, 1.0], [-(lam**2), -2.0 * lam]], dtype=_DT)
        return cls(
            A, torch.tensor([[0.0], [1.0]], dtype=_DT), torch.tensor([[4.0 * lam**3 * sig**2]], dtype=_DT)
        )

    def discretize(self, dt: float | ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact transition ``F = exp(A dt)`` and process covariance ``Qd = ∫_0^dt e^{As} Q e^{Aᵀs} ds``
        by Van Loan's block exponential. ``dt`` a number or a ``(K,)`` array (then ``(K, n, n)`` outputs)."""
        d = _real_tensor(dt, "dt", (0, 1))
        if bool((d < 0).any()):
            raise ValueError(f"dt must be >= 0; got min {float(d.min()):.3g}")
        F, Qd = _van_loan(self.A, self.Q, d.reshape(-1))
        return (F[0], Qd[0]) if d.ndim == 0 else (F, Qd)

    def lyapunov_steady_state(self) -> torch.Tensor:
        """The stationary covariance ``P∞`` ``(n, n)``: ``A P + P Aᵀ + Q = 0`` (needs a Hurwitz ``A``)."""
        if float(torch.linalg.eigvals(self.A).real.max()) >= 0:
            raise ValueError("A must be Hurwitz (all eigenvalues with negative real part) for a steady state")
        n = self.n
        eye = torch.eye(n, dtype=_DT)
        K = torch.kron(eye, self.A) + torch.kron(self.A, eye)
        P = torch.linalg.solve(K, -self.Q.mT.reshape(-1)).reshape(n, n).mT
        return 0.5 * (P + P.mT)

    def __repr__(self) -> str:
        return f"LinearSDE(n={self.n})"


def _van_loan(A: torch.Tensor, Q: torch.Tensor, dts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = A.shape[0]
    blk = torch.zeros(2 * n, 2 * n, dtype=_DT)
    blk[:n, :n] = -A
    blk[:n, n:] = Q
    blk[n:, n:] = A.mT
    E = torch.linalg.matrix_exp(dts[:, None, None] * blk)
    F = E[:, n:, n:].mT
    Qd = F @ E[:, :n, n:]
    return F, 0.5 * (Qd + Qd.mT)


class Sensor:
    """A sensor ``y = H x + v``, ``v ~ N(0, R)``, with cost ``cost`` per measurement.

    ``H`` ``(m, n)`` (a ``(n,)`` vector is one row); ``R`` a positive definite ``(m, m)`` matrix (a number
    when ``m = 1``) or a callable ``R(u) -> (m, m)`` of the auxiliary state ``u`` ``(k,)`` (torch, so that
    the optimiser differentiates through it).
    """

    def __init__(
        self,
        H: ArrayLike,
        R: ArrayLike | Callable[[torch.Tensor], torch.Tensor],
        cost: float = 0.0,
        name: str | None = None,
    ) -> None:
        H_t = _real_tensor(H, "H", (1, 2)).detach()
        self.H = H_t[None, :] if H_t.ndim == 1 else H_t
        self.cost = _scalar(cost, "cost", nonneg=True)
        self.name = name
        m = self.m
        if callable(R) and not isinstance(R, (torch.Tensor, np.ndarray)):
            self._R: torch.Tensor | None = None
            self._R_fn: Callable[[torch.Tensor], torch.Tensor] | None = R
        else:
            R_t = _real_tensor(R, "R", (0, 1, 2)).detach()
            R_t = R_t.reshape(1, 1) if R_t.numel() == 1 and m == 1 else R_t
            if R_t.ndim != 2 or R_t.shape != (m, m):
                raise ValueError(
                    f"R must have shape (m, m) = ({m}, {m}) to match H {tuple(self.H.shape)}; got {tuple(R_t.shape)}"
                )
            _check_cov(R_t, "R", definite=True)
            self._R, self._R_fn = R_t, None

    @property
    def m(self) -> int:
        """Measurement dimension."""
        return int(self.H.shape[0])

    @property
    def depends_on_aux(self) -> bool:
        """Whether ``R`` is a function of the auxiliary state."""
        return self._R_fn is not None

    def noise(self, aux: torch.Tensor | None = None) -> torch.Tensor:
        """``R`` ``(m, m)`` (at the auxiliary state ``aux`` ``(k,)`` when ``R`` is a callable), validated."""
        R = self._noise(aux, check_aux=True)
        if self._R_fn is not None:
            if not isinstance(R, torch.Tensor) or R.shape != (self.m, self.m):
                got = tuple(R.shape) if isinstance(R, torch.Tensor) else type(R).__name__
                raise ValueError(f"R(u) must return a ({self.m}, {self.m}) tensor; got {got}")
            if not bool(torch.isfinite(R.detach()).all()):
                raise ValueError("R(u) must be finite; got non-finite values")
            _check_cov(R, "R(u)", definite=True)
        return R

    def _noise(self, aux: torch.Tensor | None, check_aux: bool = False) -> torch.Tensor:
        if self._R_fn is None:
            return self._R  # type: ignore[return-value]
        if aux is None:
            raise ValueError("aux must be given: this sensor's R depends on the auxiliary state")
        return self._R_fn(aux).to(_DT)

    def __repr__(self) -> str:
        return f"Sensor(m={self.m}, cost={self.cost:g}{', R(u)' if self.depends_on_aux else ''})"


def _check_sensors(sensors: object, n: int) -> list[Sensor]:
    if isinstance(sensors, Sensor):
        sensors = [sensors]
    if (
        not isinstance(sensors, (list, tuple))
        or not sensors
        or not all(isinstance(s, Sensor) for s in sensors)
    ):
        raise TypeError(f"sensors must be a non-empty list of Sensor; got {type(sensors).__name__}")
    for i, s in enumerate(sensors):
        if s.H.shape[1] != n:
            raise ValueError(
                f"sensors[{i}].H must have n = {n} columns to match A; got shape {tuple(s.H.shape)}"
            )
    return list(sensors)


@dataclass
class AuxDynamics:
    """Auxiliary dynamics ``du/dt = g(u, w)`` with ``u(0) = u0`` ``(k,)``, controls ``w`` ``(w_dim,)`` and
    running cost ``running_cost(u, w) -> scalar`` (torch functions, differentiated by the optimiser)."""

    g: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    u0: torch.Tensor
    w_dim: int
    running_cost: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if not callable(self.g):
            raise TypeError(f"g must be callable g(u, w) -> du/dt; got {type(self.g).__name__}")
        self.u0 = _real_tensor(self.u0, "u0", (0, 1)).detach().reshape(-1)
        self.w_dim = check_int(self.w_dim, "w_dim", low=1)

    @classmethod
    def integrator(cls, u0: ArrayLike, control_cost: float = 0.1) -> AuxDynamics:
        """``du/dt = w`` (a movable sensor position) with cost ``control_cost · |w|²``."""
        c = _scalar(control_cost, "control_cost", nonneg=True)
        u = _real_tensor(u0, "u0", (0, 1)).detach().reshape(-1)
        return cls(lambda _u, w: w, u, int(u.numel()), lambda _u, w: c * (w * w).sum())


class AuxPath(NamedTuple):
    """An auxiliary trajectory ``states`` ``(M+1, k)`` on the grid ``t`` ``(M+1,)``, linearly interpolated."""

    t: np.ndarray
    states: np.ndarray

    def at(self, t: float) -> torch.Tensor:
        """``u(t)`` ``(k,)`` by linear interpolation (constant outside the grid)."""
        return torch.tensor(
            [np.interp(t, self.t, self.states[:, j]) for j in range(self.states.shape[1])], dtype=_DT
        )


def aux_trajectory(aux: AuxDynamics, controls: ArrayLike, t_grid: ArrayLike) -> torch.Tensor:
    """RK4 of ``du/dt = g(u, w)`` with ``w`` ``(M, w_dim)`` constant on each interval: ``(M+1, k)``."""
    if not isinstance(aux, AuxDynamics):
        raise TypeError(f"aux must be an AuxDynamics; got {type(aux).__name__}")
    t = _time_grid(t_grid)
    w = _real_tensor(controls, "controls", (1, 2))
    w = w[:, None] if w.ndim == 1 else w
    if w.shape != (t.numel() - 1, aux.w_dim):
        raise ValueError(
            f"controls must have shape (M, w_dim) = ({t.numel() - 1}, {aux.w_dim}); got {tuple(w.shape)}"
        )
    return _aux_rk4(aux, w, t)


def _aux_rk4(aux: AuxDynamics, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    u = aux.u0
    out = [u]
    for k in range(t.numel() - 1):
        h = t[k + 1] - t[k]
        k1 = aux.g(u, w[k])
        k2 = aux.g(u + 0.5 * h * k1, w[k])
        k3 = aux.g(u + 0.5 * h * k2, w[k])
        k4 = aux.g(u + h * k3, w[k])
        u = u + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        out.append(u)
    return torch.stack(out)


# ------------------------------------------------------------------------------------- the Kalman step
def kalman_update(P: ArrayLike, H: ArrayLike, R: ArrayLike) -> torch.Tensor:
    """The update map ``U(P) = P − P Hᵀ (H P Hᵀ + R)⁻¹ H P`` (Joseph-stabilised, symmetrised), ``(n, n)``."""
    P_t = _real_tensor(P, "P", 2)
    H_t = _real_tensor(H, "H", (1, 2))
    H_t = H_t[None, :] if H_t.ndim == 1 else H_t
    R_t = _real_tensor(R, "R", (0, 1, 2))
    R_t = R_t.reshape(1, 1) if R_t.numel() == 1 else R_t
    n, m = P_t.shape[0], H_t.shape[0]
    if P_t.shape != (n, n) or H_t.shape[1] != n or R_t.shape != (m, m):
        raise ValueError(
            f"P must be (n, n), H (m, n) and R (m, m); got P {tuple(P_t.shape)}, H {tuple(H_t.shape)}, R {tuple(R_t.shape)}"
        )
    _check_cov(P_t, "P", definite=False)
    _check_cov(R_t, "R", definite=True)
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


def _integrate_bound(
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


def _check_P0(P0: ArrayLike, n: int) -> torch.Tensor:
    P = _real_tensor(P0, "P0", 2)
    if P.shape != (n, n):
        raise ValueError(f"P0 must have shape (n, n) = ({n}, {n}); got {tuple(P.shape)}")
    _check_cov(P, "P0", definite=False)
    return P


def _check_aux_traj(aux_traj: ArrayLike | None, sensors: list[Sensor], n_points: int) -> torch.Tensor | None:
    if aux_traj is None:
        if any(s.depends_on_aux for s in sensors):
            raise ValueError("aux_traj must be given: a sensor's R depends on the auxiliary state")
        return None
    u = _real_tensor(aux_traj, "aux_traj", (1, 2))
    u = u[:, None] if u.ndim == 1 else u
    if u.shape[0] != n_points:
        raise ValueError(
            f"aux_traj must have M+1 = {n_points} rows (one per grid point); got shape {tuple(u.shape)}"
        )
    for i, s in enumerate(sensors):
        if s.depends_on_aux:
            for k in range(n_points):  # validate R(u) once on every grid point (RK4 uses it unchecked)
                try:
                    s.noise(u[k].detach())
                except ValueError as exc:
                    raise ValueError(f"aux_traj: sensors[{i}].R at grid point {k}: {exc}") from exc
    return u


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
    sens = _check_sensors(sensors, sde.n)
    t = _time_grid(t_grid)
    lam = _rates(rates, t.numel() - 1, len(sens))
    P = _check_P0(P0, sde.n)
    u = _check_aux_traj(aux_traj, sens, t.numel())
    sub = check_int(substeps, "substeps", low=1)
    _warn_unstable(sde.A, float(t[-1] - t[0]))
    return _integrate_bound(sde, sens, lam, t, P, u, sub)


# ------------------------------------------------------------------------------------ optimal control
class ObjectiveTerms(NamedTuple):
    """The terms of ``J`` (scalar tensors), the bound ``(M+1, n, n)`` and the auxiliary path ``(M+1, k)``."""

    total: torch.Tensor
    estimation: torch.Tensor
    terminal: torch.Tensor
    rate: torch.Tensor
    aux: torch.Tensor
    bound: torch.Tensor
    aux_traj: torch.Tensor | None


def _weights(W: ArrayLike | None, n: int, name: str, default_eye: bool) -> torch.Tensor:
    if W is None:
        return torch.eye(n, dtype=_DT) if default_eye else torch.zeros(n, n, dtype=_DT)
    Wt = _real_tensor(W, name, 2).detach()
    if Wt.shape != (n, n):
        raise ValueError(f"{name} must have shape (n, n) = ({n}, {n}); got {tuple(Wt.shape)}")
    _check_cov(Wt, name, definite=False)
    return Wt


def _time_weight(time_weight: ArrayLike | Callable | None, t: torch.Tensor) -> torch.Tensor:
    if time_weight is None:
        return torch.ones_like(t)
    tw = time_weight(t) if callable(time_weight) else time_weight
    w = _real_tensor(tw, "time_weight", 1).detach()
    if w.shape != t.shape:
        raise ValueError(f"time_weight must have shape (M+1,) = ({t.numel()},); got {tuple(w.shape)}")
    if bool((w < 0).any()):
        raise ValueError(f"time_weight must be >= 0; got min {float(w.min()):.3g}")
    return w


def _trapezoid(f: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return (0.5 * (f[1:] + f[:-1]) * (t[1:] - t[:-1])).sum()


def _objective(
    sde: LinearSDE,
    sens: list[Sensor],
    lam: torch.Tensor,
    t: torch.Tensor,
    P0: torch.Tensor,
    W: torch.Tensor,
    W_T: torch.Tensor,
    omega: torch.Tensor,
    aux: AuxDynamics | None,
    w: torch.Tensor | None,
    substeps: int,
) -> ObjectiveTerms:
    u = _aux_rk4(aux, w, t) if aux is not None and w is not None else None
    if u is None and any(s.depends_on_aux for s in sens):
        raise ValueError("aux must be given: a sensor's R depends on the auxiliary state")
    P = _integrate_bound(sde, sens, lam, t, P0, u, substeps)
    trace = (W * P).sum((-1, -2))  # tr(W P) for symmetric W
    est = _trapezoid(omega * trace, t)
    term = (W_T * P[-1]).sum()
    costs = torch.tensor([s.cost for s in sens], dtype=_DT)
    rate = ((lam * (t[1:] - t[:-1])[:, None]) * costs).sum()
    aux_cost = torch.zeros((), dtype=_DT)
    if u is not None and aux is not None and aux.running_cost is not None:
        ell = torch.stack(
            [0.5 * (aux.running_cost(u[k], w[k]) + aux.running_cost(u[k + 1], w[k])) for k in range(len(w))]
        )  # type: ignore[index]
        aux_cost = (ell * (t[1:] - t[:-1])).sum()
    return ObjectiveTerms(est + term + rate + aux_cost, est, term, rate, aux_cost, P, u)


def control_objective(
    sde: LinearSDE,
    sensors: Sequence[Sensor],
    rates: ArrayLike,
    t_grid: ArrayLike,
    P0: ArrayLike,
    W: ArrayLike | None = None,
    W_T: ArrayLike | None = None,
    time_weight: ArrayLike | Callable[[torch.Tensor], torch.Tensor] | None = None,
    aux: AuxDynamics | None = None,
    aux_controls: ArrayLike | None = None,
    substeps: int = 1,
) -> ObjectiveTerms:
    """``J = ∫ ω(t) tr(W P̄) dt + tr(W_T P̄(T)) + Σ_i c_i ∫ λ_i dt + ∫ ℓ(ū, w) dt`` (trapezoid on ``t_grid``).

    ``rates`` ``(M, S)``; ``W`` ``(n, n)`` (default ``I``); ``W_T`` ``(n, n)`` (default 0); ``time_weight``
    ``ω`` ``(M+1,)`` or a callable of ``t_grid`` (default 1); ``aux_controls`` ``(M, w_dim)`` drive ``aux``
    (default 0). Differentiable in ``rates`` and ``aux_controls``.
    """
    if not isinstance(sde, LinearSDE):
        raise TypeError(f"sde must be a LinearSDE; got {type(sde).__name__}")
    sens = _check_sensors(sensors, sde.n)
    t = _time_grid(t_grid)
    M = t.numel() - 1
    lam = _rates(rates, M, len(sens))
    P = _check_P0(P0, sde.n)
    w = None
    if aux is not None:
        if not isinstance(aux, AuxDynamics):
            raise TypeError(f"aux must be an AuxDynamics; got {type(aux).__name__}")
        w = (
            torch.zeros(M, aux.w_dim, dtype=_DT)
            if aux_controls is None
            else _real_tensor(aux_controls, "aux_controls", (1, 2))
        )
        w = w[:, None] if w.ndim == 1 else w
        if w.shape != (M, aux.w_dim):
            raise ValueError(
                f"aux_controls must have shape (M, w_dim) = ({M}, {aux.w_dim}); got {tuple(w.shape)}"
            )
        _check_aux_traj(_aux_rk4(aux, w.detach(), t), sens, M + 1)
    _warn_unstable(sde.A, float(t[-1] - t[0]))
    return _objective(
        sde, sens, lam, t, P, _weights(W, sde.n, "W", True), _weights(W_T, sde.n, "W_T", False),
        _time_weight(time_weight, t), aux, w, check_int(substeps, "substeps", low=1),
    )  # fmt: skip


@dataclass
class RateSchedule:
    """The optimised rates ``(M, S)`` on ``t_grid`` ``(M+1,)``, the bound ``(M+1, n, n)`` along them, the
    auxiliary controls ``(M, w_dim)`` and path ``(M+1, k)`` (or None), and the objective's terms."""

    t_grid: np.ndarray
    rates: np.ndarray
    bound: np.ndarray
    lam_max: np.ndarray
    objective: float
    terms: dict[str, float]
    aux_controls: np.ndarray | None = None
    aux_traj: np.ndarray | None = None
    history: list[float] = field(default_factory=list)

    @property
    def aux_path(self) -> AuxPath | None:
        """The auxiliary trajectory as an :class:`AuxPath` (None without auxiliary dynamics)."""
        return None if self.aux_traj is None else AuxPath(self.t_grid, self.aux_traj)

    def expected_counts(self) -> np.ndarray:
        """``Λ_i(T) = ∫ λ_i dt`` per sensor ``(S,)``."""
        return (self.rates * np.diff(self.t_grid)[:, None]).sum(0)


def optimize_rates(
    sde: LinearSDE,
    sensors: Sequence[Sensor],
    T: float,
    lam_max: float | ArrayLike,
    *,
    P0: ArrayLike | None = None,
    M: int = 100,
    W: ArrayLike | None = None,
    W_T: ArrayLike | None = None,
    time_weight: ArrayLike | Callable[[torch.Tensor], torch.Tensor] | None = None,
    aux: AuxDynamics | None = None,
    steps: int = 200,
    lr: float = 0.2,
    init_rate: float = 1.0,
    l2: float = 0.0,
    n_pieces: int | None = None,
    substeps: int = 1,
    prune: float = 1e-3,
) -> RateSchedule:
    """Finite-horizon optimal control of the rates (and auxiliary controls) by direct transcription.

    Rates are piecewise constant on ``M`` equal intervals of ``[0, T]``, ``λ = λ_max · sigmoid(θ)`` (so
    ``0 ≤ λ ≤ λ_max``), and Adam minimises :func:`control_objective` (plus ``l2 · mean(θ²)``, a
    regulariser against stalling at the saturated ends of the sigmoid) through torch autograd. The sensor
    costs ``c_i`` come from ``Sensor.cost``. ``n_pieces`` (a divisor of ``M``) ties the rates to that many
    equal blocks (``1``: the best *constant* rates). The sigmoid never reaches 0, so rates below
    ``prune · λ_max`` are set to exactly 0 in the result (the bound and the terms are recomputed with them;
    ``prune=0`` keeps them): a rate of 1e-2 would otherwise stand for rare measurements that no Monte Carlo
    of practical size resolves. ``P0`` defaults to the stationary covariance (identity
    when ``A`` is not Hurwitz). Deterministic: the initialisation is ``λ = init_rate``, ``w = 0``.
    """
    if not isinstance(sde, LinearSDE):
        raise TypeError(f"sde must be a LinearSDE; got {type(sde).__name__}")
    sens = _check_sensors(sensors, sde.n)
    S = len(sens)
    T_ = _scalar(T, "T", positive=True)
    lm = _real_tensor(lam_max, "lam_max", (0, 1)).detach().reshape(-1)
    if lm.numel() == 1:
        lm = lm.expand(S).clone()
    if lm.numel() != S:
        raise ValueError(f"lam_max must be a number or one value per sensor ({S}); got {lm.numel()} values")
    if bool((lm <= 0).any()):
        raise ValueError(f"lam_max must be > 0; got {lm.tolist()}")
    M_ = check_int(M, "M", low=1)
    steps_ = check_int(steps, "steps", low=0)
    lr_ = _scalar(lr, "lr", positive=True)
    l2_ = _scalar(l2, "l2", nonneg=True)
    r0 = _scalar(init_rate, "init_rate", positive=True)
    if bool((lm <= r0).any()):
        raise ValueError(f"init_rate must be below lam_max ({lm.min().item():g}); got {r0}")
    pieces = M_ if n_pieces is None else check_int(n_pieces, "n_pieces", low=1)
    if M_ % pieces:
        raise ValueError(f"n_pieces must divide M = {M_}; got {pieces}")
    sub = check_int(substeps, "substeps", low=1)
    prune_ = _scalar(prune, "prune", nonneg=True)
    if P0 is None:
        try:
            P_init = sde.lyapunov_steady_state()
        except ValueError:
            P_init = torch.eye(sde.n, dtype=_DT)
    else:
        P_init = _check_P0(P0, sde.n).detach()
    if aux is not None and not isinstance(aux, AuxDynamics):
        raise TypeError(f"aux must be an AuxDynamics; got {type(aux).__name__}")
    if aux is None and any(s.depends_on_aux for s in sens):
        raise ValueError("aux must be given: a sensor's R depends on the auxiliary state")
    t = torch.linspace(0.0, T_, M_ + 1, dtype=_DT)
    Wt, WTt, omega = (
        _weights(W, sde.n, "W", True),
        _weights(W_T, sde.n, "W_T", False),
        _time_weight(time_weight, t),
    )
    _warn_unstable(sde.A, T_)

    theta = torch.full((pieces, S), math.log(r0 / (lm.min().item() - r0)), dtype=_DT, requires_grad=True)
    params = [theta]
    w = None
    if aux is not None:
        w = torch.zeros(M_, aux.w_dim, dtype=_DT, requires_grad=True)
        params.append(w)
        _check_aux_traj(_aux_rk4(aux, w.detach(), t), sens, M_ + 1)
    rep = M_ // pieces

    def lam_of(th: torch.Tensor) -> torch.Tensor:
        return (lm * torch.sigmoid(th)).repeat_interleave(rep, dim=0)

    opt = Adam(params, lr=lr_)  # betas 0.9, 0.999, eps 1e-8
    history: list[float] = []
    for _ in range(steps_):
        terms = _objective(sde, sens, lam_of(theta), t, P_init, Wt, WTt, omega, aux, w, sub)
        loss = terms.total + l2_ * (theta**2).mean()
        opt.step(torch.autograd.grad(loss, params))
        history.append(float(terms.total.detach()))
    with torch.no_grad():
        lam = lam_of(theta)
        lam = torch.where(lam < prune_ * lm, torch.zeros_like(lam), lam)
        terms = _objective(sde, sens, lam, t, P_init, Wt, WTt, omega, aux, w, sub)
    return RateSchedule(
        t_grid=t.numpy(),
        rates=lam.numpy().copy(),
        bound=terms.bound.numpy().copy(),
        lam_max=lm.numpy().copy(),
        objective=float(terms.total),
        terms={k: float(getattr(terms, k)) for k in ("estimation", "terminal", "rate", "aux")},
        aux_controls=None if w is None else w.detach().numpy().copy(),
        aux_traj=None if terms.aux_traj is None else terms.aux_traj.numpy().copy(),
        history=history,
    )


# ------------------------------------------------------------------------------------------ schedules
def _rates_np(rates: ArrayLike, t_grid: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    t = _time_grid(t_grid).numpy()
    r = _real_tensor(rates, "rates", (1, 2))
    S = 1 if r.ndim == 1 else r.shape[1]
    return _rates(r, t.size - 1, S).detach().numpy(), t


def deterministic_schedule(rates: ArrayLike, t_grid: ArrayLike, offset: float = 0.5) -> list[np.ndarray]:
    """Deterministic measurement times from rates ``(M, S)`` on ``t_grid`` ``(M+1,)``.

    The k-th measurement of sensor i (k = 1, 2, ...) is at the first t with ``Λ_i(t) = ∫_0^t λ_i ≥
    k − offset`` (``offset`` in ``[0, 1)``; 0.5 is the midpoint rule, giving ``round(Λ_i(T))`` measurements).
    Returns S sorted arrays of times.
    """
    r, t = _rates_np(rates, t_grid)
    off = _scalar(offset, "offset", nonneg=True)
    if off >= 1.0:
        raise ValueError(f"offset must lie in [0, 1); got {off}")
    dt = np.diff(t)
    out = []
    for i in range(r.shape[1]):
        cum = np.concatenate([[0.0], np.cumsum(r[:, i] * dt)])
        n_meas = int(np.floor(cum[-1] + off + 1e-12))
        levels = np.arange(1, n_meas + 1) - off
        levels = np.maximum(levels, 0.0)
        j = np.clip(np.searchsorted(cum, levels - 1e-12, side="left"), 1, t.size - 1)
        lo = cum[j - 1]
        frac = np.where(r[j - 1, i] > 0, (levels - lo) / np.maximum(r[j - 1, i] * dt[j - 1], 1e-300), 0.0)
        times = t[j - 1] + np.clip(frac, 0.0, 1.0) * dt[j - 1]
        times[levels <= 0] = t[0]
        out.append(np.maximum.accumulate(times) if times.size else times)
    return out


def poisson_schedule(
    rates: ArrayLike, t_grid: ArrayLike, seed: int | np.random.Generator | None = None
) -> list[np.ndarray]:
    """Measurement times of independent inhomogeneous Poisson processes with piecewise-constant rates
    ``(M, S)`` on ``t_grid`` ``(M+1,)`` (``seed``: an int or a ``numpy.random.Generator``). S sorted arrays."""
    r, t = _rates_np(rates, t_grid)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    dt = np.diff(t)
    out = []
    for i in range(r.shape[1]):
        counts = rng.poisson(r[:, i] * dt)
        starts = np.repeat(t[:-1], counts)
        widths = np.repeat(dt, counts)
        out.append(np.sort(starts + rng.random(starts.size) * widths))
    return out


# ------------------------------------------------------------------------------- the filter and the MC
class FilterResult(NamedTuple):
    """CD-KF output at each measurement, in time order: ``times`` ``(K,)``, ``sensor`` ``(K,)`` (index),
    filtered ``means`` ``(K, n)`` and ``covs`` ``(K, n, n)``."""

    times: np.ndarray
    sensor: np.ndarray
    means: np.ndarray
    covs: np.ndarray


def _check_times(
    times: object, n_sensors: int, t0: float, t1: float | None, name: str = "times"
) -> list[np.ndarray]:
    if not isinstance(times, (list, tuple)) or len(times) != n_sensors:
        raise ValueError(
            f"{name} must be a list of {n_sensors} arrays (one per sensor); got {type(times).__name__}"
        )
    out = []
    for i, ti in enumerate(times):
        a = _real_tensor(ti, f"{name}[{i}]", 1, allow_empty=True).numpy()
        if a.size and (a.min() < t0 or (t1 is not None and a.max() > t1)):
            raise ValueError(
                f"{name}[{i}] must lie in [{t0:g}, {t1 if t1 is not None else math.inf:g}]; got range [{a.min():g}, {a.max():g}]"
            )
        if a.size > 1 and bool((np.diff(a) < 0).any()):
            raise ValueError(f"{name}[{i}] must be sorted (non-decreasing)")
        out.append(a)
    return out


def _merge(times: list[np.ndarray], grid: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted event times and kinds (sensor index, or -1 for a grid point; measurements first at ties)."""
    ts = [ti for ti in times] + ([grid] if grid is not None else [])
    kinds = [np.full(ti.size, i) for i, ti in enumerate(times)] + (
        [np.full(grid.size, -1)] if grid is not None else []
    )
    t_all = np.concatenate(ts) if ts else np.zeros(0)
    k_all = np.concatenate(kinds).astype(np.int64) if kinds else np.zeros(0, np.int64)
    order = np.lexsort((k_all == -1, t_all))
    return t_all[order], k_all[order]


def _sqrtm_psd(Ms: np.ndarray) -> np.ndarray:
    w, V = np.linalg.eigh(Ms)
    return V * np.sqrt(np.clip(w, 0.0, None))[..., None, :]


def _noise_np(sens: list[Sensor], aux_path: AuxPath | None, i: int, t: float) -> np.ndarray:
    s = sens[i]
    if not s.depends_on_aux:
        return s._R.numpy()  # type: ignore[union-attr]
    if aux_path is None:
        raise ValueError("aux_path must be given: a sensor's R depends on the auxiliary state")
    return s.noise(aux_path.at(t)).detach().numpy()


def _run(
    sde: LinearSDE,
    sens: list[Sensor],
    times: list[np.ndarray],
    t0: float,
    grid: np.ndarray | None,
    P0: np.ndarray,
    m0: np.ndarray | None,
    x0: np.ndarray | None,
    ys: list[np.ndarray] | None,
    rng: np.random.Generator | None,
    aux_path: AuxPath | None,
    W: np.ndarray,
) -> dict[str, np.ndarray]:
    """One CD-KF pass over merged events: covariance (and mean / simulated state) recursion."""
    t_ev, kind = _merge(times, grid)
    dts = np.diff(np.concatenate([[t0], t_ev]))
    F, Qd = (a.numpy() for a in _van_loan(sde.A, sde.Q, torch.from_numpy(dts)))
    simulate = rng is not None
    Qs = _sqrtm_psd(Qd) if simulate else None
    P = P0.copy()
    m = None if m0 is None else m0.copy()
    x = x0.copy() if x0 is not None else None
    counters = [0] * len(sens)
    tr_grid, err_grid, meas_means, meas_covs = [], [], [], []
    n = P.shape[0]
    for e in range(t_ev.size):
        Fe = F[e]
        P = Fe @ P @ Fe.T + Qd[e]
        if m is not None:
            m = Fe @ m
        if simulate:
            x = Fe @ x + Qs[e] @ rng.standard_normal(n)  # type: ignore[index,operator]
        i = kind[e]
        if i >= 0:
            H = sens[i].H.numpy()
            R = _noise_np(sens, aux_path, i, t_ev[e])
            S = H @ P @ H.T + R
            K = np.linalg.solve(S, H @ P).T
            I_KH = np.eye(n) - K @ H
            if m is not None:
                if simulate:
                    y = H @ x + _sqrtm_psd(R) @ rng.standard_normal(R.shape[0])  # type: ignore[union-attr,operator]
                else:
                    y = ys[i][counters[i]]  # type: ignore[index]
                m = m + K @ (y - H @ m)
            P = I_KH @ P @ I_KH.T + K @ R @ K.T
            P = 0.5 * (P + P.T)
            counters[i] += 1
            if grid is None:
                meas_means.append(m)
                meas_covs.append(P)
        else:
            tr_grid.append(float(np.sum(W * P)))
            if simulate:
                d = x - m  # type: ignore[operator]
                err_grid.append(float(d @ W @ d))
    return {
        "t": t_ev, "kind": kind, "trace": np.array(tr_grid), "err": np.array(err_grid),
        "means": np.array(meas_means), "covs": np.array(meas_covs), "counts": np.array(counters),
    }  # fmt: skip


def cdkf_filter(
    sde: LinearSDE,
    sensors: Sequence[Sensor],
    times: Sequence[ArrayLike],
    ys: Sequence[ArrayLike],
    m0: ArrayLike,
    P0: ArrayLike,
    t0: float = 0.0,
    t_end: float | None = None,
    aux_path: AuxPath | None = None,
) -> FilterResult:
    """The continuous-discrete Kalman filter on irregular multi-sensor data.

    ``times[i]`` ``(k_i,)`` sorted measurement times of sensor i in ``[t0, t_end]`` and ``ys[i]``
    ``(k_i, m_i)`` its measurements (``(k_i,)`` when ``m_i = 1``). Between measurements the moments are
    propagated exactly (Van Loan); at each one the Kalman update is applied (Joseph form). Measurements at
    equal times are processed in sensor order. ``aux_path`` gives ``u(t)`` for sensors whose ``R`` depends
    on it.
    """
    if not isinstance(sde, LinearSDE):
        raise TypeError(f"sde must be a LinearSDE; got {type(sde).__name__}")
    sens = _check_sensors(sensors, sde.n)
    t0_ = _scalar(t0, "t0")
    t1 = None if t_end is None else _scalar(t_end, "t_end")
    if t1 is not None and t1 <= t0_:
        raise ValueError(f"t_end must exceed t0 = {t0_}; got {t1}")
    tl = _check_times(times, len(sens), t0_, t1)
    if not isinstance(ys, (list, tuple)) or len(ys) != len(sens):
        raise ValueError(f"ys must be a list of {len(sens)} arrays (one per sensor); got {type(ys).__name__}")
    yl = []
    for i, (yi, ti) in enumerate(zip(ys, tl, strict=True)):
        a = _real_tensor(yi, f"ys[{i}]", (1, 2), allow_empty=True).numpy()
        a = a.reshape(-1, 1) if a.ndim == 1 else a
        if a.shape != (ti.size, sens[i].m):
            raise ValueError(
                f"ys[{i}] must have shape (k_i, m_i) = ({ti.size}, {sens[i].m}) (k_i = len(times[{i}])); got {a.shape}"
            )
        yl.append(a)
    m = _real_tensor(m0, "m0", 1).numpy()
    if m.shape != (sde.n,):
        raise ValueError(f"m0 must have shape (n,) = ({sde.n},); got {m.shape}")
    P = _check_P0(P0, sde.n).detach().numpy()
    if aux_path is not None and not isinstance(aux_path, AuxPath):
        raise TypeError(f"aux_path must be an AuxPath; got {type(aux_path).__name__}")
    res = _run(sde, sens, tl, t0_, None, P, m, None, yl, None, aux_path, np.eye(sde.n))
    n = sde.n
    return FilterResult(res["t"], res["kind"], res["means"].reshape(-1, n), res["covs"].reshape(-1, n, n))


@dataclass
class MonteCarloResult:
    """Per-run ``tr(W P(t))`` ``(n_runs, K)`` on ``t_eval`` ``(K,)``, filter errors ``(x − m)ᵀ W (x − m)``
    ``(n_runs, K)`` (when simulated, else empty) and measurement counts ``(n_runs, S)``."""

    t_eval: np.ndarray
    traces: np.ndarray
    sq_errors: np.ndarray
    counts: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        """MC mean of ``tr(W P(t))`` ``(K,)``."""
        return self.traces.mean(0)

    @property
    def se(self) -> np.ndarray:
        """Standard error of :attr:`mean` ``(K,)``."""
        n = self.traces.shape[0]
        return self.traces.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.zeros(self.traces.shape[1])

    def integral(self, time_weight: np.ndarray | None = None, errors: bool = False) -> np.ndarray:
        """Per-run ``∫ ω(t) tr(W P) dt`` (or of the squared errors) by the trapezoid rule ``(n_runs,)``."""
        f = self.sq_errors if errors else self.traces
        w = np.ones_like(self.t_eval) if time_weight is None else np.asarray(time_weight, dtype=np.float64)
        g = w * f
        return (0.5 * (g[:, 1:] + g[:, :-1]) * np.diff(self.t_eval)).sum(1)


def monte_carlo(
    sde: LinearSDE,
    sensors: Sequence[Sensor],
    rates: ArrayLike,
    t_grid: ArrayLike,
    P0: ArrayLike,
    *,
    n_runs: int = 100,
    schedule: str = "poisson",
    t_eval: ArrayLike | None = None,
    W: ArrayLike | None = None,
    aux_traj: ArrayLike | None = None,
    simulate: bool = False,
    offset: float = 0.5,
    seed: int = 0,
) -> MonteCarloResult:
    """Monte Carlo of the CD-KF covariance under measurement times drawn from ``rates`` ``(M, S)``.

    ``schedule``: ``"poisson"`` (:func:`poisson_schedule`, a new draw per run) or ``"deterministic"``
    (:func:`deterministic_schedule` with ``offset``; identical covariance in every run). ``tr(W P(t))`` is
    recorded on ``t_eval`` (default ``t_grid``; right limits, i.e. after a measurement at that time).
    With ``simulate=True`` each run also samples a state path ``x ~ N(0, P0)`` and measurements, runs the
    filter from ``m0 = 0`` and records ``(x − m)ᵀ W (x − m)`` (its mean is the filter MSE).
    """
    if not isinstance(sde, LinearSDE):
        raise TypeError(f"sde must be a LinearSDE; got {type(sde).__name__}")
    sens = _check_sensors(sensors, sde.n)
    r, t = _rates_np(rates, t_grid)
    if r.shape[1] != len(sens):
        raise ValueError(f"rates must have shape (M, S) with S = {len(sens)} sensors; got {r.shape}")
    te = t if t_eval is None else _time_grid(t_eval, "t_eval").numpy()
    if te[0] < t[0] or te[-1] > t[-1]:
        raise ValueError(
            f"t_eval must lie within t_grid's range [{t[0]:g}, {t[-1]:g}]; got [{te[0]:g}, {te[-1]:g}]"
        )
    P = _check_P0(P0, sde.n).detach().numpy()
    runs = check_int(n_runs, "n_runs", low=1)
    if schedule not in ("poisson", "deterministic"):
        raise ValueError(f"schedule must be 'poisson' or 'deterministic'; got {schedule!r}")
    u = _check_aux_traj(aux_traj, sens, t.size)
    path = None if u is None else AuxPath(t, u.detach().numpy())
    Wn = _weights(W, sde.n, "W", True).numpy()
    _warn_unstable(sde.A, float(t[-1] - t[0]))
    rng = np.random.default_rng(check_int(seed, "seed", low=0))
    det = deterministic_schedule(r, t, offset) if schedule == "deterministic" else None
    grid = te[te > t[0]]
    traces, errs, counts = [], [], []
    tr0 = float(np.sum(Wn * P))
    P_sqrt = _sqrtm_psd(P)
    for _ in range(runs):
        times = det if det is not None else poisson_schedule(r, t, rng)
        x0 = P_sqrt @ rng.standard_normal(sde.n) if simulate else None
        res = _run(
            sde, sens, times, float(t[0]), grid, P, np.zeros(sde.n) if simulate else None, x0, None,
            rng if simulate else None, path, Wn,
        )  # fmt: skip
        head = [tr0] if grid.size < te.size else []
        traces.append(np.concatenate([head, res["trace"]]))
        if simulate:
            e0 = [float(x0 @ Wn @ x0)] if grid.size < te.size else []  # type: ignore[operator]
            errs.append(np.concatenate([e0, res["err"]]))
        counts.append(res["counts"])
    return MonteCarloResult(
        te, np.array(traces), np.array(errs) if simulate else np.zeros((0, te.size)), np.array(counts)
    )
