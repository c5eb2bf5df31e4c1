"""RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding — ICML 2025, P03: chunking and retrieval of the RAG drafter's context.

As in the official ``src/rag.py`` (John-AI-Lab/RAPID): the long context is split into chunks of at most
``max_tokens`` tokens by a recursive splitter (paragraph, line, sentence, clause, space, character; no
overlap), chunks are scored against the query, the top ``k`` whose score reaches ``threshold`` are kept
(none passing: the best one), **re-sorted by their position in the context** and joined with blank lines.

Scorers are pluggable and dependency-free by default: ``"bm25"`` (Okapi BM25), ``"tfidf"`` (cosine of
TF-IDF vectors), or any dense embedder ``embed(texts) -> array (n, d)`` scored by cosine similarity (the
paper uses BGE-M3, e.g. ``SentenceTransformer("BAAI/bge-m3").encode``; threshold 0.3 in the README).
:func:`tfidf_scores` and :func:`bm25_scores` also take pre-tokenized documents (lists of token ids).
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from icml25.kernels.checks import check_array, check_float, check_int
from icml25.llm_efficiency.common.retrieval import embedding_scores, words

__all__ = ["Chunk", "bm25_scores", "chunk_text", "retrieve", "select_chunks", "tfidf_scores"]

SEPARATORS = ("\n\n", "\n", ". ", "! ", "? ", "; ", ", ", "。", "！", "？", "；", "，", " ", "")


@dataclass(frozen=True)
class Chunk:
    """One chunk of a long context: its ``text`` and the character offset ``start`` where it begins."""

    text: str
    start: int


def _token_counter(tokenizer: Any) -> Callable[[str], int]:
    if tokenizer is None:
        return lambda s: len(s.split())
    if hasattr(tokenizer, "encode"):  # a Hugging Face tokenizer (or anything with encode)
        try:
            tokenizer.encode("a", add_special_tokens=False)
            return lambda s: len(tokenizer.encode(s, add_special_tokens=False))
        except TypeError:
            return lambda s: len(tokenizer.encode(s))
    if callable(tokenizer):
        return lambda s: len(tokenizer(s))
    raise TypeError(
        "tokenizer must be None (whitespace words), a tokenizer with encode(text), or a callable text -> tokens; "
        f"got {type(tokenizer).__name__}"
    )


def _pieces(text: str, lo: int, hi: int, sep: str) -> list[tuple[int, int]]:
    """``text[lo:hi]`` split after each ``sep`` (the separator stays with the preceding piece)."""
    if sep == "":
        return [(i, i + 1) for i in range(lo, hi)]
    out, i = [], lo
    while i < hi:
        j = text.find(sep, i, hi)
        end = hi if j < 0 else j + len(sep)
        out.append((i, end))
        i = end
    return out


def _split(text: str, lo: int, hi: int, seps: Sequence[str], max_tokens: int, count) -> list[tuple[int, int]]:
    level = next(i for i, s in enumerate(seps) if s == "" or text.find(s, lo, hi) >= 0)
    rest = seps[level + 1 :]
    spans: list[tuple[int, int]] = []
    cur: list[int] | None = None  # [start, end, tokens]
    for a, b in _pieces(text, lo, hi, seps[level]):
        n = count(text[a:b])
        if n > max_tokens and rest:
            if cur is not None:
                spans.append((cur[0], cur[1]))
                cur = None
            spans += _split(text, a, b, rest, max_tokens, count)
            continue
        if cur is not None and cur[2] + n > max_tokens:
            spans.append((cur[0], cur[1]))
            cur = None
        if cur is None:
            cur = [a, b, n]
        else:
            cur[1], cur[2] = b, cur[2] + n
    if cur is not None:
        spans.append((cur[0], cur[1]))
    return spans


def chunk_text(text: str, tokenizer: Any = None, max_tokens: int = 512) -> list[Chunk]:
    """Split ``text`` into chunks of at most ``max_tokens`` tokens (recursive separators, no overlap).

    Separators, in order (official): ``"\\n\\n"``, ``"\\n"``, ``". "``, ``"! "``, ``"? "``, ``"; "``, ``", "``, the
    Chinese ``。！？；，``, ``" "``, then single characters. Pieces are merged greedily while the sum of their
    token counts stays within the budget (the rule of langchain's recursive splitter the official code uses);
    a separator stays with the piece before it. Chunks are stripped of surrounding whitespace, and
    ``text[chunk.start:].startswith(chunk.text)`` holds.

    Args:
        text: the long context.
        tokenizer: None (whitespace-separated words), a Hugging Face tokenizer, or a callable ``text -> tokens``.
        max_tokens: token budget per chunk (official README 512; ``get_rag_context`` default 128).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    max_tokens = check_int(max_tokens, "max_tokens", low=1)
    count = _token_counter(tokenizer)
    chunks = []
    for a, b in _split(text, 0, len(text), SEPARATORS, int(max_tokens), count):
        piece = text[a:b]
        stripped = piece.strip()
        if stripped:
            chunks.append(Chunk(stripped, a + (len(piece) - len(piece.lstrip()))))
    return chunks


def _check_docs(documents: object, query: object) -> tuple[list[list[Hashable]], list[Hashable]]:
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence):
        raise TypeError(f"documents must be a sequence of token sequences, got {type(documents).__name__}")
    if len(documents) == 0:
        raise ValueError("documents must hold at least one document, got an empty sequence")
    docs = []
    for i, d in enumerate(documents):
        if isinstance(d, (str, bytes)) or not isinstance(d, (Sequence, np.ndarray)):
            raise TypeError(f"documents[{i}] must be a sequence of terms (tokens), got {type(d).__name__}")
        docs.append([t.item() if isinstance(t, np.generic) else t for t in d])
    if isinstance(query, (str, bytes)) or not isinstance(query, (Sequence, np.ndarray)):
        raise TypeError(f"query must be a sequence of terms (tokens), got {type(query).__name__}")
    return docs, [t.item() if isinstance(t, np.generic) else t for t in query]


