"""FedCEO (Clients Collaborate) — ICML 2025, P50: t-SVD low-rank smoothing of DP client models, the server step.

Li et al., "Clients Collaborate: Flexible Differentially Private Federated Learning with Guaranteed
Improvement of Utility-Privacy Trade-off", ICML 2025 (official code: 6lyc/FedCEO_Collaborate-with-Each-Other).

Under differential privacy every uploaded client model carries independent Gaussian noise. FedCEO stacks
the m uploaded copies of each parameter into a 3-way tensor ``X`` of shape ``[n1, n2, m]`` (client axis
last) and replaces it by the proximal operator of the t-SVD tensor nuclear norm,

    L = prox_{τ·TNN}(X):  FFT along the client axis, soft-threshold the singular values of every
                          frequency slice by τ, inverse FFT.

The threshold grows geometrically, τ_k = ϑ^k / (2λ) at the k-th smoothing, because DP noise accumulates.
Smoothing is post-processing of already-privatised uploads, so the privacy guarantee is unchanged.

Exact identity (checked in the tests): the client mean of ``L`` equals matrix singular value thresholding
of the client mean of ``X`` with threshold τ/m (the zero frequency is the mean up to a factor m). The
non-zero frequencies only change the personalised per-client slices, which clients restart from on
rounds ``t % I == 0`` (optional, ``restart=True``).

The official code uses one absolute threshold for every parameter. ``FedCEOConfig(noise_std=s)`` instead
ties it to the upload noise: parameter-wise ``τ = ϑ^k/(2λ) · s√m(√n1 + √n2)``, the expected spectral
norm of a Fourier slice of the stacked noise (:func:`noise_threshold`) times a dimensionless factor, so
one λ fits every layer and noise level, and without DP (s = 0) FedCEO is exactly FedAvg.

This module holds the algebra (:func:`tsvt`, :func:`matricize`, :func:`fedceo_smooth`,
:func:`tau_schedule`, :func:`noise_threshold`) and :class:`FedCEOAggregator`, the server-side state
machine shared by the plain-python loop (:mod:`icml25.federated.server`) and the Flower strategy
(:mod:`icml25.federated.flower`).
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from icml25.federated.aggregation import (
    FedAvgAggregator,
    State,
    check_client_states,
    check_uploads,
    mean_state,
)
from icml25.kernels.checks import check_tensor

__all__ = [
    "FedAvgAggregator",
    "FedCEOAggregator",
    "FedCEOConfig",
    "check_client_states",
    "check_uploads",
    "fedceo_smooth",
    "is_smoothing_round",
    "matricize",
    "mean_state",
    "noise_threshold",
    "svt",
    "tau_schedule",
    "tsvt",
]


# --------------------------------------------------------------------------------------------------
# Singular value thresholding
# --------------------------------------------------------------------------------------------------


def svt(a: Tensor, tau: float) -> Tensor:
    """Matrix singular value soft-thresholding ``U max(S - τ, 0) Vᴴ`` (batched over leading dims).

    Args:
        a: ``[..., n1, n2]`` real or complex, finite (an empty ``a`` is returned as a copy).
        tau: threshold ≥ 0.
    """
    if not isinstance(a, Tensor):
        raise TypeError(f"a must be a torch.Tensor of shape [..., n1, n2], got {type(a).__name__}")
    if a.ndim < 2:
        raise ValueError(f"a must have shape [..., n1, n2] (at least 2 dims), got shape {tuple(a.shape)}")
    if not (a.is_floating_point() or a.is_complex()):
        raise TypeError(f"a must be a real or complex floating tensor, got dtype {a.dtype}")
    _check_tau(tau)
    _check_finite("a", a)
    if a.numel() == 0:
        return a.clone()
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    s = torch.clamp(s - tau, min=0.0)
    return (u * s.unsqueeze(-2).to(u.dtype)) @ vh


def tsvt(x: Tensor, tau: float) -> Tensor:
    """t-SVD singular value soft-thresholding along the last (client) axis: ``prox_{τ·TNN}(x)``.

    FFT along the client axis, SVT with threshold τ on every frequency slice, inverse FFT. Only the
    ``⌊m/2⌋+1`` non-negative frequencies are computed (``rfft``): the others are complex conjugates of
    them, and SVT commutes with conjugation, so the inverse transform is exactly real.

    Args:
        x: ``[n1, n2, m]`` real tensor (m clients), finite; an empty ``x`` is returned as a copy.
        tau: threshold ≥ 0; 0 returns ``x``.

    Returns:
        ``[n1, n2, m]`` tensor of the same dtype as ``x``.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape [n1, n2, m], got {type(x).__name__}")
    if x.ndim != 3:
        raise ValueError(f"x must have shape [n1, n2, m] (3 dims), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a real floating tensor, got dtype {x.dtype}")
    _check_tau(tau)
    _check_finite("x", x)
    if x.numel() == 0:
        return x.clone()
    m = x.shape[-1]
    # float64 internally: the tensors are small and the identities in the tests hold to 1e-6.
    xf = torch.fft.rfft(x.to(torch.float64), dim=-1)  # [n1, n2, m//2+1] complex
    slices = xf.permute(2, 0, 1)  # [F, n1, n2]: one matrix per frequency
    shrunk = svt(slices, tau).permute(1, 2, 0)
    return torch.fft.irfft(shrunk, n=m, dim=-1).to(x.dtype)


