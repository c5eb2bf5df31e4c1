"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: the word-level vocabulary of the trace generators.

Yang et al., ICML 2025 (official code ``chr26195/PENCIL``, ``tokenizer.py``: one id per whitespace-separated
word). Unlike the official tokenizer, padding is its own id (never a real token) and EOS is not assumed to be
the last id; the ids are ``[PAD]=0, <|endofprompt|>=1, [EOS]=2, [CALL]=3, [SEP]=4, [RETURN]=5`` and then the
words in first-seen order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from icml25.llm_efficiency.pencil.reduction import PencilTokens

__all__ = ["CALL", "EOP", "EOS", "PAD", "RETURN", "SEP", "PencilVocab"]

PAD, EOP, EOS, CALL, SEP, RETURN = "[PAD]", "<|endofprompt|>", "[EOS]", "[CALL]", "[SEP]", "[RETURN]"
SPECIALS = (PAD, EOP, EOS, CALL, SEP, RETURN)


class PencilVocab:
    """A word-level vocabulary: ``encode(prompt, trace)`` → ``prompt <|endofprompt|> trace [EOS]`` ids.

    ``words``: the non-special words (e.g. the union of a generator's prompts and traces); order is kept,
    duplicates are dropped. :attr:`tokens` gives the :class:`PencilTokens` of the markers.
    """

    def __init__(self, words: Iterable[str] = ()) -> None:
        self.itos: list[str] = list(SPECIALS)
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        self.add(words)

    @classmethod
    def from_examples(cls, examples: Iterable[Mapping[str, Any]]) -> PencilVocab:
        """The vocabulary of generator examples (``{"prompt": [...], "trace": [...]}`` word lists)."""
        vocab = cls()
        for i, ex in enumerate(examples):
            if not isinstance(ex, Mapping) or "prompt" not in ex or "trace" not in ex:
                raise ValueError(f"examples[{i}] must be a dict with 'prompt' and 'trace' word lists")
            vocab.add(ex["prompt"])
            vocab.add(ex["trace"])
        return vocab

    def add(self, words: Iterable[str]) -> None:
        """Add words (strings without whitespace) not yet in the vocabulary."""
        if isinstance(words, str):
            words = words.split()
        if isinstance(words, np.ndarray) and words.ndim != 1:
            raise ValueError(f"words must be a 1-D sequence of strings, got an array of shape {words.shape}")
        if not isinstance(words, Iterable):
            raise TypeError(f"words must be an iterable of strings, got {type(words).__name__}")
        for w in words:
            if not isinstance(w, str) or not w or any(ch.isspace() for ch in w):
                raise ValueError(f"words must be non-empty strings without whitespace, got {w!r}")
            if w not in self.stoi:
                self.stoi[w] = len(self.itos)
                self.itos.append(w)

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def pad_id(self) -> int:
        return self.stoi[PAD]

    @property
    def eop_id(self) -> int:
        return self.stoi[EOP]

    @property
    def eos_id(self) -> int:
        return self.stoi[EOS]

    @property
    def tokens(self) -> PencilTokens:
        return PencilTokens(self.stoi[CALL], self.stoi[SEP], self.stoi[RETURN], vocab_size=len(self))

    def ids(self, words: Sequence[str] | str) -> list[int]:
        """Ids of a word list (or a whitespace-separated string); ``ValueError`` on an unknown word."""
        if isinstance(words, str):
            words = words.split()
        out = []
        for w in words:
            if w not in self.stoi:
                raise ValueError(f"words: {w!r} is not in the vocabulary ({len(self)} words)")
            out.append(self.stoi[w])
        return out

    def encode(self, prompt: Sequence[str] | str, trace: Sequence[str] | str | None = None) -> list[int]:
        """``prompt <|endofprompt|>`` ids, followed by ``trace [EOS]`` when ``trace`` is given."""
        out = [*self.ids(prompt), self.eop_id]
        if trace is not None:
            out += [*self.ids(trace), self.eos_id]
        return out

    def decode(self, ids: Iterable[int] | torch.Tensor, skip_pad: bool = True) -> list[str]:
        """Words of ``ids`` (padding dropped unless ``skip_pad=False``)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            if not 0 <= int(i) < len(self):
                raise ValueError(f"ids: {i} is outside the vocabulary [0, {len(self)})")
            if skip_pad and int(i) == self.pad_id:
                continue
            out.append(self.itos[int(i)])
        return out
