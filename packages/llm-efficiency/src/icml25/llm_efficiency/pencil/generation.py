"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: generation with reduction, batched.

Yang et al., ICML 2025 (official code ``chr26195/PENCIL``, ``model.py`` ``GPT.generate``): sample a token,
append it, and when it is ``[RETURN]`` apply the reduction rule φ (:func:`~.reduction.reduce_once`) once; stop
at EOS or after ``max_new_tokens``. The official loop handles one sequence (its tensor reduction returns a
batch of more than one row unchanged); here every row of a batch is reduced on its own, rows of equal length
share one forward call, and a transformers causal LM may reuse its KV cache across a reduction: the cache is
cropped to the kept context ``C`` and only the answer ``A`` is re-encoded.
"""

from __future__ import annotations

import copy
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from icml25.kernels.hf_cache import cache_argument, crop_cache, output_cache
from icml25.kernels.rng import make_generator
from icml25.llm_efficiency.pencil.reduction import (
    PencilTokens,
    as_index_array,
    check_pencil_tokens,
    locate_redex,
)

__all__ = ["GenerateOutput", "crop_cache", "pencil_generate"]


@dataclass
class GenerateOutput:
    """The result of :func:`pencil_generate` (one entry per batch row).

    ``sequences[b]``: the final (reduced) context, prompt included, 1-D int64; ``traces[b]``: the unreduced
    stream, prompt followed by every sampled token (``return_trace=True``, else ``None``); ``lengths[b]``:
    the context length after each sampled token, before its reduction (the peaks are the memory needed);
    ``max_context[b]``: the most tokens the model conditioned on; ``n_reductions[b]``; ``finished[b]``
    (EOS reached); ``forward_tokens``: the tokens passed through the model in total (a compute measure).
    """

    sequences: list[torch.Tensor]
    traces: list[torch.Tensor] | None
    lengths: list[list[int]]
    max_context: list[int]
    n_reductions: list[int]
    finished: list[bool]
    forward_tokens: int = 0
    skipped_reductions: list[int] = field(default_factory=list)


@dataclass
class _Group:
    """Rows decoded in lock-step: equal context lengths, one batched KV cache of their first ``n`` tokens."""

    rows: list[int]
    cache: Any = None
    n: int = 0


def _regroup(
    groups: list[_Group], ctx: list[list[int]], finished: list[bool], keep: dict[int, int]
) -> list[_Group]:
    """Split groups whose rows diverged (EOS, a reduction in some rows only, different kept prefixes).

    A row's cache stays valid for its first ``min(n, keep, len - 1)`` tokens (``keep``: the kept context ``C``
    of a reduction this step); each new group's cache is the old one's rows, cropped to that length.
    """
    out: list[_Group] = []
    for g in groups:
        parts: dict[tuple[int, int], list[int]] = {}
        for j, b in enumerate(g.rows):
            if finished[b]:
                continue
            n = min(g.n, keep.get(b, g.n), len(ctx[b]) - 1)
            parts.setdefault((n, len(ctx[b])), []).append(j)
        for (n, _), idx in parts.items():
            rows = [g.rows[j] for j in idx]
            cache = g.cache
            if cache is not None:
                if len(parts) > 1 or len(idx) < len(g.rows):
                    cache = copy.deepcopy(cache) if len(parts) > 1 else cache
                    cache.batch_select_indices(torch.tensor(idx, device=_cache_device(cache)))
                crop_cache(cache, n)
            out.append(_Group(rows, cache, n if cache is not None else 0))
    return out


def _cache_device(cache: Any) -> torch.device:
    for layer in getattr(cache, "layers", []):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor):
            return keys.device
    return torch.device("cpu")


def _is_hf(model: Any) -> bool:
    return callable(getattr(model, "prepare_inputs_for_generation", None))


def _logits(out: Any) -> torch.Tensor:
    logits = getattr(out, "logits", out)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise TypeError(
            "model must return logits of shape (B, T, vocab) (a tensor or an object with .logits), got "
            f"{type(logits).__name__}{tuple(logits.shape) if isinstance(logits, torch.Tensor) else ''}"
        )
    return logits


def _prompts(prompt_ids: Any) -> list[torch.Tensor]:
    if isinstance(prompt_ids, torch.Tensor) and prompt_ids.dim() == 2:
        rows = list(prompt_ids)
    elif isinstance(prompt_ids, torch.Tensor) or (
        isinstance(prompt_ids, (list, tuple)) and all(isinstance(v, numbers.Integral) for v in prompt_ids)
    ):
        rows = [prompt_ids]
    elif isinstance(prompt_ids, (list, tuple)):
        rows = list(prompt_ids)
    else:
        rows = [prompt_ids]
    if not rows:
        raise ValueError("prompt_ids must hold at least one prompt, got an empty batch")
    out = []
    for i, r in enumerate(rows):
        arr = as_index_array(r, f"prompt_ids[{i}]")
        if arr.size == 0:
            raise ValueError(f"prompt_ids[{i}] must hold at least one token, got an empty prompt")
        out.append(torch.from_numpy(arr.copy()))
    return out


def _sample(
    logits: torch.Tensor, temperature: float, top_k: int | None, gen: torch.Generator
) -> torch.Tensor:
    """Next tokens ``(B,)`` from last-position logits ``(B, V)``: greedy at temperature 0, else top-k sampling."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        v = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < v, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(1).to(logits.device)


