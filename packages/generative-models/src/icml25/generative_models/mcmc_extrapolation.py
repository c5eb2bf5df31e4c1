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
3. **Extrapolator.** :class:`ExtrapolatorLM` trains an autoregressive model q_θ on ``src <sep> tgt``
   (a built-in tiny causal transformer, or any Hugging Face causal LM such as a random-init GPT-2) and
   applies it iteratively (:meth:`ExtrapolatorLM.transform`), keeping a step only if the guide improves.

:class:`SequenceDesignToy` is a sequence-design problem with a hidden oracle (additive site weights plus
adjacent-pair motif bonuses) for the reproduction; guides are callables or scikit-learn regressors
(:func:`as_guide`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "Chain",
    "ExtrapolatorLM",
    "MaskInfillProposal",
    "SequenceDesignToy",
    "SubstitutionProposal",
    "TransformResult",
    "as_guide",
    "build_pairs",
    "energy_target",
    "metropolis_hastings",
    "select_episode",
]

Rule = Literal["improve", "quantile", "consecutive"]


# ------------------------------------------------------------------------------------------ validation


def _as_tokens(x: Any, name: str, vocab_size: int | None = None, length: int | None = None) -> np.ndarray:
    """A batch of equal-length token sequences as an int64 array of shape (n, L) (1-D input: n = 1)."""
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


def _pos_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}; got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value}")
    return int(value)


def _finite_float(value: Any, name: str, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v) or abs(v) > 1e12:
        raise ValueError(f"{name} must be finite and of moderate size (|{name}| <= 1e12); got {v}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {v}")
    return v


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
        arr = _as_tokens(X, "X")
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
    seeds = _as_tokens(x0, "x0")
    b = _finite_float(beta, "beta", 0.0)
    lm = _finite_float(lam, "lam", 0.0)

    def log_target(X: np.ndarray) -> np.ndarray:
        arr = _as_tokens(X, "X", length=seeds.shape[1])
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
        self.vocab_size = _pos_int(vocab_size, "vocab_size", 2)
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
        arr = _as_tokens(X, "X", self.vocab_size)
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
        mf = _finite_float(mask_frac, "mask_frac")
        if not 0.0 < mf < 1.0:
            raise ValueError(f"mask_frac must be in (0, 1); got {mf}")
        self.mask_token_id = _pos_int(mask_token_id, "mask_token_id", 0)
        t = _finite_float(temperature, "temperature")
        if t <= 0:
            raise ValueError(f"temperature must be > 0; got {t}")
        self.mlm, self.mask_frac, self.span, self.temperature = mlm, mf, bool(span), t
        self.allowed = None
        if allowed_tokens is not None:
            allowed = np.unique(_as_tokens(list(allowed_tokens), "allowed_tokens")[0])
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
        arr = _as_tokens(X, "X")
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
    X = _as_tokens(x0, "x0")
    T = _pos_int(n_steps, "n_steps", 1)
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
        Xn = _as_tokens(Xn, "proposal output", length=L)
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
    states = _as_tokens([it[0] for it in items], "chain states")
    scores = np.asarray([_finite_float(it[1], "chain score") for it in items])
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
    m = _pos_int(max_len, "max_len", 2)
    d = _finite_float(delta, "delta", 0.0)
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
    h = _pos_int(history, "history", 1)
    if isinstance(episodes, (str, bytes)) or not isinstance(episodes, Sequence):
        raise TypeError(
            f"episodes must be a list of episodes (lists of sequences); got {type(episodes).__name__}"
        )
    pairs: list[tuple[list[int], list[int]]] = []
    length = None
    for e, ep in enumerate(episodes):
        arr = _as_tokens(ep, f"episodes[{e}]", length=length)
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
    cfg = GPT2Config(vocab_size=vocab, n_positions=ctx, n_embd=_pos_int(n_embd, "n_embd"),
                     n_layer=_pos_int(n_layer, "n_layer"), n_head=_pos_int(n_head, "n_head"))  # fmt: skip
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
        self.vocab_size = _pos_int(vocab_size, "vocab_size", 2)
        self.seq_len = _pos_int(seq_len, "seq_len", 1)
        self.history = _pos_int(history, "history", 1)
        self.sep, self.bos = self.vocab_size, self.vocab_size + 1
        ctx = (self.history + 1) * self.seq_len + 2
        if isinstance(model, str):
            if model != "gpt2":
                raise ValueError(f"model must be None, 'gpt2' or a Hugging Face causal LM; got {model!r}")
            model = _gpt2(self.vocab_size + 2, ctx, n_embd, n_layer, n_head, seed)
        if model is None:
            with isolated_rng(seed):
                model = _TinyCausalLM(
                    self.vocab_size + 2, ctx, _pos_int(n_embd, "n_embd"), _pos_int(n_layer, "n_layer"),
                    _pos_int(n_head, "n_head"),
                )  # fmt: skip
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
        src = _as_tokens([p[0] for p in pairs], "pairs src", self.vocab_size, self.history * self.seq_len)
        tgt = _as_tokens([p[1] for p in pairs], "pairs tgt", self.vocab_size, self.seq_len)
        ep = _pos_int(epochs, "epochs")
        bs = _pos_int(batch_size, "batch_size")
        rate = _finite_float(lr, "lr")
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
        s = _as_tokens(src, "src", self.vocab_size, self.history * self.seq_len)
        k = _pos_int(n_candidates, "n_candidates")
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
        X = _as_tokens(x, "x", self.vocab_size, self.seq_len)
        T = _pos_int(n_steps, "n_steps", 0)
        k = _pos_int(n_candidates, "n_candidates")
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