def _check_finite(name: str, x: Tensor) -> None:
    try:
        check_tensor(x, name, dtype=None)
    except ValueError as err:
        raise ValueError(f"{err} (the SVD of a non-finite matrix is undefined)") from None


def _check_tau(tau: float) -> None:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)):
        raise TypeError(f"tau must be a real number >= 0, got {type(tau).__name__}")
    if not math.isfinite(tau) or tau < 0:
        raise ValueError(f"tau must be a finite number >= 0, got {tau}")


# --------------------------------------------------------------------------------------------------
# Parameter matricization
# --------------------------------------------------------------------------------------------------

_CONVENTIONS = ("fedceo", "out_first")


def matricize(p: Tensor, convention: str = "fedceo") -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """View one parameter tensor as a matrix, and return the inverse map.

    ``"fedceo"`` follows the official code, which transposes *all* axes of the stacked tensor:
    a vector ``[n]`` becomes ``[1, n]``; a matrix ``[out, in]`` becomes ``[in, out]``; a tensor
    ``[o, i, kh, kw]`` becomes ``[kw·kh·i, o]`` (axes reversed, all but the output axis flattened).
    ``"out_first"`` uses ``[o, i·kh·kw]``. The two differ by a transpose and a row permutation, under
    which singular value thresholding is equivariant, so the smoothed parameters are identical.

    Args:
        p: parameter tensor of any shape (a scalar is treated as ``[1, 1]``).
        convention: ``"fedceo"`` or ``"out_first"``.

    Returns:
        ``(matrix [n1, n2], unmatricize)`` with ``unmatricize(matrix) == p`` (also on a batch
        ``[..., n1, n2]`` → ``[..., *p.shape]``).
    """
    if not isinstance(p, Tensor):
        raise TypeError(f"p must be a torch.Tensor, got {type(p).__name__}")
    if convention not in _CONVENTIONS:
        raise ValueError(f"convention must be one of {_CONVENTIONS}, got {convention!r}")
    shape = tuple(p.shape)
    if p.ndim == 0:
        return p.reshape(1, 1), lambda mat: mat.reshape(mat.shape[:-2])
    if p.ndim == 1:
        return p.reshape(1, -1), lambda mat: mat.reshape(*mat.shape[:-2], *shape)
    if convention == "out_first":
        return p.reshape(shape[0], -1), lambda mat: mat.reshape(*mat.shape[:-2], *shape)
    # "fedceo": reverse the axes, then merge all but the (now last) output axis into rows.
    rev = tuple(reversed(range(p.ndim)))
    rev_shape = tuple(shape[i] for i in rev)
    # Explicit row count (not -1): a zero-size parameter has an ambiguous -1 but a well-defined matrix.
    mat = p.permute(rev).reshape(math.prod(shape[1:]), shape[0])

    def unmatricize(mat: Tensor) -> Tensor:
        lead = mat.shape[:-2]
        t = mat.reshape(*lead, *rev_shape)
        k = len(lead)
        return t.permute(*range(k), *(k + i for i in rev))

    return mat, unmatricize


# --------------------------------------------------------------------------------------------------
# Smoothing of client states
# --------------------------------------------------------------------------------------------------


def _excluded(key: str, exclude: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pat) for pat in exclude)


def _smoothed_keys(template: Mapping[str, Tensor], exclude: Iterable[str]) -> list[str]:
    """The parameters FedCEO smooths: floating-point tensors whose name matches no ``exclude`` pattern."""
    return [k for k, v in template.items() if v.is_floating_point() and not _excluded(k, exclude)]


