"""Detecting Strategic Deception Using Linear Probes — ICML 2025, P52: the linear probes as scikit-learn estimators.

Goldowsky-Dill et al., ICML 2025; official code ``ApolloResearch/deception-detection``
(``deception_detection/detectors.py``). Every masked token is one training example labelled with its
dialogue's label; the probe is one direction ``coef_`` (and an offset), a token's score is
``x · coef_ + intercept_``, and a dialogue's score aggregates its tokens' scores (the mean, by default).

* :class:`LogisticProbe` — the paper's main probe: standardise each feature with the mean/std of the
  training tokens, then L2-regularised logistic regression with ``C = 1 / reg_coeff`` (``reg_coeff=10``)
  and no intercept, as the official detector does. The standardisation is folded into ``coef_`` /
  ``intercept_``, so the score is the logistic-regression logit.
* :class:`MeanDiffProbe` — MMS: ``coef_ = mean(deceptive tokens) − mean(honest tokens)``.
* :class:`LATProbe` — RepE's linear artificial tomography: differences of randomly paired deceptive and
  honest tokens, with random signs, and their first principal component, oriented so that deceptive
  tokens score higher.
* :class:`LDAProbe` — covariance-adjusted mean difference ``Σ⁻¹ Δμ`` (pooled within-class covariance,
  shrunk towards a multiple of the identity by ``shrinkage``).

Input formats (``fit``, ``decision_function``, ``predict``):

* a :class:`~icml25.interpretability.deception_probes.data.TokenActs`, or a list of ``[n_i, d]``
  activations (one per dialogue) with one label per dialogue — ``decision_function`` then returns one
  aggregated score per dialogue, so ``cross_val_score(probe, acts, acts.labels, scoring="roc_auc")``
  splits by dialogue;
* a 2-D token matrix ``[n_tokens, d]`` with one label per token, the plain scikit-learn convention
  (``Pipeline``, ``check_estimator``) — ``decision_function`` then scores each row.

Labels: two classes, the greater one is the positive (deceptive) class, as in scikit-learn; use 1 for
deceptive and 0 for honest. ``-1`` marks control dialogues in this package and is rejected by ``fit``,
as are the strings ``"ambiguous"`` and ``"skip"`` (the official dataset's unlabelled cases).
``predict`` flags a score above ``threshold_`` (0 after ``fit``; :meth:`calibrate` sets it at a target
false-positive rate on control dialogues).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.utils import column_or_1d
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

from icml25.interpretability.deception_probes.data import TokenActs, as_float_tensor
from icml25.interpretability.deception_probes.scoring import (
    AGGREGATIONS,
    aggregate_token_scores,
    threshold_at_fpr,
)
from icml25.kernels.checks import (
    check_choice,
    check_fitted,
    check_float,
    check_int,
    check_sklearn_array,
)

__all__ = ["LATProbe", "LDAProbe", "LogisticProbe", "MeanDiffProbe"]

_UNLABELLED = {"ambiguous", "skip"}


# ------------------------------------------------------------------------------------------ inputs
def is_dialogue_input(X: Any) -> bool:
    """A TokenActs, or a list/tuple holding tensors or arrays that are not 1-D rows (one per dialogue)."""
    if isinstance(X, TokenActs):
        return True
    return (
        isinstance(X, (list, tuple))
        and len(X) > 0
        and any(isinstance(x, torch.Tensor) or (isinstance(x, np.ndarray) and x.ndim != 1) for x in X)
    )


def _dialogues(X: Any, name: str = "X") -> list[torch.Tensor]:
    if isinstance(X, TokenActs):
        return [X[i] for i in range(len(X))]
    xs = [as_float_tensor(x, f"{name}[{i}]", ndim=2) for i, x in enumerate(X)]
    d = xs[0].shape[1]
    for i, x in enumerate(xs):
        if x.shape[0] == 0:
            raise ValueError(f"{name}[{i}] has zero tokens: dialogue {i} has an empty detection span")
        if x.shape[1] != d:
            raise ValueError(f"{name}[{i}] has {x.shape[1]} features, {name}[0] has {d}")
    if d == 0:
        raise ValueError(f"{name} must have at least one feature, got dialogues of shape [n, 0]")
    return xs


def _token_matrix(X: Any, name: str = "X", estimator: Any = None) -> np.ndarray:
    """A float64 token matrix ``[n_tokens, d]`` checked for dtype, shape and finiteness.

    A tensor must be floating point (``as_float_tensor``); anything else goes through scikit-learn's
    ``check_array`` (numeric, dense, 2-D, at least one token and one feature), so its messages are
    scikit-learn's, naming ``name``.
    """
    if isinstance(X, torch.Tensor):
        X = as_float_tensor(X, name).numpy()
    if isinstance(X, np.ndarray) and X.dtype == bool:
        raise TypeError(f"{name} must hold floating-point activations, got an array of dtype {X.dtype}")
    arr = check_sklearn_array(X, name, estimator=estimator, dtype="numeric", accept_sparse=False)
    return np.asarray(arr, dtype=np.float64)


def _token_inputs(X: Any, y: Any, estimator: Any = None) -> tuple[np.ndarray, np.ndarray]:
    x = _token_matrix(X, estimator=estimator)
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    if y is None:
        name = type(estimator).__name__ if estimator is not None else "the probe"
        raise ValueError(
            f"y is required with a token matrix X (one label per token): {name} requires y to be passed, "
            "but the target y is None"
        )
    y_arr = np.asarray(y)
    n = x.shape[0]
    if y_arr.ndim == 2 and y_arr.shape[1] == 1:
        y_arr = column_or_1d(y_arr, warn=True)  # a column vector: scikit-learn's DataConversionWarning
    if y_arr.ndim != 1 or y_arr.shape[0] != n:
        raise ValueError(f"y must be 1-D with one label per token of X ({n}), got shape {y_arr.shape}")
    return x, y_arr


def _binary_targets(y: Any, name: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """``(classes, y01)``: the two sorted classes and each label's index."""
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    y = column_or_1d(np.asarray(y), warn=True)
    if y.dtype.kind in "fc" and not np.isfinite(y).all():
        raise ValueError(f"Input {name} contains NaN or infinity: labels must be finite")
    try:
        check_classification_targets(y)
    except ValueError as err:
        raise ValueError(f"{name} must hold class labels; {err}") from None
    if y.dtype.kind in "OUS":
        bad = {str(v) for v in np.unique(y.astype(str)) if str(v).lower() in _UNLABELLED}
        if bad:
            raise ValueError(
                f"{name} contains {sorted(bad)}: drop unlabelled (ambiguous/skip) dialogues before fit"
            )
    classes = np.unique(y)
    if y.dtype.kind in "iufb" and -1 in classes and set(classes.tolist()) <= {-1, 0, 1}:
        raise ValueError(
            f"{name} contains -1, which marks control dialogues: fit on honest (0) and deceptive (1) data "
            "and use control data only to calibrate the threshold"
        )
    if classes.size < 2:
        raise ValueError(
            f"{name} must hold two classes (honest and deceptive); got 1 class: {classes.tolist()}"
        )
    if classes.size > 2:
        raise ValueError(
            f"{name} must be binary (honest vs deceptive); got {classes.size} classes. Only binary "
            "classification is supported."
        )
    return classes, (y == classes[1]).astype(np.int64)


