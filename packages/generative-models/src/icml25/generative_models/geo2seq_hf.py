"""Geometry Informed Tokenization of Molecules for Language Model Generation — ICML 2025, P27: Hugging Face LM.

Li et al., ICML 2025 (official code ``divelab/AIRS``, ``OpenMol/Geo2Seq``, which trains GPT and Mamba
models on Geo2Seq strings with next-token cross-entropy and samples with top-k and temperature). Here the
language model is a ``transformers`` causal LM built from a config:

- :func:`to_fast_tokenizer`: a :class:`~icml25.generative_models.geo2seq.Geo2SeqTokenizer` as a
  ``transformers.PreTrainedTokenizerFast`` (WordLevel model, whitespace split, ``<s> … </s>`` template);
- :func:`build_gpt2`: a randomly initialised ``GPT2LMHeadModel`` for the vocabulary (seeded, global RNG
  untouched);
- :func:`train_lm`: AdamW next-token training with gradient clipping 1.0 (the official setting);
- :func:`sample_sequences`: ``generate()`` with top-k / temperature, decoded to Geo2Seq strings.

Needs the ``hf`` extra.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "Geo2Seq's language models need transformers: pip install 'icml25-generative-models[hf]'"
    ) from exc

from icml25.generative_models.geo2seq import SPECIAL_TOKENS, Geo2SeqTokenizer
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["build_gpt2", "sample_sequences", "to_fast_tokenizer", "train_lm"]


def _int(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _float(name: str, value: object, low: float = 0.0) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= low
    ):
        raise ValueError(f"{name} must be a finite number > {low:g}, got {value!r}")
    return float(value)


def to_fast_tokenizer(tokenizer: Geo2SeqTokenizer) -> Any:
    """``transformers.PreTrainedTokenizerFast`` with the vocabulary and ids of ``tokenizer``.

    WordLevel model with ``<unk>``, whitespace pre-tokenizer, a template that wraps every text in
    ``<s> … </s>``, and ``pad/bos/eos/unk`` set; ``decode(ids, skip_special_tokens=True)`` gives the
    Geo2Seq string back (tokens joined by single spaces).
    """
    if not isinstance(tokenizer, Geo2SeqTokenizer):
        raise TypeError(f"tokenizer must be a Geo2SeqTokenizer, got {type(tokenizer).__name__}")
    vocab = tokenizer._fitted()
    pad, bos, eos, unk = SPECIAL_TOKENS

    def special(t: str) -> dict:
        return {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}  # fmt: skip

    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [special(t) for t in SPECIAL_TOKENS],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": eos, "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": eos, "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}},
                     {"SpecialToken": {"id": eos, "type_id": 0}}],
            "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in (bos, eos)},
        },
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": unk},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
        return transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(path), pad_token=pad, bos_token=bos, eos_token=eos, unk_token=unk
        )


def build_gpt2(
    vocab_size: int,
    *,
    n_layer: int = 2,
    n_embd: int = 128,
    n_head: int = 4,
    n_positions: int = 72,
    seed: int = 0,
    **config_kwargs: Any,
) -> Any:
    """A random-init ``transformers.GPT2LMHeadModel`` (paper: 8–12 layers, n_embd 768; defaults here are the
    CPU-scale 2 layers, 128 wide, 4 heads, context 72). Special ids follow :data:`SPECIAL_TOKENS`
    (pad 0, bos 1, eos 2). Initialised under ``isolated_rng(seed)``: the caller's global RNG is untouched."""
    vocab_size = _int("vocab_size", vocab_size, 5)
    n_layer, n_embd, n_head = _int("n_layer", n_layer), _int("n_embd", n_embd), _int("n_head", n_head)
    n_positions = _int("n_positions", n_positions, 2)
    if n_embd % n_head:
        raise ValueError(f"n_embd must be divisible by n_head, got n_embd={n_embd}, n_head={n_head}")
    cfg = transformers.GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **config_kwargs,
    )
    with isolated_rng(seed):
        return transformers.GPT2LMHeadModel(cfg)


