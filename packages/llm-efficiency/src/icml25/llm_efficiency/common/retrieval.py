"""The dense and lexical retrieval primitives shared by RAPID (P03) and LaRA (P38).

Chen et al., "RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding" (P03) select the
RAG drafter's chunks, and Li et al., "LaRA: Benchmarking Retrieval-Augmented Generation and Long-Context
LLMs" (P38) rank the chunks of their RAG arm, with the same two pieces:

* :func:`embedding_scores`: cosine similarity of a query to texts under any dense embedder
  ``embed(texts) -> (n, d)`` (e.g. ``SentenceTransformer(...).encode``);
* :func:`words`: the lower-cased ``\\w+`` terms the lexical scorers (BM25, TF-IDF) count.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["embedding_scores", "words"]

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """Lower-cased ``\\w+`` terms of ``text`` (the lexical scorers' tokenizer)."""
    return _WORD.findall(text.lower())


def embedding_scores(
    embed: Callable[[list[str]], Any], texts: Sequence[str], query: str, name: str = "scorer"
) -> np.ndarray:
    """Cosine similarity of ``query`` to each of ``texts`` under a dense embedder ``embed(texts) -> (n, d)``
    (called once on ``[*texts, query]``; zero vectors score 0). ``name`` is the argument named in errors."""
    emb = np.asarray(embed([*texts, query]), dtype=np.float64)
    if emb.ndim != 2 or emb.shape[0] != len(texts) + 1:
        raise ValueError(
            f"{name} must return an array of shape ({len(texts) + 1}, dim) for {len(texts) + 1} texts, "
            f"got shape {emb.shape}"
        )
    if not np.isfinite(emb).all():
        raise ValueError(f"{name} returned non-finite embeddings")
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    emb = emb / np.where(norms > 0, norms, 1.0)
    return emb[:-1] @ emb[-1]
