"""Mask-Enhanced Autoregressive Prediction — ICML 2025, P04: MEAP masking, collators and attention statistics.

Zhuang et al., "Mask-Enhanced Autoregressive Prediction: Pay Less Attention to Learn More", ICML 2025
(arXiv:2502.07490; official code ``scitix/MEAP``). MEAP trains a decoder-only LM with ordinary causal
next-token prediction (NTP) after overwriting a small random fraction of the *input* tokens with a
``[MASK]`` token; the targets stay the original next tokens. Architecture, attention mask and inference
are unchanged.

* :func:`meap_mask_inputs` — draw ``max(1, floor(T·ratio))`` distinct positions per row from
  ``[0, T-2]`` (the last input position is never masked, as in ``MEAP-Pretain/pretrained/meap_1b.py``),
  never padding or protected positions, and overwrite them with ``mask_id``. Independent positions per
  row by default; ``shared_across_batch=True`` is the official code's one-pattern-per-batch mode (the
  official re-seeding with ``50 + step % 51`` is not reproduced: it repeats the pattern every 51 steps).
* :func:`meap_pretrain_loss` — the MEAP-PT loss of a causal LM: cross-entropy over all positions against
  the unmasked next tokens, with corrupted inputs.
* :class:`MEAPCollator` — a pre-training data collator (pads through transformers'
  ``DataCollatorForLanguageModeling(mlm=False)`` when given a tokenizer; stacks equal-length rows
  otherwise) that masks ``input_ids`` only, never ``labels``.
* :class:`MEAPSFTCollator` — MEAP-SFT as in ``MEAP-SFT/MEAP-SFT.py``: the normal row (prompt + answer +
  EOS, loss on answer + EOS) plus, when the answer is longer than ``min_answer_len`` tokens, a second row
  whose answer has ``max(1, floor(0.1·len))`` positions replaced by ``[MASK]`` and whose labels are
  ``-100`` except at those positions (the original token); ``concat=True`` joins both into one row.
* :func:`add_mask_token` — add ``[MASK]`` to a tokenizer and resize the model's embeddings.
* :func:`meap_attention_stats` — per-layer, per-head entropy and variance of the attention distribution
  renormalised over the non-masked keys (the paper's attention analysis quantity).
* :func:`causal_lm_loss` — the shifted next-token cross-entropy the loss uses; it lives in the area's common
  module :mod:`icml25.llm_efficiency.common.losses` (the PENCIL experiment, P11, trains with it too) and is
  re-exported here.

HF convention throughout: ``labels`` are aligned with ``input_ids`` and the model shifts them, so in a
row of length ``L`` the inputs that predict something are positions ``0..L-2``; the collators mask
those (``T = L - 1``), which is exactly the official block ``x[0:T]`` → ``x[1:T+1]``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng, make_generator
from icml25.llm_efficiency.common.losses import causal_lm_loss

__all__ = [
    "MEAPCollator",
    "MEAPSFTCollator",
    "add_mask_token",
    "causal_lm_loss",
    "mask_hf_batch",
    "meap_attention_stats",
    "meap_mask_inputs",
    "meap_pretrain_loss",
]

_HINT = "call icml25.llm_efficiency.add_mask_token(tokenizer, model) first"


# ------------------------------------------------------------------------------------------ validation
def _token_ids(x: object, name: str) -> torch.Tensor:
    """``x`` if it is a ``(batch >= 1, T >= 2)`` integer tensor of token ids."""
    ids = check_tensor(x, name, ndim=2, dtype="int")
    if ids.shape[0] == 0 or ids.shape[1] < 2:
        raise ValueError(
            f"{name} must have shape (batch, T) with batch >= 1 and T >= 2, got {tuple(ids.shape)}"
        )
    return ids


def _binary_mask(x: object, name: str, shape: torch.Size) -> torch.Tensor | None:
    """``x`` (None, or a bool or 0/1 integer tensor of the shape of input_ids) as a bool tensor."""
    if x is None:
        return None
    return check_tensor(x, name, shape=tuple(shape), dtype=("bool", "int"), binary=True).bool()


def _mask_token_id(mask_id: object, vocab_size: int | None) -> int:
    """``mask_id`` as an int in ``[0, vocab_size)``, with the hint to add the token when it is missing."""
    if mask_id is None:
        raise ValueError(f"mask_id is None: the tokenizer has no mask token; {_HINT}")
    mid = check_int(mask_id, "mask_id", low=0)
    if vocab_size is not None and mid >= vocab_size:
        raise ValueError(
            f"mask_id must be < the vocabulary size {vocab_size}, got {mid}; {_HINT} (it resizes the embeddings)"
        )
    return mid


def _n_masked(n: int, ratio: float) -> int:
    """``max(1, floor(n·ratio))`` for ``ratio > 0`` (the official ``max(1, int(·))``), else 0."""
    if ratio == 0.0:
        return 0
    return max(1, math.floor(n * ratio + 1e-9))


# --------------------------------------------------------------------------------------------- masking
def meap_mask_inputs(
    input_ids: torch.Tensor,
    mask_id: int,
    ratio: float = 0.15,
    exclude_last: bool = True,
    shared_across_batch: bool = False,
    protect: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    vocab_size: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Overwrite ``max(1, floor(n·ratio))`` random input positions of each row with ``mask_id``.

    Args:
        input_ids: ``(B, T)`` integer token ids (the model inputs ``x[0:T]`` of the official code).
        mask_id: id of the ``[MASK]`` token (must be ``< vocab_size`` when that is given).
        ratio: masking ratio in ``[0, 1)``; 0 returns the inputs unchanged. When ``0 < ratio·n < 1`` one
            token is masked anyway (official ``max(1, ·)``), with a warning.
        exclude_last: never mask each row's last real position (``T-1`` without padding): its target is
            the final prediction (official: positions drawn from ``[0, T-2]``).
        shared_across_batch: one set of positions for every row (the official code's mode; positions
            are drawn among those valid in all rows), else independent positions per row (default).
        protect: optional ``(B, T)`` bool tensor of positions never masked (BOS/EOS, an SFT prompt...).
        attention_mask: optional ``(B, T)`` 0/1 tensor; 0 marks padding, never masked, and ``n`` is the
            row's number of real tokens (``T`` without padding).
        vocab_size: when given, ``mask_id`` is checked against it.
        seed, generator: randomness of the draw (a local generator; global RNG untouched).

    Returns:
        ``(masked, positions)``: ``masked`` a new ``(B, T)`` tensor (the input is not modified) and
        ``positions`` the ``(B, T)`` bool tensor of masked positions. When a row has fewer candidate
        positions than ``max(1, floor(n·ratio))``, all its candidates are masked.
    """
    ids = _token_ids(input_ids, "input_ids")
    mid = _mask_token_id(mask_id, vocab_size)
    r = check_float(ratio, "ratio", low=0.0, high=1.0, high_open=True)
    prot = _binary_mask(protect, "protect", ids.shape)
    att = _binary_mask(attention_mask, "attention_mask", ids.shape)
    if not isinstance(exclude_last, bool):
        raise TypeError(f"exclude_last must be a bool, got {type(exclude_last).__name__}")
    if not isinstance(shared_across_batch, bool):
        raise TypeError(f"shared_across_batch must be a bool, got {type(shared_across_batch).__name__}")
    gen = make_generator(seed, generator)
    B, T = ids.shape
    if r == 0.0:
        return ids.clone(), torch.zeros_like(ids, dtype=torch.bool)
    valid = torch.ones(B, T, dtype=torch.bool) if att is None else att.cpu().clone()
    n_real = valid.sum(1)
    cand = valid.clone()
    if exclude_last:
        has = n_real > 0
        last = (torch.arange(T).expand(B, T) * valid).argmax(1)  # last real position per row
        cand[torch.arange(B)[has], last[has]] = False
    if prot is not None:
        cand &= ~prot.cpu()
    counts = torch.tensor([_n_masked(int(n), r) if n > 0 else 0 for n in n_real])
    if bool(((n_real > 0) & (n_real.double() * r < 1)).any()):
        warnings.warn(
            f"ratio * T < 1 (ratio={r}, shortest row {int(n_real[n_real > 0].min())} tokens): masking 1 token "
            "per row anyway, as the official max(1, floor(T * ratio))",
            UserWarning,
            stacklevel=2,
        )
    if shared_across_batch:
        common = cand.all(0)
        scores = torch.rand(T, generator=gen)
        scores[~common] = 2.0
        rank = torch.argsort(torch.argsort(scores))
        pos1 = (rank < int(counts.min())) & common
        positions = pos1.expand(B, T).clone()
    else:
        scores = torch.rand(B, T, generator=gen)
        scores[~cand] = 2.0
        rank = torch.argsort(torch.argsort(scores, dim=1), dim=1)
        positions = (rank < counts[:, None]) & cand
    positions = positions.to(ids.device)
    masked = ids.masked_fill(positions, mid)
    return masked, positions


