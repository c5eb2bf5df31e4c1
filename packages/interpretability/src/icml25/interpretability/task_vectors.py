"""Vision-Language Models Create Cross-Modal Task Representations — ICML 2025, P00: task vectors at the delimiter, patching, layer sweeps.

Luo, Darrell, Bar, ICML 2025 (arXiv 2410.22330; official code ``g-luo/task_vectors_are_cross_modal``).
A causal (vision-)language model compresses a task specification (text examples, image examples or an
instruction) into the hidden state at the final answer delimiter: the *task vector*. Averaged over the
prompts of a task, read from the output of decoder layer ``l`` (the residual stream after block ``l``), it
can *replace* the hidden state at the delimiter of a zero-shot query at the same layer, during the prompt
(prefill) pass only, and the model then performs the task, across modalities and from a base LLM into its
VLM fine-tune.

The library works on any Hugging Face causal LM or VLM through forward hooks on its decoder layers
(:func:`decoder_layers`: Llama / Mistral / Qwen2 / GPT-2 ``*ForCausalLM``, LLaVA's
``model.model.language_model`` and Idefics2's ``model.model.text_model`` in transformers 5, any module with a
``language_model``), without forking modelling code:

* :func:`find_delimiter_positions` locates the delimiter in the *processed* ids (``which=-1`` the final one;
  the official code reads the last demonstration's ``A:``, ``which=-3`` with the query appended), with
  padding and an image-token ``offset``;
* :func:`extract_task_vectors` hooks every layer and averages the states at the delimiter over prompts
  (``keep_all=True`` keeps one vector per prompt); an instruction vector is the same call on instruction
  prompts read at their last token, and :func:`ensemble` averages ICL and instruction vectors;
* :func:`patch_task_vector` is a context manager that replaces one position's state at one layer in every
  forward call with more than one position (prefill), so plain ``model.generate`` works inside it and
  the one-token decode steps are never edited;
* :func:`layer_sweep`, :func:`evaluate_task_vectors` (layer chosen on validation, reported on test:
  :class:`TaskVectorResult`), :func:`cross_model_transfer` (LLM -> VLM) and :func:`answer_match` (the
  official prefix match, or exact match).

With nnsight, ``with patch_task_vector(model, h, layer, pos):`` corresponds to
``with model.trace(ids): model.model.layers[layer].output[0][:, pos] = h``; with baukit (official code),
to a ``TraceDict`` ``edit_output`` on the same layer names.

The toy two-modality model of the small-scale reproduction is :class:`ToyVLM`: a random-init
``transformers.LlamaForCausalLM`` whose "images" (scikit-learn 8x8 digits) enter through a learned linear
projection as ``inputs_embeds``; :class:`ToyTaskData` builds its text / image / instruction prompts with a
*summary token* ``S`` after the demonstrations whose residual is, by a 4-D attention mask, the only channel
from the demonstrations to the query (see the experiment module for why).

Shapes: ``B`` prompts, ``T`` positions, ``L`` decoder layers, ``d`` hidden size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "TOY_TASKS",
    "PatchHandle",
    "TaskVectorResult",
    "ToyTaskData",
    "ToyVLM",
    "answer_match",
    "bottleneck_mask",
    "cross_model_transfer",
    "decoder_layers",
    "ensemble",
    "evaluate_task_vectors",
    "extract_task_vectors",
    "find_delimiter_positions",
    "first_token_correct",
    "layer_sweep",
    "patch_task_vector",
    "patched_accuracy",
    "train_toy_vlm",
]

_NOT_MODEL_KEYS = ("position", "labels", "entity")
_SUPPORTED = (
    "Llama/Mistral/Qwen2 *ForCausalLM (model.model.layers), GPT-2 (model.transformer.h), LLaVA "
    "(model.model.language_model.layers), Idefics2 (model.model.text_model.layers), a base model with "
    ".layers, or a module with a .language_model"
)


# ------------------------------------------------------------------------------------------ resolution
def _seq(obj: Any, *path: str) -> nn.ModuleList | None:
    for a in path:
        obj = getattr(obj, a, None)
        if obj is None:
            return None
    return obj if isinstance(obj, nn.ModuleList) and len(obj) > 0 else None


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of ``model``, in order (their outputs are the residual stream after each block).

    Raises ``TypeError`` for a non-module or an architecture it cannot resolve (supported: see the module
    docstring)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for path in (
        ("model", "language_model", "layers"),  # LLaVA (transformers 5)
        ("model", "text_model", "layers"),  # Idefics2 (transformers 5)
        ("model", "layers"),  # Llama / Mistral / Qwen2 *ForCausalLM
        ("transformer", "h"),  # GPT-2
        ("layers",),  # a base model (LlamaModel, ...)
    ):
        layers = _seq(model, *path)
        if layers is not None:
            return list(layers)
    inner = getattr(model, "language_model", None)
    if isinstance(inner, nn.Module) and inner is not model:
        return decoder_layers(inner)
    raise TypeError(
        f"model ({type(model).__name__}) has no resolvable decoder layers; supported: {_SUPPORTED}"
    )


def _hidden_size(model: nn.Module) -> int:
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    for key in ("hidden_size", "n_embd", "d_model"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    inner = getattr(model, "language_model", None)
    if isinstance(inner, nn.Module) and inner is not model:
        return _hidden_size(inner)
    raise TypeError(
        f"model ({type(model).__name__}) has no config naming its hidden size (hidden_size / n_embd)"
    )


def _layer_index(layer: Any, n_layers: int, name: str = "layer") -> int:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise TypeError(f"{name} must be an int in [0, {n_layers}), got {type(layer).__name__} {layer!r}")
    if not 0 <= int(layer) < n_layers:
        raise ValueError(
            f"{name} must be in [0, {n_layers}) (the model has {n_layers} decoder layers), got {layer}"
        )
    return int(layer)


def _layer_list(layers: Any, n_layers: int) -> list[int]:
    if isinstance(layers, str):
        if layers != "all":
            raise ValueError(f"layers must be 'all' or a sequence of layer indices, got {layers!r}")
        return list(range(n_layers))
    if not isinstance(layers, Sequence) or len(layers) == 0:
        raise ValueError(f"layers must be 'all' or a non-empty sequence of layer indices, got {layers!r}")
    return [_layer_index(v, n_layers, "layers[i]") for v in layers]


def _hidden(output: Any) -> Tensor:
    return output[0] if isinstance(output, tuple) else output


def _shape(x: Any) -> str:
    return f"{type(x).__name__} of shape {tuple(x.shape)}" if hasattr(x, "shape") else type(x).__name__


def _check_vector(vector: Any, d: int, name: str = "vector") -> Tensor:
    """A finite floating tensor [d] or [B, d] (d: the model's hidden size), not empty."""
    vector = check_tensor(vector, name, ndim=(1, 2), finite=False)
    if vector.shape[-1] != d or vector.numel() == 0:
        raise ValueError(
            f"{name} must have shape [d] or [B, d] with d = {d} (the model's hidden size), got {tuple(vector.shape)}"
        )
    return check_tensor(vector, name)


def _positions(position: Any, B: int, T: int, name: str = "position") -> Tensor:
    """Absolute positions ``[B]`` from an int (negative: from the end) or a LongTensor ``[B]``."""
    if isinstance(position, bool):
        raise TypeError(f"{name} must be an int or a LongTensor [B], got bool")
    if isinstance(position, (int, np.integer)):
        p = int(position)
        if not -T <= p < T:
            raise ValueError(f"{name} must index a sequence of length {T} (in [-{T}, {T})), got {p}")
        return torch.full((B,), p % T, dtype=torch.long)
    if not isinstance(position, Tensor) or position.dtype in (torch.bool,) or position.is_floating_point():
        raise TypeError(f"{name} must be an int or an integer tensor [B], got {_shape(position)}")
    pos = position.reshape(-1).long().cpu()
    if pos.numel() == 1 and B > 1:
        pos = pos.expand(B)
    if pos.numel() != B:
        raise ValueError(f"{name} must hold one position per prompt (B = {B}), got {pos.numel()}")
    if bool((pos >= T).any()) or bool((pos < -T).any()):
        raise ValueError(f"{name} must lie within the sequence of length {T}, got {pos.tolist()}")
    return pos % T


# ------------------------------------------------------------------------------------------ positions
def find_delimiter_positions(
    input_ids: Tensor,
    delimiter_ids: int | Sequence[int],
    which: int = -1,
    offset: int = 0,
    attention_mask: Tensor | None = None,
    pad_token_id: int | None = None,
) -> Tensor:
    """Position ``[B]`` of the ``which``-th occurrence of the delimiter in each prompt, plus ``offset``.

    ``delimiter_ids``: one id, or a multi-token delimiter (the position of its last token is returned); take
    it from the tokenised template (e.g. the last id of ``tokenizer("A:")``), since tokenisers merge ``A:``
    differently after whitespace. ``which=-1`` is the final delimiter, ``-3`` the third to last (the
    official code's source position with the query appended). ``offset`` shifts every position (e.g. the
    575 extra positions of LLaVA-1.5's expanded ``<image>`` when the ids were not expanded); computing
    positions on the processed sequence is better. Only positions where ``attention_mask`` is 1 count; a
    batch containing ``pad_token_id`` without an ``attention_mask`` is rejected (its positions would be
    ambiguous), and so is a prompt without the delimiter (the error names its index).
    """
    if not isinstance(input_ids, Tensor) or input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be an integer tensor [B, T] or [T], got {_shape(input_ids)}")
    ids = input_ids[None] if input_ids.ndim == 1 else input_ids
    if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
        raise ValueError(
            f"input_ids must have shape [B, T] (or [T]) with B, T >= 1, got {tuple(input_ids.shape)}"
        )
    delim = [delimiter_ids] if isinstance(delimiter_ids, (int, np.integer)) else list(delimiter_ids)
    if len(delim) == 0 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in delim):
        raise TypeError(
            f"delimiter_ids must be an int or a non-empty sequence of ints, got {delimiter_ids!r}"
        )
    for name, v in (("which", which), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if attention_mask is None:
        if pad_token_id is not None and bool((ids == pad_token_id).any()):
            raise ValueError(
                f"input_ids contain pad_token_id={pad_token_id} but no attention_mask was given: pass the "
                "tokenizer's attention_mask so that padding is not searched (positions would be wrong)"
            )
        mask = torch.ones_like(ids, dtype=torch.bool)
    else:
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(ids.shape)}, got {_shape(attention_mask)}"
            )
        mask = attention_mask.bool()
    n = len(delim)
    T = ids.shape[1]
    hit = torch.ones(ids.shape[0], max(T - n + 1, 0), dtype=torch.bool)
    for k, tok in enumerate(delim):
        hit &= (ids[:, k : T - n + 1 + k] == int(tok)) & mask[:, k : T - n + 1 + k]
    out = []
    for b in range(ids.shape[0]):
        ends = (hit[b].nonzero().flatten() + n - 1).tolist()
        if not -len(ends) <= int(which) < len(ends):
            raise ValueError(
                f"prompt {b} of input_ids has {len(ends)} occurrence(s) of delimiter_ids {delim}, so which={which} is out of range"
                + (" (no delimiter found in this prompt)" if not ends else "")
            )
        pos = ends[int(which)] + int(offset)
        if pos < 0:
            raise ValueError(f"offset={offset} moves prompt {b}'s delimiter to a negative position {pos}")
        out.append(pos)
    return torch.tensor(out, dtype=torch.long)