# ------------------------------------------------------------------------------------------ toy problem


class SequenceDesignToy:
    """A sequence-design problem with a hidden oracle over ``vocab_size`` tokens and length ``length``:
    ``f(x) = Σ_i w[i, x_i] + bonus · #{i : (x_i, x_{i+1}) ∈ motifs}``, with ``w ~ N(0, 1)`` (L, V) and
    ``n_motifs`` random adjacent token pairs (the epistatic part), all fixed by ``seed``."""

    def __init__(
        self, length: int = 24, vocab_size: int = 8, *, n_motifs: int = 6, bonus: float = 1.5, seed: int = 0
    ) -> None:
        self.length = _pos_int(length, "length", 2)
        self.vocab_size = _pos_int(vocab_size, "vocab_size", 2)
        n_m = _pos_int(n_motifs, "n_motifs", 0)
        if n_m > self.vocab_size**2:
            raise ValueError(f"n_motifs must be <= vocab_size**2 = {self.vocab_size**2}; got {n_m}")
        self.bonus = _finite_float(bonus, "bonus")
        rng = np.random.default_rng(seed)
        self.weights = rng.normal(size=(self.length, self.vocab_size))
        pick = rng.choice(self.vocab_size**2, n_m, replace=False)
        self.motif_table = np.zeros((self.vocab_size, self.vocab_size))
        self.motif_table[pick // self.vocab_size, pick % self.vocab_size] = 1.0
        self.motifs = [(int(p // self.vocab_size), int(p % self.vocab_size)) for p in pick]

    def oracle(self, X: Any) -> np.ndarray:
        """The hidden property f (n,) of sequences ``X`` (n, L)."""
        arr = _as_tokens(X, "X", self.vocab_size, self.length)
        add = self.weights[np.arange(self.length), arr].sum(1)
        return add + self.bonus * self.motif_table[arr[:, :-1], arr[:, 1:]].sum(1)

    oracle.is_oracle = True  # type: ignore[attr-defined]

    def sample(self, n: int, *, seed: int | None = None) -> np.ndarray:
        """``n`` uniformly random sequences (n, L)."""
        return np.random.default_rng(seed).integers(0, self.vocab_size, (_pos_int(n, "n"), self.length))

    def optimum(self) -> float:
        """The maximal oracle value (dynamic programming over adjacent pairs)."""
        best = self.weights[0].copy()
        for i in range(1, self.length):
            best = (best[:, None] + self.bonus * self.motif_table).max(0) + self.weights[i]
        return float(best.max())
