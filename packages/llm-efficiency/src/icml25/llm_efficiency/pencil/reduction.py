"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: the reduction rule and the training-data transform.

Yang et al., "PENCIL: Long Thoughts with Short Memory", ICML 2025 (arXiv 2503.14337; official code
``chr26195/PENCIL``, ``pencil_utils.py``). The reduction rule φ over the three special tokens
``[CALL]``, ``[SEP]``, ``[RETURN]``: find the **first** ``[RETURN]``, the **last** ``[SEP]`` before it and the
**last** ``[CALL]`` before that ``[SEP]``, and rewrite ``C [CALL] T [SEP] A [RETURN] D`` → ``C A D`` (the thought
``T`` and the three markers are erased, the answer ``A`` is kept).

* :class:`PencilTokens`: the three marker ids (validated: distinct, non-negative, inside ``vocab_size``);
* :func:`reduce_once`, :func:`reduce_full`: φ on a 1-D token sequence (list, NumPy array or torch tensor;
  the result has the input's type, dtype and device);
* :func:`extract_subsequences`: a full trace → the successive reduced states, each cut at its next
  ``[RETURN]``, with ``loss_start`` (the official ``mask_idx + 1``) so every generated token is trained once;
* :class:`PencilCollator`: pads sub-sequences into an HF-style batch (``labels = -100`` before
  ``loss_start`` and on padding).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = [
    "PencilCollator",
    "PencilReductionError",
    "PencilTokens",
    "as_index_array",
    "check_pencil_tokens",
    "context_profile",
    "extract_subsequences",
    "locate_redex",
    "reduce_full",
    "reduce_once",
]

Ids = TypeVar("Ids", list, tuple, np.ndarray, torch.Tensor)


class PencilReductionError(ValueError):
    """A ``[RETURN]`` with no ``[SEP]`` before it, or a ``[SEP]`` with no ``[CALL]`` before it (a malformed
    trace); also an unclosed frame left after the last reduction of a training trace."""


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class PencilTokens:
    """The ids of ``[CALL]``, ``[SEP]`` and ``[RETURN]`` (and optionally the vocabulary size they live in).

    Raises ``ValueError`` for colliding ids, negative ids or ids ``>= vocab_size``; ``TypeError`` for non-ints.
    """

    call: int
    sep: int
    ret: int
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("call", "sep", "ret"):
            v = getattr(self, name)
            if not _is_int(v):
                raise TypeError(f"PencilTokens.{name} must be an int token id, got {type(v).__name__} {v!r}")
            if v < 0:
                raise ValueError(f"PencilTokens.{name} must be a non-negative token id, got {v}")
            object.__setattr__(self, name, int(v))
        if len({self.call, self.sep, self.ret}) != 3:
            raise ValueError(
                f"PencilTokens ids must be distinct, got call={self.call}, sep={self.sep}, ret={self.ret}"
            )
        if self.vocab_size is not None:
            if not _is_int(self.vocab_size) or self.vocab_size < 3:
                raise ValueError(
                    f"PencilTokens.vocab_size must be an int >= 3 or None, got {self.vocab_size!r}"
                )
            self.check_vocab(int(self.vocab_size))

    @property
    def ids(self) -> tuple[int, int, int]:
        """``(call, sep, ret)``."""
        return self.call, self.sep, self.ret

    def check_vocab(self, vocab_size: int, what: str = "the vocabulary") -> None:
        """Raise ``ValueError`` unless every marker id is ``< vocab_size``."""
        bad = {n: v for n, v in zip(("call", "sep", "ret"), self.ids) if v >= vocab_size}
        if bad:
            raise ValueError(
                f"PencilTokens ids must lie in [0, {vocab_size}) ({what}), got out-of-vocabulary {bad}"
            )


def check_pencil_tokens(tok: Any) -> PencilTokens:
    """``tok`` if it is a :class:`PencilTokens`, else ``TypeError`` naming ``tok``."""
    if not isinstance(tok, PencilTokens):
        raise TypeError(f"tok must be a PencilTokens(call=, sep=, ret=), got {type(tok).__name__}")
    return tok


def as_index_array(ids: Any, name: str = "ids") -> np.ndarray:
    """A 1-D int64 NumPy view of a list / array / tensor of token ids (validated)."""
    if isinstance(ids, torch.Tensor):
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor of token ids, got dtype {ids.dtype}")
        if ids.dim() != 1:
            raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {tuple(ids.shape)}")
        arr = ids.detach().cpu().numpy().astype(np.int64, copy=False)
    elif isinstance(ids, np.ndarray):
        if not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"{name} must be an integer array of token ids, got dtype {ids.dtype}")
        if ids.ndim != 1:
            raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {ids.shape}")
        arr = ids.astype(np.int64, copy=False)
    elif isinstance(ids, (list, tuple)):
        if not all(_is_int(v) for v in ids):
            bad = next(v for v in ids if not _is_int(v))
            raise TypeError(f"{name} must contain int token ids, got {type(bad).__name__} {bad!r}")
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    else:
        raise TypeError(
            f"{name} must be a list, NumPy array or torch tensor of token ids, got {type(ids).__name__}"
        )
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"{name} must hold non-negative token ids, got minimum {int(arr.min())}")
    return arr


