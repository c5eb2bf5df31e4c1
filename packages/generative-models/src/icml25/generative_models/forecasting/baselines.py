"""K²VAE: Koopman–Kalman VAE for long-term probabilistic forecasting — ICML 2025, P06: baselines.

Wu et al., "K²VAE: A Koopman-Kalman Enhanced Variational AutoEncoder for Probabilistic Time Series
Forecasting", ICML 2025 (arXiv 2505.23017; official code ``decisionintelligence/K2VAE``).

Three sample forecasters of ``(B, L, C)`` contexts returning ``(N, B, H, C)`` samples: climatology (the
context's per-channel mean and std as a Gaussian), seasonal-naive (repeat the last season, Gaussian noise
with the training residual std) and a DeepAR-like autoregressive GRU with a Gaussian output, sampled path by
path (the error-accumulating baseline K²VAE's one-shot Koopman rollout is compared against).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from icml25.generative_models.forecasting.k2vae import check_series
from icml25.kernels.checks import check_float, check_int
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["GRUForecaster", "SeasonalNaive", "climatology_samples"]


def _check_train(series: object, name: str = "series") -> torch.Tensor:
    if isinstance(series, np.ndarray):
        series = torch.from_numpy(series)
    if not isinstance(series, torch.Tensor) or series.dim() != 2:
        shape = tuple(series.shape) if isinstance(series, torch.Tensor) else type(series).__name__
        raise ValueError(f"{name} must be a (T, C) tensor, got {shape}")
    return check_series(series[None], name)[0].to(torch.float32)


def climatology_samples(
    x: torch.Tensor,
    horizon: int,
    num_samples: int = 100,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``N(mean, std²)`` of each context channel ``x`` ``(B, L, C)``, sampled: ``(N, B, H, C)``."""
    x = check_series(x, "x")
    horizon = check_int(horizon, "horizon", low=1)
    num_samples = check_int(num_samples, "num_samples", low=1)
    g = make_generator(seed, generator)
    m, s = x.mean(1, keepdim=True), x.std(1, keepdim=True, unbiased=False)
    B, _, C = x.shape
    return m + s * torch.randn(num_samples, B, horizon, C, generator=g, dtype=x.dtype)