def _per_key_tau(
    tau: float | Mapping[str, float], template: Mapping[str, Tensor], exclude: tuple[str, ...]
) -> dict[str, float]:
    """``{key: τ}`` for the keys that are smoothed (float tensors not matching ``exclude``)."""
    keys = _smoothed_keys(template, exclude)
    if isinstance(tau, Mapping):
        missing = [k for k in keys if k not in tau]
        if missing:
            raise ValueError(f"tau must give a threshold for every smoothed parameter, missing {missing}")
        for k in keys:
            _check_tau(tau[k])
        return {k: float(tau[k]) for k in keys}
    _check_tau(tau)
    return {k: float(tau) for k in keys}


def noise_threshold(noise_std: float, m: int, shape: tuple[int, int]) -> float:
    """Expected spectral norm of one Fourier slice of stacked i.i.d. upload noise: ``s·√m·(√n1 + √n2)``.

    If each of the m uploads carries i.i.d. N(0, s²) noise on a parameter matricised as ``[n1, n2]``,
    every frequency slice of its FFT along the client axis is an ``n1 × n2`` Gaussian matrix with
    ``E|entry|² = m·s²`` (real at frequency 0, complex elsewhere), whose largest singular value
    concentrates at ``√(m s²)(√n1 + √n2)`` (Bai–Yin / Gordon). Soft-thresholding at this level removes
    the noise's spectrum and keeps signal directions above it; at frequency 0 it is the matrix SVT of
    the client mean at ``τ/m = s(√n1 + √n2)/√m``, the spectral norm of one round's mean noise.

    Args:
        noise_std: per-entry std s ≥ 0 of the noise in one upload (σ·C under user-level DP).
        m: number of stacked clients ≥ 1.
        shape: ``(n1, n2)`` of the matricised parameter (see :func:`matricize`).
    """
    if (
        isinstance(noise_std, bool)
        or not isinstance(noise_std, (int, float))
        or not (noise_std >= 0 and math.isfinite(noise_std))
    ):
        raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be an int >= 1 (number of clients), got {m!r}")
    if len(shape) != 2 or any(int(n) < 1 for n in shape):
        raise ValueError(f"shape must be (n1, n2) with n1, n2 >= 1, got {tuple(shape)}")
    return float(noise_std) * math.sqrt(m) * (math.sqrt(shape[0]) + math.sqrt(shape[1]))


def fedceo_smooth(
    client_states: Sequence[Mapping[str, Tensor]],
    tau: float | Mapping[str, float],
    *,
    exclude: Iterable[str] = (),
    convention: str = "fedceo",
) -> tuple[list[State], State]:
    """Tensor low-rank proximal smoothing of m client models (one shot of FedCEO's step).

    For every floating-point entry of the state dicts, stack the m matricised copies into
    ``X [n1, n2, m]`` and replace them by ``tsvt(X, τ)``. Keys matching an ``exclude`` glob pattern
    (e.g. ``"*.bias"``), keys whose threshold is 0 (``tsvt(X, 0) = X``: copied, so the result is
    bit-identical to the uploads), zero-size parameters and non-float buffers (e.g. BatchNorm's ``num_batches_tracked``)
    are left as uploaded. The global model is the plain mean of the smoothed client states.

    Args:
        client_states: m dicts ``{name: tensor}`` with identical keys and shapes (m ≥ 1; with m = 1
            smoothing is matrix SVT).
        tau: threshold ≥ 0 for every parameter (the official code), or ``{name: τ}`` per parameter
            (e.g. from :meth:`FedCEOConfig.thresholds`); every smoothed float key must be present.
        exclude: glob patterns of keys not to smooth.
        convention: matricization, see :func:`matricize` (the result does not depend on it).

    Returns:
        ``(smoothed per-client states, global mean state)``.
    """
    check_client_states(client_states)
    exclude = tuple(exclude)
    taus = _per_key_tau(tau, client_states[0], exclude)
    m = len(client_states)
    if m < 2:
        warnings.warn("fedceo_smooth with a single client degenerates to matrix SVT", stacklevel=2)
    smoothed: list[State] = [{} for _ in range(m)]
    for k in client_states[0]:
        if k not in taus or taus[k] == 0 or client_states[0][k].numel() == 0:  # zero-size: nothing to smooth
            for i, st in enumerate(client_states):
                smoothed[i][k] = st[k].clone()
            continue
        mats = []
        unmat: Callable[[Tensor], Tensor] | None = None
        for st in client_states:
            mat, unmat = matricize(st[k], convention)
            mats.append(mat)
        low_rank = tsvt(torch.stack(mats, dim=-1), taus[k])  # [n1, n2, m]
        assert unmat is not None
        per_client = unmat(low_rank.permute(2, 0, 1))  # [m, *shape]
        for i in range(m):
            smoothed[i][k] = per_client[i].contiguous()
    return smoothed, mean_state(smoothed)


