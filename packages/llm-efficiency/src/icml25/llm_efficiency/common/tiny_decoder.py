"""A tiny causal Transformer LM with dense or top-k MoE FFNs, shared by two papers' experiments.

The Joint MoE Scaling Laws paper (Ludziejewski et al., "Joint MoE Scaling Laws: Mixture of Experts Can Be
Memory Efficient", arXiv:2502.05172, catalog P09) trains decoder-only Transformers whose FFNs are
token-choice top-k MoE layers; its CPU-scale check compares such models at equal active parameters. The
PENCIL experiment (Yang et al., "PENCIL: Long Thoughts with Short Memory", catalog P11) trains the same
decoder with dense FFNs (``n_experts=1``) on reduced traces.

* :class:`MoEFFN` — a top-k routed FFN (softmax router, Switch-Transformer load-balancing loss
  ``E · Σ_i f_i · P_i``), sparse dispatch (each expert runs on its own tokens, so the FFN compute per
  token is that of ``k`` experts); ``router="random"`` assigns experts uniformly at random (an ablation);
  ``n_experts=1`` is the dense FFN;
* :class:`TinyDecoder` — a pre-LN causal Transformer LM whose FFNs are dense (``n_experts=1``) or MoE.

Both are re-exported by :mod:`icml25.llm_efficiency.moe_scaling` (where they were defined) and by
:mod:`icml25.llm_efficiency`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from icml25.kernels.checks import check_choice, check_int, check_tensor
from icml25.kernels.rng import make_generator

__all__ = ["MoEFFN", "TinyDecoder"]


def _hidden_states(x: object, d_model: int) -> torch.Tensor:
    """``x`` if it is a finite floating ``(..., d_model)`` tensor with at least one token."""
    check_tensor(x, "x", dtype="float", finite=False)
    if x.dim() < 2 or x.shape[-1] != d_model or x.numel() == 0:
        raise ValueError(f"x must have shape (..., {d_model}) with at least one token, got {tuple(x.shape)}")
    return check_tensor(x, "x", dtype="float")


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
        self.d_model = check_int(d_model, "d_model", low=1)
        self.d_ff = check_int(d_ff, "d_ff", low=1)
        self.n_experts = check_int(n_experts, "n_experts", low=1)
        self.top_k = check_int(top_k, "top_k", low=1)
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k must be <= n_experts = {self.n_experts}, got {self.top_k}")
        self.router_kind = check_choice(router, "router", ("learned", "random"))
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
        _hidden_states(x, self.d_model)
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
        self.vocab = check_int(vocab, "vocab", low=2)
        d = check_int(d_model, "d_model", low=1)
        heads = check_int(n_heads, "n_heads", low=1)
        if d % heads:
            raise ValueError(f"d_model must be divisible by n_heads = {heads}, got {d}")
        self.max_len = check_int(max_len, "max_len", low=1)
        layers = check_int(n_layers, "n_layers", low=1)
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
