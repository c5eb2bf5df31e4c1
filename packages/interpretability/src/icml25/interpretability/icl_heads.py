"""Which Attention Heads Matter for In-Context Learning? — ICML 2025, P51: induction and FV head scores, ablations.

Yin & Steinhardt, "Which Attention Heads Matter for In-Context Learning?", ICML 2025 (arXiv 2502.14010;
official code ``kayoyin/icl-heads``). Every attention head is scored twice: the **induction score**
(attention from a repeated token to the token after its first occurrence, on ``[BOS, r_1..r_n, r_1..r_n]``)
and the **function-vector (FV) score** (Todd et al. 2024: the causal indirect effect of writing the head's
task-mean activation into a label-shuffled prompt's final token). The top heads of one score, optionally
excluding the top heads of the other, are then mean-ablated at the final token and few-shot ICL accuracy is
measured.

Head activation ``z[l, h]``: head ``h``'s ``d_head`` slice of the *input* of layer ``l``'s attention output
projection (``o_proj`` / ``c_proj`` / ``dense``), read and written by a forward pre-hook that splits the
heads; the modelling code is never forked. Supported families (:class:`HeadActivationSite`): Hugging Face
Llama / Mistral / Qwen2 (and :class:`TinyICLTransformer`, which has the same module paths), GPT-2 and
GPT-NeoX. Any model works whose ``forward(input_ids=..., output_attentions=...)`` returns ``.logits`` and
(for induction scores) ``.attentions``; load HF models with ``attn_implementation="eager"`` for the latter.

Shapes: ``L`` layers, ``H`` heads, ``d_head`` per head, ``B`` prompts, ``T`` positions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.interpretability.common.heads import (
    HeadActivationSite,
    as_head_site,
    head_hooks,
    random_heads,
    select_heads,
)
from icml25.interpretability.icl_heads_prompts import (
    DEFAULT_TEMPLATE,
    ICLPrompt,
    ICLTask,
    ICLTemplate,
    build_prompt,
    sample_prompts,
)
from icml25.interpretability.icl_heads_toy import (
    TinyICLTransformer,
    function_batch,
    make_synthetic_icl_tasks,
    repeat_batch,
    tiny_llama,
    train_synthetic_icl,
)
from icml25.kernels.checks import check_choice, check_int, check_tensor
from icml25.kernels.rng import make_generator

__all__ = [
    "ABLATION_MODES",
    "CORRUPTIONS",
    "FVScores",
    "HeadActivationSite",
    "ICLPrompt",
    "ICLTask",
    "ICLTemplate",
    "TinyICLTransformer",
    "ablate_heads",
    "build_prompt",
    "function_batch",
    "fv_scores",
    "icl_accuracy",
    "induction_score_from_attention",
    "induction_scores",
    "make_synthetic_icl_tasks",
    "mean_head_activations",
    "random_heads",
    "random_token_activations",
    "repeat_batch",
    "sample_prompts",
    "select_heads",
    "tiny_llama",
    "token_loss_difference",
    "train_synthetic_icl",
]


ABLATION_MODES = ("mean", "zero", "shuffled", "random_tokens_all_positions")
CORRUPTIONS = ("shuffle", "random_labels")
"""Corruptions of the demos: for the CIE (:func:`fv_scores`) and :func:`icl_accuracy` (see :func:`sample_prompts`)."""
INDUCTION_METHODS = ("mean_attention", "tl_abs")


def _logits(model: nn.Module, ids: Tensor) -> Tensor:
    return model(input_ids=ids).logits


# ------------------------------------------------------------------------------------------ induction
def induction_score_from_attention(
    attn: Tensor, n: int, method: str = "mean_attention", tokens: Tensor | None = None
) -> Tensor:
    """Induction score of attention patterns on ``[BOS, r_1..r_n, r_1..r_n]`` sequences.

    ``attn [..., B, T, T]`` with ``T = 2n + 1`` (rows sum to 1). ``mean_attention``: the mean over the batch
    and the second-half positions ``i`` of ``attn[i, i - n + 1]`` (Olsson et al.). ``tl_abs``: TransformerLens
    ``detect_head(..., "induction_head", error_measure="abs")``, ``1 - T * mean|attn - P|`` with ``P`` the
    induction pattern of ``tokens [B, T]`` (without its 3-decimal rounding), averaged over the batch.
    Returns ``[...]``.
    """
    if not isinstance(attn, Tensor) or attn.ndim < 3 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(
            f"attn must be a tensor [..., B, T, T], got {getattr(attn, 'shape', type(attn).__name__)}"
        )
    if not attn.is_floating_point():
        raise TypeError(f"attn must be a floating-point tensor, got {attn.dtype}")
    T = attn.shape[-1]
    check_int(n, "n", low=1)
    if T != 2 * n + 1 or attn.numel() == 0:
        raise ValueError(
            f"attn must be [..., B >= 1, 2n + 1, 2n + 1] = [..., B, {2 * n + 1}, {2 * n + 1}], got {tuple(attn.shape)}"
        )
    if not torch.isfinite(attn).all() or attn.min() < 0 or attn.max() > 1 + 1e-4:
        raise ValueError("attn must hold attention probabilities in [0, 1]")
    check_choice(method, "method", INDUCTION_METHODS)
    if method == "mean_attention":
        i = torch.arange(n + 1, 2 * n + 1)
        return attn[..., i, i - n + 1].mean(dim=(-1, -2))
    if tokens is None or tokens.shape != attn.shape[-3:-1]:
        raise ValueError(
            f"tokens must be [B, T] = {tuple(attn.shape[-3:-1])} for method='tl_abs', got {None if tokens is None else tuple(tokens.shape)}"
        )
    dup = (tokens[:, :, None] == tokens[:, None, :]).float()
    dup.diagonal(dim1=-2, dim2=-1).zero_()
    P = torch.zeros_like(dup)
    P[:, :, 1:] = dup[:, :, :-1]
    P = P.tril()
    return 1 - ((attn - P).abs().mean(dim=(-1, -2)) * T).mean(-1)


def _attentions(model: nn.Module, ids: Tensor) -> list[Tensor]:
    out = model(input_ids=ids, output_attentions=True)
    atts = getattr(out, "attentions", None)
    if not atts or any(a is None for a in atts):
        raise RuntimeError("model returned no attentions: load HF models with attn_implementation='eager'")
    return list(atts)


@torch.no_grad()
def induction_scores(
    model: nn.Module,
    n: int = 50,
    batch: int = 256,
    method: str = "mean_attention",
    seed: int = 0,
    tokens: Sequence[int] | None = None,
    bos_token_id: int | None = None,
    chunk: int = 64,
) -> Tensor:
    """Induction score ``[L, H]`` of every head on ``batch`` sequences ``[BOS, r_1..r_n, r_1..r_n]``,
    ``r`` uniform over ``tokens`` (default: the whole vocabulary), see :func:`induction_score_from_attention`."""
    site = as_head_site(model)
    for name, v in (("n", n), ("batch", batch), ("chunk", chunk)):
        check_int(v, name, low=1)
    check_choice(method, "method", INDUCTION_METHODS)
    cfg = site.model.config
    pool = torch.arange(cfg.vocab_size) if tokens is None else torch.as_tensor(list(tokens), dtype=torch.long)
    if pool.numel() < 1 or pool.min() < 0 or pool.max() >= cfg.vocab_size:
        raise ValueError(
            f"tokens must be non-empty ids in [0, {cfg.vocab_size}), got {list(pool.tolist())[:8]}..."
        )
    bos = bos_token_id if bos_token_id is not None else (getattr(cfg, "bos_token_id", None) or 0)
    g = make_generator(seed)
    r = pool[torch.randint(pool.numel(), (batch, n), generator=g)]
    ids = torch.cat([torch.full((batch, 1), int(bos)), r, r], 1)
    dev = next(site.model.parameters()).device
    total = torch.zeros(site.n_layers, site.n_heads)
    for s in range(0, batch, chunk):
        part = ids[s : s + chunk].to(dev)
        atts = _attentions(site.model, part)
        for layer, a in enumerate(atts):
            sc = induction_score_from_attention(a.float().transpose(0, 1).cpu(), n, method, part.cpu())
            total[layer] += sc * part.shape[0]
    return total / batch


def _by_length(prompts: Sequence[ICLPrompt]) -> list[tuple[Tensor, Tensor, list[int]]]:
    """Prompts grouped by length: ``[(ids [B, T], targets [B], original indices)]``."""
    if not prompts or not all(isinstance(p, ICLPrompt) for p in prompts):
        raise ValueError("prompts must be a non-empty list of ICLPrompt")
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p.input_ids.numel(), []).append(i)
    return [(torch.stack([prompts[i].input_ids for i in idx]), torch.tensor([prompts[i].target for i in idx]), idx)
            for idx in groups.values()]  # fmt: skip


# ------------------------------------------------------------------------------------------ activations
@torch.no_grad()
def mean_head_activations(model: nn.Module, prompts: Sequence[ICLPrompt], position: int = -1) -> Tensor:
    """Mean over ``prompts`` of every head's activation at ``position``: ``[L, H, d_head]``."""
    site = as_head_site(model)
    position = check_int(position, "position")
    total = torch.zeros(site.n_layers, site.n_heads, site.d_head)
    count = 0
    dev = next(site.model.parameters()).device
    for ids, _, _ in _by_length(prompts):
        store: dict[int, Tensor] = {}

        def grab(layer: int, store: dict[int, Tensor] = store) -> Callable[[Tensor], None]:
            def fn(z: Tensor) -> None:
                store[layer] = z[:, position].float().sum(0).cpu()

            return fn

        with head_hooks(site, {layer: grab(layer) for layer in range(site.n_layers)}):
            _logits(site.model, ids.to(dev))
        total += torch.stack([store[layer] for layer in range(site.n_layers)])
        count += ids.shape[0]
    return total / count