# --------------------------------------------------------------------------------------------------
# Schedule
# --------------------------------------------------------------------------------------------------


def is_smoothing_round(round_idx: int, interval: int) -> bool:
    """Smoothing runs after 0-indexed round ``t`` when ``(t + 1) % I == 0``."""
    return (round_idx + 1) % interval == 0


def tau_schedule(round_idx: int, lam: float, theta: float, interval: int) -> float:
    """Threshold used when smoothing after 0-indexed round ``t``: ``τ = ϑ^⌈t/I⌉ / (2λ)``.

    On smoothing rounds ``t = kI − 1`` this is ``ϑ^k / (2λ)`` for ``I > 1`` (the official code's
    formula; with ``I = 1`` the k-th smoothing uses ``ϑ^(k−1)``). ``ϑ = 1`` is the fixed variant.
    """
    if isinstance(round_idx, bool) or not isinstance(round_idx, int) or round_idx < 0:
        raise ValueError(f"round_idx must be an int >= 0, got {round_idx!r}")
    _check_schedule(lam, theta, interval)
    return float(theta ** math.ceil(round_idx / interval) / (2.0 * lam))


def _check_schedule(lam: float, theta: float, interval: int) -> None:
    if not isinstance(lam, (int, float)) or isinstance(lam, bool) or not (lam > 0 and math.isfinite(lam)):
        raise ValueError(f"lam must be a finite number > 0, got {lam!r}")
    if (
        not isinstance(theta, (int, float))
        or isinstance(theta, bool)
        or not (theta > 0 and math.isfinite(theta))
    ):
        raise ValueError(f"theta must be a finite number > 0 (usually >= 1), got {theta!r}")
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f"interval must be an int >= 1, got {interval!r}")


# --------------------------------------------------------------------------------------------------
# Server-side state machine shared by the plain loop and the Flower strategy
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FedCEOConfig:
    """FedCEO hyper-parameters.

    Two threshold scales:

    * ``noise_std=None`` (the official code): one absolute threshold for every parameter,
      ``τ_k = ϑ^k / (2λ)`` at the k-th smoothing.
    * ``noise_std=s`` (noise-calibrated): parameter-wise ``τ_k = ϑ^k / (2λ) · s√m(√n1 + √n2)``
      (:func:`noise_threshold`), so ``1/(2λ)`` is a dimensionless multiple of the expected spectral
      norm of the stacked upload noise, and one λ fits every layer shape, model and noise level.
      Without DP (``s = 0``) every threshold is 0: smoothing is the identity, no personalised restart
      happens, and FedCEO is exactly FedAvg.

    Attributes:
        lam: λ > 0; the initial threshold (multiplier) is ``1/(2λ)``.
        theta: geometric growth ϑ of the threshold per smoothing (1 = fixed threshold; < 1 warns).
        interval: smooth every ``I`` rounds (after rounds ``t`` with ``(t+1) % I == 0``).
        restart: on rounds ``t % I == 0`` (t > 0) each sampled client whose stored state is its
            smoothed slice (its latest upload was smoothed with τ > 0) starts from that state instead
            of the global model; other clients start from the global model.
        exclude: glob patterns of parameter names left unsmoothed (e.g. ``("*.bias",)``).
        noise_std: per-entry std s ≥ 0 of the noise in one upload, or ``None`` for absolute thresholds.
    """

    lam: float
    theta: float = 1.04
    interval: int = 10
    restart: bool = True
    exclude: tuple[str, ...] = ()
    noise_std: float | None = None

    def __post_init__(self) -> None:
        _check_schedule(self.lam, self.theta, self.interval)
        if self.theta < 1:
            warnings.warn(
                f"theta={self.theta} < 1: the smoothing threshold shrinks over rounds", stacklevel=3
            )
        if isinstance(self.exclude, str):
            raise TypeError(f"exclude must be a tuple of glob patterns, got the string {self.exclude!r}")
        object.__setattr__(self, "exclude", tuple(self.exclude))
        if self.noise_std is not None:
            noise_threshold(self.noise_std, 1, (1, 1))  # validates noise_std
            object.__setattr__(self, "noise_std", float(self.noise_std))

    def tau(self, round_idx: int) -> float:
        """Schedule value ``ϑ^⌈t/I⌉ / (2λ)`` after 0-indexed round ``round_idx``: the threshold itself
        (``noise_std=None``) or its multiple of the noise level (see the class docstring)."""
        return tau_schedule(round_idx, self.lam, self.theta, self.interval)

    def thresholds(self, round_idx: int, template: Mapping[str, Tensor], m: int) -> dict[str, float]:
        """Per-parameter thresholds ``{name: τ}`` for smoothing m uploads shaped like ``template``."""
        base = self.tau(round_idx)
        out: dict[str, float] = {}
        for k in _smoothed_keys(template, self.exclude):
            if self.noise_std is None:
                out[k] = base
            else:
                n1, n2 = matricize(template[k])[0].shape
                out[k] = base * noise_threshold(self.noise_std, m, (n1, n2))
        return out

    @classmethod
    def from_tau(cls, tau0: float, **kwargs: object) -> FedCEOConfig:
        """Build from the initial threshold ``τ0 = 1/(2λ)``."""
        if not isinstance(tau0, (int, float)) or not tau0 > 0:
            raise ValueError(f"tau0 must be a number > 0, got {tau0!r}")
        return cls(lam=1.0 / (2.0 * float(tau0)), **kwargs)  # type: ignore[arg-type]


