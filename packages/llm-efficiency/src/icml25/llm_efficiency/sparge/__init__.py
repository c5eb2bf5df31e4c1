"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: the op, its tuner and the transformers integration.

Training-free block-sparse + INT8 attention for any model. The op itself (stage-1 block prediction,
stage-2 sparse INT8 flash attention with the λ skip; Triton + PyTorch reference) lives in
:mod:`icml25.kernels.sparse_attention` and is re-exported here; this package adds

* :class:`SpargeTuner` — the per-head θ/τ/λ search against an error budget (``tuner.py``);
* :func:`register_sparge_attention` / :class:`SpargeController` — ``attn_implementation="sparge"`` for
  transformers models, with a tune mode (``hf.py``; extra ``[hf]``, transformers imported lazily).
"""

from icml25.kernels.sparse_attention import (
    SpargeStats,
    block_sparse_attention,
    predict_block_mask,
    sparge_attention,
)
from icml25.llm_efficiency.sparge.hf import SpargeController, register_sparge_attention
from icml25.llm_efficiency.sparge.tuner import SpargeHeadParams, SpargeTuner, head_error

__all__ = [
    "SpargeController",
    "SpargeHeadParams",
    "SpargeStats",
    "SpargeTuner",
    "block_sparse_attention",
    "head_error",
    "predict_block_mask",
    "register_sparge_attention",
    "sparge_attention",
]
