"""RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding — ICML 2025, P03: the decoding loop.

:class:`RapidGenerator` runs RAPID over two causal LMs with a shared vocabulary: the *target* reads the
long prompt (long context + query), the *RAG drafter* a short one (retrieved chunks + query). Each round
the drafter samples up to ``γ`` tokens on its own short KV cache (as the official code, it stops early after
a token it drafted with probability below ``confidence_threshold``), the target scores them in one forward
pass on the long cache, and :func:`~icml25.llm_efficiency.rapid.rapid_verify` accepts a prefix against the
retrieval-augmented target ``p̂`` and adds one token; both caches are cropped back to the accepted prefix.
``drafter=None`` is self-speculation (the target's weights with a separate cache on the RAG prompt).

Models: any Hugging Face ``PreTrainedModel`` causal LM (a ``DynamicCache`` per model, cropped with
``Cache.crop(-n)``, which means "remove ``n`` tokens" in both transformers 4.x and ≥ 5; needs the ``[hf]``
extra), or any module following that calling convention with a ``new_cache()`` method (e.g.
:class:`~icml25.llm_efficiency.rapid.InductionLM`). No monkey-patching of ``generate``: for
``model.generate(...)`` use :func:`icml25.llm_efficiency.rapid.rapid_generate` (``custom_generate=``).

Batch size 1 (as the official implementation). Cache invariant: after every round each model's cache
holds its sequence except the last token, which is fed with the next round's drafts.
"""

from __future__ import annotations

import inspect
import numbers
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from icml25.kernels.checks import check_float, check_int
from icml25.kernels.hf_cache import cache_argument
from icml25.kernels.rng import make_generator
from icml25.llm_efficiency.rapid.sampling import ALPHA_RANGE, ETA_RANGE, RESIDUALS, rapid_verify, sample_token

