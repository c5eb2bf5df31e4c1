"""P06 K²VAE with the real GluonTS (extra ``[gluonts]``): the Predictor adapter returns SampleForecasts, and
our quantile-loss CRPS and ND equal GluonTS' own Evaluator on the same samples."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("gluonts")

from gluonts.evaluation import Evaluator
from gluonts.model.forecast import SampleForecast

from icml25.generative_models.forecasting import (
    K2VAEForecaster,
    nmae,
    weighted_quantile_loss,
)
from icml25.generative_models.forecasting.metrics import DEFAULT_QUANTILES

SMALL = {"patch_len": 8, "latent_dim": 4, "hidden_dim": 8, "hidden_layers": 1, "d_model": 4, "n_heads": 2}


def _dataset(n_items: int, length: int, n_vars: int) -> list[dict]:
    rng = np.random.default_rng(0)
    t = np.arange(length)
    out = []
    for k in range(n_items):
        x = 5 + np.sin(2 * np.pi * (t + 3 * k) / 8)[None] + 0.2 * rng.standard_normal((n_vars, length))
        out.append(
            {
                "start": pd.Period("2024-01-01 00:00", freq="h"),
                "target": x[0] if n_vars == 1 else x,
                "item_id": f"s{k}",
            }
        )
    return out


def test_predictor_and_metrics_match_gluonts_evaluator() -> None:
    from icml25.generative_models.forecasting import K2VAEPredictor

    H, L = 8, 16
    train = torch.from_numpy(_dataset(1, 200, 1)[0]["target"][:, None]).float()
    fc = K2VAEForecaster(L, H, steps=20, batch_size=8, seed=0, **SMALL).fit(train)
    pred = K2VAEPredictor(fc, num_samples=50)
    full = _dataset(4, 60, 1)
    inputs = [{**e, "target": e["target"][:-H]} for e in full]
    forecasts = list(pred.predict(inputs))
    assert len(forecasts) == 4 and all(isinstance(f, SampleForecast) for f in forecasts)
    assert forecasts[0].samples.shape == (50, H)
    assert forecasts[0].start_date == pd.Period("2024-01-01 00:00", freq="h") + 60 - H
    tss = [
        pd.DataFrame(e["target"], index=pd.period_range("2024-01-01 00:00", periods=60, freq="h"))
        for e in full
    ]
    agg, _ = Evaluator(quantiles=DEFAULT_QUANTILES, num_workers=None)(iter(tss), iter(forecasts))
    samples = torch.from_numpy(np.stack([f.samples for f in forecasts], 1))  # (N, items, H)
    y = torch.from_numpy(np.stack([e["target"][-H:] for e in full]))
    assert weighted_quantile_loss(samples, y) == pytest.approx(agg["mean_wQuantileLoss"], rel=1e-5)
    assert nmae(samples, y) == pytest.approx(agg["ND"], rel=1e-5)


def test_predictor_multivariate_and_bad_inputs() -> None:
    from icml25.generative_models.forecasting import K2VAEPredictor

    data = _dataset(2, 40, 3)
    fc = K2VAEForecaster(16, 8, steps=2, batch_size=4, seed=0, **SMALL).fit(
        torch.from_numpy(data[0]["target"].T).float()
    )
    f = next(iter(K2VAEPredictor(fc, num_samples=6).predict(data)))
    assert f.samples.shape == (6, 8, 3)
    with pytest.raises(
        ValueError, match=r"dataset entry 0: target must be \(3, T\) with T >= context_len=16"
    ):
        list(K2VAEPredictor(fc).predict([{"start": data[0]["start"], "target": np.zeros((2, 40))}]))
    with pytest.raises(ValueError, match=r"start must be a pandas\.Period"):
        list(K2VAEPredictor(fc).predict([{"start": "2024-01-01", "target": data[0]["target"]}]))
    f2 = next(iter(K2VAEPredictor(fc, num_samples=2, freq="D").predict([{**data[0], "start": "2024-01-01"}])))
    assert f2.start_date == pd.Period("2024-01-01", freq="D") + 40
    with pytest.raises(ValueError, match="K2VAEForecaster is not fitted"):
        K2VAEPredictor(K2VAEForecaster(16, 8, **SMALL))
    with pytest.raises(TypeError, match="forecaster must be a K2VAEForecaster"):
        K2VAEPredictor(object())  # type: ignore[arg-type]
