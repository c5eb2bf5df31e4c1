"""The Illusion of Role Separation: Hidden Shortcuts in LLM Role Learning (and How to Fix Them) — ICML 2025, P44: position-enhanced fine-tuning (PFT), shortcut diagnostics and synthetic role tasks.

Wang, Jiang, Yu, Huang, ICML 2025 (arXiv 2505.00626; no official code was released). Models fine-tuned to
tell system instructions from user content learn shortcuts (the task type, the proximity of the
instruction to the begin-of-text token) instead of the role boundary. PFT writes an invariant role
signal into the position ids: ordinary ids inside each role and a numeric gap ``d`` between the system
block and everything after it.

* :func:`pft_position_ids` builds the ids ``[B, L]`` from per-token role ids (left/right padding aware);
  :func:`role_spans` lists the contiguous role blocks;
* :class:`PFTCollator` turns chat messages (strings through ``tokenizer.apply_chat_template`` and its
  character offsets, or pre-tokenized id lists) into ``input_ids``, ``attention_mask``, ``labels``
  (assistant content only), ``role_ids`` and ``position_ids`` for any transformers causal LM;
* :func:`pft_generate` is a KV-cached greedy/sampling decode loop whose new tokens continue from the last
  position id (transformers' ``generate`` rebuilds the ids from the attention mask and undoes PFT;
  :func:`hf_generate` calls it and warns when it would);
* :func:`check_position_range` raises for absolute position embeddings beyond their table and warns for
  RoPE models beyond their trained context;
* :class:`RoleTask` is the synthetic system/user task of the small-scale reproduction (a system op applied
  to user content, with an injected op in the user block), :func:`train_role_model` /
  :func:`answer_accuracy` train and score any causal LM on it, :func:`shortcut_suite` runs the
  proximity, task-type and injection probes and :func:`role_probe` the linear system-vs-user probe;
* :func:`pft_llama` builds a random-init ``transformers.LlamaForCausalLM`` (extra ``[hf]``, imported
  lazily).

The offset convention is unverified against the paper: ``offset="shift"`` (default) adds ``gap`` to every
id after the first system block (the jump at the boundary is ``1 + gap``); ``offset="global"`` reads
"user position = original + k + gap" with the global index, so the jump is ``1 + k + gap`` where ``k`` is
the last system position id.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from icml25.interpretability.common.llama import random_llama
from icml25.kernels.checks import check_choice, check_float, check_int, check_tensor
from icml25.kernels.hf_cache import cache_argument, output_cache
from icml25.kernels.rng import make_generator

__all__ = [
    "ASSISTANT",
    "ROLES",
    "SYSTEM",
    "USER",
    "PFTCollator",
    "PFTGeneration",
    "RoleTask",
    "answer_accuracy",
    "check_position_range",
    "hf_generate",
    "pft_generate",
    "pft_llama",
    "pft_position_ids",
    "role_probe",
    "role_spans",
    "shortcut_suite",
    "train_role_model",
]

logger = logging.getLogger(__name__)

SYSTEM, USER, ASSISTANT = 0, 1, 2
ROLES: dict[str, int] = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
"""Role name -> role id used in ``role_ids`` (padding tokens carry ``-1``)."""
OFFSETS = ("shift", "global")
_WARNED: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(msg)


def _int_tensor(x: Any, name: str, ndim: tuple[int, ...] = (1, 2)) -> Tensor:
    return check_tensor(x, name, ndim=ndim, dtype="int", non_empty=True)


def _mask(attention_mask: Any, like: Tensor) -> Tensor:
    if attention_mask is None:
        return torch.ones_like(like, dtype=torch.bool)
    attention_mask = check_tensor(
        attention_mask, "attention_mask", dtype=("float", "int", "bool"), binary=True
    )
    if attention_mask.shape != like.shape:
        raise ValueError(
            f"attention_mask must have the shape of role_ids {tuple(like.shape)}, got {tuple(attention_mask.shape)}"
        )
    return attention_mask.bool()


# ------------------------------------------------------------------------------------------ positions
def role_spans(role_ids: Tensor, attention_mask: Tensor | None = None) -> list[list[tuple[int, int, int]]]:
    """Contiguous role blocks ``(role, start, end)`` (``end`` exclusive) of each row of ``role_ids [B, L]``
    (or ``[L]``: one row); padding (``attention_mask == 0``) is skipped and splits no block."""
    r = _int_tensor(role_ids, "role_ids")
    r2 = r[None] if r.ndim == 1 else r
    m = _mask(attention_mask, r)
    m2 = m[None] if r.ndim == 1 else m
    out: list[list[tuple[int, int, int]]] = []
    for row, mrow in zip(r2.tolist(), m2.tolist(), strict=True):
        spans: list[tuple[int, int, int]] = []
        for i, (role, real) in enumerate(zip(row, mrow, strict=True)):
            if not real:
                continue
            if spans and spans[-1][0] == role and not any(mrow[spans[-1][2] : i]):
                spans[-1] = (role, spans[-1][1], i + 1)  # padding inside a block (unusual) splits nothing
            else:
                spans.append((role, i, i + 1))
        out.append(spans)
    return out


def pft_position_ids(
    role_ids: Tensor,
    gap: int,
    system_role: int = SYSTEM,
    attention_mask: Tensor | None = None,
    *,
    input_ids: Tensor | None = None,
    offset: str = "shift",
    allow_reorder: bool = False,
) -> Tensor:
    """PFT position ids ``[B, L]`` (or ``[L]``) from per-token ``role_ids`` of the same shape.

    The real tokens (``attention_mask == 1``, all when ``None``) get the ordinary ids ``0, 1, ...`` in
    order (so left padding leaves them unchanged; padding tokens get ``1``, as transformers does). Every
    real token after the *first* system block is shifted by ``gap`` (``offset="shift"``: the first user
    token gets ``k + 1 + gap`` with ``k`` the last system id) or by ``k + gap`` (``offset="global"``,
    the other reading of the paper's rule). Later system blocks of a multi-turn input are not anchors:
    there is one shift per row. A row without a system token is not shifted (logged once). A row whose
    first real token is not a system token raises unless ``allow_reorder=True`` (then the tokens before
    the first system block keep their ids). ``gap=0`` with ``"shift"`` gives the default ids.
    """
    r = _int_tensor(role_ids, "role_ids")
    if input_ids is not None:
        _int_tensor(input_ids, "input_ids")
        if input_ids.shape != r.shape:
            raise ValueError(
                f"role_ids must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(r.shape)}"
            )
    gap = check_int(gap, "gap", low=0)
    check_int(system_role, "system_role")
    check_choice(offset, "offset", OFFSETS)
    m = _mask(attention_mask, r)
    squeeze = r.ndim == 1
    r2, m2 = (r[None], m[None]) if squeeze else (r, m)
    base = m2.long().cumsum(-1) - 1
    pos = base.masked_fill(~m2, 1)
    for b in range(r2.shape[0]):
        real = m2[b].nonzero().flatten()
        if real.numel() == 0:
            continue
        roles = r2[b, real]
        is_sys = roles == system_role
        if not bool(is_sys.any()):
            _warn_once(
                "no_system", "pft_position_ids: a row has no system token; its position ids are not shifted"
            )
            continue
        first = int(is_sys.nonzero()[0])
        if first > 0 and not allow_reorder:
            raise ValueError(
                f"role_ids row {b}: the system block must come first, got role {int(roles[0])} at the first "
                f"real token and the first system token at real index {first}; pass allow_reorder=True to "
                "anchor the gap on the first system block anyway"
            )
        after = (~is_sys[first:]).nonzero()
        if after.numel() == 0:
            continue  # system only: nothing to shift
        end = first + int(after[0])  # first real index after the first system block
        k = int(base[b, real[end - 1]])
        shift = gap if offset == "shift" else k + gap
        pos[b, real[end:]] += shift
    return pos[0] if squeeze else pos


_ABSOLUTE_NAMES = ("wpe", "embed_positions", "position_embeddings", "pos_emb")


def check_position_range(model: Any, position_ids: Tensor) -> None:
    """Raise ``ValueError`` when ``position_ids`` exceed an absolute position-embedding table of ``model``
    (a ``wpe`` / ``embed_positions`` / ``position_embeddings`` ``nn.Embedding``, as in GPT-2, OPT, BERT);
    for other (RoPE) models warn (``UserWarning``) when they exceed ``config.max_position_embeddings``,
    the trained context."""
    check_tensor(position_ids, "position_ids", dtype="int")
    if position_ids.numel() == 0:
        return
    top = int(position_ids.max())
    if int(position_ids.min()) < 0:
        raise ValueError(f"position_ids must be >= 0, got min {int(position_ids.min())}")
    table = None
    if isinstance(model, nn.Module):
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Embedding) and name.rsplit(".", 1)[-1] in _ABSOLUTE_NAMES:
                table = mod.num_embeddings
                break
    cfg = getattr(model, "config", None)
    limit = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
    if table is not None:
        lim = int(limit) if isinstance(limit, int) else table
        lim = min(lim, table)
        if top >= lim:
            raise ValueError(
                f"position_ids reach {top} but the model's absolute position embedding has {lim} entries "
                f"(max_position_embeddings); use a smaller gap"
            )
    elif isinstance(limit, int) and top >= limit:
        warnings.warn(
            f"position_ids reach {top}, beyond the trained context max_position_embeddings={limit} of this "
            "RoPE model: expect degraded outputs; use a smaller gap",
            UserWarning,
            stacklevel=2,
        )


# ------------------------------------------------------------------------------------------ collator
def _assign_roles(
    text: str, messages: Sequence[Mapping[str, Any]]
) -> tuple[list[tuple[int, int]], list[int]]:
    """Character span of each message's content in ``text`` and the end of each message's region."""
    spans, cursor = [], 0
    for i, msg in enumerate(messages):
        start = text.find(msg["content"], cursor)
        if start < 0:
            raise ValueError(f"messages[{i}]['content'] is not found in the rendered chat template")
        spans.append((start, start + len(msg["content"])))
        cursor = start + len(msg["content"])
    return spans, [e for _, e in spans]


class PFTCollator:
    """Batches chat conversations into PFT inputs for a transformers causal LM.

    ``PFTCollator(tokenizer=None, gap=0, offset="shift", padding_side="right", pad_token_id=None,
    allow_reorder=False, max_length=None)``; ``collator(conversations)`` with each conversation a list of
    ``{"role": "system" | "user" | "assistant", "content": ...}`` returns a dict of ``[B, L]`` tensors
    ``input_ids``, ``attention_mask``, ``labels`` (``-100`` except on assistant content tokens),
    ``role_ids`` (:data:`ROLES`, ``-1`` on padding) and ``position_ids`` (:func:`pft_position_ids`).

    String contents are rendered with ``tokenizer.apply_chat_template(..., tokenize=False)`` and tokenized
    with character offsets; a template token belongs to the message whose content it precedes (headers,
    BOS) or, after the last content, to the last message. List-of-int contents are pre-tokenized blocks,
    concatenated without a template (no tokenizer needed; ``pad_token_id`` required).
    """

    def __init__(
        self,
        tokenizer: Any = None,
        gap: int = 0,
        offset: str = "shift",
        padding_side: str = "right",
        pad_token_id: int | None = None,
        allow_reorder: bool = False,
        max_length: int | None = None,
    ) -> None:
        self.gap = check_int(gap, "gap", low=0)
        check_choice(offset, "offset", OFFSETS)
        check_choice(padding_side, "padding_side", ("left", "right"))
        if pad_token_id is None and tokenizer is not None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
            if pad_token_id is None:
                pad_token_id = getattr(tokenizer, "eos_token_id", None)
        if pad_token_id is not None:
            check_int(pad_token_id, "pad_token_id", low=0)
        if max_length is not None:
            check_int(max_length, "max_length", low=1)
        self.tokenizer, self.offset, self.padding_side = tokenizer, offset, padding_side
        self.pad_token_id, self.allow_reorder, self.max_length = pad_token_id, allow_reorder, max_length

    def _encode(self, conv: Any, i: int) -> tuple[list[int], list[int], list[bool]]:
        if not isinstance(conv, (list, tuple)) or not conv:
            raise ValueError(f"conversations[{i}] must be a non-empty list of messages, got {conv!r}")
        for j, m in enumerate(conv):
            if not isinstance(m, Mapping) or m.get("role") not in ROLES or "content" not in m:
                raise ValueError(
                    f"conversations[{i}][{j}] must be a dict with 'role' in {tuple(ROLES)} and 'content', got {m!r}"
                )
        if all(isinstance(m["content"], str) for m in conv):
            return self._encode_text(conv, i)
        ids: list[int] = []
        roles: list[int] = []
        lab: list[bool] = []
        for j, m in enumerate(conv):
            c = m["content"]
            if isinstance(c, Tensor):
                c = c.tolist()
            if not isinstance(c, (list, tuple)) or not all(
                isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in c
            ):
                raise TypeError(
                    f"conversations[{i}][{j}]['content'] must be a str (all messages) or a list of "
                    f"non-negative token ids, got {type(m['content']).__name__}"
                )
            ids += [int(t) for t in c]
            roles += [ROLES[m["role"]]] * len(c)
            lab += [m["role"] == "assistant"] * len(c)
        if self.pad_token_id is None:
            raise ValueError("pad_token_id must be given for pre-tokenized contents (no tokenizer)")
        return ids, roles, lab

    def _encode_text(
        self, conv: Sequence[Mapping[str, Any]], i: int
    ) -> tuple[list[int], list[int], list[bool]]:
        tok = self.tokenizer
        if tok is None or not callable(getattr(tok, "apply_chat_template", None)):
            raise TypeError("string contents need a tokenizer with apply_chat_template (tokenizer=...)")
        if not getattr(tok, "is_fast", False):
            raise TypeError("tokenizer must be a fast tokenizer (character offsets give the role ids)")
        text = tok.apply_chat_template(list(conv), tokenize=False)
        spans, ends = _assign_roles(text, conv)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, roles, lab = [], [], []
        for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
            j = next((k for k, e in enumerate(ends) if a < e), len(conv) - 1)
            if a == b:  # a zero-width special token: the message it precedes
                j = next(
                    (k for k, e in enumerate(ends) if a < e or (a == e and k == len(ends) - 1)), len(conv) - 1
                )
            ids.append(int(t))
            roles.append(ROLES[conv[j]["role"]])
            s, e = spans[j]
            lab.append(conv[j]["role"] == "assistant" and a >= s and b <= e and b > a)
        return ids, roles, lab

    def __call__(self, conversations: Sequence[Any]) -> dict[str, Tensor]:
        if not isinstance(conversations, (list, tuple)) or not conversations:
            raise ValueError("conversations must be a non-empty list of conversations")
        rows = [self._encode(c, i) for i, c in enumerate(conversations)]
        if self.max_length is not None:
            rows = [(a[: self.max_length], b[: self.max_length], c[: self.max_length]) for a, b, c in rows]
        if any(len(ids) == 0 for ids, _, _ in rows):
            raise ValueError("every conversation must hold at least one token")
        L = max(len(ids) for ids, _, _ in rows)
        B = len(rows)
        input_ids = torch.full((B, L), int(self.pad_token_id or 0), dtype=torch.long)
        role_ids = torch.full((B, L), -1, dtype=torch.long)
        labels = torch.full((B, L), -100, dtype=torch.long)
        mask = torch.zeros(B, L, dtype=torch.long)
        for b, (ids, roles, lab) in enumerate(rows):
            n = len(ids)
            sl = slice(L - n, L) if self.padding_side == "left" else slice(0, n)
            t = torch.tensor(ids, dtype=torch.long)
            input_ids[b, sl] = t
            role_ids[b, sl] = torch.tensor(roles, dtype=torch.long)
            labels[b, sl] = torch.where(torch.tensor(lab), t, torch.tensor(-100))
            mask[b, sl] = 1
        pos = pft_position_ids(
            role_ids, self.gap, attention_mask=mask, offset=self.offset, allow_reorder=self.allow_reorder
        )
        return {
            "input_ids": input_ids,
            "attention_mask": mask,
            "labels": labels,
            "role_ids": role_ids,
            "position_ids": pos,
        }


# ------------------------------------------------------------------------------------------ decoding
@dataclass
class PFTGeneration:
    """Output of :func:`pft_generate`: ``sequences [B, L + T]`` (prompt then new tokens),
    ``position_ids [B, L + T]`` (the prompt's ids, then ``last + 1, last + 2, ...``), ``logits [B, T, V]``
    (the distribution each new token was drawn from) and ``attention_mask [B, L + T]``."""

    sequences: Tensor
    position_ids: Tensor
    logits: Tensor
    attention_mask: Tensor


def _check_model(model: Any) -> None:
    if not isinstance(model, nn.Module) or not callable(model):
        raise TypeError(f"model must be a torch.nn.Module causal LM, got {type(model).__name__}")


@torch.no_grad()
def pft_generate(
    model: nn.Module,
    input_ids: Tensor,
    position_ids: Tensor,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    eos_token_id: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> PFTGeneration:
    """Decode ``max_new_tokens`` tokens with a KV cache, keeping the PFT ids of the prompt.

    ``input_ids``, ``position_ids``, ``attention_mask [B, L]`` (left padding for batches of unequal
    length). New token ``t`` of row ``b`` gets position ``max(position_ids[b, real]) + 1 + t``. Greedy by
    default; ``do_sample=True`` samples from ``softmax(logits / temperature)`` (top-``k`` when given) with
    ``make_generator(seed, generator)``. After ``eos_token_id`` a row keeps emitting it. The model must
    accept ``position_ids``, ``attention_mask``, ``past_key_values`` and ``use_cache`` (transformers
    causal LMs do).
    """
    _check_model(model)
    ids = _int_tensor(input_ids, "input_ids", (2,))
    pos = _int_tensor(position_ids, "position_ids", (2,))
    if pos.shape != ids.shape:
        raise ValueError(
            f"position_ids must have the shape of input_ids {tuple(ids.shape)}, got {tuple(pos.shape)}"
        )
    mask = _mask(attention_mask, ids).long()
    n_new = check_int(max_new_tokens, "max_new_tokens", low=0)
    check_float(temperature, "temperature", low=0, low_open=True)
    if top_k is not None:
        check_int(top_k, "top_k", low=1)
    if eos_token_id is not None:
        check_int(eos_token_id, "eos_token_id", low=0)
    if bool((mask.sum(-1) == 0).any()):
        raise ValueError("attention_mask must keep at least one real token per row")
    check_position_range(model, pos.masked_fill(mask == 0, 0) + n_new)
    gen = make_generator(seed, generator) if do_sample else None
    last = pos.masked_fill(mask == 0, -1).max(-1).values  # [B]
    was_training = model.training
    model.eval()
    try:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        kw = cache_argument(model)
        past = output_cache(out)
        logits_t = out.logits[:, -1].float()
        seqs, poss, masks, all_logits = [ids], [pos], [mask], []
        done = torch.zeros(ids.shape[0], dtype=torch.bool)
        for t in range(n_new):
            all_logits.append(logits_t)
            if do_sample:
                z = logits_t / temperature
                if top_k is not None:
                    kth = z.topk(min(top_k, z.shape[-1]), dim=-1).values[:, -1:]
                    z = z.masked_fill(z < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, -1), 1, generator=gen).squeeze(-1)
            else:
                nxt = logits_t.argmax(-1)
            if eos_token_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
                done = done | (nxt == eos_token_id)
            new_pos = (last + 1 + t)[:, None]
            seqs.append(nxt[:, None])
            poss.append(new_pos)
            masks.append(torch.ones_like(new_pos))
            if t == n_new - 1:
                break
            out = model(
                input_ids=nxt[:, None],
                attention_mask=torch.cat(masks, -1),
                position_ids=new_pos,
                use_cache=True,
                **{kw: past},
            )
            past = output_cache(out)
            logits_t = out.logits[:, -1].float()
    finally:
        model.train(was_training)
    V = logits_t.shape[-1]
    return PFTGeneration(
        sequences=torch.cat(seqs, -1),
        position_ids=torch.cat(poss, -1),
        logits=torch.stack(all_logits, 1) if all_logits else torch.empty(ids.shape[0], 0, V),
        attention_mask=torch.cat(masks, -1),
    )


def hf_generate(
    model: nn.Module, input_ids: Tensor, position_ids: Tensor | None = None, **generate_kwargs: Any
) -> Tensor:
    """``model.generate(input_ids, **generate_kwargs)``, warning (``UserWarning``) when ``position_ids``
    are not the ids ``generate`` rebuilds from the attention mask: ``generate`` recomputes them (cumsum of
    the mask) and silently undoes PFT; use :func:`pft_generate` instead."""
    _check_model(model)
    ids = _int_tensor(input_ids, "input_ids", (2,))
    if position_ids is not None:
        pos = _int_tensor(position_ids, "position_ids", (2,))
        if pos.shape != ids.shape:
            raise ValueError(
                f"position_ids must have the shape of input_ids {tuple(ids.shape)}, got {tuple(pos.shape)}"
            )
        am = generate_kwargs.get("attention_mask")
        m = _mask(am, ids)
        default = (m.long().cumsum(-1) - 1).masked_fill(~m, 1)
        if not torch.equal(pos.masked_fill(~m, 1), default):
            warnings.warn(
                "transformers' generate recomputes position_ids from attention_mask and ignores the PFT "
                "ids given here (the role gap is lost); use icml25.interpretability.pft_generate",
                UserWarning,
                stacklevel=2,
            )
    return model.generate(input_ids=ids, **generate_kwargs)


def pft_llama(
    vocab_size: int,
    hidden_size: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    max_position_embeddings: int = 1024,
    rope_theta: float = 10000.0,
    seed: int = 0,
) -> nn.Module:
    """A random-init ``transformers.LlamaForCausalLM`` (RoPE, SwiGLU width ``2 * hidden_size``; no BOS/EOS,
    untied embeddings), offline, with weights from ``seed`` (the global random state is untouched;
    :func:`~icml25.interpretability.common.llama.random_llama`). Needs the ``[hf]`` extra."""
    rope_theta = check_float(rope_theta, "rope_theta", low=1, low_open=True)
    return random_llama(
        vocab_size, hidden_size, n_layers, n_heads, max_position_embeddings=max_position_embeddings,
        seed=seed, rope_theta=rope_theta, bos_token_id=None, eos_token_id=None, pad_token_id=0,
        tie_word_embeddings=False,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ synthetic
PAD, BOS, ASST, SYS, USR = 0, 1, 2, 3, 4
OPS: dict[str, int] = {"REV": 5, "SORT": 6, "INC": 7, "DUP": 8}
N_CONTENT = 16
CONTENT0 = 9
VOCAB_SIZE = CONTENT0 + N_CONTENT


def apply_op(op: int, content: Sequence[int]) -> list[int]:
    """The answer of op token ``op`` on content tokens: reverse, sort, increment (mod 16), duplicate."""
    c = list(content)
    if op == OPS["REV"]:
        return c[::-1]
    if op == OPS["SORT"]:
        return sorted(c)
    if op == OPS["INC"]:
        return [CONTENT0 + (t - CONTENT0 + 1) % N_CONTENT for t in c]
    if op == OPS["DUP"]:
        return [t for t in c for _ in (0, 1)]
    raise ValueError(f"op must be one of the op tokens {sorted(OPS.values())}, got {op!r}")


TOKEN_SHIFTS: dict[int, int] = {OPS["REV"]: 1, OPS["SORT"]: 5, OPS["INC"]: 9, OPS["DUP"]: 13}
"""``answer="token"`` mode: op ``o`` maps the last user content token ``x`` to ``x + TOKEN_SHIFTS[o]`` (mod 16)."""


ANSWERS = ("sequence", "token", "op")


def apply_op_token(op: int, x: int) -> int:
    """The one-token answer of op ``op`` on content token ``x`` (``answer="token"`` mode)."""
    if op not in TOKEN_SHIFTS:
        raise ValueError(f"op must be one of the op tokens {sorted(OPS.values())}, got {op!r}")
    return CONTENT0 + (x - CONTENT0 + TOKEN_SHIFTS[op]) % N_CONTENT


def _range(v: Any, name: str) -> tuple[int, int]:
    if (
        not isinstance(v, (tuple, list))
        or len(v) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        or v[0] < 0
        or v[1] < v[0]
    ):
        raise ValueError(f"{name} must be a (low, high) pair of ints with 0 <= low <= high, got {v!r}")
    return int(v[0]), int(v[1])


@dataclass(frozen=True)
class RoleTask:
    """The synthetic system/user role task (tokens: ``PAD=0, BOS=1, ASST=2, SYS=3, USR=4``, ops
    ``REV, SORT, INC, DUP = 5..8``, 16 content tokens ``9..24``).

    A conversation is ``[BOS, (SYS), system, (USR), user, ASST] -> answer``: the system block holds
    ``sys_len`` content (filler) tokens with one op at a system index in ``op_index`` (counted in the
    system block, the op included in ``sys_len``); the user block holds ``user_len`` content tokens plus,
    with probability ``p_inject``, one injected op (from ``injected_ops``) at user index ``>=
    inject_min_index``. The answer is the system op applied to the user content tokens (the injected op
    ignored). ``delimiters=False`` drops ``SYS``/``USR``: the role boundary is then visible only in the
    position ids. BOS and SYS belong to the system role, USR to the user role, ASST and the answer to the
    assistant role.
    """

    sys_len: tuple[int, int] = (1, 24)
    op_index: tuple[int, int] = (0, 2)
    user_len: tuple[int, int] = (6, 10)
    p_inject: float = 0.5
    inject_min_index: int = 2
    delimiters: bool = True
    injected_ops: tuple[int, ...] = tuple(OPS.values())
    system_ops: tuple[int, ...] = tuple(OPS.values())
    answer: str = "sequence"

    def __post_init__(self) -> None:
        if self.answer not in ANSWERS:
            raise ValueError(f"answer must be one of {ANSWERS}, got {self.answer!r}")
        lo, hi = _range(self.sys_len, "sys_len")
        olo, ohi = _range(self.op_index, "op_index")
        ulo, _ = _range(self.user_len, "user_len")
        if lo < 1 or olo >= hi:
            raise ValueError(
                f"sys_len {self.sys_len} must be >= 1 and admit an op at op_index {self.op_index}"
            )
        if ulo < 1:
            raise ValueError(f"user_len must be >= 1, got {self.user_len}")
        check_float(self.p_inject, "p_inject", low=0, high=1)
        check_int(self.inject_min_index, "inject_min_index", low=0)
        for name in ("injected_ops", "system_ops"):
            ops = getattr(self, name)
            if not ops or any(o not in OPS.values() for o in ops):
                raise ValueError(
                    f"{name} must be a non-empty tuple of op tokens {sorted(OPS.values())}, got {ops!r}"
                )
        del ohi

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def proximity_probe(self, min_op_index: int = 8) -> RoleTask:
        """The proximity shortcut probe: same lengths, the system op at system index ``>= min_op_index``
        (never near BOS), the injection always present."""
        return replace(self, op_index=(min_op_index, self.sys_len[1] - 1), p_inject=1.0)

    def task_type_probe(self) -> RoleTask:
        """The task-type shortcut probe: the roles' op types swapped (system ops drawn from the ops
        injected in training, the injected op from the system ops), the injection always present."""
        return replace(self, system_ops=self.injected_ops, injected_ops=self.system_ops, p_inject=1.0)

    def injection_probe(self) -> RoleTask:
        """The in-distribution task with the injection always present."""
        return replace(self, p_inject=1.0)

    def sample(
        self, n: int, seed: int | None = None, generator: torch.Generator | None = None
    ) -> list[list[dict]]:
        """``n`` conversations ``[{"role", "content": token ids}, ...]`` for :class:`PFTCollator`."""
        n = check_int(n, "n", low=1)
        g = make_generator(seed, generator)

        def ri(lo: int, hi: int) -> int:
            return int(torch.randint(lo, hi + 1, (1,), generator=g))

        def content(k: int) -> list[int]:
            return (torch.randint(0, N_CONTENT, (k,), generator=g) + CONTENT0).tolist()

        out = []
        for _ in range(n):
            olo, ohi = self.op_index
            s = ri(max(self.sys_len[0], olo + 1), self.sys_len[1])
            j = ri(olo, min(ohi, s - 1))
            op = self.system_ops[ri(0, len(self.system_ops) - 1)]
            system = content(s)
            system[j] = op
            user = content(ri(*self.user_len))
            token = self.answer != "sequence"
            if self.answer == "op":
                answer = [op]
            else:
                answer = [apply_op_token(op, user[-1])] if token else apply_op(op, user)
            if float(torch.rand((), generator=g)) < self.p_inject:
                inj = self.injected_ops[ri(0, len(self.injected_ops) - 1)]
                hi = len(user) - 1 if token else len(user)  # token mode: the last user token stays content
                at = ri(min(self.inject_min_index, hi), hi)
                user = [*user[:at], inj, *user[at:]]
            sys_block = [BOS] + ([SYS] if self.delimiters else []) + system
            usr_block = ([USR] if self.delimiters else []) + user
            out.append(
                [
                    {"role": "system", "content": sys_block},
                    {"role": "user", "content": usr_block},
                    {"role": "assistant", "content": [ASST]},
                    {"role": "assistant", "content": answer},
                ]
            )
        return out

    def batch(
        self,
        n: int,
        gap: int,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        offset: str = "shift",
    ) -> dict[str, Tensor]:
        """A right-padded :class:`PFTCollator` batch of ``n`` conversations with PFT ids of ``gap``; the
        ``ASST`` token is not a label (the answer tokens are)."""
        convs = self.sample(n, seed=seed, generator=generator)
        out = PFTCollator(gap=gap, offset=offset, pad_token_id=PAD)(convs)
        out["labels"] = out["labels"].masked_fill(out["input_ids"] == ASST, -100)
        return out


def _answer_loss_and_hits(model: nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Cross-entropy on the labelled tokens and per-row exact match of the teacher-forced argmax."""
    out = model(
        input_ids=batch["input_ids"],
        position_ids=batch["position_ids"],
        attention_mask=batch["attention_mask"],
    )
    logits = out.logits[:, :-1].float()
    tgt = batch["labels"][:, 1:]
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100
    )
    ok = (logits.argmax(-1) == tgt) | (tgt == -100)
    return loss, ok.all(-1)