def locate_redex(arr: np.ndarray, tok: PencilTokens) -> tuple[int, int, int] | str | None:
    """``(call, sep, ret)`` indices of φ's redex, ``None`` without a ``[RETURN]``, or a reason it is unmatched."""
    rets = np.flatnonzero(arr == tok.ret)
    if rets.size == 0:
        return None
    r = int(rets[0])
    seps = np.flatnonzero(arr[:r] == tok.sep)
    if seps.size == 0:
        return f"the [RETURN] at position {r} has no [SEP] before it"
    s = int(seps[-1])
    calls = np.flatnonzero(arr[:s] == tok.call)
    if calls.size == 0:
        return f"the [SEP] at position {s} (closing the [RETURN] at {r}) has no [CALL] before it"
    return int(calls[-1]), s, r


def _splice(ids: Ids, c: int, s: int, r: int) -> Ids:
    """``ids[:c] + ids[s+1:r] + ids[r+1:]`` in the type of ``ids``."""
    if isinstance(ids, torch.Tensor):
        return torch.cat([ids[:c], ids[s + 1 : r], ids[r + 1 :]])
    if isinstance(ids, np.ndarray):
        return np.concatenate([ids[:c], ids[s + 1 : r], ids[r + 1 :]])
    out = list(ids[:c]) + list(ids[s + 1 : r]) + list(ids[r + 1 :])
    return tuple(out) if isinstance(ids, tuple) else out


def reduce_once(ids: Ids, tok: PencilTokens, strict: bool = True) -> tuple[Ids, bool]:
    """Apply φ once: ``C [CALL] T [SEP] A [RETURN] D`` → ``C A D`` at the first ``[RETURN]``.

    ``ids``: 1-D token ids, a list/tuple, NumPy integer array or torch integer tensor ``(T,)``. Returns
    ``(reduced, changed)`` with ``reduced`` of the same type, dtype and device; without any ``[RETURN]`` the
    input is returned unchanged with ``changed=False``. An unmatched ``[RETURN]`` (no ``[SEP]`` before it, or
    no ``[CALL]`` before that ``[SEP]``) raises :class:`PencilReductionError` when ``strict``; otherwise it
    warns and returns the input unchanged (the official code's silent no-op, made visible).
    """
    tok = check_pencil_tokens(tok)
    arr = as_index_array(ids)
    where = locate_redex(arr, tok)
    if where is None:
        return ids, False
    if isinstance(where, str):
        if strict:
            raise PencilReductionError(f"ids: unmatched [RETURN]: {where}")
        warnings.warn(f"PENCIL reduction skipped: {where}", RuntimeWarning, stacklevel=2)
        return ids, False
    return _splice(ids, *where), True


