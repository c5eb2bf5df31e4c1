"""Detecting Strategic Deception Using Linear Probes — ICML 2025, P52: a synthetic activation simulator with a known optimum.

No public dataset carries deception labels at a CPU-sized scale, so the reproduction plants a deception
direction in synthetic token activations that share the nuisances of real residual streams, and
compares the probes with the *oracle*: the Fisher direction ``Σ⁻¹u`` applied to dialogue means, which
is optimal for honest-vs-deceptive dialogues here. Every magnitude is stated in whitened units (the
Mahalanobis norm ``‖Σ^{-1/2} δ‖`` of a shift ``δ``), so it does not depend on the random spectrum.

Generator (per dialogue ``i`` with ``n_i`` masked tokens, uniform in ``tokens``):

* token noise ``ε_t ~ N(0, Σ)``, ``Σ = R diag(λ) Rᵀ`` with ``λ`` log-uniform in ``eig_range`` and a random
  rotation ``R``; dialogue-level noise ``η_i ~ N(0, ρ Σ)`` shared by all tokens of the dialogue
  (``rho``: its size relative to the token noise), so averaging tokens cannot remove it;
* a global offset ``μ₀`` (``offset``), present everywhere (the residual stream is not centred);
* deception: ``+ signal`` along ``u`` on each token of a deceptive dialogue with probability
  ``f_i ~ U(signal_frac)``; ``u`` has cosine ``top_overlap`` with the span of the ``n_top``
  highest-variance eigenvectors;
* ``"train"`` split (Instructed-Pairs-like): ``+ cue`` along ``w`` on every deceptive token (the
  "was told to lie" instruction artefact), absent at evaluation;
* ``"eval"`` split: a context shift ``c_eval`` (``context``), and ``+ nuisance`` along ``v`` (the
  lowest-variance eigenvector, e.g. deception-related topic words) on a random half of the honest and
  half of the deceptive dialogues;
* ``"control"`` split (Alpaca-like, labels -1): no ``u``, ``w`` or ``v``, its own context shift ``c_ctrl``.

``w``, ``v``, ``c_eval`` and ``c_ctrl`` are orthogonal to ``u`` in the whitened metric, so the oracle
score is blind to them and only a probe's estimation error (or a learned cue) lets them in. Padded
positions hold a fixed "pad token" activation of whitened norm ``pad`` (real pad/BOS activations are
often orders of magnitude larger than content tokens), so any read of the padding shows.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from icml25.interpretability.deception_probes.data import CONTROL, DECEPTIVE, HONEST, TokenActs
from icml25.interpretability.deception_probes.scoring import aggregate_token_scores
from icml25.kernels.checks import check_float, check_int

__all__ = ["DeceptionSimulator"]

_SPLITS = {"train": 0, "eval": 1, "control": 2}


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x)


class DeceptionSimulator:
    """Synthetic detection-span activations with a planted deception direction (see the module docstring).

    Args:
        d: activation width (the paper: 8192 for Llama-3.3-70B; our CPU scale: 128, quick 64).
        seed: the geometry (spectrum, rotation, directions) comes from ``numpy.random.default_rng(seed)``.
        eig_range: range of the log-uniform noise eigenvalues.
        top_overlap, n_top: cosine of ``u`` with the top-``n_top`` eigenvector span (default ``d // 16``).
        rho: dialogue-level noise covariance ``rho · Σ`` (0: independent tokens).
        signal, cue, nuisance, context, offset, pad: whitened norms of ``u``-shift per carrying token, of
            the training cue ``w``, of the evaluation nuisance ``v``, of each split's context shift, of the
            global offset and of the padding activation.
        tokens: inclusive range of masked tokens per dialogue.
        signal_frac: range of the per-dialogue probability that a deceptive token carries ``u``.

    Attributes: ``cov`` (Σ), ``u`` (unit, raw space), ``oracle_direction`` (``∝ Σ⁻¹u``, the Fisher
    direction), and the raw shift vectors ``shift_u``, ``shift_w``, ``shift_v``, ``shift_eval``,
    ``shift_control``, ``offset_vector``, ``pad_vector``.
    """

    def __init__(
        self,
        d: int = 128,
        seed: int = 0,
        *,
        eig_range: tuple[float, float] = (0.05, 20.0),
        top_overlap: float = 0.5,
        n_top: int | None = None,
        rho: float = 1.0,
        signal: float = 3.75,
        cue: float = 1.0,
        nuisance: float = 2.0,
        context: float = 3.0,
        offset: float = 5.0,
        pad: float = 100.0,
        tokens: tuple[int, int] = (10, 60),
        signal_frac: tuple[float, float] = (0.6, 1.0),
    ) -> None:
        self.d = check_int(d, "d", low=4)
        self.seed = check_int(seed, "seed", low=0)
        lo, hi = (float(v) for v in eig_range)
        if not (0 < lo <= hi < math.inf):
            raise ValueError(f"eig_range must satisfy 0 < low <= high < inf, got {eig_range!r}")
        check_float(top_overlap, "top_overlap", low=0, high=1)
        self.n_top = max(1, self.d // 16) if n_top is None else check_int(n_top, "n_top", low=1)
        if self.n_top >= self.d:
            raise ValueError(f"n_top must be < d = {self.d}, got {self.n_top}")
        self.rho = check_float(rho, "rho", low=0)
        self.signal, self.cue, self.nuisance = (
            check_float(v, k, low=0) for k, v in (("signal", signal), ("cue", cue), ("nuisance", nuisance))
        )
        self.context, self.offset, self.pad = (
            check_float(v, k, low=0) for k, v in (("context", context), ("offset", offset), ("pad", pad))
        )
        if len(tokens) != 2 or check_int(tokens[0], "tokens[0]", low=1) > check_int(
            tokens[1], "tokens[1]", low=1
        ):
            raise ValueError(f"tokens must be (low, high) with 1 <= low <= high, got {tokens!r}")
        self.tokens = (int(tokens[0]), int(tokens[1]))
        f_lo, f_hi = (float(v) for v in signal_frac)
        if not (0 <= f_lo <= f_hi <= 1):
            raise ValueError(f"signal_frac must satisfy 0 <= low <= high <= 1, got {signal_frac!r}")
        self.signal_frac = (f_lo, f_hi)

        rng = np.random.default_rng(self.seed)
        eig = np.sort(np.exp(rng.uniform(math.log(lo), math.log(hi), self.d)))[::-1]
        q, r = np.linalg.qr(rng.standard_normal((self.d, self.d)))
        rot = q * np.sign(np.diag(r))
        self.eigenvalues = eig
        self.cov = (rot * eig) @ rot.T
        self._sqrt = rot * np.sqrt(eig)  # L with L Lᵀ = Σ: whitened -> raw
        inv_sqrt = (rot / np.sqrt(eig)).T  # L⁻¹: raw -> whitened
        top = rot[:, : self.n_top]
        t = top @ _unit(rng.standard_normal(self.n_top))
        rest = rng.standard_normal(self.d)
        rest = _unit(rest - top @ (top.T @ rest))
        self.u = _unit(top_overlap * t + math.sqrt(1 - top_overlap**2) * rest)
        u_white = _unit(inv_sqrt @ self.u)

        def orthogonal(x: np.ndarray) -> np.ndarray:  # whitened unit vector orthogonal to u
            return _unit(x - u_white * (u_white @ x))

        self.oracle_direction = inv_sqrt.T @ u_white
        self.shift_u = self.signal * self._sqrt @ u_white
        self.shift_w = self.cue * self._sqrt @ orthogonal(rng.standard_normal(self.d))
        self.shift_v = self.nuisance * self._sqrt @ orthogonal(inv_sqrt @ rot[:, -1])
        self.shift_eval = self.context * self._sqrt @ orthogonal(rng.standard_normal(self.d))
        self.shift_control = self.context * self._sqrt @ orthogonal(rng.standard_normal(self.d))
        self.offset_vector = self.offset * self._sqrt @ _unit(rng.standard_normal(self.d))
        self.pad_vector = self.offset_vector + self.pad * self._sqrt @ _unit(rng.standard_normal(self.d))

    def sample(
        self, n: int, split: str, seed: int = 0, *, cue: float | None = None, nuisance: float | None = None
    ) -> TokenActs:
        """``n`` dialogues of ``split`` (``"train"``, ``"eval"`` or ``"control"``) as float32 :class:`TokenActs`.

        Train and eval alternate honest (0) and deceptive (1) labels; control dialogues are labelled -1.
        ``cue`` / ``nuisance`` override the simulator's magnitudes for this call only; the random draws do
        not depend on them, so ``sample(..., cue=0)`` is the same data without the cue.
        """
        n = check_int(n, "n", low=1)
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {sorted(_SPLITS)}, got {split!r}")
        seed = check_int(seed, "seed", low=0)
        cue = self.cue if cue is None else check_float(cue, "cue", low=0)
        nuisance = self.nuisance if nuisance is None else check_float(nuisance, "nuisance", low=0)
        if (cue > 0 and self.cue == 0) or (nuisance > 0 and self.nuisance == 0):
            raise ValueError("cue and nuisance can only be rescaled when the simulator's own value is > 0")
        cue_scale = cue / self.cue if self.cue else 0.0
        nuisance_scale = nuisance / self.nuisance if self.nuisance else 0.0
        rng = np.random.default_rng((self.seed, seed, _SPLITS[split]))
        lengths = rng.integers(self.tokens[0], self.tokens[1] + 1, n)
        frac = rng.uniform(*self.signal_frac, n)
        if split == "control":
            labels = np.full(n, CONTROL)
        else:
            labels = np.where(np.arange(n) % 2 == 1, DECEPTIVE, HONEST)
        carries_v = np.zeros(n, dtype=bool)
        for cls in (HONEST, DECEPTIVE):
            members = rng.permutation(np.flatnonzero(labels == cls))
            if split == "eval":
                carries_v[members[: len(members) // 2]] = True
        dialogue = np.repeat(np.arange(n), lengths)
        z = rng.standard_normal((int(lengths.sum()), self.d))
        z += math.sqrt(self.rho) * rng.standard_normal((n, self.d))[dialogue]
        carries_u = rng.random(len(dialogue)) < frac[dialogue]

        base = np.broadcast_to(self.offset_vector, (n, self.d)).copy()
        deceptive = labels == DECEPTIVE
        if split == "eval":
            base += self.shift_eval + np.outer(carries_v, nuisance_scale * self.shift_v)
        elif split == "control":
            base += self.shift_control
        else:
            base[deceptive] += cue_scale * self.shift_w
        x = z @ self._sqrt.T + base[dialogue]
        x[deceptive[dialogue] & carries_u] += self.shift_u

        t = int(lengths.max())
        acts = np.broadcast_to(self.pad_vector.astype(np.float32), (n, t, self.d)).copy()
        position = np.arange(len(dialogue)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        acts[dialogue, position] = x
        mask = np.zeros((n, t), dtype=bool)
        mask[dialogue, position] = True
        return TokenActs(torch.from_numpy(acts), torch.from_numpy(mask), torch.from_numpy(labels))

    def oracle_scores(self, acts: TokenActs, aggregation: str = "mean") -> np.ndarray:
        """Dialogue scores of the oracle: ``x · Σ⁻¹u`` per token, aggregated (the mean: Fisher on the means)."""
        if not isinstance(acts, TokenActs):
            raise TypeError(f"acts must be a TokenActs, got {type(acts).__name__}")
        if acts.n_features != self.d:
            raise ValueError(f"acts must have d = {self.d} features, got {acts.n_features}")
        tokens, _ = acts.tokens()
        return aggregate_token_scores(
            tokens.double().numpy() @ self.oracle_direction, acts.lengths, aggregation
        )
