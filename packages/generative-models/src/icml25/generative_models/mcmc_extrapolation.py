"""Learning Extrapolative Sequence Transformations from Markov Chains — ICML 2025, P20: MCMC chains, episode selection and the learned extrapolator.

Hager, Khan, Wang & Andrews, "Learning Extrapolative Sequence Transformations from Markov Chains",
ICML 2025 (PMLR 267:21570–21590, arXiv 2505.20251; no official code repository was found).

The method has three phases:

1. **Markov chains.** Metropolis–Hastings on token sequences against an energy built from a cheap
   property guide, ``log p(x) = β·s(x) − λ·Hamming(x, x⁽⁰⁾)`` (:func:`energy_target`), with a pluggable
   proposal: a symmetric uniform substitution (:class:`SubstitutionProposal`) or a masked-LM infill
   (:class:`MaskInfillProposal`, any ``AutoModelForMaskedLM`` or a callable returning logits), whose
   forward and reverse log-probabilities enter the acceptance ratio.
2. **Episodes.** :func:`select_episode` keeps a few score-increasing states of each chain (the
   "improve by δ" rule, its "quantile" variant spread evenly in score up to the chain's best, and the
   "consecutive" ablation without selection); :func:`build_pairs` turns episodes into (previous kept
   state(s) → next kept state) training pairs, never across chains.
3. **Extrapolator.** :class:`~icml25.generative_models.mcmc_extrapolation_lm.ExtrapolatorLM` trains an
   autoregressive model q_θ on ``src <sep> tgt`` (a built-in tiny causal transformer, or any Hugging Face
   causal LM such as a random-init GPT-2) and applies it iteratively, keeping a step only if the guide
   improves (in :mod:`icml25.generative_models.mcmc_extrapolation_lm`).

:class:`~icml25.generative_models.mcmc_extrapolation_toy.SequenceDesignToy` (in
:mod:`icml25.generative_models.mcmc_extrapolation_toy`) is a sequence-design problem with a hidden oracle
(additive site weights plus adjacent-pair motif bonuses) for the reproduction; guides are callables or
scikit-learn regressors (:func:`as_guide`); :func:`as_tokens` validates token batches. The extrapolator and the
toy import this module, so their names are re-exported here lazily.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import nn

from icml25.kernels.checks import check_float, check_int

if TYPE_CHECKING:
    from icml25.generative_models.mcmc_extrapolation_lm import ExtrapolatorLM as ExtrapolatorLM
    from icml25.generative_models.mcmc_extrapolation_lm import TransformResult as TransformResult
    from icml25.generative_models.mcmc_extrapolation_toy import SequenceDesignToy as SequenceDesignToy

__all__ = [
    "Chain",
    "MaskInfillProposal",
    "SubstitutionProposal",
    "as_guide",
    "as_tokens",
    "build_pairs",
    "energy_target",
    "metropolis_hastings",
    "select_episode",
]

Rule = Literal["improve", "quantile", "consecutive"]
_MAX_ABS = 1e12
"""Bound on a real argument or score (moderate size: sums and exponentials of it stay finite)."""


# ------------------------------------------------------------------------------------------ validation


def as_tokens(x: Any, name: str, vocab_size: int | None = None, length: int | None = None) -> np.ndarray:
    """A batch of equal-length token sequences as an int64 array of shape (n, L) (1-D input: n = 1).

    Args:
        x: token ids: a list of equal-length lists, an integer array or tensor of shape (L,) or (n, L).
        name: the argument's name, for the error messages.
        vocab_size: if given, every id must lie in ``[0, vocab_size)``.
        length: if given, the sequence length L it must have.

    Raises:
        TypeError: the ids are not integers (bool, float, str, ...).
        ValueError: ragged sequences, another shape, an empty batch, the wrong length or out-of-vocabulary ids.
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"{name} must be equal-length token sequences; got ragged input ({exc})") from None
    if arr.dtype == object:
        raise ValueError(f"{name} must be equal-length token sequences of integers; got ragged/object input")
    if arr.dtype.kind not in "iu":  # bool, float, str, ... are not token ids
        raise TypeError(f"{name} must hold integer token ids; got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape (L,) or (n, L); got shape {tuple(arr.shape)}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty; got shape {tuple(arr.shape)}")
    if length is not None and arr.shape[1] != length:
        raise ValueError(f"{name} must have sequence length {length}; got length {arr.shape[1]}")
    if vocab_size is not None and (arr.min() < 0 or arr.max() >= vocab_size):
        bad = arr[(arr < 0) | (arr >= vocab_size)]
        raise ValueError(
            f"{name} must hold token ids in [0, {vocab_size}); got {bad.size} out-of-vocabulary ids "
            f"(e.g. {int(bad.flat[0])})"
        )
    return arr.astype(np.int64, copy=False)


