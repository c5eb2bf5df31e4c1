"""Learning Extrapolative Sequence Transformations from Markov Chains — ICML 2025, P20: the learned extrapolator.

:class:`ExtrapolatorLM` trains an autoregressive model q_θ on ``src <sep> tgt`` pairs built from selected
MCMC episodes (:func:`icml25.generative_models.mcmc_extrapolation.build_pairs`) — a built-in tiny causal
transformer, or any Hugging Face causal LM such as a random-init GPT-2 — and applies it iteratively
(:meth:`ExtrapolatorLM.transform`), keeping a step only if the guide improves. The chains and the episodes
are :mod:`icml25.generative_models.mcmc_extrapolation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from icml25.generative_models.mcmc_extrapolation import as_guide, as_tokens
from icml25.kernels.checks import check_float, check_int
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["ExtrapolatorLM", "TransformResult"]

_MAX_ABS = 1e12  # bound on a real argument (as in the chains' module)


# ------------------------------------------------------------------------------------------ extrapolator


class _TinyCausalLM(nn.Module):
    """A small GPT-style causal transformer: ids (B, T) -> logits (B, T, V)."""

    def __init__(self, vocab: int, max_len: int, n_embd: int, n_layer: int, n_head: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(max_len, n_embd)
        layer = nn.TransformerEncoderLayer(
            n_embd, n_head, 4 * n_embd, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        causal = torch.triu(torch.full((T, T), float("-inf"), device=ids.device), 1)
        return self.head(self.norm(self.blocks(h, mask=causal, is_causal=True)))


def _gpt2(vocab: int, ctx: int, n_embd: int, n_layer: int, n_head: int, seed: int) -> nn.Module:
    """A random-init Hugging Face GPT-2 of the given size (offline; needs the ``hf`` extra)."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as exc:
        raise ImportError(
            "model='gpt2' needs transformers: pip install 'icml25-generative-models[hf]'"
        ) from exc
    cfg = GPT2Config(
        vocab_size=vocab,
        n_positions=ctx,
        n_embd=check_int(n_embd, "n_embd", low=1),
        n_layer=check_int(n_layer, "n_layer", low=1),
        n_head=check_int(n_head, "n_head", low=1),
    )
    with isolated_rng(seed):
        return GPT2LMHeadModel(cfg)


@dataclass
class TransformResult:
    """Output of :meth:`ExtrapolatorLM.transform`: ``sequences`` (n, L) final states, ``trajectory``
    (n_steps + 1, n, L) the state after each step, ``guide_scores`` (n_steps + 1, n) (NaN without a
    guide), ``guide_evals`` the number of guide calls per sequence (the seed's own score included)."""

    sequences: np.ndarray
    trajectory: np.ndarray
    guide_scores: np.ndarray
    guide_evals: int