# ------------------------------------------------------------------------------------------ extraction
def _as_batches(batches: Any) -> list[Mapping[str, Any]]:
    if isinstance(batches, Mapping):
        return [batches]
    if not isinstance(batches, Iterable):
        raise TypeError(
            f"batches must be a mapping of model inputs or an iterable of them, got {type(batches).__name__}"
        )
    out = list(batches)
    if not out or not all(isinstance(b, Mapping) for b in out):
        raise ValueError(
            "batches must be a non-empty iterable of mappings of model inputs (input_ids or inputs_embeds, ...)"
        )
    return out


def _batch_shape(batch: Mapping[str, Any]) -> tuple[int, int]:
    key = "input_ids" if "input_ids" in batch else "inputs_embeds"
    x = batch.get(key)
    if not isinstance(x, Tensor):
        raise ValueError(
            f"each batch must hold input_ids [B, T] or inputs_embeds [B, T, d], got keys {sorted(batch)}"
        )
    if key == "input_ids" and (x.is_floating_point() or x.dtype == torch.bool or x.ndim != 2):
        raise TypeError(
            f"input_ids must be an integer tensor [B, T], got {x.dtype} of shape {tuple(x.shape)}"
        )
    if key == "inputs_embeds" and (not x.is_floating_point() or x.ndim != 3):
        raise TypeError(
            f"inputs_embeds must be a floating tensor [B, T, d], got {x.dtype} of shape {tuple(x.shape)}"
        )
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(
            f"{key} must hold at least one prompt of at least one position, got shape {tuple(x.shape)}"
        )
    if key == "inputs_embeds" and not bool(torch.isfinite(x).all()):
        raise ValueError(
            f"inputs_embeds must be finite; got {int((~torch.isfinite(x)).sum())} non-finite values"
        )
    return int(x.shape[0]), int(x.shape[1])