@torch.no_grad()
def random_token_activations(model: nn.Module, length: int, tokens: Sequence[int] | None = None, seed: int = 0,
                             bos_token_id: int | None = None) -> Tensor:  # fmt: skip
    """Every head's activation at every position of one uniform random-token sequence (after a BOS):
    ``[length, L, H, d_head]``, the replacement of ``mode="random_tokens_all_positions"``."""
    site = as_head_site(model)
    check_int(length, "length", low=1)
    cfg = site.model.config
    pool = torch.arange(cfg.vocab_size) if tokens is None else torch.as_tensor(list(tokens), dtype=torch.long)
    bos = bos_token_id if bos_token_id is not None else (getattr(cfg, "bos_token_id", None) or 0)
    g = make_generator(seed)
    ids = torch.cat(
        [torch.tensor([int(bos)]), pool[torch.randint(pool.numel(), (length - 1,), generator=g)]]
    )[None]
    store: dict[int, Tensor] = {}

    def grab(layer: int) -> Callable[[Tensor], None]:
        def fn(z: Tensor) -> None:
            store[layer] = z[0].float().cpu()

        return fn

    with head_hooks(site, {layer: grab(layer) for layer in range(site.n_layers)}):
        _logits(site.model, ids.to(next(site.model.parameters()).device))
    return torch.stack([store[layer] for layer in range(site.n_layers)], 1)


