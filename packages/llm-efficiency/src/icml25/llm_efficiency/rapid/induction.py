"""RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding — ICML 2025, P03: ``InductionLM``, an analytic copying language model.

A CPU-cheap stand-in for a long-context LLM whose distraction by long contexts is controllable (our
CPU-scale setting): the next-token distribution at position ``t`` copies the successors of earlier
occurrences of the current token ``x_t`` (an induction head), weighted by recency,

    m_t(v) ∝ Σ_{j < t, x_j = x_t, x_{j+1} = v} exp(−(t − j) / τ),      p_t = (1 − s)·m_t + s / V,

with ``m_t`` uniform when ``x_t`` did not occur before. Logits are ``log p_t``. It follows the calling
convention of a Hugging Face causal LM as :class:`~icml25.llm_efficiency.rapid.RapidGenerator` uses it:
``model(input_ids=..., cache=..., use_cache=True, logits_to_keep=...)`` returning an object with
``.logits`` ``(batch, positions, vocab)``, with a croppable cache from :meth:`InductionLM.new_cache`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["InductionCache", "InductionLM"]


class InductionCache:
    """The "KV cache" of :class:`InductionLM`: the token ids seen so far, ``(batch, length)``."""

    def __init__(self) -> None:
        self.tokens: torch.Tensor | None = None

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.tokens is None else int(self.tokens.shape[1])

    def crop(self, tokens_to_remove: int) -> None:
        """Remove ``|tokens_to_remove|`` tokens from the end (transformers ≥ 5 convention: pass ``-n``)."""
        n = abs(int(tokens_to_remove))
        if n > self.get_seq_length():
            raise ValueError(
                f"tokens_to_remove must be at most the cache length {self.get_seq_length()}, got {n}"
            )
        if n and self.tokens is not None:
            self.tokens = self.tokens[:, : self.tokens.shape[1] - n]


@dataclass
class InductionOutput:
    """Output of :class:`InductionLM`: ``logits`` ``(batch, positions, vocab)`` (float32)."""

    logits: torch.Tensor


class InductionLM(nn.Module):
    """Analytic induction-head ("copying") language model (see the module docstring).

    Args:
        vocab_size: ``V``.
        tau: recency scale ``τ`` of the match weights (tokens).
        smoothing: ``s ∈ (0, 1)``, mass spread uniformly over the vocabulary.
    """

    def __init__(self, vocab_size: int, tau: float = 10.0, smoothing: float = 1e-3) -> None:
        super().__init__()
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
        if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not (0 < tau < math.inf):
            raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
        if isinstance(smoothing, bool) or not isinstance(smoothing, numbers.Real) or not (0 < smoothing < 1):
            raise ValueError(f"smoothing must be in (0, 1), got {smoothing!r}")
        self.vocab_size, self.tau, self.smoothing = int(vocab_size), float(tau), float(smoothing)
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)

    @property
    def device(self) -> torch.device:
        return self._anchor.device

    def new_cache(self) -> InductionCache:
        """An empty cache for incremental decoding."""
        return InductionCache()

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: InductionCache | None = None,
        use_cache: bool = True,
        logits_to_keep: int = 0,
        **_: object,
    ) -> InductionOutput:
        """Logits for the positions of ``input_ids`` (the last ``logits_to_keep`` of them when > 0).

        ``input_ids``: ``(batch, n)`` int64 ids in ``[0, vocab_size)``; with a ``cache``, the ids extend the
        cached ones (appended when ``use_cache``).
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("input_ids must be an int64 tensor of token ids")
        if input_ids.ndim != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must have shape (batch >= 1, n >= 1), got {tuple(input_ids.shape)}")
        ids = input_ids.to(torch.int64)
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"input_ids must be in [0, {self.vocab_size})")
        past = None if cache is None else cache.tokens
        if past is not None and past.shape[0] != ids.shape[0]:
            raise ValueError(f"input_ids batch {ids.shape[0]} differs from the cache's {past.shape[0]}")
        seq = ids if past is None else torch.cat([past, ids.to(past.device)], dim=1)
        if cache is not None and use_cache:
            cache.tokens = seq
        n, total = ids.shape[1], seq.shape[1]
        keep = n if not logits_to_keep else min(int(logits_to_keep), n)
        return InductionOutput(self._logits(seq, total - keep, total))

    def _logits(self, seq: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """``log p_t`` for positions ``t ∈ [lo, hi)`` of ``seq`` ``(batch, total)``."""
        batch, vocab = seq.shape[0], self.vocab_size
        if hi <= 1:  # only the first position: nothing occurred before
            return torch.full((batch, hi - lo, vocab), -math.log(vocab), device=seq.device)
        t = torch.arange(lo, hi, device=seq.device)
        j = torch.arange(hi - 1, device=seq.device)  # candidate matches j < t (successor j + 1 ≤ t)
        match = (seq[:, None, j] == seq[:, t, None]) & (j[None, None, :] < t[None, :, None])
        logw = torch.where(match, -(t[:, None] - j[None, :]).double() / self.tau, -math.inf)
        top = logw.amax(dim=-1, keepdim=True)
        w = torch.where(match, torch.exp(logw - torch.where(torch.isfinite(top), top, 0.0)), 0.0).float()
        rows = hi - lo
        scores = torch.zeros(batch, rows, vocab, device=seq.device)
        scores.scatter_add_(2, seq[:, j + 1][:, None, :].expand(-1, rows, -1), w)
        total = scores.sum(dim=-1, keepdim=True)  # >= 1 where x_t occurred before (the top weight is 1)
        m = torch.where(total > 0, scores / total.clamp_min(1.0), 1.0 / vocab)
        return torch.log((1 - self.smoothing) * m + self.smoothing / vocab)
