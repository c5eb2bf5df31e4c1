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
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "ABLATION_MODES",
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
INDUCTION_METHODS = ("mean_attention", "tl_abs")
_SUPPORTED = "Llama/Mistral/Qwen2 (model.layers[i].self_attn.o_proj), GPT-2 (transformer.h[i].attn.c_proj), GPT-NeoX (gpt_neox.layers[i].attention.dense)"


# ------------------------------------------------------------------------------------------ hook site
class HeadActivationSite:
    """The per-layer attention output projections of ``model`` and its head geometry.

    ``modules[l]`` is layer ``l``'s output projection; its input ``[B, T, H * d_head]`` is split into
    ``[B, T, H, d_head]`` by :meth:`hook`. ``attention_modules[l]`` is the attention block that owns it
    (``self_attn`` / ``attn`` / ``attention``). Raises ``NotImplementedError`` for an unsupported
    architecture.
    """

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        cfg = getattr(model, "config", None)
        layers, attr, family = None, None, None
        inner = getattr(model, "model", None)
        if (
            inner is not None
            and hasattr(inner, "layers")
            and _has_path(inner.layers, ("self_attn", "o_proj"))
        ):
            layers, attr, family = inner.layers, ("self_attn", "o_proj"), "llama"
        elif hasattr(model, "transformer") and _has_path(
            getattr(model.transformer, "h", None), ("attn", "c_proj")
        ):
            layers, attr, family = model.transformer.h, ("attn", "c_proj"), "gpt2"
        elif hasattr(model, "gpt_neox") and _has_path(model.gpt_neox.layers, ("attention", "dense")):
            layers, attr, family = model.gpt_neox.layers, ("attention", "dense"), "gpt_neox"
        if layers is None or cfg is None:
            raise NotImplementedError(
                f"model ({type(model).__name__}) has no resolvable attention output projection; supported: {_SUPPORTED}"
            )
        self.model, self.family = model, family
        self.modules: list[nn.Module] = [_get_path(layer, attr) for layer in layers]
        # the attention block that owns each output projection (its forward output is the post-W_O
        # attention output; P42 steers it as the official GridToM code does)
        self.attention_modules: list[nn.Module] = [_get_path(layer, attr[:-1]) for layer in layers]
        self.n_layers = len(self.modules)
        n_heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
        if not n_heads:
            raise NotImplementedError(f"model.config of {type(model).__name__} names no head count")
        self.n_heads = int(n_heads)
        m0 = self.modules[0]
        d_in = m0.in_features if isinstance(m0, nn.Linear) else int(m0.weight.shape[0])
        if d_in % self.n_heads:
            raise NotImplementedError(
                f"output projection width {d_in} is not a multiple of {self.n_heads} heads"
            )
        self.d_head = d_in // self.n_heads

    @property
    def shape(self) -> tuple[int, int]:
        """``(L, H)``."""
        return self.n_layers, self.n_heads

    def hook(self, layer: int, fn: Callable[[Tensor], Tensor | None]) -> torch.utils.hooks.RemovableHandle:
        """Register ``fn(z)`` on layer ``layer``: ``z [B, T, H, d_head]``; a returned tensor replaces it."""
        H, dh = self.n_heads, self.d_head

        def pre(_mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            x = args[0]
            z = x.reshape(*x.shape[:-1], H, dh)
            new = fn(z)
            if new is None:
                return None
            return (new.reshape(x.shape).to(x.dtype), *args[1:])

        return self.modules[layer].register_forward_pre_hook(pre)


def _has_path(layers: Any, attr: tuple[str, ...]) -> bool:
    if layers is None or not hasattr(layers, "__len__") or len(layers) == 0:
        return False
    try:
        _get_path(layers[0], attr)
    except AttributeError:
        return False
    return True


def _get_path(obj: Any, attr: tuple[str, ...]) -> Any:
    for a in attr:
        obj = getattr(obj, a)
    return obj


@contextlib.contextmanager
def _hooks(site: HeadActivationSite, fns: Mapping[int, Callable[[Tensor], Tensor | None]]) -> Iterator[None]:
    handles = [site.hook(layer, fn) for layer, fn in fns.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _site(model: Any) -> HeadActivationSite:
    return model if isinstance(model, HeadActivationSite) else HeadActivationSite(model)


def _logits(model: nn.Module, ids: Tensor) -> Tensor:
    return model(input_ids=ids).logits


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
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
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
    """A random-init ``transformers.LlamaForCausalLM`` (eager attention, so attentions are returned), offline.

    Needs the ``[hf]`` extra (transformers, imported here lazily)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("tiny_llama needs transformers: pip install 'icml25-interpretability[hf]'") from err
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_heads, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, pad_token_id=1, attn_implementation="eager",
    )  # fmt: skip
    with isolated_rng(seed):
        model = LlamaForCausalLM(cfg)
    return model.eval()


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
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if T != 2 * n + 1 or attn.numel() == 0:
        raise ValueError(
            f"attn must be [..., B >= 1, 2n + 1, 2n + 1] = [..., B, {2 * n + 1}, {2 * n + 1}], got {tuple(attn.shape)}"
        )
    if not torch.isfinite(attn).all() or attn.min() < 0 or attn.max() > 1 + 1e-4:
        raise ValueError("attn must hold attention probabilities in [0, 1]")
    if method not in INDUCTION_METHODS:
        raise ValueError(f"method must be one of {INDUCTION_METHODS}, got {method!r}")
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
    site = _site(model)
    for name, v in (("n", n), ("batch", batch), ("chunk", chunk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if method not in INDUCTION_METHODS:
        raise ValueError(f"method must be one of {INDUCTION_METHODS}, got {method!r}")
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


# ------------------------------------------------------------------------------------------ ICL tasks
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


@dataclass(frozen=True)
class ICLPrompt:
    """One prompt: ``input_ids [T]``, the first answer token ``target`` and the full ``answer``."""

    input_ids: Tensor
    target: int
    answer: tuple[int, ...]
    task: str = ""


def build_prompt(demos: Sequence[tuple[Sequence[int], Sequence[int]]], query: tuple[Sequence[int], Sequence[int]],
                 template: ICLTemplate = ICLTemplate(), task: str = "") -> ICLPrompt:  # fmt: skip
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


def _check_shots(n_shots: Any, task: ICLTask, minimum: int = 1) -> None:
    if isinstance(n_shots, bool) or not isinstance(n_shots, int) or n_shots < minimum:
        raise ValueError(f"n_shots must be an int >= {minimum}, got {n_shots!r}")
    if n_shots + 1 > len(task.pairs):
        raise ValueError(
            f"n_shots must be < the {len(task.pairs)} pairs of task {task.name!r}, got {n_shots}"
        )


def sample_prompts(task: ICLTask, n_prompts: int, n_shots: int, template: ICLTemplate = ICLTemplate(),
                   seed: int = 0, shuffle_labels: bool = False) -> list[ICLPrompt]:  # fmt: skip
    """``n_prompts`` prompts of ``n_shots`` demos and a query, all ``n_shots + 1`` pairs distinct; with
    ``shuffle_labels`` the demos' labels are permuted among the demos (the corrupted prompts of the CIE)."""
    if not isinstance(task, ICLTask):
        raise TypeError(f"task must be an ICLTask, got {type(task).__name__}")
    _check_shots(n_shots, task, 2 if shuffle_labels else 1)
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise ValueError(f"n_prompts must be a positive int, got {n_prompts!r}")
    g = make_generator(seed)
    out = []
    for _ in range(n_prompts):
        idx = torch.randperm(len(task.pairs), generator=g)[: n_shots + 1].tolist()
        demos = [task.pairs[i] for i in idx[:-1]]
        if shuffle_labels:
            perm = torch.randperm(n_shots, generator=g).tolist()
            demos = [(demos[i][0], demos[p][1]) for i, p in enumerate(perm)]
        out.append(build_prompt(demos, task.pairs[idx[-1]], template, task.name))
    return out


def make_synthetic_icl_tasks(
    n_tasks: int = 16, words: Sequence[int] = tuple(range(62, 78)), seed: int = 0
) -> dict[str, ICLTask]:
    """``n_tasks`` tasks, each a random bijection ``f_t`` of ``words`` (pairs ``(w, f_t(w))``)."""
    if isinstance(n_tasks, bool) or not isinstance(n_tasks, int) or n_tasks < 1:
        raise ValueError(f"n_tasks must be a positive int, got {n_tasks!r}")
    w = [int(x) for x in words]
    if len(w) < 2 or len(set(w)) != len(w):
        raise ValueError(f"words must be at least 2 distinct token ids, got {list(words)}")
    g = make_generator(seed)
    tasks = {}
    for t in range(n_tasks):
        perm = torch.randperm(len(w), generator=g).tolist()
        tasks[f"f{t}"] = ICLTask(f"f{t}", tuple((w[i], w[p]) for i, p in enumerate(perm)))
    return tasks


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
    site = _site(model)
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"position must be an int, got {type(position).__name__}")
    total = torch.zeros(site.n_layers, site.n_heads, site.d_head)
    count = 0
    dev = next(site.model.parameters()).device
    for ids, _, _ in _by_length(prompts):
        store: dict[int, Tensor] = {}

        def grab(layer: int, store: dict[int, Tensor] = store) -> Callable[[Tensor], None]:
            def fn(z: Tensor) -> None:
                store[layer] = z[:, position].float().sum(0).cpu()

            return fn

        with _hooks(site, {layer: grab(layer) for layer in range(site.n_layers)}):
            _logits(site.model, ids.to(dev))
        total += torch.stack([store[layer] for layer in range(site.n_layers)])
        count += ids.shape[0]
    return total / count


@torch.no_grad()
def random_token_activations(model: nn.Module, length: int, tokens: Sequence[int] | None = None, seed: int = 0,
                             bos_token_id: int | None = None) -> Tensor:  # fmt: skip
    """Every head's activation at every position of one uniform random-token sequence (after a BOS):
    ``[length, L, H, d_head]``, the replacement of ``mode="random_tokens_all_positions"``."""
    site = _site(model)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
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

    with _hooks(site, {layer: grab(layer) for layer in range(site.n_layers)}):
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

                with _hooks(site, {layer: patch_all}):
                    p = _target_prob(_logits(site.model, ids.repeat(H, 1)), tgt.repeat(H)).cpu()
                out[layer] += (p.view(H, B) - base).sum(1)
            else:
                for h in range(H):
                    v = mean[layer, h].to(dev)

                    def patch_one(z: Tensor, h: int = h, v: Tensor = v) -> Tensor:
                        z = z.clone()
                        z[:, -1, h] = v
                        return z

                    with _hooks(site, {layer: patch_one}):
                        p = _target_prob(_logits(site.model, ids), tgt).cpu()
                    out[layer, h] += (p - base).sum()
    return out / len(prompts)


def fv_scores(
    model: nn.Module,
    tasks: Mapping[str, ICLTask],
    template: ICLTemplate = ICLTemplate(),
    n_shots: int = 10,
    n_prompts: int = 100,
    seed: int = 0,
    batch_heads: bool = True,
) -> FVScores:
    """FV score of every head: the causal indirect effect (probability after softmax of the query's first
    answer token) of writing the head's task-mean final-token activation (over ``n_prompts`` clean prompts)
    into ``n_prompts`` label-shuffled prompts, head by head, averaged over prompts and ``tasks``.
    ``batch_heads`` patches all heads of a layer in one forward (one prompt copy per head)."""
    site = _site(model)
    if not isinstance(tasks, Mapping) or not tasks or not all(isinstance(t, ICLTask) for t in tasks.values()):
        raise ValueError("tasks must be a non-empty {name: ICLTask} mapping")
    if isinstance(n_shots, bool) or not isinstance(n_shots, int) or n_shots < 2:
        raise ValueError(f"n_shots must be an int >= 2 (the demos' labels are shuffled), got {n_shots!r}")
    for t in tasks.values():
        _check_shots(n_shots, t, 2)
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise ValueError(f"n_prompts must be a positive int, got {n_prompts!r}")
    per_task, per_mean = {}, {}
    for k, (name, task) in enumerate(tasks.items()):
        s = seed * 1_000_003 + 2 * k
        clean = sample_prompts(task, n_prompts, n_shots, template, seed=s)
        mean = mean_head_activations(site, clean)
        corrupt = sample_prompts(task, n_prompts, n_shots, template, seed=s + 1, shuffle_labels=True)
        per_task[name] = _cie(site, corrupt, mean, batch_heads)
        per_mean[name] = mean
    scores = torch.stack(list(per_task.values())).mean(0)
    return FVScores(scores, per_task, torch.stack(list(per_mean.values())).mean(0), per_mean)


# ------------------------------------------------------------------------------------------ selection
def _count(k: Any, total: int, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, float)):
        raise TypeError(f"{name} must be an int count or a float fraction, got {type(k).__name__}")
    if isinstance(k, float):
        if not 0 < k <= 1:
            raise ValueError(f"{name} as a fraction must be in (0, 1], got {k}")
        return max(1, math.floor(k * total))
    if not 1 <= k <= total:
        raise ValueError(f"{name} must be in [1, {total}] heads, got {k}")
    return k


