"""LaRA: Benchmarking Retrieval-Augmented Generation and Long-Context LLMs — ICML 2025, P38: a synthetic mini-LaRA and two deterministic readers.

A seeded stand-in for LaRA at CPU scale (no LLM): documents of 4k and 16k whitespace tokens in three
styles (``book`` narrative, ``financial`` table rows, ``paper`` results prose) made of templated sentences
about invented entities with numeric attributes, and LaRA's four tasks: *location* (one stated fact),
*reasoning* (increase of an attribute between two years: a difference of two stated numbers), *comp*
(which of entity A, stated in the first third, and entity B, stated in the last third, has the higher
attribute) and *hallu* (an attribute the document never states for the entity; gold "not mentioned").
Half of the location/reasoning/comparison items also carry *distractor* sentences that repeat the entity
and the attribute without a number (they compete with the fact for the retriever's top chunks).

Readers (answer = a string, judged by :class:`~icml25.llm_efficiency.lara.LexicalJudge`):

* :class:`RagReader`: :class:`~icml25.llm_efficiency.lara.HybridRetriever` top-k chunks + the rule-based
  :func:`extract_answer`; it fails when a needed fact is not retrieved.
* :class:`SimulatedLCReader` — **simulated**: the same extractor over the whole document, but each needed
  fact is missed with a probability that grows with the document length and towards its middle ("lost in
  the middle"), and a hallucination item is answered with an invented number at a fixed rate. Its
  parameters are frozen in :data:`LC_READERS` (a strong and a weak reader).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from icml25.kernels.checks import check_int
from icml25.llm_efficiency.lara.data import LaraItem
from icml25.llm_efficiency.lara.retrieval import Chunker, DocIndex, HybridRetriever, RetrievedChunk, TextChunk

__all__ = [
    "LC_READERS",
    "LCReaderParams",
    "MiniLara",
    "RagReader",
    "SimulatedLCReader",
    "extract_answer",
    "make_mini_lara",
]

STYLES = ("book", "financial", "paper")
LENGTH_WORDS = {"4k": 4000, "16k": 16000}
NOT_MENTIONED = "The text does not mention it."
ATTRIBUTES = (
    "revenue", "budget", "headcount", "inventory", "debt", "savings", "tonnage", "acreage", "mileage",
    "payroll", "rainfall", "harvest", "livestock", "turnover", "reserves", "tariffs", "shipments", "rent",
    "altitude", "bandwidth", "capacity", "dividend", "enrolment", "footfall", "garrison", "latency",
    "membership", "orchards", "pensions", "quarries", "royalties", "subsidies", "tonnes", "vineyards",
    "warehouses", "yield",
)  # fmt: skip
_SYLLABLES = ("bor", "van", "kel", "ith", "mar", "dun", "sel", "tor", "ane", "ris", "gal", "oth", "pen", "lum",
              "zar", "eth", "qui", "nor", "vel", "ash", "tam", "ock", "ril", "sen")  # fmt: skip
_FILLER = (
    "river", "market", "winter", "council", "harbor", "letter", "journey", "garden", "lantern", "meeting",
    "village", "archive", "machine", "sample", "method", "quarter", "ledger", "account", "season", "road",
    "bridge", "tower", "valley", "storm", "window", "portrait", "contract", "schedule", "signal", "theory",
)  # fmt: skip
FACT = {
    "book": "In the old chronicle {e} was said to hold a {a} of {v} that season",
    "financial": "Row {e} | {a} | {v} | audited and reported",
    "paper": "Our measurements show that {e} reaches a {a} of {v} in the main experiment",
}
FACT_YEAR = {
    "book": "In the year {y} {e} was said to hold a {a} of {v}",
    "financial": "Row {e} | {a} for {y} | {v} | audited",
    "paper": "In the {y} run {e} reaches a {a} of {v}",
}
DISTRACTOR = {
    "book": "Travellers argued about the {a} of {e} and the {a} of {e} stayed a rumour",
    "financial": "Note {e} | {a} restated | the {a} of {e} remains under review",
    "paper": "Prior work questioned the {a} of {e} and the {a} of {e} is still debated",
}
FILLER = {
    "book": "The {w1} near the {w2} was quiet while {e} walked past the {w3}",
    "financial": "Memo {e} | {w1} {w2} | {w3} | no change",
    "paper": "We discuss the {w1} of the {w2} and relate {e} to the {w3}",
}
Q_LOCATION = "What is the {a} of {e}?"
Q_REASONING = "By how much did the {a} of {e} increase from {y1} to {y2}?"
Q_COMPARISON = "Comparing {e1} and {e2}, which one has the higher {a}?"
_RE_LOC = re.compile(r"^What is the (\w+) of (\w+)\?$")
_RE_REA = re.compile(r"^By how much did the (\w+) of (\w+) increase from (\d{4}) to (\d{4})\?$")
_RE_CMP = re.compile(r"^Comparing (\w+) and (\w+), which one has the higher (\w+)\?$")
_VALUE = re.compile(r"\b\d{1,3}\b")
_YEAR = re.compile(r"\b(?:19|20)\d{2}\b")
_SENTENCE_END = re.compile(r"\.\s+")


def _sentences(text: str) -> list[tuple[int, str]]:
    """``(start offset, sentence)`` pairs of ``text`` split after ``". "``."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append((start, text[start : m.start()]))
        start = m.end()
    if start < len(text):
        out.append((start, text[start:].rstrip(". \n")))
    return out