# ------------------------------------------------------------------------------------------ FV scores
@dataclass
class FVScores:
    """``scores [L, H]`` (mean CIE over tasks), ``per_task`` CIE ``{task: [L, H]}``, ``mean_activations``
    ``[L, H, d_head]`` (the mean over the scoring tasks' clean prompts, used by :func:`ablate_heads`) and
    ``per_task_mean`` ``{task: [L, H, d_head]}``."""

    scores: Tensor
    per_task: dict[str, Tensor] = field(default_factory=dict)
    mean_activations: Tensor | None = None
    per_task_mean: dict[str, Tensor] = field(default_factory=dict)


def _target_prob(logits: Tensor, targets: Tensor) -> Tensor:
    return logits[:, -1].float().softmax(-1).gather(1, targets[:, None])[:, 0]


@torch.no_grad()
def _cie(site: HeadActivationSite, prompts: Sequence[ICLPrompt], mean: Tensor, batch_heads: bool) -> Tensor:
    """Mean over ``prompts`` of ``P(target | head patched with mean) - P(target)``: ``[L, H]``."""
    L, H = site.shape
    dev = next(site.model.parameters()).device
    out = torch.zeros(L, H)
    for ids, tgt, _ in _by_length(prompts):
        ids, tgt = ids.to(dev), tgt.to(dev)
        B = ids.shape[0]
        base = _target_prob(_logits(site.model, ids), tgt).cpu()
        for layer in range(L):
            if batch_heads:
                m = mean[layer].to(dev)

                def patch_all(z: Tensor, m: Tensor = m, B: int = B) -> Tensor:
                    z = z.clone()
                    for h in range(H):
                        z[h * B : (h + 1) * B, -1, h] = m[h]
                    return z

                with head_hooks(site, {layer: patch_all}):
                    p = _target_prob(_logits(site.model, ids.repeat(H, 1)), tgt.repeat(H)).cpu()
                out[layer] += (p.view(H, B) - base).sum(1)
            else:
                for h in range(H):
                    v = mean[layer, h].to(dev)

                    def patch_one(z: Tensor, h: int = h, v: Tensor = v) -> Tensor:
                        z = z.clone()
                        z[:, -1, h] = v
                        return z

                    with head_hooks(site, {layer: patch_one}):
                        p = _target_prob(_logits(site.model, ids), tgt).cpu()
                    out[layer, h] += (p - base).sum()
    return out / len(prompts)