def _batch_positions(batch: Mapping[str, Any], position: Any, B: int, T: int) -> Tensor:
    if position is None:
        if "position" not in batch:
            raise ValueError("position is None, so each batch must carry a 'position' entry (LongTensor [B])")
        return _positions(batch["position"], B, T, "batch['position']")
    mask = batch.get("attention_mask")
    if isinstance(position, (int, np.integer)) and not isinstance(position, bool) and position < 0:
        if isinstance(mask, Tensor) and mask.ndim == 2 and not bool(mask.bool().all()):
            # negative: counted from each prompt's last real token (right or left padding)
            last = T - 1 - mask.bool().flip(1).int().argmax(1)
            if not -T <= position:
                raise ValueError(f"position must index a sequence of length {T}, got {position}")
            pos = last + 1 + int(position)
            if bool((pos < 0).any()):
                raise ValueError(f"position={position} lies before the start of a padded prompt")
            return pos.long().cpu()
    return _positions(position, B, T)


def _model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if k not in _NOT_MODEL_KEYS}


@torch.no_grad()
def extract_task_vectors(
    model: nn.Module,
    batches: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    layers: str | Sequence[int] = "all",
    position: int | Tensor | None = None,
    keep_all: bool = False,
) -> Tensor:
    """The mean hidden state at the source position over all prompts: ``[n_layers, d]`` (``keep_all``:
    ``[N, n_layers, d]``, one per prompt, for ensembling or subsampling).

    Each batch is a mapping of model inputs (``input_ids`` or ``inputs_embeds``, ``attention_mask``, ...,
    passed to ``model(**batch)``); its optional ``position`` ``[B]`` gives the source position (the final
    delimiter, e.g. from :func:`find_delimiter_positions`) when ``position`` is None, and ``labels`` is
    ignored. An int ``position`` applies to every prompt (negative: from each prompt's last real token under
    a 2-D attention mask; an instruction vector is ``position=-1``). The states are the outputs of the
    chosen decoder layers (``layers``: "all" or indices, in that order)."""
    blocks = decoder_layers(model)
    idx = _layer_list(layers, len(blocks))
    batches = _as_batches(batches)
    got: dict[int, Tensor] = {}
    rows: list[Tensor] = []
    for batch in batches:
        B, T = _batch_shape(batch)
        pos = _batch_positions(batch, position, B, T)

        def reader(j: int, pos: Tensor = pos) -> Callable[..., None]:
            def hook(_m: nn.Module, _a: Any, out: Any) -> None:
                h = _hidden(out)
                got[j] = h[torch.arange(h.shape[0]), pos.to(h.device)].float().cpu()

            return hook

        handles = [blocks[layer].register_forward_hook(reader(j)) for j, layer in enumerate(idx)]
        try:
            model(**_model_inputs(batch))
        finally:
            for h in handles:
                h.remove()
        rows.append(torch.stack([got[j] for j in range(len(idx))], 1))
    allv = torch.cat(rows)
    return allv if keep_all else allv.mean(0)