class SeasonalNaive:
    """Repeat the last ``season`` steps of the context, plus ``N(0, σ_c²)`` noise, ``σ_c`` the std of the
    ``season``-lag residual ``x_t − x_{t−season}`` on the training series (per channel)."""

    def __init__(self, season: int = 24) -> None:
        self.season = check_int(season, "season", low=1)

    def fit(self, series: torch.Tensor | np.ndarray) -> SeasonalNaive:
        """Fit the residual std on a training series ``(T, C)``, ``T > season``."""
        s = _check_train(series)
        if s.shape[0] <= self.season:
            raise ValueError(
                f"series must have more than season={self.season} steps, got shape {tuple(s.shape)}"
            )
        self.sigma_ = (s[self.season :] - s[: -self.season]).std(0, unbiased=False).clamp_min(1e-8)
        return self

    def sample(
        self,
        x: torch.Tensor,
        horizon: int,
        num_samples: int = 100,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Samples ``(N, B, H, C)`` for contexts ``x`` ``(B, L, C)`` with ``L ≥ season``."""
        if not hasattr(self, "sigma_"):
            raise ValueError("SeasonalNaive is not fitted: call fit(...) first")
        x = check_series(x, "x", n_vars=self.sigma_.numel())
        if x.shape[1] < self.season:
            raise ValueError(f"x must have at least season={self.season} steps, got shape {tuple(x.shape)}")
        horizon = check_int(horizon, "horizon", low=1)
        num_samples = check_int(num_samples, "num_samples", low=1)
        g = make_generator(seed, generator)
        last = x[:, -self.season :]
        reps = -(-horizon // self.season)
        mean = last.repeat(1, reps, 1)[:, :horizon]
        noise = torch.randn(num_samples, *mean.shape, generator=g, dtype=x.dtype)
        return mean + self.sigma_.to(x.dtype) * noise


class _GRUNet(nn.Module):
    def __init__(self, n_vars: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.gru = nn.GRU(n_vars, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, 2 * n_vars)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        out, h = self.gru(x, h)
        mu, s = self.head(out).chunk(2, -1)
        return mu, nn.functional.softplus(s) + 1e-4, h


class GRUForecaster:
    """DeepAR-like baseline: a GRU reads ``x_{t−1}`` and outputs ``N(μ_t, σ_t²)`` per channel (diagonal);
    trained by teacher-forced Gaussian NLL on windows of ``window`` steps, forecast by ancestral sampling
    (each sampled step is fed back), so errors compound over the horizon."""

    def __init__(
        self,
        n_vars: int,
        hidden: int = 64,
        layers: int = 1,
        window: int = 144,
        steps: int = 1000,
        batch_size: int = 64,
        lr: float = 1e-3,
        seed: int = 0,
    ) -> None:
        self.n_vars = check_int(n_vars, "n_vars", low=1)
        self.hidden = check_int(hidden, "hidden", low=1)
        self.layers = check_int(layers, "layers", low=1)
        self.window = check_int(window, "window", low=2)
        self.steps = check_int(steps, "steps", low=1)
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.lr = check_float(lr, "lr", low=0.0, low_open=True)
        self.seed = check_int(seed, "seed", low=0)

    def fit(self, series: torch.Tensor | np.ndarray) -> GRUForecaster:
        """Train on a ``(T, C)`` series (``T > window``); sets ``net_`` and ``loss_history_``."""
        s = _check_train(series)
        if s.shape[1] != self.n_vars:
            raise ValueError(f"series must have n_vars={self.n_vars} channels, got shape {tuple(s.shape)}")
        if s.shape[0] <= self.window:
            raise ValueError(
                f"series must have more than window={self.window} steps, got shape {tuple(s.shape)}"
            )
        g = make_generator(self.seed)
        with isolated_rng(self.seed):
            net = _GRUNet(self.n_vars, self.hidden, self.layers)
        opt = torch.optim.Adam(net.parameters(), lr=self.lr)
        starts_max = s.shape[0] - self.window
        hist = []
        for _ in range(self.steps):
            idx = torch.randint(0, starts_max + 1, (self.batch_size,), generator=g)
            w = s[idx[:, None] + torch.arange(self.window)]
            mu, sig, _ = net(w[:, :-1])
            loss = -torch.distributions.Normal(mu, sig).log_prob(w[:, 1:]).mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            opt.step()
            hist.append(float(loss.detach()))
        self.net_, self.loss_history_ = net, hist
        return self

    @torch.no_grad()
    def sample(
        self,
        x: torch.Tensor,
        horizon: int,
        num_samples: int = 100,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Ancestral samples ``(N, B, H, C)`` for contexts ``x`` ``(B, L, C)``."""
        if not hasattr(self, "net_"):
            raise ValueError("GRUForecaster is not fitted: call fit(...) first")
        x = check_series(x, "x", n_vars=self.n_vars).to(torch.float32)
        horizon = check_int(horizon, "horizon", low=1)
        num_samples = check_int(num_samples, "num_samples", low=1)
        g = make_generator(seed, generator)
        B, _, C = x.shape
        _, _, h = self.net_(x[:, :-1])
        h = h.repeat(1, num_samples, 1)  # (layers, N*B, hidden), sample-major like cur
        cur = x[:, -1:].repeat(num_samples, 1, 1)  # (N*B, 1, C), sample-major
        out = []
        for _ in range(horizon):
            mu, sig, h = self.net_(cur, h)
            cur = mu + sig * torch.randn(mu.shape, generator=g)
            out.append(cur)
        return torch.cat(out, 1).reshape(num_samples, B, horizon, C)
