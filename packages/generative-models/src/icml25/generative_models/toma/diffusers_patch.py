"""ToMA: Token Merge with Attention for Diffusion Models — ICML 2025, P26: the diffusers integration.

Wraps the attention processor of every ``BasicTransformerBlock.attn1`` (self-attention over image tokens)
of a diffusers model: merge with ToMA (:func:`icml25.generative_models.toma.toma_fns`), the original
processor on the merged tokens, unmerge. A forward pre-hook on the model records the input's spatial size
(to recover each block's grid) and advances the :class:`~icml25.generative_models.toma.ToMAState` step.
The official code (``WenboLuu/ToMA``, ``toma/patch.py``) patches Flux blocks by class swapping; processors
are diffusers' own extension point and keep the block code untouched. Requires
``pip install 'icml25-generative-models[diffusers]'``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

try:
    from diffusers.models.attention import BasicTransformerBlock
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "apply_toma needs diffusers: pip install 'icml25-generative-models[diffusers]'"
    ) from exc

from icml25.generative_models.toma import ToMAState, toma_fns

SUPPORTED = "diffusers BasicTransformerBlock (UNet2DConditionModel, Transformer2DModel, PixArt, DiT)"


def _root(model_or_pipe: Any) -> torch.nn.Module:
    for attr in ("unet", "transformer"):
        sub = getattr(model_or_pipe, attr, None)
        if isinstance(sub, torch.nn.Module):
            return sub
    if isinstance(model_or_pipe, torch.nn.Module):
        return model_or_pipe
    raise TypeError(
        f"model_or_pipe must be a diffusers model (torch.nn.Module) or a pipeline with .unet/.transformer "
        f"containing {SUPPORTED}; got {type(model_or_pipe).__name__}"
    )


class ToMAAttnProcessor:
    """Merge -> the original processor -> unmerge, for self-attention calls on ``[B, N, C]`` tokens."""

    def __init__(self, inner: Any, state: ToMAState, config: dict, model: torch.nn.Module) -> None:
        self.inner = inner
        self.state = state
        self.config = config
        self.model = model

    def _grid(self, N: int) -> tuple[int, int] | None:
        size = getattr(self.model, "_toma_input_hw", None)
        if size is not None:
            H0, W0 = size
            f = math.ceil(math.sqrt(H0 * W0 / N))
            h, w = math.ceil(H0 / f), math.ceil(W0 / f)
            if h * w == N:
                return h, w
        side = math.isqrt(N)
        return (side, side) if side * side == N else None

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        cfg = self.config
        plain = (
            encoder_hidden_states is not None
            or attention_mask is not None
            or hidden_states.ndim != 3
            or cfg["ratio"] == 0.0
            or hidden_states.shape[1] < max(cfg["min_tokens"], 1)
            or not self.state.merging()
        )
        hw = None if plain else self._grid(hidden_states.shape[1])
        if hw is None:
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)
        B, N, _ = hidden_states.shape
        t = math.isqrt(cfg["num_tiles"])
        while hw[0] % t or hw[1] % t:
            t -= 1
        if math.floor((hw[0] // t) * (hw[1] // t) * (1 - cfg["ratio"]) + 1e-9) < 1:
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)
        plan = self.state.get(
            (N, B, hidden_states.device),
            lambda: toma_fns(
                hidden_states.detach(), hw, ratio=cfg["ratio"], num_tiles=t * t, scale=cfg["scale"],
                backend=cfg["backend"],
            ),
        )  # fmt: skip
        merged = plan.merge(hidden_states)
        mask = None
        if cfg["proportional_attention"]:
            mask = plan.log_sizes()[:, None, :].to(hidden_states.dtype)  # [B, 1, D]: broadcast over queries
        out = self.inner(attn, merged, None, mask, *args, **kwargs)
        return plan.unmerge(out)


def _pre_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    sample = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states"))
    if isinstance(sample, torch.Tensor) and sample.ndim == 4:
        module._toma_input_hw = (int(sample.shape[-2]), int(sample.shape[-1]))
    state = module._toma_state
    if module._toma_calls:
        state.advance()
    module._toma_calls += 1


def apply(model_or_pipe: Any, state: ToMAState, config: dict) -> ToMAState:
    """Patch ``model_or_pipe`` (see :func:`icml25.generative_models.toma.apply_toma`)."""
    root = _root(model_or_pipe)
    blocks = [m for m in root.modules() if isinstance(m, BasicTransformerBlock)]
    if not blocks:
        raise TypeError(
            f"model_or_pipe has no supported block: apply_toma patches {SUPPORTED}; "
            f"{type(root).__name__} contains none"
        )
    remove(root)
    for block in blocks:
        attn = block.attn1
        attn._toma_original_processor = attn.processor
        attn.set_processor(ToMAAttnProcessor(attn.processor, state, config, root))
    root._toma_state = state
    root._toma_calls = 0
    root._toma_hook = root.register_forward_pre_hook(_pre_hook, with_kwargs=True)
    return state


def remove(model_or_pipe: Any) -> Any:
    """Restore the original processors and drop the hook; unpatched models are returned unchanged."""
    root = _root(model_or_pipe)
    for m in root.modules():
        orig = m.__dict__.pop("_toma_original_processor", None)
        if orig is not None:
            m.set_processor(orig)
    hook = root.__dict__.pop("_toma_hook", None)
    if hook is not None:
        hook.remove()
    for attr in ("_toma_state", "_toma_calls", "_toma_input_hw"):
        root.__dict__.pop(attr, None)
    return model_or_pipe
