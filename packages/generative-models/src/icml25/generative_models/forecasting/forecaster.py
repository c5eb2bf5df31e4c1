"""K²VAE: Koopman–Kalman VAE for long-term probabilistic forecasting — ICML 2025, P06: sklearn-style wrapper.

Wu et al., "K²VAE: A Koopman-Kalman Enhanced Variational AutoEncoder for Probabilistic Time Series
Forecasting", ICML 2025 (arXiv 2505.23017; official code ``decisionintelligence/K2VAE``).

:class:`K2VAEForecaster` does what the official ProbTS pipeline does around the model: a per-channel
standard scaler fitted on the training series, random (context, horizon) windows, Adam with gradient-norm
clipping 0.5, and sampling back in the original units.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from icml25.generative_models.forecasting.k2vae import K2VAE, check_series
from icml25.kernels.checks import check_float, check_int
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["K2VAEForecaster"]


class K2VAEForecaster:
    """Fit a :class:`K2VAE` on one ``(T, C)`` series and forecast ``(N, B, H, C)`` samples.

    ``steps`` Adam steps (paper 50 epochs × 100 batches) of ``batch_size`` [64] random windows at ``lr``
    [1e-3]; ``model_kwargs`` go to :class:`K2VAE` (``patch_len``, ``latent_dim``, ``koopman_mode``, ...).
    After ``fit``: ``model_``, ``loss_history_`` (total loss per step), ``mean_`` / ``scale_`` (the scaler),
    ``skipped_steps_`` (steps skipped for a non-finite loss or gradient).
    """

    def __init__(
        self,
        context_len: int,
        horizon: int,
        steps: int = 1000,
        batch_size: int = 64,
        lr: float = 1e-3,
        grad_clip: float = 0.5,
        seed: int = 0,
        **model_kwargs: Any,
    ) -> None:
        self.context_len = check_int(context_len, "context_len", low=2)
        self.horizon = check_int(horizon, "horizon", low=1)
        self.steps = check_int(steps, "steps", low=1)
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.lr = check_float(lr, "lr", low=0.0, low_open=True)
        self.grad_clip = check_float(grad_clip, "grad_clip", low=0.0, low_open=True)
        self.seed = check_int(seed, "seed", low=0)
        self.model_kwargs = dict(model_kwargs)
        # Validate the model arguments now (a throwaway 1-channel model), so a bad kwarg fails at construction.
        with isolated_rng(0):
            K2VAE(1, self.context_len, self.horizon, **self.model_kwargs)

    def fit(self, series: torch.Tensor | np.ndarray) -> K2VAEForecaster:
        """Train on ``series`` ``(T, C)`` with ``T ≥ context_len + horizon``; returns ``self``."""
        if isinstance(series, np.ndarray):
            series = torch.from_numpy(series)
        if not isinstance(series, torch.Tensor) or series.dim() != 2:
            shape = tuple(series.shape) if isinstance(series, torch.Tensor) else type(series).__name__
            raise ValueError(f"series must be a (T, C) tensor, got {shape}")
        s = check_series(series[None], "series")[0].to(torch.float32)
        need = self.context_len + self.horizon
        if s.shape[0] < need:
            raise ValueError(
                f"series must have at least context_len + horizon = {need} steps, got shape {tuple(s.shape)}"
            )
        std = s.std(0, unbiased=False)
        if bool((std == 0).any()):
            raise ValueError(
                f"series must not have constant channels; got std=0 in channels {torch.nonzero(std == 0).flatten().tolist()}"
            )
        mean = s.mean(0)
        z = (s - mean) / std
        model = K2VAE(s.shape[1], self.context_len, self.horizon, seed=self.seed, **self.model_kwargs)
        g = make_generator(self.seed)
        opt = torch.optim.Adam(model.parameters(), lr=self.lr)
        offsets = torch.arange(need)
        hist: list[float] = []
        skipped = 0
        model.train()
        with isolated_rng(self.seed):  # dropout draws
            for _ in range(self.steps):
                idx = torch.randint(0, s.shape[0] - need + 1, (self.batch_size,), generator=g)
                w = z[idx[:, None] + offsets]
                loss = model.loss(w[:, : self.context_len], w[:, self.context_len :], generator=g)["total"]
                opt.zero_grad()
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
                if torch.isfinite(norm) and torch.isfinite(loss):
                    opt.step()
                else:  # a non-finite loss or gradient: skip the step (counted), keep the parameters finite
                    skipped += 1
                hist.append(float(loss.detach()))
        model.eval()
        self.model_, self.loss_history_, self.mean_, self.scale_ = model, hist, mean, std
        self.skipped_steps_ = skipped
        return self

    def predict(
        self,
        context: torch.Tensor | np.ndarray,
        num_samples: int = 100,
        latent_draws: int = 20,
        seed: int | None = 0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Samples ``(num_samples, B, horizon, C)`` in the original units for ``context`` ``(B, L, C)`` or
        ``(L, C)`` (then ``(num_samples, horizon, C)``)."""
        if not hasattr(self, "model_"):
            raise ValueError("K2VAEForecaster is not fitted: call fit(...) first")
        if isinstance(context, np.ndarray):
            context = torch.from_numpy(context)
        single = isinstance(context, torch.Tensor) and context.dim() == 2
        x = check_series(
            context[None] if single else context, "context", self.model_.n_vars, self.context_len
        )
        xz = (x.to(torch.float32) - self.mean_) / self.scale_
        out = self.model_.sample(xz, num_samples, latent_draws, generator=generator, seed=seed)
        out = out * self.scale_ + self.mean_
        return out[:, 0] if single else out
