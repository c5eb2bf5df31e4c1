"""A small random-init Llama causal LM, built offline: the toy model of P00, P44 and P51.

Todd et al.'s task vectors (P00, :class:`~icml25.interpretability.task_vectors_toy.ToyVLM`'s language model),
Wang et al.'s position-enhanced fine-tuning (P44, :func:`~icml25.interpretability.role_separation.pft_llama`)
and Yin & Steinhardt's ICL heads (P51, :func:`~icml25.interpretability.icl_heads_toy.tiny_llama`) each train
or probe a few-layer ``transformers.LlamaForCausalLM`` from scratch: RoPE, a SwiGLU MLP of width
``2 * hidden_size`` and full multi-head attention (as many key/value heads as query heads). What differs
between them (token ids, attention implementation, RoPE base, tied embeddings) passes through as
``LlamaConfig`` fields. Needs the ``[hf]`` extra (transformers, imported lazily).
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn

from icml25.kernels.checks import check_int
from icml25.kernels.rng import isolated_rng

__all__ = ["random_llama"]


def random_llama(
    vocab_size: int,
    hidden_size: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    *,
    max_position_embeddings: int = 256,
    seed: int | None = 0,
    hidden_size_name: str = "hidden_size",
    **config: Any,
) -> nn.Module:
    """A random-init ``transformers.LlamaForCausalLM`` (in training mode), built without any download.

    Args:
        vocab_size, hidden_size, n_layers, n_heads, max_position_embeddings: the model's size, each >= 1;
            ``hidden_size`` must be a multiple of ``2 * n_heads`` (RoPE rotates pairs of a head's dims).
        seed: the weights' seed, drawn with the global random state untouched; ``None`` draws them from the
            current global state (a caller that seeds several modules as one, e.g. ToyVLM's projection).
        hidden_size_name: what errors call ``hidden_size`` (a caller's own name for it, e.g. ``"d_model"``).
        **config: further ``LlamaConfig`` fields (``bos_token_id``, ``pad_token_id``, ``attn_implementation``,
            ``rope_theta``, ``tie_word_embeddings``, ...).
    """
    sizes = {
        "vocab_size": vocab_size,
        hidden_size_name: hidden_size,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "max_position_embeddings": max_position_embeddings,
    }
    for name, value in sizes.items():
        check_int(value, name, low=1)
    if hidden_size % (2 * n_heads):
        raise ValueError(
            f"{hidden_size_name} must be a multiple of 2 * n_heads = {2 * n_heads}, got {hidden_size}"
        )
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "random_llama needs transformers: pip install 'icml25-interpretability[hf]'"
        ) from err
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_heads,
        max_position_embeddings=max_position_embeddings, **config,
    )  # fmt: skip
    # isolated_rng(None) would restore the state on exit; a caller drawing more modules needs it advanced
    with isolated_rng(seed) if seed is not None else contextlib.nullcontext():
        return LlamaForCausalLM(cfg)