__all__ = ["RapidGenerator", "RapidOutput"]

Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class RapidOutput:
    """Result of :meth:`RapidGenerator.generate`.

    Attributes:
        tokens: the generated token ids, 1-D int64 (EOS included when generation stopped on it).
        accepted_per_round: accepted drafts per round (``≤ γ``).
        drafted_per_round: drafted tokens per round.
        target_calls: target forward passes after the prefill (one per round; target-only decoding needs
            one per token).
        drafter_calls: drafter forward passes after its prefill.
        wall_time: seconds spent in :meth:`~RapidGenerator.generate`.
        stopped_at_eos: whether generation ended on an EOS token.
    """

    tokens: torch.Tensor
    accepted_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    target_calls: int = 0
    drafter_calls: int = 0
    wall_time: float = 0.0
    stopped_at_eos: bool = False

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens over all rounds (0.0 when nothing was drafted)."""
        drafted = sum(self.drafted_per_round)
        return sum(self.accepted_per_round) / drafted if drafted else 0.0

    @property
    def target_calls_per_token(self) -> float:
        """Target forward passes per generated token (1.0 for target-only decoding; 0.0 for no tokens)."""
        return self.target_calls / len(self.tokens) if len(self.tokens) else 0.0


def _vocab_size(model: Any) -> int | None:
    v = getattr(model, "vocab_size", None)
    if isinstance(v, int):
        return v
    v = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(v, int):
        return v
    get = getattr(model, "get_output_embeddings", None)
    emb = get() if callable(get) else None
    return int(emb.weight.shape[0]) if emb is not None and hasattr(emb, "weight") else None


def _model_device(model: Any) -> torch.device:
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return param.device if param is not None else torch.device("cpu")


class _Session:
    """One model's running state: its cache and the exact ids the cache holds (``fed``)."""

    def __init__(self, model: Any, vocab: int) -> None:
        self.model, self.vocab = model, vocab
        if hasattr(model, "new_cache"):
            self.cache = model.new_cache()
        else:
            from icml25.llm_efficiency.rapid.hf import new_dynamic_cache

            self.cache = new_dynamic_cache(model)
        self.cache_kw = cache_argument(model)
        params = inspect.signature(model.forward).parameters
        has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self.keep_kw = "logits_to_keep" in params or has_var_kw
        self.device = _model_device(model)
        self.fed: list[int] = []
        self.synced = 0  # fed[:synced] is known to be a prefix of the sequence
        self.calls = 0

    def feed(self, ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Run the model on ``ids`` after the cached ones; float32 logits ``(len(ids), vocab)``."""
        x = torch.tensor([list(ids)], dtype=torch.int64, device=self.device)
        kwargs: dict[str, Any] = {"input_ids": x, self.cache_kw: self.cache, "use_cache": True}
        if last_only and self.keep_kw:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        self.fed += list(ids)
        logits = out.logits[0].float()
        if logits.shape[-1] < self.vocab:
            raise ValueError(
                f"the model returned {logits.shape[-1]} logits per token, expected >= {self.vocab}"
            )
        return logits[:, : self.vocab]

    def rollback(self, sequence: Sequence[int]) -> None:
        """Crop the cache to the longest common prefix of what it holds and ``sequence``."""
        keep, limit = self.synced, min(len(self.fed), len(sequence))
        while keep < limit and self.fed[keep] == sequence[keep]:
            keep += 1
        keep = min(keep, len(sequence) - 1)  # the last token is always fed with the next round
        if keep < len(self.fed):
            self.cache.crop(-(len(self.fed) - keep))
            del self.fed[keep:]
        self.synced = keep


def _check_ids(ids: object, name: str) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an integer (int64) tensor of token ids, got dtype {ids.dtype}")
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise ValueError(
                f"{name} must hold one sequence (batch size 1, as the official implementation); got shape "
                f"{tuple(ids.shape)}: loop over the batch"
            )
        ids = ids[0]
    if ids.ndim != 1:
        raise ValueError(f"{name} must have shape (length,) or (1, length), got shape {tuple(ids.shape)}")
    if ids.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one token, got an empty sequence")
    return ids


def _eos_set(eos_token_id: object, model: Any) -> set[int]:
    if eos_token_id is None:
        for holder in (getattr(model, "generation_config", None), getattr(model, "config", None)):
            eos = getattr(holder, "eos_token_id", None)
            if eos is not None:
                eos_token_id = eos
                break
        else:
            raise ValueError(
                "eos_token_id: the target model defines no EOS token; pass eos_token_id=<id or list of ids>, or "
                "eos_token_id=[] to always generate max_new_tokens tokens"
            )
    ids = [eos_token_id] if isinstance(eos_token_id, numbers.Integral) else eos_token_id
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1).tolist()
    if isinstance(ids, bool) or not isinstance(ids, (list, tuple, set)):
        raise TypeError(
            f"eos_token_id must be an int, a list of ints or None, got {type(eos_token_id).__name__}"
        )
    for e in ids:
        if isinstance(e, bool) or not isinstance(e, numbers.Integral) or e < 0:
            raise ValueError(f"eos_token_id must hold non-negative ints, got {eos_token_id!r}")
    return {int(e) for e in ids}


class RapidGenerator:
    """RAPID decoding: a RAG drafter proposes, the long-context target verifies against ``p̂``.

    Args:
        target: the long-context model (HF causal LM or the same calling convention).
        drafter: the RAG drafter; None = self-speculation with the target's weights (separate cache).
        gamma: the most drafted tokens per round ``γ ≥ 1`` (official examples: 10).
        confidence_threshold: the official stop rule (transformers' ``ConfidenceCriteria``, which the official
            code turns on for the drafter): a round's drafting stops after a drafted token whose probability
            under the drafter's processed distribution is below this value (that token is still verified).
            Default 0.1, the official LongBench script's ``assistant_confidence_threshold``; ``None`` drafts
            exactly ``γ`` tokens every round (this module's rule before the alignment).
        eta: strength ``η ≥ 0`` of the retrieval-augmented target (``0``: standard speculative decoding,
            the output is distributed as the target's; README: 10 (5–50); official ``generate`` default 1).
        alpha: truncation ``α ∈ (0, 1]`` of the correction (official 0.1).
        residual: ``"exact"`` or ``"official"`` (see :func:`~icml25.llm_efficiency.rapid.rapid_verify`).
        tokenizer, drafter_tokenizer: optional; when both are given their vocabularies must be identical (no
            token translation). With ``tokenizer`` alone, models whose output layers are padded past
            ``len(tokenizer)`` (e.g. Qwen sizes) are compared on the tokenizer's ids.
        verify: the verification rule, a callable with :func:`rapid_verify`'s signature (default
            :func:`rapid_verify`; for ablations).
    """

    def __init__(
        self,
        target: Any,
        drafter: Any = None,
        *,
        gamma: int = 10,
        eta: float = 10.0,
        alpha: float = 0.1,
        residual: str = "exact",
        confidence_threshold: float | None = 0.1,
        tokenizer: Any = None,
        drafter_tokenizer: Any = None,
        verify: Callable[..., tuple[torch.Tensor, int]] | None = None,
    ) -> None:
        for name, m in (("target", target), ("drafter", drafter)):
            if m is not None and not (callable(m) and hasattr(m, "forward")):
                raise TypeError(
                    f"{name} must be a causal LM module (callable with .forward), got {type(m).__name__}"
                )
        gamma = check_int(gamma, "gamma", low=1)  # drafted tokens per round
        self.confidence_threshold = (
            None
            if confidence_threshold is None
            else check_float(confidence_threshold, "confidence_threshold", low=0.0, high=1.0)
        )
        if residual not in RESIDUALS:
            raise ValueError(f"residual must be one of {RESIDUALS}, got {residual!r}")
        if verify is not None and not callable(verify):
            raise TypeError(f"verify must be callable, got {type(verify).__name__}")
        self.target, self.drafter = target, target if drafter is None else drafter
        self.gamma, self.eta = gamma, check_float(eta, "eta", **ETA_RANGE)
        self.alpha = check_float(alpha, "alpha", **ALPHA_RANGE)
        self.residual, self.verify = residual, verify or rapid_verify
        if tokenizer is not None and drafter_tokenizer is not None:
            if dict(tokenizer.get_vocab()) != dict(drafter_tokenizer.get_vocab()):
                raise ValueError(
                    "drafter_tokenizer: its vocabulary differs from the target tokenizer's; RAPID needs a shared "
                    "vocabulary (token translation between tokenizers is not implemented)"
                )
        vt, vd = _vocab_size(self.target), _vocab_size(self.drafter)
        if vt is None or vd is None:
            raise TypeError("target and drafter must expose vocab_size (or config.vocab_size)")
        if vt != vd:
            shared = len(tokenizer) if tokenizer is not None else None
            if shared is None or shared > min(vt, vd):
                raise ValueError(
                    f"drafter: vocabulary size {vd} differs from the target's {vt}; RAPID needs a shared tokenizer "
                    "(pass tokenizer= when the models only pad their output layers differently)"
                )
            vt = shared
        self.vocab = vt

    def _unconfident(self, q: torch.Tensor, y: int) -> bool:
        """Whether the drafter's probability of its draft ``y`` (``q``: processed logits) is below the threshold."""
        if self.confidence_threshold is None:
            return False
        return float(torch.softmax(q, dim=-1)[y]) < self.confidence_threshold

    def _process(self, processor: Processor | None, temperature: float, ids: list[int], logits: torch.Tensor):
        if processor is not None:
            logits = processor(torch.tensor([ids], dtype=torch.int64, device=logits.device), logits[None])[0]
        return logits / temperature if temperature != 1.0 else logits

    @torch.no_grad()
    def generate(
        self,
        long_ids: torch.Tensor,
        rag_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        do_sample: bool = True,
        temperature: float = 1.0,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        logits_processor: Processor | None = None,
        stopping_criteria: Callable[[torch.Tensor], bool] | None = None,
        streamer: Any = None,
    ) -> RapidOutput:
        """Generate up to ``max_new_tokens`` tokens after ``long_ids`` with RAPID.

        Args:
            long_ids: the target's prompt (long context + query), ``(L,)`` or ``(1, L)``.
            rag_ids: the drafter's prompt (retrieved chunks + query), ``(R,)`` or ``(1, R)``.
            max_new_tokens: ``≥ 1``.
            do_sample: sample (True) or the greedy mode (False; with ``eta=0`` exactly the target's greedy
                output).
            temperature: applied to both target and drafter logits before ``g`` is formed.
            seed, generator: the local random stream (never the global one); ``generator`` wins.
            eos_token_id: id(s) that end generation; None reads the target's ``generation_config`` /
                ``config`` (an error when it has none); ``[]`` never stops early.
            logits_processor: ``f(ids (1, t), scores (1, V)) -> scores`` applied to every target and drafter
                row before temperature (e.g. a transformers ``LogitsProcessorList``).
            stopping_criteria: ``f(ids (1, t)) -> bool`` on the target sequence, checked after each round.
            streamer: object with ``put(tensor)`` / ``end()`` receiving new tokens per round.
        """
        start = time.perf_counter()
        long_ids, rag_ids = _check_ids(long_ids, "long_ids"), _check_ids(rag_ids, "rag_ids")
        for name, ids in (("long_ids", long_ids), ("rag_ids", rag_ids)):
            if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
                raise ValueError(
                    f"{name} must hold ids in [0, {self.vocab}), got min {int(ids.min())}, max {int(ids.max())}"
                )
        max_new_tokens = check_int(max_new_tokens, "max_new_tokens", low=1)
        if not isinstance(do_sample, bool):
            raise TypeError(f"do_sample must be a bool, got {type(do_sample).__name__}")
        temperature = check_float(temperature, "temperature", low=0.0, low_open=True)
        eos = _eos_set(eos_token_id, self.target)
        if rag_ids.shape[0] > long_ids.shape[0]:
            warnings.warn(
                f"rag_ids ({rag_ids.shape[0]} tokens) is longer than long_ids ({long_ids.shape[0]} tokens): the RAG "
                "drafter gives no speed benefit over the long-context target",
                stacklevel=2,
            )
        temperature = float(temperature) if do_sample else 1.0
        gen = None if not do_sample else make_generator(seed, generator, device=_model_device(self.target))
        target, drafter = _Session(self.target, self.vocab), _Session(self.drafter, self.vocab)
        long_seq, rag_seq = long_ids.tolist(), rag_ids.tolist()
        for session, seq in ((target, long_seq), (drafter, rag_seq)):
            if len(seq) > 1:
                session.feed(seq[:-1], last_only=True)
                session.synced = len(seq) - 1
        out = RapidOutput(tokens=torch.zeros(0, dtype=torch.int64))
        new: list[int] = []
        while len(new) < max_new_tokens:
            k = min(self.gamma, max_new_tokens - len(new) - 1)
            drafts: list[int] = []
            q_rows: list[torch.Tensor] = []
            pending = rag_seq[len(drafter.fed) :]
            for _ in range(k):
                logits = drafter.feed(pending)[-1]
                drafter.calls += 1
                q = self._process(logits_processor, temperature, rag_seq + drafts, logits)
                if do_sample:
                    y = sample_token(torch.softmax(q, dim=-1).to(gen.device), gen)
                else:
                    y = int(q.argmax())
                drafts.append(y)
                q_rows.append(q)
                if y in eos or self._unconfident(q, y):
                    break
                pending = [y]
            rows = target.feed(long_seq[len(target.fed) :] + drafts)[-(len(drafts) + 1) :]
            target.calls += 1
            p = torch.stack(
                [
                    self._process(logits_processor, temperature, long_seq + drafts[:i], rows[i])
                    for i in range(len(rows))
                ]
            )
            q_mat = torch.stack(q_rows) if q_rows else p.new_zeros(0, self.vocab)
            tokens, n = self.verify(
                torch.tensor(drafts, dtype=torch.int64, device=p.device),
                q_mat.to(p.device),
                p,
                eta=self.eta,
                alpha=self.alpha,
                residual=self.residual,
                greedy=not do_sample,
                generator=gen,
            )
            emitted = [int(t) for t in tokens.tolist()]
            out.accepted_per_round.append(int(n))
            out.drafted_per_round.append(len(drafts))
            for j, t in enumerate(emitted):
                if t in eos:
                    emitted, out.stopped_at_eos = emitted[: j + 1], True
                    break
            emitted = emitted[: max_new_tokens - len(new)]
            new += emitted
            long_seq += emitted
            rag_seq += emitted
            if streamer is not None:
                streamer.put(torch.tensor(emitted, dtype=torch.int64))
            if out.stopped_at_eos or (stopping_criteria is not None and bool(stopping_criteria(
                torch.tensor([long_seq], dtype=torch.int64)
            ))):  # fmt: skip
                break
            target.rollback(long_seq)
            drafter.rollback(rag_seq)
        if streamer is not None:
            streamer.end()
        out.tokens = torch.tensor(new, dtype=torch.int64)
        out.target_calls, out.drafter_calls = target.calls, drafter.calls
        out.wall_time = time.perf_counter() - start
        return out