def _find(
    sentences: Sequence[tuple[int, str]], entity: str, attr: str, year: str | None
) -> tuple[int, int] | None:
    """``(offset, value)`` of the first sentence stating ``attr`` of ``entity`` (in ``year``) with a number."""
    for start, s in sentences:
        toks = set(re.findall(r"\w+", s))
        if entity not in toks or attr not in toks:
            continue
        years = _YEAR.findall(s)
        if (year is None and years) or (year is not None and year not in years):
            continue
        values = _VALUE.findall(_YEAR.sub(" ", s))
        if values:
            return start, int(values[0])
    return None


def parse_question(question: str) -> tuple[str, tuple[str, ...]]:
    """``(kind, fields)`` of a synthetic question: kind ``location`` (attr, entity), ``reasoning`` (attr,
    entity, year1, year2) or ``comp`` (entity1, entity2, attr)."""
    for kind, pattern in (("location", _RE_LOC), ("reasoning", _RE_REA), ("comp", _RE_CMP)):
        m = pattern.match(question)
        if m:
            return kind, m.groups()
    raise ValueError(f"question is not one of the mini-LaRA templates: {question!r}")


def _lookups(kind: str, fields: tuple[str, ...]) -> list[tuple[str, str, str | None]]:
    if kind == "location":
        return [(fields[1], fields[0], None)]
    if kind == "reasoning":
        return [(fields[1], fields[0], fields[2]), (fields[1], fields[0], fields[3])]
    return [(fields[0], fields[2], None), (fields[1], fields[2], None)]


def _answer(kind: str, fields: tuple[str, ...], values: list[int | None]) -> str:
    if any(v is None for v in values):
        return NOT_MENTIONED
    if kind == "location":
        return str(values[0])
    if kind == "reasoning":
        return str(values[1] - values[0])
    return fields[0] if values[0] > values[1] else fields[1]


def extract_answer(question: str, text: str) -> str:
    """The rule-based reader: parse the question's template, find the sentences stating the needed facts
    (entity, attribute, year, a number) and answer; a missing fact → "The text does not mention it."."""
    kind, fields = parse_question(question)
    sentences = _sentences(text)
    values = [None if (f := _find(sentences, *lk)) is None else f[1] for lk in _lookups(kind, fields)]
    return _answer(kind, fields, values)


@dataclass(frozen=True)
class LCReaderParams:
    """Frozen parameters of a simulated long-context reader: a needed fact at relative depth ``d`` of a
    document of ``n`` tokens is missed with probability ``base_miss + length_slope·log2(n / 4000) +
    middle_miss·4d(1 − d)`` (clipped to [0, 1]); a hallucination item is answered with an invented number
    with probability ``hallucination``."""

    name: str
    base_miss: float
    length_slope: float
    middle_miss: float
    hallucination: float

    def miss_probability(self, depth: float, n_tokens: int) -> float:
        p = (
            self.base_miss
            + self.length_slope * math.log2(n_tokens / 4000)
            + self.middle_miss * 4 * depth * (1 - depth)
        )
        return min(1.0, max(0.0, p))


LC_READERS = {
    "strong": LCReaderParams(
        "strong", base_miss=0.05, length_slope=0.08, middle_miss=0.15, hallucination=0.25
    ),
    "weak": LCReaderParams("weak", base_miss=0.20, length_slope=0.10, middle_miss=0.20, hallucination=0.45),
}
"""The simulated LC readers, frozen before any router is fitted (printed in the reproduction's notes)."""


