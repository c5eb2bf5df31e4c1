"""Imagine while Reasoning in Space: Multimodal Visualization-of-Thought — ICML 2025, P12: Hugging Face integration.

Li et al., ICML 2025 (arXiv 2501.07542; official code ``chengzu-li/MVoT``, whose trainer overrides
``transformers.Trainer.compute_loss`` and whose model is an Anole subclass of
``ChameleonForConditionalGeneration``). :class:`MVoTTrainer` trains any causal LM whose vocabulary holds an
image-token range with ``L_CE + λ L_D`` (works with a peft LoRA model as upstream: r = 8, α = 16 on
q/k/v/o plus ``modules_to_save=["lm_head"]``); :class:`ImageBlockLogitsProcessor` makes ``generate`` emit
image blocks of a fixed token count; :func:`build_mvot_llama` builds the random-init tiny Llama of the
small-scale reproduction. Needs the ``hf`` extra.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

try:
    import transformers
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "MVoT's Hugging Face trainer and logits processor need transformers: "
        "pip install 'icml25-generative-models[hf]'"
    ) from exc

from icml25.generative_models.mvot import MVoTLoss, as_token_tensor, image_block_mask
from icml25.kernels.checks import check_int

__all__ = ["ImageBlockLogitsProcessor", "MVoTTrainer", "build_mvot_llama"]


class ImageBlockLogitsProcessor(transformers.LogitsProcessor):
    """Inside an image block, masks non-image tokens and closes the block after ``n_tokens`` image tokens.

    A block is open when the last BOI of a row comes after its last EOI (the prompt may end with BOI, or the
    model may emit one). Masked scores are set to ``-inf``.
    """

    def __init__(self, image_token_ids: Tensor, boi_id: int, eoi_id: int, n_tokens: int):
        self.image_token_ids = as_token_tensor(image_token_ids, "image_token_ids", 1, floating=False).long()
        boi_id, eoi_id = check_int(boi_id, "boi_id", low=0), check_int(eoi_id, "eoi_id", low=0)
        n_tokens = check_int(n_tokens, "n_tokens", low=1)  # tokens per image
        self.boi_id, self.eoi_id, self.n_tokens = boi_id, eoi_id, n_tokens

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        allowed = image_block_mask(
            input_ids, scores.shape[-1], self.image_token_ids, self.boi_id, self.eoi_id, self.n_tokens
        )
        return scores.masked_fill(~allowed, float("-inf"))


class MVoTTrainer(transformers.Trainer):
    """``transformers.Trainer`` whose loss is :class:`~icml25.generative_models.mvot.MVoTLoss`.

    Pass ``mvot_loss=MVoTLoss(distance, image_token_ids, weight)``; batches need ``labels``. The parts of the
    last loss are kept in ``last_loss_parts`` (``ce``, ``discrepancy``) for logging.
    """

    def __init__(self, *args: Any, mvot_loss: MVoTLoss, **kwargs: Any):
        if not isinstance(mvot_loss, MVoTLoss):
            raise TypeError(f"mvot_loss must be an MVoTLoss, got {type(mvot_loss).__name__}")
        super().__init__(*args, **kwargs)
        self.mvot_loss = mvot_loss
        self.last_loss_parts: dict[str, float] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "labels" not in inputs:
            raise ValueError("inputs must contain 'labels' (token ids, -100 where unsupervised)")
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss_fn = self.mvot_loss.to(outputs.logits.device)
        parts = loss_fn(outputs.logits, labels)
        self.last_loss_parts = {k: float(v.detach()) for k, v in parts.items() if k != "loss"}
        return (parts["loss"], outputs) if return_outputs else parts["loss"]


def build_mvot_llama(vocab_size: int, hidden: int = 128, layers: int = 4, heads: int = 4, max_len: int = 64,
                     seed: int = 0, **config_kwargs: Any) -> Any:  # fmt: skip
    """A random-init ``transformers.LlamaForCausalLM`` over a text + image-token vocabulary."""
    for nm, v in (("vocab_size", vocab_size), ("hidden", hidden), ("layers", layers), ("heads", heads),
                  ("max_len", max_len)):  # fmt: skip
        check_int(v, nm, low=1)
    if hidden % heads:
        raise ValueError(f"hidden must be divisible by heads, got hidden={hidden}, heads={heads}")
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **config_kwargs,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.LlamaForCausalLM(cfg)
