"""RAPID: Long-Context Inference with Retrieval-Augmented Speculative Decoding — ICML 2025, P03: the retrieval-augmented target and speculative verification.

Pure functions of one round's logits (official code: ``_speculative_sampling`` in ``src/utils.py`` of
John-AI-Lab/RAPID):

* :func:`augmented_target` — the retrieval-augmented target ``ẑ = z − η·g``, with ``g = p − q`` (the
  gradient of ``CE(q, softmax(z))`` with respect to the target logits ``z``) truncated to the tokens the
  drafter finds plausible, ``q(v) ≥ α·max q``;
* :func:`rapid_verify` — speculative acceptance of ``γ`` drafted tokens against ``p̂ = softmax(ẑ)``:
  accept ``y_i`` with probability ``min(1, p̂_i(y_i)/q_i(y_i))``, stop at the first rejection and sample its
  replacement from a residual distribution; after ``γ`` acceptances a bonus token comes from the
  *unmodified* target ``p_{γ+1}`` (official).

Residuals: ``"exact"`` (default) samples ``norm(max(0, p̂ − q))``, which makes every token emitted at a
drafted position exactly ``p̂``-distributed; ``"official"`` reproduces the official
``norm(max(0, max(p − q, p − p̂)))``, which does not. ``greedy=True`` (accept while the draft equals
``argmax p̂``) is this project's deterministic mode; the official code always samples.
"""

from __future__ import annotations

import torch

from icml25.kernels.checks import check_float, check_tensor
from icml25.kernels.rng import make_generator

__all__ = ["augmented_target", "rapid_verify"]

RESIDUALS = ("exact", "official")
ETA_RANGE = {"low": 0.0}  # eta >= 0; 0 = standard speculative decoding
ALPHA_RANGE = {
    "low": 0.0,
    "high": 1.0,
    "low_open": True,
}  # the truncation q >= alpha * max q, alpha in (0, 1]


def _check_logits(x: object, name: str, rows: int | None = None) -> torch.Tensor:
    """``x`` if it is a ``(rows, vocab)`` floating tensor of logits: ``-inf`` masks a token, NaN and ``+inf``
    are errors, and every row keeps a finite entry."""
    x = check_tensor(x, name, shape=(rows, None), finite=False)
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have a vocabulary of at least one token, got shape {tuple(x.shape)}")
    finite = torch.isfinite(x)
    if bool(finite.all()):  # the fast path: one reduction
        return x
    n_nan, n_pos = int(torch.isnan(x).sum()), int(torch.isposinf(x).sum())
    if n_nan or n_pos:
        raise ValueError(
            f"{name} must not contain NaN or +Inf; got {n_nan} NaN and {n_pos} +Inf values in a tensor of "
            f"shape {tuple(x.shape)}"
        )
    if x.shape[0] and not bool(finite.any(dim=-1).all()):
        bad = int((~finite.any(dim=-1)).sum())
        raise ValueError(f"{name} must have a finite entry in every row; {bad} row(s) are -Inf everywhere")
    return x


def _augment(p_logits: torch.Tensor, q_logits: torch.Tensor, eta: float, alpha: float) -> torch.Tensor:
    z = p_logits.float()
    if eta == 0.0:
        return z
    p = torch.softmax(z, dim=-1)
    q = torch.softmax(q_logits.float(), dim=-1)
    keep = q >= alpha * q.amax(dim=-1, keepdim=True)
    g = torch.where(keep, p - q, torch.zeros_like(p))
    return z - eta * g


