"""Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with Auxiliary Dynamics — ICML 2025, P46: measurement schedules, the CD-KF and the Monte Carlo check.

Ahdab et al., "Optimal Sensor Scheduling and Selection for Continuous-Discrete Kalman Filtering with
Auxiliary Dynamics", ICML 2025 (arXiv 2507.11240; no official code was released). The model and the method
are described in :mod:`icml25.rl.cdkf`.

:func:`deterministic_schedule` (the k-th measurement at the first t with ``Λ_i(t) ≥ k − offset``) and
:func:`poisson_schedule` turn rates into measurement times; :func:`cdkf_filter` is the continuous-discrete
Kalman filter (exact Van Loan prediction between measurements, Kalman updates at them) on irregular
multi-sensor data; :func:`monte_carlo` runs its covariance recursion (and optionally filtering on simulated
data) over many sampled schedules, the check of the bound :func:`~icml25.rl.cdkf.mean_cov_bound`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from icml25.kernels.checks import check_int
from icml25.rl.cdkf_models import AuxPath, LinearSDE, Sensor, sensor_list, van_loan
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

__all__ = [
    "FilterResult",
    "MonteCarloResult",
    "cdkf_filter",
    "deterministic_schedule",
    "monte_carlo",
    "poisson_schedule",
    "rates_on_grid",
]


# ------------------------------------------------------------------------------------------ schedules
def rates_on_grid(rates: ArrayLike, t_grid: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    t = time_grid(t_grid).numpy()
    r = real_tensor(rates, "rates", (1, 2))
    S = 1 if r.ndim == 1 else r.shape[1]
    return rate_matrix(r, t.size - 1, S).detach().numpy(), t


def deterministic_schedule(rates: ArrayLike, t_grid: ArrayLike, offset: float = 0.5) -> list[np.ndarray]:
    """Deterministic measurement times from rates ``(M, S)`` on ``t_grid`` ``(M+1,)``.

    The k-th measurement of sensor i (k = 1, 2, ...) is at the first t with ``Λ_i(t) = ∫_0^t λ_i ≥
    k − offset`` (``offset`` in ``[0, 1)``; 0.5 is the midpoint rule, giving ``round(Λ_i(T))`` measurements).
    Returns S sorted arrays of times.
    """
    r, t = rates_on_grid(rates, t_grid)
    off = real_scalar(offset, "offset", nonneg=True)
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
    r, t = rates_on_grid(rates, t_grid)
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
        a = real_tensor(ti, f"{name}[{i}]", 1, allow_empty=True).numpy()
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
    F, Qd = (a.numpy() for a in van_loan(sde.A, sde.Q, torch.from_numpy(dts)))
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
    sens = sensor_list(sensors, sde.n)
    t0_ = real_scalar(t0, "t0")
    t1 = None if t_end is None else real_scalar(t_end, "t_end")
    if t1 is not None and t1 <= t0_:
        raise ValueError(f"t_end must exceed t0 = {t0_}; got {t1}")
    tl = _check_times(times, len(sens), t0_, t1)
    if not isinstance(ys, (list, tuple)) or len(ys) != len(sens):
        raise ValueError(f"ys must be a list of {len(sens)} arrays (one per sensor); got {type(ys).__name__}")
    yl = []
    for i, (yi, ti) in enumerate(zip(ys, tl, strict=True)):
        a = real_tensor(yi, f"ys[{i}]", (1, 2), allow_empty=True).numpy()
        a = a.reshape(-1, 1) if a.ndim == 1 else a
        if a.shape != (ti.size, sens[i].m):
            raise ValueError(
                f"ys[{i}] must have shape (k_i, m_i) = ({ti.size}, {sens[i].m}) (k_i = len(times[{i}])); got {a.shape}"
            )
        yl.append(a)
    m = real_tensor(m0, "m0", 1).numpy()
    if m.shape != (sde.n,):
        raise ValueError(f"m0 must have shape (n,) = ({sde.n},); got {m.shape}")
    P = initial_covariance(P0, sde.n).detach().numpy()
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
    sens = sensor_list(sensors, sde.n)
    r, t = rates_on_grid(rates, t_grid)
    if r.shape[1] != len(sens):
        raise ValueError(f"rates must have shape (M, S) with S = {len(sens)} sensors; got {r.shape}")
    te = t if t_eval is None else time_grid(t_eval, "t_eval").numpy()
    if te[0] < t[0] or te[-1] > t[-1]:
        raise ValueError(
            f"t_eval must lie within t_grid's range [{t[0]:g}, {t[-1]:g}]; got [{te[0]:g}, {te[-1]:g}]"
        )
    P = initial_covariance(P0, sde.n).detach().numpy()
    runs = check_int(n_runs, "n_runs", low=1)
    if schedule not in ("poisson", "deterministic"):
        raise ValueError(f"schedule must be 'poisson' or 'deterministic'; got {schedule!r}")
    u = aux_on_grid(aux_traj, sens, t.size)
    path = None if u is None else AuxPath(t, u.detach().numpy())
    Wn = weight_matrix(W, sde.n, "W", True).numpy()
    warn_unstable(sde.A, float(t[-1] - t[0]))
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
