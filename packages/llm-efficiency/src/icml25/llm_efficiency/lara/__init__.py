"""LaRA: Benchmarking Retrieval-Augmented Generation and Long-Context LLMs — ICML 2025, P38: the RAG-vs-long-context harness and a per-query router.

Li et al., ICML 2025 (official code and data: Alibaba-NLP/LaRA).

* :class:`LaraItem`, :func:`load_lara`, :func:`save_lara`, :func:`read_document` (``data.py``): LaRA's
  released data layout, read from a local copy;
* :class:`Chunker`, :class:`HybridRetriever`, :class:`DocIndex`, :class:`RetrievedChunk`, :class:`LlamaIndexRetriever`
  (``retrieval.py``): 600/100-token chunks, BM25 + dense candidates, optional reranker;
* :func:`build_prompt`, :func:`evaluate_arm`, :func:`score_predictions`, :func:`fit_context`,
  :class:`HFGenerator` (``pipelines.py``): the RAG and LC solvers over any callable or transformers LM;
* :class:`Judge`, :class:`LexicalJudge`, :class:`LLMJudge`, :func:`is_refusal`, :func:`normalize_numbers`
  (``judge.py``);
* :class:`RagLcRouter`, :func:`router_features`, :func:`guideline_route`, :func:`routed_accuracy`
  (``router.py``);
* :func:`make_mini_lara`, :class:`RagReader`, :class:`SimulatedLCReader`, :func:`extract_answer`
  (``synthetic.py``): the synthetic mini-LaRA and its readers (the LC reader is simulated).
"""

from __future__ import annotations

from icml25.llm_efficiency.lara.data import (
    CONTEXT_TYPES,
    LENGTHS,
    TASKS,
    LaraItem,
    load_lara,
    read_document,
    save_lara,
)
from icml25.llm_efficiency.lara.judge import Judge, LexicalJudge, LLMJudge, is_refusal, normalize_numbers
from icml25.llm_efficiency.lara.pipelines import (
    HFGenerator,
    build_prompt,
    evaluate_arm,
    fit_context,
    score_predictions,
)
from icml25.llm_efficiency.lara.retrieval import (
    Chunker,
    DocIndex,
    HybridRetriever,
    LlamaIndexRetriever,
    RetrievedChunk,
    TextChunk,
)
from icml25.llm_efficiency.lara.router import (
    BASE_FEATURES,
    FEATURE_NAMES,
    RETRIEVAL_FEATURES,
    RagLcRouter,
    guideline_route,
    question_cues,
    routed_accuracy,
    router_features,
)
from icml25.llm_efficiency.lara.synthetic import (
    LC_READERS,
    LCReaderParams,
    MiniLara,
    RagReader,
    SimulatedLCReader,
    extract_answer,
    make_mini_lara,
)

__all__ = [
    "BASE_FEATURES",
    "CONTEXT_TYPES",
    "FEATURE_NAMES",
    "LC_READERS",
    "LENGTHS",
    "RETRIEVAL_FEATURES",
    "TASKS",
    "Chunker",
    "DocIndex",
    "HFGenerator",
    "HybridRetriever",
    "Judge",
    "LCReaderParams",
    "LLMJudge",
    "LaraItem",
    "LexicalJudge",
    "LlamaIndexRetriever",
    "MiniLara",
    "RagLcRouter",
    "RagReader",
    "RetrievedChunk",
    "SimulatedLCReader",
    "TextChunk",
    "build_prompt",
    "evaluate_arm",
    "extract_answer",
    "fit_context",
    "guideline_route",
    "is_refusal",
    "load_lara",
    "make_mini_lara",
    "normalize_numbers",
    "question_cues",
    "read_document",
    "routed_accuracy",
    "router_features",
    "save_lara",
    "score_predictions",
]
