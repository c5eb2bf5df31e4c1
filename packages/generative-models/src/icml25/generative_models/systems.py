"""Thermalizer: Stable autoregressive neural emulation of spatiotemporal chaos — ICML 2025, P02: KS and Lorenz-96 solvers.

Reference chaotic systems used to train and test emulators and thermalizers (Pedersen, Zanna & Bruna,
arXiv 2503.18731): the 1D Kuramoto–Sivashinsky equation on a periodic domain, solved with the ETDRK4
scheme of Kassam & Trefethen (2005), and the Lorenz-96 model integrated with classical RK4. Both solvers
are vectorised over a batch of trajectories (numpy, float64), and both data generators return float32
arrays of shape ``(n_traj, n_steps, n_points)`` sampled every emulator step ``Δt = dt · substeps``.

Also here: :func:`energy_spectrum`, the time-averaged power spectrum of a periodic 1D field, used by the
P02 reproduction to compare rollouts with the invariant measure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icml25.kernels.checks import check_float, check_int

__all__ = [
    "KSETDRK4",
    "energy_spectrum",
    "ks_simulate",
    "lorenz96_simulate",
    "lorenz96_tendency",
]


def _check_initial(name: str, value: object, n: int, label: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a real numeric array (n_traj, {label}={n}), got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] != n:
        raise ValueError(f"{name} must have shape (n_traj >= 1, {label}={n}), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite, got {int((~np.isfinite(arr)).sum())} NaN/Inf values")
    return arr


def _check_trajectory(out: np.ndarray, start: str) -> np.ndarray:
    if not np.isfinite(out).all():
        raise ValueError(
            f"the simulation diverged to non-finite states (from {start}); reduce dt or the magnitude of {start}"
        )
    return out


# ----------------------------------------------------------------------------------------------------------
# Kuramoto–Sivashinsky: u_t = -u u_x - u_xx - u_xxxx on [0, L), periodic.
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KSETDRK4:
    """ETDRK4 integrator for 1D Kuramoto–Sivashinsky, batched over trajectories.

    The stiff linear part ``L = q² - q⁴`` (q = 2πk/L) is integrated exactly; the nonlinear term
    ``-½ ∂_x(u²)`` with the fourth-order exponential Runge–Kutta scheme. The φ-function coefficients are
    evaluated by the contour-integral mean of Kassam & Trefethen (2005) to avoid cancellation at small
    ``|L·dt|``. Fields live in real-FFT space (``N // 2 + 1`` complex modes).

    The k = 0 mode has ``L = 0`` and zero nonlinear forcing (the nonlinearity is a derivative), so the
    spatial mean is conserved exactly up to rounding.

    Attributes:
        L: domain length.
        N: number of grid points (even).
        dt: internal time step.
    """

    L: float = 22.0
    N: int = 64
    dt: float = 0.05

    def __post_init__(self) -> None:
        check_float(self.L, "L", low=0.0, low_open=True)
        check_int(self.N, "N", low=1)
        check_float(self.dt, "dt", low=0.0, low_open=True)
        if self.N % 2 or self.N < 4:
            raise ValueError(f"N must be an even int >= 4, got {self.N!r}")
        q = 2.0 * np.pi / self.L * np.arange(self.N // 2 + 1)
        lin = q**2 - q**4
        # 1j*q*(-1/2): the derivative of u² with the Nyquist mode zeroed (its odd derivative is not real).
        g = -0.5j * q
        g[-1] = 0.0
        h = self.dt
        e = np.exp(h * lin)
        e2 = np.exp(h * lin / 2.0)
        m = 32  # contour points
        r = np.exp(1j * np.pi * (np.arange(1, m + 1) - 0.5) / m)
        lr = h * lin[:, None] + r[None, :]
        q_c = h * np.real(np.mean((np.exp(lr / 2.0) - 1.0) / lr, axis=1))
        f1 = h * np.real(np.mean((-4.0 - lr + np.exp(lr) * (4.0 - 3.0 * lr + lr**2)) / lr**3, axis=1))
        f2 = h * np.real(np.mean((2.0 + lr + np.exp(lr) * (-2.0 + lr)) / lr**3, axis=1))
        f3 = h * np.real(np.mean((-4.0 - 3.0 * lr - lr**2 + np.exp(lr) * (4.0 - lr)) / lr**3, axis=1))
        # frozen dataclass: store the coefficient arrays through object.__setattr__
        for name, val in {"_g": g, "_e": e, "_e2": e2, "_q": q_c, "_f1": f1, "_f2": f2, "_f3": f3}.items():
            object.__setattr__(self, name, val)

    def _nonlinear(self, v: np.ndarray) -> np.ndarray:
        u = np.fft.irfft(v, n=self.N, axis=-1)
        return self._g * np.fft.rfft(u * u, axis=-1)

    def step_spectral(self, v: np.ndarray, n: int = 1) -> np.ndarray:
        """Advance Fourier coefficients ``v`` (shape ``(..., N//2+1)``, complex) by ``n`` steps of ``dt``."""
        e, e2, q, f1, f2, f3 = self._e, self._e2, self._q, self._f1, self._f2, self._f3
        for _ in range(n):
            nv = self._nonlinear(v)
            a = e2 * v + q * nv
            na = self._nonlinear(a)
            b = e2 * v + q * na
            nb = self._nonlinear(b)
            c = e2 * a + q * (2.0 * nb - nv)
            nc = self._nonlinear(c)
            v = e * v + nv * f1 + 2.0 * (na + nb) * f2 + nc * f3
        return v

    def step(self, u: np.ndarray, n: int = 1) -> np.ndarray:
        """Advance real fields ``u`` of shape ``(..., N)`` by ``n`` steps of ``dt``; returns the same shape."""
        u = np.asarray(u, dtype=np.float64)
        if u.shape[-1] != self.N:
            raise ValueError(f"u must have last dimension N={self.N}, got shape {u.shape}")
        return np.fft.irfft(self.step_spectral(np.fft.rfft(u, axis=-1), n), n=self.N, axis=-1)


def ks_simulate(
    n_traj: int,
    n_steps: int,
    L: float = 22.0,
    N: int = 64,
    dt: float = 0.05,
    substeps: int = 20,
    spinup: int = 200,
    seed: int = 0,
    u0: np.ndarray | None = None,
) -> np.ndarray:
    """Simulate a batch of KS trajectories and sample them every emulator step ``Δt = dt·substeps``.

    Args:
        n_traj: number of independent trajectories (ignored when ``u0`` is given).
        n_steps: number of saved emulator steps per trajectory (after spin-up).
        L, N, dt: domain length, grid size, ETDRK4 step.
        substeps: solver steps per saved step.
        spinup: saved-step units discarded first, so the trajectories start on the attractor.
        seed: seed of the random initial conditions.
        u0: optional initial fields, shape ``(n_traj, N)``; if given they are the first saved state
            after ``spinup`` further steps (use ``spinup=0`` to start exactly at ``u0``).

    Returns:
        float32 array of shape ``(n_traj, n_steps, N)``; entry ``[:, 0]`` is the state after spin-up.
    """
    n_steps = check_int(n_steps, "n_steps", low=1)
    substeps = check_int(substeps, "substeps", low=1)
    spinup = check_int(spinup, "spinup", low=0)
    solver = KSETDRK4(L=L, N=N, dt=dt)
    if u0 is None:
        n_traj = check_int(n_traj, "n_traj", low=1)
        rng = np.random.default_rng(seed)
        # Smooth random start: a few low modes with random phases, zero mean.
        x = np.arange(N) * L / N
        u = np.zeros((n_traj, N))
        for k in range(1, 5):
            amp = rng.normal(size=(n_traj, 1))
            phase = rng.uniform(0, 2 * np.pi, size=(n_traj, 1))
            u += 0.5 * amp * np.cos(2 * np.pi * k * x[None, :] / L + phase)
    else:
        u = _check_initial("u0", u0, N, "N")
    v = np.fft.rfft(u, axis=-1)
    v = solver.step_spectral(v, spinup * substeps)
    out = np.empty((v.shape[0], n_steps, N), dtype=np.float32)
    for i in range(n_steps):
        if i:
            v = solver.step_spectral(v, substeps)
        out[:, i] = np.fft.irfft(v, n=N, axis=-1)
    return _check_trajectory(out, "u0" if u0 is not None else "the random initial state")


# ----------------------------------------------------------------------------------------------------------
# Lorenz-96: dx_k/dt = (x_{k+1} - x_{k-2}) x_{k-1} - x_k + F, periodic in k.
# ----------------------------------------------------------------------------------------------------------


def lorenz96_tendency(x: np.ndarray, forcing: float = 8.0) -> np.ndarray:
    """Right-hand side of Lorenz-96 for states ``x`` of shape ``(..., K)``."""
    k = np.arange(x.shape[-1])
    # Fancy indexing with precomputed neighbours is ~2x faster than np.roll on small arrays.
    xp1, xm1, xm2 = x[..., (k + 1) % k.size], x[..., k - 1], x[..., k - 2]
    return (xp1 - xm2) * xm1 - x + forcing


def lorenz96_simulate(
    n_traj: int,
    n_steps: int,
    K: int = 20,
    forcing: float = 8.0,
    dt: float = 0.01,
    substeps: int = 5,
    spinup: int = 200,
    seed: int = 0,
    x0: np.ndarray | None = None,
) -> np.ndarray:
    """Simulate a batch of Lorenz-96 trajectories with RK4 and sample every ``Δt = dt·substeps``.

    Args:
        n_traj: number of trajectories (ignored when ``x0`` is given).
        n_steps: saved steps per trajectory (after spin-up).
        K: number of sites; forcing: the constant F (chaotic for F = 8).
        dt: RK4 step; substeps: RK4 steps per saved step.
        spinup: saved-step units discarded first.
        seed: seed of the random initial perturbation around the fixed point ``x = F``.
        x0: optional initial states, shape ``(n_traj, K)``.

    Returns:
        float32 array of shape ``(n_traj, n_steps, K)``.
    """
    n_steps = check_int(n_steps, "n_steps", low=1)
    K = check_int(K, "K", low=1)
    substeps = check_int(substeps, "substeps", low=1)
    spinup = check_int(spinup, "spinup", low=0)
    dt = check_float(dt, "dt", low=0.0, low_open=True)
    forcing = check_float(forcing, "forcing")
    if K < 4:
        raise ValueError(f"K must be >= 4 for Lorenz-96, got {K}")
    if x0 is None:
        n_traj = check_int(n_traj, "n_traj", low=1)
        rng = np.random.default_rng(seed)
        x = forcing + rng.normal(scale=1.0, size=(n_traj, K))
    else:
        x = _check_initial("x0", x0, K, "K")

    def rk4(x: np.ndarray) -> np.ndarray:
        k1 = lorenz96_tendency(x, forcing)
        k2 = lorenz96_tendency(x + 0.5 * dt * k1, forcing)
        k3 = lorenz96_tendency(x + 0.5 * dt * k2, forcing)
        k4 = lorenz96_tendency(x + dt * k3, forcing)
        return x + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)

    for _ in range(spinup * substeps):
        x = rk4(x)
    out = np.empty((x.shape[0], n_steps, K), dtype=np.float32)
    for i in range(n_steps):
        if i:
            for _ in range(substeps):
                x = rk4(x)
        out[:, i] = x
    return _check_trajectory(out, "x0" if x0 is not None else "the random initial state")


def energy_spectrum(x: np.ndarray, axis_time: int | None = -2) -> np.ndarray:
    """Power spectrum ``|rfft(x)|² / n`` of periodic 1D fields, averaged over the time axis.

    Args:
        x: fields of shape ``(..., T, n)`` (``axis_time`` = -2) or ``(..., n)`` (``axis_time=None``).
        axis_time: the axis averaged over, or None to keep every snapshot.

    Returns:
        array of shape ``(..., n // 2 + 1)`` (time averaged) or ``(..., T, n // 2 + 1)``.
    """
    arr = np.asarray(x)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"x must be a real numeric array (..., n), got dtype {arr.dtype}")
    x = arr.astype(np.float64)
    need = 1 if axis_time is None else 2
    if x.ndim < need or x.size == 0:
        raise ValueError(f"x must be a non-empty array with at least {need} dims, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(
            f"x must be finite, got {int((~np.isfinite(x)).sum())} NaN/Inf values in shape {x.shape}"
        )
    with np.errstate(over="ignore"):
        power = np.abs(np.fft.rfft(x, axis=-1)) ** 2 / x.shape[-1]
    if not np.isfinite(power).all():
        raise ValueError(
            f"x is too large: its power spectrum overflows float64 (max |x| = {np.abs(x).max():.3g})"
        )
    return power if axis_time is None else power.mean(axis=axis_time)
