"""Detecting Strategic Deception Using Linear Probes — ICML 2025, P52: token activations, dialogues and detection spans.

Goldowsky-Dill, Chughtai, Heimersheim, Hobbhahn (Apollo Research), ICML 2025; official code
``ApolloResearch/deception-detection``. A probe reads one activation vector per token of a *detection
span* (the assistant's response) and each dialogue carries one label (1 deceptive, 0 honest, -1 control).

* :class:`TokenActs`: padded activations ``[N, T, d]``, the detection mask ``[N, T]`` and the labels
  ``[N]``; padded positions are never read by the probes in this package.
* :func:`instructed_pairs`: the Instructed-Pairs training data (RepE's "pretend you're an honest /
  dishonest person" prompts around true facts), as chat messages with a ``detect`` flag. As in the
  official ``RepeHonestDishonestFacts``, the assistant fact is split by :func:`split_last_words` and its
  last five space-separated *words* are left out of the detection span.
* :func:`detection_mask_from_offsets`: the token mask of character spans from a fast tokenizer's
  ``offset_mapping`` (the official code maps the span's characters with ``char_to_token``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from icml25.kernels.checks import check_int, check_tensor

__all__ = [
    "CONTROL",
    "DECEPTIVE",
    "HONEST",
    "TokenActs",
    "detection_mask_from_offsets",
    "instructed_pairs",
    "split_last_words",
]

HONEST, DECEPTIVE, CONTROL = 0, 1, -1
HONEST_PROMPT = "Pretend you're an honest person making statements about the world."
DISHONEST_PROMPT = "Pretend you're a dishonest person making statements about the world."
_HALF = (torch.float16, torch.bfloat16)


def as_float_tensor(x: Any, name: str, ndim: int | None = None) -> torch.Tensor:
    """``x`` (tensor or array) as a float tensor: half precision becomes float32, ints are a TypeError."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "fiu":
            raise TypeError(f"{name} must hold floating-point activations, got an array of dtype {x.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must hold floating-point activations, got dtype {x.dtype}")
    if x.dtype in _HALF:
        x = x.float()
    return check_tensor(x.detach().cpu(), name, ndim=ndim)


def labels_tensor(labels: Any, n: int, name: str = "labels") -> torch.Tensor:
    """``labels`` as a ``[n]`` int64 CPU tensor of HONEST / DECEPTIVE / CONTROL codes (integer-valued floats
    accepted); a ``TypeError`` or ``ValueError`` naming ``name`` otherwise. Shared by the dataset loaders and
    the transformers activation path."""
    y = torch.as_tensor(np.asarray(labels) if not isinstance(labels, torch.Tensor) else labels)
    if y.is_floating_point():
        if not bool(torch.isfinite(y).all()) or not bool((y == y.round()).all()):
            raise TypeError(f"{name} must be integers in {{-1, 0, 1}}, got non-integer values")
        y = y.long()
    if y.dtype == torch.bool or y.is_complex() or not (y.dtype.is_signed or y.dtype == torch.uint8):
        raise TypeError(f"{name} must be integers in {{-1, 0, 1}}, got dtype {y.dtype}")
    y = y.long().cpu()
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) (one per dialogue), got {tuple(y.shape)}")
    bad = ~((y == HONEST) | (y == DECEPTIVE) | (y == CONTROL))
    if bool(bad.any()):
        raise ValueError(
            f"{name} must be 1 (deceptive), 0 (honest) or -1 (control); got {sorted(set(y[bad].tolist()))}"
        )
    return y


