"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: transformers integration (extra ``[hf]``).

Yang et al., ICML 2025 (official code ``chr26195/PENCIL``). transformers' ``generate`` has no hook that may
shorten the sequence, so the reduction runs as *reduce-and-resume*: :class:`ReturnStoppingCriteria` stops a
row when it emits ``[RETURN]``, φ is applied, and ``generate`` resumes from the reduced context with the
KV cache cropped to the kept prefix (:func:`pencil_hf_generate`). :func:`to_hf_tokenizer` turns a
:class:`~icml25.llm_efficiency.pencil.PencilVocab` into a word-level ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import torch

try:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "icml25.llm_efficiency.pencil's transformers integration needs transformers: "
        "pip install 'icml25-llm-efficiency[hf]'"
    ) from err

from icml25.kernels.hf_cache import cache_argument, crop_cache, output_cache
from icml25.llm_efficiency.pencil.reduction import PencilTokens, check_pencil_tokens, locate_redex
from icml25.llm_efficiency.pencil.vocab import EOS, PAD, PencilVocab

__all__ = ["ReturnStoppingCriteria", "pencil_hf_generate", "to_hf_tokenizer"]


class ReturnStoppingCriteria(transformers.StoppingCriteria):
    """Stop each row of ``generate`` once its last token is ``[RETURN]`` (a per-row boolean, transformers ≥ 4.39)."""

    def __init__(self, ret_id: int) -> None:
        if not isinstance(ret_id, numbers.Integral) or isinstance(ret_id, bool) or ret_id < 0:
            raise ValueError(f"ret_id must be a non-negative int token id, got {ret_id!r}")
        self.ret_id = int(ret_id)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return input_ids[:, -1] == self.ret_id


def to_hf_tokenizer(vocab: PencilVocab) -> transformers.PreTrainedTokenizerFast:
    """A whitespace word-level ``PreTrainedTokenizerFast`` with the ids of ``vocab`` (pad ``[PAD]``, eos ``[EOS]``)."""
    if not isinstance(vocab, PencilVocab):
        raise TypeError(f"vocab must be a PencilVocab, got {type(vocab).__name__}")
    core = Tokenizer(models.WordLevel(dict(vocab.stoi), unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS)


def pencil_hf_generate(
    model: Any,
    input_ids: torch.Tensor,
    tok: PencilTokens,
    eos_id: int,
    max_new_tokens: int,
    **generate_kwargs: Any,
) -> list[torch.Tensor]:
    """PENCIL decoding through ``model.generate``: generate until ``[RETURN]``, reduce, resume.

    ``input_ids``: ``(B, T)`` prompts (no padding) or one ``(T,)`` prompt; ``generate_kwargs`` go to
    ``generate`` (e.g. ``do_sample=False``). Rows are decoded one after another (a reduction changes each
    row's length differently). The KV cache survives a reduction: it is cropped to the kept context and
    only the spliced answer is re-encoded. Returns the final reduced sequence of each row (prompt included).
    """
    tok = check_pencil_tokens(tok)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be an int64 tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must have shape (B >= 1, T >= 1), got {tuple(input_ids.shape)}")
    if not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    for key in ("stopping_criteria", "cache", "past_key_values", "max_new_tokens", "eos_token_id"):
        if key in generate_kwargs:
            raise ValueError(f"generate_kwargs must not set {key!r}: pencil_hf_generate manages it")
    cache_kw = cache_argument(model)
    stop = transformers.StoppingCriteriaList([ReturnStoppingCriteria(tok.ret)])
    out = []
    for row in input_ids:
        ctx = row[None].to(model.device)
        cache = transformers.DynamicCache(config=model.config)
        budget = int(max_new_tokens)
        while budget > 0:
            before = ctx.shape[1]
            res = model.generate(
                input_ids=ctx,
                max_new_tokens=budget,
                eos_token_id=eos_id,
                pad_token_id=eos_id,
                stopping_criteria=stop,
                return_dict_in_generate=True,
                **{cache_kw: cache},
                **generate_kwargs,
            )
            ctx, cache = res.sequences, output_cache(res)
            budget -= ctx.shape[1] - before
            if ctx[0, -1].item() != tok.ret:
                break  # EOS or out of budget
            where = locate_redex(ctx[0].cpu().numpy(), tok)
            if where is None or isinstance(where, str):
                # an unmatched [RETURN]: warn and keep generating, as pencil_generate does
                warnings.warn(f"PENCIL reduction skipped: {where}", RuntimeWarning, stacklevel=2)
                continue
            c, s, r = where
            ids = ctx[0]
            ctx = torch.cat([ids[:c], ids[s + 1 : r], ids[r + 1 :]])[None]
            # generate feeds the uncached tail; keep at least one token to re-encode.
            crop_cache(cache, min(c, ctx.shape[1] - 1))
        out.append(ctx[0].cpu())
    return out
