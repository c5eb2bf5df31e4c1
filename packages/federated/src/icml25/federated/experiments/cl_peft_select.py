"""Exploiting Presentative Feature Distributions for Parameter-Efficient Continual Learning of Large Language Models — ICML 2025, P14: small-scale reproduction.

Cheng et al., ICML 2025 (official code "Online-CL-LLMs", public copy ``donggcao18/Online-CL-LLMs``).
Claim: routing each instance to the per-task LoRA block whose presentative feature distribution is
closest, with no task id at test time and no replay, almost matches oracle task-id routing and clearly
beats sequential fine-tuning of one shared LoRA.

Our CPU-scale setting (:data:`FULL`; :class:`Setting` gives each knob's paper value next to ours): a tiny
Llama-style decoder (RMSNorm attention input, q/k/v/o projections, SwiGLU MLP) is pre-trained on a generic
task family (20 random token-polarity tables over a 40-token pool, each announced by a table-id token,
answer YES/NO = sign of the summed polarities), then frozen. The continual tasks are 5 *new* polarity
tables without id token, each over its own 10-token sub-vocabulary; consecutive tasks share 3 tokens with
flipped polarity, so one shared LoRA interferes. Learners: SeqLoRA (one LoRA trained on the tasks in
order), ours (q/v LoRA r 8, α 32, L2, τ 1, top-1, per-layer routing), the oracle (per-task LoRA selected
by the true task id; the information-leakage upper bound) and uniform averaging of the per-task LoRAs.
Every learner's LoRA is trained with Adam and the gradient clipped at total norm 1.0 (the official Hugging
Face Trainer default; ``Setting.clip_norm=None`` turns it off). The full run adds an ungated arm, ours with
the official successor option at ``(0,)`` (every layer reuses layer 0's routing weights), reported as
``successor_*`` metrics. :data:`QUICK` has 2 tasks, 2 epochs, a smaller base, and no successor arm.

Pass rule (:func:`checks`): ours AP ≥ oracle AP − 5 points, ours AP ≥ SeqLoRA AP + 15 points (quick:
first task's drop after the second task ≤ 10 points under ours, and ours ≥ SeqLoRA), uniform AP ≤ ours AP
− 10 points (full), routing accuracy averaged over layers ≥ 0.9 (quick 0.8) and no layer-task pair below
0.5. Pre-condition (:func:`preconditions`): the oracle reaches ≥ 0.85 (quick 0.8) on every task, else the
run is INCONCLUSIVE (a chance-level oracle makes "ours ≥ oracle − 5" vacuous).

Run: ``python -m icml25.federated.experiments.cl_peft_select [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml25.federated.cl_peft_select import PresentativeCL
from icml25.kernels.experiment import (
    Check,
    Report,
    experiment_main,
    new_figure,
    progress,
    save_figure,
    seed_everything,
    threshold_text,
    torch_threads,
)
from icml25.kernels.optim import Adam
from icml25.kernels.rng import isolated_rng, make_generator

PAPER = "P14"
CLAIM = (
    "Routing each instance to the per-task LoRA whose presentative feature distribution is closest (no task "
    "id, no replay) nearly matches oracle task-id routing and clearly beats sequential fine-tuning of one LoRA."
)

POOL = 40
YES, NO, QUERY, PAD = 40, 41, 42, 43
TABLE0 = 44
N_TABLES = 20
VOCAB = TABLE0 + N_TABLES


@dataclass(frozen=True)
class Setting:
    """One reproduction scale."""

    n_tasks: int
    """Continual tasks (paper: 15 SuperNI / Long-Sequence tasks; ours 5 synthetic polarity tasks, quick 2)."""
    epochs: int
    """Epochs per task (paper 50 with the best checkpoint by ROUGE-L; ours 4, quick 2). The plan chooses the
    budget by the oracle pre-condition: at 3 epochs the oracle's weakest task was 0.857 on an AMD EPYC (the
    run recorded there) but 0.847 on an Intel Xeon (the two CPUs' float paths drift apart over training),
    under the 0.85 bar; at 4 epochs it is 0.883 on the Intel Xeon (seed 0, measured before this change)."""
    n_train: int = 600
    """Training examples per task (paper: SuperNI's 1,000 per task; ours 600)."""
    n_test: int = 300
    """Test examples per task (ours 300)."""
    hidden: int = 128
    """Base width (paper LLaMA-2-7B, 4096; ours 128, quick 64)."""
    layers: int = 4
    """Decoder layers (paper 32; ours 4, quick 2)."""
    heads: int = 4
    """Attention heads (paper 32; ours 4)."""
    pretrain_steps: int = 600
    """Generic pre-training steps of the frozen base at batch 64 (paper: a pre-trained chat LLM; ours 600, quick 150)."""
    r: int = 8
    """LoRA rank (paper 4; ours 8, for the small base)."""
    alpha: float = 32.0
    """LoRA α (paper 32, as here)."""
    lr: float = 3e-3
    """AdamW learning rate of the LoRA (paper 5e-5 constant over 50 epochs; ours 3e-3)."""
    pretrain_lr: float = 2e-3
    """Peak Adam learning rate of the base's pre-training, 10% linear warm-up then cosine decay (paper: a
    pretrained T5 / LLaMA base, no pre-training here; ours 2e-3)."""
    batch_size: int = 16
    """Batch size (paper 1 × 4 accumulation × 8 GPUs = 32; ours 16)."""
    min_oracle: float = 0.85
    """Pre-condition: the oracle's accuracy on every task, at least (ours 0.85, quick 0.8)."""
    min_routing: float = 0.9
    """Routing accuracy averaged over wrapped layers, at least (ours 0.9, quick 0.8)."""
    clip_norm: float | None = 1.0
    """Gradient clipping of every learner's LoRA training, total L2 norm (official 1.0: the Hugging Face
    Trainer's max_grad_norm default, DeepSpeed gradient_clipping "auto"; ours before issue 85: none, still
    reachable as None)."""
    successor_arm: tuple[int, ...] | None = (0,)
    """The official successor list of an extra, ungated arm: ours with only these layers routing on their
    own feature, the rest reusing the previous layer's weights (official default: off, every layer routes;
    ours: the gated learner routes per layer as there, and the full run adds this arm with (0,); quick: None,
    not run, for the quick budget)."""


FULL = Setting(n_tasks=5, epochs=4)
# Quick: 2 epochs, not 1: with 1 epoch the oracle reached only 0.81 on the first task, at the
# edge of its 0.8 pre-condition (measured once while sizing the quick run; the thresholds are unchanged).
QUICK = Setting(
    n_tasks=2,
    epochs=2,
    n_train=400,
    n_test=200,
    hidden=64,
    layers=2,
    pretrain_steps=150,
    min_oracle=0.8,
    min_routing=0.8,
    successor_arm=None,
)

ORACLE_MARGIN = 5.0
"""Ours AP, at most this many points below the oracle's (our CPU-scale margin, set before running)."""
SEQ_MARGIN = 15.0
"""Ours AP, at least this many points above SeqLoRA's (full; our CPU-scale margin, set before running)."""
UNIFORM_MARGIN = 10.0
"""Uniform-averaging AP, at least this many points below ours (full; set before running)."""
QUICK_SEQ_MARGIN = 5.0
"""Quick: ours AP at least this many points above SeqLoRA's (a stated smaller margin on 2 tasks)."""
MAX_DROP = 10.0
"""Quick: the first task's accuracy under ours drops by at most this many points after the second task."""
MIN_PAIR_ROUTING = 0.5
"""No (wrapped layer, task) pair's routing accuracy below this (a per-layer collapse guard)."""


def preconditions(setting: Setting) -> list[Check]:
    """When the comparison can show the effect at all: the oracle fits every task."""
    return [
        Check(
            f"oracle accuracy >= {setting.min_oracle:g} on every task",
            lambda m: m["oracle_min_task_acc"] >= setting.min_oracle,
        )
    ]


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (accuracies in points, routing accuracies as fractions)."""
    quick = setting.n_tasks <= 2
    out = [
        Check(
            f"ours AP >= oracle AP - {ORACLE_MARGIN:g}",
            lambda m: m["ours_ap"] >= m["oracle_ap"] - ORACLE_MARGIN,
        ),
    ]
    if quick:
        out += [
            Check(
                f"ours AP >= SeqLoRA AP + {QUICK_SEQ_MARGIN:g}",
                lambda m: m["ours_ap"] >= m["baseline_seqlora_ap"] + QUICK_SEQ_MARGIN,
            ),
            Check(f"ours first-task drop <= {MAX_DROP:g}", lambda m: m["ours_first_task_drop"] <= MAX_DROP),
        ]
    else:
        out += [
            Check(
                f"ours AP >= SeqLoRA AP + {SEQ_MARGIN:g}",
                lambda m: m["ours_ap"] >= m["baseline_seqlora_ap"] + SEQ_MARGIN,
            ),
            Check(
                f"uniform AP <= ours AP - {UNIFORM_MARGIN:g}",
                lambda m: m["uniform_ap"] <= m["ours_ap"] - UNIFORM_MARGIN,
            ),
        ]
    out += [
        Check(
            f"mean routing accuracy >= {setting.min_routing:g}",
            lambda m: m["routing_acc_mean"] >= setting.min_routing,
        ),
        Check(
            f"min layer-task routing accuracy >= {MIN_PAIR_ROUTING:g}",
            lambda m: m["routing_acc_min_pair"] >= MIN_PAIR_ROUTING,
        ),
    ]
    return out


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it."""
    return threshold_text(checks(QUICK if quick else FULL))


# ------------------------------------------------------------------------------------------- model
class RMSNorm(nn.Module):
    """Llama's RMSNorm over the last axis."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Attention(nn.Module):
    """Causal multi-head attention with Llama's module names (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(h)), split(self.k_proj(h)), split(self.v_proj(h))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm decoder layer: ``input_layernorm`` → attention, ``post_attention_layernorm`` → SwiGLU."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.self_attn = Attention(d, heads)
        self.gate_proj, self.up_proj = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False)
        self.down_proj = nn.Linear(2 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyCausalLM(nn.Module):
    """A Llama-style decoder: ``(B, T)`` token ids -> ``(B, T, vocab)`` logits (learned positions)."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, max_len: int = 32) -> None:
        super().__init__()
        self.embed_tokens, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.layers = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.lm_head = RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


# -------------------------------------------------------------------------------------------- data
@dataclass
class Batch:
    """Right-padded sequences ``ids (N, T)``, prompt mask ``(N, T)``, answer position ``(N,)``, label ``(N,)`` (1 = YES)."""

    ids: torch.Tensor
    mask: torch.Tensor
    last: torch.Tensor
    label: torch.Tensor

    def __len__(self) -> int:
        return len(self.label)

    def take(self, idx: torch.Tensor) -> Batch:
        return Batch(self.ids[idx], self.mask[idx], self.last[idx], self.label[idx])


def polarity_sequences(
    polarity: np.ndarray,
    vocab: np.ndarray,
    n: int,
    rng: np.random.Generator,
    table_tokens: np.ndarray | None = None,
) -> Batch:
    """``n`` sequences of odd length 13–19 drawn from ``vocab``, an optional leading table-id token per row
    (``table_tokens (n,)``; ``polarity`` then has one row per table), then QUERY.

    The label is the sign of the summed polarity (odd length: no ties)."""
    length = rng.choice(np.array([13, 15, 17, 19]), size=n)
    toks = rng.choice(vocab, size=(n, 19))
    valid = np.arange(19)[None, :] < length[:, None]
    pol = (
        polarity[toks] if polarity.ndim == 1 else np.take_along_axis(polarity[table_tokens - TABLE0], toks, 1)
    )
    label = ((pol * valid).sum(1) > 0).astype(np.int64)
    body = np.where(valid, toks, PAD)
    off = 0 if table_tokens is None else 1
    ids = np.full((n, 19 + off + 1), PAD, dtype=np.int64)
    if table_tokens is not None:
        ids[:, 0] = table_tokens
    ids[:, off : off + 19] = body
    last = length + off
    ids[np.arange(n), last] = QUERY
    mask = np.arange(ids.shape[1])[None, :] <= last[:, None]
    return Batch(
        torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(last), torch.from_numpy(label)
    )


def make_tasks(n_tasks: int, n_train: int, n_test: int, seed: int) -> list[tuple[Batch, Batch]]:
    """Continual tasks: sub-vocabulary ``pool[7t : 7t+10]`` (3 tokens shared with the next task, polarity
    flipped there), a random ±1 polarity table with at least 3 tokens of each sign, no table-id token.

    A table with 8 or more tokens of one sign is drawn again: its answer is (nearly) constant (99–100 % one
    class), so every learner scores the same and the task tests nothing (quick seed 3 drew two such
    tables: ours, oracle and SeqLoRA all 97.75). Tables with 3 to 7 of each sign keep their first draw, so
    the other seeds' data are unchanged."""
    rng = np.random.default_rng(seed + 1)
    tasks, prev = [], None
    for t in range(n_tasks):
        vocab = np.arange(7 * t, 7 * t + 10)
        while True:
            pol = np.zeros(POOL)
            pol[vocab] = rng.choice([-1.0, 1.0], size=10)
            if prev is not None:
                shared = vocab[:3]
                pol[shared] = -prev[shared]
            if 3 <= int((pol[vocab] > 0).sum()) <= 7:
                break
        prev = pol
        tasks.append(
            (polarity_sequences(pol, vocab, n_train, rng), polarity_sequences(pol, vocab, n_test, rng))
        )
    return tasks


def answer_logits(logits: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """``(N, T, V)`` logits -> ``(N, 2)`` logits of (NO, YES) at the answer position."""
    at = logits[torch.arange(len(last)), last]
    return at[:, [NO, YES]]


def pretrain_base(setting: Setting, seed: int) -> TinyCausalLM:
    """Train the base on 20 generic polarity tables (id token announces the table), then freeze it."""
    with isolated_rng(seed):
        model = TinyCausalLM(VOCAB, setting.hidden, setting.layers, setting.heads)
    rng = np.random.default_rng(seed + 2)
    tables = rng.choice([-1.0, 1.0], size=(N_TABLES, POOL))
    # Adam (= AdamW at weight decay 0) from icml25.kernels.optim: torch.optim's first step imports
    # torch._dynamo (seconds of CPU); 10% linear warm-up, cosine decay.
    opt = Adam(model.parameters(), lr=setting.pretrain_lr)
    warm = max(1, setting.pretrain_steps // 10)
    data = polarity_sequences(
        tables,
        np.arange(POOL),
        64 * setting.pretrain_steps,
        rng,
        TABLE0 + rng.integers(N_TABLES, size=64 * setting.pretrain_steps),
    )
    for step in progress(range(setting.pretrain_steps), desc="pretrain base"):
        b = data.take(torch.arange(64 * step, 64 * (step + 1)))
        loss = F.cross_entropy(answer_logits(model(b.ids), b.last), b.label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        frac = (step + 1 - warm) / max(1, setting.pretrain_steps - warm)
        opt.lr = setting.pretrain_lr * (
            (step + 2) / warm if step + 1 < warm else 0.5 * (1 + math.cos(math.pi * frac))
        )
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# ---------------------------------------------------------------------------------------- learners
@torch.no_grad()
def evaluate(
    cl: PresentativeCL, data: Batch, route: torch.Tensor | None = None
) -> tuple[float, dict[str, torch.Tensor]]:
    """Accuracy (points) and each wrapped layer's top-1 choices ``(N,)`` on ``data`` (eval mode)."""
    cl.eval()
    correct, choices = 0, {}
    for start in range(0, len(data), 256):
        idx = torch.arange(start, min(start + 256, len(data)))
        b = data.take(idx)
        r = None if route is None else route[idx]
        logits = cl(b.ids, prompt_mask=b.mask, route=r)
        correct += int((answer_logits(logits, b.last).argmax(1) == b.label).sum())
        for name, w in cl.last_routing().items():
            choices.setdefault(name, []).append(w.argmax(1))
    return 100.0 * correct / len(data), {k: torch.cat(v) for k, v in choices.items()}


def train_task(
    cl: PresentativeCL, data: Batch, setting: Setting, seed: int, oracle_index: int | None
) -> float:
    """Train the current task's LoRA; returns the share of training instances whose last-layer top-1 is the
    current task (ours) — 1.0 when the route is forced."""
    params = cl.trainable_parameters()
    opt = Adam(params, lr=setting.lr)  # AdamW at weight decay 0
    g = make_generator(seed)
    cl.train()
    own, seen = 0, 0
    last_layer = cl.layer_names[-1]
    for _ in range(setting.epochs):
        perm = torch.randperm(len(data), generator=g)
        for start in range(0, len(data), setting.batch_size):
            b = data.take(perm[start : start + setting.batch_size])
            route = None if oracle_index is None else torch.full((len(b),), oracle_index, dtype=torch.long)
            logits = cl(b.ids, prompt_mask=b.mask, route=route)
            loss = F.cross_entropy(answer_logits(logits, b.last), b.label)
            opt.zero_grad()
            if loss.requires_grad:
                loss.backward()
                if setting.clip_norm is not None:  # the official Trainer clips the total norm
                    torch.nn.utils.clip_grad_norm_(params, setting.clip_norm)
                opt.step()
            w = cl.last_routing()[last_layer]
            own += int((w.argmax(1) == len(cl.tasks) - 1).sum())
            seen += len(b)
    return own / max(seen, 1)


def run_learner(
    kind: str,
    base: TinyCausalLM,
    tasks: list[tuple[Batch, Batch]],
    setting: Setting,
    seed: int,
    top_k: int = 1,
    successor: tuple[int, ...] | None = None,
) -> dict[str, object]:
    """Train one learner over the task sequence; returns its accuracy matrix ``acc[i][j]`` (after task i, on
    task j, points), final per-task accuracies, routing matrices and train-routing shares.

    ``kind``: ``"ours"`` (feature routing), ``"oracle"`` (per-task LoRA, true task id; also yields
    ``"uniform"`` accuracies from the same blocks), ``"seqlora"`` (one shared LoRA) or ``"random"`` (per-task
    LoRA, routing by a random task id: the broken variant). ``successor``: the official successor list
    (:class:`~icml25.federated.cl_peft_select.PresentativeCL`), for ``"ours"``."""
    import copy

    cl = PresentativeCL(
        copy.deepcopy(base), r=setting.r, alpha=setting.alpha, top_k=top_k, seed=seed, successor=successor
    )
    n = len(tasks)
    acc = np.full((n, n), np.nan)
    shares = []
    g = make_generator(seed + 7)
    for i, (train, _) in enumerate(tasks):
        if kind != "seqlora" or i == 0:
            cl.begin_task("shared" if kind == "seqlora" else f"task{i}")
        forced = None if kind in ("ours", "seqlora") else len(cl.tasks) - 1
        shares.append(train_task(cl, train, setting, seed + i, forced))
        if kind != "seqlora" or i == n - 1:
            cl.end_task()
        for j in range(i + 1):
            test = tasks[j][1]
            if kind == "oracle":
                route = torch.full((len(test),), j, dtype=torch.long)
            elif kind == "random":
                route = torch.randint(0, len(cl.tasks), (len(test),), generator=g)
            else:
                route = None
            acc[i, j] = evaluate(cl, test, route)[0]
    out: dict[str, object] = {"acc": acc, "train_share": shares}
    if kind == "ours":
        routing = {}
        for j, (_, test) in enumerate(tasks):
            _, choices = evaluate(cl, test)
            routing[j] = {name: float((c == j).float().mean()) for name, c in choices.items()}
        out["routing"] = routing
    if kind == "oracle":
        uni = []
        for _, test in tasks:
            k = len(cl.tasks)
            uni.append(evaluate(cl, test, torch.full((len(test), k), 1.0 / k))[0])
        out["uniform_final"] = uni
    return out


def routing_summary(routing: dict[int, dict[str, float]], n_tasks: int) -> tuple[list[str], np.ndarray]:
    """Wrapped layer names and the ``(task, layer)`` matrix of test routing accuracies."""
    layers = list(routing[0])
    return layers, np.array([[routing[j][name] for name in layers] for j in range(n_tasks)])


def summarize(acc: np.ndarray) -> tuple[float, float]:
    """AP (mean final accuracy) and BWT (mean final minus just-learned accuracy over tasks 0..n-2)."""
    n = acc.shape[0]
    ap = float(np.mean(acc[-1]))
    bwt = float(np.mean([acc[-1, j] - acc[j, j] for j in range(n - 1)])) if n > 1 else 0.0
    return ap, bwt


def measure(
    setting: Setting, seed: int = 0, ours_kind: str = "ours", base: TinyCausalLM | None = None
) -> dict[str, float]:
    """All metrics of one run; ``ours_kind="random"`` swaps our routing for random task ids (the broken
    variant, task-agnostic selection). ``base``: a frozen base from :func:`pretrain_base` (trained here if None)."""
    if ours_kind not in ("ours", "random"):
        raise ValueError(f"ours_kind must be 'ours' or 'random', got {ours_kind!r}")
    if base is None:
        base = pretrain_base(setting, seed)
    tasks = make_tasks(setting.n_tasks, setting.n_train, setting.n_test, seed)
    res = {
        k: run_learner(k, base, tasks, setting, seed)
        for k in progress([ours_kind, "oracle", "seqlora"], desc="learners")
    }
    ours, oracle, seq = res[ours_kind], res["oracle"], res["seqlora"]
    m: dict[str, float] = {}
    for name, r in (("ours", ours), ("oracle", oracle), ("baseline_seqlora", seq)):
        ap, bwt = summarize(r["acc"])  # type: ignore[arg-type]
        m[f"{name}_ap"], m[f"{name}_bwt"] = ap, bwt
        for j, a in enumerate(r["acc"][-1]):  # type: ignore[index]
            m[f"{name}_final_task{j}"] = float(a)
    m["uniform_ap"] = float(np.mean(oracle["uniform_final"]))  # type: ignore[arg-type]
    m["oracle_min_task_acc"] = float(np.min(np.diag(oracle["acc"]))) / 100.0  # type: ignore[arg-type]
    acc = ours["acc"]
    m["ours_first_task_drop"] = float(acc[0, 0] - acc[-1, 0])  # type: ignore[index]
    if "routing" in ours:
        layers, per = routing_summary(ours["routing"], setting.n_tasks)  # type: ignore[arg-type]
        for li, name in enumerate(layers):
            m[f"routing_acc[{name}]"] = float(per[:, li].mean())
        m["routing_acc_mean"] = float(per.mean())
        m["routing_acc_min_pair"] = float(per.min())
        m["routing_acc_last_layer"] = float(per[:, -2:].mean())
    else:
        m["routing_acc_mean"] = m["routing_acc_min_pair"] = m["routing_acc_last_layer"] = 0.0
    for i, s in enumerate(ours["train_share"]):  # type: ignore[arg-type]
        m[f"ours_train_top1_current_share_task{i}"] = float(s)
    if setting.successor_arm is not None and ours_kind == "ours":
        # Extra arm, not gated: the official successor option against the per-layer miss.
        succ = run_learner("ours", base, tasks, setting, seed, successor=setting.successor_arm)
        ap, bwt = summarize(succ["acc"])  # type: ignore[arg-type]
        m["successor_ap"], m["successor_bwt"] = ap, bwt
        for j, a in enumerate(succ["acc"][-1]):  # type: ignore[index]
            m[f"successor_final_task{j}"] = float(a)
        _, per = routing_summary(succ["routing"], setting.n_tasks)  # type: ignore[arg-type]
        m["successor_routing_acc_mean"] = float(per.mean())
        m["successor_routing_acc_min_pair"] = float(per.min())
    return m


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Run the reproduction at the quick or full scale and check the pass rule."""
    setting = QUICK if quick else FULL
    seed_everything(seed)
    t0 = time.perf_counter()
    with torch_threads(1):
        m = measure(setting, seed)
    m["wall_seconds"] = time.perf_counter() - t0
    figures = []
    if out_dir is not None:
        fig, ax = new_figure()
        xs = np.arange(setting.n_tasks)
        for k, (name, label) in enumerate(
            (
                ("ours", "ours (feature routing)"),
                ("oracle", "oracle task id"),
                ("baseline_seqlora", "SeqLoRA"),
            )
        ):
            ax.bar(xs + (k - 1) * 0.25, [m[f"{name}_final_task{j}"] for j in xs], 0.25, label=label)
        ax.set_xlabel("task")
        ax.set_ylabel("final accuracy (%)")
        ax.set_title(
            f"P14: AP ours {m['ours_ap']:.1f}, oracle {m['oracle_ap']:.1f}, SeqLoRA {m['baseline_seqlora_ap']:.1f}"
        )
        ax.legend(fontsize=8)
        figures.append(save_figure(fig, out_dir, "cl_peft_select_final_accuracy"))
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        preconditions=preconditions(setting),
        metrics=m,
        headline="ours_ap",
        baseline="baseline_seqlora_ap",
        figures=figures,
        notes=(
            f"{setting.n_tasks} synthetic polarity tasks, tiny Llama-style base (d={setting.hidden}, "
            f"{setting.layers} layers) pre-trained on generic tables then frozen; q/v LoRA r={setting.r}, "
            f"{setting.epochs} epoch(s) per task, gradient clipping {setting.clip_norm}; accuracies in points"
            + (
                ""
                if setting.successor_arm is None
                else f"; successor_* = ungated arm, ours with successor={list(setting.successor_arm)}"
            )
            + "."
        ),
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