def _weighted_mean(x: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    return x.mean(0) if w is None else (w[:, None] * x).sum(0) / w.sum()


def _orient(coef: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, float]:
    """Flip ``coef`` so deceptive tokens score higher on average; the offset puts 0 at the class midpoint."""
    m1 = _weighted_mean(x[y == 1], None if w is None else w[y == 1]) @ coef
    m0 = _weighted_mean(x[y == 0], None if w is None else w[y == 0]) @ coef
    if m1 < m0:
        coef, m1, m0 = -coef, -m1, -m0
    return coef, -0.5 * float(m1 + m0)


# ------------------------------------------------------------------------------------------ base
class _LinearProbe(ClassifierMixin, BaseEstimator, ABC):
    """Shared fit / score / predict logic; subclasses implement ``_direction``."""

    def _check_params(self) -> None:
        check_choice(self.aggregation, "aggregation", AGGREGATIONS)
        check_choice(self.balance, "balance", ("token", "dialogue"))

    def __sklearn_tags__(self):  # scikit-learn Tags
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    @abstractmethod
    def _direction(
        self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None
    ) -> tuple[np.ndarray, float, dict]:
        """The probe's direction ``coef [d]``, offset and extra fitted attributes from tokens ``x [n, d]``,
        labels ``y [n]`` and optional token weights ``w [n]``."""

    def fit(self, X: Any, y: Any = None) -> _LinearProbe:
        """Fit on honest/deceptive tokens (see the module docstring for the formats of ``X`` and ``y``).

        Every masked token is one example carrying its dialogue's label. ``balance="dialogue"`` weighs
        the tokens of each dialogue by ``1 / n_i`` (long dialogues no longer dominate). Inputs are all
        validated before anything is stored: a rejected call leaves a fitted probe unchanged.
        """
        self._check_params()
        if is_dialogue_input(X):
            xs = _dialogues(X)
            if y is None:
                if not isinstance(X, TokenActs):
                    raise ValueError("y is required with a list of dialogues (one label per dialogue)")
                y = X.labels
            y_arr = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
            if y_arr.ndim != 1 or y_arr.shape[0] != len(xs):
                raise ValueError(f"y must hold one label per dialogue ({len(xs)}), got shape {y_arr.shape}")
            classes, y01 = _binary_targets(y_arr)
            lengths = np.array([x.shape[0] for x in xs])
            x = torch.cat(xs).double().numpy()
            ty = np.repeat(y01, lengths)
            w = np.repeat(x.shape[0] / len(xs) / lengths, lengths) if self.balance == "dialogue" else None
            n_features = x.shape[1]
        else:
            if self.balance == "dialogue":
                raise ValueError(
                    "balance='dialogue' needs dialogue input (a TokenActs or a list of [n_i, d])"
                )
            x, y_checked = _token_inputs(X, y, estimator=self)
            classes, ty = _binary_targets(y_checked)
            w, n_features = None, x.shape[1]
        if not (x.std(0) > 0).any():
            raise ValueError(f"X must vary across tokens: all {n_features} features are constant")
        coef, intercept, extra = self._direction(x, ty, w)
        if not np.isfinite(coef).all() or not np.isfinite(intercept):
            raise ValueError("X is too large or too degenerate: the fitted direction is not finite")
        if not is_dialogue_input(X):
            validate_data(self, x, reset=True, skip_check_array=True)  # n_features_in_
            if hasattr(X, "columns"):  # a DataFrame: its column names, as scikit-learn stores them
                validate_data(self, X, reset=True, skip_check_array=True)
        self.n_features_in_ = n_features
        self.classes_ = classes
        self.coef_ = coef
        self.intercept_ = float(intercept)
        self.threshold_ = 0.0
        for k, v in extra.items():
            setattr(self, k, v)
        return self

    # ------------------------------------------------------------------ scoring
    def score_tokens(self, X: Any) -> np.ndarray:
        """Per-token scores ``x · coef_ + intercept_`` of activations ``[..., d]`` (any leading shape), e.g.
        every position of a dialogue for visualisation. Every position is scored, padding included."""
        check_fitted(self, "coef_")
        x = as_float_tensor(X, "X")
        if x.ndim == 0 or x.shape[-1] != self.n_features_in_:
            raise ValueError(
                f"X must have {self.n_features_in_} features in its last dimension (as in fit), got shape "
                f"{tuple(x.shape)}"
            )
        return x.double().numpy() @ self.coef_ + self.intercept_

    def decision_function(self, X: Any) -> np.ndarray:
        """Scores: one aggregated score per dialogue for dialogue input, one per row for a token matrix."""
        check_fitted(self, "coef_")
        if is_dialogue_input(X):
            xs = _dialogues(X)
            if xs[0].shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {xs[0].shape[1]} features, but {type(self).__name__} was fitted with "
                    f"{self.n_features_in_}"
                )
            tokens = self.score_tokens(torch.cat(xs))
            return aggregate_token_scores(tokens, np.array([x.shape[0] for x in xs]), self.aggregation)
        x = _token_matrix(X, estimator=self)
        validate_data(self, X if hasattr(X, "columns") else x, reset=False, skip_check_array=True)
        return x @ self.coef_ + self.intercept_

    def predict(self, X: Any) -> np.ndarray:
        """``classes_[1]`` (deceptive) where the score is above ``threshold_``, else ``classes_[0]``."""
        check_fitted(self, "coef_")
        return self.classes_[(self.decision_function(X) > self.threshold_).astype(np.int64)]

    def calibrate(self, control: Any, fpr: float = 0.01) -> _LinearProbe:
        """Set ``threshold_`` at false-positive rate ``fpr`` on ``control`` dialogues (a TokenActs or a
        list of ``[n_i, d]``): the ``1 - fpr`` quantile of their scores, as the paper does with Alpaca."""
        if not is_dialogue_input(control):
            raise TypeError(
                f"control must be a TokenActs or a list of [n_i, d] dialogues, got {type(control).__name__}"
            )
        check_fitted(self, "coef_")
        self.threshold_ = threshold_at_fpr(self.decision_function(control), fpr)
        return self


