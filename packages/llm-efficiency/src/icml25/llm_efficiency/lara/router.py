"""LaRA: Benchmarking Retrieval-Augmented Generation and Long-Context LLMs — ICML 2025, P38: a per-query RAG/LC router.

LaRA finds no universal winner between RAG and long context (LC): the better arm depends on the model's
strength, the context length, the task and the retrieval. The paper gives guidelines
(:func:`guideline_route`); :class:`RagLcRouter` learns the choice per query from logged outcomes of both
arms: two probabilistic classifiers estimate ``P(LC correct | x)`` and ``P(RAG correct | x)`` and a query
goes to LC when the predicted gain exceeds a (cost-weighted) margin. Features known before answering come
from :func:`router_features`: context length and type, cues of the task in the question, the model's
strength (accuracy on a probe set), and the retrieval's evidence (top scores and gap, where the chunks lie,
how much of the question they cover).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from itertools import combinations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from icml25.kernels.checks import check_fitted, check_float, check_int, check_sklearn_array
from icml25.llm_efficiency.lara.data import CONTEXT_TYPES, LaraItem, canonical_task
from icml25.llm_efficiency.lara.retrieval import RetrievedChunk, words

__all__ = [
    "BASE_FEATURES",
    "FEATURE_NAMES",
    "RETRIEVAL_FEATURES",
    "RagLcRouter",
    "guideline_route",
    "question_cues",
    "routed_accuracy",
    "router_features",
]

BASE_FEATURES = (
    "log2_context_tokens",
    *(f"context_{c}" for c in CONTEXT_TYPES),
    "cue_comparison",
    "cue_reasoning",
    "model_strength",
)
RETRIEVAL_FEATURES = (
    "top1_score",
    "top1_top2_gap",
    "top1_bm25",
    "position_spread",
    "position_mean",
    "term_coverage",
    "pair_coverage",
    "best_chunk_coverage",
)
FEATURE_NAMES = (*BASE_FEATURES, *RETRIEVAL_FEATURES)

_CUE_COMPARISON = re.compile(
    r"\b(compar\w*|both|versus|vs|which one|whereas|differ(?:s|ence)? between)\b", re.I
)
_CUE_REASONING = re.compile(
    r"\b(how much|how many more|chang\w*|increas\w*|decreas\w*|difference|total|sum|average|ratio|grow\w*)\b",
    re.I,
)


def question_cues(question: str) -> tuple[float, float]:
    """``(comparison, reasoning)`` cue indicators of a question (LaRA's task types are not given to a user's
    router; their wording is)."""
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    return float(bool(_CUE_COMPARISON.search(question))), float(bool(_CUE_REASONING.search(question)))


def _content_terms(question: str) -> list[str]:
    return sorted({w for w in words(question) if w not in ENGLISH_STOP_WORDS and len(w) > 1})


def router_features(
    item: LaraItem, retrieved: Sequence[RetrievedChunk], n_ctx_tokens: int, model_strength: float
) -> np.ndarray:
    """The router's features of one query (:data:`FEATURE_NAMES`; the last :data:`RETRIEVAL_FEATURES`
    describe the retrieval): ``log2`` context tokens, context-type one-hot, question cues, model strength,
    the top-1 final score and its gap to the second, the top-1 BM25 score, the spread (standard deviation)
    and mean of the retrieved chunks' relative positions, the share of the question's content words found
    in the retrieved chunks, the share of pairs of them found together in one chunk, and the best single
    chunk's share."""
    if not isinstance(item, LaraItem):
        raise TypeError(f"item must be a LaraItem, got {type(item).__name__}")
    if isinstance(retrieved, (str, bytes)) or not isinstance(retrieved, Sequence) or not retrieved:
        raise ValueError("retrieved must be a non-empty sequence of RetrievedChunk")
    if not all(isinstance(c, RetrievedChunk) for c in retrieved):
        raise TypeError("retrieved must hold RetrievedChunk objects (from HybridRetriever)")
    check_int(n_ctx_tokens, "n_ctx_tokens", low=1)
    strength = check_float(model_strength, "model_strength")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(
            f"model_strength must be in [0, 1] (accuracy on a probe set), got {model_strength!r}"
        )
    ranked = sorted(retrieved, key=lambda c: c.rank)
    scores = [c.score for c in ranked]
    positions = np.array([c.position for c in ranked])
    terms = _content_terms(item.question)
    chunk_terms = [set(words(c.text)) for c in ranked]
    union = set().union(*chunk_terms)
    if terms:
        coverage = sum(t in union for t in terms) / len(terms)
        best = max(sum(t in s for t in terms) for s in chunk_terms) / len(terms)
        pairs = list(combinations(terms, 2))
        pair_cov = (
            sum(any(a in s and b in s for s in chunk_terms) for a, b in pairs) / len(pairs)
            if pairs
            else coverage
        )
    else:
        coverage = best = pair_cov = 0.0
    cues = question_cues(item.question)
    return np.array(
        [
            math.log2(n_ctx_tokens),
            *(float(item.context_type == c) for c in CONTEXT_TYPES),
            *cues,
            strength,
            scores[0],
            scores[0] - scores[1] if len(scores) > 1 else 0.0,
            ranked[0].bm25,
            float(positions.std()),
            float(positions.mean()),
            coverage,
            pair_cov,
            best,
        ],
        dtype=np.float64,
    )


