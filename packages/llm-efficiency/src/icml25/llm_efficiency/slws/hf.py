"""Stochastic Layer-Wise Shuffle for Vision Mamba — ICML 2025, P13: the Hugging Face transformers integration.

:func:`apply_slws_hf` wraps the blocks of a transformers Mamba-family model (``MambaModel.layers``, or
``backbone.layers`` of ``MambaForCausalLM`` and of classifiers built on the backbone) with
:class:`~icml25.llm_efficiency.slws.StochasticLayerShuffle`. A ``MambaBlock`` keeps its residual inside, so
only the hidden states and the ``(B, L)`` padding mask are permuted; ``cache`` must be None while training
(transformers disables it in training mode unless ``use_cache=True`` is passed). In transformers 5 the
Mamba mixer runs a pure-torch scan when the ``mamba-ssm`` kernels are absent, so this works on CPU.

Requires the ``[hf]`` extra (``pip install 'icml25-llm-efficiency[hf]'``).
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from transformers import PreTrainedModel
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the transformers integration of SLWS needs transformers>=5.0: pip install 'icml25-llm-efficiency[hf]'"
    ) from err

from icml25.llm_efficiency.slws.shuffle import Schedule, apply_slws

__all__ = ["apply_slws_hf"]

_PATHS = ("layers", "backbone.layers", "model.layers")


def _find_layers(model: nn.Module) -> str | None:
    for path in _PATHS:
        owner: object = model
        for part in path.split("."):
            owner = getattr(owner, part, None)
        if isinstance(owner, nn.ModuleList):
            return path
    return None


def apply_slws_hf(
    model: PreTrainedModel,
    max_rate: float = 0.5,
    schedule: Schedule = "linear",
    *,
    per_sample: bool = False,
    keep_first: int = 0,
    generator: torch.Generator | None = None,
) -> PreTrainedModel:
    """SLWS on a transformers model's block list, in place (:func:`~icml25.llm_efficiency.slws.apply_slws`).

    Args:
        model: a ``transformers.PreTrainedModel`` whose blocks are a ``ModuleList`` at ``layers``,
            ``backbone.layers`` or ``model.layers`` (``MambaModel``, ``MambaForCausalLM``, ...).
        max_rate, schedule, per_sample, keep_first, generator: as
            :class:`~icml25.llm_efficiency.slws.StochasticLayerShuffle`.

    Returns:
        ``model``, with ``config.slws_max_rate`` set for the record.

    Warns:
        UserWarning: on a causal LM (``MambaForCausalLM``): the shuffle destroys autoregressive semantics.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    path = _find_layers(model)
    if path is None:
        raise ValueError(
            f"{type(model).__name__} has no block list at {', '.join(_PATHS)}; "
            "use apply_slws(model, layers_attr=...) with the path of its blocks"
        )
    apply_slws(
        model, path, max_rate, schedule, per_sample=per_sample, keep_first=keep_first, generator=generator
    )
    model.config.slws_max_rate = float(max_rate)
    return model
