"""Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with Auxiliary Dynamics — ICML 2025, P46: optimal control of the measurement rates.

Ahdab et al., "Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with
Auxiliary Dynamics", ICML 2025 (arXiv 2507.11240; no official code was released). The model and the method
are described in :mod:`icml25.rl.cdkf`.

:func:`control_objective` / :func:`optimize_rates`: finite-horizon optimal control of the rates
``λ = λ_max · sigmoid(θ)`` (and the auxiliary controls ``w``) by direct transcription, on the bound
:func:`~icml25.rl.cdkf.mean_cov_bound`:
``J = ∫ ω(t) tr(W P̄) dt + tr(W_T P̄(T)) + Σ_i c_i ∫ λ_i dt + ∫ ℓ(ū, w) dt``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from icml25.kernels.checks import check_int
from icml25.kernels.optim import Adam
from icml25.rl.cdkf import integrate_bound
from icml25.rl.cdkf_models import AuxDynamics, AuxPath, LinearSDE, Sensor, aux_rk4, sensor_list
from icml25.rl.cdkf_validation import (
    ArrayLike,
    aux_on_grid,
    initial_covariance,
    rate_matrix,
    real_scalar,
    real_tensor,
    time_grid,
    warn_unstable,
    weight_matrix,
)

__all__ = ["ObjectiveTerms", "RateSchedule", "control_objective", "optimize_rates"]

_DT = torch.float64


class ObjectiveTerms(NamedTuple):
    """The terms of ``J`` (scalar tensors), the bound ``(M+1, n, n)`` and the auxiliary path ``(M+1, k)``."""

    total: torch.Tensor
    estimation: torch.Tensor
    terminal: torch.Tensor
    rate: torch.Tensor
    aux: torch.Tensor
    bound: torch.Tensor
    aux_traj: torch.Tensor | None


def _time_weight(time_weight: ArrayLike | Callable | None, t: torch.Tensor) -> torch.Tensor:
    if time_weight is None:
        return torch.ones_like(t)
    tw = time_weight(t) if callable(time_weight) else time_weight
    w = real_tensor(tw, "time_weight", 1).detach()
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
    u = aux_rk4(aux, w, t) if aux is not None and w is not None else None
    if u is None and any(s.depends_on_aux for s in sens):
        raise ValueError("aux must be given: a sensor's R depends on the auxiliary state")
    P = integrate_bound(sde, sens, lam, t, P0, u, substeps)
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
    sens = sensor_list(sensors, sde.n)
    t = time_grid(t_grid)
    M = t.numel() - 1
    lam = rate_matrix(rates, M, len(sens))
    P = initial_covariance(P0, sde.n)
    w = None
    if aux is not None:
        if not isinstance(aux, AuxDynamics):
            raise TypeError(f"aux must be an AuxDynamics; got {type(aux).__name__}")
        w = (
            torch.zeros(M, aux.w_dim, dtype=_DT)
            if aux_controls is None
            else real_tensor(aux_controls, "aux_controls", (1, 2))
        )
        w = w[:, None] if w.ndim == 1 else w
        if w.shape != (M, aux.w_dim):
            raise ValueError(
                f"aux_controls must have shape (M, w_dim) = ({M}, {aux.w_dim}); got {tuple(w.shape)}"
            )
        aux_on_grid(aux_rk4(aux, w.detach(), t), sens, M + 1)
    warn_unstable(sde.A, float(t[-1] - t[0]))
    return _objective(
        sde, sens, lam, t, P, weight_matrix(W, sde.n, "W", True), weight_matrix(W_T, sde.n, "W_T", False),
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
    sens = sensor_list(sensors, sde.n)
    S = len(sens)
    T_ = real_scalar(T, "T", positive=True)
    lm = real_tensor(lam_max, "lam_max", (0, 1)).detach().reshape(-1)
    if lm.numel() == 1:
        lm = lm.expand(S).clone()
    if lm.numel() != S:
        raise ValueError(f"lam_max must be a number or one value per sensor ({S}); got {lm.numel()} values")
    if bool((lm <= 0).any()):
        raise ValueError(f"lam_max must be > 0; got {lm.tolist()}")
    M_ = check_int(M, "M", low=1)
    steps_ = check_int(steps, "steps", low=0)
    lr_ = real_scalar(lr, "lr", positive=True)
    l2_ = real_scalar(l2, "l2", nonneg=True)
    r0 = real_scalar(init_rate, "init_rate", positive=True)
    if bool((lm <= r0).any()):
        raise ValueError(f"init_rate must be below lam_max ({lm.min().item():g}); got {r0}")
    pieces = M_ if n_pieces is None else check_int(n_pieces, "n_pieces", low=1)
    if M_ % pieces:
        raise ValueError(f"n_pieces must divide M = {M_}; got {pieces}")
    sub = check_int(substeps, "substeps", low=1)
    prune_ = real_scalar(prune, "prune", nonneg=True)
    if P0 is None:
        try:
            P_init = sde.lyapunov_steady_state()
        except ValueError:
            P_init = torch.eye(sde.n, dtype=_DT)
    else:
        P_init = initial_covariance(P0, sde.n).detach()
    if aux is not None and not isinstance(aux, AuxDynamics):
        raise TypeError(f"aux must be an AuxDynamics; got {type(aux).__name__}")
    if aux is None and any(s.depends_on_aux for s in sens):
        raise ValueError("aux must be given: a sensor's R depends on the auxiliary state")
    t = torch.linspace(0.0, T_, M_ + 1, dtype=_DT)
    Wt, WTt, omega = (
        weight_matrix(W, sde.n, "W", True),
        weight_matrix(W_T, sde.n, "W_T", False),
        _time_weight(time_weight, t),
    )
    warn_unstable(sde.A, T_)

    theta = torch.full((pieces, S), math.log(r0 / (lm.min().item() - r0)), dtype=_DT, requires_grad=True)
    params = [theta]
    w = None
    if aux is not None:
        w = torch.zeros(M_, aux.w_dim, dtype=_DT, requires_grad=True)
        params.append(w)
        aux_on_grid(aux_rk4(aux, w.detach(), t), sens, M_ + 1)
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
