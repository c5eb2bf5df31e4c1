"""Cross-Modal Alignment via Variational Copula Modelling — ICML 2025, P18: the fusion network and its scikit-learn classifier.

:class:`CopulaFusionNet` — encoders → (L2-normalised) embeddings → imputation of a missing modality by the
copula joint (:class:`icml25.generative_models.copula_multimodal.CopulaJoint`) → concat or LSTM fusion head;
loss ``CE + λ_cop · (−mean ℓ)``. :class:`CopulaFusionClassifier` — a scikit-learn classifier over two array
modalities stacked as the columns of ``X`` (a modality is missing in a row when all its columns are NaN),
with its training loop. The copulas, marginals and the joint are :mod:`icml25.generative_models.copula_multimodal`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import column_or_1d
from sklearn.utils.multiclass import check_classification_targets
from torch import Tensor, nn
from torch.nn import functional as F

from icml25.generative_models.copula_multimodal import FAMILIES, FUSIONS, IMPUTE_MODES, CopulaJoint
from icml25.kernels.checks import (
    check_choice,
    check_fitted,
    check_float,
    check_int,
    check_sklearn_array,
    check_tensor,
)
from icml25.kernels.optim import Adam
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = ["CopulaFusionClassifier", "CopulaFusionNet"]


def _as_tensor(x: object, name: str) -> Tensor:
    """A modality's features ``(n, d)`` as a tensor (a NumPy array is converted), checked by
    :func:`icml25.kernels.checks.check_tensor`: floating, finite, non-empty, ``|values| <= 1e15``."""
    x = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
    return check_tensor(x, name, ndim=2, non_empty=True, max_abs=1e15)


# ------------------------------------------------------------------------------------------ fusion net
def _mlp(d_in: int, hidden: int, layers: int, d_out: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    d = d_in
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), nn.ReLU()]
        d = hidden
    mods.append(nn.Linear(d, d_out))
    return nn.Sequential(*mods)


class CopulaFusionNet(nn.Module):
    """Two encoders, a :class:`CopulaJoint` on their embeddings and a fusion head (CM²).

    ``forward(x_a, x_b, a_present, b_present)`` encodes both modalities (rows of an absent one may hold any
    finite values), L2-normalises the embeddings (``normalize``), replaces an absent modality's embedding by
    :meth:`CopulaJoint.impute` (``impute``), and classifies with ``fusion="concat"`` (Linear on
    ``[h_A, h_B]``) or ``"lstm"`` (the official MIMIC head: an LSTM over ``[h_A, h_B]`` for paired rows and
    over the present embedding alone otherwise, so an imputed embedding never reaches the head).
    ``copula_on="paired"`` scores ``ℓ`` on rows with both modalities; ``"all"`` (official) includes imputed ones.
    """

    def __init__(
        self,
        encoder_a: nn.Module,
        encoder_b: nn.Module,
        embed_dim: int,
        n_classes: int = 2,
        n_components: int = 3,
        family: str = "gumbel",
        fusion: str = "concat",
        impute: str = "conditional",
        normalize: bool = True,
        copula_on: str = "paired",
        official_gumbel_density: bool = False,
        min_std: float = 0.05,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        if not isinstance(encoder_a, nn.Module) or not isinstance(encoder_b, nn.Module):
            raise TypeError(
                f"encoder_a and encoder_b must be torch.nn.Module, got {type(encoder_a).__name__} and "
                f"{type(encoder_b).__name__}"
            )
        self.embed_dim = check_int(embed_dim, "embed_dim", low=1)
        self.n_classes = check_int(n_classes, "n_classes", low=2)
        self.fusion = check_choice(fusion, "fusion", FUSIONS)
        self.impute = check_choice(impute, "impute", IMPUTE_MODES)
        self.copula_on = check_choice(copula_on, "copula_on", ("paired", "all"))
        self.normalize = bool(normalize)
        self.encoder_a, self.encoder_b = encoder_a, encoder_b
        with isolated_rng(seed):
            self.joint = CopulaJoint(
                self.embed_dim, self.embed_dim, n_components, family,
                official_gumbel_density=official_gumbel_density, min_std=min_std, seed=seed,
            )  # fmt: skip
            if self.fusion == "concat":
                self.head = nn.Linear(2 * self.embed_dim, self.n_classes)
            else:
                self.lstm = nn.LSTMCell(self.embed_dim, self.embed_dim)
                self.head = nn.Linear(self.embed_dim, self.n_classes)

    def _embed(self, enc: nn.Module, x: Tensor, name: str) -> Tensor:
        h = enc(x)
        if not isinstance(h, Tensor) or h.dim() != 2 or h.shape[1] != self.embed_dim:
            shape = tuple(h.shape) if isinstance(h, Tensor) else type(h).__name__
            raise ValueError(
                f"{name} must return embeddings of shape (B, embed_dim={self.embed_dim}), got {shape}"
            )
        return F.normalize(h, dim=1) if self.normalize else h

    def forward(
        self, x_a: Tensor, x_b: Tensor, a_present: Tensor | None = None, b_present: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> dict[str, Tensor]:  # fmt: skip
        """``{"logits" (B, n_classes), "log_lik" (scalar mean ℓ over the scored rows, 0 when none),
        "h_a", "h_b" (embeddings after imputation)}``."""
        x_a, x_b = _as_tensor(x_a, "x_a"), _as_tensor(x_b, "x_b")
        n = x_a.shape[0]
        if x_b.shape[0] != n:
            raise ValueError(f"x_a and x_b must have the same number of rows, got {n} and {x_b.shape[0]}")
        a_p = (
            torch.ones(n, dtype=torch.bool)
            if a_present is None
            else torch.as_tensor(a_present).to(torch.bool)
        )
        b_p = (
            torch.ones(n, dtype=torch.bool)
            if b_present is None
            else torch.as_tensor(b_present).to(torch.bool)
        )
        if a_p.shape != (n,) or b_p.shape != (n,):
            raise ValueError(
                f"a_present and b_present must have shape ({n},), got {tuple(a_p.shape)}, {tuple(b_p.shape)}"
            )
        if bool((~a_p & ~b_p).any()):
            raise ValueError(
                f"each row needs at least one modality; rows {torch.nonzero(~a_p & ~b_p)[:5, 0].tolist()} have none"
            )
        h_a, h_b = (
            self._embed(self.encoder_a, x_a, "encoder_a"),
            self._embed(self.encoder_b, x_b, "encoder_b"),
        )
        sample = self.impute == "marginal_official"  # the official code draws; conditional uses the mean
        if bool((~b_p).any()):
            fill = self.joint.impute(h_a[~b_p], "B", self.impute, sample=sample, generator=generator)
            h_b = _put(h_b, ~b_p, fill)
        if bool((~a_p).any()):
            fill = self.joint.impute(h_b[~a_p], "A", self.impute, sample=sample, generator=generator)
            h_a = _put(h_a, ~a_p, fill)
        scored = (a_p & b_p) if self.copula_on == "paired" else torch.ones(n, dtype=torch.bool)
        if bool(scored.any()):
            log_lik = self.joint(h_a[scored], h_b[scored]).mean()
        else:
            log_lik = h_a.sum() * 0.0  # nothing to score: no copula term (and no NaN)
        if self.fusion == "concat":
            logits = self.head(torch.cat([h_a, h_b], 1))
        else:
            first = torch.where(a_p[:, None], h_a, h_b)
            hx, cx = self.lstm(first)
            h2, _ = self.lstm(h_b, (hx, cx))
            logits = self.head(torch.where((a_p & b_p)[:, None], h2, hx))
        return {"logits": logits, "log_lik": log_lik, "h_a": h_a, "h_b": h_b}


def _put(h: Tensor, rows: Tensor, fill: Tensor) -> Tensor:
    out = h.clone()
    out[rows] = fill.to(h.dtype)
    return out


# ------------------------------------------------------------------------------------- sklearn wrapper
class CopulaFusionClassifier(ClassifierMixin, BaseEstimator):
    """CM² as a scikit-learn classifier over two array modalities.

    ``X`` stacks modality A in its first ``n_features_a`` columns and modality B in the rest; a row whose
    B (or A) columns are *all* NaN has that modality missing (a partly-NaN block is an error, as is a row
    with both missing). MLP encoders (``n_layers`` × ``hidden``, ReLU) map each modality to ``embed_dim``;
    features are standardised with the training statistics of the present rows. The mixtures start random
    (``mixture_init="random"``) or at the untrained encoders' embeddings of ``K`` random paired rows
    (``"data"``, :meth:`CopulaJoint.init_from`). Trained with
    cross-entropy ``+ lambda_cop · (−mean ℓ)`` by Adam (learning rate ``lr``; ``copula_lr`` for the mixtures and
    the copula, ``None``: ``lr`` as in the official code). ``impute="zeros"`` is the zero-fill baseline.

    Fitted attributes: ``classes_``, ``n_features_in_``, ``net_`` (:class:`CopulaFusionNet`), ``mean_``,
    ``scale_``, ``loss_history_`` (per epoch), ``theta_`` (the copula parameter).
    """

    def __init__(
        self,
        n_features_a: int = 1,
        embed_dim: int = 16,
        hidden: int = 32,
        n_layers: int = 2,
        n_components: int = 3,
        family: str = "gumbel",
        fusion: str = "concat",
        impute: str = "conditional",
        lambda_cop: float = 0.1,
        normalize: bool = True,
        copula_on: str = "paired",
        official_gumbel_density: bool = False,
        min_std: float = 0.05,
        mixture_init: str = "random",
        epochs: int = 40,
        batch_size: int = 32,
        lr: float = 1e-3,
        copula_lr: float | None = None,
        seed: int = 0,
    ) -> None:
        self.n_features_a = n_features_a
        self.embed_dim = embed_dim
        self.hidden = hidden
        self.n_layers = n_layers
        self.n_components = n_components
        self.family = family
        self.fusion = fusion
        self.impute = impute
        self.lambda_cop = lambda_cop
        self.normalize = normalize
        self.copula_on = copula_on
        self.official_gumbel_density = official_gumbel_density
        self.min_std = min_std
        self.mixture_init = mixture_init
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.copula_lr = copula_lr
        self.seed = seed

    def _more_tags(self) -> dict:  # scikit-learn < 1.6
        return {"allow_nan": True}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # NaN blocks mark a missing modality
        return tags

    # -- input handling
    def _split(
        self, X: object, name: str = "X", reset: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        # scikit-learn's check_array (its messages, naming ``name``): dense, numeric, 2-D, non-empty; NaN allowed
        X = check_sklearn_array(X, name, estimator=self, dtype="numeric", ensure_all_finite="allow-nan")
        na = check_int(self.n_features_a, "n_features_a", low=1)
        if not reset and hasattr(self, "n_features_in_") and X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"{name} has {X.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input (as in fit)"
            )
        if X.shape[1] <= na:
            raise ValueError(
                f"{name} must have more than n_features_a={na} columns (A's, then B's), got {X.shape[1]} "
                f"feature(s), shape {X.shape}"
            )
        X = X.astype(np.float64)
        if np.isinf(X).any() or np.abs(np.nan_to_num(X)).max() > 1e15:
            raise ValueError(
                f"{name} must be finite with |values| <= 1e15 (NaN marks a missing modality), got Inf or huge values"
            )
        nan = np.isnan(X)
        blocks = []
        for lo, hi, mod in ((0, na, "A"), (na, X.shape[1], "B")):
            part = nan[:, lo:hi]
            if (part.any(1) & ~part.all(1)).any():
                row = int(np.flatnonzero(part.any(1) & ~part.all(1))[0])
                raise ValueError(
                    f"{name}: modality {mod}'s columns must be all finite or all NaN (missing) in each row; "
                    f"row {row} is partly NaN"
                )
            blocks.append(~part.all(1))
        a_p, b_p = blocks
        if (~a_p & ~b_p).any():
            raise ValueError(
                f"{name}: each row needs at least one modality; row {int(np.flatnonzero(~a_p & ~b_p)[0])} has none"
            )
        Xf = np.nan_to_num(X, nan=0.0)
        return (
            torch.from_numpy(Xf[:, :na]),
            torch.from_numpy(Xf[:, na:]),
            torch.from_numpy(a_p),
            torch.from_numpy(b_p),
        )

    def _standardise(self, xa: Tensor, xb: Tensor) -> tuple[Tensor, Tensor]:
        na = xa.shape[1]
        xa = (xa - self.mean_[:na]) / self.scale_[:na]
        xb = (xb - self.mean_[na:]) / self.scale_[na:]
        return xa.float(), xb.float()

    def fit(self, X: object, y: object) -> CopulaFusionClassifier:
        """Train on ``X`` ``(n, n_a + n_b)`` (NaN blocks = missing modality) and labels ``y`` ``(n,)``."""
        xa, xb, a_p, b_p = self._split(X, reset=True)
        if y is None:
            raise ValueError(
                "y must hold one label per row of X: CopulaFusionClassifier requires y to be passed, but the "
                "target y is None"
            )
        y_arr = np.asarray(y)
        if y_arr.ndim == 2 and y_arr.shape[1] == 1:
            y_arr = column_or_1d(y_arr, warn=True)  # a column vector: scikit-learn's DataConversionWarning
        if y_arr.ndim != 1 or y_arr.shape[0] != xa.shape[0]:
            raise ValueError(
                f"y must be 1-D with {xa.shape[0]} labels (one per row of X), got shape {y_arr.shape}"
            )
        if y_arr.dtype.kind == "f" and not np.isfinite(y_arr).all():
            raise ValueError("y must hold finite class labels, got NaN/Inf")
        check_classification_targets(y_arr)  # "Unknown label type: continuous" for a regression target
        classes, y_idx = np.unique(y_arr, return_inverse=True)
        if classes.shape[0] < 2:
            raise ValueError(
                f"y must hold at least 2 classes, got {classes.shape[0]} class: {classes.tolist()}"
            )
        args = {
            "embed_dim": check_int(self.embed_dim, "embed_dim", low=1),
            "hidden": check_int(self.hidden, "hidden", low=1),
            "n_layers": check_int(self.n_layers, "n_layers", low=0),
            "n_components": check_int(self.n_components, "n_components", low=1),
            "epochs": check_int(self.epochs, "epochs", low=1),
            "batch_size": check_int(self.batch_size, "batch_size", low=1),
        }
        lam = check_float(self.lambda_cop, "lambda_cop", low=0.0)
        min_std = check_float(self.min_std, "min_std", low=0.0, low_open=True)
        lr = check_float(self.lr, "lr", low=0.0, low_open=True)
        lr_cop = (
            lr if self.copula_lr is None else check_float(self.copula_lr, "copula_lr", low=0.0, low_open=True)
        )
        for value, name, choices in ((self.family, "family", FAMILIES), (self.fusion, "fusion", FUSIONS),
                                     (self.impute, "impute", IMPUTE_MODES), (self.copula_on, "copula_on", ("paired", "all")),
                                     (self.mixture_init, "mixture_init", ("random", "data"))):  # fmt: skip
            check_choice(value, name, choices)
        seed = check_int(self.seed, "seed", low=0)
        # all inputs valid: from here on the estimator's state changes
        X_all = torch.cat([xa, xb], 1)
        present = torch.cat([a_p[:, None].expand_as(xa), b_p[:, None].expand_as(xb)], 1)
        cnt = present.sum(0).clamp_min(1)
        mean = (X_all * present).sum(0) / cnt
        var = (((X_all - mean) * present) ** 2).sum(0) / cnt
        self.mean_, self.scale_ = mean, torch.where(var > 1e-24, var.sqrt(), torch.ones_like(var))
        self.classes_ = classes
        self.n_features_in_ = xa.shape[1] + xb.shape[1]
        d, h, L = args["embed_dim"], args["hidden"], args["n_layers"]
        with isolated_rng(seed):
            enc_a, enc_b = _mlp(xa.shape[1], h, L, d), _mlp(xb.shape[1], h, L, d)
        self.net_ = CopulaFusionNet(
            enc_a, enc_b, d, max(2, classes.shape[0]), args["n_components"], self.family, self.fusion,
            self.impute, self.normalize, self.copula_on, self.official_gumbel_density, min_std, seed,
        )  # fmt: skip
        xa_s, xb_s = self._standardise(xa, xb)
        yt = torch.from_numpy(y_idx.astype(np.int64))
        g = make_generator(seed)
        both = a_p & b_p
        if self.mixture_init == "data" and int(both.sum()) >= args["n_components"]:
            with torch.no_grad():
                h_a0 = self.net_._embed(self.net_.encoder_a, xa_s[both], "encoder_a")
                h_b0 = self.net_._embed(self.net_.encoder_b, xb_s[both], "encoder_b")
            self.net_.joint.init_from(h_a0, h_b0, generator=g)
        joint = set(map(id, self.net_.joint.parameters()))
        opts = [
            Adam([p for p in self.net_.parameters() if id(p) not in joint], lr=lr),
            Adam(list(self.net_.joint.parameters()), lr=lr_cop),
        ]
        n, bs = xa.shape[0], args["batch_size"]
        self.loss_history_ = []
        self.net_.train()
        for _ in range(args["epochs"]):
            perm = torch.randperm(n, generator=g)
            total = 0.0
            for i in range(0, n, bs):
                idx = perm[i : i + bs]
                out = self.net_(xa_s[idx], xb_s[idx], a_p[idx], b_p[idx], generator=g)
                loss = F.cross_entropy(out["logits"], yt[idx]) - lam * out["log_lik"]
                for opt in opts:
                    opt.zero_grad()
                loss.backward()
                for opt in opts:
                    opt.step()
                total += float(loss.detach()) * idx.shape[0]
            self.loss_history_.append(total / n)
        self.net_.eval()
        return self

    @property
    def theta_(self) -> float:
        """The fitted copula parameter (ρ for the Gaussian family)."""
        check_fitted(self, "net_")
        return float(self.net_.joint.copula.theta.detach())

    def predict_proba(self, X: object) -> np.ndarray:
        """Class probabilities ``(n, n_classes)``; a missing modality is imputed (``impute``)."""
        check_fitted(self, "net_")
        xa, xb, a_p, b_p = self._split(X)
        xa, xb = self._standardise(xa, xb)
        with torch.no_grad():
            logits = self.net_(xa, xb, a_p, b_p, generator=make_generator(0))["logits"]
        return torch.softmax(logits.double(), 1)[:, : self.classes_.shape[0]].numpy()

    def predict(self, X: object) -> np.ndarray:
        """The most probable class label per row."""
        proba = self.predict_proba(X)
        return self.classes_[proba.argmax(1)]

    def embed(self, X: object) -> Mapping[str, np.ndarray]:
        """``{"h_a", "h_b"}`` embeddings ``(n, embed_dim)`` after imputation of missing modalities."""
        check_fitted(self, "net_")
        xa, xb, a_p, b_p = self._split(X)
        xa, xb = self._standardise(xa, xb)
        with torch.no_grad():
            out = self.net_(xa, xb, a_p, b_p, generator=make_generator(0))
        return {"h_a": out["h_a"].numpy(), "h_b": out["h_b"].numpy()}