# ------------------------------------------------------------------------------------------ probes
class LogisticProbe(_LinearProbe):
    """The paper's logistic-regression probe (see the module docstring).

    Args:
        reg_coeff: L2 strength λ; scikit-learn's ``C = 1 / reg_coeff`` (paper and official config: 10).
        normalize: standardise features with the training tokens' mean and std (official: True).
        fit_intercept: fit a bias in the standardised space (official: False).
        aggregation: token→dialogue aggregation of ``decision_function`` on dialogue input.
        balance: ``"token"`` (every token weighs 1, the paper's) or ``"dialogue"``.
        max_iter, tol: of scikit-learn's lbfgs solver (official: scikit-learn's defaults, 100 and 1e-4;
            ``max_iter=1000, tol=1e-6`` come closer to the objective's optimum).

    Fitted attributes: ``coef_ [d]``, ``intercept_`` (the standardisation folded in), ``scaler_mean_``,
    ``scaler_scale_``, ``lr_coef_`` (the weights in the standardised space), ``classes_``,
    ``threshold_``, ``n_features_in_``.
    """

    def __init__(
        self,
        reg_coeff: float = 10.0,
        normalize: bool = True,
        fit_intercept: bool = False,
        aggregation: str = "mean",
        balance: str = "token",
        max_iter: int = 100,
        tol: float = 1e-4,
    ) -> None:
        self.reg_coeff = reg_coeff
        self.normalize = normalize
        self.fit_intercept = fit_intercept
        self.aggregation = aggregation
        self.balance = balance
        self.max_iter = max_iter
        self.tol = tol

    def _check_params(self) -> None:
        super()._check_params()
        check_float(self.reg_coeff, "reg_coeff", low=0.0, low_open=True)

    def _direction(
        self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None
    ) -> tuple[np.ndarray, float, dict]:
        if self.normalize:
            mean = _weighted_mean(x, w)
            var = _weighted_mean((x - mean) ** 2, w)
            scale = np.sqrt(var)
            scale[scale == 0] = 1.0  # constant features, as StandardScaler
        else:
            mean, scale = np.zeros(x.shape[1]), np.ones(x.shape[1])
        z = (x - mean) / scale
        lr = LogisticRegression(
            C=1.0 / self.reg_coeff, fit_intercept=self.fit_intercept, max_iter=self.max_iter, tol=self.tol
        )
        lr.fit(z, y, sample_weight=w)
        beta = lr.coef_[0].astype(np.float64)
        coef = beta / scale
        intercept = float(lr.intercept_[0]) if self.fit_intercept else 0.0
        return (
            coef,
            intercept - float(mean @ coef),
            {
                "scaler_mean_": mean,
                "scaler_scale_": scale,
                "lr_coef_": beta,
                "n_iter_": lr.n_iter_.copy(),
            },
        )