def augmented_target(
    p_logits: torch.Tensor, q_logits: torch.Tensor, eta: float, alpha: float = 0.1
) -> torch.Tensor:
    """The retrieval-augmented target logits ``ẑ = z − η·g`` (float32).

    ``g = softmax(z) − softmax(q_logits)`` where the drafter's probability ``q(v) ≥ α·max_v q(v)``, else 0
    (official truncation). Properties: ``η = 0`` returns ``z`` exactly; ``|ẑ − z|_∞ ≤ η``; tokens outside the
    mask keep their logits exactly; ``q = p`` gives ``ẑ = z``. ``−Inf`` logits (e.g. after top-k) stay ``−Inf``.

    Args:
        p_logits: target logits ``(positions, vocab)`` (temperature already applied).
        q_logits: drafter logits of the same shape (the same temperature applied).
        eta: strength ``η ≥ 0`` (official ``speculative_margin``; README 10).
        alpha: truncation ``α ∈ (0, 1]`` (official ``spec_alpha`` = 0.1).
    """
    p_logits = _check_logits(p_logits, "p_logits")
    q_logits = _check_logits(q_logits, "q_logits")
    if q_logits.shape != p_logits.shape:
        raise ValueError(
            f"q_logits must have the shape of p_logits {tuple(p_logits.shape)}, got {tuple(q_logits.shape)}"
        )
    return _augment(
        p_logits, q_logits, check_float(eta, "eta", **ETA_RANGE), check_float(alpha, "alpha", **ALPHA_RANGE)
    )


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from the (unnormalised, non-negative) 1-D ``probs``: inverse CDF in float64 (a
    zero-probability token is never drawn; faster than ``torch.multinomial`` for one sample on CPU)."""
    cdf = probs.double().cumsum(0)
    u = torch.rand((), dtype=torch.float64, generator=generator, device=probs.device) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), probs.shape[0] - 1)


def rapid_verify(
    draft_tokens: torch.Tensor,
    q_logits: torch.Tensor,
    p_logits: torch.Tensor,
    *,
    eta: float,
    alpha: float = 0.1,
    residual: str = "exact",
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, int]:
    """Verify ``k`` drafted tokens against the retrieval-augmented target; return ``(tokens, n_accepted)``.

    ``tokens`` (1-D, int64) are the ``n`` accepted drafts followed by one new token: the residual sample at
    the first rejection, or a bonus token from ``p_{k+1}`` when all ``k`` are accepted (so ``n ≤ k`` and
    ``len(tokens) = n + 1``).

    Args:
        draft_tokens: ``(k,)`` token ids the drafter sampled from ``softmax(q_logits)`` (``k ≥ 0``).
        q_logits: drafter logits ``(k, vocab)`` at the drafted positions.
        p_logits: target logits ``(k + 1, vocab)``: the drafted positions and the one after.
        eta, alpha: see :func:`augmented_target` (``eta = 0``: standard speculative sampling).
        residual: ``"exact"`` (``norm(max(0, p̂ − q))``; every emitted token at a drafted position is exactly
            ``p̂``-distributed) or ``"official"`` (``norm(max(0, max(p − q, p − p̂)))`` as in the official code).
        greedy: accept while the draft equals ``argmax p̂`` and emit the argmax (deterministic; this
            project's mode, the official code always samples).
        generator: ``torch.Generator`` for the acceptance draws and samples (a fresh one when None;
            the global generator is never used).
    """
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in (torch.int64, torch.int32):
        got = draft_tokens.dtype if isinstance(draft_tokens, torch.Tensor) else type(draft_tokens).__name__
        raise TypeError(f"draft_tokens must be an int64 tensor of token ids, got {got}")
    if draft_tokens.ndim != 1:
        raise ValueError(f"draft_tokens must have shape (k,), got shape {tuple(draft_tokens.shape)}")
    k = int(draft_tokens.shape[0])
    if isinstance(q_logits, torch.Tensor) and q_logits.ndim == 2 and q_logits.shape[0] != k:
        raise ValueError(
            f"q_logits must have one row per drafted token: len(draft_tokens) = {k}, got shape {tuple(q_logits.shape)}"
        )
    q_logits = _check_logits(q_logits, "q_logits", rows=k)
    p_logits = _check_logits(p_logits, "p_logits", rows=k + 1)
    vocab = p_logits.shape[1]
    if q_logits.shape[1] != vocab:
        raise ValueError(
            f"q_logits must have the vocabulary size of p_logits ({vocab}), got shape {tuple(q_logits.shape)}"
        )
    if k and (int(draft_tokens.min()) < 0 or int(draft_tokens.max()) >= vocab):
        raise ValueError(f"draft_tokens must be ids in [0, {vocab}), got {draft_tokens.tolist()}")
    eta, alpha = check_float(eta, "eta", **ETA_RANGE), check_float(alpha, "alpha", **ALPHA_RANGE)
    if residual not in RESIDUALS:
        raise ValueError(f"residual must be one of {RESIDUALS}, got {residual!r}")
    if not isinstance(greedy, bool):
        raise TypeError(f"greedy must be a bool, got {type(greedy).__name__}")
    device = p_logits.device
    draft = draft_tokens.to(device=device, dtype=torch.int64)
    z_hat = _augment(p_logits[:k], q_logits.to(device), eta, alpha)
    idx = torch.arange(k, device=device)
    gen = None if greedy else make_generator(None, generator, device=device)
    if greedy:
        accepted = draft == z_hat.argmax(dim=-1)
    else:
        q = torch.softmax(q_logits.float().to(device), dim=-1)
        p_hat = torch.softmax(z_hat, dim=-1)
        u = torch.rand(k, generator=gen, device=device)
        accepted = u * q[idx, draft] < p_hat[idx, draft]  # u < p̂(y)/q(y), safe when q(y) = 0
    n = int(torch.cumprod(accepted.to(torch.int64), dim=0).sum()) if k else 0
    if n == k:  # all accepted: the bonus token from the unmodified target (official)
        last = p_logits[k].float()
        new = int(last.argmax()) if greedy else sample_token(torch.softmax(last, dim=-1), gen)
    elif greedy:
        new = int(z_hat[n].argmax())
    else:
        p_n = torch.softmax(p_logits[n].float(), dim=-1)
        if residual == "exact":
            res, fallback = (p_hat[n] - q[n]).clamp_min(0.0), p_hat[n]
        else:
            res, fallback = torch.maximum(p_n - q[n], p_n - p_hat[n]).clamp_min(0.0), p_n
        # a rejection with an all-zero residual has probability 0 (p̂ = q); only rounding gets here
        new = sample_token(res if float(res.sum()) > 0 else fallback, gen)
    tokens = torch.cat([draft[:n], torch.tensor([new], dtype=torch.int64, device=device)])
    return tokens, n
