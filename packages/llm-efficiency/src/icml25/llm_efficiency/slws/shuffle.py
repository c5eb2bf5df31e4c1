"""Stochastic Layer-Wise Shuffle for Vision Mamba — ICML 2025, P13: the layer-wise shuffle and its depth schedule.

SLWS (Huang et al., "Stochastic Layer-Wise Shuffle for Improving Vision Mamba Training", ICML 2025,
arXiv 2408.17081; official code ``huangzizheng01/ShuffleMamba``, ``models_shuffle.py``: ``shuffle_forward``
and the ``ssr`` schedule of ``VisionMamba``) is a training-only regulariser for token-sequence models: in
training mode, layer ``l`` of ``N`` is run, with probability ``p_l = P · l / (N - 1)``, on a randomly
permuted token sequence, and its outputs are put back in the original order. Nothing changes in eval mode.

* :func:`linear_shuffle_schedule` — ``p_l = linspace(0, P, N)`` (the official ``torch.linspace(0, ssr, depth)``).
* :func:`shuffle_forward` — one layer call with the shuffle: one Bernoulli(``prob``) draw per call shared
  by the batch; on success one permutation ``π`` of the ``L`` tokens shared by the batch (official), or one
  per sample (``per_sample=True``, a variant); every tensor argument of shape ``(B, L, ...)`` (the hidden
  states, a separate residual stream, a padding mask) is gathered with ``π`` and every output of shape
  ``(B, L, ...)`` is gathered back with ``argsort(π)``.
* :class:`ShuffledLayer` — a module that wraps one layer with its probability;
  :class:`StochasticLayerShuffle` — an ``nn.ModuleList`` of wrapped layers (drop-in for a model's block list);
  :func:`apply_slws` — patch a model's block list in place (Vision Mamba, timm ViT ``blocks``, Hugging Face
  ``MambaModel.layers``, any stack of sequence-preserving ``(B, L, d) -> (B, L, d)`` blocks).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from icml25.kernels.checks import check_float, check_int

__all__ = [
    "ShuffledLayer",
    "StochasticLayerShuffle",
    "apply_slws",
    "constant_shuffle_schedule",
    "linear_shuffle_schedule",
    "shuffle_forward",
]

_CACHE_KWARGS = ("inference_params", "cache", "cache_params", "past_key_values", "past_key_value")
Schedule = str | Sequence[float] | Callable[[int, float], Sequence[float]]


# ---------------------------------------------------------------------------------------- validation
def _check_generator(generator: object) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


# ------------------------------------------------------------------------------------------ schedules
def linear_shuffle_schedule(depth: int, max_rate: float) -> list[float]:
    """SLWS's layer-wise probabilities ``p_l = max_rate · l / (depth - 1)``, ``l = 0..depth-1``.

    The official ``torch.linspace(0, ssr, depth)``: the first layer never shuffles, the last shuffles with
    probability ``max_rate`` (the paper writes ``(l / L) · P``; the endpoints differ by one index).
    ``depth = 1`` gives ``[0.0]`` (linspace's first point).

    Args:
        depth: number of layers N ≥ 1.
        max_rate: the maximum shuffle rate P in [0, 1] (official ``--ssr``; 0.5 for ShuffleMamba-B).
    """
    depth = check_int(depth, "depth", low=1)
    max_rate = check_float(max_rate, "max_rate", low=0, high=1)
    return [float(p) for p in torch.linspace(0.0, max_rate, depth, dtype=torch.float64)]


def constant_shuffle_schedule(depth: int, max_rate: float) -> list[float]:
    """``p_l = max_rate`` in every layer (the paper's constant-rate ablation). Arguments as
    :func:`linear_shuffle_schedule`."""
    depth = check_int(depth, "depth", low=1)
    return [check_float(max_rate, "max_rate", low=0, high=1)] * depth


_SCHEDULES = {"linear": linear_shuffle_schedule, "constant": constant_shuffle_schedule}


def _resolve_schedule(schedule: object, depth: int, max_rate: float) -> list[float]:
    if isinstance(schedule, str):
        if schedule not in _SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(_SCHEDULES)} or a callable, got {schedule!r}")
        return _SCHEDULES[schedule](depth, max_rate)
    if callable(schedule):
        probs = list(schedule(depth, max_rate))
    elif isinstance(schedule, Sequence) and not isinstance(schedule, (str, bytes)):
        probs = list(schedule)
    else:
        raise TypeError(
            "schedule must be 'linear', 'constant', a sequence of probabilities or a callable "
            f"(depth, max_rate) -> probabilities, got {type(schedule).__name__}"
        )
    if len(probs) != depth:
        raise ValueError(f"schedule must give one probability per layer ({depth}), got {len(probs)}")
    return [check_float(p, f"schedule[{i}]", low=0, high=1) for i, p in enumerate(probs)]


# -------------------------------------------------------------------------------------- the operation
def _draw(prob: float, generator: torch.Generator | None) -> bool:
    """The official ``torch.rand(1) < prob``: one draw per layer call, shared by the batch."""
    if prob <= 0.0:
        return False
    return bool(torch.rand((), generator=generator) < prob)


def _permutation(
    B: int, L: int, keep_first: int, per_sample: bool, generator: torch.Generator | None
) -> torch.Tensor:
    """``π [B, L]`` (int64, CPU): ``keep_first`` leading tokens fixed, the rest permuted."""
    m = L - keep_first
    if per_sample:
        tail = torch.argsort(torch.rand(B, m, generator=generator), dim=1)
    else:
        tail = torch.randperm(m, generator=generator).expand(B, m)
    head = torch.arange(keep_first).expand(B, keep_first)
    return torch.cat([head, tail + keep_first], dim=1)


def _gather(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[b, index[b]]`` along dim 1 for a ``(B, L, ...)`` tensor."""
    idx = index.to(t.device).reshape(*index.shape, *([1] * (t.ndim - 2))).expand(t.shape)
    return torch.gather(t, 1, idx)


def _is_seq(t: object, B: int, L: int) -> bool:
    return isinstance(t, torch.Tensor) and t.ndim >= 2 and tuple(t.shape[:2]) == (B, L)


def _restore(out: Any, inv: torch.Tensor, B: int, L: int, layer: nn.Module) -> Any:
    if isinstance(out, torch.Tensor):
        if out.ndim >= 2 and out.shape[0] == B and out.shape[1] != L:
            raise ValueError(
                f"SLWS requires sequence-preserving layers: {type(layer).__name__} returned a tensor of shape "
                f"{tuple(out.shape)} for an input of {L} tokens (dimension 1 must stay L = {L})"
            )
        return _gather(out, inv) if _is_seq(out, B, L) else out
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_restore(o, inv, B, L, layer) for o in out)
    if isinstance(out, list):
        return [_restore(o, inv, B, L, layer) for o in out]
    return out


def shuffle_forward(
    layer: Callable[..., Any],
    x: torch.Tensor,
    *args: Any,
    prob: float,
    training: bool,
    residual: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    per_sample: bool = False,
    keep_first: int = 0,
    restore: bool = True,
    **kwargs: Any,
) -> Any:
    """Call ``layer`` on a randomly permuted token sequence and put its outputs back in order.

    In training mode, with probability ``prob`` (one draw per call, shared by the batch), a permutation
    ``π`` of the ``L`` tokens is drawn (one for the batch, as the official ``shuffle_forward``, or one per
    sample); ``x``, ``residual`` and every other tensor argument of shape ``(B, L, ...)`` are gathered with
    ``π``; ``layer(x[π], *args, residual=residual[π], **kwargs)`` runs (``residual=`` only when given, the
    pre-norm Mamba block API ``(hidden, residual) -> (hidden, residual)``); and every returned tensor of
    shape ``(B, L, ...)`` (also inside a returned tuple/list) is gathered back with ``argsort(π)``. Without
    a draw, or when ``training`` is False, it is exactly ``layer(x, *args, [residual=residual,] **kwargs)``.

    Args:
        layer: a sequence-preserving callable, ``(B, L, d) -> (B, L, d)`` (or a tuple of such tensors).
        x: ``(B, L, d)`` token sequence (floating point; the class token is shuffled like any token).
        prob: shuffle probability in [0, 1] for this layer.
        training: apply the shuffle (pass ``module.training``); False runs the layer unchanged.
        residual: the separate ``(B, L, d)`` residual stream of pre-norm Mamba blocks, or None.
        generator: the source of the Bernoulli draw and the permutation (CPU generator); None uses torch's
            global generator, like dropout.
        per_sample: one independent permutation per sample (not the official behaviour).
        keep_first: pin the first ``keep_first`` tokens (e.g. 1 for a class token at index 0; not official).
        restore: put the outputs back in order (True). False is the broken variant the tests use to show
            that forgetting the restoration fails the reproduction; never use it for training.
        args, kwargs: passed to ``layer``; tensors of shape ``(B, L, ...)`` are permuted too.

    Returns:
        What ``layer`` returns, in the original token order.

    Raises:
        ValueError: ``x`` not ``(B, L, d)`` with ``d >= 1``; ``keep_first >= L``; a layer output whose dimension 1 is not
            ``L`` (SLWS requires sequence-preserving layers); a cache/incremental-inference argument
            (``inference_params``, ``cache``, ``past_key_values``...) that is not None while training.
        TypeError: wrong argument types.

    ``L = 1`` (or ``L - keep_first <= 1``) has nothing to permute: the layer runs unchanged, with a
    warning when the draw would have shuffled.
    """
    if not callable(layer):
        raise TypeError(f"layer must be a callable module, got {type(layer).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor (B, L, d), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor (B, L, d), got dtype {x.dtype}")
    if x.ndim != 3:
        raise ValueError(f"x must be a (B, L, d) token sequence, got shape {tuple(x.shape)}")
    if x.shape[2] == 0:
        raise ValueError(f"x must have d >= 1 features per token (B, L, d), got shape {tuple(x.shape)}")
    prob = check_float(prob, "prob", low=0, high=1)
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {training!r}")
    if not isinstance(per_sample, bool):
        raise TypeError(f"per_sample must be a bool, got {per_sample!r}")
    if not isinstance(restore, bool):
        raise TypeError(f"restore must be a bool, got {restore!r}")
    keep_first = check_int(keep_first, "keep_first", low=0)
    _check_generator(generator)
    B, L, _ = x.shape
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError(
                f"residual must be a torch.Tensor (B, L, d) or None, got {type(residual).__name__}"
            )
        if tuple(residual.shape[:2]) != (B, L) or residual.ndim != 3:
            raise ValueError(
                f"residual must have the (B, L) = {(B, L)} of x and 3 dims, got shape {tuple(residual.shape)}"
            )
        kwargs = {**kwargs, "residual": residual}
    if training and L > 0 and keep_first >= L:
        raise ValueError(f"keep_first must be < L = {L} (the sequence length, x.shape[1]), got {keep_first}")
    if training:
        for name in _CACHE_KWARGS:
            if kwargs.get(name) is not None:
                raise ValueError(
                    f"{name} is not None while training: SLWS permutes the token order, which an incremental "
                    "(cached) inference path cannot follow; pass no cache in training mode"
                )
    if not training or not _draw(prob, generator):
        return layer(x, *args, **kwargs)
    if L - keep_first <= 1:
        warnings.warn(
            f"SLWS: a sequence of L = {L} tokens (keep_first = {keep_first}) has nothing to permute; "
            "the layer runs unchanged",
            stacklevel=2,
        )
        return layer(x, *args, **kwargs)
    perm = _permutation(B, L, keep_first, per_sample, generator)
    inv = torch.argsort(perm, dim=1)

    def fwd(t: Any) -> Any:
        return _gather(t, perm) if _is_seq(t, B, L) else t

    out = layer(fwd(x), *[fwd(a) for a in args], **{k: fwd(v) for k, v in kwargs.items()})
    if not restore:
        return _restore(out, torch.arange(L).expand(B, L), B, L, layer)  # shape checks only
    return _restore(out, inv, B, L, layer)


# ------------------------------------------------------------------------------------------- modules
class ShuffledLayer(nn.Module):
    """One layer wrapped with SLWS: ``forward(x, *args, **kw)`` is :func:`shuffle_forward` with
    ``prob`` and ``training = self.training`` (identity wrapper in eval mode).

    Args:
        layer: the wrapped sequence-preserving module (kept as ``self.layer``).
        prob: this layer's shuffle probability in [0, 1].
        per_sample, keep_first, generator, restore: as :func:`shuffle_forward`.
    """

    def __init__(
        self,
        layer: nn.Module,
        prob: float,
        *,
        per_sample: bool = False,
        keep_first: int = 0,
        generator: torch.Generator | None = None,
        restore: bool = True,
    ) -> None:
        if not isinstance(layer, nn.Module):
            raise TypeError(f"layer must be an nn.Module, got {type(layer).__name__}")
        if isinstance(layer, ShuffledLayer):
            raise ValueError("layer is already wrapped by SLWS (a ShuffledLayer); do not wrap it twice")
        prob = check_float(prob, "prob", low=0, high=1)
        if not isinstance(per_sample, bool):
            raise TypeError(f"per_sample must be a bool, got {per_sample!r}")
        if not isinstance(restore, bool):
            raise TypeError(f"restore must be a bool, got {restore!r}")
        check_int(keep_first, "keep_first", low=0)
        _check_generator(generator)
        super().__init__()
        self.layer = layer
        self.prob = prob
        self.per_sample = per_sample
        self.keep_first = keep_first
        self.generator = generator
        self.restore = restore

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return shuffle_forward(
            self.layer, x, *args, prob=self.prob, training=self.training, generator=self.generator,
            per_sample=self.per_sample, keep_first=self.keep_first, restore=self.restore, **kwargs,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"prob={self.prob:.4g}, per_sample={self.per_sample}, keep_first={self.keep_first}"


class StochasticLayerShuffle(nn.ModuleList):
    """A model's block list with SLWS: an ``nn.ModuleList`` of :class:`ShuffledLayer`, one per block, with
    probabilities from ``schedule``; iterating it (``for blk in self.layers: x = blk(x)``) works unchanged.

    Args:
        layers: the blocks (an ``nn.ModuleList`` or any sequence of modules), depth N ≥ 1.
        max_rate: the maximum shuffle rate P in [0, 1] (official ``--ssr``; 0.5 for ShuffleMamba-B).
        schedule: ``"linear"`` (SLWS, ``linspace(0, P, N)``), ``"constant"`` (P everywhere), a sequence of
            N probabilities, or a callable ``(N, P) -> N probabilities``.
        per_sample, keep_first, generator, restore: as :func:`shuffle_forward` (one generator shared by
            every layer).

    Attributes:
        probs: the per-layer probabilities.
    """

    def __init__(
        self,
        layers: Sequence[nn.Module] | nn.ModuleList,
        max_rate: float = 0.5,
        schedule: Schedule = "linear",
        *,
        per_sample: bool = False,
        keep_first: int = 0,
        generator: torch.Generator | None = None,
        restore: bool = True,
    ) -> None:
        if isinstance(layers, nn.Module) and not isinstance(layers, (nn.ModuleList, nn.Sequential)):
            raise TypeError(
                f"layers must be an nn.ModuleList or a sequence of modules, got {type(layers).__name__}"
            )
        if not isinstance(layers, (nn.ModuleList, nn.Sequential, Sequence)) or isinstance(
            layers, (str, bytes)
        ):
            raise TypeError(
                f"layers must be an nn.ModuleList or a sequence of modules, got {type(layers).__name__}"
            )
        blocks = list(layers)
        if not blocks:
            raise ValueError("layers must hold at least one module, got an empty list")
        for i, blk in enumerate(blocks):
            if not isinstance(blk, nn.Module):
                raise TypeError(f"layers[{i}] must be an nn.Module, got {type(blk).__name__}")
            if isinstance(blk, ShuffledLayer):
                raise ValueError(f"layers[{i}] is already wrapped by SLWS; do not apply it twice")
        max_rate = check_float(max_rate, "max_rate", low=0, high=1)
        probs = _resolve_schedule(schedule, len(blocks), max_rate)
        wrapped = [
            ShuffledLayer(blk, p, per_sample=per_sample, keep_first=keep_first, generator=generator, restore=restore)
            for blk, p in zip(blocks, probs)
        ]  # fmt: skip
        super().__init__(wrapped)
        self.max_rate = max_rate
        self.probs = probs

    def unwrap(self) -> nn.ModuleList:
        """The original blocks, as a plain ``nn.ModuleList`` (the same module objects)."""
        return nn.ModuleList([blk.layer for blk in self])


def _is_causal_lm(model: nn.Module) -> bool:
    name = type(model).__name__
    config = getattr(model, "config", None)
    return (
        "CausalLM" in name
        or "LMHead" in name
        or callable(getattr(model, "generate", None))
        or bool(getattr(config, "is_decoder", False))
    )


def apply_slws(
    model: nn.Module,
    layers_attr: str = "layers",
    max_rate: float = 0.5,
    schedule: Schedule = "linear",
    *,
    per_sample: bool = False,
    keep_first: int = 0,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Patch ``model``'s block list in place with :class:`StochasticLayerShuffle` and return ``model``.

    Works on any model whose blocks map ``(B, L, d) -> (B, L, d)`` and are called in a loop over an
    ``nn.ModuleList`` attribute (or chained by an ``nn.Sequential``, which stays one): :class:`~icml25.llm_efficiency.slws.VimTiny` (``"layers"``), timm ViT
    (``"blocks"``), Hugging Face ``MambaModel`` (``"layers"``) or ``MambaForCausalLM`` / a classifier
    around it (``"backbone.layers"``). A no-op in ``model.eval()``; composes with drop-path inside blocks.

    Args:
        model: the model (modified in place).
        layers_attr: dotted path of the block list, e.g. ``"layers"``, ``"blocks"``, ``"backbone.layers"``.
        max_rate, schedule, per_sample, keep_first, generator: as :class:`StochasticLayerShuffle`.

    Warns:
        UserWarning: the model looks like a causal LM (``generate``, ``*CausalLM``, ``is_decoder``): the
        shuffle destroys autoregressive semantics (a token's causal scan then sees later tokens).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(layers_attr, str) or not layers_attr:
        raise TypeError(f"layers_attr must be a non-empty dotted attribute path (str), got {layers_attr!r}")
    *parents, leaf = layers_attr.split(".")
    owner: Any = model
    for part in parents:
        if not hasattr(owner, part):
            raise ValueError(f"layers_attr {layers_attr!r}: {type(owner).__name__} has no attribute {part!r}")
        owner = getattr(owner, part)
    layers = getattr(owner, leaf, None)
    if not isinstance(layers, (nn.ModuleList, nn.Sequential)):
        raise ValueError(
            f"layers_attr {layers_attr!r} must name an nn.ModuleList of blocks on {type(model).__name__}, "
            f"got {type(layers).__name__}"
        )
    if isinstance(layers, StochasticLayerShuffle):
        raise ValueError(f"{layers_attr!r} is already wrapped by SLWS; do not apply it twice")
    wrapped = StochasticLayerShuffle(
        layers, max_rate, schedule, per_sample=per_sample, keep_first=keep_first, generator=generator
    )
    if _is_causal_lm(model):
        warnings.warn(
            f"SLWS on {type(model).__name__}, which looks like a causal language model: shuffling the token "
            "order destroys autoregressive semantics (use it for non-causal sequence tasks such as vision)",
            stacklevel=2,
        )
    # an nn.Sequential (timm's ViT ``blocks``) chains its blocks itself: keep it one, of wrapped blocks
    setattr(owner, leaf, nn.Sequential(*wrapped) if isinstance(layers, nn.Sequential) else wrapped)
    return model