def ensemble(*vectors: Tensor, weights: Sequence[float] | None = None) -> Tensor:
    """Weighted mean of task vectors of one shape (default: the plain mean, the paper's (ICL + instruction) / 2)."""
    if not vectors:
        raise ValueError("ensemble needs at least one vector")
    for i, v in enumerate(vectors):
        if not isinstance(v, Tensor) or not v.is_floating_point():
            raise TypeError(f"vectors[{i}] must be a floating torch.Tensor, got {_shape(v)}")
        if v.shape != vectors[0].shape or v.numel() == 0:
            raise ValueError(
                f"vectors must share one non-empty shape; vectors[0] is {tuple(vectors[0].shape)}, vectors[{i}] is {tuple(v.shape)}"
            )
        if not bool(torch.isfinite(v).all()):
            raise ValueError(
                f"vectors[{i}] must be finite; got {int((~torch.isfinite(v)).sum())} non-finite values"
            )
    if weights is None:
        w = torch.ones(len(vectors))
    else:
        w = torch.as_tensor(np.asarray(weights, dtype=float), dtype=torch.float64)
        if (
            w.shape != (len(vectors),)
            or not bool(torch.isfinite(w).all())
            or bool((w < 0).any())
            or float(w.sum()) <= 0
        ):
            raise ValueError(
                f"weights must be {len(vectors)} finite non-negative numbers with a positive sum, got {weights!r}"
            )
    w = (w / w.sum()).to(vectors[0].dtype)
    # v_0 + sum_i w_i (v_i - v_0): the weighted mean, exactly v_0 when the vectors are identical
    base = vectors[0]
    return base + sum(wi * (v - base) for wi, v in zip(w, vectors, strict=True))


# ------------------------------------------------------------------------------------------ patching
@dataclass
class PatchHandle:
    """What :func:`patch_task_vector` did: ``calls`` forward calls of the layer, ``edits`` of them edited
    (prefill calls, with more than one position)."""

    calls: int = 0
    edits: int = 0


@contextlib.contextmanager
def patch_task_vector(
    model: nn.Module, vector: Tensor, layer: int, position: int | Tensor
) -> Iterator[PatchHandle]:
    """Inside the block, the output of decoder layer ``layer`` at ``position`` is *replaced* by ``vector``
    (``[d]``, or ``[B, d]`` one per prompt) in every forward call with more than one position (the prompt
    pass); one-token calls (cached decode steps of ``generate``) are never edited. ``position``: an int
    (negative from the end) or a LongTensor ``[B]``. Yields a :class:`PatchHandle` counting calls and edits.
    """
    blocks = decoder_layers(model)
    layer = _layer_index(layer, len(blocks))
    vec = _check_vector(vector, _hidden_size(model))
    if not isinstance(position, (int, np.integer, Tensor)) or isinstance(position, bool):
        raise TypeError(f"position must be an int or a LongTensor [B], got {type(position).__name__}")
    handle = PatchHandle()

    def hook(_m: nn.Module, _a: Any, out: Any) -> Any:
        handle.calls += 1
        h = _hidden(out)
        B, T = h.shape[0], h.shape[1]
        if T <= 1:
            return None
        pos = _positions(position, B, T).to(h.device)
        v = vec.to(h.device, h.dtype)
        if v.ndim == 2 and v.shape[0] != B:
            raise ValueError(f"vector holds {v.shape[0]} rows but the batch has {B} prompts")
        h = h.clone()
        h[torch.arange(B, device=h.device), pos] = v if v.ndim == 2 else v.expand(B, -1)
        handle.edits += 1
        return (h, *out[1:]) if isinstance(out, tuple) else h

    # an invalid int position is rejected here, before any forward call
    if isinstance(position, (int, np.integer)):
        _positions(position, 1, 1 << 30)
    h = blocks[layer].register_forward_hook(hook)
    try:
        yield handle
    finally:
        h.remove()


def first_token_correct(logits: Tensor, batch: Mapping[str, Any]) -> Tensor:
    """Greedy next token at the last position equals ``batch['labels']`` ``[B]`` (the official
    ``max_new_tokens=1`` accuracy on single-token answers): a bool tensor ``[B]``."""
    labels = batch.get("labels")
    if not isinstance(labels, Tensor) or labels.ndim != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(
            f"batch['labels'] must be a LongTensor [B] with B = {logits.shape[0]}, got {_shape(labels)}"
        )
    return logits[:, -1].argmax(-1).cpu() == labels.cpu()


def answer_match(prediction: str, label: str, mode: str = "prefix") -> bool:
    """``"prefix"`` (official): after stripping, both are non-empty and one is a prefix of the other (so a
    one-token prediction can match a longer label); ``"exact"``: equal after stripping."""
    if not isinstance(prediction, str) or not isinstance(label, str):
        raise TypeError(
            f"prediction and label must be str, got {type(prediction).__name__} and {type(label).__name__}"
        )
    p, g = prediction.strip(), label.strip()
    if mode == "exact":
        return p == g
    if mode != "prefix":
        raise ValueError(f"mode must be 'prefix' or 'exact', got {mode!r}")
    return bool(p) and bool(g) and (p.startswith(g) or g.startswith(p))


Metric = Callable[[Tensor, Mapping[str, Any]], Tensor]


@torch.no_grad()
def patched_accuracy(
    model: nn.Module,
    vector: Tensor | None,
    layer: int,
    batches: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    position: int | Tensor | None = None,
    metric: Metric | None = None,
) -> float:
    """Mean of ``metric(logits, batch)`` (default :func:`first_token_correct`) over the prompts of
    ``batches`` with ``vector`` patched at ``layer`` and each batch's ``position`` (or ``position``);
    ``vector=None`` measures the unpatched model."""
    metric = first_token_correct if metric is None else metric
    hits, n = 0.0, 0
    for batch in _as_batches(batches):
        B, T = _batch_shape(batch)
        if vector is None:
            logits = model(**_model_inputs(batch)).logits
        else:
            pos = _batch_positions(batch, position, B, T)
            with patch_task_vector(model, vector, layer, pos):
                logits = model(**_model_inputs(batch)).logits
        ok = metric(logits, batch)
        hits += float(ok.float().sum())
        n += B
    return hits / n


