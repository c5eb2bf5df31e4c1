"""Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with Auxiliary Dynamics — ICML 2025, P46: input validation shared by the bound, the control, the schedules and the filter.

Ahdab et al., "Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with
Auxiliary Dynamics", ICML 2025 (arXiv 2507.11240; no official code was released). The model and the method
are described in :mod:`icml25.rl.cdkf`.

What :mod:`icml25.kernels.checks` does not cover: float64 tensors that keep autograd with a magnitude cap
(the Riccati products overflow beyond ``MAX_ABS``), covariances (symmetric positive semidefinite), time grids,
rate matrices and auxiliary trajectories checked against the sensors' noise models.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from icml25.kernels.checks import check_array, check_float, check_tensor

if TYPE_CHECKING:
    from icml25.rl.cdkf_models import Sensor

__all__ = [
    "MAX_ABS",
    "ArrayLike",
    "aux_on_grid",
    "initial_covariance",
    "rate_matrix",
    "real_scalar",
    "real_tensor",
    "require_covariance",
    "time_grid",
    "warn_unstable",
    "weight_matrix",
]

MAX_ABS = 1e8
"""Largest accepted magnitude of a model entry, rate or time: beyond it the Riccati products overflow."""
_DT = torch.float64
ArrayLike = torch.Tensor | np.ndarray | Sequence[float] | float


def real_tensor(
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


def real_scalar(x: object, name: str, *, positive: bool = False, nonneg: bool = False) -> float:
    """``x`` (a real number or a one-element real tensor) as a finite float of magnitude at most ``MAX_ABS``
    (``> 0`` if ``positive``, ``>= 0`` if ``nonneg``)."""
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
    low = 0.0 if positive or nonneg else -MAX_ABS
    return check_float(x, name, low=low, high=MAX_ABS, low_open=positive)


def require_covariance(P: torch.Tensor, name: str, *, definite: bool) -> None:
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


def time_grid(t_grid: ArrayLike, name: str = "t_grid") -> torch.Tensor:
    """A strictly increasing float64 grid of at least 2 points (detached)."""
    t = real_tensor(t_grid, name, 1)
    if t.numel() < 2:
        raise ValueError(f"{name} must have at least 2 points; got {t.numel()}")
    if not bool((t[1:] > t[:-1]).all()):
        raise ValueError(
            f"{name} must be strictly increasing; got {t.numel()} points with a non-increasing step"
        )
    return t.detach()


def rate_matrix(rates: ArrayLike, n_steps: int, n_sensors: int, name: str = "rates") -> torch.Tensor:
    """Non-negative rates ``(M, S)`` (one per grid interval and sensor; a 1-D input is one sensor)."""
    r = real_tensor(rates, name, (1, 2))
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


def warn_unstable(A: torch.Tensor, horizon: float) -> None:
    """A ``RuntimeWarning`` when ``A``'s growth over ``horizon`` would make the covariance blow up."""
    growth = float(torch.linalg.eigvals(A.detach()).real.max()) * horizon
    if growth > 5.0:
        warnings.warn(
            f"A is unstable (max Re eig(A) * T = {growth:.3g}): the covariance grows like exp(2 * {growth:.3g}) "
            "over the horizon and may blow up; use a smaller T or a log-Cholesky parameterisation",
            RuntimeWarning,
            stacklevel=3,
        )


def weight_matrix(W: ArrayLike | None, n: int, name: str, default_eye: bool) -> torch.Tensor:
    """A symmetric PSD ``(n, n)`` weight (the identity or zeros when ``W`` is None)."""
    if W is None:
        return torch.eye(n, dtype=_DT) if default_eye else torch.zeros(n, n, dtype=_DT)
    Wt = real_tensor(W, name, 2).detach()
    if Wt.shape != (n, n):
        raise ValueError(f"{name} must have shape (n, n) = ({n}, {n}); got {tuple(Wt.shape)}")
    require_covariance(Wt, name, definite=False)
    return Wt


def initial_covariance(P0: ArrayLike, n: int) -> torch.Tensor:
    """``P0`` as a symmetric PSD ``(n, n)`` float64 tensor (keeps autograd)."""
    P = real_tensor(P0, "P0", 2)
    if P.shape != (n, n):
        raise ValueError(f"P0 must have shape (n, n) = ({n}, {n}); got {tuple(P.shape)}")
    require_covariance(P, "P0", definite=False)
    return P


def aux_on_grid(aux_traj: ArrayLike | None, sensors: list[Sensor], n_points: int) -> torch.Tensor | None:
    """The auxiliary trajectory ``(M+1, k)`` on the grid (``None`` when no sensor's R depends on it), with
    every sensor's ``R(u)`` checked at every grid point."""
    if aux_traj is None:
        if any(s.depends_on_aux for s in sensors):
            raise ValueError("aux_traj must be given: a sensor's R depends on the auxiliary state")
        return None
    u = real_tensor(aux_traj, "aux_traj", (1, 2))
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