def pencil_generate(
    model: Callable[..., Any],
    prompt_ids: Any,
    tok: PencilTokens,
    eos_id: int,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 200,
    max_context: int | None = None,
    use_cache: bool = True,
    return_trace: bool = False,
    reduce: bool = True,
    rule: Callable[[list[int]], list[int]] | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> GenerateOutput:
    """Autoregressive generation with PENCIL's reduction, for a batch of prompts of any lengths.

    ``model``: a transformers causal LM (``model(input_ids=...)`` with ``.logits``) or any callable
    ``ids (B, T) int64 -> logits (B, T, vocab)`` (e.g. :class:`~icml25.llm_efficiency.TinyDecoder`).
    ``prompt_ids``: one prompt (1-D list/array/tensor), a ``(B, T)`` tensor or a list of 1-D prompts.
    Each step samples a token per unfinished row (``temperature=0``: greedy; else softmax at ``temperature``
    over the ``top_k`` largest logits, drawn from ``generator``/``seed``), appends it, and applies φ once when
    it is ``[RETURN]`` (``reduce=False`` gives the plain chain-of-thought baseline). A ``[RETURN]`` that φ
    cannot match warns and stays (as in the official code, it then blocks later reductions of that row).
    ``max_context``: the model sees at most the last ``max_context`` tokens (the official sliding window);
    it must be at least the longest prompt. ``use_cache``: with a transformers model, reuse the KV cache
    while the context fits the window (cropped to ``C`` on a reduction); other models recompute.
    Rows stop at ``eos_id`` or after ``max_new_tokens``. ``rule``: replaces φ (a function of the row's token
    list returning the rewritten list; for ablations), applied at each ``[RETURN]``.
    """
    tok = check_pencil_tokens(tok)
    if not isinstance(eos_id, numbers.Integral) or isinstance(eos_id, bool) or eos_id < 0:
        raise TypeError(f"eos_id must be a non-negative int token id, got {eos_id!r}")
    if int(eos_id) in tok.ids:
        raise ValueError(f"eos_id must differ from the PENCIL markers {tok.ids}, got {eos_id}")
    if (
        not isinstance(max_new_tokens, numbers.Integral)
        or isinstance(max_new_tokens, bool)
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not isinstance(temperature, numbers.Real) or not (temperature >= 0 and temperature < float("inf")):
        raise ValueError(f"temperature must be a finite float >= 0 (0 = greedy), got {temperature!r}")
    if rule is not None and not callable(rule):
        raise TypeError(f"rule must be a callable list[int] -> list[int] or None, got {type(rule).__name__}")
    if top_k is not None and (not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"top_k must be an int >= 1 or None, got {top_k!r}")
    rows = _prompts(prompt_ids)
    longest = max(len(r) for r in rows)
    if max_context is not None:
        if not isinstance(max_context, numbers.Integral) or isinstance(max_context, bool):
            raise TypeError(f"max_context must be an int or None, got {type(max_context).__name__}")
        if max_context < longest:
            raise ValueError(
                f"max_context must be >= the prompt length (the prompt must fit the window), got "
                f"max_context={max_context} for a prompt of {longest} tokens"
            )
    gen = make_generator(seed, generator)
    hf = _is_hf(model)
    cache_kw = cache_argument(model) if hf else ""
    cached = bool(use_cache) and hf
    vocab_checked = False
    device = next(iter(model.parameters())).device if hasattr(model, "parameters") else torch.device("cpu")

    B = len(rows)
    ctx = [r.tolist() for r in rows]
    traces = [r.tolist() for r in rows] if return_trace else None
    lengths: list[list[int]] = [[] for _ in range(B)]
    max_ctx = [0] * B
    n_red = [0] * B
    skipped = [0] * B
    finished = [False] * B
    fwd = 0

    def forward(batch: list[list[int]], cache: Any = None) -> tuple[torch.Tensor, Any]:
        nonlocal vocab_checked
        ids = torch.tensor(batch, dtype=torch.long, device=device)
        if hf:
            kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": cache is not None}
            if cache is not None and cache is not True:
                kwargs[cache_kw] = cache
            out = model(**kwargs)
            logits, new_cache = _logits(out), output_cache(out)
        else:
            logits, new_cache = _logits(model(ids)), None
        if not vocab_checked:
            tok.check_vocab(logits.shape[-1], "the model's logits")
            if eos_id >= logits.shape[-1]:
                raise ValueError(
                    f"eos_id must be < the model's vocabulary size {logits.shape[-1]}, got {eos_id}"
                )
            vocab_checked = True
        return logits[:, -1, :], new_cache

    # Lock-step groups: rows of one group have equal context lengths and share one batched KV cache
    # holding their first ``n`` tokens (``cache=None``: nothing cached). Without a cache, ``n`` stays 0.
    groups: list[_Group] = []
    for b in range(B):
        g = next((g for g in groups if len(ctx[g.rows[0]]) == len(ctx[b])), None)
        if g is None:
            groups.append(_Group([b]))
        else:
            g.rows.append(b)

    with torch.no_grad():
        for _ in range(int(max_new_tokens)):
            if not groups:
                break
            last: dict[int, torch.Tensor] = {}
            for g in groups:
                n_ctx = len(ctx[g.rows[0]])
                if not cached or (max_context is not None and n_ctx > max_context):
                    # sliding window (or no cache): recompute the last max_context tokens, positions from 0
                    g.cache, g.n = None, 0
                    window = n_ctx if max_context is None else min(n_ctx, max_context)
                    logit, _ = forward([ctx[b][-window:] for b in g.rows])
                    fwd += window * len(g.rows)
                else:
                    window = n_ctx
                    logit, g.cache = forward(
                        [ctx[b][g.n :] for b in g.rows], g.cache if g.cache is not None else True
                    )
                    fwd += (n_ctx - g.n) * len(g.rows)
                    g.n = n_ctx
                for j, b in enumerate(g.rows):
                    last[b] = logit[j]
                    max_ctx[b] = max(max_ctx[b], window)
            active = [b for g in groups for b in g.rows]
            nxt = _sample(torch.stack([last[b] for b in active]), float(temperature), top_k, gen).tolist()
            keep: dict[int, int] = {}
            for b, t in zip(active, nxt):
                ctx[b].append(int(t))
                if traces is not None:
                    traces[b].append(int(t))
                lengths[b].append(len(ctx[b]))
                if t == eos_id:
                    finished[b] = True
                elif reduce and t == tok.ret and rule is not None:
                    new = list(rule(list(ctx[b])))
                    same = next(
                        (i for i, (x, y) in enumerate(zip(ctx[b], new)) if x != y), min(len(new), len(ctx[b]))
                    )
                    if new != ctx[b]:
                        ctx[b] = new
                        n_red[b] += 1
                        keep[b] = same
                elif reduce and t == tok.ret:
                    where = locate_redex(np.asarray(ctx[b], dtype=np.int64), tok)
                    if isinstance(where, str) or where is None:
                        warnings.warn(
                            f"PENCIL reduction skipped in row {b}: {where}", RuntimeWarning, stacklevel=2
                        )
                        skipped[b] += 1
                        continue
                    c, s, r = where
                    ctx[b] = ctx[b][:c] + ctx[b][s + 1 : r] + ctx[b][r + 1 :]
                    n_red[b] += 1
                    keep[b] = c
            groups = _regroup(groups, ctx, finished, keep)
    return GenerateOutput(
        sequences=[torch.tensor(c, dtype=torch.long) for c in ctx],
        traces=None if traces is None else [torch.tensor(t, dtype=torch.long) for t in traces],
        lengths=lengths,
        max_context=max_ctx,
        n_reductions=n_red,
        finished=finished,
        forward_tokens=fwd,
        skipped_reductions=skipped,
    )
