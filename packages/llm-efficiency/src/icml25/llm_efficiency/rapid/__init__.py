"""RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding — ICML 2025, P03: the method.

Chen et al., ICML 2025 (official code: John-AI-Lab/RAPID). A *RAG drafter* — an LLM of any size
that reads only retrieved chunks of the long context plus the query — drafts ``γ`` tokens cheaply; the
long-context *target* verifies them in one forward pass against a *retrieval-augmented target*
``p̂ = softmax(z − η·g)``, ``g = p − q`` truncated to ``q ≥ α·max q``, so the drafter's knowledge is
accepted where the target does not strongly disagree.

* :func:`augmented_target`, :func:`rapid_verify` (``sampling.py``): the pure per-round math;
* :class:`RapidGenerator`, :class:`RapidOutput` (``decoding.py``): the loop over two causal LMs with
  separate caches, statistics (acceptance, target calls per token, wall time);
* :func:`chunk_text`, :func:`retrieve`, :func:`select_chunks`, :func:`bm25_scores`, :func:`tfidf_scores`
  (``retrieval.py``): the RAG context, pluggable scorers;
* :class:`InductionLM` (``induction.py``): an analytic copying LM for CPU-scale experiments;
* ``rapid_generate`` (``hf.py``, extra ``[hf]``, imported on first access): the decoding method for
  transformers' ``generate(custom_generate=rapid_generate, drafter=..., rag_input_ids=...)``.
"""

from __future__ import annotations

from icml25.llm_efficiency.rapid.decoding import RapidGenerator, RapidOutput
from icml25.llm_efficiency.rapid.induction import InductionCache, InductionLM
from icml25.llm_efficiency.rapid.retrieval import (
    Chunk,
    bm25_scores,
    chunk_text,
    retrieve,
    select_chunks,
    tfidf_scores,
)
from icml25.llm_efficiency.rapid.sampling import augmented_target, rapid_verify

__all__ = [
    "Chunk",
    "InductionCache",
    "InductionLM",
    "RapidGenerator",
    "RapidOutput",
    "augmented_target",
    "bm25_scores",
    "chunk_text",
    "rapid_generate",
    "rapid_verify",
    "retrieve",
    "select_chunks",
    "tfidf_scores",
]


def __getattr__(name: str) -> object:
    # Lazy: the transformers integration needs the optional dependency (extra [hf]).
    if name == "rapid_generate":
        from icml25.llm_efficiency.rapid.hf import rapid_generate

        return rapid_generate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