def tfidf_scores(documents: Sequence[Sequence[Hashable]], query: Sequence[Hashable]) -> np.ndarray:
    """Cosine similarity in ``[0, 1]`` between the TF-IDF vectors of the query and of each document.

    Raw term counts times the smoothed idf ``ln((1 + N) / (1 + df)) + 1`` (scikit-learn's default),
    L2-normalised; an empty document or a query without terms scores 0.
    """
    docs, q = _check_docs(documents, query)
    n = len(docs)
    df = Counter(t for d in docs for t in set(d))
    idf = {t: math.log((1 + n) / (1 + c)) + 1.0 for t, c in df.items()}

    def vec(terms: list[Hashable]) -> dict[Hashable, float]:
        v = {t: c * idf.get(t, math.log(1 + n) + 1.0) for t, c in Counter(terms).items()}
        norm = math.sqrt(sum(x * x for x in v.values()))
        return {t: x / norm for t, x in v.items()} if norm > 0 else {}

    qv = vec(q)
    return np.array([sum(w * qv.get(t, 0.0) for t, w in vec(d).items()) for d in docs], dtype=np.float64)


def bm25_scores(
    documents: Sequence[Sequence[Hashable]], query: Sequence[Hashable], k1: float = 1.5, b: float = 0.75
) -> np.ndarray:
    """Okapi BM25 score (``≥ 0``, unbounded) of each document for the query.

    ``idf = ln(1 + (N − df + 0.5) / (df + 0.5))`` (non-negative), term saturation ``k1``, length
    normalisation ``b`` (defaults of ``rank_bm25.BM25Okapi``).
    """
    docs, q = _check_docs(documents, query)
    k1, b = check_float(k1, "k1", low=0.0), check_float(b, "b", low=0.0, high=1.0)
    n = len(docs)
    lengths = np.array([len(d) for d in docs], dtype=np.float64)
    avg = float(lengths.mean()) or 1.0
    df = Counter(t for d in docs for t in set(d))
    counts = [Counter(d) for d in docs]
    out = np.zeros(n)
    for t in set(q):
        if t not in df:
            continue
        idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
        tf = np.array([c.get(t, 0) for c in counts], dtype=np.float64)
        out += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * lengths / avg))
    return out


def select_chunks(scores: Sequence[float] | np.ndarray, k: int, threshold: float | None = None) -> list[int]:
    """Indices of the kept chunks, **in their original order**: the top ``k`` by score (ties: earlier
    first) with score ``≥ threshold``; when none passes, the single best (official pitfall: never empty).
    ``k`` larger than the number of chunks keeps them all."""
    s = check_array(scores, "scores", ndim=1, dtype=("float", "int", "bool"), non_empty=True).astype(
        np.float64
    )
    k = check_int(k, "k", low=1)
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or math.isnan(threshold)
    ):
        raise ValueError(f"threshold must be a real number or None, got {threshold!r}")
    order = np.argsort(-s, kind="stable")[: int(k)]
    kept = [int(i) for i in order if threshold is None or s[i] >= threshold]
    return sorted(kept or [int(order[0])])


def retrieve(
    chunks: Sequence[Chunk | str],
    query: str,
    *,
    k: int,
    scorer: str | Callable[[list[str]], Any] = "bm25",
    threshold: float | None = None,
    tokenize: Callable[[str], Sequence[Hashable]] | None = None,
) -> str:
    """The RAG drafter's context: the selected chunks (:func:`select_chunks`) in original order, joined by
    blank lines.

    Args:
        chunks: :class:`Chunk` objects (from :func:`chunk_text`) or strings, in context order.
        query: the question.
        k: chunks to keep (official: ``ceil(target_rag_len / chunk_tokens)``, README 8192/512 = 16).
        scorer: ``"bm25"`` (default, dependency-free), ``"tfidf"``, or an embedder ``texts -> (n, d) array``
            scored by cosine similarity (official: BGE-M3 through sentence-transformers).
        threshold: minimum score to keep a chunk (official 0.3 for BGE-M3 cosine); None keeps the top ``k``.
        tokenize: terms of a text for the lexical scorers (default: lower-cased ``\\w+`` words).
    """
    if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Sequence) or len(chunks) == 0:
        raise ValueError("chunks must be a non-empty sequence of Chunk or str")
    texts = []
    for i, c in enumerate(chunks):
        if isinstance(c, Chunk):
            texts.append(c.text)
        elif isinstance(c, str):
            texts.append(c)
        else:
            raise TypeError(f"chunks[{i}] must be a Chunk or str, got {type(c).__name__}")
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if isinstance(scorer, str):
        if scorer not in ("bm25", "tfidf"):
            raise ValueError(f"scorer must be 'bm25', 'tfidf' or an embedding callable, got {scorer!r}")
        terms = tokenize or words
        docs = [list(terms(t)) for t in texts]
        fn = bm25_scores if scorer == "bm25" else tfidf_scores
        scores = fn(docs, list(terms(query)))
    elif callable(scorer):
        scores = embedding_scores(scorer, texts, query)
    else:
        raise TypeError(f"scorer must be 'bm25', 'tfidf' or a callable, got {type(scorer).__name__}")
    return "\n\n".join(texts[i] for i in select_chunks(scores, k, threshold))
