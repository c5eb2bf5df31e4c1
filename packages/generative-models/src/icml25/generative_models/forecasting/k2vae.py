"""K²VAE: Koopman–Kalman VAE for long-term probabilistic forecasting — ICML 2025, P06: the model.

Wu et al., "K²VAE: A Koopman-Kalman Enhanced Variational AutoEncoder for Probabilistic Time Series
Forecasting", ICML 2025 (arXiv 2505.23017; official code ``decisionintelligence/K2VAE``, built on ProbTS).

The context ``x`` ``(B, L, C)`` is RevIN-normalised, cut into ``n = ceil(L/p)`` patches (channels of a
patch flattened together), embedded by an MLP into a latent space where a Koopman operator ``K`` (local
eDMD least squares + a learnable global matrix) rolls the last patches forward ``S = ceil(H/p)`` patches in
one jump (``Z[:, -S:] K^S``). A differentiable Kalman filter refines that rollout, with control inputs from a
transformer over the Koopman reconstruction residual, and yields a per-step latent covariance ``P_t`` (the
VAE prior). Decoder MLPs map latent samples to a Gaussian forecast ``(B, H, C)``.

Fixes of the official code (each a constructor option where the official behaviour is kept available):
the Gaussian scale is denormalised by the RevIN std only (the official code adds the mean to the raw scale
before the softplus); the auxiliary head uses ``n`` and ``S`` (official ``L // p`` and ``H // p`` break when
``p`` does not divide ``L`` or ``H``); the Kalman gain is applied in the textbook form ``x + G r``
(``gain_transpose=True`` reproduces the official ``x + Gᵀ r``); the latent sampling noise is selectable
(``latent_noise="identity"``, the official ``N(0, I)``, or ``"prior"``, the training ``N(0, P_t)``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["K2VAE", "DifferentiableKalmanFilter", "K2VAEOutput", "KoopmanOperator", "RevIN"]

KoopmanMode = Literal["both", "dynamic", "static"]
_MODES = ("both", "dynamic", "static")


def check_series(x: object, name: str, n_vars: int | None = None, length: int | None = None) -> torch.Tensor:
    """Validate a ``(B, T, C)`` float tensor: finite, non-empty, ``C == n_vars`` and ``T == length``."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    # finite and |x| <= 1e15 in one reduction: RevIN squares deviations, and larger series should be rescaled
    x = check_tensor(x, name, ndim=3, non_empty=True, max_abs=1e15)
    if length is not None and x.shape[1] != length:
        raise ValueError(f"{name} must have {length} time steps (axis 1), got shape {tuple(x.shape)}")
    if n_vars is not None and x.shape[2] != n_vars:
        raise ValueError(f"{name} must have n_vars={n_vars} channels (axis 2), got shape {tuple(x.shape)}")
    return x


class RevIN(nn.Module):
    """Reversible instance normalisation over the time axis of ``(B, T, C)`` tensors.

    ``normalize`` stores the per-sample, per-channel mean and std (``(B, 1, C)``) and applies an optional
    learnable affine map; ``denormalize`` inverts it; ``denormalize_scale`` maps a standard deviation
    (std scaling only: a scale has no location).
    """

    def __init__(self, n_vars: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.n_vars = check_int(n_vars, "n_vars", low=1)
        self.eps = check_float(eps, "eps", low=0.0, low_open=True)
        self.affine = bool(affine)
        self.weight = nn.Parameter(torch.ones(self.n_vars)) if self.affine else None
        self.bias = nn.Parameter(torch.zeros(self.n_vars)) if self.affine else None

    def stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, std)`` of ``x`` ``(B, T, C)`` over time, each ``(B, 1, C)`` (std with ``eps``)."""
        mean = x.mean(1, keepdim=True).detach()
        std = torch.sqrt(x.var(1, keepdim=True, unbiased=False) + self.eps).detach()
        return mean, std

    def normalize(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """``(x − mean)/std``, then the affine map; ``x`` ``(B, T, C)``."""
        out = (x - mean) / std
        if self.affine:
            out = out * self.weight + self.bias
        return out

    def denormalize(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`normalize`."""
        if self.affine:
            x = (x - self.bias) / (self.weight + self.eps * self.eps)
        return x * std + mean

    def denormalize_scale(self, scale: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """A standard deviation in the normalised space mapped back: ``scale · std / |w|``."""
        if self.affine:
            scale = scale / (self.weight.abs() + self.eps * self.eps)
        return scale * std


def _mlp(d_in: int, d_out: int, hidden: int, layers: int, dropout: float) -> nn.Sequential:
    mods: list[nn.Module] = []
    d = d_in
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), nn.ReLU(), nn.Dropout(dropout)]
        d = hidden
    mods.append(nn.Linear(d, d_out))
    return nn.Sequential(*mods)