def fv_scores(
    model: nn.Module,
    tasks: Mapping[str, ICLTask],
    template: ICLTemplate = DEFAULT_TEMPLATE,
    n_shots: int = 10,
    n_prompts: int = 100,
    seed: int = 0,
    batch_heads: bool = True,
    corruption: str = "shuffle",
    clean_means: Mapping[str, Tensor] | None = None,
) -> FVScores:
    """FV score of every head: the causal indirect effect (probability after softmax of the query's first
    answer token) of writing the head's task-mean final-token activation (over ``n_prompts`` clean prompts)
    into ``n_prompts`` corrupted prompts, head by head, averaged over prompts and ``tasks``.
    ``batch_heads`` patches all heads of a layer in one forward (one prompt copy per head). ``corruption``:
    ``"shuffle"`` (the paper's: the demos' labels permuted among them) or ``"random_labels"`` (each label
    replaced by another of the task's labels; see :func:`sample_prompts`). ``clean_means``: the
    ``per_task_mean`` of an earlier call on the same model, tasks, sizes and seed (for example with the other
    corruption), reused instead of measured again."""
    site = as_head_site(model)
    if not isinstance(tasks, Mapping) or not tasks or not all(isinstance(t, ICLTask) for t in tasks.values()):
        raise ValueError("tasks must be a non-empty {name: ICLTask} mapping")
    check_int(n_shots, "n_shots", low=2)  # the demos' labels are shuffled: at least 2 demos
    for t in tasks.values():
        if n_shots + 1 > len(t.pairs):
            raise ValueError(f"n_shots must be < the {len(t.pairs)} pairs of task {t.name!r}, got {n_shots}")
    check_int(n_prompts, "n_prompts", low=1)
    check_choice(corruption, "corruption", CORRUPTIONS)
    if clean_means is not None:
        if not isinstance(clean_means, Mapping) or set(clean_means) != set(tasks):
            raise ValueError(
                f"clean_means must map the same task names as tasks ({sorted(tasks)}), got "
                f"{sorted(clean_means) if isinstance(clean_means, Mapping) else type(clean_means).__name__}"
            )
        for name in tasks:
            check_tensor(
                clean_means[name], f"clean_means[{name!r}]", shape=(site.n_layers, site.n_heads, site.d_head)
            )
    per_task, per_mean = {}, {}
    for k, (name, task) in enumerate(tasks.items()):
        s = seed * 1_000_003 + 2 * k
        if clean_means is None:
            mean = mean_head_activations(site, sample_prompts(task, n_prompts, n_shots, template, seed=s))
        else:
            mean = clean_means[name]
        corrupt = sample_prompts(
            task, n_prompts, n_shots, template, seed=s + 1, shuffle_labels=corruption == "shuffle",
            random_labels=corruption == "random_labels",
        )  # fmt: skip
        per_task[name] = _cie(site, corrupt, mean, batch_heads)
        per_mean[name] = mean
    scores = torch.stack(list(per_task.values())).mean(0)
    return FVScores(scores, per_task, torch.stack(list(per_mean.values())).mean(0), per_mean)