def reduce_full(ids: Ids, tok: PencilTokens) -> Ids:
    """Apply φ until no ``[RETURN]`` is left (strict: an unmatched ``[RETURN]`` raises); same type as ``ids``."""
    changed = True
    while changed:
        ids, changed = reduce_once(ids, tok, strict=True)
    return ids


def extract_subsequences(trace_ids: Ids, tok: PencilTokens, prompt_end_id: int) -> list[dict[str, Any]]:
    """The PENCIL training examples of one full trace ``prompt <|endofprompt|> trace EOS``.

    Starting from the full trace, repeatedly emit the current state cut just after its first ``[RETURN]``
    and apply φ (:func:`reduce_once`, strict); finally emit the fully reduced sequence. Each example is
    ``{"ids": <same type as trace_ids>, "loss_start": int}``: positions ``>= loss_start`` are training
    targets. The first example trains everything after ``<|endofprompt|>``; after a reduction
    ``C [CALL] T [SEP] A [RETURN] D → C A D`` the next one starts at ``len(C) + len(A)`` (the official
    ``mask_idx = len(C) + len(A) - 1`` in its shifted-target convention), so the kept context, the spliced
    answer included, is not trained again and every token after the prompt is a target exactly once.

    Unlike the official ``extract_subseqs`` (which locates the first ``[SEP]`` of the whole sequence) this uses
    φ's own rule, so it stays correct with several pending ``[SEP]``. Raises :class:`PencilReductionError` on
    an unmatched ``[RETURN]`` or on a ``[CALL]``/``[SEP]`` left unclosed after the last reduction, and
    ``ValueError`` when ``prompt_end_id`` does not occur.
    """
    tok = check_pencil_tokens(tok)
    if not _is_int(prompt_end_id) or prompt_end_id < 0:
        raise TypeError(f"prompt_end_id must be a non-negative int token id, got {prompt_end_id!r}")
    if int(prompt_end_id) in tok.ids:
        raise ValueError(f"prompt_end_id must differ from the PENCIL markers {tok.ids}, got {prompt_end_id}")
    arr = as_index_array(trace_ids, "trace_ids")
    hits = np.flatnonzero(arr == prompt_end_id)
    if hits.size == 0:
        raise ValueError(
            f"trace_ids must contain the prompt_end_id {prompt_end_id} (<|endofprompt|>), found none"
        )
    first = int(hits[0])
    if np.isin(arr[: first + 1], tok.ids).any():
        raise ValueError(
            "trace_ids: the prompt (through <|endofprompt|>) must not contain [CALL]/[SEP]/[RETURN]"
        )
    out: list[dict[str, Any]] = []
    loss_start = first + 1
    cur: Any = trace_ids
    while True:
        arr = as_index_array(cur, "trace_ids")
        where = locate_redex(arr, tok)
        if where is None:
            break
        if isinstance(where, str):
            raise PencilReductionError(f"trace_ids: unmatched [RETURN]: {where}")
        c, s, r = where
        out.append({"ids": cur[: r + 1], "loss_start": loss_start})
        loss_start = c + (r - s - 1)
        cur = _splice(cur, c, s, r)
    if np.isin(arr, tok.ids).any():
        left = [n for n, v in zip(("[CALL]", "[SEP]"), (tok.call, tok.sep)) if (arr == v).any()]
        raise PencilReductionError(
            f"trace_ids: unclosed frame: {' and '.join(left)} left after the last [RETURN] was reduced"
        )
    out.append({"ids": cur, "loss_start": loss_start})
    return out


