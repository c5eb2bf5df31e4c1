"""Learning Extrapolative Sequence Transformations from Markov Chains — ICML 2025, P20: the toy sequence-design problem.

:class:`SequenceDesignToy` is a sequence-design problem with a hidden oracle (additive site weights plus
adjacent-pair motif bonuses) for the reproduction of :mod:`icml25.generative_models.mcmc_extrapolation`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from icml25.generative_models.mcmc_extrapolation import as_tokens
from icml25.kernels.checks import check_float, check_int

__all__ = ["SequenceDesignToy"]

_MAX_ABS = 1e12  # bound on a real argument (as in the chains' module)


# ------------------------------------------------------------------------------------------ toy problem


class SequenceDesignToy:
    """A sequence-design problem with a hidden oracle over ``vocab_size`` tokens and length ``length``:
    ``f(x) = Σ_i w[i, x_i] + bonus · #{i : (x_i, x_{i+1}) ∈ motifs}``, with ``w ~ N(0, 1)`` (L, V) and
    ``n_motifs`` random adjacent token pairs (the epistatic part), all fixed by ``seed``."""

    def __init__(
        self, length: int = 24, vocab_size: int = 8, *, n_motifs: int = 6, bonus: float = 1.5, seed: int = 0
    ) -> None:
        self.length = check_int(length, "length", low=2)
        self.vocab_size = check_int(vocab_size, "vocab_size", low=2)
        n_m = check_int(n_motifs, "n_motifs", low=0)
        if n_m > self.vocab_size**2:
            raise ValueError(f"n_motifs must be <= vocab_size**2 = {self.vocab_size**2}; got {n_m}")
        self.bonus = check_float(bonus, "bonus", low=-_MAX_ABS, high=_MAX_ABS)
        rng = np.random.default_rng(seed)
        self.weights = rng.normal(size=(self.length, self.vocab_size))
        pick = rng.choice(self.vocab_size**2, n_m, replace=False)
        self.motif_table = np.zeros((self.vocab_size, self.vocab_size))
        self.motif_table[pick // self.vocab_size, pick % self.vocab_size] = 1.0
        self.motifs = [(int(p // self.vocab_size), int(p % self.vocab_size)) for p in pick]

    def oracle(self, X: Any) -> np.ndarray:
        """The hidden property f (n,) of sequences ``X`` (n, L)."""
        arr = as_tokens(X, "X", self.vocab_size, self.length)
        add = self.weights[np.arange(self.length), arr].sum(1)
        return add + self.bonus * self.motif_table[arr[:, :-1], arr[:, 1:]].sum(1)

    oracle.is_oracle = True  # type: ignore[attr-defined]

    def sample(self, n: int, *, seed: int | None = None) -> np.ndarray:
        """``n`` uniformly random sequences (n, L)."""
        return np.random.default_rng(seed).integers(
            0, self.vocab_size, (check_int(n, "n", low=1), self.length)
        )

    def optimum(self) -> float:
        """The maximal oracle value (dynamic programming over adjacent pairs)."""
        best = self.weights[0].copy()
        for i in range(1, self.length):
            best = (best[:, None] + self.bonus * self.motif_table).max(0) + self.weights[i]
        return float(best.max())
