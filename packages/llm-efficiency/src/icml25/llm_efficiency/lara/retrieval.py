"""LaRA: Benchmarking Retrieval-Augmented Generation and Long-Context LLMs — ICML 2025, P38: chunking and hybrid retrieval of the RAG arm.

As in the official ``evaluation/eval_rag.py`` and ``search/simpleHybridSearcher.py`` (Alibaba-NLP/LaRA):
chunks of 600 tokens with 100 tokens of overlap; ``k = 5`` candidates, ``vector_ratio = 0.5`` of them
(``int(k · ratio)`` = 2) from a dense embedder and the rest (3) from BM25, then an optional cross-encoder
rerank. Our :class:`Chunker` is an exact token window (the official ``SentenceSplitter`` also snaps to
sentence ends); BM25 is Okapi (``k1 = 1.5``, ``b = 0.75``) and the default dense scorer is TF-IDF cosine,
both over the terms of :func:`~icml25.llm_efficiency.common.retrieval.words`; any embedder ``texts -> (n, d)`` (e.g. ``SentenceTransformer(...).encode``) and reranker
``(question, texts) -> scores`` (e.g. a ``CrossEncoder``'s ``predict`` on pairs) plug in.
"""

from __future__ import annotations

import math
import numbers
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

from icml25.kernels.checks import check_float, check_int
from icml25.llm_efficiency.common.retrieval import embedding_scores, words

__all__ = [
    "Chunker",
    "DocIndex",
    "HybridRetriever",
    "LlamaIndexRetriever",
    "RetrievedChunk",
    "TextChunk",
    "words",
]

_TOKEN = re.compile(r"\S+")


@dataclass(frozen=True)
class TextChunk:
    """Chunk ``index`` of a document: tokens ``[token_start, token_end)``, characters ``[char_start, char_end)``."""

    index: int
    text: str
    token_start: int
    token_end: int
    char_start: int
    char_end: int


@dataclass(frozen=True)
class RetrievedChunk:
    """A retrieved chunk, its rank (0 = best), final ``score`` (rerank score, else the fused score), its raw
    ``bm25`` and ``dense`` scores, ``source`` (``"dense"`` or ``"bm25"``: the list that nominated it) and
    ``position`` in the document (``chunk.index / (n_chunks − 1)``, 0 for a single chunk)."""

    chunk: TextChunk
    rank: int
    score: float
    bm25: float
    dense: float
    source: str
    position: float

    @property
    def text(self) -> str:
        return self.chunk.text


class Chunker:
    """Token windows of ``chunk_tokens`` tokens, consecutive windows sharing exactly ``overlap`` tokens.

    ``tokenizer``: None (whitespace-separated tokens) or a Hugging Face *fast* tokenizer (character offsets
    through ``return_offsets_mapping``). Window ``i`` starts at token ``i·(chunk_tokens − overlap)``; the
    last window ends at the document's last token, so the chunks cover the whole document. A chunk's text
    is the document's span from its first token's start to its last token's end.
    """

    def __init__(self, tokenizer: Any = None, chunk_tokens: int = 600, overlap: int = 100) -> None:
        self.chunk_tokens = check_int(chunk_tokens, "chunk_tokens", low=1)
        self.overlap = check_int(overlap, "overlap", low=0)
        if self.overlap >= self.chunk_tokens:
            raise ValueError(f"overlap must be < chunk_tokens ({self.chunk_tokens}), got {self.overlap}")
        if tokenizer is not None and not callable(tokenizer):
            raise TypeError(
                f"tokenizer must be None or a Hugging Face fast tokenizer, got {type(tokenizer).__name__}"
            )
        self.tokenizer = tokenizer

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the tokens of ``text``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.tokenizer is None:
            return [m.span() for m in _TOKEN.finditer(text)]
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(a), int(b)) for a, b in enc["offset_mapping"] if b > a]

    def count(self, text: str) -> int:
        """Number of tokens of ``text``."""
        return len(self.spans(text))

    def __call__(self, text: str) -> list[TextChunk]:
        spans = self.spans(text)
        if not spans:
            raise ValueError("text must hold at least one token, got an empty or blank document")
        n, size, stride = len(spans), self.chunk_tokens, self.chunk_tokens - self.overlap
        out, start = [], 0
        while True:
            end = min(start + size, n)
            a, b = spans[start][0], spans[end - 1][1]
            out.append(TextChunk(len(out), text[a:b], start, end, a, b))
            if end == n:
                return out
            start += stride


def _minmax(x: np.ndarray) -> np.ndarray:
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


