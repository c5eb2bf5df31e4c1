"""Joint MoE Scaling Laws: Mixture of Experts Can Be Memory Efficient — ICML 2025, P09: tiny MoE models.

Ludziejewski et al., ICML 2025 (arXiv:2502.05172) train decoder-only Transformers whose FFNs are
replaced by token-choice top-k MoE layers. For a CPU-scale check of the law's basic direction (more
experts at fixed active parameters and tokens lower the loss) this module has:

* :class:`MoEFFN` — a top-k routed FFN (softmax router, Switch-Transformer load-balancing loss
  ``E · Σ_i f_i · P_i``), sparse dispatch (each expert runs on its own tokens, so the FFN compute per
  token is that of ``k`` experts); ``router="random"`` assigns experts uniformly at random (an ablation);
* :class:`TinyDecoder` — a pre-LN causal Transformer LM whose FFNs are dense (``n_experts=1``) or MoE;
  both live in the area's common module :mod:`icml25.llm_efficiency.common.tiny_decoder` (the PENCIL
  experiment, P11, trains the same decoder) and are re-exported here;
* :class:`TopicBigramCorpus` — a synthetic corpus: a mixture of sparse random bigram "topics" that
  switch every ``switch_every`` tokens, with exact reference losses (the topic-aware oracle and the
  topic-agnostic bigram), so that capacity and the use of context matter.
"""

from __future__ import annotations

import numpy as np
import torch

from icml25.kernels.checks import check_array, check_int
from icml25.llm_efficiency.common.tiny_decoder import MoEFFN, TinyDecoder

__all__ = ["MoEFFN", "TinyDecoder", "TopicBigramCorpus"]


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
        self.vocab = check_int(vocab, "vocab", low=2)
        self.n_topics = check_int(n_topics, "n_topics", low=1)
        self.successors = check_int(successors, "successors", low=1)
        if self.successors > self.vocab:
            raise ValueError(f"successors must be <= vocab = {self.vocab}, got {self.successors}")
        self.switch_every = check_int(switch_every, "switch_every", low=1)
        rng = np.random.default_rng(check_int(seed, "seed", low=0))
        V, S = self.vocab, self.successors
        P = np.zeros((self.n_topics, V, V))
        for t in range(self.n_topics):
            for v in range(V):
                nxt = rng.choice(V, size=S, replace=False)
                P[t, v, nxt] = rng.dirichlet(np.ones(S))
        self.transition = P  # (topics, V, V)

    def sample(self, n_tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """A stream of ``n_tokens`` tokens and the topic of each, both ``(n_tokens,)`` int64 arrays."""
        n = check_int(n_tokens, "n_tokens", low=1)
        rng = np.random.default_rng(check_int(seed, "seed", low=0))
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
    def _ids(x: object, name: str, upper: int) -> np.ndarray:
        """``x`` (an array-like or a CPU tensor) as a 1-D int64 array of ids in ``[0, upper)``."""
        arr = check_array(x.numpy() if isinstance(x, torch.Tensor) else x, name, ndim=1, dtype="int")
        if arr.size and (arr.min() < 0 or arr.max() >= upper):
            raise ValueError(f"{name} must be in [0, {upper}), got range [{arr.min()}, {arr.max()}]")
        return arr.astype(np.int64)

    def reference_losses(self, tokens: np.ndarray, topics: np.ndarray) -> dict[str, float]:
        """Exact per-token losses (nats) of two reference predictors on a sampled stream.

        ``"oracle"``: ``−ln P_topic(x_i | x_{i−1})`` (knows the topic); ``"bigram"``: the stream's
        topic-agnostic bigram ``P(x_i | x_{i−1}) = Σ_t w_t(x_{i−1}) P_t(x_i | x_{i−1})`` with ``w_t``
        the posterior of topic ``t`` given the previous token under the topics' stationary laws.
        """
        tokens = self._ids(tokens, "tokens", self.vocab)
        topics = self._ids(topics, "topics", self.n_topics)
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