# ------------------------------------------------------------------------------------------ ablation
@contextlib.contextmanager
def ablate_heads(
    model: nn.Module,
    heads: Sequence[tuple[int, int]],
    mean_acts: Tensor | None = None,
    position: str | int = "last",
    mode: str = "mean",
    seed: int = 0,
) -> Iterator[HeadActivationSite]:
    """Within the block, replace the activation of each ``(layer, head)`` in ``heads``.

    ``mode``: ``mean`` (``mean_acts [L, H, d_head]``), ``zero``, ``shuffled`` (``mean_acts`` with its
    ``L * H`` head vectors permuted by ``seed``: a sanity baseline) at ``position`` (``"last"``, an int
    index, or ``"all"``); ``random_tokens_all_positions``: ``mean_acts`` is ``[T, L, H, d_head]`` from
    :func:`random_token_activations` and replaces every position ``t < T`` (the official token-loss
    ablation, here on the head output rather than its values). Hooks are removed on exit.
    """
    site = as_head_site(model)
    L, H, dh = site.n_layers, site.n_heads, site.d_head
    check_choice(mode, "mode", ABLATION_MODES)
    if not isinstance(heads, Sequence) or not heads:
        raise ValueError("heads must be a non-empty list of (layer, head) pairs")
    for lh in heads:
        if not (isinstance(lh, tuple) and len(lh) == 2 and 0 <= lh[0] < L and 0 <= lh[1] < H):
            raise ValueError(f"heads must be (layer, head) pairs in [0, {L}) x [0, {H}), got {lh!r}")
    if not (position in ("last", "all") or (isinstance(position, int) and not isinstance(position, bool))):
        raise ValueError(f"position must be 'last', 'all' or an int, got {position!r}")
    if mode in ("mean", "shuffled"):
        rep = check_tensor(mean_acts, "mean_acts", shape=(L, H, dh))  # [L, H, d_head]
        if mode == "shuffled":
            perm = torch.randperm(L * H, generator=make_generator(seed))
            rep = rep.reshape(L * H, dh)[perm].reshape(L, H, dh)
    elif mode == "random_tokens_all_positions":
        rep = check_tensor(mean_acts, "mean_acts", shape=(None, L, H, dh))  # [T, L, H, d_head]
    else:
        rep = torch.zeros(L, H, dh)
    by_layer: dict[int, list[int]] = {}
    for layer, h in heads:
        by_layer.setdefault(layer, []).append(h)

    def make(layer: int, hs: list[int]) -> Callable[[Tensor], Tensor]:
        def fn(z: Tensor) -> Tensor:
            z = z.clone()
            if mode == "random_tokens_all_positions":
                T = min(z.shape[1], rep.shape[0])
                for h in hs:
                    z[:, :T, h] = rep[:T, layer, h].to(z)
            else:
                sl = slice(None) if position == "all" else (-1 if position == "last" else position)
                for h in hs:
                    z[:, sl, h] = rep[layer, h].to(z)
            return z

        return fn

    with head_hooks(site, {layer: make(layer, hs) for layer, hs in by_layer.items()}):
        yield site


# ------------------------------------------------------------------------------------------ metrics
@torch.no_grad()
def icl_accuracy(model: nn.Module, task: ICLTask, template: ICLTemplate = DEFAULT_TEMPLATE, n_shots: int = 10,
                 n_prompts: int = 100, seed: int = 0, corruption: str | None = None) -> float:  # fmt: skip
    """Few-shot accuracy: the fraction of ``n_prompts`` prompts whose greedy next token (one prefill
    forward, so a ``"last"`` ablation touches the prompt's final token only) is the answer's first token.
    Wrap in :func:`ablate_heads` to measure an ablation. ``corruption`` (``"shuffle"`` or
    ``"random_labels"``, see :func:`sample_prompts`) measures how much of the task corrupted prompts still
    carry; ``None`` (default) uses clean prompts."""
    if not isinstance(task, ICLTask):
        raise TypeError(f"task must be an ICLTask, got {type(task).__name__}")
    if corruption is not None:
        check_choice(corruption, "corruption", CORRUPTIONS)
    site = as_head_site(model)
    prompts = sample_prompts(
        task, n_prompts, n_shots, template, seed=seed, shuffle_labels=corruption == "shuffle",
        random_labels=corruption == "random_labels",
    )  # fmt: skip
    dev = next(site.model.parameters()).device
    correct = 0
    for ids, tgt, _ in _by_length(prompts):
        correct += int((_logits(site.model, ids.to(dev))[:, -1].argmax(-1).cpu() == tgt).sum())
    return correct / len(prompts)


@torch.no_grad()
def token_loss_difference(model: nn.Module, seqs: Tensor, early: int = 50, late: int = 500) -> float:
    """Olsson's token-loss difference: mean cross-entropy of token ``early`` minus that of token ``late``
    (0-based positions of ``seqs [B, T]``, ``T > late``)."""
    site = as_head_site(model)
    if not isinstance(seqs, Tensor) or seqs.ndim != 2 or seqs.dtype not in (torch.long, torch.int32):
        raise ValueError(
            f"seqs must be an integer tensor [B, T], got {getattr(seqs, 'shape', type(seqs).__name__)} {getattr(seqs, 'dtype', '')}"
        )
    if not (isinstance(early, int) and isinstance(late, int) and 1 <= early < late):
        raise ValueError(f"early and late must be ints with 1 <= early < late, got {early!r}, {late!r}")
    if seqs.shape[0] < 1 or seqs.shape[1] <= late:
        raise ValueError(
            f"seqs must hold >= 1 sequence of more than late={late} tokens, got shape {tuple(seqs.shape)}"
        )
    if seqs.min() < 0 or seqs.max() >= site.model.config.vocab_size:
        raise ValueError(f"seqs must hold token ids in [0, {site.model.config.vocab_size})")
    seqs = seqs.long()
    logits = _logits(model, seqs.to(next(model.parameters()).device)).float()
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), seqs[:, 1:].to(logits.device), reduction="none")
    return float(ce[:, early - 1].mean() - ce[:, late - 1].mean())
