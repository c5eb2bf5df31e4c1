"""Vision-Language Models Create Cross-Modal Task Representations — ICML 2025, P00: the toy two-modality model.

The small-scale reproduction's model and data (the method itself is :mod:`icml25.interpretability.task_vectors`):
:class:`ToyVLM`, a random-init ``transformers.LlamaForCausalLM`` whose "images" (scikit-learn 8x8 digits)
enter through a learned linear projection as ``inputs_embeds``; :class:`ToyTaskData`, its text / image /
instruction prompts over :data:`TOY_TASKS` with a *summary token* ``S`` after the demonstrations whose residual
is, by the 4-D attention mask of :func:`bottleneck_mask`, the only channel from the demonstrations to the query
(see the experiment module for why); and :func:`train_toy_vlm`, its training loop. Needs the ``[hf]`` extra.

Shapes: ``B`` prompts, ``T`` positions, ``d`` hidden size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.interpretability.common.llama import random_llama
from icml25.kernels.checks import check_float, check_int, describe
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["TOY_TASKS", "TOY_VOCAB", "ToyTaskData", "ToyVLM", "bottleneck_mask", "train_toy_vlm"]

_NOT_MODEL_KEYS = ("position", "labels", "entity")
"""Prompt-batch entries that are not model inputs."""


# ------------------------------------------------------------------------------------------ the tasks
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
        raise TypeError(f"valid must be a non-empty bool tensor [B, T], got {describe(valid)}")
    B, T = valid.shape
    for name, v in (("summary", summary), ("bos", bos)):
        if not isinstance(v, Tensor) or v.is_floating_point() or v.dtype == torch.bool or v.shape != (B,):
            raise TypeError(f"{name} must be an integer tensor [B] with B = {B}, got {describe(v)}")
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
        with isolated_rng(seed):  # the language model, then the projection, from one seeded stream
            self.language_model = random_llama(
                TOY_VOCAB, d_model, n_layers, n_heads, max_position_embeddings=64, seed=None,
                hidden_size_name="d_model", bos_token_id=BOS, eos_token_id=SEP, pad_token_id=PAD, attn_implementation="sdpa",
            )  # fmt: skip
            self.image_proj = nn.Linear(64, d_model)
        self.config = self.language_model.config

    def forward(
        self,
        input_ids: Tensor,
        pixel_values: Tensor | None = None,
        image_mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Any:
        if not isinstance(input_ids, Tensor) or input_ids.is_floating_point() or input_ids.ndim != 2:
            raise TypeError(f"input_ids must be an integer tensor [B, T], got {describe(input_ids)}")
        if input_ids.numel() == 0:
            raise ValueError(f"input_ids must hold at least one token, got shape {tuple(input_ids.shape)}")
        if pixel_values is not None:
            if not isinstance(pixel_values, Tensor) or pixel_values.shape != (*input_ids.shape, 64):
                raise ValueError(
                    f"pixel_values must have shape [B, T, 64] = {(*input_ids.shape, 64)}, got {describe(pixel_values)}"
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
        n_shots = check_int(n_shots, "n_shots", low=1, high=10)
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
        n = check_int(n, "n", low=1)
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
        check_int(v, name, low=1)
    check_float(lr, "lr", low=0.0, low_open=True)
    g = make_generator(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        batch = data.training_batch(batch_size, g)
        inputs = {k: v for k, v in batch.items() if k not in _NOT_MODEL_KEYS}
        logits = model(**inputs).logits[:, -1]
        loss = F.cross_entropy(logits, batch["labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if callback is not None:
            callback(step, losses[-1])
    model.eval()
    return losses
