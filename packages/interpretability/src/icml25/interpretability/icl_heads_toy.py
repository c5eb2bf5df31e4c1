"""Which Attention Heads Matter for In-Context Learning? — ICML 2025, P51: the synthetic toy and its training.

Yin & Steinhardt, "Which Attention Heads Matter for In-Context Learning?", ICML 2025 (arXiv 2502.14010): the
synthetic CPU reproduction, a tiny decoder with the Llama module paths, random word-bijection tasks, and its
training on a mix of repeat data (which grows induction heads) and function-ICL data.

:class:`TinyICLTransformer` is a small pre-LayerNorm decoder whose attention output projections sit where
Llama's do (``model.layers[l].self_attn.o_proj``), so the head hook site of
:mod:`icml25.interpretability.common.heads` reads it like a Hugging Face model; :func:`tiny_llama` builds a
random-init ``LlamaForCausalLM`` (extra ``[hf]``). The head scores and ablations are in
:mod:`icml25.interpretability.icl_heads`, which re-exports every name here.

Shapes: ``B`` sequences, ``T`` positions, ``V`` vocabulary, ``H`` heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.interpretability.common.llama import random_llama
from icml25.interpretability.icl_heads_prompts import DEFAULT_TEMPLATE, ICLTask, ICLTemplate
from icml25.kernels.checks import check_int
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "TinyConfig",
    "TinyICLTransformer",
    "TinyOutput",
    "function_batch",
    "make_synthetic_icl_tasks",
    "repeat_batch",
    "tiny_llama",
    "train_synthetic_icl",
]


# ------------------------------------------------------------------------------------------ tiny model
@dataclass
class TinyConfig:
    """Config of :class:`TinyICLTransformer` (HF-style attribute names, so :class:`HeadActivationSite` reads it)."""

    vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    hidden_size: int
    max_position_embeddings: int
    bos_token_id: int = 0


@dataclass
class TinyOutput:
    """``logits [B, T, V]``; ``attentions``: one ``[B, H, T, T]`` per layer when requested."""

    logits: Tensor
    attentions: tuple[Tensor, ...] | None = None


class _Attention(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h, self.dh = h, d // h
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        B, T, _ = x.shape
        q, k, v = (
            p(x).view(B, T, self.h, self.dh).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        a = s.masked_fill(mask, float("-inf")).softmax(-1)
        z = (a @ v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(z), a


class _Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_attn = _Attention(d, h)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        o, a = self.self_attn(self.input_layernorm(x))
        x = x + o
        return x + self.mlp(self.post_attention_layernorm(x)), a


class _Body(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.embed_positions = nn.Embedding(cfg.max_position_embeddings, d)
        self.layers = nn.ModuleList(_Block(d, cfg.num_attention_heads) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.LayerNorm(d)


class TinyICLTransformer(nn.Module):
    """A small pre-LayerNorm decoder with learned positions and the Llama module paths
    (``model.layers[l].self_attn.o_proj``), for the synthetic reproduction on CPU.

    ``forward(input_ids [B, T], output_attentions=False) -> TinyOutput``. Weights are initialised from
    ``seed`` without touching the caller's global random state.
    """

    def __init__(
        self,
        vocab_size: int,
        n_layers: int = 2,
        n_heads: int = 4,
        d_model: int = 64,
        max_len: int = 64,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("n_layers", n_layers), ("n_heads", n_heads),
                        ("d_model", d_model), ("max_len", max_len)):  # fmt: skip
            check_int(v, name, low=1)
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads={n_heads}, got {d_model}")
        self.config = TinyConfig(vocab_size, n_layers, n_heads, d_model, max_len)
        with isolated_rng(seed):
            self.model = _Body(self.config)
            self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, input_ids: Tensor, output_attentions: bool = False) -> TinyOutput:
        T = input_ids.shape[-1]
        if T > self.config.max_position_embeddings:
            raise ValueError(f"input_ids length must be <= {self.config.max_position_embeddings}, got {T}")
        pos = torch.arange(T, device=input_ids.device)
        x = self.model.embed_tokens(input_ids) + self.model.embed_positions(pos)
        atts = []
        for layer in self.model.layers:
            x, a = layer(x)
            atts.append(a)
        logits = self.lm_head(self.model.norm(x))
        return TinyOutput(logits, tuple(atts) if output_attentions else None)


def tiny_llama(
    vocab_size: int = 128, n_layers: int = 2, n_heads: int = 4, d_model: int = 64, seed: int = 0
) -> nn.Module:
    """A random-init ``transformers.LlamaForCausalLM`` in eval mode, with eager attention (so attentions are
    returned), offline (:func:`~icml25.interpretability.common.llama.random_llama`). Needs the ``[hf]`` extra."""
    model = random_llama(
        vocab_size, d_model, n_layers, n_heads, seed=seed, hidden_size_name="d_model",
        bos_token_id=0, eos_token_id=1, pad_token_id=1, attn_implementation="eager",
    )  # fmt: skip
    return model.eval()


# ------------------------------------------------------------------------------------------ synthetic tasks
def make_synthetic_icl_tasks(
    n_tasks: int = 16, words: Sequence[int] = tuple(range(62, 78)), seed: int = 0
) -> dict[str, ICLTask]:
    """``n_tasks`` tasks, each a random bijection ``f_t`` of ``words`` (pairs ``(w, f_t(w))``)."""
    check_int(n_tasks, "n_tasks", low=1)
    w = [int(x) for x in words]
    if len(w) < 2 or len(set(w)) != len(w):
        raise ValueError(f"words must be at least 2 distinct token ids, got {list(words)}")
    g = make_generator(seed)
    tasks = {}
    for t in range(n_tasks):
        perm = torch.randperm(len(w), generator=g).tolist()
        tasks[f"f{t}"] = ICLTask(f"f{t}", tuple((w[i], w[p]) for i, p in enumerate(perm)))
    return tasks


# ------------------------------------------------------------------------------------------ training
def repeat_batch(batch: int, n: int, alphabet: Sequence[int], bos: int, generator: torch.Generator) -> Tensor:
    """``[batch, 2n + 1]`` sequences ``[BOS, r_1..r_n, r_1..r_n]``, ``r`` uniform over ``alphabet``."""
    pool = torch.as_tensor(list(alphabet), dtype=torch.long)
    r = pool[torch.randint(pool.numel(), (batch, n), generator=generator)]
    return torch.cat([torch.full((batch, 1), bos), r, r], 1)


def function_batch(tasks: Sequence[ICLTask], batch: int, n_shots: int, template: ICLTemplate,
                   generator: torch.Generator) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Full sequences ``[batch, T]`` of ``n_shots`` demos and the query followed by its answer (single
    token pairs, query not among the demos), and the mask ``[batch, T - 1]`` of predictions of answers."""
    n_pairs = len(tasks[0].pairs)
    if any(len(t.pairs) != n_pairs or any(len(x) != 1 or len(y) != 1 for x, y in t.pairs) for t in tasks):
        raise ValueError("tasks must all hold the same number of single-token (x, y) pairs")
    if n_shots + 1 > n_pairs:
        raise ValueError(f"n_shots must be < the {n_pairs} pairs per task, got {n_shots}")
    table = torch.tensor([[[x[0], y[0]] for x, y in t.pairs] for t in tasks])  # [tasks, pairs, 2]
    t = torch.randint(len(tasks), (batch,), generator=generator)
    idx = torch.rand(batch, n_pairs, generator=generator).argsort(1)[:, : n_shots + 1]
    xy = table[t[:, None], idx]  # [batch, n_shots + 1, 2]
    q, a, sep = (torch.tensor(v, dtype=torch.long).expand(batch, n_shots + 1, -1)
                 for v in (template.q_prefix, template.a_prefix, template.demo_sep))  # fmt: skip
    parts = torch.cat([q, xy[..., :1], a, xy[..., 1:], sep], -1)  # [batch, n_shots + 1, stride]
    stride = parts.shape[-1]
    body = parts.reshape(batch, -1)[:, : -len(template.demo_sep) or None]
    head = [] if template.bos is None else [torch.full((batch, 1), template.bos)]
    seqs = torch.cat([*head, body], 1)
    start = len(head) + len(template.q_prefix) + len(template.a_prefix)
    mask = torch.zeros(seqs.shape[1] - 1, dtype=torch.bool)
    mask[start + torch.arange(n_shots + 1) * stride] = True  # the x (or a_prefix) position predicts y
    return seqs, mask.expand(batch, -1)