class KoopmanOperator(nn.Module):
    """Koopman operator on latent snapshots (row-vector convention ``z_{t+1} = z_t K``).

    ``mode="static"``: the local operator ``K_loc = argmin ‖Z[:, :-1] K − Z[:, 1:]‖² + λ‖K‖²`` per sample
    (one-step eDMD; the official code uses the pseudo-inverse, the ``λ → 0`` limit); ``"dynamic"``: a learnable global ``K_glo``
    (``d × d``, initialised orthogonal, ``U Vᵀ`` of a Gaussian matrix's SVD); ``"both"``: ``K_loc + K_glo``
    (the paper's formulation). A non-finite ``K`` or ``K^S`` falls back to the identity.
    """

    def __init__(self, latent_dim: int, mode: KoopmanMode = "both", ridge: float = 1e-6) -> None:
        super().__init__()
        self.latent_dim = check_int(latent_dim, "latent_dim", low=1)
        self.ridge = check_float(ridge, "ridge", low=0.0, low_open=True)
        if mode not in _MODES:
            raise ValueError(f"koopman_mode must be one of {_MODES}, got {mode!r}")
        self.mode = mode
        u, _, vh = torch.linalg.svd(torch.randn(self.latent_dim, self.latent_dim))
        self.K_global = nn.Parameter(u @ vh)

    def local_operator(self, Z: torch.Tensor) -> torch.Tensor:
        """``K_loc`` ``(B, d, d)`` from latents ``Z`` ``(B, n, d)``, ``n ≥ 2``: Tikhonov-regularised least
        squares ``Xᵀ (X Xᵀ + λI)⁻¹ Y`` (``X = Z[:, :-1]``, ``Y = Z[:, 1:]``, ``λ = ridge``), which tends to the
        minimum-norm pseudo-inverse solution as ``λ → 0`` but keeps a bounded gradient when the snapshots
        are rank-deficient (a periodic context can repeat a patch exactly)."""
        if Z.dim() != 3 or Z.shape[1] < 2:
            raise ValueError(f"Z must have shape (B, n, d) with n >= 2 snapshots, got {tuple(Z.shape)}")
        X, Y = Z[:, :-1], Z[:, 1:]
        m, d = X.shape[1], X.shape[2]
        if m <= d:  # under-determined (the usual case): solve the small m x m system
            gram = X @ X.transpose(1, 2) + self.ridge * torch.eye(m, dtype=Z.dtype, device=Z.device)
            return X.transpose(1, 2) @ torch.linalg.solve(gram, Y)
        gram = X.transpose(1, 2) @ X + self.ridge * torch.eye(d, dtype=Z.dtype, device=Z.device)
        return torch.linalg.solve(gram, X.transpose(1, 2) @ Y)

    def operator(self, Z: torch.Tensor) -> torch.Tensor:
        """The operator ``K`` ``(B, d, d)`` used for ``Z`` ``(B, n, d)`` in this mode."""
        B, d = Z.shape[0], Z.shape[2]
        if self.mode == "dynamic":
            K = self.K_global.expand(B, d, d)
        elif self.mode == "static":
            K = self.local_operator(Z)
        else:
            K = self.local_operator(Z) + self.K_global
        return _finite_or_identity(K)

    def forward(self, Z: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reconstruction and ``steps``-patch forecast of ``Z`` ``(B, n, d)``.

        Returns ``(Z_rec (B, n, d), Y (B, steps, d), K (B, d, d))``: ``Z_rec = [z_1, z_1 K, …, z_{n−1} K]``;
        ``Y = Z[:, −S:] K^S`` when ``S ≤ n``, else ``Z`` advanced in blocks of ``K^n`` and truncated to ``S``.
        """
        Z = _check_latents(Z, "Z", self.latent_dim, min_len=2)
        steps = check_int(steps, "steps", low=1)
        n = Z.shape[1]
        K = self.operator(Z)
        Z_rec = torch.cat([Z[:, :1], Z[:, :-1] @ K], dim=1)
        if steps <= n:
            Y = Z[:, -steps:] @ _finite_or_identity(torch.linalg.matrix_power(K, steps))
        else:
            Kn = _finite_or_identity(torch.linalg.matrix_power(K, n))
            blocks, cur = [], Z
            for _ in range(math.ceil(steps / n)):
                cur = cur @ Kn
                blocks.append(cur)
            Y = torch.cat(blocks, dim=1)[:, :steps]
        return Z_rec, Y, K


def _check_latents(Z: object, name: str, dim: int, min_len: int = 1) -> torch.Tensor:
    Z = check_tensor(Z, name, shape=(None, None, dim), non_empty=True)
    if Z.shape[1] < min_len:
        raise ValueError(f"{name} must have shape (B, n >= {min_len}, {dim}), got shape {tuple(Z.shape)}")
    return Z


def _finite_or_identity(K: torch.Tensor) -> torch.Tensor:
    ok = torch.isfinite(K).flatten(-2).all(-1)
    if bool(ok.all()):
        return K
    eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device).expand_as(K)
    return torch.where(ok[..., None, None], K, eye)


class DifferentiableKalmanFilter(nn.Module):
    """Batched linear-Gaussian Kalman filter with learnable ``F, B, H, Q = L_Q L_Qᵀ, R = L_R L_Rᵀ``.

    State model ``x_t = F x_{t−1} + B u_t + w``, ``w ~ N(0, Q)``; measurement ``y_t = H x_t + v``,
    ``v ~ N(0, R)``. All matrices start at the identity (``init="identity"``) or, for ``F`` and ``B``, as
    Gaussian matrices (``init="randn"``). The covariance update is Joseph's form, symmetrised every step.
    """

    def __init__(
        self, dim: int, init: Literal["identity", "randn"] = "identity", gain_transpose: bool = False
    ):
        super().__init__()
        self.dim = check_int(dim, "dim", low=1)
        if init not in ("identity", "randn"):
            raise ValueError(f"init must be 'identity' or 'randn', got {init!r}")
        eye = torch.eye(self.dim)
        mk = (lambda: torch.randn(self.dim, self.dim) / math.sqrt(self.dim)) if init == "randn" else eye.clone
        self.F = nn.Parameter(mk())
        self.B = nn.Parameter(mk())
        self.H = nn.Parameter(eye.clone())
        self.L_Q = nn.Parameter(eye.clone())
        self.L_R = nn.Parameter(eye.clone())
        self.gain_transpose = bool(gain_transpose)

    @property
    def Q(self) -> torch.Tensor:
        """Process-noise covariance ``L_Q L_Qᵀ`` ``(d, d)``."""
        return self.L_Q @ self.L_Q.T

    @property
    def R(self) -> torch.Tensor:
        """Measurement-noise covariance ``L_R L_Rᵀ`` ``(d, d)``."""
        return self.L_R @ self.L_R.T

    def forward(
        self,
        x0: torch.Tensor,
        measurements: torch.Tensor,
        controls: torch.Tensor | None = None,
        P0: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Filter ``measurements`` ``(B, S, d)`` from state ``x0`` ``(B, d)`` and ``P0`` ``(d, d)`` (default I).

        ``controls`` ``(B, S, d)`` (default zero). Returns the filtered states ``(B, S, d)`` and covariances
        ``(S, d, d)`` (they do not depend on the data, so they are shared by the batch).
        """
        d = self.dim
        if isinstance(x0, torch.Tensor) and x0.dim() != 2:
            raise ValueError(f"x0 must have shape (B, {d}), got shape {tuple(x0.shape)}")
        x0 = _check_latents(x0[:, None] if isinstance(x0, torch.Tensor) else x0, "x0", d)[:, 0]
        measurements = _check_latents(measurements, "measurements", d)
        if measurements.shape[0] != x0.shape[0]:
            raise ValueError(
                f"measurements must have shape (B={x0.shape[0]}, S, {d}), got {tuple(measurements.shape)}"
            )
        if controls is not None:
            controls = _check_latents(controls, "controls", d)
            if controls.shape != measurements.shape:
                raise ValueError(
                    f"controls must have the shape of measurements {tuple(measurements.shape)}, got "
                    f"{tuple(controls.shape)}"
                )
        eye = torch.eye(d, dtype=x0.dtype, device=x0.device)
        P = eye if P0 is None else P0
        Fm, Bm, Hm, Q, R = self.F, self.B, self.H, self.Q, self.R
        x = x0
        states, covs = [], []
        for t in range(measurements.shape[1]):
            x_pred = x @ Fm.T
            if controls is not None:
                x_pred = x_pred + controls[:, t] @ Bm.T
            P_pred = Fm @ P @ Fm.T + Q
            Sm = Hm @ P_pred @ Hm.T + R
            G = torch.linalg.solve(Sm, Hm @ P_pred).T  # P̂ Hᵀ S⁻¹ (P̂ and S symmetric)
            innov = measurements[:, t] - x_pred @ Hm.T
            x = x_pred + (innov @ G if self.gain_transpose else innov @ G.T)
            A = eye - G @ Hm
            P = A @ P_pred @ A.T + G @ R @ G.T
            P = 0.5 * (P + P.T)
            states.append(x)
            covs.append(P)
        return torch.stack(states, 1), torch.stack(covs, 0)


@dataclass
class K2VAEOutput:
    """One forward pass: the reconstruction, the latent prior and the Gaussian forecast.

    ``x_rec`` ``(B, L, C)``, ``mean``/``scale`` ``(B, H, C)`` (original units), ``prior_mean`` ``(B, S, d)``,
    ``prior_cov`` ``(S, d, d)``, and the RevIN-normalised ``x_rec_norm``, ``mean_norm``, ``scale_norm``.
    """

    x_rec: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor
    prior_mean: torch.Tensor
    prior_cov: torch.Tensor
    x_rec_norm: torch.Tensor
    mean_norm: torch.Tensor
    scale_norm: torch.Tensor

    @property
    def predictive(self) -> torch.distributions.Normal:
        """The Gaussian forecast ``N(mean, scale²)`` ``(B, H, C)`` given this pass's latent draw."""
        return torch.distributions.Normal(self.mean, self.scale)


def _psd_factor(P: torch.Tensor) -> torch.Tensor:
    """A factor ``A`` with ``A Aᵀ = P`` for ``P`` ``(..., d, d)`` (Cholesky; eigenvalues clamped at 1e-6)."""
    L, info = torch.linalg.cholesky_ex(P)
    if bool((info == 0).all()):
        return L
    w, V = torch.linalg.eigh(P)
    return V * w.clamp_min(1e-6).sqrt().unsqueeze(-2)


class K2VAE(nn.Module):
    """K²VAE forecaster of ``horizon`` steps from ``context_len`` steps of ``n_vars`` channels.

    Arguments follow the official configuration (paper LTSF values in brackets): ``patch_len`` p [24],
    ``latent_dim`` d [128], encoder/decoder MLPs of ``hidden_layers`` [3] × ``hidden_dim`` [256] with
    ``dropout`` [0.05], auxiliary transformer ``d_model`` [128], ``n_heads`` [4], ``e_layers`` [1],
    ``koopman_mode`` ["both" in the paper; most official configs "dynamic"], KL weight ``kl_weight`` [0.01],
    NLL gate ``nll_gate`` [100] (the NLL term is dropped while it exceeds the gate, counted in
    ``nll_gated_``). ``padding``: ``"wrap"`` (official: prepend the last ``n·p − L`` steps) or
    ``"replicate"`` (repeat the first step). ``seed`` seeds the initialisation (None: torch's global RNG).
    """

    def __init__(
        self,
        n_vars: int,
        context_len: int,
        horizon: int,
        patch_len: int = 24,
        latent_dim: int = 128,
        hidden_dim: int = 256,
        hidden_layers: int = 3,
        koopman_mode: KoopmanMode = "both",
        d_model: int = 128,
        n_heads: int = 4,
        e_layers: int = 1,
        kl_weight: float = 0.01,
        nll_gate: float = 100.0,
        dropout: float = 0.05,
        kalman_init: Literal["identity", "randn"] = "identity",
        gain_transpose: bool = False,
        latent_noise: Literal["identity", "prior"] = "identity",
        padding: Literal["wrap", "replicate"] = "wrap",
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.n_vars = check_int(n_vars, "n_vars", low=1)
        self.patch_len = check_int(patch_len, "patch_len", low=1)
        self.context_len = check_int(context_len, "context_len", low=1)
        if self.context_len < 2 * self.patch_len:
            raise ValueError(
                f"context_len must be >= 2 * patch_len = {2 * self.patch_len} (eDMD needs >= 2 patches), "
                f"got context_len={self.context_len}"
            )
        self.horizon = check_int(horizon, "horizon", low=1)
        self.latent_dim = check_int(latent_dim, "latent_dim", low=1)
        hidden_dim = check_int(hidden_dim, "hidden_dim", low=1)
        hidden_layers = check_int(hidden_layers, "hidden_layers", low=0)
        d_model = check_int(d_model, "d_model", low=1)
        n_heads = check_int(n_heads, "n_heads", low=1)
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads={n_heads}, got d_model={d_model}")
        e_layers = check_int(e_layers, "e_layers", low=1)
        if koopman_mode not in _MODES:
            raise ValueError(f"koopman_mode must be one of {_MODES}, got {koopman_mode!r}")
        if latent_noise not in ("identity", "prior"):
            raise ValueError(f"latent_noise must be 'identity' or 'prior', got {latent_noise!r}")
        if padding not in ("wrap", "replicate"):
            raise ValueError(f"padding must be 'wrap' or 'replicate', got {padding!r}")
        self.kl_weight = check_float(kl_weight, "kl_weight", low=0.0)
        self.nll_gate = check_float(nll_gate, "nll_gate", low=0.0, low_open=True)
        dropout = check_float(dropout, "dropout", low=0.0, high=1.0, high_open=True)
        if dropout >= 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.latent_noise, self.padding, self.koopman_mode = latent_noise, padding, koopman_mode
        self.n_patches = math.ceil(self.context_len / self.patch_len)
        self.n_future = math.ceil(self.horizon / self.patch_len)
        pc = self.patch_len * self.n_vars
        d, n, S = self.latent_dim, self.n_patches, self.n_future
        with isolated_rng(seed):
            self.revin = RevIN(self.n_vars)
            self.encoder = _mlp(pc, d, hidden_dim, hidden_layers, dropout)
            self.koopman = KoopmanOperator(d, koopman_mode)
            self.aux_in = nn.Linear(d, d_model)
            layer = nn.TransformerEncoderLayer(d_model, n_heads, 2 * d_model, dropout=0.1, batch_first=True)
            self.aux_transformer = nn.TransformerEncoder(layer, e_layers, enable_nested_tensor=False)
            self.aux_out = nn.Linear(n * d_model, S * d)
            self.kalman = DifferentiableKalmanFilter(d, kalman_init, gain_transpose)
            self.dec_mu = _mlp(d, pc, hidden_dim, hidden_layers, dropout)
            self.dec_sigma = _mlp(d, pc, hidden_dim, hidden_layers, dropout)
        self.nll_gated_ = 0

    # ------------------------------------------------------------------------------------------ pieces
    def _patch(self, xn: torch.Tensor) -> torch.Tensor:
        pad = self.n_patches * self.patch_len - self.context_len
        if pad:
            front = xn[:, -pad:] if self.padding == "wrap" else xn[:, :1].expand(-1, pad, -1)
            xn = torch.cat([front, xn], 1)
        return xn.reshape(xn.shape[0], self.n_patches, self.patch_len * self.n_vars)

    def _unpatch(self, v: torch.Tensor) -> torch.Tensor:
        return v.reshape(v.shape[0], v.shape[1] * self.patch_len, self.n_vars)

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Latent quantities of a context ``x`` ``(B, L, C)``: RevIN stats, ``Z``, ``Z_rec``, the prior."""
        mean, std = self.revin.stats(x)
        xn = self.revin.normalize(x, mean, std)
        Z = self.encoder(self._patch(xn))
        Z_rec, Y, _ = self.koopman(Z, self.n_future)
        E = Z - Z_rec
        h = self.aux_transformer(self.aux_in(E))
        U = self.aux_out(h.flatten(1)).reshape(-1, self.n_future, self.latent_dim)
        states, covs = self.kalman(Z[:, -1], Y, U)
        return {"mean": mean, "std": std, "xn": xn, "Z": Z, "Z_rec": Z_rec, "mu": states + U, "P": covs}

    def decode(self, z: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Latents ``z`` ``(B, S, d)`` → ``(mean, scale, mean_norm, scale_norm)``, each ``(B, H, C)``."""
        mu_n = self._unpatch(self.dec_mu(z))[:, : self.horizon]
        sc_n = (F.softplus(self._unpatch(self.dec_sigma(z))) + 1e-6)[:, : self.horizon]
        return self.revin.denormalize(mu_n, mean, std), self.revin.denormalize_scale(sc_n, std), mu_n, sc_n

    def _check_x(self, x: object, name: str = "x") -> torch.Tensor:
        x = check_series(x, name, self.n_vars, self.context_len)
        const = x.std(1) == 0
        if const.any():
            warnings.warn(
                f"{name} has {int(const.sum())} constant (series, channel) pairs: RevIN divides by eps",
                RuntimeWarning,
                stacklevel=3,
            )
        return x.to(self.K_dtype)

    @property
    def K_dtype(self) -> torch.dtype:
        return self.koopman.K_global.dtype

    # ------------------------------------------------------------------------------------------ API
    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> K2VAEOutput:
        """One pass on a context ``x`` ``(B, L, C)`` with one reparameterised latent draw ``N(μ_t, P_t)``."""
        x = self._check_x(x)
        enc = self.encode(x)
        A = _psd_factor(enc["P"])  # (S, d, d)
        eps = torch.randn(enc["mu"].shape, generator=generator, dtype=x.dtype, device=x.device)
        z = enc["mu"] + torch.einsum("sij,bsj->bsi", A, eps)
        mean, scale, mu_n, sc_n = self.decode(z, enc["mean"], enc["std"])
        xr_n = self._unpatch(self.dec_mu(enc["Z_rec"]))[:, -self.context_len :]
        x_rec = self.revin.denormalize(xr_n, enc["mean"], enc["std"])
        return K2VAEOutput(x_rec, mean, scale, enc["mu"], enc["P"], xr_n, mu_n, sc_n)

    def loss(
        self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Training loss on context ``x`` ``(B, L, C)`` and target ``y`` ``(B, H, C)``.

        ``total = MSE(x_rec, x) + MSE(mean, y) + α·NLL + β·KL`` on the denormalised reconstruction and
        forecast (the units of ``x``, ``y``, as the official ProbTS forecaster); ``α = 1`` while the NLL is
        below ``nll_gate`` (else 0, counted in ``nll_gated_``), ``β = kl_weight``,
        ``KL = ½ (tr P − d − log det P)`` averaged over steps. Returns ``total, rec, mse, nll, kl``.

        Not in the RevIN-normalised space: there the learnable affine weight is part of the target, and
        shrinking it to 0 collapses every normalised target onto the bias, a degenerate minimum (NLL → −∞)
        whose denormalised forecasts explode; a 1,500-step run fell into it (normalised NLL −5, forecast
        sample std ≈ 80 on standardised data).
        """
        x = self._check_x(x)
        y = check_series(y, "y", self.n_vars, self.horizon).to(x.dtype)
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have the batch size of x ({x.shape[0]}), got shape {tuple(y.shape)}")
        out = self.forward(x, generator=generator)
        rec = F.mse_loss(out.x_rec, x)
        mse = F.mse_loss(out.mean, y)
        nll = -out.predictive.log_prob(y).mean()
        kl = kl_to_standard_normal(out.prior_cov)
        alpha = 1.0 if float(nll.detach()) < self.nll_gate else 0.0
        if alpha == 0.0:
            self.nll_gated_ += 1
        total = rec + mse + alpha * nll + self.kl_weight * kl
        return {"total": total, "rec": rec, "mse": mse, "nll": nll, "kl": kl}

    @torch.no_grad()
    def sample(
        self,
        x: torch.Tensor,
        num_samples: int = 100,
        latent_draws: int = 20,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> torch.Tensor:
        """Forecast samples ``(num_samples, B, H, C)`` for a context ``x`` ``(B, L, C)``.

        ``latent_draws`` latent perturbations ``μ + ε`` (``ε ~ N(0, I)`` with ``latent_noise="identity"``,
        as the official code; ``N(0, P_t)`` with ``"prior"``) are decoded to Gaussians, and the samples are
        split as evenly as possible over them (``min(latent_draws, num_samples)`` draws are used).
        """
        num_samples = check_int(num_samples, "num_samples", low=1)
        latent_draws = check_int(latent_draws, "latent_draws", low=1)
        x = self._check_x(x)
        g = make_generator(seed, generator)
        was_training = self.training
        self.eval()
        try:
            enc = self.encode(x)
            A = _psd_factor(enc["P"]) if self.latent_noise == "prior" else None
            draws = min(latent_draws, num_samples)
            counts = [num_samples // draws + (1 if k < num_samples % draws else 0) for k in range(draws)]
            out = []
            for c in counts:
                eps = torch.randn(enc["mu"].shape, generator=g, dtype=x.dtype)
                if A is not None:
                    eps = torch.einsum("sij,bsj->bsi", A, eps)
                mean, scale, _, _ = self.decode(enc["mu"] + eps, enc["mean"], enc["std"])
                noise = torch.randn((c, *mean.shape), generator=g, dtype=x.dtype)
                out.append(mean + scale * noise)
            return torch.cat(out, 0)
        finally:
            self.train(was_training)


def kl_to_standard_normal(P: torch.Tensor) -> torch.Tensor:
    """``KL(N(0, P_t) ‖ N(0, I))`` averaged over ``t`` for covariances ``P`` ``(S, d, d)``."""
    d = P.shape[-1]
    tr = torch.diagonal(P, dim1=-2, dim2=-1).sum(-1)
    return (0.5 * (tr - d - torch.logdet(P))).mean()
