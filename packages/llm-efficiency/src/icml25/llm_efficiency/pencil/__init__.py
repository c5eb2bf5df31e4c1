"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: reduction of intermediate thoughts in generation.

Yang et al., "PENCIL: Long Thoughts with Short Memory", ICML 2025 (arXiv 2503.14337; official code
``chr26195/PENCIL``). Generation interleaves next-token prediction with the reduction rule
``C [CALL] T [SEP] A [RETURN] D → C A D``, so a model with a short context runs long traces.

* :class:`PencilTokens`, :func:`reduce_once`, :func:`reduce_full`, :class:`PencilReductionError`
  (``reduction.py``): the rule φ on lists / NumPy arrays / torch tensors;
* :func:`extract_subsequences`, :class:`PencilCollator` (``reduction.py``): full traces → reduced training
  sub-sequences with their loss start, and the padding collator;
* :func:`pencil_generate`, :class:`GenerateOutput` (``generation.py``): batched generation with reduction for
  transformers causal LMs (KV cache cropped across reductions) or any ``ids -> logits`` callable;
* :class:`PencilVocab` (``vocab.py``): the word-level vocabulary of the generators;
* :func:`generate_sat`, :func:`generate_qbf`, :func:`generate_seqsum` (``generators/``): seeded traces;
* ``pencil_hf_generate``, ``ReturnStoppingCriteria``, ``to_hf_tokenizer`` (``hf.py``, extra ``[hf]``,
  imported on first access): reduce-and-resume around ``model.generate``.
"""

from __future__ import annotations

from icml25.llm_efficiency.pencil.generation import GenerateOutput, crop_cache, pencil_generate
from icml25.llm_efficiency.pencil.generators import (
    brute_force_qbf,
    brute_force_sat,
    dpll_trace,
    generate_qbf,
    generate_sat,
    generate_seqsum,
    qbf_trace,
    seqsum_geometry,
)
from icml25.llm_efficiency.pencil.reduction import (
    PencilCollator,
    PencilReductionError,
    PencilTokens,
    context_profile,
    extract_subsequences,
    reduce_full,
    reduce_once,
)
from icml25.llm_efficiency.pencil.vocab import PencilVocab

__all__ = [
    "GenerateOutput",
    "PencilCollator",
    "PencilReductionError",
    "PencilTokens",
    "PencilVocab",
    "ReturnStoppingCriteria",
    "brute_force_qbf",
    "brute_force_sat",
    "context_profile",
    "crop_cache",
    "dpll_trace",
    "extract_subsequences",
    "generate_qbf",
    "generate_sat",
    "generate_seqsum",
    "pencil_generate",
    "pencil_hf_generate",
    "qbf_trace",
    "reduce_full",
    "reduce_once",
    "seqsum_geometry",
    "to_hf_tokenizer",
]

_HF = ("pencil_hf_generate", "ReturnStoppingCriteria", "to_hf_tokenizer")


def __getattr__(name: str) -> object:
    # Lazy: the transformers integration needs the optional dependency (extra [hf]).
    if name in _HF:
        from icml25.llm_efficiency.pencil import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