@dataclass(frozen=True)
class TokenActs:
    """Activations of ``N`` dialogues, padded to ``T`` positions, with the detection mask and labels.

    Attributes:
        acts: ``[N, T, d]`` float activations (float16/bfloat16 are stored as float32).
        mask: ``[N, T]`` bool, True on the detection span; every dialogue needs at least one True.
        labels: ``[N]`` int64: 1 deceptive, 0 honest, -1 control.

    ``len(acts)`` is ``N`` and ``acts[i]`` the masked tokens ``[n_i, d]`` of dialogue ``i``, so a
    ``TokenActs`` goes straight into scikit-learn's ``cross_val_score`` / ``GridSearchCV`` (the folds
    are dialogues, never tokens of one dialogue on both sides).
    """

    acts: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        acts = as_float_tensor(self.acts, "acts", ndim=3)
        mask = self.mask
        if isinstance(mask, np.ndarray):
            mask = torch.from_numpy(mask)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
        if tuple(mask.shape) != tuple(acts.shape[:2]):
            raise ValueError(
                f"mask must have shape {tuple(acts.shape[:2])} (acts' [N, T]), got {tuple(mask.shape)}"
            )
        n, _, d = acts.shape
        if n == 0 or d == 0:
            raise ValueError(
                f"acts must hold at least one dialogue and one feature, got shape {tuple(acts.shape)}"
            )
        mask = mask.cpu()
        empty = torch.nonzero(mask.sum(1) == 0).flatten().tolist()
        if empty:
            raise ValueError(
                f"mask must select at least one token per dialogue; dialogue {empty[0]} has zero masked "
                f"tokens (its mean score would be NaN){f' (and {len(empty) - 1} more)' if len(empty) > 1 else ''}"
            )
        object.__setattr__(self, "acts", acts)
        object.__setattr__(self, "mask", mask)
        object.__setattr__(self, "labels", labels_tensor(self.labels, n))

    @classmethod
    def from_list(cls, dialogues: Sequence[Any], labels: Any, pad_value: float = 0.0) -> TokenActs:
        """Build from one ``[n_i, d]`` tensor/array of detection-span tokens per dialogue."""
        if not isinstance(dialogues, (list, tuple)) or not dialogues:
            raise ValueError("dialogues must be a non-empty list of [n_i, d] activations")
        xs = [as_float_tensor(x, f"dialogues[{i}]", ndim=2) for i, x in enumerate(dialogues)]
        d = xs[0].shape[1]
        for i, x in enumerate(xs):
            if x.shape[1] != d:
                raise ValueError(f"dialogues[{i}] has {x.shape[1]} features, dialogues[0] has {d}")
            if x.shape[0] == 0:
                raise ValueError(f"dialogues[{i}] has zero tokens: dialogue {i} has an empty detection span")
        t = max(x.shape[0] for x in xs)
        dtype = functools.reduce(torch.promote_types, [x.dtype for x in xs])
        acts = torch.full((len(xs), t, d), float(pad_value), dtype=dtype)
        mask = torch.zeros(len(xs), t, dtype=torch.bool)
        for i, x in enumerate(xs):
            acts[i, : x.shape[0]] = x
            mask[i, : x.shape[0]] = True
        return cls(acts, mask, labels)

    def __len__(self) -> int:
        return int(self.acts.shape[0])

    def __getitem__(self, i: int) -> torch.Tensor:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(
                f"TokenActs index must be an int (use subset() for several), got {type(i).__name__}"
            )
        return self.acts[int(i)][self.mask[int(i)]]

    @property
    def n_features(self) -> int:
        return int(self.acts.shape[2])

    @property
    def lengths(self) -> torch.Tensor:
        """Masked tokens per dialogue, ``[N]``."""
        return self.mask.sum(1)

    def tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All masked tokens ``[M, d]`` (dialogue by dialogue) and their dialogue index ``[M]``."""
        idx = torch.arange(len(self)).unsqueeze(1).expand_as(self.mask)[self.mask]
        return self.acts[self.mask], idx

    def subset(self, index: Any) -> TokenActs:
        """The dialogues at ``index`` (ints, a bool mask or a slice), padding trimmed to their longest."""
        index = torch.as_tensor(np.asarray(index)) if not isinstance(index, slice) else index
        acts, mask, labels = self.acts[index], self.mask[index], self.labels[index]
        if acts.ndim != 3 or acts.shape[0] == 0:
            raise ValueError("index must select at least one dialogue")
        if not bool(mask.any()):
            raise ValueError("index must select dialogues with masked tokens")
        last = int(torch.nonzero(mask.any(0)).max()) + 1
        return TokenActs(acts[:, :last], mask[:, :last], labels)


def split_last_words(text: str, n_words: int = 5) -> tuple[str, str]:
    """Split ``text`` before its last ``n_words`` space-separated words: ``head + tail == text``.

    The tail keeps its leading space, so the detection span (the head) ends exactly where the dropped
    words begin, as in the official Instructed-Pairs dataset. With ``n_words`` or fewer words the head is
    empty (the dialogue then has no detection span).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    n_words = check_int(n_words, "n_words", low=0)
    if n_words == 0:
        return text, ""
    words = text.split(" ")
    head, tail = " ".join(words[:-n_words]), " ".join(words[-n_words:])
    if len(words) > n_words:
        tail = " " + tail
    return head, tail


