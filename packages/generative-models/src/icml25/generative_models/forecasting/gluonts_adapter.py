"""K²VAE: Koopman–Kalman VAE for long-term probabilistic forecasting — ICML 2025, P06: GluonTS adapter.

Wu et al., "K²VAE: A Koopman-Kalman Enhanced Variational AutoEncoder for Probabilistic Time Series
Forecasting", ICML 2025 (arXiv 2505.23017; official code ``decisionintelligence/K2VAE``).

:class:`K2VAEPredictor` wraps a fitted :class:`~icml25.generative_models.K2VAEForecaster` as a GluonTS
``Predictor``: ``predict(dataset)`` yields one ``SampleForecast`` per entry, so GluonTS' ``Evaluator`` and
backtesting tools work on K²VAE unchanged. Requires ``pip install 'icml25-generative-models[gluonts]'``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

try:
    import pandas as pd
    from gluonts.model.forecast import SampleForecast
    from gluonts.model.predictor import Predictor
except ImportError as err:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "K2VAEPredictor needs GluonTS: pip install 'icml25-generative-models[gluonts]'"
    ) from err

from icml25.generative_models.forecasting.forecaster import K2VAEForecaster
from icml25.kernels.checks import check_int

__all__ = ["K2VAEPredictor"]


class K2VAEPredictor(Predictor):
    """GluonTS ``Predictor`` over a fitted :class:`K2VAEForecaster` (``prediction_length = horizon``).

    Each dataset entry's ``target`` is ``(T,)`` for a 1-channel model or ``(C, T)`` (GluonTS' multivariate
    layout) for ``C`` channels, ``T ≥ context_len``; the last ``context_len`` steps are the context. The
    forecast's samples are ``(num_samples, H)`` or ``(num_samples, H, C)``, starting one period after the
    entry's last step. ``freq`` converts a non-``Period`` ``start`` (GluonTS datasets carry Periods).
    """

    def __init__(
        self, forecaster: K2VAEForecaster, num_samples: int = 100, seed: int = 0, freq: str | None = None
    ) -> None:
        if not isinstance(forecaster, K2VAEForecaster):
            raise TypeError(f"forecaster must be a K2VAEForecaster, got {type(forecaster).__name__}")
        if not hasattr(forecaster, "model_"):
            raise ValueError("K2VAEForecaster is not fitted: call fit(...) first")
        num_samples = check_int(num_samples, "num_samples", low=1)
        super().__init__(prediction_length=forecaster.horizon)
        self.forecaster, self.num_samples, self.seed, self.freq = forecaster, num_samples, seed, freq

    def predict(self, dataset: Any, **kwargs: Any) -> Iterator[SampleForecast]:
        """One ``SampleForecast`` per entry of ``dataset`` (an iterable of GluonTS data entries)."""
        fc = self.forecaster
        n_vars = fc.model_.n_vars
        for k, entry in enumerate(dataset):
            target = np.asarray(entry["target"], dtype=np.float32)
            series = target[:, None] if target.ndim == 1 else target.T  # (T, C)
            if series.shape[1] != n_vars or series.shape[0] < fc.context_len:
                raise ValueError(
                    f"dataset entry {k}: target must be ({'T' if n_vars == 1 else f'{n_vars}, T'}) with "
                    f"T >= context_len={fc.context_len}, got shape {target.shape}"
                )
            samples = fc.predict(series[-fc.context_len :], num_samples=self.num_samples, seed=self.seed + k)
            samples = samples.numpy()
            if target.ndim == 1:
                samples = samples[..., 0]
            start = entry["start"]
            if not isinstance(start, pd.Period):
                if self.freq is None:
                    raise ValueError(
                        f"dataset entry {k}: start must be a pandas.Period (GluonTS convention) or pass freq=, "
                        f"got {start!r}"
                    )
                start = pd.Period(start, freq=self.freq)
            start = start + len(series)
            yield SampleForecast(samples=samples, start_date=start, item_id=entry.get("item_id"))
