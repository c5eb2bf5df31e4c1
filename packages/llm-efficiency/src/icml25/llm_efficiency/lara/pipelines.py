"""LaRA: Benchmarking Retrieval-Augmented Generation and Long-Context LLMs — ICML 2025, P38: the two solvers (RAG and long context) and their evaluation.

Prompts as in the official ``evaluation/prompt.py`` (Alibaba-NLP/LaRA): the long-context (LC) arm reads
"Read the {book | papers | financial statement} below and answer a question." + the whole document + the
question + "Be concise."; the RAG arm reads "Here are some chunks retrieved from a {...}. Read these chunks to
answer a question." + ``chunk i: text.`` lines in rank order + the question + "Be concise.". A generator is
any callable ``messages -> str`` (an API client, a vLLM client, a test double) or :class:`HFGenerator` over
a transformers causal LM (extra ``[hf]``). Long contexts are never truncated silently: a prompt over the
window raises unless ``truncate="middle"`` is asked for, and truncation is recorded in every row.
"""

from __future__ import annotations

import logging
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from icml25.llm_efficiency.lara.data import LaraItem, read_document
from icml25.llm_efficiency.lara.judge import Judge
from icml25.llm_efficiency.lara.retrieval import HybridRetriever, RetrievedChunk

__all__ = ["HFGenerator", "build_prompt", "evaluate_arm", "fit_context", "score_predictions"]

log = logging.getLogger(__name__)

DOC_NOUN = {"book": "book", "paper": "papers", "financial": "financial statement"}
ARMS = ("rag", "lc")


def _doc_noun(context_type: str) -> str:
    return DOC_NOUN.get(context_type, "document")