class SimulatedLCReader:
    """**Simulated** long-context reader (see :class:`LCReaderParams`): deterministic given ``seed`` and the
    item's ``uid`` (``meta["uid"]``)."""

    def __init__(self, params: LCReaderParams, seed: int = 0) -> None:
        if not isinstance(params, LCReaderParams):
            raise TypeError(f"params must be LCReaderParams, got {type(params).__name__}")
        self.params, self.seed = params, int(seed)

    def __call__(self, item: LaraItem, document: str) -> str:
        rng = np.random.default_rng([self.seed, int(item.meta.get("uid", 0)), 7])
        kind, fields = parse_question(item.question)
        sentences = _sentences(document)
        n_tokens = len(document.split())
        values = []
        for lk in _lookups(kind, fields):
            found = _find(sentences, *lk)
            miss = (
                rng.random() < self.params.miss_probability(found[0] / len(document), n_tokens)
                if found
                else True
            )
            values.append(None if miss else found[1])
        answer = _answer(kind, fields, values)
        if answer == NOT_MENTIONED and rng.random() < self.params.hallucination:
            return str(int(rng.integers(10, 1000)))  # confabulates a number instead of admitting absence
        return answer

    def __repr__(self) -> str:
        return f"SimulatedLCReader({self.params!r}, seed={self.seed})"


class RagReader:
    """RAG reader: ``retriever`` top-k chunks (default ``HybridRetriever(k=3)`` over 64-token chunks with
    10 overlapping) + :func:`extract_answer` over the chunks. ``__call__(item, chunks) -> (answer, retrieved)``."""

    def __init__(self, retriever: HybridRetriever | None = None) -> None:
        self.retriever = retriever or HybridRetriever(k=3, vector_ratio=0.5, chunker=Chunker(None, 64, 16))

    def __call__(
        self, item: LaraItem, chunks: Sequence[TextChunk] | str | DocIndex
    ) -> tuple[str, list[RetrievedChunk]]:
        retrieved = self.retriever(chunks, item.question)
        text = ". ".join(c.text.strip(". ") for c in retrieved) + "."
        return extract_answer(item.question, text), retrieved


@dataclass(frozen=True)
class MiniLara:
    """A synthetic mini-LaRA: ``items`` and their ``documents`` keyed ``(length, context_type, doc_id)``."""

    items: list[LaraItem]
    documents: dict[tuple[str, str, str], str]

    def document(self, item: LaraItem) -> str:
        return self.documents[(item.length, item.context_type, item.doc_id)]


def _names(rng: np.random.Generator, n: int) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        k = int(rng.integers(2, 4))
        out.add("".join(rng.choice(_SYLLABLES, k)).capitalize())
    return sorted(out)


