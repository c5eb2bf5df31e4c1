"""What several LLM-efficiency papers share: public modules named for what they hold.

* :func:`cache_argument`, :func:`output_cache` and :func:`crop_cache`, the KV-cache calls that differ
  between transformers versions, re-exported from :mod:`icml25.kernels.hf_cache`, where they moved because a
  paper of another area (role separation, P44) uses them too (RAPID, P03, PENCIL, P11, NTPP, P24, AQUA-KV,
  P36).
* :mod:`~icml25.llm_efficiency.common.losses`: :func:`causal_lm_loss`, the shifted next-token cross-entropy
  (MEAP, P04, and the PENCIL experiment, P11).
* :mod:`~icml25.llm_efficiency.common.tiny_decoder`: :class:`TinyDecoder`, a small pre-LN causal Transformer
  LM, and its dense or top-k MoE FFN :class:`MoEFFN` (Joint MoE Scaling Laws, P09, and the PENCIL
  experiment, P11).
* :mod:`~icml25.llm_efficiency.common.retrieval`: :func:`embedding_scores` and :func:`words`, the dense and
  lexical retrieval primitives (RAPID, P03, and LaRA, P38).

A paper's module imports only its own files, these common modules and :mod:`icml25.kernels`, never another
paper's module; the names are re-exported here, lazily (:mod:`icml25.kernels.lazy`), the decoder and
the loss also by :mod:`icml25.llm_efficiency` and by the papers' modules that used to define them (``meap``,
``moe_scaling``).
"""

from typing import TYPE_CHECKING

from icml25.kernels.lazy import lazy_namespace

if TYPE_CHECKING:  # the name -> module map of the lazy namespace (icml25.kernels.lazy)
    from icml25.kernels.hf_cache import cache_argument, crop_cache, output_cache
    from icml25.llm_efficiency.common.losses import causal_lm_loss
    from icml25.llm_efficiency.common.retrieval import embedding_scores, words
    from icml25.llm_efficiency.common.tiny_decoder import MoEFFN, TinyDecoder
else:
    __getattr__, __dir__ = lazy_namespace(__name__, __file__)

__all__ = [
    "MoEFFN",
    "TinyDecoder",
    "cache_argument",
    "causal_lm_loss",
    "crop_cache",
    "embedding_scores",
    "output_cache",
    "words",
]
