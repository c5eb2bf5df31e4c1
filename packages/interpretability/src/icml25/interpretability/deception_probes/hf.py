"""Detecting Strategic Deception Using Linear Probes — ICML 2025, P52: activations from Hugging Face transformers models.

The paper probes the residual stream of Llama-3.3-70B-Instruct after one layer (``hidden_states[22]``
of 80 in the official configuration) on the tokens of the assistant's response. Here, for any
transformers causal LM and its (fast) tokenizer with a chat template:

* :func:`format_dialogue` renders a dialogue with the chat template and returns the character spans
  of the messages marked ``detect=True`` (consecutive messages of one role are merged into one turn,
  as the official code does, so the Instructed-Pairs fact and its dropped last words form one
  assistant turn);
* :func:`tokenize_dialogue` maps those spans to tokens through the tokenizer's character offsets, so
  template tokens (Llama-3's ``<|start_header_id|>assistant<|end_header_id|>``, ``<|eot_id|>``) are
  never in the mask;
* :func:`extract_hidden_states` does the same on already tokenized ``input_ids`` with a detection mask;
* :func:`extract_activations` runs the model with ``output_hidden_states=True`` and keeps
  ``hidden_states[layer]`` on the masked tokens, where ``hidden_states[0]`` is the embedding output and
  ``hidden_states[n_layers]`` the last layer's output; half-precision activations come back as float32.

Needs the ``[hf]`` extra (transformers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

try:
    from transformers import PreTrainedTokenizerBase
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "activation extraction from transformers models needs transformers: "
        "pip install 'icml25-interpretability[hf]'"
    ) from err

from icml25.interpretability.deception_probes.data import (
    TokenActs,
    detection_mask_from_offsets,
    labels_tensor,
)
from icml25.kernels.checks import check_int

__all__ = ["extract_activations", "extract_hidden_states", "format_dialogue", "tokenize_dialogue"]


def _check_tokenizer(tokenizer: Any) -> None:
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            "tokenizer must be a fast tokenizer (character offsets are needed for the detection mask)"
        )
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("tokenizer must have a chat template (tokenizer.chat_template is None)")


def _merged_turns(dialogue: Any) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """``[(role, content, detect spans relative to content)]`` with consecutive same-role messages merged."""
    if not isinstance(dialogue, (list, tuple)) or not dialogue:
        raise ValueError("dialogue must be a non-empty list of messages {'role', 'content', 'detect'}")
    turns: list[tuple[str, str, list[tuple[int, int]]]] = []
    for i, m in enumerate(dialogue):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(f"dialogue[{i}] must be a dict with str 'role' and 'content', got {m!r}")
        detect = m.get("detect", False)
        if not isinstance(detect, bool):
            raise TypeError(f"dialogue[{i}]['detect'] must be a bool, got {type(detect).__name__}")
        if turns and turns[-1][0] == m["role"]:
            role, content, spans = turns[-1]
        else:
            role, content, spans = m["role"], "", []
            turns.append((role, content, spans))
        if detect and m["content"]:
            spans.append((len(content), len(content) + len(m["content"])))
        turns[-1] = (role, content + m["content"], spans)
    return turns


def format_dialogue(tokenizer: Any, dialogue: Sequence[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """The chat-template text of ``dialogue`` and the character spans of its ``detect=True`` messages.

    Each turn's content is located in the rendered text in order; a template that trims the content
    (Llama-3's does) is handled by locating the trimmed content. Raises ValueError when a turn's
    content cannot be found verbatim (a template that rewrites messages).
    """
    _check_tokenizer(tokenizer)
    turns = _merged_turns(dialogue)
    text = tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c, _ in turns], tokenize=False, add_generation_prompt=False
    )
    if not isinstance(text, str):
        raise TypeError(
            f"tokenizer.apply_chat_template(tokenize=False) must return a str, got {type(text).__name__}"
        )
    cursor, spans = 0, []
    for k, (_, content, rel) in enumerate(turns):
        at, shift, length = text.find(content, cursor), 0, len(content)
        if at < 0:
            stripped = content.strip()
            at, shift, length = (
                text.find(stripped, cursor),
                len(content) - len(content.lstrip()),
                len(stripped),
            )
        if at < 0:
            raise ValueError(
                f"dialogue turn {k} ({content[:40]!r}...) does not appear verbatim in the chat template's text"
            )
        for a, b in rel:
            a, b = max(a - shift, 0), min(b - shift, length)
            if b > a:
                spans.append((at + a, at + b))
        cursor = at + length
    return text, spans


def tokenize_dialogue(
    tokenizer: Any, dialogue: Sequence[dict[str, Any]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [T], detection_mask [T])`` of one dialogue (see :func:`format_dialogue`).

    The text is tokenized with ``add_special_tokens=False`` (the chat template writes BOS itself); a
    token is masked when its characters overlap a ``detect=True`` span.
    """
    text, spans = format_dialogue(tokenizer, dialogue)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.as_tensor(enc["input_ids"], dtype=torch.long)
    return ids, detection_mask_from_offsets(enc["offset_mapping"], spans)


def _check_layer(model: Any, layer: Any) -> None:
    n_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    layer = check_int(layer, "layer")
    if layer < 0 or (n_layers is not None and layer > n_layers):
        raise ValueError(f"layer must be in [0, {n_layers}] (0 = embeddings), got {layer}")


@torch.no_grad()
def _hidden_on_masks(
    model: Any, encoded: list[tuple[torch.Tensor, torch.Tensor]], layer: int, pad_id: int, batch_size: int
) -> list[torch.Tensor]:
    """``hidden_states[layer]`` of each ``(ids [T_i], mask [T_i])`` sequence on its masked positions."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = []
    try:
        for start in range(0, len(encoded), batch_size):
            batch = encoded[start : start + batch_size]
            t = max(len(ids) for ids, _ in batch)
            input_ids = torch.full((len(batch), t), pad_id, dtype=torch.long)
            attention = torch.zeros((len(batch), t), dtype=torch.long)
            for b, (ids, _) in enumerate(batch):
                input_ids[b, : len(ids)] = ids
                attention[b, : len(ids)] = 1
            result = model(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), output_hidden_states=True
            )
            hidden = getattr(result, "hidden_states", None)
            if hidden is None:
                raise TypeError("model must return hidden_states when called with output_hidden_states=True")
            if layer >= len(hidden):
                raise ValueError(f"layer must be in [0, {len(hidden) - 1}] (0 = embeddings), got {layer}")
            states = hidden[layer]
            for b, (ids, mask) in enumerate(batch):
                out.append(states[b, : len(ids)][mask.to(states.device)].float().cpu())
    finally:
        model.train(was_training)
    return out


def extract_hidden_states(
    model: Any,
    input_ids: Any,
    detection_mask: Any,
    labels: Sequence[int],
    layer: int,
    attention_mask: Any = None,
    batch_size: int = 8,
) -> TokenActs:
    """``hidden_states[layer]`` at the masked positions of already tokenized sequences.

    Args:
        model: a transformers model that accepts ``output_hidden_states``.
        input_ids: ``[N, T]`` integer token ids (right-padded when ``attention_mask`` is given).
        detection_mask: ``[N, T]`` bool, True on the tokens to read (at least one per sequence, never on
            padding).
        labels: one per sequence: 1 deceptive, 0 honest, -1 control.
        layer: index into ``hidden_states`` (0 = embeddings, ``num_hidden_layers`` = last layer).
        attention_mask: ``[N, T]`` 0/1 or bool, 1 on real tokens, which must be a prefix of each row
            (right padding); default all ones.
        batch_size: sequences per forward pass.

    Returns float32 :class:`TokenActs` of the masked tokens, left-aligned, in their original order.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    ids = torch.as_tensor(input_ids)
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.is_complex():
        raise TypeError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
    if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"input_ids must have shape [N, T] with N, T >= 1, got {tuple(ids.shape)}")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if bool((ids < 0).any()) or (vocab is not None and bool((ids >= vocab).any())):
        raise ValueError(
            f"input_ids must be in [0, {vocab}) (the model's vocabulary), got values out of range"
        )
    mask = torch.as_tensor(detection_mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"detection_mask must be a bool tensor, got dtype {mask.dtype}")
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(
            f"detection_mask must have input_ids' shape {tuple(ids.shape)}, got {tuple(mask.shape)}"
        )
    if attention_mask is None:
        attn = torch.ones_like(ids, dtype=torch.bool)
    else:
        attn = torch.as_tensor(attention_mask)
        if attn.is_floating_point() or attn.is_complex():
            raise TypeError(f"attention_mask must be 0/1 integers or bool, got dtype {attn.dtype}")
        if tuple(attn.shape) != tuple(ids.shape):
            raise ValueError(
                f"attention_mask must have input_ids' shape {tuple(ids.shape)}, got {tuple(attn.shape)}"
            )
        if not bool(((attn == 0) | (attn == 1)).all()):
            raise ValueError("attention_mask must hold only 0 and 1")
        attn = attn.bool()
    lengths = attn.sum(1)
    prefix = torch.arange(ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    if not bool((prefix == attn).all()):
        raise ValueError("attention_mask must be right padding: ones followed by zeros in every row")
    if bool((mask & ~attn).any()):
        raise ValueError("detection_mask must not select padding (positions where attention_mask is 0)")
    empty = torch.nonzero(mask.sum(1) == 0).flatten().tolist()
    if empty:
        raise ValueError(f"detection_mask selects zero tokens of sequence {empty[0]}: its mean would be NaN")
    y = labels_tensor(labels, ids.shape[0])
    _check_layer(model, layer)
    check_int(batch_size, "batch_size", low=1)
    encoded = [(ids[i, : int(lengths[i])].long(), mask[i, : int(lengths[i])]) for i in range(ids.shape[0])]
    return TokenActs.from_list(_hidden_on_masks(model, encoded, layer, 0, batch_size), y)


def extract_activations(
    model: Any,
    tokenizer: Any,
    dialogues: Sequence[Sequence[dict[str, Any]]],
    labels: Sequence[int],
    layer: int,
    batch_size: int = 8,
) -> TokenActs:
    """Residual-stream activations ``hidden_states[layer]`` on each dialogue's detection span.

    Args:
        model: a transformers model (e.g. ``AutoModelForCausalLM``) that accepts ``output_hidden_states``.
        tokenizer: its fast tokenizer, with a chat template.
        dialogues: lists of messages ``{"role", "content", "detect"}`` (e.g. from :func:`instructed_pairs`).
        labels: one per dialogue: 1 deceptive, 0 honest, -1 control.
        layer: index into ``hidden_states``: 0 = embeddings, ``model.config.num_hidden_layers`` = last.
        batch_size: dialogues per forward pass (right padding, which a causal model never attends to).

    The model runs in eval mode (its mode is restored afterwards) without gradients. Returns a
    :class:`TokenActs` holding only the masked tokens, left-aligned, as float32.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    _check_tokenizer(tokenizer)
    if not isinstance(dialogues, (list, tuple)) or not dialogues:
        raise ValueError("dialogues must be a non-empty list of dialogues")
    y = labels_tensor(labels, len(dialogues))
    _check_layer(model, layer)
    check_int(batch_size, "batch_size", low=1)
    encoded = []
    for i, dialogue in enumerate(dialogues):
        try:
            ids, mask = tokenize_dialogue(tokenizer, dialogue)
        except (ValueError, TypeError) as err:
            raise type(err)(f"dialogues[{i}]: {err}") from None
        if not bool(mask.any()):
            raise ValueError(f"dialogues[{i}] has zero tokens in its detection span (no detect=True content)")
        encoded.append((ids, mask))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return TokenActs.from_list(_hidden_on_masks(model, encoded, layer, pad_id, batch_size), y)