def fit_context(
    text: str,
    window: int | None,
    count_tokens: Callable[[str], int] | None = None,
    truncate: Literal["middle"] | None = None,
) -> tuple[str, bool]:
    """``(text, truncated)``: ``text`` if it has at most ``window`` tokens (``count_tokens``, default
    whitespace tokens); else a ``ValueError`` unless ``truncate="middle"``, which keeps the first and last
    halves of the budget (whitespace tokens) joined by ``" ... "``."""
    if window is None:
        return text, False
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"window must be an int >= 1 or None, got {window!r}")
    if truncate not in (None, "middle"):
        raise ValueError(f"truncate must be None or 'middle', got {truncate!r}")
    count = count_tokens or (lambda s: len(s.split()))
    n = count(text)
    if n <= window:
        return text, False
    if truncate is None:
        raise ValueError(
            f"the long context has {n} tokens, more than the window of {window}: choose documents that fit "
            "(as LaRA does) or pass truncate='middle' to cut the middle explicitly"
        )
    toks = text.split()
    keep = max(1, int(len(toks) * window / n) - 1)
    head = keep // 2
    out = " ".join(toks[:head]) + " ... " + " ".join(toks[len(toks) - (keep - head) :])
    while count(out) > window and keep > 1:
        keep -= max(1, keep // 20)
        head = keep // 2
        out = " ".join(toks[:head]) + " ... " + " ".join(toks[len(toks) - (keep - head) :])
    return out, True


def build_prompt(
    item: LaraItem,
    arm: Literal["rag", "lc"],
    chunks: Sequence[RetrievedChunk | str] | None = None,
    document: str | None = None,
) -> list[dict[str, str]]:
    """Chat messages of one query: ``arm="rag"`` needs the retrieved ``chunks`` (rank order kept), ``"lc"``
    the whole ``document``."""
    if not isinstance(item, LaraItem):
        raise TypeError(f"item must be a LaraItem, got {type(item).__name__}")
    noun = _doc_noun(item.context_type)
    if arm == "lc":
        if not isinstance(document, str):
            raise ValueError(f"arm='lc' needs the whole document as a str, got {type(document).__name__}")
        body = f"Read the {noun} below and answer a question.\n\n{document}\n\nQuestion: {item.question}\nBe concise."
    elif arm == "rag":
        if chunks is None or isinstance(chunks, str) or not isinstance(chunks, Sequence) or not chunks:
            raise ValueError("arm='rag' needs a non-empty sequence of retrieved chunks")
        lines = []
        for i, c in enumerate(chunks, 1):
            text = c.text if isinstance(c, RetrievedChunk) else c
            if not isinstance(text, str):
                raise TypeError(f"chunks[{i - 1}] must be a RetrievedChunk or str, got {type(c).__name__}")
            lines.append(f"chunk {i}: {text.strip()}.")
        body = (
            f"Here are some chunks retrieved from a {noun}. Read these chunks to answer a question.\n\n"
            + "\n".join(lines)
            + f"\n\nQuestion: {item.question}\nBe concise."
        )
    else:
        raise ValueError(f"arm must be 'rag' or 'lc', got {arm!r}")
    return [{"role": "user", "content": body}]


def _document(documents: str | Path | Mapping[Any, str], item: LaraItem) -> str:
    if isinstance(documents, (str, Path)):
        return read_document(documents, item)
    key = (item.length, item.context_type, item.doc_id)
    if key in documents:
        return documents[key]
    if item.doc_id in documents:
        return documents[item.doc_id]
    raise KeyError(f"documents has no text for {key} (keys: (length, context_type, doc_id) or doc_id)")


def evaluate_arm(
    items: Sequence[LaraItem],
    generate: Callable[[list[dict[str, str]]], str],
    arm: Literal["rag", "lc"],
    judge: Judge | None,
    *,
    documents: str | Path | Mapping[Any, str],
    retriever: Callable[[str, str], list[RetrievedChunk]] | None = None,
    window: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
    truncate: Literal["middle"] | None = None,
) -> list[dict[str, Any]]:
    """Run one arm over ``items``: one row per item with its fields, ``arm``, ``prediction``, ``truncated``,
    the retrieved chunk indices (RAG) and, when ``judge`` is given, ``correct`` (``judge=None`` stores
    predictions only; judge them later with :func:`score_predictions`). An empty prediction is scored
    incorrect and logged. ``documents``: a local LaRA root (``load_lara``'s) or a mapping
    ``(length, context_type, doc_id)`` or ``doc_id`` → text. ``retriever`` (RAG arm): any
    ``retriever(document, question) -> list[RetrievedChunk]`` (default :class:`HybridRetriever`, or a
    :class:`LlamaIndexRetriever`). ``window`` (LC arm): see :func:`fit_context`."""
    if arm not in ARMS:
        raise ValueError(f"arm must be 'rag' or 'lc', got {arm!r}")
    if not callable(generate):
        raise TypeError(f"generate must be a callable messages -> str, got {type(generate).__name__}")
    if judge is not None and not callable(judge):
        raise TypeError(
            f"judge must be None or a callable (question, answer, prediction, task) -> bool, got {judge!r}"
        )
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise ValueError("items must be a non-empty sequence of LaraItem")
    if arm == "rag" and retriever is None:
        retriever = HybridRetriever()
    rows = []
    for i, item in enumerate(items):
        if not isinstance(item, LaraItem):
            raise TypeError(f"items[{i}] must be a LaraItem, got {type(item).__name__}")
        doc = _document(documents, item)
        truncated, retrieved = False, None
        if arm == "lc":
            doc, truncated = fit_context(doc, window, count_tokens, truncate)
            messages = build_prompt(item, "lc", document=doc)
        else:
            retrieved = retriever(doc, item.question)
            messages = build_prompt(item, "rag", chunks=retrieved)
        prediction = generate(messages)
        if not isinstance(prediction, str):
            raise TypeError(f"generate must return a str, got {type(prediction).__name__} for items[{i}]")
        if not prediction.strip():
            log.warning("empty prediction for items[%d] (%s arm)", i, arm)
        row = {**item.to_record(), "arm": arm, "prediction": prediction, "truncated": truncated}
        if retrieved is not None:
            row["chunks"] = [c.chunk.index for c in retrieved]
        rows.append(row)
    if any(r["truncated"] for r in rows):
        warnings.warn(
            f"{sum(r['truncated'] for r in rows)} of {len(rows)} long contexts were truncated in the middle "
            "(truncate='middle'): LC results are not comparable with untruncated runs",
            stacklevel=2,
        )
    return score_predictions(rows, judge) if judge is not None else rows


def score_predictions(rows: Sequence[Mapping[str, Any]], judge: Judge) -> list[dict[str, Any]]:
    """Copies of ``rows`` (from :func:`evaluate_arm`) with ``correct`` set by ``judge`` and ``judge`` naming
    it (predictions and judgements stay separable: re-judge stored predictions with a new judge)."""
    if not callable(judge):
        raise TypeError(
            f"judge must be a callable (question, answer, prediction, task) -> bool, got {judge!r}"
        )
    out = []
    for r in rows:
        correct = bool(judge(r["question"], r["answer"], r["prediction"], r["level"]))
        out.append({**r, "correct": correct, "judge": repr(judge)})
    return out


class HFGenerator:
    """A transformers causal LM as a LaRA generator: ``HFGenerator(model, tokenizer)(messages) -> str``.

    The prompt is the tokenizer's chat template when it has one (else the messages' contents joined by blank
    lines and ``"\\nAnswer:"``); greedy decoding of at most ``max_new_tokens``; the reply is the decoded new
    tokens. A prompt longer than ``window − max_new_tokens`` (``window`` default: the model config's
    ``max_position_embeddings``) raises ``ValueError`` unless ``truncate="middle"`` (keep the head and the
    tail of the prompt's token ids; counted in ``truncations`` and warned)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 64,
        window: int | None = None,
        truncate: Literal["middle"] | None = None,
    ) -> None:
        if not hasattr(model, "generate"):
            raise TypeError(
                f"model must be a transformers causal LM with generate(), got {type(model).__name__}"
            )
        if not callable(tokenizer) or not hasattr(tokenizer, "decode"):
            raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, numbers.Integral)
            or max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if truncate not in (None, "middle"):
            raise ValueError(f"truncate must be None or 'middle', got {truncate!r}")
        window = (
            window
            if window is not None
            else getattr(getattr(model, "config", None), "max_position_embeddings", None)
        )
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, numbers.Integral) or window <= max_new_tokens
        ):
            raise ValueError(f"window must be an int > max_new_tokens ({max_new_tokens}), got {window!r}")
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.window, self.truncate = int(max_new_tokens), window, truncate
        self.truncations = 0

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the prompt of ``messages`` (before any truncation)."""
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
        ):
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': str} dicts")
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, Mapping) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        text = "\n\n".join(m["content"] for m in messages) + "\nAnswer:"
        return [int(t) for t in self.tokenizer(text)["input_ids"]]

    def __call__(self, messages: list[dict[str, str]]) -> str:
        import torch

        ids = self.prompt_ids(messages)
        if self.window is not None and len(ids) + self.max_new_tokens > self.window:
            budget = self.window - self.max_new_tokens
            if self.truncate is None:
                raise ValueError(
                    f"the prompt has {len(ids)} tokens, more than the window of {self.window} minus "
                    f"max_new_tokens={self.max_new_tokens}: pass truncate='middle' to cut the middle explicitly"
                )
            ids = ids[: budget // 2] + ids[len(ids) - (budget - budget // 2) :]
            self.truncations += 1
            warnings.warn(f"prompt truncated in the middle to {budget} tokens", stacklevel=2)
        device = getattr(self.model, "device", None)
        input_ids = torch.tensor([ids], device=device)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        with torch.no_grad():
            out = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=pad if pad is not None else eos,
            )
        return self.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True).strip()