def layer_sweep(
    model: nn.Module,
    vectors: Tensor,
    batches: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    layers: str | Sequence[int] = "all",
    position: int | Tensor | None = None,
    metric: Metric | None = None,
) -> dict[int, float]:
    """``{layer: accuracy}`` with ``vectors[layer]`` (``[L, d]``, from :func:`extract_task_vectors` with
    ``layers="all"``) patched at each layer in turn (see :func:`patched_accuracy`)."""
    n, d = len(decoder_layers(model)), _hidden_size(model)
    if not isinstance(vectors, Tensor) or not vectors.is_floating_point():
        raise TypeError(
            f"vectors must be a floating tensor [L, d] with L = {n}, d = {d}, got {_shape(vectors)}"
        )
    if vectors.shape != (n, d):
        raise ValueError(
            f"vectors must have shape [L, d] with L = {n} (one per decoder layer), d = {d}, got {tuple(vectors.shape)}"
        )
    if not bool(torch.isfinite(vectors).all()):
        raise ValueError(
            f"vectors must be finite; got {int((~torch.isfinite(vectors)).sum())} non-finite values"
        )
    batches = _as_batches(batches)
    return {
        layer: patched_accuracy(model, vectors[layer], layer, batches, position, metric)
        for layer in _layer_list(layers, n)
    }


@dataclass
class TaskVectorResult:
    """Accuracy of one task's zero-shot queries: unpatched (``no_context``), with the full prompt in
    context (``prompt``, None when not measured), and patched at each layer (``val`` on the validation
    queries, ``test`` on the test ones); ``layer`` is the best validation layer and ``patch`` its test
    accuracy (the paper's protocol: never the best test layer)."""

    no_context: float
    prompt: float | None
    val: dict[int, float]
    test: dict[int, float]
    layer: int = field(init=False)
    patch: float = field(init=False)

    def __post_init__(self) -> None:
        self.layer = max(self.val, key=lambda k: (self.val[k], -k))
        self.patch = self.test[self.layer]


def evaluate_task_vectors(
    model: nn.Module,
    vectors: Tensor,
    val_batches: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    test_batches: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    prompt_batches: Mapping[str, Any] | Iterable[Mapping[str, Any]] | None = None,
    position: int | Tensor | None = None,
    metric: Metric | None = None,
) -> TaskVectorResult:
    """Sweep every layer on ``val_batches``, report the test accuracy at the best validation layer, the
    unpatched zero-shot accuracy on ``test_batches`` and, given ``prompt_batches``, in-context accuracy."""
    val = layer_sweep(model, vectors, val_batches, position=position, metric=metric)
    test = layer_sweep(model, vectors, test_batches, position=position, metric=metric)
    none = patched_accuracy(model, None, 0, test_batches, metric=metric)
    prompt = (
        None if prompt_batches is None else patched_accuracy(model, None, 0, prompt_batches, metric=metric)
    )
    return TaskVectorResult(none, prompt, val, test)


def cross_model_transfer(
    src_model: nn.Module,
    tgt_model: nn.Module,
    batches: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    layers: str | Sequence[int] = "all",
    position: int | Tensor | None = None,
) -> Tensor:
    """Task vectors of ``src_model`` (e.g. the base LLM) on ``batches`` for patching into ``tgt_model``
    (its VLM fine-tune), after checking that the two share the layer count and hidden size (``ValueError``
    otherwise): ``[n_layers, d]``."""
    ls, lt = len(decoder_layers(src_model)), len(decoder_layers(tgt_model))
    ds, dt = _hidden_size(src_model), _hidden_size(tgt_model)
    if ls != lt or ds != dt:
        raise ValueError(
            f"src_model and tgt_model must share the layer count and hidden size to transfer task vectors; "
            f"got {ls} layers x {ds} (src_model) vs {lt} layers x {dt} (tgt_model)"
        )
    return extract_task_vectors(src_model, batches, layers=layers, position=position)


# ------------------------------------------------------------------------------------------ toy VLM
@dataclass(frozen=True)
class _ToyTask:
    name: str
    offset: int
    n_out: int
    fn: Callable[[int], int]


# vocabulary: 0 PAD, 1 BOS, 2 S (summary), 3 ARROW, 4 SEP, 5 IMG placeholder, 6..15 entities, then outputs
PAD, BOS, SUM, ARROW, SEP, IMG = range(6)
_ENT = 6
TOY_TASKS: tuple[_ToyTask, ...] = (
    _ToyTask("successor", 16, 10, lambda k: (k + 1) % 10),
    _ToyTask("double", 26, 10, lambda k: (2 * k) % 10),
    _ToyTask("parity", 36, 2, lambda k: k % 2),
    _ToyTask("complement", 38, 10, lambda k: 9 - k),
)
_INSTR = 48
TOY_VOCAB = 56