def _document(rng: np.random.Generator, style: str, n_words: int, questions: int, doc_id: str, length: str,
              uid0: int) -> tuple[list[LaraItem], str]:  # fmt: skip
    names = _names(rng, 48)
    attrs = list(ATTRIBUTES)
    tasks = [("location", "reasoning", "comp", "hallu")[i % 4] for i in range(questions)]
    used_pairs: set[tuple[str, str]] = set()
    planned: list[tuple[str, dict]] = []  # (task, spec)

    item_attrs = iter(
        rng.permutation(attrs)[:questions].tolist()
    )  # one attribute per question of the document

    for task in tasks:
        a = str(next(item_attrs))
        if task == "comp":
            e1, e2 = (str(x) for x in rng.choice(names, 2, replace=False))
            v1, v2 = rng.choice(np.arange(10, 1000), 2, replace=False)
            used_pairs.update({(e1, a), (e2, a)})
            planned.append((task, {"e": (e1, e2), "a": a, "v": (int(v1), int(v2))}))
        else:
            e = str(rng.choice(names))
            used_pairs.add((e, a))
            planned.append((task, {"e": e, "a": a}))
    # background facts: other (entity, attribute) pairs with values
    n_sent = max(40, n_words // 12)
    body: list[str] = []
    for _ in range(n_sent):
        if rng.random() < 0.2:
            e, a = str(rng.choice(names)), str(rng.choice(attrs))
            if (e, a) in used_pairs:  # question pairs are stated only where the item puts them
                continue
            body.append(FACT[style].format(e=e, a=a, v=int(rng.integers(10, 1000))))
        else:
            w1, w2, w3 = rng.choice(_FILLER, 3, replace=False)
            body.append(FILLER[style].format(w1=w1, w2=w2, w3=w3, e=rng.choice(names)))
    inserts: list[tuple[float, str]] = []  # (relative position, sentence)
    items = []
    for j, (task, spec) in enumerate(planned):
        meta = {"uid": uid0 + j, "style": style}
        distract = task != "hallu" and rng.random() < 0.5
        if task == "location":
            e, a = spec["e"], spec["a"]
            v = int(rng.integers(10, 1000))
            pos = float(rng.random())
            inserts.append((pos, FACT[style].format(e=e, a=a, v=v)))
            question, answer = Q_LOCATION.format(a=a, e=e), str(v)
            meta["fact_depth"] = [pos]
        elif task == "reasoning":
            e, a = spec["e"], spec["a"]
            y1 = int(rng.integers(2001, 2015))
            y2 = y1 + int(rng.integers(1, 6))
            v1 = int(rng.integers(10, 500))
            v2 = v1 + int(rng.integers(5, 400))
            pos = float(rng.random()) * 0.97
            gap = float(rng.integers(0, 4)) * 12 / n_words
            inserts += [(pos, FACT_YEAR[style].format(y=y1, e=e, a=a, v=v1)),
                        (pos + gap + 1e-9, FACT_YEAR[style].format(y=y2, e=e, a=a, v=v2))]  # fmt: skip
            question, answer = Q_REASONING.format(a=a, e=e, y1=y1, y2=y2), str(v2 - v1)
            meta["fact_depth"] = [pos, pos + gap]
        elif task == "comp":
            (e1, e2), a, (v1, v2) = spec["e"], spec["a"], spec["v"]
            p1, p2 = float(rng.uniform(0.0, 1 / 3)), float(rng.uniform(2 / 3, 1.0))
            inserts += [(p1, FACT[style].format(e=e1, a=a, v=v1)), (p2, FACT[style].format(e=e2, a=a, v=v2))]
            question, answer = Q_COMPARISON.format(e1=e1, e2=e2, a=a), e1 if v1 > v2 else e2
            meta["fact_depth"] = [p1, p2]
            meta["comp_parts"] = [1, 3]
        else:
            e, a = spec["e"], spec["a"]
            while not any(
                e in s for s in body
            ):  # the entity appears in the document, the attribute not for it
                body.insert(
                    int(rng.integers(0, len(body))),
                    FILLER[style].format(w1="river", w2="road", w3="tower", e=e),
                )
            question, answer = Q_LOCATION.format(a=a, e=e), "not mentioned"
            meta["fact_depth"] = []
        if distract:
            entities = spec["e"] if isinstance(spec["e"], tuple) else (spec["e"],)
            for e in entities:
                for _ in range(2):
                    inserts.append((float(rng.random()), DISTRACTOR[style].format(e=e, a=spec["a"])))
        meta["distractors"] = bool(distract)
        items.append(LaraItem(length, style, task, doc_id, question, answer, meta))
    for pos, sentence in sorted(inserts, key=lambda t: t[0]):
        body.insert(min(len(body), round(pos * len(body))), sentence)
    return items, ". ".join(body) + "."


def make_mini_lara(n_items: int, seed: int = 0, questions_per_doc: int = 8) -> MiniLara:
    """``n_items`` items (a multiple of ``questions_per_doc``, itself a multiple of 4) over documents cycling
    through the lengths 4k/16k and the three styles; each document hosts ``questions_per_doc`` questions,
    the four tasks equally. Each item's ``meta`` holds ``uid``, ``fact_depth`` (relative positions of the
    needed facts), ``distractors`` and ``style``."""
    questions_per_doc = check_int(questions_per_doc, "questions_per_doc", low=4, high=len(ATTRIBUTES))
    if questions_per_doc % 4:
        raise ValueError(f"questions_per_doc must be a multiple of 4, got {questions_per_doc!r}")
    n_items = check_int(n_items, "n_items", low=1)
    if n_items % questions_per_doc:
        raise ValueError(
            f"n_items must be a positive multiple of questions_per_doc={questions_per_doc}, got {n_items!r}"
        )
    rng = np.random.default_rng(seed)
    items: list[LaraItem] = []
    documents: dict[tuple[str, str, str], str] = {}
    for d in range(n_items // questions_per_doc):
        length = ("4k", "16k")[d % 2]
        style = STYLES[(d // 2) % 3]
        doc_id = f"doc{d:03d}.txt"
        doc_items, text = _document(
            rng, style, LENGTH_WORDS[length], questions_per_doc, doc_id, length, len(items)
        )
        items += doc_items
        documents[(length, style, doc_id)] = text
    return MiniLara(items, documents)


def reader_table() -> str:
    """The frozen LC reader parameters as one line (for reports)."""
    return "; ".join(f"{k}: {asdict(v)}" for k, v in LC_READERS.items())