def _check_values(values: Any, X: np.ndarray, name: str) -> np.ndarray:
    """Scores/log-densities returned by a user callable: shape (n,), finite, else raise with the sequence."""
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must return real numbers; got {type(values).__name__}") from None
    if v.ndim == 2 and v.shape[1] == 1:  # a regressor's (n, 1) column
        v = v[:, 0]
    if v.shape != (X.shape[0],):
        raise ValueError(f"{name} must return one value per sequence, shape ({X.shape[0]},); got {v.shape}")
    bad = ~np.isfinite(v)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name} returned a non-finite value {v[i]} for sequence {X[i].tolist()} "
            f"({int(bad.sum())} of {len(v)} non-finite)"
        )
    return v


# ------------------------------------------------------------------------------------------ guides, targets


class _Guide:
    """A guide score s(X) -> (n,) from a callable or a scikit-learn regressor (``predict``)."""

    def __init__(self, guide: Any) -> None:
        self.inner = guide
        self.is_oracle = bool(getattr(guide, "is_oracle", False))

    def __call__(self, X: Any) -> np.ndarray:
        arr = as_tokens(X, "X")
        out = self.inner.predict(arr) if hasattr(self.inner, "predict") else self.inner(arr)
        return _check_values(out, arr, "guide")


def as_guide(guide: Any, *, evaluation: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap a guide score: a scikit-learn regressor (its ``predict`` gets the (n, L) int token array, so
    use a pipeline with e.g. ``OneHotEncoder``) or a callable ``(n, L) -> (n,)``. The wrapper validates
    the output (one finite value per sequence; a NaN/inf raises naming the sequence).

    ``evaluation=True`` warns when ``guide`` is the evaluation oracle (``guide.is_oracle``): guiding
    the search with the oracle it is scored by leaks the test metric.
    """
    if isinstance(guide, _Guide):
        g = guide
    elif hasattr(guide, "predict") or callable(guide):
        g = _Guide(guide)
    else:
        raise TypeError(
            f"guide must be a callable (n, L) -> (n,) or a regressor with predict; got {type(guide).__name__}"
        )
    if evaluation and g.is_oracle:
        warnings.warn(
            "guide is the evaluation oracle (leakage): the reported oracle score is no longer held out",
            UserWarning,
            stacklevel=2,
        )
    return g


def energy_target(
    guide: Any, x0: Any, *, beta: float = 1.0, lam: float = 0.05
) -> Callable[[np.ndarray], np.ndarray]:
    """The unnormalised MH target ``log p(x) = β·s(x) − λ·Hamming(x, x⁽⁰⁾)`` for a batch of chains.

    ``x0``: (n, L) seeds, one per chain (row i of the evaluated batch is compared with row i of ``x0``).
    Returns a callable ``X (n, L) -> (n,)``.
    """
    g = as_guide(guide)
    seeds = as_tokens(x0, "x0")
    b = check_float(beta, "beta", low=0.0, high=_MAX_ABS)
    lm = check_float(lam, "lam", low=0.0, high=_MAX_ABS)

    def log_target(X: np.ndarray) -> np.ndarray:
        arr = as_tokens(X, "X", length=seeds.shape[1])
        if arr.shape[0] != seeds.shape[0]:
            raise ValueError(f"X must have one row per chain ({seeds.shape[0]}); got {arr.shape[0]}")
        return b * g(arr) - lm * (arr != seeds).sum(1)

    log_target.guide = g  # type: ignore[attr-defined]
    return log_target


# ------------------------------------------------------------------------------------------ proposals


class SubstitutionProposal:
    """Symmetric proposal: substitute ``k`` uniformly chosen positions (``k`` uniform in ``sites``) by
    a uniformly drawn *different* token. ``q(x'|x) = q(x|x')``, so the returned log-ratios cancel."""

    def __init__(self, vocab_size: int, sites: Sequence[int] = (1, 2)) -> None:
        self.vocab_size = check_int(vocab_size, "vocab_size", low=2)
        if isinstance(sites, (int, np.integer)):
            sites = (int(sites),)
        sites = tuple(sites)
        if not sites or any(
            isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1 for s in sites
        ):
            raise ValueError(f"sites must be a non-empty sequence of ints >= 1; got {sites!r}")
        self.sites = tuple(int(s) for s in sites)

    def _log_q(self, L: int, k: np.ndarray) -> np.ndarray:
        # P(k) · 1/C(L, k) · (1/(V-1))^k
        lg = np.array([math.lgamma(L + 1) - math.lgamma(kk + 1) - math.lgamma(L - kk + 1) for kk in k])
        return -math.log(len(self.sites)) - lg - k * math.log(self.vocab_size - 1)

    def propose(self, X: Any, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Propose for each row of ``X`` (n, L): returns ``(X', log q(X'|X), log q(X|X'))``, (n, L), (n,), (n,)."""
        arr = as_tokens(X, "X", self.vocab_size)
        n, L = arr.shape
        if max(self.sites) > L:
            raise ValueError(f"sites must not exceed the sequence length {L}; got {self.sites}")
        k = np.asarray(self.sites)[rng.integers(0, len(self.sites), n)]
        order = np.argsort(rng.random((n, L)), axis=1)
        mask = np.zeros((n, L), dtype=bool)
        rows = np.repeat(np.arange(n), k)
        cols = np.concatenate([order[i, : k[i]] for i in range(n)])
        mask[rows, cols] = True
        shift = rng.integers(1, self.vocab_size, size=(n, L))
        new = np.where(mask, (arr + shift) % self.vocab_size, arr)
        lq = self._log_q(L, k)
        return new, lq, lq.copy()


class MaskInfillProposal:
    """Masked-LM infill proposal: mask positions, sample the masked tokens from the MLM, and return the
    exact forward and reverse log-probabilities.

    A mask of ``k = max(1, round(mask_frac·L))`` positions (a uniform subset, or a contiguous span with
    ``span=True``) is replaced by ``mask_token_id``; one MLM call gives logits ``(n, L, V)``; new tokens
    are drawn independently at the masked positions from ``softmax`` (restricted to ``allowed_tokens``
    when given). With the same mask, the masked input of ``x'`` equals that of ``x``, so
    ``log q(x'|x) = Σ_masked log p(x'_i | x_masked)`` and ``log q(x|x') = Σ_masked log p(x_i | x_masked)``
    (the mask's own probability is the same in both directions and cancels).

    ``mlm``: a Hugging Face ``AutoModelForMaskedLM`` (anything whose call with ``input_ids`` returns an
    object with ``.logits``) or a callable ``(n, L) int array -> (n, L, V)`` logits.
    """

    def __init__(
        self,
        mlm: Any,
        mask_token_id: int,
        *,
        mask_frac: float = 0.15,
        span: bool = False,
        allowed_tokens: Sequence[int] | None = None,
        temperature: float = 1.0,
    ) -> None:
        if not callable(mlm):
            raise TypeError(
                f"mlm must be a masked LM or a callable returning logits; got {type(mlm).__name__}"
            )
        mf = check_float(mask_frac, "mask_frac", low=-_MAX_ABS, high=_MAX_ABS)
        if not 0.0 < mf < 1.0:
            raise ValueError(f"mask_frac must be in (0, 1); got {mf}")
        self.mask_token_id = check_int(mask_token_id, "mask_token_id", low=0)
        t = check_float(temperature, "temperature", low=-_MAX_ABS, high=_MAX_ABS)
        if t <= 0:
            raise ValueError(f"temperature must be > 0; got {t}")
        self.mlm, self.mask_frac, self.span, self.temperature = mlm, mf, bool(span), t
        self.allowed = None
        if allowed_tokens is not None:
            allowed = np.unique(as_tokens(list(allowed_tokens), "allowed_tokens")[0])
            if allowed.size < 2 or self.mask_token_id in allowed:
                raise ValueError(
                    f"allowed_tokens must list >= 2 token ids, not the mask token; got {allowed.tolist()}"
                )
            self.allowed = allowed

    def n_masked(self, L: int) -> int:
        """Number of masked positions for a sequence of length ``L``."""
        return min(L, max(1, round(self.mask_frac * L)))

    def sample_mask(self, n: int, L: int, rng: np.random.Generator) -> np.ndarray:
        """A boolean (n, L) mask, ``n_masked(L)`` positions per row (a span if ``span``)."""
        k = self.n_masked(L)
        mask = np.zeros((n, L), dtype=bool)
        if self.span:
            start = rng.integers(0, L - k + 1, n)
            for i in range(n):
                mask[i, start[i] : start[i] + k] = True
        else:
            idx = np.argsort(rng.random((n, L)), axis=1)[:, :k]
            np.put_along_axis(mask, idx, True, axis=1)
        return mask

    def log_probs(self, X_masked: np.ndarray) -> np.ndarray:
        """Infill log-probabilities (n, L, V) of the MLM at a masked batch (restricted to ``allowed_tokens``)."""
        if hasattr(self.mlm, "config") and isinstance(self.mlm, nn.Module):
            with torch.no_grad():
                ids = torch.as_tensor(X_masked, dtype=torch.long)
                logits = self.mlm(input_ids=ids).logits.float().cpu().numpy()
        else:
            out = self.mlm(X_masked)
            logits = out.detach().float().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
        n, L = X_masked.shape
        if logits.ndim != 3 or logits.shape[:2] != (n, L):
            raise ValueError(f"mlm must return logits of shape (n, L, V) = ({n}, {L}, V); got {logits.shape}")
        logits = logits.astype(np.float64) / self.temperature
        if self.allowed is not None:
            if self.allowed.max() >= logits.shape[2]:
                raise ValueError(f"allowed_tokens exceed the MLM vocabulary ({logits.shape[2]})")
            keep = np.full(logits.shape[2], -np.inf)
            keep[self.allowed] = 0.0
            logits = logits + keep
        if not np.all(np.isfinite(logits.max(2))):
            raise ValueError("mlm returned non-finite logits")
        m = logits.max(2, keepdims=True)
        return logits - (m + np.log(np.exp(logits - m).sum(2, keepdims=True)))

    def propose(self, X: Any, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Propose for each row of ``X`` (n, L): returns ``(X', log q(X'|X), log q(X|X'))``, (n, L), (n,), (n,)."""
        arr = as_tokens(X, "X")
        n, L = arr.shape
        mask = self.sample_mask(n, L, rng)
        masked = np.where(mask, self.mask_token_id, arr)
        lp = self.log_probs(masked)
        if arr.max() >= lp.shape[2]:
            raise ValueError(
                f"X must hold token ids in [0, {lp.shape[2]}) (the MLM vocabulary); got {arr.max()}"
            )
        p = np.exp(lp)
        cum = np.cumsum(p, axis=2)
        u = rng.random((n, L, 1)) * cum[:, :, -1:]
        draw = np.minimum((cum < u).sum(2), lp.shape[2] - 1)
        new = np.where(mask, draw, arr)
        fwd = (np.take_along_axis(lp, new[:, :, None], 2)[:, :, 0] * mask).sum(1)
        rev_terms = np.take_along_axis(lp, arr[:, :, None], 2)[:, :, 0]
        rev = np.where(mask, rev_terms, 0.0).sum(1)  # -inf when the old token is outside allowed_tokens
        return new, fwd, rev


# ------------------------------------------------------------------------------------------ MCMC


@dataclass
class Chain:
    """One Markov chain: ``states`` (T+1, L) int, ``scores`` (T+1,) guide scores, ``log_p`` (T+1,)
    target log-densities, ``accepted`` (T,) bool."""

    states: np.ndarray
    scores: np.ndarray
    log_p: np.ndarray
    accepted: np.ndarray

    @property
    def acceptance_rate(self) -> float:
        """Fraction of accepted proposals."""
        return float(self.accepted.mean()) if self.accepted.size else 0.0


def metropolis_hastings(
    x0: Any,
    log_target: Callable[[np.ndarray], np.ndarray],
    proposal: Any,
    n_steps: int,
    *,
    guide: Any = None,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
) -> list[Chain]:
    """Run one Metropolis–Hastings chain per row of ``x0`` (n, L), vectorised over chains.

    Accepts ``x'`` with probability ``min(1, p(x') q(x|x') / (p(x) q(x'|x)))``. ``log_target``: a
    callable ``(n, L) -> (n,)`` (row i belongs to chain i, see :func:`energy_target`); ``proposal``:
    anything with ``propose(X, rng) -> (X', log q(X'|X), log q(X|X'))``; ``guide``: the score stored
    per state (default: ``log_target.guide`` if present, else the log target). Chains without any
    accepted move raise a warning. Returns ``n`` :class:`Chain` objects of ``n_steps + 1`` states.
    """
    X = as_tokens(x0, "x0")
    T = check_int(n_steps, "n_steps", low=1)
    if not callable(log_target):
        raise TypeError(f"log_target must be a callable (n, L) -> (n,); got {type(log_target).__name__}")
    if not hasattr(proposal, "propose"):
        raise TypeError(f"proposal must have a propose(X, rng) method; got {type(proposal).__name__}")
    if guide is None:
        guide = getattr(log_target, "guide", None)
    g = as_guide(guide) if guide is not None else None
    gen = rng if rng is not None else np.random.default_rng(seed)
    n, L = X.shape
    states = np.empty((T + 1, n, L), dtype=np.int64)
    lps = np.empty((T + 1, n))
    scores = np.empty((T + 1, n))
    acc = np.zeros((T, n), dtype=bool)
    lp = _check_values(log_target(X), X, "log_target")
    sc = g(X) if g is not None else lp
    states[0], lps[0], scores[0] = X, lp, sc
    for t in range(T):
        Xn, fwd, rev = proposal.propose(X, gen)
        Xn = as_tokens(Xn, "proposal output", length=L)
        lpn = _check_values(log_target(Xn), Xn, "log_target")
        scn = g(Xn) if g is not None else lpn
        log_alpha = lpn - lp + np.asarray(rev, dtype=np.float64) - np.asarray(fwd, dtype=np.float64)
        log_alpha = np.nan_to_num(log_alpha, nan=-np.inf)
        a = np.log(gen.random(n)) < np.minimum(log_alpha, 0.0)
        X = np.where(a[:, None], Xn, X)
        lp, sc = np.where(a, lpn, lp), np.where(a, scn, sc)
        states[t + 1], lps[t + 1], scores[t + 1], acc[t] = X, lp, sc, a
    chains = [
        Chain(states[:, i].copy(), scores[:, i].copy(), lps[:, i].copy(), acc[:, i].copy()) for i in range(n)
    ]
    stuck = sum(not c.accepted.any() for c in chains)
    if stuck:
        warnings.warn(
            f"{stuck} of {n} chains accepted no move in {T} steps: lower the mask fraction or the energy scale",
            UserWarning,
            stacklevel=2,
        )
    return chains


# ------------------------------------------------------------------------------------------ episodes, pairs


def _chain_arrays(chain: Any) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(chain, Chain):
        return chain.states, chain.scores
    try:
        items = list(chain)
    except TypeError:
        raise TypeError(
            f"chain must be a Chain or a list of (sequence, score) pairs; got {type(chain).__name__}"
        ) from None
    if not items:
        raise ValueError("chain must be non-empty; got 0 states")
    if any(not isinstance(it, (tuple, list)) or len(it) != 2 for it in items):
        raise ValueError("chain must be a Chain or a list of (sequence, score) pairs")
    states = as_tokens([it[0] for it in items], "chain states")
    scores = np.asarray([check_float(it[1], "chain score", low=-_MAX_ABS, high=_MAX_ABS) for it in items])
    return states, scores


def select_episode(
    chain: Any,
    *,
    rule: Rule = "improve",
    delta: float = 0.0,
    max_len: int = 5,
    seed: int | None = None,
) -> list[list[int]]:
    """Select an episode ``x⁽⁰⁾, x^(a₁), …`` of at most ``max_len`` states from one chain.

    ``chain``: a :class:`Chain` or a list of ``(sequence, score)`` pairs (chains from any sampler).

    - ``"improve"``: walk the chain and keep a state when its score exceeds the last kept one by at
      least ``delta`` (and strictly); stop after ``max_len`` states (the first-m rule).
    - ``"quantile"``: the states passing the improve rule over the *whole* chain, thinned to
      ``max_len`` states evenly spaced in score from ``x⁽⁰⁾`` to the chain's best passing state.
    - ``"consecutive"``: no selection (ablation): ``max_len`` consecutive states from a random start.

    The first two start at ``x⁽⁰⁾`` and have strictly increasing scores.
    """
    states, scores = _chain_arrays(chain)
    m = check_int(max_len, "max_len", low=2)
    d = check_float(delta, "delta", low=0.0, high=_MAX_ABS)
    if rule == "consecutive":
        start = int(np.random.default_rng(seed).integers(0, max(1, len(states) - m + 1)))
        return [s.tolist() for s in states[start : start + m]]
    if rule not in ("improve", "quantile"):
        raise ValueError(f"rule must be 'improve', 'quantile' or 'consecutive'; got {rule!r}")
    kept = [0]
    for t in range(1, len(states)):
        if scores[t] > scores[kept[-1]] and scores[t] - scores[kept[-1]] >= d:
            kept.append(t)
            if rule == "improve" and len(kept) == m:
                break
    if rule == "quantile" and len(kept) > m:
        s0, best = scores[kept[0]], scores[kept[-1]]
        chosen = [kept[0]]
        for j in range(1, m - 1):
            target = s0 + j / (m - 1) * (best - s0)
            cand = next(i for i in kept if scores[i] >= target)
            if scores[cand] > scores[chosen[-1]] and cand != kept[-1]:
                chosen.append(cand)
        chosen.append(kept[-1])
        kept = chosen
    return [states[t].tolist() for t in kept]


def build_pairs(
    episodes: Sequence[Sequence[Sequence[int]]], *, history: int = 1
) -> list[tuple[list[int], list[int]]]:
    """Training pairs (src, tgt) within each episode: ``tgt`` is a kept state, ``src`` the ``history``
    kept states before it, oldest first, concatenated (left-padded by repeating the episode's first
    state, so every src has ``history·L`` tokens). Pairs never cross episodes (chains/seeds).

    Raises when no episode has two states (e.g. chains that never accepted a move).
    """
    h = check_int(history, "history", low=1)
    if isinstance(episodes, (str, bytes)) or not isinstance(episodes, Sequence):
        raise TypeError(
            f"episodes must be a list of episodes (lists of sequences); got {type(episodes).__name__}"
        )
    pairs: list[tuple[list[int], list[int]]] = []
    length = None
    for e, ep in enumerate(episodes):
        arr = as_tokens(ep, f"episodes[{e}]", length=length)
        length = arr.shape[1]
        for j in range(1, len(arr)):
            idx = [max(0, j - h + i) for i in range(h)]
            pairs.append((arr[idx].reshape(-1).tolist(), arr[j].tolist()))
    if not pairs:
        raise ValueError(
            f"episodes produced no training pairs: all {len(episodes)} episodes have fewer than 2 states "
            "(chains without accepted improving moves)"
        )
    return pairs


# The extrapolator and the toy import this module (as_guide, as_tokens), so they are re-exported lazily
# (PEP 562).
_MOVED = {
    "ExtrapolatorLM": "icml25.generative_models.mcmc_extrapolation_lm",
    "TransformResult": "icml25.generative_models.mcmc_extrapolation_lm",
    "SequenceDesignToy": "icml25.generative_models.mcmc_extrapolation_toy",
}


def __getattr__(name: str) -> Any:
    """``ExtrapolatorLM`` / ``TransformResult`` (:mod:`icml25.generative_models.mcmc_extrapolation_lm`) and
    ``SequenceDesignToy`` (:mod:`icml25.generative_models.mcmc_extrapolation_toy`), imported on first access."""
    if name in _MOVED:
        value = getattr(importlib.import_module(_MOVED[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
