"""LaRA: Benchmarking Retrieval-Augmented Generation and Long-Context LLMs — ICML 2025, P38: answer judges.

The official scorer (``evaluation/compute_score_llm.py``, Alibaba-NLP/LaRA) asks an LLM whether a prediction
matches the gold answer (for hallucination items: whether it says the information is absent) and counts a
reply as correct when it contains "true" anywhere; its judge model is not pinned. Here a judge is any
callable ``judge(question, answer, prediction, task) -> bool``: :class:`LexicalJudge` is offline (refusal
detection, normalised numbers, containment, token F1) and :class:`LLMJudge` wraps a chat callable, names
its model and accepts only an exact ``True``/``False`` reply (anything else is a logged judge failure,
scored incorrect).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from icml25.kernels.checks import check_float
from icml25.llm_efficiency.lara.data import canonical_task

__all__ = ["Judge", "LLMJudge", "LexicalJudge", "is_refusal", "normalize_numbers"]

log = logging.getLogger(__name__)

REFUSAL_PATTERNS = (
    r"\bnot (?:explicitly |directly )?(?:mentioned|stated|provided|specified|given|included|found|available|disclosed)\b",
    r"\b(?:does|do|did) not (?:explicitly )?(?:mention|state|provide|specify|say|contain|include|disclose)\b",
    r"\bno (?:information|mention|data|details?|record)\b",
    r"\b(?:cannot|can ?not|can't|unable to) (?:be )?(?:determine|determined|find|found|answer|answered|tell|infer)\b",
    r"\bnot (?:possible|able) to (?:determine|answer|tell)\b",
    r"\b(?:isn't|is not|aren't|are not|wasn't|was not) (?:mentioned|stated|provided|specified|given)\b",
    r"\bunknown\b",
)
_REFUSAL = re.compile("|".join(REFUSAL_PATTERNS), re.IGNORECASE)
_NUMBER = re.compile(r"[-−]?\$?\d[\d,]*(?:\.\d+)?")
_WORD = re.compile(r"\w+")


def is_refusal(text: str) -> bool:
    """Whether ``text`` says the information is absent ("not mentioned", "does not state", "no information"...)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _REFUSAL.search(text) is not None


