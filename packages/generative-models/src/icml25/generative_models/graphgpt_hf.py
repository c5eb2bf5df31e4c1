"""GraphGPT: Generative Pre-trained Graph Eulerian Transformer — ICML 2025, P29: Hugging Face Llama models.

Zhao et al., ICML 2025 (official code ``alibaba/graph-gpt``, whose models are ``transformers`` Llama models).
:func:`build_graphgpt` builds a randomly initialised ``transformers.LlamaForCausalLM`` (NTP) or
``LlamaModel`` (SMTP: bidirectional through the explicit 4-D mask of :func:`bidirectional_mask`) for a
:class:`~icml25.generative_models.graphgpt.GraphTokenizer` vocabulary; ``GraphGPTModel(backend="hf")`` uses
it as its backbone. Needs the ``hf`` extra.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "GraphGPT's Hugging Face models need transformers: pip install 'icml25-generative-models[hf]'"
    ) from exc

from icml25.generative_models.graphgpt import SIZES
from icml25.kernels.checks import check_int

__all__ = ["bidirectional_mask", "build_graphgpt"]


def build_graphgpt(
    vocab_size: int,
    size: str | None = "tiny",
    *,
    causal: bool = True,
    hidden: int | None = None,
    layers: int | None = None,
    heads: int | None = None,
    intermediate: int | None = None,
    head: bool = True,
    **config_kwargs: Any,
) -> Any:
    """A random-init Llama model for a graph vocabulary.

    ``size`` names (hidden, layers, heads) in :data:`~icml25.generative_models.graphgpt.SIZES`
    (``"tiny"``, ``"mini"`` 256 x 4, ``"small"``, ``"base"`` 768 x 12); explicit ``hidden``/``layers``/
    ``heads`` override it. ``causal and head``: ``LlamaForCausalLM``; otherwise ``LlamaModel`` (call it with
    :func:`bidirectional_mask` for SMTP). ``config_kwargs`` go to ``transformers.LlamaConfig``.
    """
    vocab_size = check_int(vocab_size, "vocab_size", low=2)
    if size is not None and size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)} or None, got {size!r}")
    h, n_layers, n_heads = SIZES[size] if size is not None else (None, None, None)
    h, n_layers, n_heads = hidden or h, layers or n_layers, heads or n_heads
    if h is None or n_layers is None or n_heads is None:
        raise ValueError("size=None needs hidden, layers and heads")
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=h,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_heads,
        intermediate_size=intermediate or 4 * h,
        max_position_embeddings=config_kwargs.pop("max_position_embeddings", 1024),
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        tie_word_embeddings=False,
        **config_kwargs,
    )
    cfg._attn_implementation = "sdpa"
    if causal and head:
        return transformers.LlamaForCausalLM(cfg)
    return transformers.LlamaModel(cfg)


def bidirectional_mask(attention_mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive ``(B, 1, L, L)`` mask that makes a Llama model bidirectional: 0 where a query may attend
    a (non-padding) key, the dtype's minimum elsewhere; padding queries attend themselves."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must be a (B, L) tensor, got {getattr(attention_mask, 'shape', type(attention_mask))}"
        )
    B, L = attention_mask.shape
    ok = attention_mask.bool()[:, None, None, :].expand(B, 1, L, L) | torch.eye(L, dtype=torch.bool)
    return torch.zeros(B, 1, L, L, dtype=dtype).masked_fill(~ok, torch.finfo(dtype).min)
