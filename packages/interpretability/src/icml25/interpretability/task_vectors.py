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

The toy two-modality model of the small-scale reproduction (:class:`ToyVLM`, :class:`ToyTaskData`,
:func:`train_toy_vlm`) lives in :mod:`icml25.interpretability.task_vectors_toy`.

Shapes: ``B`` prompts, ``T`` positions, ``L`` decoder layers, ``d`` hidden size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from icml25.kernels.checks import check_tensor, describe

__all__ = [
    "PatchHandle",
    "TaskVectorResult",
    "answer_match",
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
        raise TypeError(f"{name} must be an int or an integer tensor [B], got {describe(position)}")
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
        raise TypeError(f"input_ids must be an integer tensor [B, T] or [T], got {describe(input_ids)}")
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
                f"attention_mask must have the shape of input_ids {tuple(ids.shape)}, got {describe(attention_mask)}"
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
    if key == "inputs_embeds":
        check_tensor(x, key)
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
            raise TypeError(f"vectors[{i}] must be a floating torch.Tensor, got {describe(v)}")
        if v.shape != vectors[0].shape or v.numel() == 0:
            raise ValueError(
                f"vectors must share one non-empty shape; vectors[0] is {tuple(vectors[0].shape)}, vectors[{i}] is {tuple(v.shape)}"
            )
        check_tensor(v, f"vectors[{i}]")
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
            f"batch['labels'] must be a LongTensor [B] with B = {logits.shape[0]}, got {describe(labels)}"
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
            f"vectors must be a floating tensor [L, d] with L = {n}, d = {d}, got {describe(vectors)}"
        )
    if vectors.shape != (n, d):
        raise ValueError(
            f"vectors must have shape [L, d] with L = {n} (one per decoder layer), d = {d}, got {tuple(vectors.shape)}"
        )
    check_tensor(vectors, "vectors")
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
