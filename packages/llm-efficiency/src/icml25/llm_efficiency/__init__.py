"""icml25.llm_efficiency — LLM efficiency: sparse/quantized attention, KV-cache compression, decoding and training efficiency.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here.
"""

from importlib.metadata import version as _distribution_version

from icml25.llm_efficiency.aqua_kv import (
    AquaPredictors,
    CalibrationReport,
    HiggsQuantizer,
    PassthroughQuantizer,
    UniformQuantizer,
    calibrate_predictors,
    evaluate_kv_compression,
    make_gaussian_grid,
)
from icml25.llm_efficiency.sparge import (
    SpargeController,
    SpargeHeadParams,
    SpargeStats,
    SpargeTuner,
    block_sparse_attention,
    predict_block_mask,
    register_sparge_attention,
    sparge_attention,
)

__version__ = _distribution_version("icml25-llm-efficiency")

__all__ = [
    "AquaPredictors",
    "CalibrationReport",
    "HiggsQuantizer",
    "PassthroughQuantizer",
    "SpargeController",
    "SpargeHeadParams",
    "SpargeStats",
    "SpargeTuner",
    "UniformQuantizer",
    "__version__",
    "block_sparse_attention",
    "calibrate_predictors",
    "evaluate_kv_compression",
    "make_gaussian_grid",
    "predict_block_mask",
    "register_sparge_attention",
    "sparge_attention",
]