class MeanDiffProbe(_LinearProbe):
    """MMS: the direction from the mean honest token to the mean deceptive token.

    ``coef_ = mean(deceptive) − mean(honest)`` exactly (weighted by ``balance``); ``intercept_`` puts 0
    at the midpoint of the two class means. Args as :class:`LogisticProbe` (``aggregation``, ``balance``).
    """

    def __init__(self, aggregation: str = "mean", balance: str = "token") -> None:
        self.aggregation = aggregation
        self.balance = balance

    def _direction(
        self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None
    ) -> tuple[np.ndarray, float, dict]:
        m1 = _weighted_mean(x[y == 1], None if w is None else w[y == 1])
        m0 = _weighted_mean(x[y == 0], None if w is None else w[y == 0])
        coef = m1 - m0
        return coef, -0.5 * float((m1 + m0) @ coef), {}


class LATProbe(_LinearProbe):
    """LAT (RepE): first principal component of differences of random deceptive/honest token pairs.

    Args:
        n_pairs: number of random pairs (default: the smaller class's token count).
        seed: the pairing and the random signs come from ``numpy.random.default_rng(seed)`` (the global
            generators are never touched).
        aggregation, balance: as :class:`LogisticProbe` (``balance`` weighs the class means used to
            orient the direction and to place 0).
    """

    def __init__(
        self, n_pairs: int | None = None, seed: int = 0, aggregation: str = "mean", balance: str = "token"
    ) -> None:
        self.n_pairs = n_pairs
        self.seed = seed
        self.aggregation = aggregation
        self.balance = balance

    def _check_params(self) -> None:
        super()._check_params()
        if self.n_pairs is not None:
            check_int(self.n_pairs, "n_pairs", low=1)
        check_int(self.seed, "seed", low=0)

    def _direction(
        self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None
    ) -> tuple[np.ndarray, float, dict]:
        rng = np.random.default_rng(int(self.seed))
        pos, neg = x[y == 1], x[y == 0]
        n = int(self.n_pairs) if self.n_pairs is not None else min(len(pos), len(neg))
        diffs = pos[rng.integers(0, len(pos), n)] - neg[rng.integers(0, len(neg), n)]
        diffs *= rng.choice([-1.0, 1.0], size=(n, 1))
        diffs -= diffs.mean(0)
        if n == 1 or not np.any(diffs):
            first = pos.mean(0) - neg.mean(0)  # one pair: its difference is the only direction
        else:
            first = np.linalg.svd(diffs, full_matrices=False)[2][0]
        coef, intercept = _orient(first / np.linalg.norm(first), x, y, w)
        return coef, intercept, {}