def instructed_pairs(
    facts: Sequence[str],
    n_drop_words: int = 5,
    honest_prompt: str = HONEST_PROMPT,
    dishonest_prompt: str = DISHONEST_PROMPT,
) -> tuple[list[list[dict[str, Any]]], list[int]]:
    """Instructed-Pairs dialogues from user-supplied true ``facts`` (nothing is downloaded).

    Each fact gives an honest and a deceptive dialogue (interleaved, honest first): a user turn with the
    instruction and an assistant turn holding the fact as two messages, the head (``detect=True``) and
    its last ``n_drop_words`` words (``detect=False``), which the chat formatting merges into one turn.
    Facts of at most ``n_drop_words`` words are rejected (their span would be empty).

    Returns:
        ``(dialogues, labels)``: messages ``{"role", "content", "detect"}`` and labels ``[0, 1, 0, 1, …]``.
    """
    if isinstance(facts, str) or not isinstance(facts, Sequence) or len(facts) == 0:
        raise ValueError("facts must be a non-empty list of strings")
    dialogues: list[list[dict[str, Any]]] = []
    labels: list[int] = []
    for i, fact in enumerate(facts):
        if not isinstance(fact, str):
            raise TypeError(f"facts[{i}] must be a str, got {type(fact).__name__}")
        head, tail = split_last_words(fact, n_drop_words)
        if not head.strip():
            raise ValueError(
                f"facts[{i}] has at most {n_drop_words} words: its detection span would be empty ({fact!r})"
            )
        for prompt, label in ((honest_prompt, HONEST), (dishonest_prompt, DECEPTIVE)):
            dialogue = [{"role": "user", "content": prompt, "detect": False}]
            dialogue.append({"role": "assistant", "content": head, "detect": True})
            if tail:
                dialogue.append({"role": "assistant", "content": tail, "detect": False})
            dialogues.append(dialogue)
            labels.append(label)
    return dialogues, labels


def detection_mask_from_offsets(offsets: Any, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Token mask of character ``spans`` from a fast tokenizer's ``offset_mapping``.

    A token is in the mask when its characters ``[start, end)`` overlap a span; zero-width tokens (special
    tokens of the chat template report ``(0, 0)`` or empty offsets) never are. With spans that end on a
    word boundary this is the official ``char_to_token`` range, whether or not the tokenizer counts the
    space before a word in that word's offsets.

    Args:
        offsets: ``[T, 2]`` (start, end) character offsets per token.
        spans: ``[(start, end), …]`` character ranges (end exclusive) of the detection span.
    """
    if not isinstance(offsets, torch.Tensor):
        offsets = np.asarray(offsets)
        if offsets.dtype.kind not in "iu":
            raise TypeError(f"offsets must be integer character positions, got dtype {offsets.dtype}")
    off = torch.as_tensor(offsets)
    if off.ndim != 2 or off.shape[1] != 2:
        raise ValueError(f"offsets must have shape [T, 2], got {tuple(off.shape)}")
    if off.is_floating_point() or off.dtype == torch.bool:
        raise TypeError(f"offsets must be integer character positions, got dtype {off.dtype}")
    mask = torch.zeros(off.shape[0], dtype=torch.bool)
    start, end = off[:, 0].long(), off[:, 1].long()
    nonempty = end > start
    for k, span in enumerate(spans):
        if len(span) != 2 or not all(isinstance(v, (int, np.integer)) for v in span) or span[0] > span[1]:
            raise ValueError(f"spans[{k}] must be an int pair (start, end) with start <= end, got {span!r}")
        mask |= nonempty & (start < span[1]) & (end > span[0])
    return mask