def guideline_route(task: str, n_ctx_tokens: int, model_strength: float, *, long_context: int = 64_000,
                    strong: float = 0.7) -> int:  # fmt: skip
    """LaRA's guidelines as a rule (0 = RAG, 1 = LC): a weak model (probe accuracy ``< strong``) → RAG;
    hallucination detection → RAG; comparison and reasoning → LC; otherwise (location) LC for short contexts
    (``< long_context`` tokens) is no better than RAG, so RAG for cost."""
    task = canonical_task(task)
    check_int(n_ctx_tokens, "n_ctx_tokens", low=1)
    strength = check_float(model_strength, "model_strength")
    if strength < strong or task == "hallu":
        return 0
    return 1 if task in ("comp", "reasoning") else 0


def _outcomes(y: object, name: str, n: int | None = None) -> np.ndarray:
    a = np.asarray(y)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be 0/1 or boolean outcomes, got an array of dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one outcome per query), got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} must not be empty")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite 0/1 outcomes, got NaN or Inf")
    if not np.isin(a, (0, 1)).all():
        raise ValueError(f"{name} must hold only 0/1 (or booleans), got values {np.unique(a)[:5].tolist()}")
    if n is not None and a.size != n:
        raise ValueError(f"{name} must have one outcome per row of features ({n}), got {a.size}")
    return a.astype(np.int64)


def routed_accuracy(route: object, lc_correct: object, rag_correct: object) -> float:
    """Accuracy of a routing (1 = LC, 0 = RAG) given both arms' outcomes."""
    r = _outcomes(route, "route")
    lc, rag = _outcomes(lc_correct, "lc_correct", r.size), _outcomes(rag_correct, "rag_correct", r.size)
    return float(np.where(r == 1, lc, rag).mean())


def _features(x: object, n_features: int | None = None, estimator: object = None) -> np.ndarray:
    """``x`` as a float64 ``(queries, features)`` matrix, through scikit-learn's ``check_array`` (its messages,
    naming ``features``: dense, numeric, 2-D, non-empty, finite) and a magnitude bound."""
    a = np.asarray(check_sklearn_array(x, "features", estimator=estimator, dtype="numeric"), dtype=np.float64)
    if np.abs(a).max() > 1e15:
        raise ValueError(f"features must have magnitude <= 1e15, got max |x| = {np.abs(a).max():.3g}")
    if n_features is not None and a.shape[1] != n_features:
        raise ValueError(f"features must have {n_features} columns (as in fit), got {a.shape[1]}")
    return a


