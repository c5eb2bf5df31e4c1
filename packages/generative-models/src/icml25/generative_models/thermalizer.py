"""Thermalizer: Stable autoregressive neural emulation of spatiotemporal chaos — ICML 2025, P02: the thermalized rollout.

Pedersen, Zanna & Bruna (arXiv 2503.18731; code ``Chris-Pedersen/thermalizer``). An autoregressive
emulator ``x_{n+1} = x_n + f_θ(x_n)`` of a chaotic system drifts off the invariant measure μ as small
errors compound, and eventually blows up. A *thermalizer* — a DDPM trained on clean snapshots of μ, whose
network also classifies the noise level of its input — is run alongside the emulator: after every step
the classifier estimates how far the state is from μ, expressed as a diffusion level k̂; when k̂ exceeds
``s_init`` the state is forward-diffused to level k̂ and pulled back to level ``s_stop`` by k̂ − s_stop
ancestral reverse steps. The two models are trained independently; the thermalizer is used only at
inference, so any ``nn.Module`` emulator can be wrapped.

Conventions (shared with the reference code): levels are ``k = 0..T-1``; with the cosine schedule
``f(t) = cos²(((t/T + s)/(1 + s))·π/2)``, ``β_k = min(1 − f(k+1)/f(k), 0.999)`` and
``ᾱ_k = Π_{j≤k}(1 − β_j)``, so level 0 already carries a little noise. A reverse step *at level i* maps
``x_i → x_{i−1}`` with the posterior ``q(x_{i−1} | x_i, x̂_0(ε̂))``; the step at i = 0 returns the
clean estimate (no noise).

Shapes: states are ``(B, *event)`` (e.g. ``(B, K)`` for Lorenz-96, ``(B, N)`` for 1D KS); levels are
``(B,)`` int64. Both models take states in physical units and normalise internally by the training data's
``field_mean`` / ``field_std`` (stored as buffers by ``fit``).

This module holds the thermalized rollout (Algorithm 1, :func:`thermalized_rollout`) and the choice of
``(s_init, s_stop)`` (:func:`select_levels`). The model is in :mod:`icml25.generative_models.thermalizer_model`,
the small networks and the emulator in :mod:`icml25.generative_models.thermalizer_nets`, the rollout
diagnostics in :mod:`icml25.generative_models.thermalizer_metrics`; their public names are re-exported here.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

# The split modules' public names, re-exported (``X as X``) so that the imports from this module that predate
# the split (issue 82) keep working; each is documented in its own module.
from icml25.generative_models.thermalizer_metrics import spectral_reference as spectral_reference
from icml25.generative_models.thermalizer_metrics import spectrum_rmse as spectrum_rmse
from icml25.generative_models.thermalizer_metrics import stability_band as stability_band
from icml25.generative_models.thermalizer_metrics import stable_mask as stable_mask
from icml25.generative_models.thermalizer_model import Thermalizer as Thermalizer
from icml25.generative_models.thermalizer_model import cosine_beta_schedule as cosine_beta_schedule
from icml25.generative_models.thermalizer_nets import MLP as MLP
from icml25.generative_models.thermalizer_nets import ConvLevelHead1d as ConvLevelHead1d
from icml25.generative_models.thermalizer_nets import LevelMLP as LevelMLP
from icml25.generative_models.thermalizer_nets import PeriodicConvNet1d as PeriodicConvNet1d
from icml25.generative_models.thermalizer_nets import ResidualEmulator as ResidualEmulator
from icml25.generative_models.thermalizer_nets import SpectralLevelHead1d as SpectralLevelHead1d
from icml25.generative_models.thermalizer_nets import periodic_symmetry_augment as periodic_symmetry_augment
from icml25.kernels.checks import check_int, check_tensor
from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.rng import make_generator

__all__ = ["RolloutResult", "choose_levels", "select_levels", "thermalized_rollout"]


# ----------------------------------------------------------------------------------------------------------
# Thermalized rollout (Algorithm 1)
# ----------------------------------------------------------------------------------------------------------


@dataclass
class RolloutResult:
    """Outcome of :func:`thermalized_rollout` for B initial conditions over ``n_steps`` steps.

    Attributes:
        states: ``(B, n_steps + 1, *event)``; ``states[:, 0]`` is ``x0``. After an abort the offending
            state is kept at the abort step and later steps are NaN.
        levels: int64 ``(B, n_steps + 1)``: the classifier's k̂ after each emulator step (before
            thermalization); −1 where not classified (step 0, no thermalizer, aborted, non-finite).
        n_denoise_steps: int64 ``(B, n_steps + 1)``: reverse diffusion steps taken at each step.
        aborted_at: int64 ``(B,)``: first step at which the element was aborted (non-finite state, or
            ``k̂ > noise_limit``), −1 if never.
    """

    states: Tensor
    levels: Tensor
    n_denoise_steps: Tensor
    aborted_at: Tensor

    @property
    def energy(self) -> Tensor:
        """``mean(x²)`` over the event dimensions, ``(B, n_steps + 1)`` (NaN after an abort)."""
        return self.states.pow(2).flatten(2).mean(-1)

    @property
    def fired(self) -> Tensor:
        """Bool ``(B, n_steps + 1)``: whether thermalization ran at each step."""
        return self.n_denoise_steps > 0


@torch.no_grad()
def thermalized_rollout(
    emulator: nn.Module | Callable[[Tensor], Tensor],
    thermalizer: Thermalizer | None,
    x0: Tensor,
    n_steps: int,
    s_init: int = 10,
    s_stop: int = 4,
    forward_diffuse: bool = True,
    noise_limit: int | None = 100,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> RolloutResult:
    """Autoregressive rollout of ``emulator`` with on-the-fly thermalization (paper's Algorithm 1).

    Per step n: ``x = emulator(x)``; elements whose state is non-finite are aborted (never shown to the
    classifier); ``k̂ = thermalizer.noise_level(x)``; elements with ``k̂ > noise_limit`` are aborted; the
    elements with ``k̂ > s_init`` are denoised from k̂ to ``s_stop`` (:meth:`Thermalizer.denoise`).
    Aborted elements are frozen; the others continue (the reference stops the whole batch instead).

    Args:
        emulator: any module/callable mapping states ``(B, *event) -> (B, *event)`` (the next state, not
            the increment; wrap increment nets in :class:`ResidualEmulator`). Its train/eval mode is
            left as given.
        thermalizer: a trained :class:`Thermalizer`, or None for the plain emulator (the baseline).
        x0: initial states ``(B, *event)``, physical units, finite.
        n_steps: number of emulator steps.
        s_init: thermalize when ``k̂ > s_init``; ``0 ≤ s_stop < s_init < T``.
        s_stop: level at which denoising stops.
        forward_diffuse: forward-diffuse to k̂ before the reverse chain (paper default True).
        noise_limit: abort an element when ``k̂ > noise_limit`` (None: never); must exceed ``s_init``.
        generator: RNG for the thermalizer's noise, and for the step noise of a stochastic
            :class:`ResidualEmulator` (other emulators draw their own noise).
        progress: show a tqdm bar.

    Returns:
        :class:`RolloutResult`.
    """
    if not callable(emulator):
        raise TypeError(f"emulator must be an nn.Module or callable, got {type(emulator).__name__}")
    if thermalizer is not None and not isinstance(thermalizer, Thermalizer):
        raise TypeError(f"thermalizer must be a Thermalizer or None, got {type(thermalizer).__name__}")
    check_tensor(x0, "x0", non_empty=True)
    if x0.dim() < 2:
        raise ValueError(f"x0 must have shape (B, *event), got {tuple(x0.shape)}")
    if thermalizer is not None:
        thermalizer._check_event("x0", x0)
    n_steps = check_int(n_steps, "n_steps", low=1)
    if thermalizer is not None:
        s_init = check_int(s_init, "s_init", low=0, high=thermalizer.T - 1)
        s_stop = check_int(s_stop, "s_stop", low=0, high=thermalizer.T - 1)
        if s_stop >= s_init:
            raise ValueError(f"s_stop must be < s_init, got s_stop={s_stop}, s_init={s_init}")
        if noise_limit is not None:
            noise_limit = check_int(noise_limit, "noise_limit", low=s_init + 1)
        ratio = float(x0.std()) / float(thermalizer.field_std)
        if not 1 / 3 <= ratio <= 3:
            warnings.warn(
                f"x0 std {float(x0.std()):.3g} differs by more than 3x from the thermalizer's training "
                f"field_std {float(thermalizer.field_std):.3g}; are the states in the same units?",
                stacklevel=3,  # past the no_grad decorator, at the caller
            )

    B = x0.shape[0]
    states = torch.full((B, n_steps + 1, *x0.shape[1:]), float("nan"), dtype=x0.dtype, device=x0.device)
    states[:, 0] = x0
    levels = torch.full((B, n_steps + 1), -1, dtype=torch.long, device=x0.device)
    n_den = torch.zeros((B, n_steps + 1), dtype=torch.long, device=x0.device)
    aborted_at = torch.full((B,), -1, dtype=torch.long, device=x0.device)
    active = torch.arange(B, device=x0.device)  # indices of elements still being rolled out
    x = x0.clone()
    for n in progress_bar(range(1, n_steps + 1), desc="rollout") if progress else range(1, n_steps + 1):
        if active.numel() == 0:
            break
        y = emulator(x, generator=generator) if isinstance(emulator, ResidualEmulator) else emulator(x)
        if not isinstance(y, Tensor) or y.shape != x.shape:
            got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
            raise ValueError(f"emulator output shape {got} must equal its input shape {tuple(x.shape)}")
        keep = torch.isfinite(y).flatten(1).all(1)
        if thermalizer is not None and bool(keep.any()):
            kept = keep.nonzero().squeeze(1)
            k_hat = thermalizer.noise_level(y[kept])
            levels[active[kept], n] = k_hat
            if noise_limit is not None:
                over = k_hat > noise_limit
                keep[kept[over]] = False
            fire = (k_hat > s_init) & keep[kept]
            if bool(fire.any()):
                fi = kept[fire]
                y[fi], steps = thermalizer.denoise(y[fi], k_hat[fire], s_stop, forward_diffuse, generator)
                n_den[active[fi], n] = steps
        states[active, n] = y  # aborted elements keep their offending state at the abort step
        aborted_at[active[~keep]] = n
        active, x = active[keep], y[keep]
    return RolloutResult(states=states, levels=levels, n_denoise_steps=n_den, aborted_at=aborted_at)


def choose_levels(scores: dict[tuple[int, int], tuple[float, float, float]]) -> tuple[int, int]:
    """The selection rule of :func:`select_levels` on ``{(s_init, s_stop): (stable, firing, spectrum RMSE)}``.

    Admissible pairs fire on 0.1%–50% of steps (the algorithm's intended regime: it corrects rarely, but
    does act); all pairs compete if none is. Among them the highest stable fraction wins, then the lowest
    spectrum RMSE; a remaining tie goes to the earlier pair in ``scores``.
    """
    if not isinstance(scores, dict) or not scores:
        raise ValueError(
            f"scores must be a non-empty {{(s_init, s_stop): (stable, firing, rmse)}} dict, got {scores!r}"
        )
    for pair, v in scores.items():
        if not (isinstance(v, tuple) and len(v) == 3 and not any(math.isnan(float(t)) for t in v)):
            raise ValueError(
                f"scores[{pair!r}] must be a (stable, firing, rmse) tuple without NaN, got {v!r}"
            )
    admissible = {c: v for c, v in scores.items() if 0.001 <= v[1] <= 0.5} or scores
    return min(admissible, key=lambda c: (-admissible[c][0], admissible[c][2]))


def select_levels(
    emulator: nn.Module | Callable[[Tensor], Tensor],
    thermalizer: Thermalizer,
    ics: Tensor,
    candidates: Sequence[tuple[int, int]],
    *,
    horizon: int,
    window: int,
    band: tuple[float, float],
    log_ref: np.ndarray,
    modes: np.ndarray,
    noise_limit: int | None = 100,
    seed: int = 0,
) -> tuple[tuple[int, int], dict[tuple[int, int], tuple[float, float, float]]]:
    """Choose ``(s_init, s_stop)`` by a thermalized-rollout sweep from training states.

    The official code's sweep (``scripts/therm_inference/therm_sweep.py``) rolls out every pair of a grid
    and keeps the one whose rollouts are most like the true system; here, for each candidate pair the
    ``ics`` are rolled out for ``horizon`` steps (:func:`thermalized_rollout`, the same seed for every
    pair) and scored by the stable fraction (:func:`stable_mask`), the firing rate and the median
    spectrum RMSE of the last ``window`` steps (:func:`spectrum_rmse`); :func:`choose_levels` picks.
    Use training states only, so the choice never sees the test trajectories.

    Args:
        emulator, thermalizer: as for :func:`thermalized_rollout`.
        ics: initial states ``(B, N)`` taken from training trajectories.
        candidates: non-empty sequence of ``(s_init, s_stop)`` pairs with ``0 <= s_stop < s_init < T``.
        horizon: rollout length; window: scored final steps, ``0 < window <= horizon``.
        band: energy band (:func:`stability_band`); log_ref, modes: spectrum reference
            (:func:`spectral_reference`).
        noise_limit: as for :func:`thermalized_rollout`.
        seed: seed of the thermalizer's noise.

    Returns:
        the chosen pair and ``{pair: (stable fraction, firing rate, median spectrum RMSE)}`` (rounded to
        3, 4 and 4 decimals).
    """
    check_tensor(ics, "ics", ndim=2, non_empty=True)  # (B, N): periodic 1D fields
    if not isinstance(thermalizer, Thermalizer):
        raise TypeError(f"thermalizer must be a Thermalizer, got {type(thermalizer).__name__}")
    thermalizer._check_event("ics", ics)
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence) or not candidates:
        raise ValueError(f"candidates must be a non-empty list of (s_init, s_stop), got {candidates!r}")
    horizon = check_int(horizon, "horizon", low=1)
    window = check_int(window, "window")
    if not 0 < window <= horizon:
        raise ValueError(f"window must be in (0, horizon={horizon}], got {window}")
    stable_mask(
        np.zeros((1, 1)), band
    )  # band's rule, checked before any rollout: (low, high), 0 <= low < high
    for pair in candidates:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"candidates must hold (s_init, s_stop) pairs, got {pair!r}")
    scores: dict[tuple[int, int], tuple[float, float, float]] = {}
    for si, ss in candidates:
        res = thermalized_rollout(
            emulator,
            thermalizer,
            ics,
            horizon,
            s_init=si,
            s_stop=ss,
            noise_limit=noise_limit,
            generator=make_generator(seed),
        )
        stable = float(stable_mask(res.energy[:, 1:], band).mean())
        fire = float(res.fired[:, 1:].float().mean())
        rmse = float(np.median(spectrum_rmse(res.states[:, -window:], log_ref, modes)))
        scores[(si, ss)] = (round(stable, 3), round(fire, 4), round(rmse, 4))
    return choose_levels(scores), scores