class FedCEOAggregator(FedAvgAggregator):
    """FedCEO's server: stores per-client personalised states, smooths every ``I`` rounds.

    Used unchanged by :class:`icml25.federated.server.FedCEOServer` and by
    :class:`icml25.federated.flower.FedCEOStrategy`. Following the official code, a client's stored
    state is its latest upload, replaced by its smoothed slice when the round is a smoothing round.

    Attributes:
        personal_states: ``{client_id: state}`` of every client seen so far.
        smoothed_clients: clients whose stored state is a smoothed slice (τ > 0); only they restart
            from it.
        taus: ``{round_idx: schedule value}`` of the smoothing rounds performed (:meth:`FedCEOConfig.tau`).
        layer_taus: ``{round_idx: {name: τ}}``, the thresholds actually applied.
    """

    def __init__(self, config: FedCEOConfig) -> None:
        if not isinstance(config, FedCEOConfig):
            raise TypeError(f"config must be a FedCEOConfig, got {type(config).__name__}")
        self.config = config
        self.personal_states: dict[Hashable, State] = {}
        self.smoothed_clients: set[Hashable] = set()
        self.taus: dict[int, float] = {}
        self.layer_taus: dict[int, dict[str, float]] = {}

    def smoothed_round(self, round_idx: int) -> bool:
        return is_smoothing_round(round_idx, self.config.interval)

    def start_state(self, round_idx: int, client_id: Hashable, global_state: State) -> State:
        """Personalised restart on rounds ``t % I == 0`` (t > 0) when enabled and the client's stored
        state is its smoothed slice.

        Unlike the official code, a client without a smoothed state trains from the global model: the
        official loop silently re-uploads the previous client's weights when nothing is stored, and
        restarts from a stale un-smoothed upload when the client's latest round was not a smoothing one.
        """
        if (
            self.config.restart
            and round_idx > 0
            and round_idx % self.config.interval == 0
            and client_id in self.smoothed_clients
        ):
            return self.personal_states[client_id]
        return global_state

    def aggregate(
        self, round_idx: int, uploads: Mapping[Hashable, State] | Sequence[tuple[Hashable, State]]
    ) -> State:
        items = check_uploads(uploads)
        ids = [cid for cid, _ in items]
        states = [st for _, st in items]
        smoothed = False
        if self.smoothed_round(round_idx):
            taus = self.config.thresholds(round_idx, states[0], len(states))
            self.taus[round_idx] = self.config.tau(round_idx)
            self.layer_taus[round_idx] = taus
            smoothed = any(t > 0 for t in taus.values())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # m = 1 is legitimate inside a run
                states, global_state = fedceo_smooth(states, taus, exclude=self.config.exclude)
        else:
            global_state = mean_state(states)
        for cid, st in zip(ids, states):
            self.personal_states[cid] = {k: v.detach().clone() for k, v in st.items()}
            if smoothed:
                self.smoothed_clients.add(cid)
            else:
                self.smoothed_clients.discard(cid)
        return global_state
