"""NTPP: Next-Token-Pair Prediction — ICML 2025, P24: transformers integration (extra ``[hf]``).

Wang et al., ICML 2025 (arXiv 2506.00975; official code: github.com/Chaos96/NTPP). :class:`NTPPModel` runs
a transformers decoder-only LM (``LlamaForCausalLM`` or any model taking ``inputs_embeds``, a custom 4-D
additive ``attention_mask`` and ``position_ids``) on the interleaved pair sequence with the pair-causal mask,
token position ids and the official channel embedding (one learned vector per channel added to the queries
and keys after the rotary embedding in every attention layer, ``ntpp/model/dual_llama.py:446-461, 522-536,
889``); :meth:`NTPPModel.duplex_generate` streams one forward pass per frame with a KV cache (two tokens
appended per step). :func:`flat_duplex_generate` is the decode loop of the flattened next-token baseline (a
plain causal LM on ``a_0 b_0 a_1 …``).

The channel embedding reaches the attention through transformers' attention interface: NTPPModel registers
an attention function ``ntpp_channel_<base>`` (``<base>`` the LM's own implementation, e.g. ``sdpa``) that
adds the channel vectors to the queries and keys it is given and calls the base function, and passes the
vectors as the keyword ``ntpp_channel`` of the LM call; without that keyword the function is the base one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

try:
    import transformers
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "icml25.llm_efficiency.ntpp's transformers integration needs transformers: "
        "pip install 'icml25-llm-efficiency[hf]'"
    ) from err

from icml25.kernels.checks import check_choice, check_float, check_int
from icml25.kernels.hf_cache import cache_argument, output_cache
from icml25.kernels.rng import isolated_rng, make_generator
from icml25.llm_efficiency.ntpp.core import (
    POSITION_LAYOUTS,
    check_token_pair,
    check_token_stream,
    pair_causal_mask,
    slot_positions,
)

__all__ = ["NTPPModel", "flat_duplex_generate"]

_MIN_TRANSFORMERS = (4, 40)

CHANNEL_EMBEDDINGS = ("qk", "input", "none")
"""Where :class:`NTPPModel` puts the channel identity: ``"qk"`` (the official code's): one learned vector
per channel, of the attention head size, added to the queries and keys after the rotary embedding in every
attention layer (one module shared by all layers); ``"input"`` (ours before the official code was read): a
learned 2-entry embedding of the hidden size added once to the token embeddings; ``"none"``."""

_CHANNEL_KWARG = "ntpp_channel"
_ATTENTION_PREFIX = "ntpp_channel_"


def _check_transformers_version(version: str | None = None) -> None:
    """Custom 4-D additive attention masks need transformers >= 4.40."""
    v = transformers.__version__ if version is None else version
    parts = tuple(int(p) for p in v.split(".")[:2] if p.isdigit())
    if len(parts) == 2 and parts < _MIN_TRANSFORMERS:
        raise ImportError(
            f"NTPP needs custom 4-D attention masks (transformers >= 4.40), found transformers {v}: "
            "pip install -U 'icml25-llm-efficiency[hf]'"
        )


def _base_attention(module: nn.Module, base: str) -> Callable[..., Any]:
    """The attention function ``base`` names for ``module``: the global interface's, or for ``"eager"`` the
    ``eager_attention_forward`` of the module's own modelling file (transformers keeps eager per model)."""
    if base != "eager":
        return transformers.AttentionInterface()[base]
    fn = getattr(inspect.getmodule(type(module)), "eager_attention_forward", None)
    if fn is None:
        raise TypeError(
            f"channel_embedding='qk' needs the attention's eager function; {type(module).__name__} has none"
        )
    return fn


def _channel_attention(base: str) -> Callable[..., Any]:
    """An attention function that adds the NTPP channel vectors to the queries and keys, then runs ``base``.

    ``key`` holds every cached key and the new ones, in sequence order from token 0 (transformers updates the
    cache before the attention function), so key ``j`` belongs to channel ``j mod 2`` and the ``q`` queries
    are the last ``q`` keys' tokens. Adding the vector to every key at each call equals the official adding it
    before the cache (``dual_llama.py:889``; the cached keys here are stored without it)."""

    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> Any:
        channel = kwargs.pop(_CHANNEL_KWARG, None)
        if channel is not None:
            q_len, k_len = query.shape[-2], key.shape[-2]
            vec = channel.to(key.dtype)[torch.arange(k_len, device=key.device) % 2]  # (k_len, head_dim)
            key = key + vec
            query = query + vec[k_len - q_len :]
        return _base_attention(module, base)(module, query, key, value, attention_mask, **kwargs)

    return attention


def _use_channel_attention(lm: Any) -> None:
    """Switch ``lm`` to the channel attention over its current implementation (registered once per base)."""
    config = getattr(lm, "config", None)
    base = getattr(config, "_attn_implementation", None)
    if not isinstance(base, str):
        raise TypeError(
            "channel_embedding='qk' needs a transformers model that dispatches attention through "
            f"config._attn_implementation, got {type(lm).__name__}"
        )
    if base.startswith(_ATTENTION_PREFIX):
        return
    name = _ATTENTION_PREFIX + base
    transformers.AttentionInterface.register(name, _channel_attention(base))
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if base in ALL_MASK_ATTENTION_FUNCTIONS:  # the LM called on its own keeps building its base mask
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    config._attn_implementation = name


def _pick(
    logits: torch.Tensor, temperature: float, gen: torch.Generator, silence_id: int | None
) -> torch.Tensor:
    """``(B, V)`` logits -> ``(B,)`` tokens: argmax at temperature 0, else a sample.

    Greedy with ``silence_id``: silence iff ``p(silence) >= 1/2``, else the most likely other token (the
    speak-or-not decision is not split over the content tokens)."""
    if temperature == 0.0:
        if silence_id is None:
            return logits.argmax(-1)
        p_sil = torch.softmax(logits.float(), -1)[:, silence_id]
        speech = logits.clone()
        speech[:, silence_id] = float("-inf")
        return torch.where(
            p_sil >= 0.5, torch.full_like(p_sil, silence_id, dtype=torch.long), speech.argmax(-1)
        )
    p = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(p.cpu(), 1, generator=gen)[:, 0].to(logits.device)


def _vocab(lm: Any) -> int:
    return int(lm.get_input_embeddings().num_embeddings)


def _max_positions(lm: Any) -> int | None:
    v = getattr(getattr(lm, "config", None), "max_position_embeddings", None)
    return int(v) if isinstance(v, int) else None


def _head_dim(lm: Any) -> int:
    config = lm.config
    head_dim = getattr(config, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    return int(config.hidden_size) // int(config.num_attention_heads)


class NTPPModel(nn.Module):
    """Next-token-pair prediction on a transformers decoder-only LM.

    Input: two aligned frame streams ``a, b`` of shape ``(B, T)``. The LM reads the interleaved sequence
    ``a_0 b_0 a_1 b_1 …`` (``2T`` tokens) with the pair-causal mask (:func:`pair_causal_mask`: the same-frame
    partner is never seen, the paper's factorisation), position ids ``0 … 2T − 1`` (the official code's; so
    ``2T`` must not exceed ``max_position_embeddings``) and the official channel embedding (a learned vector
    per channel added to the queries and keys of every attention layer). Token embeddings and the LM head
    are shared by both channels (speaker independence); the output at ``a_t``'s slot predicts ``a_{t+1}``, at
    ``b_t``'s slot ``b_{t+1}``.

    Args:
        lm: a transformers causal LM (e.g. ``LlamaForCausalLM``) or a config (``LlamaConfig``) to build
            one from (initialised under ``seed``). With ``channel_embedding="qk"`` its attention
            implementation is switched to the channel attention over the one it had (see the module
            docstring); called on its own, without the channel vectors, it computes what it did before.
        attention: ``"pair"`` (NTPP) or ``"own"`` (each channel sees only its own past: the deaf control).
        channel_embedding: ``"qk"`` (official, default), ``"input"`` (ours before: a 2-entry embedding added
            to the token embeddings) or ``"none"`` (the two slots are told apart only by position).
            ``CHANNEL_EMBEDDINGS`` describes them. The vectors start at ``N(0, 0.02²)`` (the config's
            ``initializer_range`` when it has one, as the official initialisation).
        positions: ``"token"`` (official, default: ``0 … 2T − 1``) or ``"frame"`` (ours before: both tokens
            of frame ``t`` at ``t``, so ``T <= max_position_embeddings``).
        seed: initialisation of the LM built from a config and of the channel embedding (global RNG untouched).
    """

    def __init__(
        self,
        lm: Any,
        attention: str = "pair",
        channel_embedding: str = "qk",
        positions: str = "token",
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        _check_transformers_version()
        check_choice(attention, "attention", ("pair", "own"))
        check_choice(channel_embedding, "channel_embedding", CHANNEL_EMBEDDINGS)
        check_choice(positions, "positions", POSITION_LAYOUTS)
        with isolated_rng(seed):
            if isinstance(lm, transformers.PretrainedConfig):
                lm = transformers.AutoModelForCausalLM.from_config(lm)
            if not isinstance(lm, nn.Module) or not callable(getattr(lm, "get_input_embeddings", None)):
                raise TypeError(f"lm must be a transformers causal LM or its config, got {type(lm).__name__}")
            std = float(getattr(getattr(lm, "config", None), "initializer_range", 0.02) or 0.02)
            self.channel: nn.Embedding | None = None
            if channel_embedding == "input":
                self.channel = nn.Embedding(2, lm.get_input_embeddings().embedding_dim)
            elif channel_embedding == "qk":
                self.channel = nn.Embedding(2, _head_dim(lm))
            if self.channel is not None:
                nn.init.normal_(self.channel.weight, std=std)
        if channel_embedding == "qk":
            _use_channel_attention(lm)
        self.lm = lm
        self.attention = attention
        self.channel_embedding = channel_embedding
        self.positions = positions
        self.vocab_size = _vocab(lm)
        self.max_positions = _max_positions(lm)

    # ---------------------------------------------------------------------------------------- plumbing
    def _embed(self, ids: torch.Tensor, chan: torch.Tensor) -> torch.Tensor:
        e = self.lm.get_input_embeddings()(ids)
        if self.channel_embedding != "input":
            return e
        return e + self.channel(chan).to(e.dtype)

    def _check_frames(self, T: int) -> None:
        need = 2 * T if self.positions == "token" else T
        if self.max_positions is not None and need > self.max_positions:
            rule = "2T" if self.positions == "token" else "T"
            raise ValueError(
                f"a sequence of {T} frames ({2 * T} tokens) needs {need} positions with positions="
                f"{self.positions!r}, which exceeds max_position_embeddings={self.max_positions}: "
                f"{rule} must be <= max_position_embeddings"
            )

    def _mask(self, T: int, rows: slice, B: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        m = pair_causal_mask(T, device=device, dtype=dtype, cross_channel=self.attention == "pair")
        return m[rows][None, None].expand(B, 1, -1, -1)

    def _run(self, ids: torch.Tensor, total_frames: int, cache: Any = None) -> Any:
        """One LM call on the last ``ids.shape[1]`` slots of the interleaved sequence of ``total_frames``."""
        B, n = ids.shape
        slots = torch.arange(2 * total_frames - n, 2 * total_frames, device=ids.device)
        emb = self._embed(ids, (slots % 2).expand(B, n))
        mask = self._mask(
            total_frames, slice(2 * total_frames - n, 2 * total_frames), B, emb.dtype, ids.device
        )
        kw: dict[str, Any] = {
            "inputs_embeds": emb,
            "attention_mask": mask,
            "position_ids": slot_positions(slots, self.positions).expand(B, n),
            "use_cache": cache is not False,
        }
        if self.channel_embedding == "qk":
            kw[_CHANNEL_KWARG] = self.channel.weight
        if cache is not None and cache is not False:
            kw[cache_argument(self.lm)] = cache
        return self.lm(**kw)

    # ----------------------------------------------------------------------------------------- forward
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, T)``, ``(B, T)`` -> ``(logits_a, logits_b)``, each ``(B, T, V)``: ``logits_x[:, t]`` is the
        distribution of ``x_{t+1}`` given the frames ``<= t`` (feed them to :func:`ntpp_loss`)."""
        a, b = check_token_pair(a, b, self.vocab_size)
        B, T = a.shape
        self._check_frames(T)
        ids = torch.stack([a, b], 2).reshape(B, 2 * T)
        logits = self._run(ids, T, cache=False).logits
        return logits[:, 0::2], logits[:, 1::2]

    # -------------------------------------------------------------------------------------- generation
    @torch.no_grad()
    def duplex_generate(
        self,
        prompt_a: torch.Tensor,
        prompt_b: torch.Tensor,
        steps: int,
        user: torch.Tensor | None = None,
        sample_channels: Sequence[str] = ("b",),
        temperature: float = 0.0,
        silence_id: int | None = None,
        use_cache: bool = True,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stream ``steps`` new frames after a ``(B, P)`` prompt: **one forward pass per frame**.

        Full duplex: with ``user`` (``(B, steps)`` tokens of channel a, the live input) channel a is
        teacher-forced and only channel b is generated (``sample_channels=("b",)``); without ``user`` both
        channels are generated (``sample_channels=("a", "b")``), the pair sampled in parallel from one
        pass (the two tokens of a frame are conditionally independent given the past). Frame ``t``'s
        tokens never see each other, so b's token at frame ``t`` does not wait for the user's token at
        ``t``. With ``use_cache`` each pass appends the 2 tokens of the last frame to the KV cache;
        ``use_cache=False`` recomputes the full sequence (same result, for checking).

        Args:
            prompt_a, prompt_b: ``(B, P)`` token ids, ``P >= 1``.
            steps: frames to generate (>= 1); ``2(P + steps)`` (``P + steps`` with frame positions) must be
                ``<= max_position_embeddings``.
            user: ``(B, steps)`` channel-a tokens, or None.
            sample_channels: ``("b",)`` with ``user``, ``("a", "b")`` without.
            temperature: 0 = greedy (argmax), else sampling at this temperature.
            silence_id: with greedy decoding, emit silence iff ``p(silence) >= 1/2`` and otherwise the most
                likely other token (speech/silence decided first); None: plain argmax.
            seed, generator: randomness of the samples (a local generator; global RNG untouched).

        Returns:
            ``(a, b)``, each ``(B, P + steps)``: the prompt followed by the new frames (``a[:, P:]`` is
            ``user`` unchanged when it is given).
        """
        pa, pb = check_token_pair(prompt_a, prompt_b, self.vocab_size)
        B, P = pa.shape
        steps = check_int(steps, "steps", low=1)
        chans = tuple(sample_channels) if isinstance(sample_channels, (list, tuple)) else None
        if (
            chans is None
            or not chans
            or any(c not in ("a", "b") for c in chans)
            or len(set(chans)) != len(chans)
        ):
            raise ValueError(f"sample_channels must be ('b',) or ('a', 'b'), got {sample_channels!r}")
        if user is not None:
            user = check_token_stream(user, "user", self.vocab_size)
            if "a" in chans:
                raise ValueError(
                    "sample_channels includes 'a' but a user stream is given: channel a is the user's "
                    "(teacher-forced); pass sample_channels=('b',) or user=None"
                )
            if tuple(user.shape) != (B, steps):
                raise ValueError(
                    f"user must have shape (batch, steps) = {(B, steps)}, got {tuple(user.shape)}"
                )
            user = user.to(pa.device)
        elif set(chans) != {"a", "b"}:
            raise ValueError(
                "without a user stream both channels are generated: pass sample_channels=('a', 'b') or user="
            )
        temp = check_float(temperature, "temperature", low=0.0)
        sil = (
            None
            if silence_id is None
            else check_int(silence_id, "silence_id", low=0, high=self.vocab_size - 1)
        )
        if not isinstance(use_cache, bool):
            raise TypeError(f"use_cache must be a bool, got {type(use_cache).__name__}")
        self._check_frames(P + steps)
        gen = make_generator(seed, generator)
        a = torch.empty(B, P + steps, dtype=torch.long, device=pa.device)
        b = torch.empty_like(a)
        a[:, :P], b[:, :P] = pa, pb
        cache = None
        for k in range(steps):
            f = P + k  # the frame to produce, from the frames < f
            if k == 0 or not use_cache:
                ids = torch.stack([a[:, :f], b[:, :f]], 2).reshape(B, 2 * f)
            else:
                ids = torch.stack([a[:, f - 1], b[:, f - 1]], 1)
            out = self._run(ids, f, cache=cache if use_cache else False)
            if use_cache:
                cache = output_cache(out)
            la, lb = out.logits[:, -2], out.logits[:, -1]
            a[:, f] = user[:, k] if user is not None else _pick(la, temp, gen, sil)
            b[:, f] = _pick(lb, temp, gen, sil)
        return a, b


@torch.no_grad()
def flat_duplex_generate(
    lm: Any,
    prompt_a: torch.Tensor,
    prompt_b: torch.Tensor,
    steps: int,
    user: torch.Tensor | None = None,
    temperature: float = 0.0,
    silence_id: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode loop of the flattened next-token baseline: a causal LM on ``a_0 b_0 a_1 b_1 …``.

    Token positions are token indices and ``b_t`` is read after ``a_t`` (it sees the same-frame user
    token). With ``user`` (``(B, steps)``, channel a teacher-forced) each frame costs one pass (feed
    ``[b_{t-1}, a_t]``, read ``b_t``); without it both channels are generated and each frame costs two
    sequential passes (read ``a_t``, feed it, read ``b_t``). KV cache throughout.

    Args:
        lm: a transformers causal LM trained on interleaved pairs.
        prompt_a, prompt_b: ``(B, P)`` token ids, ``P >= 1``.
        steps: frames to generate (>= 1); ``2(P + steps)`` must be ``<= max_position_embeddings``.
        user: ``(B, steps)`` channel-a tokens or None.
        temperature, silence_id, seed, generator: as :meth:`NTPPModel.duplex_generate`.

    Returns:
        ``(a, b)``, each ``(B, P + steps)``.
    """
    if not isinstance(lm, nn.Module) or not callable(getattr(lm, "get_input_embeddings", None)):
        raise TypeError(f"lm must be a transformers causal LM, got {type(lm).__name__}")
    V = _vocab(lm)
    pa, pb = check_token_pair(prompt_a, prompt_b, V)
    B, P = pa.shape
    steps = check_int(steps, "steps", low=1)
    if user is not None:
        user = check_token_stream(user, "user", V)
        if tuple(user.shape) != (B, steps):
            raise ValueError(f"user must have shape (batch, steps) = {(B, steps)}, got {tuple(user.shape)}")
    temp = check_float(temperature, "temperature", low=0.0)
    sil = None if silence_id is None else check_int(silence_id, "silence_id", low=0, high=V - 1)
    mp = _max_positions(lm)
    if mp is not None and 2 * (P + steps) > mp:
        raise ValueError(f"2 * (P + steps) = {2 * (P + steps)} tokens exceed max_position_embeddings={mp}")
    gen = make_generator(seed, generator)
    key = cache_argument(lm)
    a = torch.empty(B, P + steps, dtype=torch.long, device=pa.device)
    b = torch.empty_like(a)
    a[:, :P], b[:, :P] = pa, pb
    cache, n = None, 0

    def step(ids: torch.Tensor) -> torch.Tensor:
        nonlocal cache, n
        pos = torch.arange(n, n + ids.shape[1], device=ids.device).expand(B, -1)
        kw: dict[str, Any] = {"input_ids": ids, "position_ids": pos, "use_cache": True}
        if cache is not None:
            kw[key] = cache
        out = lm(**kw)
        cache, n = output_cache(out), n + ids.shape[1]
        return out.logits[:, -1]

    pending = torch.stack([pa, pb], 2).reshape(B, 2 * P)
    for k in range(steps):
        f = P + k
        if user is not None:
            a[:, f] = user[:, k]
            b[:, f] = _pick(step(torch.cat([pending, a[:, f : f + 1]], 1)), temp, gen, sil)
        else:
            a[:, f] = _pick(step(pending), temp, gen, sil)
            b[:, f] = _pick(step(a[:, f : f + 1]), temp, gen, sil)
        pending = b[:, f : f + 1]
    return a, b