def train_synthetic_icl(
    model: nn.Module,
    tasks: Sequence[ICLTask],
    alphabet: Sequence[int],
    steps: int = 800,
    batch: int = 64,
    lr: float = 1e-3,
    n: int = 16,
    n_shots: int = 6,
    template: ICLTemplate = DEFAULT_TEMPLATE,
    seed: int = 0,
    callback: Callable[[int], None] | None = None,
) -> list[float]:
    """Train ``model`` (Adam) on a 50/50 mix of repeat data (loss on the second half, which grows
    induction heads) and function-ICL data over ``tasks`` (loss on the answers); returns the losses."""
    check_int(steps, "steps", low=1)
    if not tasks or not all(isinstance(t, ICLTask) for t in tasks):
        raise ValueError("tasks must be a non-empty list of ICLTask")
    g = make_generator(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    bos = 0 if template.bos is None else template.bos
    half = max(1, batch // 2)
    losses = []
    model.train()
    for step in range(steps):
        r = repeat_batch(half, n, alphabet, bos, g)
        lr_ = model(input_ids=r).logits[:, n + 1 : -1]
        loss_r = F.cross_entropy(lr_.reshape(-1, lr_.shape[-1]), r[:, n + 2 :].reshape(-1))
        f, m = function_batch(tasks, half, n_shots, template, g)
        lf = model(input_ids=f).logits[:, :-1][m]
        loss_f = F.cross_entropy(lf, f[:, 1:][m])
        loss = 0.5 * (loss_r + loss_f)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if callback is not None:
            callback(step)
    model.eval()
    return losses