def normalize_numbers(text: str) -> list[str]:
    """The numbers of ``text``, normalised: ``"$2,576,340."`` → ``"2576340"``, ``"3.50"`` → ``"3.5"``,
    ``"−7"`` → ``"-7"``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out = []
    for m in _NUMBER.finditer(text):
        s = m.group().replace("−", "-").replace("$", "").replace(",", "")
        if "." in s:
            s = s.rstrip("0").rstrip(".")
        neg = s.startswith("-")
        s = s.lstrip("-").lstrip("0") or "0"
        if s.startswith("."):
            s = "0" + s
        out.append(("-" if neg and s != "0" else "") + s)
    return out


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def token_f1(prediction: str, answer: str) -> float:
    """SQuAD-style token F1 of ``prediction`` against ``answer`` (lower-cased ``\\w+`` tokens)."""
    p, a = _tokens(prediction), _tokens(answer)
    common = sum((Counter(p) & Counter(a)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(a)
    return 2 * prec * rec / (prec + rec)


@runtime_checkable
class Judge(Protocol):
    """``judge(question, answer, prediction, task) -> bool``: whether ``prediction`` answers ``question``."""

    def __call__(self, question: str, answer: str, prediction: str, task: str) -> bool: ...


def _check_strings(question: object, answer: object, prediction: object) -> None:
    for name, v in (("question", question), ("answer", answer), ("prediction", prediction)):
        if not isinstance(v, str):
            raise TypeError(f"{name} must be a str, got {type(v).__name__}")


class LexicalJudge:
    """Offline judge. ``hallu``: correct iff the prediction is a refusal (:func:`is_refusal`). Otherwise a
    refusal or an empty prediction is incorrect; a gold answer with numbers needs every gold number among
    the prediction's (:func:`normalize_numbers`); else the normalised gold must be contained in the
    prediction or their token F1 must reach ``f1_threshold``. Reliable for numeric and short-span answers
    (LaRA's financial location/reasoning items and hallucination detection); free-form answers need an
    LLM judge."""

    def __init__(self, f1_threshold: float = 0.5) -> None:
        self.f1_threshold = check_float(f1_threshold, "f1_threshold", low=0.0, high=1.0)

    def __call__(self, question: str, answer: str, prediction: str, task: str) -> bool:
        _check_strings(question, answer, prediction)
        task = canonical_task(task)
        if not prediction.strip():
            log.warning("empty prediction for %r: scored incorrect", question[:80])
            return False
        if task == "hallu":
            return is_refusal(prediction)
        if is_refusal(prediction):
            return False
        gold_numbers = normalize_numbers(answer)
        if gold_numbers:
            have = Counter(normalize_numbers(prediction))
            return not (Counter(gold_numbers) - have)
        gold = " ".join(_tokens(answer))
        if gold and gold in " ".join(_tokens(prediction)):
            return True
        return token_f1(prediction, answer) >= self.f1_threshold

    def __repr__(self) -> str:
        return f"LexicalJudge(f1_threshold={self.f1_threshold})"


JUDGE_SYSTEM = (
    "You are a discriminator that judges whether a model's prediction to a question is correct. "
    "Reply with exactly one word: True or False."
)
JUDGE_TEMPLATE = (
    "Question: {question}\nGround-truth answer: {answer}\nPrediction: {prediction}\n\n"
    "Is the prediction consistent with the ground-truth answer? Reply True or False."
)
JUDGE_TEMPLATE_HALLU = (
    "Question: {question}\nGround truth: the information asked for is not in the text ({answer}).\n"
    "Prediction: {prediction}\n\nDoes the prediction correctly say that the information is not mentioned "
    "(without inventing an answer)? Reply True or False."
)


class LLMJudge:
    """LLM judge over any chat callable ``chat(messages) -> str`` (an API client, a transformers pipeline,
    :class:`~icml25.llm_efficiency.lara.HFGenerator`). ``model`` names the judge (stored with every
    judgement: scores drift across judge versions). The reply must be exactly ``True`` or ``False``
    (case and surrounding punctuation ignored); anything else, or an exception of ``chat``, is a judge
    failure: logged, counted in ``failures`` and scored incorrect."""

    def __init__(self, chat: Callable[[list[dict[str, str]]], str], model: str) -> None:
        if not callable(chat):
            raise TypeError(f"chat must be a callable messages -> str, got {type(chat).__name__}")
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"model must name the judge model (a non-empty str), got {model!r}")
        self.chat, self.model, self.failures = chat, model, 0

    def messages(self, question: str, answer: str, prediction: str, task: str) -> list[dict[str, str]]:
        """The judge's chat messages for one prediction."""
        template = JUDGE_TEMPLATE_HALLU if canonical_task(task) == "hallu" else JUDGE_TEMPLATE
        return [
            {"role": "system", "content": JUDGE_SYSTEM},
            {
                "role": "user",
                "content": template.format(question=question, answer=answer, prediction=prediction),
            },
        ]

    def __call__(self, question: str, answer: str, prediction: str, task: str) -> bool:
        _check_strings(question, answer, prediction)
        if not prediction.strip():
            log.warning("empty prediction for %r: scored incorrect", question[:80])
            return False
        try:
            reply = self.chat(self.messages(question, answer, prediction, task))
        except Exception as e:  # a judge failure never aborts an evaluation
            self.failures += 1
            log.warning("judge %s failed (%s: %s): scored incorrect", self.model, type(e).__name__, e)
            return False
        verdict = reply.strip().strip(".!*\"' \n").lower() if isinstance(reply, str) else None
        if verdict not in ("true", "false"):
            self.failures += 1
            log.warning("judge %s replied %r (not True/False): scored incorrect", self.model, reply)
            return False
        return verdict == "true"

    def __repr__(self) -> str:
        return f"LLMJudge(model={self.model!r})"