def bottleneck_mask(valid: Tensor, summary: Tensor, bos: Tensor) -> Tensor:
    """Additive 4-D attention mask ``[B, 1, T, T]`` (0 allowed, dtype-min blocked): causal over the real
    positions (``valid`` ``[B, T]``), except that the positions after the summary token (``summary`` ``[B]``)
    see only ``bos`` ``[B]``, the summary and each other, so the summary's residual is the only channel from
    the demonstrations to the query. A padding row sees only itself."""
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool or valid.ndim != 2 or 0 in valid.shape:
        raise TypeError(f"valid must be a non-empty bool tensor [B, T], got {_shape(valid)}")
    B, T = valid.shape
    for name, v in (("summary", summary), ("bos", bos)):
        if not isinstance(v, Tensor) or v.is_floating_point() or v.dtype == torch.bool or v.shape != (B,):
            raise TypeError(f"{name} must be an integer tensor [B] with B = {B}, got {_shape(v)}")
        if bool(((v < 0) | (v >= T)).any()):
            raise ValueError(f"{name} must hold positions in [0, {T}), got {v.tolist()}")
    i = torch.arange(T)
    allowed = (i[None, :, None] >= i[None, None, :]) & valid[:, None, :]
    after = i[None, :] > summary[:, None]  # [B, T] query rows (and columns)
    keep_for_query = after | (i[None, :] == summary[:, None]) | (i[None, :] == bos[:, None])
    allowed &= ~(after[:, :, None] & ~keep_for_query[:, None, :])
    allowed |= torch.eye(T, dtype=torch.bool)[None] & ~valid[:, :, None]
    mask = torch.zeros(B, 1, T, T)
    mask.masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
    return mask