class ExtrapolatorLM:
    """The autoregressive extrapolator q_θ(x_next | x_prev) trained on ``src <sep> tgt``.

    Token layout: sequence tokens ``0..vocab_size-1``, ``<sep> = vocab_size``, ``<bos> = vocab_size+1``;
    the input is ``<bos> src <sep> tgt`` and the loss is the cross-entropy on the ``tgt`` tokens only;
    decoding is restricted to sequence tokens and produces exactly ``seq_len`` tokens.

    ``model``: ``None`` (a built-in causal transformer of ``n_layer`` layers, width ``n_embd``),
    ``"gpt2"`` (a random-init Hugging Face GPT-2 of that size; the ``hf`` extra) or any Hugging Face causal LM (e.g. a random-init ``GPT2LMHeadModel``; its vocabulary must hold
    ``vocab_size + 2`` ids and its context ``(history + 1)·seq_len + 2``).
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        *,
        history: int = 1,
        model: nn.Module | str | None = None,
        n_layer: int = 2,
        n_embd: int = 64,
        n_head: int = 4,
        seed: int = 0,
    ) -> None:
        self.vocab_size = check_int(vocab_size, "vocab_size", low=2)
        self.seq_len = check_int(seq_len, "seq_len", low=1)
        self.history = check_int(history, "history", low=1)
        self.sep, self.bos = self.vocab_size, self.vocab_size + 1
        ctx = (self.history + 1) * self.seq_len + 2
        if isinstance(model, str):
            if model != "gpt2":
                raise ValueError(f"model must be None, 'gpt2' or a Hugging Face causal LM; got {model!r}")
            model = _gpt2(self.vocab_size + 2, ctx, n_embd, n_layer, n_head, seed)
        if model is None:
            with isolated_rng(seed):
                model = _TinyCausalLM(
                    self.vocab_size + 2,
                    ctx,
                    check_int(n_embd, "n_embd", low=1),
                    check_int(n_layer, "n_layer", low=1),
                    check_int(n_head, "n_head", low=1),
                )
            self._hf = False
        else:
            if not isinstance(model, nn.Module) or not hasattr(model, "config"):
                raise TypeError(f"model must be None or a Hugging Face causal LM; got {type(model).__name__}")
            v = getattr(model.config, "vocab_size", None)
            if v is None or v < self.vocab_size + 2:
                raise ValueError(
                    f"model vocabulary must hold vocab_size + 2 = {self.vocab_size + 2} ids; got {v}"
                )
            npos = getattr(model.config, "n_positions", None) or getattr(
                model.config, "max_position_embeddings", None
            )
            if npos is not None and npos < ctx:
                raise ValueError(
                    f"model context must hold (history + 1) * seq_len + 2 = {ctx} tokens; got {npos}"
                )
            self._hf = True
        self.model = model
        self.seed = seed
        self.losses: list[float] = []
        self.fitted = False

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        if self._hf:
            return self.model(input_ids=ids).logits
        return self.model(ids)

    def _src_ids(self, src: np.ndarray) -> torch.Tensor:
        n = src.shape[0]
        bos = np.full((n, 1), self.bos)
        sep = np.full((n, 1), self.sep)
        return torch.as_tensor(np.concatenate([bos, src, sep], 1), dtype=torch.long)

    def fit(
        self,
        pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        epochs: int = 20,
        batch_size: int = 32,
        lr: float = 3e-3,
        seed: int | None = None,
    ) -> ExtrapolatorLM:
        """Train on ``(src, tgt)`` pairs (from :func:`build_pairs`) by teacher-forced cross-entropy on the
        target tokens (AdamW, shuffled mini-batches). All inputs are validated before any update."""
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence) or not pairs:
            raise ValueError(
                f"pairs must be a non-empty list of (src, tgt) pairs; got {type(pairs).__name__}"
            )
        if any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in pairs):
            raise ValueError("pairs must be a list of (src, tgt) pairs")
        src = as_tokens([p[0] for p in pairs], "pairs src", self.vocab_size, self.history * self.seq_len)
        tgt = as_tokens([p[1] for p in pairs], "pairs tgt", self.vocab_size, self.seq_len)
        ep = check_int(epochs, "epochs", low=1)
        bs = check_int(batch_size, "batch_size", low=1)
        rate = check_float(lr, "lr", low=-_MAX_ABS, high=_MAX_ABS)
        if rate <= 0:
            raise ValueError(f"lr must be > 0; got {rate}")
        gen = make_generator(self.seed if seed is None else seed)
        ids = torch.cat([self._src_ids(src), torch.as_tensor(tgt)], 1)
        n_src = src.shape[1] + 2
        opt = torch.optim.AdamW(self.model.parameters(), lr=rate, weight_decay=0.01)
        self.model.train()
        for _ in range(ep):
            perm = torch.randperm(len(ids), generator=gen)
            for b in range(0, len(ids), bs):
                batch = ids[perm[b : b + bs]]
                logits = self._logits(batch[:, :-1])[:, n_src - 1 :, : self.vocab_size]
                loss = nn.functional.cross_entropy(
                    logits.reshape(-1, self.vocab_size), batch[:, n_src:].reshape(-1)
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                self.losses.append(loss.item())
        self.model.eval()
        self.fitted = True
        return self

    def _require_fit(self) -> None:
        if not self.fitted:
            raise ValueError("ExtrapolatorLM is not fitted: call fit(...) first")

    @torch.no_grad()
    def step(
        self, src: Any, *, n_candidates: int = 1, greedy: bool = True, seed: int | None = None
    ) -> np.ndarray:
        """Decode the next state for each source: ``src`` (n, history·L) (or (n, L) when history = 1)
        -> (n, n_candidates, L). Greedy decoding (argmax) or ancestral sampling with ``seed``."""
        self._require_fit()
        s = as_tokens(src, "src", self.vocab_size, self.history * self.seq_len)
        k = check_int(n_candidates, "n_candidates", low=1)
        gen = make_generator(seed)
        ids = self._src_ids(np.repeat(s, k, axis=0))
        for _ in range(self.seq_len):
            logits = self._logits(ids)[:, -1, : self.vocab_size]
            if greedy:
                nxt = logits.argmax(-1)
            else:
                nxt = torch.multinomial(torch.softmax(logits.double(), -1), 1, generator=gen)[:, 0]
            ids = torch.cat([ids, nxt[:, None]], 1)
        return ids[:, -self.seq_len :].numpy().reshape(s.shape[0], k, self.seq_len)

    def transform(
        self,
        x: Any,
        n_steps: int = 5,
        *,
        n_candidates: int = 1,
        guide: Any = None,
        greedy: bool = True,
        seed: int | None = None,
    ) -> TransformResult:
        """Apply q_θ iteratively for up to ``n_steps`` steps from the seeds ``x`` (n, L).

        With a ``guide``, each step keeps the best of ``n_candidates`` by guide score and is accepted only
        if it improves on the current state (otherwise that sequence stops); ``guide_evals`` counts
        ``1 + n_steps·n_candidates`` calls per sequence. ``n_steps = 0`` returns the input.
        """
        X = as_tokens(x, "x", self.vocab_size, self.seq_len)
        T = check_int(n_steps, "n_steps", low=0)
        k = check_int(n_candidates, "n_candidates", low=1)
        if T > 0:
            self._require_fit()
        g = as_guide(guide, evaluation=True) if guide is not None else None
        if g is None and (k > 1):
            raise ValueError("n_candidates > 1 needs a guide to choose among the candidates")
        n, L = X.shape
        hist = [X] * self.history
        cur = X.copy()
        cur_s = g(cur) if g is not None else np.full(n, np.nan)
        active = np.ones(n, dtype=bool)
        traj, scs = [cur.copy()], [cur_s.copy()]
        for t in range(T):
            src = np.concatenate(hist[-self.history :], 1)
            step_seed = None if seed is None else seed + t
            if g is not None:
                rows = np.flatnonzero(active)  # stopped sequences are not decoded again
                if rows.size:
                    cand = self.step(src[rows], n_candidates=k, greedy=greedy, seed=step_seed)
                    cs = g(cand.reshape(rows.size * k, L)).reshape(rows.size, k)
                    best = cs.argmax(1)
                    new, new_s = cand[np.arange(rows.size), best], cs[np.arange(rows.size), best]
                    better = new_s > cur_s[rows]
                    active[:] = False
                    active[rows[better]] = True
                    cur, cur_s = cur.copy(), cur_s.copy()
                    cur[rows[better]], cur_s[rows[better]] = new[better], new_s[better]
            else:
                cur = self.step(src, n_candidates=1, greedy=greedy, seed=step_seed)[:, 0]
            hist.append(cur.copy())
            traj.append(cur.copy())
            scs.append(cur_s.copy())
        evals = (1 + T * k) if g is not None else 0
        return TransformResult(cur, np.stack(traj), np.stack(scs), evals)
