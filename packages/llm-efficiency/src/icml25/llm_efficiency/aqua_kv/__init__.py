"""AQUA-KV: Cache Me If You Must: Adaptive Key-Value Quantization for Large Language Models — ICML 2025, P36: the method.

KV-cache compression that quantizes only what the previous layer cannot predict: per-layer linear
predictors (fitted once, in closed form) predict each layer's pre-RoPE keys from the previous layer's
reconstructed keys and values from [this layer's keys; previous layer's values]; the residual is stored
with a HIGGS quantizer (Hadamard rotation + Gaussian-optimal grid) at ~2 bits per value.

``AquaKVCache`` (a ``transformers`` Cache) needs the ``[hf]`` extra and is imported on first access.
"""

from __future__ import annotations

from icml25.llm_efficiency.aqua_kv.calibrate import (
    CalibrationReport,
    CapturedKV,
    calibrate_predictors,
    capture_kv,
)
from icml25.llm_efficiency.aqua_kv.evaluate import evaluate_kv_compression, reconstruction_error
from icml25.llm_efficiency.aqua_kv.predictors import AquaCodec, AquaPredictors, fit_ridge
from icml25.llm_efficiency.aqua_kv.quantizers import (
    HiggsCodes,
    HiggsQuantizer,
    PassthroughQuantizer,
    UniformQuantizer,
    make_gaussian_grid,
    stored_bits,
)

__all__ = [
    "AquaCodec",
    "AquaKVCache",
    "AquaPredictors",
    "CalibrationReport",
    "CapturedKV",
    "HiggsCodes",
    "HiggsQuantizer",
    "PassthroughQuantizer",
    "UniformQuantizer",
    "calibrate_predictors",
    "capture_kv",
    "evaluate_kv_compression",
    "fit_ridge",
    "make_gaussian_grid",
    "reconstruction_error",
    "stored_bits",
]


def __getattr__(name: str) -> object:
    # Lazy: the cache subclasses transformers.Cache, an optional dependency (extra [hf]).
    if name == "AquaKVCache":
        try:
            from icml25.llm_efficiency.aqua_kv.cache import AquaKVCache
        except ImportError as err:
            raise ImportError(
                "AquaKVCache needs transformers: pip install 'icml25-llm-efficiency[hf]'"
            ) from err
        return AquaKVCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
