"""Per-head activation hook site and head selection, shared by P42 (GridToM) and P51 (ICL heads).

The hook site reads and writes each attention head's activation ``z[l, h]``: head ``h``'s ``d_head`` slice
of the *input* of layer ``l``'s attention output projection (``o_proj`` / ``c_proj`` / ``dense``), through a
forward pre-hook that splits the heads; the modelling code is never forked. Used by Yin & Steinhardt, "Which
Attention Heads Matter for In-Context Learning?" (P51: function-vector scores and mean ablations) and Li et
al., "From Black Boxes to Transparent Minds" (P42: per-head belief probes and inference-time intervention). Supported families (:class:`HeadActivationSite`): Hugging Face Llama /
Mistral / Qwen2 (and P51's ``TinyICLTransformer``, which has the same module paths), GPT-2 and GPT-NeoX.

Head selection: :func:`select_heads` (the top-k heads by a score ``[L, H]``, optionally after excluding the
top heads of another score) and :func:`random_heads` (uniform and layer-matched random baselines).

Shapes: ``L`` layers, ``H`` heads, ``d_head`` per head, ``B`` prompts, ``T`` positions.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from icml25.kernels.checks import check_float, check_int, check_ints, check_tensor
from icml25.kernels.rng import make_generator

__all__ = ["HeadActivationSite", "as_head_site", "head_hooks", "random_heads", "select_heads"]

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
def head_hooks(
    site: HeadActivationSite, fns: Mapping[int, Callable[[Tensor], Tensor | None]]
) -> Iterator[None]:
    """Within the block, ``fns[l]`` is hooked on layer ``l`` of ``site`` (:meth:`HeadActivationSite.hook`);
    the hooks are removed on exit, also on an exception."""
    handles = [site.hook(layer, fn) for layer, fn in fns.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def as_head_site(model: Any) -> HeadActivationSite:
    """``model`` itself if it is a :class:`HeadActivationSite`, else the site of the model."""
    return model if isinstance(model, HeadActivationSite) else HeadActivationSite(model)


# ------------------------------------------------------------------------------------------ selection
def _count(k: Any, total: int, name: str) -> int:
    """A head count ``k``: an int in ``[1, total]``, or a fraction in ``(0, 1]`` of ``total`` (floored, at
    least 1)."""
    if isinstance(k, float):
        return max(1, math.floor(check_float(k, name, low=0.0, high=1.0, low_open=True) * total))
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"{name} must be an int count or a float fraction, got {type(k).__name__}")
    return check_int(k, name, low=1, high=total)


def select_heads(
    scores: Tensor, k: int | float, exclude_scores: Tensor | None = None, exclude_top: int | float = 0.02
) -> list[tuple[int, int]]:
    """The top-``k`` heads ``(layer, head)`` by ``scores [L, H]`` after dropping the top ``exclude_top``
    heads under ``exclude_scores`` (an int count or a fraction of all heads, floored, at least 1; none
    when ``exclude_scores`` is None). A fractional ``k`` is floored and raised to at least 1."""
    s = check_tensor(scores, "scores", ndim=2, non_empty=True)
    total = s.numel()
    n = _count(k, total, "k")
    banned: set[int] = set()
    if exclude_scores is not None:
        e = check_tensor(exclude_scores, "exclude_scores", ndim=2, non_empty=True)
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
    L, H = check_ints(shape, "shape", length=2, low=1)
    g = make_generator(seed)
    if layers is not None:
        out: list[tuple[int, int]] = []
        for i, layer in enumerate(layers):
            check_int(layer, f"layers[{i}]", low=0, high=L - 1)
            free = [h for h in range(H) if (layer, h) not in out]
            if not free:
                raise ValueError(f"layers lists layer {layer} more than H={H} times")
            out.append((layer, free[int(torch.randint(len(free), (1,), generator=g))]))
        return out
    n = _count(k, L * H, "k")
    return [(i // H, i % H) for i in torch.randperm(L * H, generator=g)[:n].tolist()]
