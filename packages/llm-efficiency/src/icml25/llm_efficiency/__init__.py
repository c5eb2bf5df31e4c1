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
from icml25.llm_efficiency.meap import (
    MEAPCollator,
    MEAPSFTCollator,
    add_mask_token,
    causal_lm_loss,
    mask_hf_batch,
    meap_attention_stats,
    meap_mask_inputs,
    meap_pretrain_loss,
)
from icml25.llm_efficiency.moe_scaling import (
    PAPER_COEFFS_UNVERIFIED,
    Allocation,
    JointLawParams,
    JointMoEScalingLaw,
    MoEFFN,
    TinyDecoder,
    TopicBigramCorpus,
    budget_table,
    lr_rule,
    total_params,
)
from icml25.llm_efficiency.rapid import (
    Chunk,
    InductionLM,
    RapidGenerator,
    RapidOutput,
    augmented_target,
    bm25_scores,
    chunk_text,
    rapid_verify,
    retrieve,
    select_chunks,
    tfidf_scores,
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
    "PAPER_COEFFS_UNVERIFIED",
    "Allocation",
    "AquaPredictors",
    "CalibrationReport",
    "Chunk",
    "HiggsQuantizer",
    "InductionLM",
    "JointLawParams",
    "JointMoEScalingLaw",
    "MEAPCollator",
    "MEAPSFTCollator",
    "MoEFFN",
    "PassthroughQuantizer",
    "RapidGenerator",
    "RapidOutput",
    "SpargeController",
    "SpargeHeadParams",
    "SpargeStats",
    "SpargeTuner",
    "TinyDecoder",
    "TopicBigramCorpus",
    "UniformQuantizer",
    "__version__",
    "add_mask_token",
    "augmented_target",
    "block_sparse_attention",
    "bm25_scores",
    "budget_table",
    "calibrate_predictors",
    "causal_lm_loss",
    "chunk_text",
    "evaluate_kv_compression",
    "lr_rule",
    "make_gaussian_grid",
    "mask_hf_batch",
    "meap_attention_stats",
    "meap_mask_inputs",
    "meap_pretrain_loss",
    "predict_block_mask",
    "rapid_verify",
    "register_sparge_attention",
    "retrieve",
    "select_chunks",
    "sparge_attention",
    "tfidf_scores",
    "total_params",
]
