"""RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding — ICML 2025, P03: the Hugging Face transformers integration.

:func:`rapid_generate` is a decoding method for transformers' ``generate(custom_generate=...)`` hook, so
RAPID runs from the usual call without monkey-patching ``GenerationMixin`` (the official code patches
``generate``/``_assisted_decoding`` of transformers 4.45.2, the version it pins)::

    out = target.generate(long_ids, custom_generate=rapid_generate, drafter=drafter,
                          rag_input_ids=rag_ids, gamma=10, eta=10.0, do_sample=True,
                          temperature=0.5, max_new_tokens=128)

``generate`` prepares the generation config, logits processors (temperature, top-k/top-p, penalties:
applied to target and drafter rows alike, as in the official code) and stopping criteria; RAPID's own
arguments (``drafter``, ``rag_input_ids``, ``gamma``, ``eta``, ``alpha``, ``residual``,
``confidence_threshold``, ``seed``, ``generator``) pass through. HF assisted generation cannot give the
drafter a different prompt, hence a custom decoding loop (:class:`~icml25.llm_efficiency.rapid.RapidGenerator`).
Batch size 1, no padding.

Requires the ``[hf]`` extra (``pip install 'icml25-llm-efficiency[hf]'``).
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from transformers import DynamicCache
    from transformers.generation.utils import GenerateDecoderOnlyOutput
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "RAPID's transformers integration needs transformers: pip install 'icml25-llm-efficiency[hf]'"
    ) from err

from icml25.llm_efficiency.rapid.decoding import RapidGenerator

__all__ = ["new_dynamic_cache", "rapid_generate"]


def new_dynamic_cache(model: Any) -> DynamicCache:
    """An empty ``DynamicCache`` for ``model`` (built from its config when the constructor takes one)."""
    config = getattr(model, "config", None)
    try:
        return DynamicCache(config=config) if config is not None else DynamicCache()
    except TypeError:  # transformers versions whose DynamicCache takes no config
        return DynamicCache()


def rapid_generate(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    *,
    drafter: Any = None,
    rag_input_ids: torch.Tensor | None = None,
    gamma: int = 10,
    eta: float = 10.0,
    alpha: float = 0.1,
    residual: str = "exact",
    confidence_threshold: float | None = 0.1,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | GenerateDecoderOnlyOutput:
    """RAPID as a transformers decoding method: ``model.generate(..., custom_generate=rapid_generate)``.

    ``model`` is the long-context target and ``input_ids`` its prompt; ``rag_input_ids`` is the RAG
    drafter's prompt (retrieved chunks + query); ``drafter=None`` self-speculates. ``do_sample``,
    ``max_new_tokens``/``max_length``, ``eos_token_id`` and ``return_dict_in_generate`` come from the
    generation config (greedy ``do_sample=False`` with ``eta=0`` reproduces the target's greedy output).
    Returns the sequences ``(1, prompt + new)`` or a ``GenerateDecoderOnlyOutput`` with ``sequences``.
    """
    if rag_input_ids is None:
        raise ValueError("rag_input_ids is required: the RAG drafter's prompt (retrieved chunks + query)")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("attention_mask: RAPID decodes one unpadded sequence; padding is not supported")
    if generation_config is None:
        generation_config = model.generation_config
    prompt_len = int(input_ids.shape[-1])
    max_length = generation_config.max_length
    if generation_config.max_new_tokens is not None:
        max_length = prompt_len + int(generation_config.max_new_tokens)
    max_new = int(max_length) - prompt_len
    if max_new < 1:
        sequences = input_ids
    else:
        eos = generation_config.eos_token_id
        rapid = RapidGenerator(
            model, drafter, gamma=gamma, eta=eta, alpha=alpha, residual=residual,
            confidence_threshold=confidence_threshold,
        )  # fmt: skip

        def stop(ids: torch.Tensor) -> bool:
            if stopping_criteria is None:
                return False
            return bool(torch.as_tensor(stopping_criteria(ids.to(input_ids.device), None)).any())

        out = rapid.generate(
            input_ids,
            rag_input_ids,
            max_new,
            do_sample=bool(generation_config.do_sample),
            seed=seed,
            generator=generator,
            eos_token_id=[] if eos is None else eos,
            logits_processor=logits_processor if logits_processor else None,
            stopping_criteria=stop,
        )
        new = out.tokens.to(input_ids.device)[None]
        sequences = torch.cat([input_ids, new], dim=1)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences
