"""Learning from True-False Labels via Multi-modal Prompt Retrieving — ICML 2025, P39: TFL generation, the
risk-consistent loss, a scikit-learn estimator and model-agnostic prompt retrieval.

Li, Xu, Ying, Wei, Xu, ICML 2025 (arXiv 2405.15228); official code ``github.com/Tranquilxu/TMP``.

A True-False Label (TFL) of an instance ``x`` is a pair ``(ȳ, s)``: a candidate class ``ȳ`` drawn uniformly
from the ``K`` classes and the yes/no answer ``s = 1[y = ȳ]`` of an annotator (a vision-language model in the
paper, any scoring callable here) to "is this a ȳ?". Since ``P(s = 1 | x, ȳ) = p(ȳ | x)``, the ordinary
risk ``E_x Σ_i p(i|x) L(f(x), i)`` equals

    R(f) = E_{x, ȳ, s}[ s · L(f(x), ȳ) + (1 − s) · Σ_{i ≠ ȳ} w_i(x, ȳ) · L(f(x), i) ],
    w_i = p(i|x) / (1 − p(ȳ|x)),

(average over the ``K`` equally likely ``ȳ``: each contributes ``Σ_i p(i|x) L_i``), so the risk-consistent
(RC) loss :func:`tfl_rc_loss` trains any classifier from TFLs given an estimate ``p̂(·|x)`` (the prior): a
zero-shot model mixed with the model's own detached prediction. The official ``RC_loss`` leaves the weights
unnormalised (``w_i = p̂_i``): ``normalize=False``; its batch reduction (mean over True samples plus the
*sum* over False ones) is ``reduction="official"``.

Contents:

* :func:`make_tfl` — simulate TFLs from true labels or from any scoring callable ``(X, ȳ) -> yes/no``;
* :func:`tfl_rc_loss` — the RC loss; :func:`sharpen_prior` — the prior's temperature;
* :class:`TFLClassifier` — a scikit-learn estimator (``fit`` / ``predict`` / ``predict_proba`` / ``score``)
  training a torch MLP (or logistic regression) with the RC loss, or with the baselines' losses;
* the Multi-modal Prompt Retrieving (MRP) module in a model-agnostic form, over precomputed embeddings of
  any encoder: :class:`PromptImageGenerator` (the learnable prompt image), :func:`retrieve_text_prompts`,
  :func:`retrieve_image_prompts` and :func:`mrp_features`.
"""

from __future__ import annotations

import itertools
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin
from torch import nn

from icml25.kernels.checks import (
    check_array,
    check_choice,
    check_fitted,
    check_float,
    check_int,
    check_sklearn_array,
    check_tensor,
)
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "LOSSES",
    "PromptImageGenerator",
    "TFLClassifier",
    "make_tfl",
    "mrp_features",
    "retrieve_image_prompts",
    "retrieve_text_prompts",
    "sharpen_prior",
    "tfl_rc_loss",
]

LOSSES = ("rc", "true_only", "complementary", "complementary_nn", "complementary_unbiased")
"""Training objectives of :class:`TFLClassifier`: the RC loss and four baselines on the same TFLs."""
REDUCTIONS = ("mean", "sum", "none", "official")
_PRIOR_ATOL = 1e-4
_X_MAX = 1e15


# ------------------------------------------------------------------------------------------ validation
def _as_numpy(value: object, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be array-like, got {type(value).__name__}: {exc}") from None


def _check_float_matrix(value: object, name: str, n_cols: int | None = None) -> np.ndarray:
    a = check_array(_as_numpy(value, name), name, ndim=2, dtype=("float", "int", "bool"), non_empty=True)
    if n_cols is not None and a.shape[1] != n_cols:
        raise ValueError(f"{name} must have {n_cols} columns, got shape {a.shape}")
    return a.astype(np.float64)


def _check_X(
    X: object, name: str = "X", n_features: int | None = None, estimator: object = None
) -> np.ndarray:
    """``X`` as a float64 ``(n_samples, n_features)`` matrix, through scikit-learn's ``check_array`` (its
    messages, naming ``name``: dense, numeric, 2-D, non-empty, finite) and a magnitude bound."""
    a = np.asarray(check_sklearn_array(X, name, estimator=estimator, dtype="numeric"), dtype=np.float64)
    if n_features is not None and a.shape[1] != n_features:
        raise ValueError(f"{name} must have {n_features} columns, got shape {a.shape}")
    peak = float(np.abs(a).max())
    if peak > _X_MAX:
        raise ValueError(f"{name} must have max |x| <= {_X_MAX:g} (float32 training overflows), got {peak:g}")
    return a


def _check_labels(value: object, name: str, n: int | None, n_classes: int | None) -> np.ndarray:
    a = _as_numpy(value, name)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be an integer class-index array, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of class indices, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} must be non-empty, got shape {a.shape}")
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise ValueError(f"{name} must hold integer class indices, got non-integer values")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} must hold one entry per row of X ({n}), got {a.shape[0]}")
    lo, hi = float(a.min()), float(a.max())
    if lo < 0 or (n_classes is not None and hi >= n_classes):
        bound = f"[0, {n_classes})" if n_classes is not None else ">= 0"
        raise ValueError(f"{name} must hold class indices in {bound}, got values in [{lo:g}, {hi:g}]")
    return a.astype(np.int64)


def _check_answers(value: object, name: str, n: int) -> np.ndarray:
    a = _as_numpy(value, name)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D boolean (or 0/1) array of answers, got shape {a.shape}")
    if a.shape[0] != n:
        raise ValueError(f"{name} must hold one answer per sample ({n}), got {a.shape[0]}")
    if a.dtype.kind == "b":
        return a.astype(bool)
    if a.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be boolean or 0/1, got dtype {a.dtype}")
    if not np.all(np.isin(a, (0, 1))):
        bad = a[~np.isin(a, (0, 1))]
        raise ValueError(
            f"{name} must be boolean or 0/1, got other values such as {bad.ravel()[:3].tolist()}"
        )
    return a.astype(bool)


def _check_prior(value: object, name: str, n: int, n_classes: int | None) -> np.ndarray:
    a = _check_float_matrix(value, name)
    if a.shape[0] != n or (n_classes is not None and a.shape[1] != n_classes):
        cols = n_classes if n_classes is not None else "K"
        raise ValueError(f"{name} must have shape ({n}, {cols}) (one distribution per sample), got {a.shape}")
    if a.shape[1] < 2:
        raise ValueError(f"{name} must have K >= 2 columns (classes), got shape {a.shape}")
    if (a < 0).any():
        raise ValueError(f"{name} must be non-negative probabilities, got a minimum of {a.min():g}")
    err = np.abs(a.sum(axis=1) - 1.0)
    if err.max() > _PRIOR_ATOL:
        raise ValueError(
            f"{name} rows must sum to 1 (within {_PRIOR_ATOL:g}), got row sums off by up to {err.max():g}"
        )
    return a