def _model_vocab(model: Any) -> int | None:
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        emb = get()
        if emb is not None and hasattr(emb, "num_embeddings"):
            return int(emb.num_embeddings)
    return None


def _logits(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, Mapping):
        logits = out.get("logits")
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"model must return logits (a tensor or an object with .logits), got {type(out).__name__}"
        )
    return logits


def meap_pretrain_loss(
    model: Any,
    input_ids: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    mask_id: int,
    ratio: float = 0.15,
    ignore_index: int = -100,
    attention_mask: torch.Tensor | None = None,
    protect: torch.Tensor | None = None,
    shared_across_batch: bool = False,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """MEAP pre-training loss: next-token cross-entropy against the *unmasked* tokens, corrupted inputs.

    Args:
        model: a causal LM called as ``model(input_ids=..., attention_mask=...)`` returning ``(B, L, V)``
            logits (a tensor or an object with ``.logits``, e.g. any HF ``AutoModelForCausalLM``).
        input_ids: ``(B, L)`` token ids (HF convention: labels aligned with inputs, shifted inside).
        labels: ``(B, L)`` targets, default ``input_ids`` with padding (``attention_mask == 0``) ignored.
        mask_id, ratio, protect, shared_across_batch, seed, generator: see :func:`meap_mask_inputs`,
            applied to the predicting inputs ``input_ids[:, :L-1]`` (``T = L - 1``).
        ignore_index: label value that is skipped.
        attention_mask: optional ``(B, L)`` 0/1 padding mask, passed to the model.

    Returns:
        scalar loss; with ``ratio=0`` exactly the standard causal-LM loss.
    """
    ids = _token_ids(input_ids, "input_ids")
    if not callable(model):
        raise TypeError(f"model must be a callable causal LM, got {type(model).__name__}")
    check_int(ignore_index, "ignore_index", low=-(2**62))
    if labels is not None:
        _token_ids(labels, "labels")
        if labels.shape != ids.shape:
            raise ValueError(
                f"labels must have the shape of input_ids {tuple(ids.shape)}, got {tuple(labels.shape)}"
            )
    att = _binary_mask(attention_mask, "attention_mask", ids.shape)
    masked = mask_hf_batch(
        ids,
        mask_id,
        ratio,
        attention_mask=attention_mask,
        protect=protect,
        shared_across_batch=shared_across_batch,
        vocab_size=_model_vocab(model),
        seed=seed,
        generator=generator,
    )[0]
    if labels is None:
        labels = ids.masked_fill(~att, ignore_index) if att is not None else ids
    kwargs = {"input_ids": masked}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    return causal_lm_loss(_logits(model(**kwargs)), labels, ignore_index)


def mask_hf_batch(
    input_ids: torch.Tensor,
    mask_id: int,
    ratio: float,
    *,
    attention_mask: torch.Tensor | None = None,
    protect: torch.Tensor | None = None,
    shared_across_batch: bool = False,
    vocab_size: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`meap_mask_inputs` on the predicting inputs ``input_ids[:, :L-1]`` of an HF-convention batch
    ``(B, L)`` (the final column, which predicts nothing, is kept); returns ``(B, L)`` masked ids and
    positions. ``protect``/``attention_mask`` are ``(B, L)``."""
    ids = _token_ids(input_ids, "input_ids")
    if ids.shape[1] < 3:
        raise ValueError(f"input_ids must have length L >= 3 (T = L - 1 >= 2 inputs), got {tuple(ids.shape)}")
    prot = _binary_mask(protect, "protect", ids.shape)
    att = _binary_mask(attention_mask, "attention_mask", ids.shape)
    if att is not None:
        # The last real token of a right-padded row predicts nothing: treat it like the final column.
        n = att.sum(1)
        att = att.clone()
        rows = torch.arange(ids.shape[0])[n > 0]
        att[rows, n[n > 0] - 1] = False
        att = att[:, :-1]
    head, pos = meap_mask_inputs(
        ids[:, :-1],
        mask_id,
        ratio,
        exclude_last=True,
        shared_across_batch=shared_across_batch,
        protect=None if prot is None else prot[:, :-1],
        attention_mask=att,
        vocab_size=vocab_size,
        seed=seed,
        generator=generator,
    )
    z = torch.zeros_like(pos[:, :1])
    return torch.cat([head, ids[:, -1:]], 1), torch.cat([pos, z], 1)


# ------------------------------------------------------------------------------------------ tokenizer
def add_mask_token(tokenizer: Any, model: Any = None, token: str = "[MASK]", seed: int = 0) -> int:
    """Add ``token`` as the tokenizer's mask token (unless it has one) and grow ``model``'s embeddings.

    Args:
        tokenizer: a transformers tokenizer (``add_special_tokens``, ``mask_token_id``, ``len``).
        model: optional HF model; ``resize_token_embeddings(len(tokenizer))`` is called when its input
            embedding has fewer rows than the tokenizer (so it grows by exactly the added token).
        token: the mask token's string.
        seed: seeds the initialisation of the new embedding rows (global RNG restored afterwards).

    Returns:
        the mask token id.
    """
    if not isinstance(token, str) or not token:
        raise TypeError(f"token must be a non-empty str, got {token!r}")
    for attr in ("add_special_tokens", "convert_tokens_to_ids"):
        if not callable(getattr(tokenizer, attr, None)):
            raise TypeError(
                f"tokenizer must be a transformers tokenizer (with {attr}), got {type(tokenizer).__name__}"
            )
    if model is not None and not callable(getattr(model, "resize_token_embeddings", None)):
        raise TypeError(
            f"model must be a transformers model (resize_token_embeddings), got {type(model).__name__}"
        )
    if getattr(tokenizer, "mask_token", None) is None:
        tokenizer.add_special_tokens({"mask_token": token})
    mid = tokenizer.mask_token_id
    if model is not None:
        vocab = _model_vocab(model)
        if vocab is None or vocab < len(tokenizer):
            with isolated_rng(seed):
                model.resize_token_embeddings(len(tokenizer))
    return int(mid)


# ------------------------------------------------------------------------------------------ collators
def _as_list(v: Any, name: str) -> list[int]:
    if isinstance(v, torch.Tensor):
        v = v.tolist()
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise TypeError(f"{name} must be a sequence of int token ids, got {type(v).__name__}")
    out = list(v)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in out):
        raise TypeError(f"{name} must hold int token ids")
    return out


def _pad(rows: list[list[int]], value: int, side: str = "right") -> torch.Tensor:
    L = max(len(r) for r in rows)
    fill = [[value] * (L - len(r)) for r in rows]
    return torch.tensor([r + f if side == "right" else f + r for r, f in zip(rows, fill, strict=True)])


class MEAPCollator:
    """Data collator for MEAP pre-training of a causal LM (``transformers.Trainer`` or a plain loop).

    Builds the usual causal-LM batch (``input_ids``, ``attention_mask``, ``labels`` = ``input_ids`` with
    padding set to ``-100``), then masks :func:`mask_hf_batch` positions of ``input_ids`` only; the
    labels keep the original tokens. With a ``tokenizer``, padding goes through
    ``DataCollatorForLanguageModeling(tokenizer, mlm=False)`` (needs the ``[hf]`` extra), ``mask_id``
    defaults to ``tokenizer.mask_token_id`` and the tokenizer's BOS/EOS/PAD ids are protected. Without
    one, features must be equal-length ``input_ids`` rows. A feature may carry ``meap_protect``, a 0/1
    list as long as its ``input_ids``: positions never masked (e.g. a question the model must read),
    on top of ``protect_ids``; it is removed from the batch.

    Args:
        tokenizer: optional transformers tokenizer.
        mask_id: ``[MASK]`` id (default: the tokenizer's).
        ratio: masking ratio in ``[0, 1)`` (paper pre-training: 0.15).
        protect_ids: token ids never masked (default: the tokenizer's BOS/EOS/PAD ids).
        shared_across_batch: one position set per batch (official mode) instead of per row.
        seed, generator: randomness of the masks (a local generator advanced at every call).

    Set ``collator.apply_mask = False`` (or use ``ratio=0``) for evaluation: inference never sees
    ``[MASK]``.
    """

    def __init__(
        self,
        tokenizer: Any = None,
        mask_id: int | None = None,
        ratio: float = 0.15,
        protect_ids: Sequence[int] | None = None,
        shared_across_batch: bool = False,
        seed: int | None = 0,
        generator: torch.Generator | None = None,
    ) -> None:
        self.ratio = check_float(ratio, "ratio", low=0.0, high=1.0, high_open=True)
        self.tokenizer = tokenizer
        vocab = None
        if tokenizer is not None:
            if not callable(getattr(tokenizer, "pad", None)):
                raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
            if mask_id is None:
                mask_id = getattr(tokenizer, "mask_token_id", None)
            vocab = len(tokenizer)
        self.mask_id = _mask_token_id(mask_id, vocab)
        if protect_ids is None:
            ids = [getattr(tokenizer, a, None) for a in ("bos_token_id", "eos_token_id", "pad_token_id")]
            protect_ids = [i for i in ids if i is not None]
        self.protect_ids = tuple(_as_list(protect_ids, "protect_ids"))
        if not isinstance(shared_across_batch, bool):
            raise TypeError(f"shared_across_batch must be a bool, got {type(shared_across_batch).__name__}")
        self.shared_across_batch = shared_across_batch
        self.generator = make_generator(seed, generator)
        self.apply_mask = True
        self._base = None
        if tokenizer is not None:
            try:
                from transformers import DataCollatorForLanguageModeling
            except ImportError as err:  # pragma: no cover - exercised only without the extra
                raise ImportError(
                    "MEAPCollator(tokenizer=...) needs transformers: pip install 'icml25-llm-efficiency[hf]'"
                ) from err
            self._base = DataCollatorForLanguageModeling(tokenizer, mlm=False)

    def _plain(self, features: Sequence[Any]) -> dict[str, torch.Tensor]:
        rows = []
        for i, f in enumerate(features):
            v = f["input_ids"] if isinstance(f, Mapping) else f
            rows.append(_as_list(v, f"features[{i}]['input_ids']"))
        if len({len(r) for r in rows}) != 1:
            raise ValueError(
                "features must have equal-length input_ids without a tokenizer (pass tokenizer= to pad), "
                f"got lengths {sorted({len(r) for r in rows})}"
            )
        ids = torch.tensor(rows)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    def _split_protect(self, features: Sequence[Any]) -> tuple[list[Any], list[list[int]]]:
        """Split the optional per-position ``meap_protect`` lists off the features."""
        out, rows = [], []
        for i, f in enumerate(features):
            p: list[int] = []
            if isinstance(f, Mapping) and "meap_protect" in f:
                f = dict(f)
                p = _as_list(f.pop("meap_protect"), f"features[{i}]['meap_protect']")
                n = len(_as_list(f.get("input_ids", []), f"features[{i}]['input_ids']"))
                if len(p) != n or any(v not in (0, 1) for v in p):
                    raise ValueError(
                        f"features[{i}]['meap_protect'] must be a 0/1 list of length {n} (its input_ids), "
                        f"got length {len(p)}"
                    )
            ids = f.get("input_ids") if isinstance(f, Mapping) else f
            if ids is None:
                raise ValueError(f"features[{i}] must have 'input_ids', got keys {sorted(f)}")
            if len(_as_list(ids, f"features[{i}]['input_ids']")) < 3:
                raise ValueError(f"features[{i}]['input_ids'] must have at least 3 tokens, got {len(ids)}")
            rows.append(p)
            out.append(f)
        return out, rows

    def __call__(self, features: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Collate ``features`` (dicts with ``input_ids``, or id lists) into a masked ``(B, L)`` batch."""
        if isinstance(features, (str, bytes, Mapping)) or not isinstance(features, Sequence) or not features:
            raise ValueError(
                f"features must be a non-empty sequence of examples, got {type(features).__name__}"
            )
        features, prot_rows = self._split_protect(features)
        batch = dict(self._base(list(features))) if self._base is not None else self._plain(features)
        ids = batch["input_ids"]
        if "attention_mask" not in batch:
            batch["attention_mask"] = torch.ones_like(ids)
        if not self.apply_mask or self.ratio == 0.0:
            return batch
        protect = torch.zeros_like(ids, dtype=torch.bool)
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        for i, p in enumerate(prot_rows):
            if p:
                t = torch.tensor(p, dtype=torch.bool)
                if left:
                    protect[i, ids.shape[1] - len(p) :] |= t
                else:
                    protect[i, : len(p)] |= t
        for t in self.protect_ids:
            protect |= ids == t
        batch["input_ids"], _ = mask_hf_batch(
            ids,
            self.mask_id,
            self.ratio,
            attention_mask=batch["attention_mask"],
            protect=protect,
            shared_across_batch=self.shared_across_batch,
            generator=self.generator,
        )
        return batch


class MEAPSFTCollator:
    """MEAP supervised fine-tuning collator (official ``MEAP-SFT.py``, ``preprocess_function``).

    Each example (a dict with ``prompt_ids`` and ``answer_ids`` id lists, or ``prompt``/``answer``
    strings encoded by ``tokenizer`` without special tokens for the answer) gives

    1. the normal row ``prompt + answer + [EOS]`` with labels ``-100`` on the prompt, the answer and EOS
       as labels;
    2. when ``len(answer) > min_answer_len``, a masked copy ``prompt + answer + [EOS]`` in which
       ``max(1, floor(len(answer)·ratio))`` answer positions are ``[MASK]`` and the labels are ``-100``
       everywhere except at those positions, which hold the original token (so position ``i-1``
       predicts the hidden ``x_i``). The prompt and EOS are never masked.

    ``concat=False`` (default, as the official code) emits the copy as a separate row; ``concat=True``
    appends it to the normal row. Rows are right-padded with ``pad_id`` (labels ``-100``). With
    ``max_length``, rows are truncated as in the official code (``... + [EOS]``); an example whose
    prompt already fills ``max_length`` is skipped and counted in ``n_skipped``.

    Args:
        tokenizer: optional transformers tokenizer (string examples; default ids for EOS/PAD/MASK).
        mask_id, eos_id, pad_id: token ids (default: the tokenizer's; ``pad_id`` falls back to EOS).
        ratio: fraction of answer tokens masked in the copy, in ``[0, 1)`` (paper 0.1).
        min_answer_len: the copy is made only for answers longer than this (official 50).
        max_length: optional row length cap.
        concat: one row (normal + copy) instead of two.
        seed, generator: randomness of the masked positions.
    """

    def __init__(
        self,
        tokenizer: Any = None,
        mask_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        ratio: float = 0.1,
        min_answer_len: int = 50,
        max_length: int | None = None,
        concat: bool = False,
        seed: int | None = 0,
        generator: torch.Generator | None = None,
    ) -> None:
        self.ratio = check_float(ratio, "ratio", low=0.0, high=1.0, high_open=True)
        vocab = None
        if tokenizer is not None:
            if not callable(getattr(tokenizer, "encode", None)):
                raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
            mask_id = tokenizer.mask_token_id if mask_id is None else mask_id
            eos_id = tokenizer.eos_token_id if eos_id is None else eos_id
            pad_id = tokenizer.pad_token_id if pad_id is None else pad_id
            vocab = len(tokenizer)
        self.tokenizer = tokenizer
        self.mask_id = _mask_token_id(mask_id, vocab)
        if eos_id is None:
            raise ValueError("eos_id is None: pass eos_id= or a tokenizer with an EOS token")
        self.eos_id = check_int(eos_id, "eos_id", low=0)
        self.pad_id = self.eos_id if pad_id is None else check_int(pad_id, "pad_id", low=0)
        self.min_answer_len = check_int(min_answer_len, "min_answer_len", low=0)
        self.max_length = None if max_length is None else check_int(max_length, "max_length", low=2)
        if not isinstance(concat, bool):
            raise TypeError(f"concat must be a bool, got {type(concat).__name__}")
        self.concat = concat
        self.generator = make_generator(seed, generator)
        self.n_skipped = 0

    def _ids(self, f: Mapping[str, Any], key: str, i: int) -> list[int]:
        if f"{key}_ids" in f:
            return _as_list(f[f"{key}_ids"], f"features[{i}]['{key}_ids']")
        if key in f and self.tokenizer is not None:
            text = f[key]
            if not isinstance(text, str):
                raise TypeError(f"features[{i}]['{key}'] must be a str, got {type(text).__name__}")
            return list(self.tokenizer.encode(text, add_special_tokens=key == "prompt"))
        raise ValueError(
            f"features[{i}] must have '{key}_ids' (token ids) or '{key}' (text, with a tokenizer); "
            f"got keys {sorted(f)}"
        )

    def rows(self, prompt: list[int], answer: list[int]) -> list[tuple[list[int], list[int]]]:
        """The ``(input_ids, labels)`` rows of one example (before padding); ``[]`` if skipped."""
        ml = self.max_length
        if ml is not None and len(prompt) >= ml:
            self.n_skipped += 1
            return []
        seq = prompt + answer + [self.eos_id]
        lab = [-100] * len(prompt) + answer + [self.eos_id]
        if ml is not None and len(seq) > ml:
            seq, lab = [*seq[: ml - 1], self.eos_id], [*lab[: ml - 1], self.eos_id]
        out = [(seq, lab)]
        if len(answer) > self.min_answer_len and self.ratio > 0:
            full = prompt + answer
            start = len(prompt)
            end = len(full) if ml is None else min(len(full), ml - 1)
            n = _n_masked(end - start, self.ratio)
            order = torch.randperm(end - start, generator=self.generator)[:n] + start
            mseq, mlab = full[:end], [-100] * end
            for p in order.tolist():
                mseq[p], mlab[p] = self.mask_id, full[p]
            out.append(([*mseq, self.eos_id], [*mlab, -100]))
        if self.concat and len(out) == 2:
            out = [(out[0][0] + out[1][0], out[0][1] + out[1][1])]
        return out

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        """Collate SFT examples into ``input_ids``/``attention_mask``/``labels`` of shape ``(R, L)``."""
        if isinstance(features, (str, bytes, Mapping)) or not isinstance(features, Sequence) or not features:
            raise ValueError(
                f"features must be a non-empty sequence of examples, got {type(features).__name__}"
            )
        pairs: list[tuple[list[int], list[int]]] = []
        for i, f in enumerate(features):
            if not isinstance(f, Mapping):
                raise TypeError(f"features[{i}] must be a dict with prompt/answer, got {type(f).__name__}")
            pairs += self.rows(self._ids(f, "prompt", i), self._ids(f, "answer", i))
        if not pairs:
            raise ValueError(
                f"every example was skipped: each prompt fills max_length={self.max_length} (n_skipped={self.n_skipped})"
            )
        ids = _pad([p[0] for p in pairs], self.pad_id)
        labels = _pad([p[1] for p in pairs], -100)
        att = _pad([[1] * len(p[0]) for p in pairs], 0)
        return {"input_ids": ids, "attention_mask": att, "labels": labels}


# ------------------------------------------------------------------------------------- attention stats
@torch.no_grad()
def meap_attention_stats(
    model: Any,
    batch: Mapping[str, torch.Tensor] | torch.Tensor,
    mask_id: int | None = None,
    query_positions: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-layer, per-head entropy and variance of attention renormalised over non-masked keys.

    Args:
        model: an HF causal LM that returns ``attentions`` with ``output_attentions=True`` (eager
            attention, e.g. ``model.set_attn_implementation("eager")``).
        batch: ``(B, L)`` ``input_ids`` or a dict with ``input_ids`` (and optionally ``attention_mask``).
        mask_id: keys holding this id (``[MASK]``) are left out and the weights renormalised; None keeps
            every key.
        query_positions: optional ``(B,)`` position of the query row to analyse in each sequence (e.g.
            the answer position); default: every non-padding position.

    Returns:
        dict with ``entropy`` and ``variance``, each ``(n_layers, n_heads)`` (mean over queries and
        rows), and ``n_keys`` (mean number of non-masked keys seen per query).
    """
    if isinstance(batch, torch.Tensor):
        batch = {"input_ids": batch}
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise TypeError("batch must be an input_ids tensor or a dict with 'input_ids'")
    ids = _token_ids(batch["input_ids"], "batch['input_ids']")
    att = _binary_mask(batch.get("attention_mask"), "batch['attention_mask']", ids.shape)
    if mask_id is not None:
        _mask_token_id(mask_id, _model_vocab(model))
    B, L = ids.shape
    if query_positions is not None:
        q = query_positions
        if (
            not isinstance(q, torch.Tensor)
            or q.is_floating_point()
            or q.is_complex()
            or q.dtype == torch.bool
        ):
            raise TypeError(f"query_positions must be an integer tensor of shape ({B},) or None, got {q!r}")
        if tuple(q.shape) != (B,) or bool(((q < 0) | (q >= L)).any()):
            raise ValueError(
                f"query_positions must have shape ({B},) with positions in [0, {L}), got shape {tuple(q.shape)}"
            )
        q = q.long().cpu()
    kwargs: dict[str, Any] = {"input_ids": ids, "output_attentions": True}
    if att is not None:
        kwargs["attention_mask"] = att.long()
    out = model(**kwargs)
    attn = getattr(out, "attentions", None)
    if not attn or attn[0] is None:
        raise ValueError(
            "model returned no attentions: use eager attention (model.set_attn_implementation('eager'))"
        )
    keys = torch.ones(B, L, dtype=torch.bool) if att is None else att.clone()
    if mask_id is not None:
        keys &= ids != mask_id
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    allowed = causal[None] & keys[:, None, :]  # (B, Lq, Lk)
    if query_positions is None:
        qsel = torch.ones(B, L, dtype=torch.bool) if att is None else att.clone()
    else:
        qsel = torch.zeros(B, L, dtype=torch.bool)
        qsel[torch.arange(B), q] = True
    qsel &= allowed.any(-1)
    ents, vars_ = [], []
    for a in attn:
        p = a.float() * allowed[:, None]  # (B, H, Lq, Lk)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        ent = -(p * p.clamp_min(1e-30).log()).sum(-1)  # (B, H, Lq)
        n = allowed.sum(-1).clamp_min(1)[:, None].float()  # (B, 1, Lq)
        mean = 1.0 / n
        var = ((p - mean[..., None]) ** 2 * allowed[:, None]).sum(-1) / n
        w = qsel[:, None].float()
        ents.append((ent * w).sum((0, 2)) / w.sum((0, 2)).clamp_min(1))
        vars_.append((var * w).sum((0, 2)) / w.sum((0, 2)).clamp_min(1))
    n_keys = (allowed.sum(-1).float() * qsel).sum() / qsel.sum().clamp_min(1)
    return {"entropy": torch.stack(ents), "variance": torch.stack(vars_), "n_keys": n_keys}
