"""Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with Auxiliary Dynamics — ICML 2025, P46: the models: the linear SDE, the sensors and the auxiliary dynamics.

Ahdab et al., "Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with
Auxiliary Dynamics", ICML 2025 (arXiv 2507.11240; no official code was released). The model and the method
are described in :mod:`icml25.rl.cdkf`.

:class:`LinearSDE` (``dx = A x dt + L dβ``, spectral density ``Qc``, exact Van Loan discretisation),
:class:`Sensor` (``y = H x + v``, ``v ~ N(0, R(u))``, a cost per unit rate) and :class:`AuxDynamics`
(``du/dt = g(u, w)`` with a running cost), integrated by :func:`aux_trajectory`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from icml25.kernels.checks import check_int
from icml25.rl.cdkf_validation import ArrayLike, real_scalar, real_tensor, require_covariance, time_grid

__all__ = [
    "AuxDynamics",
    "AuxPath",
    "LinearSDE",
    "Sensor",
    "aux_rk4",
    "aux_trajectory",
    "sensor_list",
    "van_loan",
]

_DT = torch.float64


class LinearSDE:
    """``dx = A x dt + L dβ`` with ``E[dβ dβᵀ] = Qc dt``; ``A`` ``(n, n)``, ``L`` ``(n, s)``, ``Qc`` ``(s, s)``."""

    def __init__(self, A: ArrayLike, L: ArrayLike | None = None, Qc: ArrayLike | None = None) -> None:
        A_t = real_tensor(A, "A", 2).detach()
        if A_t.shape[0] != A_t.shape[1]:
            raise ValueError(f"A must be square (n, n); got shape {tuple(A_t.shape)}")
        n = A_t.shape[0]
        L_t = torch.eye(n, dtype=_DT) if L is None else real_tensor(L, "L", 2).detach()
        if L_t.shape[0] != n:
            raise ValueError(f"L must have n = {n} rows (shape (n, s)); got shape {tuple(L_t.shape)}")
        s = L_t.shape[1]
        Qc_t = torch.eye(s, dtype=_DT) if Qc is None else real_tensor(Qc, "Qc", (0, 2)).detach()
        if Qc_t.ndim == 0:
            Qc_t = Qc_t.reshape(1, 1)
        if Qc_t.shape != (s, s):
            raise ValueError(f"Qc must have shape (s, s) = ({s}, {s}) to match L; got {tuple(Qc_t.shape)}")
        require_covariance(Qc_t, "Qc", definite=False)
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
        ell = real_scalar(lengthscale, "lengthscale", positive=True)
        sig = real_scalar(sigma, "sigma", positive=True)
        lam = math.sqrt(3.0) / ell
        A = torch.tensor([[0.0, 1.0], [-(lam**2), -2.0 * lam]], dtype=_DT)
        return cls(
            A, torch.tensor([[0.0], [1.0]], dtype=_DT), torch.tensor([[4.0 * lam**3 * sig**2]], dtype=_DT)
        )

    def discretize(self, dt: float | ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact transition ``F = exp(A dt)`` and process covariance ``Qd = ∫_0^dt e^{As} Q e^{Aᵀs} ds``
        by Van Loan's block exponential. ``dt`` a number or a ``(K,)`` array (then ``(K, n, n)`` outputs)."""
        d = real_tensor(dt, "dt", (0, 1))
        if bool((d < 0).any()):
            raise ValueError(f"dt must be >= 0; got min {float(d.min()):.3g}")
        F, Qd = van_loan(self.A, self.Q, d.reshape(-1))
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


def van_loan(A: torch.Tensor, Q: torch.Tensor, dts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
        H_t = real_tensor(H, "H", (1, 2)).detach()
        self.H = H_t[None, :] if H_t.ndim == 1 else H_t
        self.cost = real_scalar(cost, "cost", nonneg=True)
        self.name = name
        m = self.m
        if callable(R) and not isinstance(R, (torch.Tensor, np.ndarray)):
            self._R: torch.Tensor | None = None
            self._R_fn: Callable[[torch.Tensor], torch.Tensor] | None = R
        else:
            R_t = real_tensor(R, "R", (0, 1, 2)).detach()
            R_t = R_t.reshape(1, 1) if R_t.numel() == 1 and m == 1 else R_t
            if R_t.ndim != 2 or R_t.shape != (m, m):
                raise ValueError(
                    f"R must have shape (m, m) = ({m}, {m}) to match H {tuple(self.H.shape)}; got {tuple(R_t.shape)}"
                )
            require_covariance(R_t, "R", definite=True)
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
            require_covariance(R, "R(u)", definite=True)
        return R

    def _noise(self, aux: torch.Tensor | None, check_aux: bool = False) -> torch.Tensor:
        if self._R_fn is None:
            return self._R  # type: ignore[return-value]
        if aux is None:
            raise ValueError("aux must be given: this sensor's R depends on the auxiliary state")
        return self._R_fn(aux).to(_DT)

    def __repr__(self) -> str:
        return f"Sensor(m={self.m}, cost={self.cost:g}{', R(u)' if self.depends_on_aux else ''})"


def sensor_list(sensors: object, n: int) -> list[Sensor]:
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
        self.u0 = real_tensor(self.u0, "u0", (0, 1)).detach().reshape(-1)
        self.w_dim = check_int(self.w_dim, "w_dim", low=1)

    @classmethod
    def integrator(cls, u0: ArrayLike, control_cost: float = 0.1) -> AuxDynamics:
        """``du/dt = w`` (a movable sensor position) with cost ``control_cost · |w|²``."""
        c = real_scalar(control_cost, "control_cost", nonneg=True)
        u = real_tensor(u0, "u0", (0, 1)).detach().reshape(-1)
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
    t = time_grid(t_grid)
    w = real_tensor(controls, "controls", (1, 2))
    w = w[:, None] if w.ndim == 1 else w
    if w.shape != (t.numel() - 1, aux.w_dim):
        raise ValueError(
            f"controls must have shape (M, w_dim) = ({t.numel() - 1}, {aux.w_dim}); got {tuple(w.shape)}"
        )
    return aux_rk4(aux, w, t)


def aux_rk4(aux: AuxDynamics, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
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