class ToyVLM(nn.Module):
    """A toy two-modality causal LM: ``language_model`` is a random-init ``transformers.LlamaForCausalLM``
    over :data:`TOY_VOCAB`; positions whose ``image_mask`` is set take ``image_proj(pixel_values)`` (a
    64 -> d linear map of an 8x8 digits image) as their input embedding instead of the placeholder token's.

    ``forward(input_ids [B, T], pixel_values [B, T, 64] = None, image_mask [B, T] = None, attention_mask =
    None)`` returns the language model's output (``.logits``). Needs the ``[hf]`` extra."""

    def __init__(self, n_layers: int = 4, d_model: int = 128, n_heads: int = 4, seed: int = 0) -> None:
        super().__init__()
        for name, v in (("n_layers", n_layers), ("d_model", d_model), ("n_heads", n_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads={n_heads}, got {d_model}")
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError as err:  # pragma: no cover - exercised only without the extra
            raise ImportError("ToyVLM needs transformers: pip install 'icml25-interpretability[hf]'") from err
        cfg = LlamaConfig(
            vocab_size=TOY_VOCAB, hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=n_layers,
            num_attention_heads=n_heads, num_key_value_heads=n_heads, max_position_embeddings=64,
            bos_token_id=BOS, eos_token_id=SEP, pad_token_id=PAD, attn_implementation="sdpa",
        )  # fmt: skip
        with isolated_rng(seed):
            self.language_model = LlamaForCausalLM(cfg)
            self.image_proj = nn.Linear(64, d_model)
        self.config = cfg

    def forward(
        self,
        input_ids: Tensor,
        pixel_values: Tensor | None = None,
        image_mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Any:
        if not isinstance(input_ids, Tensor) or input_ids.is_floating_point() or input_ids.ndim != 2:
            raise TypeError(f"input_ids must be an integer tensor [B, T], got {_shape(input_ids)}")
        if input_ids.numel() == 0:
            raise ValueError(f"input_ids must hold at least one token, got shape {tuple(input_ids.shape)}")
        if pixel_values is not None:
            if not isinstance(pixel_values, Tensor) or pixel_values.shape != (*input_ids.shape, 64):
                raise ValueError(
                    f"pixel_values must have shape [B, T, 64] = {(*input_ids.shape, 64)}, got {_shape(pixel_values)}"
                )
            if not pixel_values.is_floating_point() or not bool(torch.isfinite(pixel_values).all()):
                raise ValueError(
                    "pixel_values must be a finite floating tensor (8x8 images scaled to [0, 1])"
                )
        emb = self.language_model.get_input_embeddings()(input_ids)
        if image_mask is not None and pixel_values is not None and bool(image_mask.any()):
            emb = torch.where(image_mask[..., None], self.image_proj(pixel_values.to(emb.dtype)), emb)
        return self.language_model(inputs_embeds=emb, attention_mask=attention_mask)


class ToyTaskData:
    """Prompts of the toy tasks (:data:`TOY_TASKS`; ``tasks`` picks some) over entities ``k = 0..9``, as text
    tokens or as scikit-learn digits images of class ``k`` (split per class 60/20/20 into train / val / test
    by ``seed``). Every prompt ends with ``S x_q ->`` and carries ``position`` (of ``S``) and ``labels`` (the
    answer token):

    * :meth:`icl`: ``BOS (x -> y ;) x n_shots  S x_q ->`` with :func:`bottleneck_mask`; the query's modality
      defaults to the demos' one; ``shuffle_labels`` pairs the demos with random outputs of the task's range;
    * :meth:`instruction`: ``BOS [INSTR_task] S x_q ->``;
    * :meth:`zero_shot`: ``BOS S x_q ->`` (``position`` = 1);
    * ``source=True`` stops a prompt at ``S`` (extraction needs nothing after it: the model is causal);
    * ``bottleneck=False`` keeps ``S`` but gives every prompt plain causal attention (the query sees the
      demonstrations: the free-attention toy);
    * ``entity`` holds the query's ``k`` (not a model input), so :meth:`relabel` gives another task's answers.
    """

    def __init__(
        self, tasks: Sequence[int] = (0, 1, 2, 3), n_shots: int = 5, seed: int = 0, bottleneck: bool = True
    ) -> None:
        from sklearn.datasets import load_digits

        if (
            isinstance(tasks, (str, bytes))
            or not isinstance(tasks, Sequence)
            or not tasks
            or any(isinstance(t, bool) or t not in range(len(TOY_TASKS)) for t in tasks)
        ):
            raise ValueError(
                f"tasks must be a non-empty sequence of task indices in 0..{len(TOY_TASKS) - 1}, got {tasks!r}"
            )
        if isinstance(n_shots, bool) or not isinstance(n_shots, int) or not 1 <= n_shots <= 10:
            raise ValueError(f"n_shots must be an int in [1, 10], got {n_shots!r}")
        self.tasks, self.n_shots, self.bottleneck = tuple(int(t) for t in tasks), n_shots, bool(bottleneck)
        self.table = torch.tensor([[t.offset + t.fn(k) for k in range(10)] for t in TOY_TASKS])
        self._offset = torch.tensor([t.offset for t in TOY_TASKS])
        self._n_out = torch.tensor([t.n_out for t in TOY_TASKS])
        d = load_digits()
        X = torch.tensor(d.data / 16.0, dtype=torch.float32)
        rng = np.random.default_rng(seed)
        parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
        for k in range(10):
            idx = rng.permutation(np.flatnonzero(d.target == k))
            a, b = int(0.6 * len(idx)), int(0.8 * len(idx))
            parts["train"].append(idx[:a])
            parts["val"].append(idx[a:b])
            parts["test"].append(idx[b:])
        self.images: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
        for split, idxs in parts.items():
            sizes = torch.tensor([len(i) for i in idxs])
            starts = torch.cumsum(sizes, 0) - sizes
            self.images[split] = (X[np.concatenate(idxs)], starts, sizes)

    def answer(self, task: int, k: int) -> int:
        """The answer token of entity ``k`` under task ``task``."""
        return int(self.table[task, k])

    def relabel(self, batch: Mapping[str, Tensor], task: int) -> Tensor:
        """The answers ``[B]`` of ``task`` for the queries of ``batch``."""
        return self.table[task, batch["entity"]]

    def _check(self, task: Any, n: Any, modality: str, split: str) -> Tensor:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if modality not in ("text", "image"):
            raise ValueError(f"modality must be 'text' or 'image', got {modality!r}")
        if split not in self.images:
            raise ValueError(f"split must be one of {sorted(self.images)}, got {split!r}")
        t = (
            torch.full((n,), task, dtype=torch.long)
            if isinstance(task, int)
            else torch.as_tensor(task).long()
        )
        if t.shape != (n,) or bool(((t < 0) | (t >= len(TOY_TASKS))).any()):
            raise ValueError(
                f"task must be a task index or {n} of them in 0..{len(TOY_TASKS) - 1}, got {task!r}"
            )
        return t

    def _entities(self, ks: Tensor, image: Tensor, split: str, g: torch.Generator) -> tuple[Tensor, Tensor]:
        """Tokens and pixels of entities ``ks``; ``image`` (broadcast to ``ks``) picks an image of class k."""
        X, starts, sizes = self.images[split]
        pick = starts[ks] + (torch.rand(ks.shape, generator=g) * sizes[ks]).long().clamp_max(sizes[ks] - 1)
        image = image.expand(ks.shape)
        tok = torch.where(image, torch.full_like(ks, IMG), _ENT + ks)
        pix = X[pick] * image[..., None]
        return tok, pix

    def _pack(self, ids: Tensor, pix: Tensor, img: Tensor, summary: int, labels: Tensor, entity: Tensor,
              masked: bool) -> dict[str, Tensor]:  # fmt: skip
        B, T = ids.shape
        pos = torch.full((B,), summary, dtype=torch.long)
        out = {"input_ids": ids, "pixel_values": pix, "image_mask": img, "position": pos, "labels": labels,
               "entity": entity}  # fmt: skip
        if masked:  # bottleneck=False: plain causal attention (as a 4-D mask, so batches can be padded)
            cut = pos if self.bottleneck else torch.full((B,), T - 1)
            out["attention_mask"] = bottleneck_mask(
                torch.ones(B, T, dtype=torch.bool), cut, torch.zeros(B, dtype=torch.long)
            )
        return out

    def _tail(
        self, n: int, image: Tensor, split: str, g: torch.Generator, source: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``S x_q ->`` (or ``S``): tokens, pixels, image mask, query entities."""
        kq = torch.randint(10, (n,), generator=g)
        tq, pq = self._entities(kq, image, split, g)
        S = torch.full((n, 1), SUM)
        if source:
            return S, torch.zeros(n, 1, 64), torch.zeros(n, 1, dtype=torch.bool), kq
        ids = torch.cat([S, tq[:, None], torch.full((n, 1), ARROW)], 1)
        pix = torch.stack([torch.zeros(n, 64), pq, torch.zeros(n, 64)], 1)
        img = torch.zeros(n, 3, dtype=torch.bool)
        img[:, 1] = image.expand(n)
        return ids, pix, img, kq

    def icl(self, task: int | Sequence[int], n: int, modality: str = "text", split: str = "val",
            query_modality: str | None = None, shuffle_labels: bool = False, source: bool = False,
            seed: int | None = None, generator: torch.Generator | None = None) -> dict[str, Tensor]:  # fmt: skip
        """``n`` ICL prompts (``task``: one task for all, or one per prompt)."""
        t = self._check(task, n, modality, split)
        qm = modality if query_modality is None else query_modality
        self._check(task, n, qm, split)
        g = make_generator(seed, generator)
        S = self.n_shots
        ks = torch.randint(10, (n, S), generator=g)
        y = self.table[t[:, None], ks]
        if shuffle_labels:
            y = self._offset[t][:, None] + (torch.rand(n, S, generator=g) * self._n_out[t][:, None]).long()
        tx, px = self._entities(ks, torch.tensor(modality == "image"), split, g)
        demo = torch.stack([tx, torch.full_like(tx, ARROW), y, torch.full_like(tx, SEP)], -1).reshape(
            n, 4 * S
        )
        dpix = torch.zeros(n, S, 4, 64)
        dpix[:, :, 0] = px
        dimg = torch.zeros(n, S, 4, dtype=torch.bool)
        dimg[:, :, 0] = modality == "image"
        tail, tpix, timg, kq = self._tail(n, torch.tensor(qm == "image"), split, g, source)
        ids = torch.cat([torch.full((n, 1), BOS), demo, tail], 1)
        pix = torch.cat([torch.zeros(n, 1, 64), dpix.reshape(n, 4 * S, 64), tpix], 1)
        img = torch.cat([torch.zeros(n, 1, dtype=torch.bool), dimg.reshape(n, 4 * S), timg], 1)
        return self._pack(ids, pix, img, 1 + 4 * S, self.table[t, kq], kq, masked=True)

    def instruction(self, task: int | Sequence[int], n: int, modality: str | Tensor = "text", split: str = "val",
                    source: bool = False, seed: int | None = None,
                    generator: torch.Generator | None = None) -> dict[str, Tensor]:  # fmt: skip
        """``n`` instruction prompts ``BOS [INSTR_task] S x_q ->`` (``source``: ``BOS [INSTR_task] S``);
        ``modality`` may also be a bool tensor ``[n]`` (True: an image query)."""
        image = modality if isinstance(modality, Tensor) else torch.tensor(modality == "image")
        t = self._check(task, n, "text" if isinstance(modality, Tensor) else modality, split)
        g = make_generator(seed, generator)
        tail, tpix, timg, kq = self._tail(n, image.bool(), split, g, source)
        head = torch.stack([torch.full((n,), BOS), _INSTR + t], 1)
        ids = torch.cat([head, tail], 1)
        pix = torch.cat([torch.zeros(n, 2, 64), tpix], 1)
        img = torch.cat([torch.zeros(n, 2, dtype=torch.bool), timg], 1)
        return self._pack(ids, pix, img, 2, self.table[t, kq], kq, masked=True)

    def zero_shot(self, task: int, n: int, modality: str = "image", split: str = "val",
                  seed: int | None = None, generator: torch.Generator | None = None) -> dict[str, Tensor]:  # fmt: skip
        """``n`` zero-shot queries ``BOS S x_q ->`` labelled with ``task``'s answers (``position`` = 1, S)."""
        t = self._check(task, n, modality, split)
        g = make_generator(seed, generator)
        tail, tpix, timg, kq = self._tail(n, torch.tensor(modality == "image"), split, g, source=False)
        ids = torch.cat([torch.full((n, 1), BOS), tail], 1)
        pix = torch.cat([torch.zeros(n, 1, 64), tpix], 1)
        img = torch.cat([torch.zeros(n, 1, dtype=torch.bool), timg], 1)
        return self._pack(ids, pix, img, 1, self.table[t, kq], kq, masked=False)

    def training_batch(self, n: int, generator: torch.Generator) -> dict[str, Tensor]:
        """A mixed batch of ``n`` prompts: text-only ICL, image-only ICL and instruction prompts (1:1:1,
        tasks uniform; instruction queries text or image), never text demos with an image query; padded on
        the left to one length."""
        kinds = torch.randint(3, (n,), generator=generator)
        tasks = torch.tensor(self.tasks)[torch.randint(len(self.tasks), (n,), generator=generator)]
        parts = []
        for kind in range(3):
            ts = tasks[kinds == kind]
            if len(ts) == 0:
                continue
            if kind == 2:
                image = torch.rand(len(ts), generator=generator) < 0.5
                parts.append(self.instruction(ts.tolist(), len(ts), image, "train", generator=generator))
            else:
                mod = "text" if kind == 0 else "image"
                parts.append(self.icl(ts.tolist(), len(ts), mod, "train", generator=generator))
        return _concat_left(parts)


def _concat_left(parts: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Left-pad prompt batches to one length and concatenate them (4-D masks padded as blocked columns)."""
    T = max(p["input_ids"].shape[1] for p in parts)
    out: dict[str, list[Tensor]] = {k: [] for k in parts[0]}
    for p in parts:
        pad = T - p["input_ids"].shape[1]
        out["input_ids"].append(F.pad(p["input_ids"], (pad, 0), value=PAD))
        out["pixel_values"].append(F.pad(p["pixel_values"], (0, 0, pad, 0)))
        out["image_mask"].append(F.pad(p["image_mask"], (pad, 0), value=False))
        out["position"].append(p["position"] + pad)
        out["labels"].append(p["labels"])
        out["entity"].append(p["entity"])
        m = F.pad(p["attention_mask"], (pad, 0, pad, 0), value=torch.finfo(torch.float32).min)
        idx = torch.arange(pad)
        m[:, :, idx, idx] = 0.0  # a padding row sees only itself
        out["attention_mask"].append(m)
    return {k: torch.cat(v) for k, v in out.items()}


def train_toy_vlm(
    model: ToyVLM,
    data: ToyTaskData,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    callback: Callable[[int, float], None] | None = None,
) -> list[float]:
    """AdamW on :meth:`ToyTaskData.training_batch`, cross-entropy on the query's answer only. Returns the
    per-step losses."""
    for name, v in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite positive number, got {lr!r}")
    g = make_generator(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        batch = data.training_batch(batch_size, g)
        logits = model(**_model_inputs(batch)).logits[:, -1]
        loss = F.cross_entropy(logits, batch["labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if callback is not None:
            callback(step, losses[-1])
    model.eval()
    return losses
