"""Thermalizer: Stable autoregressive neural emulation of spatiotemporal chaos — ICML 2025, P02: rollout diagnostics.

The stability criterion (:func:`stability_band`, :func:`stable_mask`) and the spectral comparison
(:func:`spectral_reference`, :func:`spectrum_rmse`) that score rollouts of
:func:`icml25.generative_models.thermalizer.thermalized_rollout` against the true system.
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from icml25.generative_models.systems import energy_spectrum
from icml25.kernels.checks import check_array, check_float

__all__ = ["spectral_reference", "spectrum_rmse", "stability_band", "stable_mask"]


# ----------------------------------------------------------------------------------------------------------
# Rollout diagnostics and the choice of (s_init, s_stop)
# ----------------------------------------------------------------------------------------------------------


def _numpy(x: object) -> object:
    """A tensor as a numpy array (for :func:`icml25.kernels.checks.check_array`); anything else unchanged."""
    return x.detach().cpu().numpy() if isinstance(x, Tensor) else x


def _check_band(band: object) -> tuple[float, float]:
    """``band`` as ``(low, high)``: finite floats with ``0 <= low < high``."""
    ok = isinstance(band, (tuple, list)) and len(band) == 2
    lo, hi = (float(band[0]), float(band[1])) if ok else (math.nan, math.nan)
    if not (ok and math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise ValueError(
            f"band must be a pair (low, high) of finite energies with 0 <= low < high, got {band!r}"
        )
    return lo, hi


def stability_band(trajectories: np.ndarray | Tensor, q: float = 0.001) -> tuple[float, float]:
    """Energy band ``[0.5·quantile_q, 1.5·quantile_{1−q}]`` of true energies (the stability criterion).

    A rollout is *stable* while it is finite and its energy ``mean(x²)`` over the event dimensions stays in
    this band of the true system's energies (:func:`stable_mask`).

    Args:
        trajectories: true states ``(n_traj, n_steps, *event)``, finite, not all zero.
        q: lower quantile (``0 < q < 0.5``; default 0.1%, so the band spans 0.5·q_0.1% to 1.5·q_99.9%).

    Returns:
        ``(low, high)`` energies.
    """
    x = check_array(_numpy(trajectories), "trajectories", non_empty=True).astype(np.float64)
    if x.ndim < 3:
        raise ValueError(f"trajectories must have shape (n_traj, n_steps, *event), got {x.shape}")
    q = check_float(q, "q", low=0.0, high=0.5, low_open=True, high_open=True)
    with np.errstate(over="ignore"):
        energy = (x**2).reshape(x.shape[0], x.shape[1], -1).mean(-1)
    if not np.isfinite(energy).all():
        raise ValueError(
            f"trajectories are too large: their energy mean(x²) overflows (max |x| = {np.abs(x).max():.3g})"
        )
    lo, hi = 0.5 * float(np.quantile(energy, q)), 1.5 * float(np.quantile(energy, 1.0 - q))
    if not hi > 0:
        raise ValueError("trajectories must not be all zero (their energy band would be empty)")
    return lo, hi


def stable_mask(energy: np.ndarray | Tensor, band: tuple[float, float]) -> np.ndarray:
    """Per-rollout stability: energy finite and inside ``band`` at every step.

    Args:
        energy: ``(B, n_steps)`` energies of B rollouts (e.g. ``RolloutResult.energy[:, 1:]``); NaN/Inf
            entries (a blown-up or aborted rollout) count as unstable.
        band: ``(low, high)`` from :func:`stability_band`.

    Returns:
        bool array ``(B,)``.
    """
    e = check_array(_numpy(energy), "energy", finite=False, non_empty=True).astype(np.float64)
    if e.ndim != 2:
        raise ValueError(f"energy must have shape (B, n_steps), got {e.shape}")
    lo, hi = _check_band(band)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(e) & (e >= lo) & (e <= hi)
    return ok.all(axis=1)


def spectral_reference(
    trajectories: np.ndarray | Tensor, rel_floor: float = 1e-3
) -> tuple[np.ndarray, np.ndarray]:
    """Climatological log energy spectrum of periodic 1D fields and its energetic modes.

    Args:
        trajectories: true states ``(n_traj, n_steps, N)``, finite.
        rel_floor: a mode is *energetic* when its mean power is at least ``rel_floor`` × the peak
            (``0 < rel_floor < 1``); below that the spectrum of a thermalized rollout is dominated by the
            ``s_stop``-level noise the algorithm leaves by construction.

    Returns:
        ``log_ref`` ``(N // 2 + 1,)`` (log of the time- and trajectory-averaged power; modes with zero
        power get ``-inf``) and ``modes``, the int64 indices of the energetic modes.
    """
    x = check_array(_numpy(trajectories), "trajectories", non_empty=True).astype(np.float64)
    if x.ndim != 3:
        raise ValueError(f"trajectories must have shape (n_traj, n_steps, N), got {x.shape}")
    rel_floor = check_float(rel_floor, "rel_floor", low=0.0, high=1.0, low_open=True, high_open=True)
    if not np.ptp(x, axis=-1).max() > 0:
        raise ValueError("trajectories must not be constant in space (no power on any non-zero mode)")
    try:
        clim = energy_spectrum(x).mean(0)
    except ValueError as exc:  # overflow of a huge field: name the argument
        raise ValueError(f"trajectories: {exc}") from None
    with np.errstate(divide="ignore"):
        log_ref = np.log(clim)
    return log_ref, np.nonzero(clim >= rel_floor * clim.max())[0]


def spectrum_rmse(segments: np.ndarray | Tensor, log_ref: np.ndarray, modes: np.ndarray) -> np.ndarray:
    """Per-segment RMSE of the log energy spectrum against a reference, over the chosen modes.

    Args:
        segments: ``(B, W, N)`` windows of B rollouts (or true trajectories); the spectrum of each is
            averaged over its W steps. A segment with a non-finite or huge (``|x| >= 1e6``) entry, i.e. a
            blown-up rollout, gets ``inf``; so does one with zero power on a compared mode (a collapsed,
            e.g. constant, state: log 0).
        log_ref: ``(N // 2 + 1,)`` reference log spectrum (:func:`spectral_reference`), finite on ``modes``.
        modes: int indices of the compared modes (non-empty, in ``[0, N // 2]``).

    Returns:
        float64 ``(B,)``; ``inf`` marks blown-up segments (documented, not an error).
    """
    seg = check_array(_numpy(segments), "segments", finite=False, non_empty=True).astype(np.float64)
    if seg.ndim != 3:
        raise ValueError(f"segments must have shape (B, W, N), got {seg.shape}")
    ref = np.asarray(log_ref)
    m = np.asarray(modes)
    n_modes = seg.shape[-1] // 2 + 1
    if ref.dtype.kind != "f" or ref.shape != (n_modes,):
        raise ValueError(f"log_ref must be a float array of shape ({n_modes},), got {ref.dtype} {ref.shape}")
    if m.dtype.kind not in "iu" or m.ndim != 1 or m.size == 0 or m.min() < 0 or m.max() >= n_modes:
        raise ValueError(f"modes must be a non-empty 1D int array in [0, {n_modes}), got {modes!r}")
    if not (np.abs(ref[m]) < 1e4).all():  # log powers: |log p| < 1e4 covers every float64 power
        raise ValueError(
            f"log_ref must hold finite log powers (|value| < 1e4) on modes, got {ref[m].tolist()}"
        )
    out = np.full(seg.shape[0], np.inf)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(seg).all(axis=(1, 2)) & (np.abs(seg) < 1e6).all(axis=(1, 2))
    if ok.any():
        spec = energy_spectrum(seg[ok])[:, m]
        with np.errstate(divide="ignore"):
            out[ok] = np.sqrt(((np.log(spec) - ref[m]) ** 2).mean(-1))
    return out