def _check_batch(batch: Any) -> None:
    need = ("input_ids", "position_ids", "attention_mask", "labels")
    if not isinstance(batch, Mapping) or any(k not in batch for k in need):
        raise ValueError(
            f"batch must be a mapping with {need} (a PFTCollator output), got {type(batch).__name__}"
        )


def train_role_model(
    model: nn.Module,
    task: RoleTask,
    gap: int,
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int | None = 0,
    offset: str = "shift",
    callback: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Supervised fine-tuning of a causal LM on :class:`RoleTask` with PFT ids of ``gap`` (``0``: the
    standard ids): AdamW at ``lr``, cross-entropy on the answer tokens only. Returns the per-step losses."""
    _check_model(model)
    if not isinstance(task, RoleTask):
        raise TypeError(f"task must be a RoleTask, got {type(task).__name__}")
    check_int(gap, "gap", low=0)
    check_int(steps, "steps", low=1)
    check_int(batch_size, "batch_size", low=1)
    check_float(lr, "lr", low=0, low_open=True)
    g = make_generator(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for step in range(steps):
        b = task.batch(batch_size, gap, generator=g, offset=offset)
        if step == 0:
            check_position_range(model, b["position_ids"])
        loss, _ = _answer_loss_and_hits(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if callback is not None:
            callback(step, losses[-1])
    model.eval()
    return losses


@torch.no_grad()
def answer_accuracy(
    model: nn.Module,
    task: RoleTask,
    gap: int,
    n: int = 512,
    seed: int | None = 0,
    batch_size: int = 128,
    offset: str = "shift",
) -> float:
    """Exact-match answer accuracy on ``n`` fresh conversations of ``task``: every answer token is the
    argmax given the correct prefix (equal to greedy decoding's exact match)."""
    _check_model(model)
    if not isinstance(task, RoleTask):
        raise TypeError(f"task must be a RoleTask, got {type(task).__name__}")
    check_int(gap, "gap", low=0)
    check_int(n, "n", low=1)
    check_int(batch_size, "batch_size", low=1)
    g = make_generator(seed)
    was = model.training
    model.eval()
    hits = 0
    for start in range(0, n, batch_size):
        b = task.batch(min(batch_size, n - start), gap, generator=g, offset=offset)
        hits += int(_answer_loss_and_hits(model, b)[1].sum())
    model.train(was)
    return hits / n


SPLITS = ("id", "proximity", "task_type", "injection")


def shortcut_suite(
    model: nn.Module,
    task: RoleTask,
    gap: int,
    n: int = 512,
    seed: int | None = 0,
    min_op_index: int = 8,
    offset: str = "shift",
    splits: Sequence[str] = SPLITS,
) -> dict[str, float]:
    """The paper's shortcut diagnostics on a trained model: exact-match accuracy on ``"id"`` (``task``
    itself), ``"proximity"`` (:meth:`RoleTask.proximity_probe`: the instruction far from BOS),
    ``"task_type"`` (:meth:`RoleTask.task_type_probe`) and ``"injection"`` (every user block injected),
    for the names in ``splits``."""
    if isinstance(splits, str) or not splits or any(s not in SPLITS for s in splits):
        raise ValueError(f"splits must be a non-empty sequence of names from {SPLITS}, got {splits!r}")
    tasks = {
        "id": task,
        "proximity": task.proximity_probe(min_op_index),
        "task_type": task.task_type_probe(),
        "injection": task.injection_probe(),
    }
    return {s: answer_accuracy(model, tasks[s], gap, n, seed, offset=offset) for s in splits}


@torch.no_grad()
def role_probe(
    model: nn.Module,
    batch: Mapping[str, Tensor],
    layer: int,
    roles: tuple[int, int] = (SYSTEM, USER),
    test_fraction: float = 0.5,
    seed: int = 0,
) -> float:
    """Held-out accuracy of a logistic-regression probe telling ``roles[0]`` from ``roles[1]`` tokens in
    ``hidden_states[layer]`` (``0``: the embeddings) of ``model`` on ``batch`` (a :class:`PFTCollator`
    output with ``role_ids``); the split is by conversation (``test_fraction`` held out)."""
    _check_model(model)
    _check_batch(batch)
    if "role_ids" not in batch:
        raise ValueError("batch must hold role_ids (a PFTCollator output)")
    check_int(layer, "layer")
    check_float(test_fraction, "test_fraction", low=0, high=1, low_open=True, high_open=True)
    from sklearn.linear_model import LogisticRegression

    out = model(
        input_ids=batch["input_ids"], position_ids=batch["position_ids"],
        attention_mask=batch["attention_mask"], output_hidden_states=True,
    )  # fmt: skip
    hs = out.hidden_states
    if not -len(hs) <= layer < len(hs):
        raise ValueError(f"layer must be in [-{len(hs)}, {len(hs) - 1}], got {layer}")
    h = hs[layer].float()
    r = batch["role_ids"]
    B = r.shape[0]
    if B < 2:
        raise ValueError(f"batch must hold at least 2 conversations for a held-out split, got {B}")
    perm = np.random.default_rng(seed).permutation(B)
    n_test = min(B - 1, max(1, round(B * test_fraction)))
    split = {"test": perm[:n_test], "train": perm[n_test:]}
    data = {}
    for k, rows in split.items():
        sel = torch.zeros(B, dtype=torch.bool)
        sel[torch.as_tensor(rows)] = True
        m = sel[:, None] & ((r == roles[0]) | (r == roles[1])) & batch["attention_mask"].bool()
        data[k] = (h[m].numpy(), (r[m] == roles[1]).numpy().astype(int))
    Xtr, ytr = data["train"]
    if len(np.unique(ytr)) < 2:
        raise ValueError(f"batch must hold tokens of both roles {roles} in the probe's training split")
    clf = LogisticRegression(max_iter=2000).fit(Xtr, ytr)
    Xte, yte = data["test"]
    return float(clf.score(Xte, yte))
