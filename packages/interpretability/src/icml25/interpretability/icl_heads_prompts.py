"""Which Attention Heads Matter for In-Context Learning? — ICML 2025, P51: ICL tasks and prompts.

Yin & Steinhardt, "Which Attention Heads Matter for In-Context Learning?", ICML 2025 (arXiv 2502.14010;
official code ``kayoyin/icl-heads``).

A task is a list of ``(x, y)`` token-id pairs; a prompt is ``k`` demonstrations and a query laid out by an
:class:`ICLTemplate` (the paper's ``Q: x\\nA: y\\n\\n`` tokenised, or ``x y ;`` for the synthetic tasks).
:func:`sample_prompts` draws clean prompts and the label-shuffled (corrupted) prompts of the function-vector
score in :mod:`icml25.interpretability.icl_heads`, which re-exports every name here.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from icml25.kernels.checks import check_int
from icml25.kernels.rng import make_generator

__all__ = ["DEFAULT_TEMPLATE", "ICLPrompt", "ICLTask", "ICLTemplate", "build_prompt", "sample_prompts"]


def _as_tokens(v: Any, name: str) -> tuple[int, ...]:
    t = (v,) if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
    if not t or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in t):
        raise ValueError(f"{name} must be a token id or a non-empty sequence of token ids, got {v!r}")
    return t


@dataclass(frozen=True)
class ICLTask:
    """A task of ``(x, y)`` pairs of token ids (an int or a tuple of ints each)."""

    name: str
    pairs: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        pairs = tuple(
            (_as_tokens(x, f"{self.name}: x"), _as_tokens(y, f"{self.name}: y")) for x, y in self.pairs
        )
        if len(pairs) < 2:
            raise ValueError(f"pairs must hold at least 2 (x, y) pairs, got {len(pairs)}")
        object.__setattr__(self, "pairs", pairs)


@dataclass(frozen=True)
class ICLTemplate:
    """Prompt layout: ``[bos] (q_prefix x a_prefix y demo_sep)*k q_prefix x_q a_prefix``; the paper's
    ``Q: x\\nA: y\\n\\n`` tokenised, or ``x y ;`` for the synthetic tasks (the default: ``demo_sep=(1,)``)."""

    bos: int | None = 0
    q_prefix: tuple[int, ...] = ()
    a_prefix: tuple[int, ...] = ()
    demo_sep: tuple[int, ...] = (1,)


DEFAULT_TEMPLATE = ICLTemplate()
"""The synthetic tasks' layout ``[bos] (x y ;)*k x_q`` (frozen, so a safe argument default)."""


@dataclass(frozen=True)
class ICLPrompt:
    """One prompt: ``input_ids [T]``, the first answer token ``target`` and the full ``answer``."""

    input_ids: Tensor
    target: int
    answer: tuple[int, ...]
    task: str = ""


def build_prompt(demos: Sequence[tuple[Sequence[int], Sequence[int]]], query: tuple[Sequence[int], Sequence[int]],
                 template: ICLTemplate = DEFAULT_TEMPLATE, task: str = "") -> ICLPrompt:  # fmt: skip
    """The prompt of ``demos`` then ``query`` (its answer is the target). Warns when the query's ``x`` is
    among the demos (the task degenerates to copying)."""
    qx, qy = (tuple(query[0]), tuple(query[1]))
    if any(tuple(x) == qx for x, _ in demos):
        warnings.warn(f"query x={qx} is among the demos: the task degenerates to copying", stacklevel=2)
    ids: list[int] = [] if template.bos is None else [template.bos]
    for x, y in demos:
        ids += [*template.q_prefix, *x, *template.a_prefix, *y, *template.demo_sep]
    ids += [*template.q_prefix, *qx, *template.a_prefix]
    return ICLPrompt(torch.tensor(ids, dtype=torch.long), int(qy[0]), qy, task)


def sample_prompts(task: ICLTask, n_prompts: int, n_shots: int, template: ICLTemplate = DEFAULT_TEMPLATE,
                   seed: int = 0, shuffle_labels: bool = False, random_labels: bool = False) -> list[ICLPrompt]:  # fmt: skip
    """``n_prompts`` prompts of ``n_shots`` demos and a query, all ``n_shots + 1`` pairs distinct. Two ways
    to corrupt the demos (the corrupted prompts of the CIE): ``shuffle_labels`` permutes their labels among
    them (the paper's); ``random_labels`` replaces each label by one drawn uniformly from the task's other
    labels, so the set of labels shown no longer tells which task it is (with tasks that share one label
    vocabulary, such as bijections of one word set, a shuffled label set still does)."""
    if not isinstance(task, ICLTask):
        raise TypeError(f"task must be an ICLTask, got {type(task).__name__}")
    if shuffle_labels and random_labels:
        raise ValueError("shuffle_labels and random_labels are two corruptions: pass at most one")
    check_int(n_shots, "n_shots", low=2 if shuffle_labels else 1)
    if n_shots + 1 > len(task.pairs):
        raise ValueError(
            f"n_shots must be < the {len(task.pairs)} pairs of task {task.name!r}, got {n_shots}"
        )
    check_int(n_prompts, "n_prompts", low=1)
    labels = sorted({tuple(y) for _, y in task.pairs})
    if random_labels and len(labels) < 2:
        raise ValueError(
            f"random_labels needs a task with 2 or more distinct labels, {task.name!r} has {len(labels)}"
        )
    others = {lab: [other for other in labels if other != lab] for lab in labels}
    g = make_generator(seed)
    out = []
    for _ in range(n_prompts):
        idx = torch.randperm(len(task.pairs), generator=g)[: n_shots + 1].tolist()
        demos = [task.pairs[i] for i in idx[:-1]]
        if shuffle_labels:
            perm = torch.randperm(n_shots, generator=g).tolist()
            demos = [(demos[i][0], demos[p][1]) for i, p in enumerate(perm)]
        elif random_labels:
            draws = torch.randint(len(labels) - 1, (n_shots,), generator=g).tolist()
            demos = [(x, others[tuple(y)][d]) for (x, y), d in zip(demos, draws)]
        out.append(build_prompt(demos, task.pairs[idx[-1]], template, task.name))
    return out