class DocIndex:
    """A document's chunks with their lexical statistics, built once and queried many times:
    term counts (for BM25) and a TF-IDF model (the default dense scorer)."""

    def __init__(self, chunks: Sequence[TextChunk]) -> None:
        if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Sequence) or not chunks:
            raise ValueError("chunks must be a non-empty sequence of TextChunk")
        if not all(isinstance(c, TextChunk) for c in chunks):
            raise TypeError("chunks must hold TextChunk objects (from Chunker)")
        self.chunks = list(chunks)
        texts = [c.text for c in self.chunks]
        self._counter = CountVectorizer(tokenizer=words, lowercase=False, token_pattern=None)
        try:
            self.counts = self._counter.fit_transform(texts).tocsc()
        except ValueError:  # no term at all (punctuation only)
            self._counter, self.counts = None, None
        self.lengths = np.array([len(words(t)) for t in texts], dtype=np.float64)
        self._tfidf = TfidfVectorizer(tokenizer=words, lowercase=False, token_pattern=None)
        self.tfidf = self._tfidf.fit_transform(texts) if self._counter is not None else None

    def __len__(self) -> int:
        return len(self.chunks)

    def bm25(self, question: str, k1: float = 1.5, b: float = 0.75) -> np.ndarray:
        """Okapi BM25 of every chunk for ``question`` over lower-cased ``\\w+`` terms:
        ``Σ_t idf(t)·tf·(k1 + 1) / (tf + k1·(1 − b + b·len/avglen))``, ``idf = ln(1 + (N − df + 0.5) / (df + 0.5))``
        (the formula of :func:`~icml25.llm_efficiency.rapid.bm25_scores`, vectorised over a sparse index)."""
        out = np.zeros(len(self.chunks))
        if self._counter is None:
            return out
        vocab = self._counter.vocabulary_
        n, avg = len(self.chunks), float(self.lengths.mean()) or 1.0
        norm = k1 * (1 - b + b * self.lengths / avg)
        for t in set(words(question)):
            j = vocab.get(t)
            if j is None:
                continue
            col = self.counts[:, j]
            tf = col.toarray().ravel()
            df = col.nnz
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            out += idf * tf * (k1 + 1) / (tf + norm)
        return out

    def tfidf_cosine(self, question: str) -> np.ndarray:
        """Cosine of the question's and each chunk's TF-IDF vectors (scikit-learn's smoothed idf, l2 norm)."""
        if self.tfidf is None:
            return np.zeros(len(self.chunks))
        q = self._tfidf.transform([question])
        return np.asarray((self.tfidf @ q.T).todense()).ravel()