def context_profile(trace_ids: Any, tok: PencilTokens) -> list[int]:
    """The context length after each token when ``trace_ids`` is generated with reduction, in linear time.

    Entry ``t`` is the length of the state once token ``t`` is appended and before it is reduced (so the
    peaks, reached at ``[RETURN]`` tokens, are the memory PENCIL needs; the prompt's tokens count too).
    Equal to replaying the trace through repeated :func:`reduce_once` (tested); an unmatched ``[RETURN]``
    raises :class:`PencilReductionError`.
    """
    tok = check_pencil_tokens(tok)
    arr = as_index_array(trace_ids, "trace_ids").tolist()
    calls: list[int] = []
    seps: list[int] = []
    n = 0
    out = []
    for t in arr:
        n += 1
        out.append(n)
        if t == tok.call:
            calls.append(n - 1)
        elif t == tok.sep:
            seps.append(n - 1)
        elif t == tok.ret:
            if not seps:
                raise PencilReductionError(
                    f"trace_ids: unmatched [RETURN]: no [SEP] before the state's position {n - 1}"
                )
            s = seps[-1]
            c = next((p for p in reversed(calls) if p < s), None)
            if c is None:
                raise PencilReductionError(
                    f"trace_ids: unmatched [RETURN]: the [SEP] at {s} has no [CALL] before it"
                )
            gone = s - c + 1
            calls = [p for p in calls if p < c] + [p - gone for p in calls if p > s]
            seps = [p for p in seps if p < c]
            n -= gone + 1
    return out


class PencilCollator:
    """Pad PENCIL sub-sequences into a batch for a causal LM (``transformers.Trainer`` or a plain loop).

    ``features``: a sequence of ``{"ids" (or "input_ids"): 1-D ids, "loss_start": int}`` (the output of
    :func:`extract_subsequences`). Returns ``{"input_ids", "attention_mask", "labels"}``, each ``(B, L)``
    int64, right-padded with ``pad_id``; ``labels`` are the input ids (HF convention: the model shifts them)
    with ``-100`` before ``loss_start`` and on padding. ``max_length`` truncates each example (the official
    ``block_size + 1`` cut); an example whose ``loss_start`` falls beyond the cut keeps no target.
    """

    def __init__(self, pad_id: int, max_length: int | None = None) -> None:
        if not _is_int(pad_id) or pad_id < 0:
            raise ValueError(f"pad_id must be a non-negative int token id, got {pad_id!r}")
        if max_length is not None and (not _is_int(max_length) or max_length < 2):
            raise ValueError(f"max_length must be an int >= 2 or None, got {max_length!r}")
        self.pad_id = int(pad_id)
        self.max_length = None if max_length is None else int(max_length)

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if isinstance(features, (str, bytes)) or not isinstance(features, Sequence) or len(features) == 0:
            raise ValueError(f"features must be a non-empty sequence of dicts, got {type(features).__name__}")
        rows: list[np.ndarray] = []
        starts: list[int] = []
        for i, f in enumerate(features):
            if not isinstance(f, Mapping):
                raise TypeError(
                    f"features[{i}] must be a dict with 'ids' and 'loss_start', got {type(f).__name__}"
                )
            key = "ids" if "ids" in f else "input_ids"
            if key not in f or "loss_start" not in f:
                raise ValueError(
                    f"features[{i}] must have 'ids' (or 'input_ids') and 'loss_start', got {sorted(f)}"
                )
            arr = as_index_array(f[key], f"features[{i}]['{key}']")
            if arr.size == 0:
                raise ValueError(
                    f"features[{i}]['{key}'] must hold at least one token, got an empty sequence"
                )
            ls = f["loss_start"]
            if not _is_int(ls) or not 0 <= ls <= arr.size:
                raise ValueError(f"features[{i}]['loss_start'] must be an int in [0, {arr.size}], got {ls!r}")
            if self.max_length is not None:
                arr = arr[: self.max_length]
            rows.append(arr)
            starts.append(int(ls))
        width = max(r.size for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, (r, ls) in enumerate(zip(rows, starts)):
            t = torch.from_numpy(np.ascontiguousarray(r))
            ids[i, : r.size] = t
            att[i, : r.size] = 1
            if ls < r.size:
                labels[i, ls : r.size] = t[ls:]
        return {"input_ids": ids, "attention_mask": att, "labels": labels}