def _check_scores(scores: Any, name: str) -> Tensor:
    if isinstance(scores, Tensor) and not scores.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {scores.dtype}")
    if not isinstance(scores, Tensor) or scores.ndim != 2 or scores.numel() == 0:
        raise ValueError(
            f"{name} must be a [L, H] tensor, got {getattr(scores, 'shape', type(scores).__name__)}"
        )
    if not torch.isfinite(scores).all():
        raise ValueError(f"{name} must be finite")
    return scores


def select_heads(
    scores: Tensor, k: int | float, exclude_scores: Tensor | None = None, exclude_top: int | float = 0.02
) -> list[tuple[int, int]]:
    """The top-``k`` heads ``(layer, head)`` by ``scores [L, H]`` after dropping the top ``exclude_top``
    heads under ``exclude_scores`` (an int count or a fraction of all heads, floored, at least 1; none
    when ``exclude_scores`` is None). A fractional ``k`` is floored and raised to at least 1."""
    s = _check_scores(scores, "scores")
    total = s.numel()
    n = _count(k, total, "k")
    banned: set[int] = set()
    if exclude_scores is not None:
        e = _check_scores(exclude_scores, "exclude_scores")
        if e.shape != s.shape:
            raise ValueError(
                f"exclude_scores must have the shape of scores {tuple(s.shape)}, got {tuple(e.shape)}"
            )
        if not (isinstance(exclude_top, int) and exclude_top == 0):
            banned = set(
                torch.argsort(e.flatten(), descending=True, stable=True)[
                    : _count(exclude_top, total, "exclude_top")
                ].tolist()
            )
    if total - len(banned) < n:
        raise ValueError(f"k={n} exceeds the {total - len(banned)} heads left after excluding {len(banned)}")
    order = [i for i in torch.argsort(s.flatten(), descending=True, stable=True).tolist() if i not in banned]
    H = s.shape[1]
    return [(i // H, i % H) for i in order[:n]]


def random_heads(
    shape: tuple[int, int], k: int | float, seed: int = 0, layers: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """``k`` heads uniformly at random from an ``(L, H)`` grid; with ``layers``, one random head in each
    listed layer (the layer-matched random baseline), distinct."""
    if not (
        isinstance(shape, tuple) and len(shape) == 2 and all(isinstance(x, int) and x >= 1 for x in shape)
    ):
        raise ValueError(f"shape must be (L, H) positive ints, got {shape!r}")
    L, H = shape
    g = make_generator(seed)
    if layers is not None:
        out: list[tuple[int, int]] = []
        for layer in layers:
            if not 0 <= layer < L:
                raise ValueError(f"layers must be in [0, {L}), got {layer}")
            free = [h for h in range(H) if (layer, h) not in out]
            if not free:
                raise ValueError(f"layers lists layer {layer} more than H={H} times")
            out.append((layer, free[int(torch.randint(len(free), (1,), generator=g))]))
        return out
    n = _count(k, L * H, "k")
    return [(i // H, i % H) for i in torch.randperm(L * H, generator=g)[:n].tolist()]


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
    site = _site(model)
    L, H, dh = site.n_layers, site.n_heads, site.d_head
    if mode not in ABLATION_MODES:
        raise ValueError(f"mode must be one of {ABLATION_MODES}, got {mode!r}")
    if not isinstance(heads, Sequence) or not heads:
        raise ValueError("heads must be a non-empty list of (layer, head) pairs")
    for lh in heads:
        if not (isinstance(lh, tuple) and len(lh) == 2 and 0 <= lh[0] < L and 0 <= lh[1] < H):
            raise ValueError(f"heads must be (layer, head) pairs in [0, {L}) x [0, {H}), got {lh!r}")
    if not (position in ("last", "all") or (isinstance(position, int) and not isinstance(position, bool))):
        raise ValueError(f"position must be 'last', 'all' or an int, got {position!r}")
    if mode in ("mean", "shuffled"):
        if not isinstance(mean_acts, Tensor) or tuple(mean_acts.shape) != (L, H, dh):
            raise ValueError(
                f"mean_acts must be [L, H, d_head] = {(L, H, dh)}, got {getattr(mean_acts, 'shape', None)}"
            )
        rep = mean_acts
        if mode == "shuffled":
            perm = torch.randperm(L * H, generator=make_generator(seed))
            rep = mean_acts.reshape(L * H, dh)[perm].reshape(L, H, dh)
    elif mode == "random_tokens_all_positions":
        if (
            not isinstance(mean_acts, Tensor)
            or mean_acts.ndim != 4
            or tuple(mean_acts.shape[1:]) != (L, H, dh)
        ):
            raise ValueError(
                f"mean_acts must be [T, L, H, d_head] with (L, H, d_head) = {(L, H, dh)} for mode={mode!r}, got {getattr(mean_acts, 'shape', None)}"
            )
        rep = mean_acts
    else:
        rep = torch.zeros(L, H, dh)
    if not rep.is_floating_point():
        raise TypeError(f"mean_acts must be a floating-point tensor, got {rep.dtype}")
    if not torch.isfinite(rep).all():
        raise ValueError("mean_acts must be finite")
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

    with _hooks(site, {layer: make(layer, hs) for layer, hs in by_layer.items()}):
        yield site


# ------------------------------------------------------------------------------------------ metrics
@torch.no_grad()
def icl_accuracy(model: nn.Module, task: ICLTask, template: ICLTemplate = ICLTemplate(), n_shots: int = 10,
                 n_prompts: int = 100, seed: int = 0) -> float:  # fmt: skip
    """Few-shot accuracy: the fraction of ``n_prompts`` clean prompts whose greedy next token (one
    prefill forward, so a ``"last"`` ablation touches the prompt's final token only) is the answer's
    first token. Wrap in :func:`ablate_heads` to measure an ablation."""
    if not isinstance(task, ICLTask):
        raise TypeError(f"task must be an ICLTask, got {type(task).__name__}")
    site = _site(model)
    prompts = sample_prompts(task, n_prompts, n_shots, template, seed=seed)
    dev = next(site.model.parameters()).device
    correct = 0
    for ids, tgt, _ in _by_length(prompts):
        correct += int((_logits(site.model, ids.to(dev))[:, -1].argmax(-1).cpu() == tgt).sum())
    return correct / len(prompts)


@torch.no_grad()
def token_loss_difference(model: nn.Module, seqs: Tensor, early: int = 50, late: int = 500) -> float:
    """Olsson's token-loss difference: mean cross-entropy of token ``early`` minus that of token ``late``
    (0-based positions of ``seqs [B, T]``, ``T > late``)."""
    site = _site(model)
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
    template: ICLTemplate = ICLTemplate(),
    seed: int = 0,
    callback: Callable[[int], None] | None = None,
) -> list[float]:
    """Train ``model`` (Adam) on a 50/50 mix of repeat data (loss on the second half, which grows
    induction heads) and function-ICL data over ``tasks`` (loss on the answers); returns the losses."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
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
