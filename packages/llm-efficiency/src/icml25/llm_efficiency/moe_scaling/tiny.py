"""Joint MoE Scaling Laws: Mixture of Experts Can Be Memory Efficient — ICML 2025, P09: tiny MoE models.

Ludziejewski et al., ICML 2025 (arXiv:2502.05172) train decoder-only Transformers whose FFNs are
replaced by token-choice top-k MoE layers. For a CPU-scale check of the law's basic direction (more
experts at fixed active parameters and tokens lower the loss) this module has:

* :class:`MoEFFN` — a top-k routed FFN (softmax router, Switch-Transformer load-balancing loss
  ``E · Σ_i f_i · P_i``), sparse dispatch (each expert runs on its own tokens, so the FFN compute per
  token is that of ``k`` experts); ``router="random"`` assigns experts uniformly at random (an ablation);
* :class:`TinyDecoder` — a pre-LN causal Transformer LM whose FFNs are dense (``n_experts=1``) or MoE;
* :class:`TopicBigramCorpus` — a synthetic corpus: a mixture of sparse random bigram "topics" that
  switch every ``switch_every`` tokens, with exact reference losses (the topic-aware oracle and the
  topic-agnostic bigram), so that capacity and the use of context matter.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from icml25.kernels.rng import make_generator

__all__ = ["MoEFFN", "TinyDecoder", "TopicBigramCorpus"]


def _pos_int(v: object, name: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")
    return int(v)


def _check_x(x: object, d_model: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < 2 or x.shape[-1] != d_model or x.numel() == 0:
        raise ValueError(f"x must have shape (..., {d_model}) with at least one token, got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(
            f"x must be finite; got {int(torch.isnan(x).sum())} NaN and {int(torch.isinf(x).sum())} Inf "
            f"values in a tensor of shape {tuple(x.shape)}"
        )
    return x


class MoEFFN(nn.Module):
    """A token-choice top-``k`` Mixture-of-Experts FFN.

    Each expert is ``Linear(d, d_ff) → GELU → Linear(d_ff, d)``; ``n_experts=1`` is the dense FFN. The
    router is a bias-free linear map to ``E`` logits; the top-``k`` experts of each token are combined
    with their softmax probabilities (renormalised over the ``k`` chosen when ``k > 1``; for ``k = 1`` the
    gate is the probability itself, as in the Switch Transformer, so the router gets a gradient).
    ``forward`` stores the load-balancing loss ``E · Σ_i f_i · P_i`` (``f_i`` fraction of routed slots
    to expert ``i``, ``P_i`` mean router probability; 1 at perfect balance) in ``self.aux_loss``.

    ``router="random"``: experts drawn uniformly per token from ``generator`` (seeded by ``seed``), gate 1,
    aux loss 0 — the mechanism (learned routing) removed.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int = 4,
        top_k: int = 1,
        router: str = "learned",
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        self.d_model = _pos_int(d_model, "d_model")
        self.d_ff = _pos_int(d_ff, "d_ff")
        self.n_experts = _pos_int(n_experts, "n_experts")
        self.top_k = _pos_int(top_k, "top_k")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k must be <= n_experts = {self.n_experts}, got {self.top_k}")
        if router not in ("learned", "random"):
            raise ValueError(f"router must be 'learned' or 'random', got {router!r}")
        self.router_kind = router
        E = self.n_experts
        self.w1 = nn.Parameter(torch.empty(E, self.d_model, self.d_ff))
        self.b1 = nn.Parameter(torch.zeros(E, self.d_ff))
        self.w2 = nn.Parameter(torch.empty(E, self.d_ff, self.d_model))
        self.b2 = nn.Parameter(torch.zeros(E, self.d_model))
        nn.init.normal_(self.w1, std=1.0 / math.sqrt(self.d_model))
        nn.init.normal_(self.w2, std=1.0 / math.sqrt(self.d_ff))
        self.router = nn.Linear(self.d_model, E, bias=False) if E > 1 else None
        self.generator = make_generator(seed) if router == "random" else None
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(..., d_model)`` → ``(..., d_model)``; sets ``self.aux_loss`` (a 0-d tensor)."""
        _check_x(x, self.d_model)
        shape = x.shape
        h = x.reshape(-1, self.d_model)  # (T, d)
        T, E = h.shape[0], self.n_experts
        if E == 1:
            self.aux_loss = h.new_zeros(())
            y = F.gelu(h @ self.w1[0] + self.b1[0]) @ self.w2[0] + self.b2[0]
            return y.reshape(shape)
        if self.router_kind == "random":
            scores = torch.rand(T, E, generator=self.generator).to(h)
            idx = scores.topk(self.top_k, dim=-1).indices  # (T, k): uniform without replacement
            gates = h.new_ones(T, self.top_k)
            self.aux_loss = h.new_zeros(())
        else:
            probs = torch.softmax(self.router(h), dim=-1)  # (T, E)
            top_p, idx = probs.topk(self.top_k, dim=-1)
            gates = top_p if self.top_k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
            routed = torch.zeros(T, E, dtype=h.dtype, device=h.device).scatter_(1, idx, 1.0)
            frac = routed.mean(dim=0) / self.top_k  # f_i, sums to 1
            self.aux_loss = E * (frac * probs.mean(dim=0)).sum()
        # Sparse dispatch: each expert runs only on the tokens routed to it (top-k slots), then a
        # gate-weighted scatter-add combines the slots.
        y = torch.zeros_like(h)
        flat_idx, flat_gate = idx.reshape(-1), gates.reshape(-1)
        token_of = torch.arange(T, device=h.device).repeat_interleave(self.top_k)
        for e in range(E):
            sel = (flat_idx == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            tok = token_of[sel]
            hid = F.gelu(h[tok] @ self.w1[e] + self.b1[e])
            y = y.index_add(0, tok, (hid @ self.w2[e] + self.b2[e]) * flat_gate[sel, None])
        return y.reshape(shape)


class _Block(nn.Module):
    def __init__(self, d: int, heads: int, ffn: MoEFFN) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, d))
        return x + self.ffn(self.ln2(x))


class TinyDecoder(nn.Module):
    """A pre-LN causal Transformer LM with dense or MoE FFNs (every layer's FFN is a :class:`MoEFFN`).

    ``forward(ids)`` with ``ids`` ``(B, T)`` int64 in ``[0, vocab)``, ``T <= max_len`` → logits
    ``(B, T, vocab)``; :attr:`aux_loss` is the mean load-balancing loss over the layers of the last call.
    Active parameters per token do not depend on ``n_experts`` (top-1 experts of the dense FFN's size).
    """

    def __init__(
        self,
        vocab: int,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        max_len: int = 64,
        d_ff: int = 256,
        n_experts: int = 1,
        top_k: int = 1,
        router: str = "learned",
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.vocab = _pos_int(vocab, "vocab", 2)
        d = _pos_int(d_model, "d_model")
        heads = _pos_int(n_heads, "n_heads")
        if d % heads:
            raise ValueError(f"d_model must be divisible by n_heads = {heads}, got {d}")
        self.max_len = _pos_int(max_len, "max_len")
        layers = _pos_int(n_layers, "n_layers")
        self.tok = nn.Embedding(self.vocab, d)
        self.pos = nn.Embedding(self.max_len, d)
        self.blocks = nn.ModuleList(
            _Block(d, heads, MoEFFN(d, d_ff, n_experts, top_k, router, seed=seed + i)) for i in range(layers)
        )
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, self.vocab, bias=False)

    @property
    def aux_loss(self) -> torch.Tensor:
        """Mean load-balancing loss of the layers' MoE FFNs in the last forward (0 for dense)."""
        return torch.stack([b.ffn.aux_loss for b in self.blocks]).mean()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be a torch.Tensor of token ids, got {type(ids).__name__}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids must be an int64/int32 tensor, got dtype {ids.dtype}")
        if ids.dim() != 2 or ids.shape[0] == 0 or not 1 <= ids.shape[1] <= self.max_len:
            raise ValueError(
                f"ids must have shape (B >= 1, 1 <= T <= {self.max_len}), got {tuple(ids.shape)}"
            )
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise ValueError(
                f"ids must be in [0, {self.vocab}), got range [{int(ids.min())}, {int(ids.max())}]"
            )
        ids = ids.long()
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


class TopicBigramCorpus:
    """A stream of tokens from a mixture of sparse random bigram models ("topics").

    Each topic ``t`` has, for every previous token, ``successors`` random next tokens with Dirichlet(1)
    probabilities. The stream picks a topic uniformly at random every ``switch_every`` tokens and walks
    that topic's chain. A model that infers the topic from context can approach
    :meth:`reference_losses` ``["oracle"]`` (the exact loss of the generating process given the topic);
    a model that only learns bigram statistics stays near ``["bigram"]`` (the exact topic-agnostic
    bigram predictor of the stream).
    """

    def __init__(
        self,
        vocab: int = 128,
        n_topics: int = 16,
        successors: int = 4,
        switch_every: int = 128,
        seed: int = 0,
    ) -> None:
        self.vocab = _pos_int(vocab, "vocab", 2)
        self.n_topics = _pos_int(n_topics, "n_topics")
        self.successors = _pos_int(successors, "successors")
        if self.successors > self.vocab:
            raise ValueError(f"successors must be <= vocab = {self.vocab}, got {self.successors}")
        self.switch_every = _pos_int(switch_every, "switch_every")
        rng = np.random.default_rng(_pos_int(seed, "seed", 0))
        V, S = self.vocab, self.successors
        P = np.zeros((self.n_topics, V, V))
        for t in range(self.n_topics):
            for v in range(V):
                nxt = rng.choice(V, size=S, replace=False)
                P[t, v, nxt] = rng.dirichlet(np.ones(S))
        self.transition = P  # (topics, V, V)

    def sample(self, n_tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """A stream of ``n_tokens`` tokens and the topic of each, both ``(n_tokens,)`` int64 arrays."""
        n = _pos_int(n_tokens, "n_tokens")
        rng = np.random.default_rng(_pos_int(seed, "seed", 0))
        cdf = np.cumsum(self.transition, axis=-1)
        tokens = np.empty(n, dtype=np.int64)
        topics = np.repeat(
            rng.integers(0, self.n_topics, size=-(-n // self.switch_every)), self.switch_every
        )[:n]
        u = rng.random(n)
        cur = int(rng.integers(0, self.vocab))
        for i in range(n):
            cur = min(int(np.searchsorted(cdf[topics[i], cur], u[i], side="right")), self.vocab - 1)
            tokens[i] = cur
        return tokens, topics.astype(np.int64)

    @staticmethod
    def _check_ids(x: object, name: str, upper: int) -> np.ndarray:
        arr = np.asarray(x.numpy() if isinstance(x, torch.Tensor) else x)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
        if arr.ndim != 1:
            raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
        if arr.size and (arr.min() < 0 or arr.max() >= upper):
            raise ValueError(f"{name} must be in [0, {upper}), got range [{arr.min()}, {arr.max()}]")
        return arr.astype(np.int64)

    def reference_losses(self, tokens: np.ndarray, topics: np.ndarray) -> dict[str, float]:
        """Exact per-token losses (nats) of two reference predictors on a sampled stream.

        ``"oracle"``: ``−ln P_topic(x_i | x_{i−1})`` (knows the topic); ``"bigram"``: the stream's
        topic-agnostic bigram ``P(x_i | x_{i−1}) = Σ_t w_t(x_{i−1}) P_t(x_i | x_{i−1})`` with ``w_t``
        the posterior of topic ``t`` given the previous token under the topics' stationary laws.
        """
        tokens = self._check_ids(tokens, "tokens", self.vocab)
        topics = self._check_ids(topics, "topics", self.n_topics)
        if tokens.shape != topics.shape or len(tokens) < 2:
            raise ValueError(
                f"tokens and topics must be equal-length 1-D arrays of >= 2 entries, got shapes "
                f"{tokens.shape} and {topics.shape}"
            )
        prev, nxt, top = tokens[:-1], tokens[1:], topics[1:]
        p_true = self.transition[top, prev, nxt]
        if (p_true == 0).any():
            raise ValueError(
                f"tokens and topics contain {int((p_true == 0).sum())} transitions that are impossible under "
                "their topic "
                "(not a stream of this corpus); reference losses would be infinite"
            )
        oracle = -np.log(p_true)
        # Stationary distribution of each topic's chain (power iteration on the row-stochastic matrix).
        pi = np.full((self.n_topics, self.vocab), 1.0 / self.vocab)
        for _ in range(500):
            pi = np.einsum("tv,tvw->tw", pi, self.transition)
        w = pi / pi.sum(axis=0, keepdims=True)  # (topics, V): P(topic | prev)
        mix = np.einsum("tv,tvw->vw", w, self.transition)
        bigram = -np.log(np.maximum(mix[prev, nxt], 1e-300))
        return {"oracle": float(oracle.mean()), "bigram": float(bigram.mean())}