class RagLcRouter(ClassifierMixin, BaseEstimator):
    """Per-query router between RAG (0) and long context (1), a scikit-learn estimator.

    ``fit(features, lc_correct, rag_correct)`` fits one clone of ``estimator`` (default: gradient-boosted
    trees) per arm on the logged outcomes; ``predict`` routes to LC where ``P(LC) − P(RAG) > margin +
    cost_weight · extra_cost`` (``extra_cost``: LC's extra cost per query, e.g. tokens / 1e5). For
    ``GridSearchCV``/``cross_val_score`` pass ``y`` as an ``(n, 2)`` array ``[lc_correct, rag_correct]``;
    ``score`` is the routed accuracy.
    """

    def __init__(self, estimator: object = None, margin: float = 0.0, cost_weight: float = 0.0) -> None:
        self.estimator = estimator
        self.margin = margin
        self.cost_weight = cost_weight

    def _split_y(self, lc_correct: object, rag_correct: object, n: int) -> tuple[np.ndarray, np.ndarray]:
        if rag_correct is None:
            if lc_correct is None:
                raise ValueError(
                    "lc_correct must be given: RagLcRouter requires y to be passed, but the target y is None"
                )
            y = np.asarray(lc_correct)
            if y.ndim != 2 or y.shape[1] != 2:
                raise ValueError(
                    "lc_correct must be 1-D with rag_correct given, or an (n, 2) array [lc_correct, rag_correct]; "
                    f"got shape {y.shape} and rag_correct=None"
                )
            lc_correct, rag_correct = y[:, 0], y[:, 1]
        return _outcomes(lc_correct, "lc_correct", n), _outcomes(rag_correct, "rag_correct", n)

    def fit(self, features: object, lc_correct: object, rag_correct: object = None) -> RagLcRouter:
        x = _features(features, estimator=self)
        lc, rag = self._split_y(lc_correct, rag_correct, x.shape[0])
        for name, y in (("lc_correct", lc), ("rag_correct", rag)):
            if np.unique(y).size < 2:
                raise ValueError(
                    f"{name} must hold both outcomes (0 and 1) to learn P(correct); got only {int(y[0])} "
                    f"for all {y.size} queries"
                )
        for name in ("margin", "cost_weight"):
            check_float(getattr(self, name), name)
        base = (
            self.estimator
            if self.estimator is not None
            else HistGradientBoostingClassifier(max_depth=3, max_iter=100, learning_rate=0.1, random_state=0)
        )
        if not (hasattr(base, "fit") and hasattr(base, "predict_proba")):
            raise TypeError(
                f"estimator must be a classifier with fit and predict_proba, got {type(base).__name__}"
            )
        models = (clone(base).fit(x, lc), clone(base).fit(x, rag))
        self.lc_model_, self.rag_model_ = models
        self.n_features_in_ = x.shape[1]
        self.classes_ = np.array([0, 1])
        return self

    def predict_gain(self, features: object) -> np.ndarray:
        """``P(LC correct) − P(RAG correct)`` per query."""
        check_fitted(self, "lc_model_")
        x = _features(features, self.n_features_in_, self)
        return self.lc_model_.predict_proba(x)[:, 1] - self.rag_model_.predict_proba(x)[:, 1]

    def predict_proba(self, features: object) -> np.ndarray:
        """``[(1 − g) / 2, (1 + g) / 2]`` with ``g`` the predicted gain (a score in [0, 1] for LC)."""
        g = self.predict_gain(features)
        return np.stack([(1 - g) / 2, (1 + g) / 2], axis=1)

    def predict(self, features: object, extra_cost: object = None) -> np.ndarray:
        """1 (LC) where the predicted gain exceeds ``margin + cost_weight · extra_cost``, else 0 (RAG)."""
        gain = self.predict_gain(features)
        threshold = np.full_like(gain, check_float(self.margin, "margin"))
        if extra_cost is not None:
            c = np.asarray(extra_cost, dtype=np.float64)
            if c.shape not in ((), gain.shape) or not np.isfinite(c).all():
                raise ValueError(
                    f"extra_cost must be finite, a scalar or shape {gain.shape}, got shape {c.shape}"
                )
            threshold = threshold + check_float(self.cost_weight, "cost_weight") * c
        return (gain > threshold).astype(np.int64)

    def score(self, features: object, y: object, sample_weight: object = None) -> float:
        """Routed accuracy on ``y = [lc_correct, rag_correct]`` (an ``(n, 2)`` array)."""
        x = _features(features)
        lc, rag = self._split_y(y, None, x.shape[0])
        return routed_accuracy(self.predict(x), lc, rag)