class LDAProbe(_LinearProbe):
    """Covariance-adjusted mean difference ``Σ⁻¹ Δμ`` (the official "cmms"; Fisher's LDA direction).

    ``Σ`` is the pooled within-class covariance of the training tokens, shrunk as
    ``(1 − shrinkage) Σ + shrinkage · tr(Σ)/d · I`` so that it is invertible for ``d`` above the number
    of tokens. Args ``aggregation``, ``balance`` as :class:`LogisticProbe`. Memory: one ``d × d`` matrix.
    """

    def __init__(self, shrinkage: float = 1e-3, aggregation: str = "mean", balance: str = "token") -> None:
        self.shrinkage = shrinkage
        self.aggregation = aggregation
        self.balance = balance

    def _check_params(self) -> None:
        super()._check_params()
        check_float(self.shrinkage, "shrinkage", low=0.0, high=1.0, low_open=True)

    def _direction(
        self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None
    ) -> tuple[np.ndarray, float, dict]:
        weights = np.ones(len(x)) if w is None else w
        m1 = _weighted_mean(x[y == 1], weights[y == 1])
        m0 = _weighted_mean(x[y == 0], weights[y == 0])
        centred = x - np.where(y[:, None] == 1, m1, m0)
        cov = (weights[:, None] * centred).T @ centred / weights.sum()
        ridge = np.trace(cov) / cov.shape[0]
        cov = (1.0 - self.shrinkage) * cov + self.shrinkage * (ridge if ridge > 0 else 1.0) * np.eye(
            cov.shape[0]
        )
        coef = np.linalg.solve(cov, m1 - m0)
        return coef, -0.5 * float((m1 + m0) @ coef), {}