def train_lm(
    model: torch.nn.Module,
    ids: np.ndarray | torch.Tensor,
    mask: np.ndarray | torch.Tensor,
    *,
    epochs: float = 1.0,
    batch_size: int = 32,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    seed: int = 0,
    callback: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Next-token training of a causal LM on padded ``ids`` ``(B, L)`` with ``mask`` ``(B, L)`` (1 = real
    token): AdamW at a constant ``lr``, shuffled mini-batches from ``seed``, gradient-norm clip
    ``grad_clip``, dropout under ``isolated_rng(seed)``, padding excluded from the loss (each batch is cut to its longest sequence). ``epochs`` may be fractional (``round(epochs · B /
    batch_size)`` steps, at least 1). Returns the loss of every step; validates everything before training.
    """
    ids_t = torch.as_tensor(ids)
    mask_t = torch.as_tensor(mask)
    if ids_t.dtype not in (torch.int64, torch.int32) or ids_t.dim() != 2 or 0 in ids_t.shape:
        raise ValueError(
            f"ids must be a non-empty integer (B, L) array, got {tuple(ids_t.shape)} {ids_t.dtype}"
        )
    if mask_t.shape != ids_t.shape:
        raise ValueError(f"mask must have the shape of ids {tuple(ids_t.shape)}, got {tuple(mask_t.shape)}")
    vocab = model.get_input_embeddings().num_embeddings
    if int(ids_t.min()) < 0 or int(ids_t.max()) >= vocab:
        raise ValueError(
            f"ids must lie in [0, {vocab}) (the model's vocabulary), got [{int(ids_t.min())}, {int(ids_t.max())}]"
        )
    epochs = _float("epochs", epochs)
    batch_size = _int("batch_size", batch_size)
    lr, grad_clip = _float("lr", lr), _float("grad_clip", grad_clip)
    ids_t, mask_t = ids_t.long(), mask_t.long()
    labels = ids_t.masked_fill(mask_t == 0, -100)
    n = ids_t.shape[0]
    steps = max(1, round(epochs * n / batch_size))
    gen = make_generator(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    with isolated_rng(seed):  # dropout draws: reproducible, the caller's global RNG untouched
        losses: list[float] = []
        order = torch.randperm(n, generator=gen)
        cursor = 0
        for step in range(steps):
            if cursor + batch_size > n:
                order, cursor = torch.randperm(n, generator=gen), 0
            idx = order[cursor : cursor + batch_size]
            cursor += batch_size
            width = int(
                mask_t[idx].sum(1).max()
            )  # trim the batch to its longest sequence (same loss, less work)
            out = model(
                input_ids=ids_t[idx, :width], attention_mask=mask_t[idx, :width], labels=labels[idx, :width]
            )
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            losses.append(float(out.loss.detach()))
            if callback is not None:
                callback(step, losses[-1])
    model.eval()
    return losses


@torch.no_grad()
def sample_sequences(
    model: torch.nn.Module,
    tokenizer: Geo2SeqTokenizer,
    n: int,
    *,
    max_length: int = 72,
    top_k: int = 50,
    temperature: float = 0.7,
    batch_size: int = 100,
    seed: int = 0,
) -> list[str]:
    """``n`` Geo2Seq strings sampled from ``model`` with ``generate()`` (top-k ``top_k``, ``temperature``;
    the paper samples with top-k 50, T 0.7; lower T / k give more valid but less diverse molecules),
    starting from ``<s>`` and stopping at ``</s>`` or ``max_length`` tokens. Sampling runs under
    ``isolated_rng(seed)``: reproducible, and the caller's global RNG is untouched."""
    if not isinstance(tokenizer, Geo2SeqTokenizer):
        raise TypeError(f"tokenizer must be a Geo2SeqTokenizer, got {type(tokenizer).__name__}")
    tokenizer._fitted()
    n, max_length, top_k = _int("n", n), _int("max_length", max_length, 2), _int("top_k", top_k)
    temperature, batch_size = _float("temperature", temperature), _int("batch_size", batch_size)
    model.eval()
    out: list[str] = []
    with isolated_rng(seed):
        while len(out) < n:
            b = min(batch_size, n - len(out))
            start = torch.full((b, 1), tokenizer.bos_id, dtype=torch.long)
            gen = model.generate(
                input_ids=start,
                attention_mask=torch.ones_like(start),
                do_sample=True,
                top_k=top_k,
                temperature=temperature,
                max_length=max_length,
                pad_token_id=tokenizer.pad_id,
                eos_token_id=tokenizer.eos_id,
                bos_token_id=tokenizer.bos_id,
            )
            out.extend(tokenizer.decode(row.tolist()) for row in gen)
    return out