# ------------------------------------------------------------------------------------------ TFL generation
def make_tfl(
    oracle: np.ndarray | Callable[[np.ndarray, np.ndarray], Any],
    n_classes: int,
    X: np.ndarray | None = None,
    *,
    annotator_acc: float = 1.0,
    threshold: float = 0.5,
    seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Simulate True-False Labels: ``ȳ ~ Uniform{0..K-1}`` per instance and the answer ``s`` to "is it ȳ?".

    Args:
        oracle: either the true labels ``(n,)`` (then ``s = 1[y = ȳ]``), or a scoring callable
            ``oracle(X, ybar)`` returning, per instance, a yes/no answer (bool or 0/1, ``(n,)``) or the
            probability of "yes" in ``[0, 1]`` (answer yes iff ``>= threshold``): a VLM asked the binary
            question in the paper, e.g. ``lambda X, yb: clf.predict_proba(X)[np.arange(len(X)), yb]``.
        n_classes: ``K >= 2``.
        X: the instances ``(n, ...)`` passed to a callable oracle (required then; ignored for labels).
        annotator_acc: each answer is flipped with probability ``1 - annotator_acc`` (an imperfect annotator).
        threshold: the "yes" cut-off on probability answers.
        seed: seed of the draws (``numpy.random.default_rng``); None draws nondeterministically.

    Returns:
        ``(ybar, s)``: int64 ``(n,)`` candidate classes and bool ``(n,)`` answers.
    """
    K = check_int(n_classes, "n_classes", low=2)
    acc = check_float(annotator_acc, "annotator_acc", low=0.0, high=1.0)
    thr = check_float(threshold, "threshold", low=0.0, high=1.0)
    if seed is not None:
        check_int(seed, "seed", low=0)
    if callable(oracle):
        if X is None:
            raise ValueError("X must be given (the instances) when oracle is a callable")
        Xa = _as_numpy(X, "X")
        if Xa.ndim < 1 or Xa.shape[0] == 0:
            raise ValueError(f"X must be a non-empty array of instances, got shape {Xa.shape}")
        if Xa.dtype.kind in "fc":  # instances may be of any dtype (text, objects); numbers must be finite
            check_array(Xa, "X", dtype=None)
        n = Xa.shape[0]
    else:
        y = _check_labels(oracle, "oracle", None, K)
        n = y.shape[0]
    rng = np.random.default_rng(seed)
    ybar = rng.integers(0, K, size=n)
    if callable(oracle):
        raw = _as_numpy(oracle(X, ybar.copy()), "oracle(X, ybar)")
        if raw.shape != (n,):
            raise ValueError(
                f"oracle(X, ybar) must return one answer per instance, shape ({n},), got {raw.shape}"
            )
        if raw.dtype.kind == "b":
            s = raw.astype(bool)
        elif raw.dtype.kind in "iuf" and np.all(np.isfinite(raw)) and raw.min() >= 0 and raw.max() <= 1:
            s = raw >= thr if raw.dtype.kind == "f" else raw.astype(bool)
        else:
            raise ValueError("oracle(X, ybar) must return booleans, 0/1 or probabilities in [0, 1]")
    else:
        s = y == ybar
    if acc < 1.0:
        s = np.where(rng.random(n) < acc, s, ~s)
    return ybar.astype(np.int64), np.asarray(s, dtype=bool)


# ------------------------------------------------------------------------------------------ the RC loss
def sharpen_prior(prior: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(log p / T)`` row-wise: ``T = 1`` returns ``prior``, ``T < 1`` sharpens, ``T = 0`` is the
    one-hot argmax (ties to the lowest index). ``prior`` is ``(n, K)`` probabilities; returns ``(n, K)``.

    The official code's CLIP prior is ``softmax(cos / 0.001)``, effectively the one-hot argmax; for a scorer
    with probabilities ``softmax(-d)`` (e.g. negative distances), temperature ``T`` gives ``softmax(-d / T)``.
    """
    if not isinstance(prior, torch.Tensor) or not prior.is_floating_point():
        got = f"a tensor of dtype {prior.dtype}" if isinstance(prior, torch.Tensor) else type(prior).__name__
        raise TypeError(f"prior must be a floating-point torch.Tensor of probabilities (n, K), got {got}")
    if prior.ndim != 2 or prior.numel() == 0:
        raise ValueError(f"prior must be a non-empty (n, K) tensor, got shape {tuple(prior.shape)}")
    if not torch.isfinite(prior).all() or bool((prior < 0).any()):
        raise ValueError(
            f"prior must be finite and non-negative, got invalid values in shape {tuple(prior.shape)}"
        )
    T = check_float(temperature, "temperature", low=0.0)
    if T == 0.0:
        return F.one_hot(prior.argmax(dim=-1), prior.shape[-1]).to(prior.dtype)
    if T == 1.0:
        return prior
    tiny = torch.finfo(prior.dtype).tiny
    return torch.softmax(torch.log(prior.clamp_min(tiny)) / T, dim=-1)


def _check_loss_inputs(logits: object, ybar: object, s: object, prior: object) -> tuple:
    logits = check_tensor(logits, "logits", ndim=2, non_empty=True)
    n, K = logits.shape
    if K < 2:
        raise ValueError(f"logits must have K >= 2 classes (columns), got shape {tuple(logits.shape)}")
    yb = torch.as_tensor(_check_labels(ybar, "ybar", n, K), device=logits.device)
    sb = torch.as_tensor(_check_answers(s, "s", n), device=logits.device)
    if not isinstance(prior, torch.Tensor):
        raise TypeError(f"prior must be a torch.Tensor of shape ({n}, {K}), got {type(prior).__name__}")
    _check_prior(prior, "prior", n, K)
    return yb, sb, prior.detach().to(logits.dtype)


def tfl_rc_loss(
    logits: torch.Tensor,
    ybar: torch.Tensor,
    s: torch.Tensor,
    prior: torch.Tensor,
    *,
    normalize: bool = True,
    reduction: str = "mean",
    eps: float = 1e-6,
) -> torch.Tensor:
    """The risk-consistent loss of True-False Labels.

    Per sample: ``CE(f(x), ȳ)`` when ``s`` is True, else ``Σ_{i≠ȳ} w_i · CE(f(x), i)`` with
    ``w_i = p̂_i / max(1 − p̂_ȳ, eps)`` (``normalize=True``, the weights sum to 1: the risk-consistent form)
    or ``w_i = p̂_i`` (``normalize=False``, the official ``RC_loss``).

    Args:
        logits: ``(n, K)`` model outputs (gradients flow through them only).
        ybar: ``(n,)`` candidate classes in ``[0, K)``.
        s: ``(n,)`` answers, bool or 0/1.
        prior: ``(n, K)`` estimate of ``p(y | x)`` (rows sum to 1); detached.
        normalize: renormalise the False weights by ``1 − p̂_ȳ``.
        reduction: ``"mean"`` (average over all samples: the empirical risk), ``"sum"``, ``"none"``
            (``(n,)``), or ``"official"`` (mean over the True samples plus the sum over the False ones, as in
            the official training loop).
        eps: floor of ``1 − p̂_ȳ`` (a False answer on a sample whose prior is certain of ``ȳ``).

    Returns:
        A scalar (or ``(n,)`` for ``reduction="none"``).
    """
    if not isinstance(normalize, (bool, np.bool_)):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    reduction = check_choice(reduction, "reduction", REDUCTIONS)
    eps = check_float(eps, "eps", low=0.0, high=1.0, low_open=True, high_open=True)
    yb, sb, p = _check_loss_inputs(logits, ybar, s, prior)
    log_q = torch.log_softmax(logits, dim=-1)  # (n, K); CE(f(x), i) = -log_q[:, i]
    ce_bar = -log_q.gather(1, yb[:, None]).squeeze(1)
    w = p.clone()
    w.scatter_(1, yb[:, None], 0.0)  # w_ȳ = 0
    if normalize:
        p_bar = p.gather(1, yb[:, None])
        w = w / (1.0 - p_bar).clamp_min(eps)
    false_loss = -(w * log_q).sum(dim=1)
    per_sample = torch.where(sb, ce_bar, false_loss)
    if reduction == "none":
        return per_sample
    if reduction == "sum":
        return per_sample.sum()
    if reduction == "mean":
        return per_sample.mean()
    true_part = ce_bar[sb].mean() if bool(sb.any()) else logits.new_zeros(())
    return true_part + false_loss[~sb].sum()


def _complementary_loss(logits: torch.Tensor, ybar: torch.Tensor, s: torch.Tensor, form: str) -> torch.Tensor:
    """CE on True samples plus a complementary-label loss on False ones (ȳ is then uniform over the classes
    other than y), weighted by the two groups' shares, so the result is a mean over samples.

    ``form``:

    * ``"scl_nl"``: Chou et al.'s (2020) surrogate complementary loss ``−log(1 − q_ȳ)`` per False sample (the
      bounded loss they propose after showing that the unbiased estimator's variance misleads training);
    * ``"unbiased"``: Ishida et al.'s (2019) unbiased estimator, the mean of ``Σ_j CE_j − (K − 1) CE_ȳ``;
    * ``"non_negative"``: the same split into per-class terms ``R_k = Σ_i CE_k(x_i) / n_F − (K − 1) ·
      Σ_{i: ȳ_i = k} CE_k(x_i) / n_F`` (over the ``n_F`` False samples; each estimates ``π_k E_k[CE_k] ≥ 0``),
      each clipped at 0: Ishida et al.'s max-operator correction.
    """
    log_q = torch.log_softmax(logits, dim=-1)
    K = logits.shape[1]
    ce = -log_q
    ce_bar = ce.gather(1, ybar[:, None]).squeeze(1)
    n, f = logits.shape[0], ~s
    n_false = int(f.sum())
    true_part = ce_bar[s].sum() / n
    if n_false == 0:
        return true_part
    if form == "scl_nl":
        q_bar = log_q.gather(1, ybar[:, None]).squeeze(1)[f]
        return true_part + (-torch.log(-torch.expm1(q_bar).clamp(max=-1e-7))).sum() / n
    ce_f = ce[f]
    onehot = F.one_hot(ybar[f], K).to(ce.dtype)
    per_class = (ce_f.sum(0) - (K - 1) * (onehot * ce_f).sum(0)) / n_false
    if form == "non_negative":
        per_class = per_class.clamp(min=0.0)
    return true_part + per_class.sum() * (n_false / n)


_COMPLEMENTARY = {
    "complementary": "scl_nl",
    "complementary_nn": "non_negative",
    "complementary_unbiased": "unbiased",
}


# ------------------------------------------------------------------------------------------ estimator
def _mlp(n_in: int, hidden: Sequence[int], n_out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


class TFLClassifier(ClassifierMixin, BaseEstimator):
    """A classifier trained from True-False Labels with the risk-consistent loss (scikit-learn API).

    ``fit(X, ybar, s, prior=None)`` or ``fit(X, Y)`` with ``Y = [ȳ, s]`` of shape ``(n, 2)`` (so that
    pipelines, ``clone`` and ``cross_val_score`` work on TFL data); ``score(X, y)`` is accuracy against true
    labels ``(n,)`` or, for ``(n, 2)`` TFL targets, the rate at which the model's yes/no (``predict == ȳ``)
    agrees with ``s``.

    The prior at each step is ``prior_weight · sharpen(p̂_0, prior_temperature) + (1 − prior_weight) ·
    softmax(f(x) / model_temperature)`` (detached), with ``p̂_0`` the given prior (an ``(n, K)`` array, or a
    callable ``X -> (n, K)`` such as an sklearn classifier's ``predict_proba``: the zero-shot "VLM"); with
    ``prior=None`` the model's own softmax alone (self-training). The official code uses prior weight 0.9,
    model temperature 1e5 (a uniform term) and a CLIP temperature of 0.001 (≈ one-hot: ``prior_temperature=0``).

    Parameters:
        hidden_layer_sizes: MLP hidden widths; ``()`` is multinomial logistic regression.
        loss: ``"rc"`` (the paper's), or the baselines ``"true_only"`` (CE on the True samples) and
            CE on True plus a complementary-label loss on False: ``"complementary"`` (Chou et al.'s 2020
            bounded surrogate ``−log(1 − q_ȳ)``), ``"complementary_nn"`` (Ishida et al.'s 2019 unbiased risk
            with their non-negative max-operator correction per class) and ``"complementary_unbiased"``
            (Ishida et al.'s unbiased risk alone, which a flexible model drives to −∞).
        normalize, reduction, eps: of :func:`tfl_rc_loss` (``reduction`` in ``"mean"``, ``"official"``).
        prior_weight: weight of the given prior against the model's own prediction (paper 0.9).
        prior_temperature: sharpening of the given prior (0 = one-hot; 1 = unchanged). Sharp priors work
            best with ``normalize=True``: a soft prior spreads the False samples' weight over wrong classes.
        model_temperature: temperature of the model term (official 1e5; ours 1).
        epochs, batch_size, lr, weight_decay: Adam training (``weight_decay`` as AdamW's).
        n_classes: ``K``; None infers it from the prior's columns, else ``max(ȳ) + 1``.
        seed: initialisation and batch order (the global generators are untouched).

    Fitted attributes: ``coefs_`` / ``intercepts_`` (the layers' weights ``(in, out)`` and biases, as
    scikit-learn's ``MLPClassifier``; ``model_`` rebuilds the torch module), ``classes_`` (``arange(K)``),
    ``n_classes_``, ``n_features_in_``, ``loss_curve_`` (mean training loss per epoch). Prediction runs in
    float64 NumPy.
    """

    def __init__(
        self,
        hidden_layer_sizes: tuple[int, ...] = (128,),
        *,
        loss: str = "rc",
        normalize: bool = True,
        reduction: str = "mean",
        prior_weight: float = 0.9,
        prior_temperature: float = 1.0,
        model_temperature: float = 1.0,
        eps: float = 1e-6,
        epochs: int = 100,
        batch_size: int = 64,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        n_classes: int | None = None,
        seed: int | None = 0,
    ) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.loss = loss
        self.normalize = normalize
        self.reduction = reduction
        self.prior_weight = prior_weight
        self.prior_temperature = prior_temperature
        self.model_temperature = model_temperature
        self.eps = eps
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.n_classes = n_classes
        self.seed = seed

    # -------------------------------------------------------------------------------- checks
    def _checked_params(self) -> dict[str, Any]:
        hidden = self.hidden_layer_sizes
        if isinstance(hidden, (numbers.Integral,)) and not isinstance(hidden, bool):
            hidden = (hidden,)
        if not isinstance(hidden, (tuple, list)):
            raise TypeError(f"hidden_layer_sizes must be a tuple of ints, got {type(hidden).__name__}")
        hidden = tuple(check_int(h, "hidden_layer_sizes", low=1) for h in hidden)
        if not isinstance(self.normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be a bool, got {type(self.normalize).__name__}")
        if self.seed is not None:
            check_int(self.seed, "seed", low=0)
        return {
            "hidden": hidden,
            "loss": check_choice(self.loss, "loss", LOSSES),
            "reduction": check_choice(self.reduction, "reduction", ("mean", "official")),
            "prior_weight": check_float(self.prior_weight, "prior_weight", low=0.0, high=1.0),
            "prior_temperature": check_float(self.prior_temperature, "prior_temperature", low=0.0, high=1e6),
            "model_temperature": check_float(
                self.model_temperature, "model_temperature", low=0.0, high=1e12, low_open=True
            ),
            "eps": check_float(self.eps, "eps", low=0.0, high=1.0, low_open=True, high_open=True),
            "epochs": check_int(self.epochs, "epochs", low=1),
            "batch_size": check_int(self.batch_size, "batch_size", low=1),
            "lr": check_float(self.lr, "lr", low=0.0, high=10.0, low_open=True),
            "weight_decay": check_float(self.weight_decay, "weight_decay", low=0.0, high=10.0),
            "n_classes": None if self.n_classes is None else check_int(self.n_classes, "n_classes", low=2),
        }

    @property
    def model_(self) -> nn.Sequential:
        """The fitted network as a fresh torch module (float32, eval mode), built from ``coefs_`` /
        ``intercepts_``."""
        check_fitted(self, "coefs_")  # NotFittedError: a ValueError and an AttributeError
        model = _mlp(
            self.coefs_[0].shape[0], [c.shape[1] for c in self.coefs_[:-1]], self.coefs_[-1].shape[1]
        )
        linears = [m for m in model if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for m, W, b in zip(linears, self.coefs_, self.intercepts_):
                m.weight.copy_(torch.as_tensor(W.T))
                m.bias.copy_(torch.as_tensor(b))
        return model.eval()

    # -------------------------------------------------------------------------------- fit
    def fit(
        self,
        X: np.ndarray,
        y: np.ndarray,
        s: np.ndarray | None = None,
        prior: np.ndarray | Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> TFLClassifier:
        """Train on TFLs.

        Args:
            X: ``(n, d)`` features.
            y: ``(n,)`` candidate classes ``ȳ`` (with ``s``), or ``(n, 2)`` columns ``[ȳ, s]``.
            s: ``(n,)`` answers, bool or 0/1 (None when ``y`` holds them).
            prior: ``(n, K)`` probabilities, a callable ``X -> (n, K)``, an object with ``predict_proba``,
                or None (the model's own detached softmax; all-False data then warns).

        Returns:
            ``self``. Every input is validated before any fitted attribute changes.
        """
        params = self._checked_params()
        Xa = _check_X(X, estimator=self)
        n = Xa.shape[0]
        ya = _as_numpy(y, "y")
        if s is None:
            if y is None:
                raise ValueError(
                    "y must be given: TFLClassifier requires y to be passed, but the target y is None"
                )
            if ya.ndim != 2 or ya.shape[1] != 2:
                raise ValueError(
                    f"y must be (n, 2) columns [ybar, s] when s is not given, got shape {ya.shape}"
                )
            s = ya[:, 1]
            ya = ya[:, 0]
        elif ya.ndim != 1:
            raise ValueError(
                f"y must be the 1-D candidate classes ybar when s is given, got shape {ya.shape}"
            )
        sa = _check_answers(s, "s", n)
        K = params["n_classes"]
        P = None
        if prior is not None:
            if hasattr(prior, "predict_proba") and not isinstance(prior, np.ndarray):
                prior = prior.predict_proba
            raw = prior(Xa) if callable(prior) else prior
            P = _check_prior(raw, "prior", n, K)
            K = P.shape[1]
        yb = _check_labels(ya, "y (ybar)", n, None if P is not None else K)
        if P is not None and int(yb.max()) >= K:
            raise ValueError(
                f"prior must have one column per class: y (ybar) holds class {int(yb.max())}, so K >= "
                f"{int(yb.max()) + 1}, but the prior{' callable' if callable(prior) else ''} gave shape {P.shape} "
                f"(or y (ybar) must hold class indices in [0, {K}))"
            )
        if K is None:
            K = int(yb.max()) + 1
            if K < 2:
                raise ValueError(
                    f"n_classes must be >= 2; ybar only holds class {int(yb.max())}: pass n_classes"
                )
        if params["loss"] == "true_only" and not sa.any():
            raise ValueError("s must contain at least one True answer for loss='true_only'")
        if prior is None and params["loss"] == "rc" and not sa.any():
            warnings.warn(
                "every TFL is False and prior=None: the self-prior starts uniform, so training degenerates into "
                "complementary-label learning; pass a zero-shot prior",
                RuntimeWarning,
                stacklevel=2,
            )
        model, curve = self._train(params, Xa, yb, sa, P, K)
        linears = [m for m in model if isinstance(m, nn.Linear)]
        self.coefs_ = [m.weight.detach().double().numpy().T.copy() for m in linears]
        self.intercepts_ = [m.bias.detach().double().numpy().copy() for m in linears]
        self.loss_curve_ = curve
        self.n_classes_ = K
        self.classes_ = np.arange(K)
        self.n_features_in_ = Xa.shape[1]
        return self

    def _train(self, params: dict[str, Any], X: np.ndarray, yb: np.ndarray, s: np.ndarray,
               P: np.ndarray | None, K: int) -> tuple[nn.Module, list[float]]:  # fmt: skip
        if params["loss"] == "true_only":
            X, yb, s = X[s], yb[s], s[s]
            P = None if P is None else P[s]
        Xt = torch.as_tensor(X, dtype=torch.float32)
        yt = torch.as_tensor(yb)
        st = torch.as_tensor(s)
        Pt = None
        if P is not None:
            Pt = sharpen_prior(torch.as_tensor(P, dtype=torch.float32), params["prior_temperature"])
            Pt = Pt / Pt.sum(dim=1, keepdim=True)
        with isolated_rng(self.seed):
            model = _mlp(X.shape[1], params["hidden"], K)
        gen = make_generator(self.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=params["lr"], weight_decay=params["weight_decay"])
        n, bs, lam = X.shape[0], params["batch_size"], params["prior_weight"]
        curve: list[float] = []
        model.train()
        for _ in range(params["epochs"]):
            order = torch.randperm(n, generator=gen)
            total = 0.0
            for start in range(0, n, bs):
                idx = order[start : start + bs]
                logits = model(Xt[idx])
                if params["loss"] in _COMPLEMENTARY:
                    loss = _complementary_loss(logits, yt[idx], st[idx], _COMPLEMENTARY[params["loss"]])
                elif params["loss"] == "true_only":
                    loss = F.cross_entropy(logits, yt[idx])
                else:
                    own = torch.softmax(logits.detach() / params["model_temperature"], dim=1)
                    prior_b = own if Pt is None else lam * Pt[idx] + (1.0 - lam) * own
                    loss = tfl_rc_loss(logits, yt[idx], st[idx], prior_b, normalize=bool(self.normalize),
                                       reduction=params["reduction"], eps=params["eps"])  # fmt: skip
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
            curve.append(total / n)
        model.eval()
        return model, curve

    # -------------------------------------------------------------------------------- predict
    def decision_function(self, X: np.ndarray) -> np.ndarray:
        """Logits ``(n, K)``."""
        check_fitted(self, "coefs_")  # NotFittedError: a ValueError and an AttributeError
        h = _check_X(X, n_features=self.n_features_in_, estimator=self)
        for i, (W, b) in enumerate(zip(self.coefs_, self.intercepts_)):
            h = h @ W + b
            if i < len(self.coefs_) - 1:
                h = np.maximum(h, 0.0)
        return h

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities ``(n, K)`` (rows sum to 1)."""
        z = self.decision_function(X)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Class indices ``(n,)``."""
        z = self.decision_function(X)
        return self.classes_[z.argmax(axis=1)]

    def score(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> float:
        """Accuracy against true labels ``(n,)``; for TFL targets ``(n, 2)`` = ``[ȳ, s]`` the agreement of
        the model's answer ``predict(X) == ȳ`` with ``s`` (a held-out metric that needs no true labels)."""
        ya = _as_numpy(y, "y")
        if ya.ndim == 2 and ya.shape[1] == 2:
            pred = self.predict(X)
            yb = _check_labels(ya[:, 0], "y (ybar)", pred.shape[0], self.n_classes_)
            sa = _check_answers(ya[:, 1], "y (s)", pred.shape[0])
            agree = ((pred == yb) == sa).astype(np.float64)
            return float(np.average(agree, weights=sample_weight))
        return float(super().score(X, y, sample_weight=sample_weight))


# ------------------------------------------------------------------------------------------ MRP
class PromptImageGenerator(nn.Module):
    """The learnable prompt image of MRP: a conv net (1→64→128→64→3 channels, 3×3, BatchNorm, leaky ReLU
    0.05, as the official ``image_input``) mapping a constant ``(1, 1, H, W)`` input of ones to a
    ``(1, 3, H, W)`` image, which the (frozen) image encoder turns into the prompt embedding ``e_p``.

    ``size`` is ``H = W`` (official 224, CLIP's input); construct under ``isolated_rng(seed)`` for a
    reproducible initialisation.
    """

    def __init__(self, size: int = 224, channels: tuple[int, int, int] = (64, 128, 64)) -> None:
        super().__init__()
        self.size = check_int(size, "size", low=1)
        if not isinstance(channels, (tuple, list)) or len(channels) != 3:
            raise TypeError(f"channels must be a tuple of 3 ints, got {channels!r}")
        widths = [1, *(check_int(c, "channels", low=1) for c in channels)]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.LeakyReLU(0.05)]
        layers.append(nn.Conv2d(widths[-1], 3, 3, padding=1))
        self.net = nn.Sequential(*layers)

    def forward(self) -> torch.Tensor:
        """The prompt image ``(1, 3, size, size)``."""
        ones = torch.ones(1, 1, self.size, self.size, device=self.net[0].weight.device)
        return self.net(ones)


def _check_emb(value: object, name: str, dim: int | None = None, ndim: int = 2) -> torch.Tensor:
    value = check_tensor(value, name, ndim=ndim, non_empty=True)
    if dim is not None and value.shape[-1] != dim:
        raise ValueError(f"{name} must have embedding dimension {dim}, got shape {tuple(value.shape)}")
    return value


def _cosine(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Cosine similarity ``(m,)`` of ``query`` ``(d,)`` with each row of ``keys`` ``(m, d)``; each vector is
    first scaled by its max-abs entry (cosine is scale-invariant) so that huge embeddings do not overflow."""
    tiny = torch.finfo(keys.dtype).tiny
    q = query / query.abs().max().clamp_min(tiny)
    k = keys / keys.abs().amax(dim=1, keepdim=True).clamp_min(tiny)
    return F.cosine_similarity(k, q[None, :].expand_as(k), dim=1, eps=1e-6)


def retrieve_text_prompts(
    prompt_emb: torch.Tensor, class_text_emb: torch.Tensor, n_prompts: int = 15, top_fraction: float = 0.6
) -> torch.Tensor:
    """Indices ``(t,)`` of the class-name embeddings most cosine-similar to the prompt embedding.

    ``prompt_emb`` is ``(d,)``, ``class_text_emb`` ``(K, d)``. The official ``learn_text`` keeps the top
    ``int(top_fraction · K)`` classes and then takes ``n_prompts`` of them in set order (arbitrary); ours takes
    the ``t = min(n_prompts, int(top_fraction · K))`` most similar, in decreasing similarity (deterministic).
    When ``n_prompts >= K`` the official code uses ``int(0.2 K)``; so does ours (at least 1).
    """
    e = _check_emb(prompt_emb, "prompt_emb", ndim=1)
    T = _check_emb(class_text_emb, "class_text_emb", dim=e.shape[0])
    t = check_int(n_prompts, "n_prompts", low=1)
    frac = check_float(top_fraction, "top_fraction", low=0.0, high=1.0, low_open=True)
    K = T.shape[0]
    if t >= K:
        t = max(1, int(0.2 * K))
    t = max(1, min(t, int(frac * K)))
    return torch.topk(_cosine(e.detach(), T.detach()), k=t).indices


def retrieve_image_prompts(
    prompt_emb: torch.Tensor, image_emb: torch.Tensor, n_prompts: int = 5, pool: int = 1000,
    *, seed: int | None = None, generator: torch.Generator | None = None,
) -> torch.Tensor:  # fmt: skip
    """Indices ``(m,)`` into ``image_emb`` ``(N, d)`` of the ``n_prompts`` images most cosine-similar to
    ``prompt_emb`` ``(d,)`` among a random pool of ``pool`` images (official: 1,000, or 10% of a smaller
    set), in decreasing similarity."""
    e = _check_emb(prompt_emb, "prompt_emb", ndim=1)
    E = _check_emb(image_emb, "image_emb", dim=e.shape[0])
    m = check_int(n_prompts, "n_prompts", low=1)
    size = check_int(pool, "pool", low=1)
    N = E.shape[0]
    if size >= N:
        size = max(m, int(0.1 * N))
    size = min(size, N)
    if m > size:
        raise ValueError(f"n_prompts must be <= the pool size {size} (of {N} images), got {m}")
    g = make_generator(seed, generator)
    cand = torch.randperm(N, generator=g)[:size].to(E.device)
    sims = _cosine(e.detach(), E.detach()[cand])
    return cand[torch.topk(sims, k=m).indices]


def mrp_features(
    image_emb: torch.Tensor, prompt_emb: torch.Tensor, text_prompts: torch.Tensor, image_prompts: torch.Tensor
) -> torch.Tensor:
    """MRP's classifier input: ``concat[emb(x), e_p, text prompts, image prompts]`` flattened per instance.

    Args:
        image_emb: ``(B, d)`` instance embeddings.
        prompt_emb: ``(d,)`` prompt embedding ``e_p`` (gradients flow to the prompt generator through it).
        text_prompts: ``(t, d)`` retrieved class-name embeddings.
        image_prompts: ``(m, d)`` retrieved image embeddings.

    Returns:
        ``(B, d · (2 + t + m))`` (official: ``768 · 22`` with ``t = 15``, ``m = 5``).
    """
    x = _check_emb(image_emb, "image_emb")
    d = x.shape[1]
    e = _check_emb(prompt_emb, "prompt_emb", dim=d, ndim=1)
    tp = _check_emb(text_prompts, "text_prompts", dim=d)
    ip = _check_emb(image_prompts, "image_prompts", dim=d)
    B = x.shape[0]
    shared = torch.cat([e[None, :], tp, ip], dim=0).to(x.dtype)  # (1 + t + m, d)
    return torch.cat([x[:, None, :], shared[None].expand(B, -1, -1)], dim=1).reshape(B, -1)
