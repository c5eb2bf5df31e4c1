"""K²VAE: Koopman–Kalman VAE for long-term probabilistic forecasting — ICML 2025, P06: forecasting subpackage.

Wu et al., "K²VAE: A Koopman-Kalman Enhanced Variational AutoEncoder for Probabilistic Time Series
Forecasting", ICML 2025 (arXiv 2505.23017; official code ``decisionintelligence/K2VAE``). The model
(:mod:`.k2vae`), the sklearn-style wrapper (:mod:`.forecaster`), metrics (:mod:`.metrics`), baselines
(:mod:`.baselines`) and, through one lazy hop, the GluonTS ``Predictor`` adapter (``K2VAEPredictor``,
extra ``[gluonts]``).

Also P25 VisionTS (Chen et al., ICML 2025; official code ``Keytoyze/VisionTS``): :mod:`.visionts`, series
rendered as images and forecast by an image MAE's in-painting.

Also P35 VIMTS (ICML 2025; official code ``WHU-HZY/VIMTS``): :mod:`.vimts`, irregular multivariate series
patched per channel, completed across channels by a learned graph and forecast by a ViT-MAE's mask tokens.
"""

from __future__ import annotations

from typing import Any

from icml25.generative_models.common.vit_mae import load_vit_mae, small_vit_mae
from icml25.generative_models.forecasting.baselines import GRUForecaster, SeasonalNaive, climatology_samples
from icml25.generative_models.forecasting.forecaster import K2VAEForecaster
from icml25.generative_models.forecasting.k2vae import (
    K2VAE,
    DifferentiableKalmanFilter,
    K2VAEOutput,
    KoopmanOperator,
    RevIN,
    kl_to_standard_normal,
)
from icml25.generative_models.forecasting.metrics import (
    crps_from_samples,
    gaussian_crps,
    interval_coverage,
    nmae,
    weighted_quantile_loss,
)
from icml25.generative_models.forecasting.vimts import (
    TTCN,
    VIMTS,
    AdaptiveGCN,
    IMTSBatch,
    LearnableTimeEmbedding,
    PatchedIMTS,
    fit_vimts,
    imts_from_arrays,
    imts_from_long,
    imts_masked_mse,
    patchify_irregular,
    query_patch_index,
    seq_sincos_pos_embed,
)
from icml25.generative_models.forecasting.visionts import (
    FacebookMAEAdapter,
    HFViTMAEAdapter,
    MAEAdapter,
    VisionTS,
    VisionTSGeometry,
    autotune_periodicity,
    candidate_periods,
    image_to_forecast,
    series_to_image,
    visionts_geometry,
    visionts_keep_mask,
)

__all__ = [
    "K2VAE",
    "TTCN",
    "VIMTS",
    "AdaptiveGCN",
    "DifferentiableKalmanFilter",
    "FacebookMAEAdapter",
    "GRUForecaster",
    "HFViTMAEAdapter",
    "IMTSBatch",
    "K2VAEForecaster",
    "K2VAEOutput",
    "K2VAEPredictor",
    "KoopmanOperator",
    "LearnableTimeEmbedding",
    "MAEAdapter",
    "PatchedIMTS",
    "RevIN",
    "SeasonalNaive",
    "VisionTS",
    "VisionTSGeometry",
    "autotune_periodicity",
    "candidate_periods",
    "climatology_samples",
    "crps_from_samples",
    "fit_vimts",
    "gaussian_crps",
    "image_to_forecast",
    "imts_from_arrays",
    "imts_from_long",
    "imts_masked_mse",
    "interval_coverage",
    "kl_to_standard_normal",
    "load_vit_mae",
    "nmae",
    "patchify_irregular",
    "query_patch_index",
    "seq_sincos_pos_embed",
    "series_to_image",
    "small_vit_mae",
    "visionts_geometry",
    "visionts_keep_mask",
    "weighted_quantile_loss",
]


def __getattr__(name: str) -> Any:
    if name == "K2VAEPredictor":
        from icml25.generative_models.forecasting.gluonts_adapter import K2VAEPredictor

        return K2VAEPredictor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