class HybridRetriever:
    """BM25 + dense hybrid retrieval of LaRA's RAG arm; ``retriever(doc, question) -> list[RetrievedChunk]``.

    ``int(k · vector_ratio)`` candidates are the dense top chunks; the remaining ``k`` are filled from the
    BM25 ranking, skipping chunks already nominated, so exactly ``min(k, n_chunks)`` unique chunks return
    (``k > n_chunks`` warns). Order: by ``rerank(question, texts)`` when given (official: GTE reranker),
    else by the fused score ``(1 − vector_ratio)·minmax(bm25) + vector_ratio·minmax(dense)``.

    Args:
        k: chunks returned (official ``rerank_size`` 5).
        vector_ratio: share of dense candidates (official 0.5), in ``[0, 1]``.
        embed: dense embedder ``texts -> array (n, d)`` scored by cosine; None: TF-IDF cosine.
        rerank: ``(question, texts) -> scores`` (higher is better), or None.
        chunker: splits a ``str`` document (default ``Chunker()``: 600 tokens, overlap 100).
    """

    def __init__(
        self,
        k: int = 5,
        vector_ratio: float = 0.5,
        embed: Callable[[list[str]], Any] | None = None,
        rerank: Callable[[str, list[str]], Any] | None = None,
        chunker: Chunker | None = None,
    ) -> None:
        self.k = check_int(k, "k", low=1)
        self.vector_ratio = check_float(vector_ratio, "vector_ratio", low=0.0, high=1.0)
        for name, fn in (("embed", embed), ("rerank", rerank)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be None or a callable, got {type(fn).__name__}")
        if chunker is not None and not isinstance(chunker, Chunker):
            raise TypeError(f"chunker must be a Chunker or None, got {type(chunker).__name__}")
        self.embed, self.rerank = embed, rerank
        self.chunker = chunker or Chunker()

    def _dense(self, index: DocIndex, question: str) -> np.ndarray:
        if self.embed is None:
            return index.tfidf_cosine(question)
        return embedding_scores(self.embed, [c.text for c in index.chunks], question, "embed")

    def index(self, doc: str | Sequence[TextChunk] | DocIndex) -> DocIndex:
        """The :class:`DocIndex` of a document (``str``: chunked by ``chunker``), to query many times."""
        if isinstance(doc, DocIndex):
            return doc
        if isinstance(doc, str):
            return DocIndex(self.chunker(doc))
        if isinstance(doc, Sequence) and doc and all(isinstance(c, TextChunk) for c in doc):
            return DocIndex(doc)
        raise TypeError(
            f"doc must be a str, a non-empty sequence of TextChunk or a DocIndex, got {type(doc).__name__}"
        )

    def __call__(self, doc: str | Sequence[TextChunk] | DocIndex, question: str) -> list[RetrievedChunk]:
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty str, got {question!r}")
        index = self.index(doc)
        chunks = index.chunks
        texts = [c.text for c in chunks]
        n = len(chunks)
        k = self.k
        if k > n:
            warnings.warn(f"k={k} exceeds the {n} chunks of the document: returning all {n}", stacklevel=2)
            k = n
        bm25 = index.bm25(question)
        dense = self._dense(index, question)
        n_dense = int(k * self.vector_ratio)
        chosen = [int(i) for i in np.argsort(-dense, kind="stable")[:n_dense]]
        source = dict.fromkeys(chosen, "dense")
        for i in np.argsort(-bm25, kind="stable"):
            if len(chosen) == k:
                break
            if int(i) not in source:
                chosen.append(int(i))
                source[int(i)] = "bm25"
        fused = (1 - self.vector_ratio) * _minmax(bm25) + self.vector_ratio * _minmax(dense)
        if self.rerank is not None:
            raw = np.asarray(self.rerank(question, [texts[i] for i in chosen]), dtype=np.float64).reshape(-1)
            if raw.shape != (len(chosen),) or not np.isfinite(raw).all():
                raise ValueError(
                    f"rerank must return {len(chosen)} finite scores for {len(chosen)} chunks, got shape "
                    f"{raw.shape}"
                )
            final = dict(zip(chosen, raw.tolist(), strict=True))
        else:
            final = {i: float(fused[i]) for i in chosen}
        order = sorted(chosen, key=lambda i: (-final[i], i))
        denom = max(n - 1, 1)
        return [
            RetrievedChunk(
                chunks[i],
                r,
                float(final[i]),
                float(bm25[i]),
                float(dense[i]),
                source[i],
                chunks[i].index / denom,
            )
            for r, i in enumerate(order)
        ]

    def __repr__(self) -> str:
        return f"HybridRetriever(k={self.k}, vector_ratio={self.vector_ratio}, embed={self.embed!r}, rerank={self.rerank!r})"


class LlamaIndexRetriever:
    """Any llama-index retriever as a LaRA retriever (LaRA's own RAG arm runs on llama-index).

    ``build(document) -> retriever`` makes a retriever over one document, e.g. ``lambda doc:
    VectorStoreIndex.from_documents([Document(text=doc)]).as_retriever(similarity_top_k=5)``; it is called
    once per document (the last one is cached). ``retriever(doc, question)`` calls ``retrieve(question)`` and
    maps each returned ``NodeWithScore`` to a :class:`RetrievedChunk` in the returned order: text
    ``node.get_content()``, score ``score`` (None → 0), ``position`` from the node's ``start_char_idx`` when
    known (else 0), ``bm25 = dense = score``, ``source = "llama_index"``.
    """

    def __init__(self, build: Callable[[str], Any]) -> None:
        if not callable(build):
            raise TypeError(
                f"build must be a callable document -> llama-index retriever, got {type(build).__name__}"
            )
        self.build = build
        self._cache: tuple[str, Any] | None = None

    def __call__(self, doc: str, question: str) -> list[RetrievedChunk]:
        if not isinstance(doc, str):
            raise TypeError(f"doc must be the document text (str), got {type(doc).__name__}")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty str, got {question!r}")
        if self._cache is None or self._cache[0] != doc:
            retriever = self.build(doc)
            if not hasattr(retriever, "retrieve"):
                raise TypeError(
                    f"build must return an object with retrieve(query), got {type(retriever).__name__}"
                )
            self._cache = (doc, retriever)
        nodes = list(self._cache[1].retrieve(question))
        if not nodes:
            raise ValueError(f"the llama-index retriever returned no nodes for {question!r}")
        out = []
        for rank, hit in enumerate(nodes):
            node = getattr(hit, "node", hit)
            text = node.get_content() if hasattr(node, "get_content") else str(getattr(node, "text", ""))
            score = getattr(hit, "score", None)
            score = 0.0 if score is None else float(score)
            if not math.isfinite(score):
                raise ValueError(f"the llama-index retriever returned a non-finite score for node {rank}")
            start = getattr(node, "start_char_idx", None)
            start = int(start) if isinstance(start, numbers.Integral) else -1
            end = start + len(text) if start >= 0 else -1
            position = min(1.0, start / max(len(doc) - 1, 1)) if start >= 0 else 0.0
            chunk = TextChunk(rank, text, -1, -1, start, end)
            out.append(RetrievedChunk(chunk, rank, score, score, score, "llama_index", position))
        return out
