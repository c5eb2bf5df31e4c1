"""Cross-Modal Alignment via Variational Copula Modelling — ICML 2025, P18: CM² copula fusion with missing-modality imputation.

Wu, Chan, Wang, Yin, Yu, "Cross-Modal Alignment via Variational Copula Modelling", ICML 2025 (PMLR 267;
arXiv 2511.03196; official code ``HKU-MedAI/CMCM``, ``models/loss.py`` and ``models/mimic*/fusion_copula.py``).

Each modality's embedding ``h`` gets a ``K``-component diagonal Gaussian-mixture marginal; a bivariate
copula ties the component CDFs ``F_k(h) = Π_j Φ((h_j − μ_kj)/σ_kj)`` of the two modalities together, and the
joint log-likelihood pairs the components by index::

    ℓ(h_A, h_B) = log Σ_k w_k · c_θ(F^A_k(h_A), F^B_k(h_B)) · N^A_k(h_A) · N^B_k(h_B),
    w_k = π^A_k π^B_k / Σ_j π^A_j π^B_j.

* :class:`GaussianMixtureMarginal` — the per-modality marginal (log density, per-component log CDF,
  posterior, sampling).
* :class:`BivariateCopula` and the functions :func:`copula_log_cdf` / :func:`copula_log_density` — Gumbel
  (default), Clayton, Frank and Gaussian copulas with their *true* densities, all in log space (``log u`` is
  clamped to ``[−50, −1e-7]``). ``official_gumbel_density=True`` reproduces the official code, which uses
  the Gumbel log-CDF in place of the log-density (a line its authors flag as unfinished).
* :class:`CopulaJoint` — the joint above, :meth:`CopulaJoint.impute` (``"conditional"``: the posterior-mean
  embedding of the missing modality, ``Σ_k r_k μ_k`` with ``r_k ∝ w_k N_k(h_obs)``, or a draw;
  ``"marginal_official"``: the official ``Σ_k π_k (μ_k + σ_k ε_k)``, unconditional) and :meth:`CopulaJoint.fit`.
* :class:`CopulaFusionNet` — encoders → (L2-normalised) embeddings → imputation of a missing modality →
  concat or LSTM fusion head; loss ``CE + λ_cop · (−mean ℓ)``.
* :class:`CopulaFusionClassifier` — a scikit-learn classifier over two array modalities stacked as the
  columns of ``X`` (a modality is missing in a row when all its columns are NaN).

With ``d = 1`` and normalised weights the joint is an exact density (a test integrates it); for ``d > 1``
the copula of products of per-dimension CDFs is, as in the paper, a model term, not a normalised density.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import column_or_1d
from sklearn.utils.multiclass import check_classification_targets
from torch import Tensor, nn
from torch.nn import functional as F

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

__all__ = [
    "BivariateCopula",
    "CopulaFusionClassifier",
    "CopulaFusionNet",
    "CopulaJoint",
    "GaussianMixtureMarginal",
    "copula_log_cdf",
    "copula_log_density",
    "sample_gumbel_copula",
]

FAMILIES = ("gumbel", "clayton", "frank", "gaussian")
IMPUTE_MODES = ("conditional", "marginal_official", "zeros")
FUSIONS = ("concat", "lstm")
LOG_U_MIN, LOG_U_MAX = -50.0, -1e-7
"""Clamp of ``log u`` (and ``log v``): u in [e^-50, 1 - 1e-7], so no copula term is 0, 1 or infinite."""
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(32)


# ----------------------------------------------------------------------------------------- validation
def _float_tensor(x: object, name: str, dim: int | None = None, ndim: int = 2) -> Tensor:
    """A finite, non-empty floating tensor of ``ndim`` dims whose last axis has ``dim`` entries (a NumPy array is
    converted), with ``|values| <= 1e15``."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    shape = None if dim is None else (None,) * (ndim - 1) + (dim,)
    return check_tensor(x, name, ndim=ndim, shape=shape, non_empty=True, max_abs=1e15)


def _check_log_uv(x: object, name: str) -> Tensor:
    """``log u`` values: a finite-or-(-inf) floating tensor of values <= 0 (clamped afterwards)."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a floating-point torch.Tensor of log-probabilities, got {got}")
    if torch.isnan(x).any() or (x > 0).any():
        raise ValueError(
            f"{name} must hold log-probabilities in [-inf, 0] (no NaN); got {int(torch.isnan(x).sum())} NaN "
            f"and {int((x > 0).sum())} positive values in shape {tuple(x.shape)}"
        )
    return x


def _inv_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


# ------------------------------------------------------------------------------------------- copulas
def _clamp_log(lu: Tensor) -> Tensor:
    return lu.clamp(LOG_U_MIN, LOG_U_MAX)


def _gumbel(lu: Tensor, lv: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
    """Gumbel ``(log C, log c)``; ``a = −log u``, ``g = a^θ + b^θ``, ``C = exp(−g^{1/θ})``."""
    la, lb = torch.log(-lu), torch.log(-lv)
    log_g = torch.logaddexp(theta * la, theta * lb)
    g_root = torch.exp(log_g / theta)
    log_C = -g_root
    log_c = (
        log_C - lu - lv + (theta - 1) * (la + lb) + (1 / theta - 2) * log_g + torch.log(g_root + theta - 1)
    )
    return log_C, log_c


def _clayton(lu: Tensor, lv: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
    """Clayton (θ > 0): ``C = (u^−θ + v^−θ − 1)^{−1/θ}``, ``c = (1+θ)(uv)^{−1−θ} s^{−2−1/θ}``."""
    x, y = -theta * lu, -theta * lv  # >= 0
    hi, lo = torch.maximum(x, y), torch.minimum(x, y)
    log_s = hi + torch.log1p(torch.exp(lo - hi) - torch.exp(-hi))
    log_C = -log_s / theta
    log_c = torch.log1p(theta) - (1 + theta) * (lu + lv) - (2 + 1 / theta) * log_s
    return log_C, log_c


def _frank(lu: Tensor, lv: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
    """Frank (θ ≠ 0; θ → 0 is independence)."""
    small = theta.abs() < 1e-6
    t = torch.where(small, torch.full_like(theta, 1e-6), theta)
    u, v = torch.exp(lu), torch.exp(lv)
    eu, ev, e1 = torch.expm1(-t * u), torch.expm1(-t * v), torch.expm1(-t)
    log_C = torch.log(-torch.log1p(eu * ev / e1) / t)
    log_c = torch.log(t * -e1) - t * (u + v) - 2 * torch.log((-e1 - eu * ev).abs())
    return torch.where(small, lu + lv, log_C), torch.where(small, torch.zeros_like(log_c), log_c)


def _gaussian(lu: Tensor, lv: Tensor, rho: Tensor) -> tuple[Tensor, Tensor]:
    """Gaussian copula with correlation ρ: density in closed form, CDF by Plackett's identity
    ``Φ₂(x, y; ρ) = Φ(x)Φ(y) + ∫_0^ρ φ₂(x, y; r) dr`` (32-point Gauss–Legendre)."""
    eps = 1e-12 if lu.dtype == torch.float64 else 1e-6
    x = torch.special.ndtri(torch.exp(lu).clamp(eps, 1 - eps))
    y = torch.special.ndtri(torch.exp(lv).clamp(eps, 1 - eps))
    one_m = 1 - rho * rho
    log_c = -0.5 * torch.log(one_m) - (rho * rho * (x * x + y * y) - 2 * rho * x * y) / (2 * one_m)
    nodes = torch.as_tensor(_GL_NODES, dtype=lu.dtype)
    weights = torch.as_tensor(_GL_WEIGHTS, dtype=lu.dtype)
    r = (0.5 * rho).unsqueeze(-1) * (nodes + 1)  # (..., 32) in [0, ρ]
    xe, ye = x.unsqueeze(-1), y.unsqueeze(-1)
    om = 1 - r * r
    dens = torch.exp(-(xe * xe - 2 * r * xe * ye + ye * ye) / (2 * om)) / (2 * math.pi * torch.sqrt(om))
    integral = 0.5 * rho * (dens * weights).sum(-1)
    C = (torch.exp(lu) * torch.exp(lv) + integral).clamp_min(torch.finfo(lu.dtype).tiny)
    return torch.log(C), log_c


_COPULAS = {"gumbel": _gumbel, "clayton": _clayton, "frank": _frank, "gaussian": _gaussian}


def _theta_ok(family: str, theta: Tensor) -> None:
    if not torch.isfinite(theta).all():
        raise ValueError(f"theta must be finite, got {theta}")
    lows = {
        "gumbel": (theta < 1, ">= 1"),
        "clayton": (theta <= 0, "> 0"),
        "gaussian": (theta.abs() >= 1, "in (-1, 1)"),
    }
    if family in lows and bool(lows[family][0].any()):
        raise ValueError(f"theta of the {family} copula must be {lows[family][1]}, got {theta}")


def _copula(family: str, log_u: object, log_v: object, theta: object) -> tuple[Tensor, Tensor]:
    family = check_choice(family, "family", FAMILIES)
    lu, lv = _check_log_uv(log_u, "log_u"), _check_log_uv(log_v, "log_v")
    if lu.shape != lv.shape:
        raise ValueError(
            f"log_u and log_v must have the same shape, got {tuple(lu.shape)} and {tuple(lv.shape)}"
        )
    if lu.numel() == 0:
        raise ValueError(f"log_u must be non-empty, got shape {tuple(lu.shape)}")
    if not isinstance(theta, Tensor):
        theta = torch.tensor(check_float(theta, "theta"), dtype=lu.dtype)
    _theta_ok(family, theta)
    return _COPULAS[family](_clamp_log(lu), _clamp_log(lv), theta.to(lu.dtype))


def copula_log_cdf(family: str, log_u: Tensor, log_v: Tensor, theta: float | Tensor) -> Tensor:
    """``log C_θ(u, v)`` of a bivariate copula from ``log u``, ``log v`` (same shape, values in ``[-inf, 0]``,
    clamped to ``[−50, −1e-7]``). ``family``: ``"gumbel"`` (θ ≥ 1), ``"clayton"`` (θ > 0), ``"frank"``
    (θ real, 0 = independence) or ``"gaussian"`` (θ = ρ in (−1, 1))."""
    return _copula(family, log_u, log_v, theta)[0]


def copula_log_density(family: str, log_u: Tensor, log_v: Tensor, theta: float | Tensor) -> Tensor:
    """``log c_θ(u, v) = log ∂²C/∂u∂v`` of a bivariate copula (arguments as :func:`copula_log_cdf`)."""
    return _copula(family, log_u, log_v, theta)[1]


def sample_gumbel_copula(n: int, theta: float, seed: int | None = 0) -> Tensor:
    """``n`` draws ``(n, 2)`` of ``(u, v)`` from the Gumbel copula (Marshall–Olkin: a positive-stable frailty
    ``S`` with Laplace transform ``exp(−s^{1/θ})`` by Kanter's representation, then ``u_i = exp(−(E_i/S)^{1/θ})``
    with ``E_i ~ Exp(1)``), in float64 from ``seed``."""
    n = check_int(n, "n", low=1)
    theta = check_float(theta, "theta", low=1.0)
    if theta > 1e3:
        raise ValueError(f"theta must be in [1, 1000] (1000 is numerically comonotone), got {theta!r}")
    g = make_generator(seed)
    E = -torch.log1p(-torch.rand(n, 2, generator=g, dtype=torch.float64))
    if theta == 1.0:
        return torch.exp(-E)
    a = 1.0 / theta
    W = math.pi * torch.rand(n, generator=g, dtype=torch.float64).clamp_min(1e-12)
    E0 = -torch.log1p(-torch.rand(n, generator=g, dtype=torch.float64))
    S = (torch.sin(a * W) / torch.sin(W) ** (1 / a)) * (torch.sin((1 - a) * W) / E0) ** ((1 - a) / a)
    return torch.exp(-((E / S[:, None]) ** a))


class BivariateCopula(nn.Module):
    """A one-parameter bivariate copula with a learnable, constrained parameter.

    Parametrisation of the raw parameter ``r``: Gumbel ``θ = 1 + softplus(r)``, Clayton ``θ = softplus(r)``,
    Frank ``θ = r``, Gaussian ``ρ = tanh(r)``. ``theta`` is the initial value (default: near independence:
    Gumbel 1.1, Clayton 0.1, Frank 0.1, Gaussian 0). ``official_gumbel_density=True`` returns the Gumbel
    log-CDF from :meth:`log_density`, as the official ``CopulaLoss`` does (for comparison only).
    """

    def __init__(
        self, family: str = "gumbel", theta: float | None = None, official_gumbel_density: bool = False
    ) -> None:
        super().__init__()
        self.family = check_choice(family, "family", FAMILIES)
        default = {"gumbel": 1.1, "clayton": 0.1, "frank": 0.1, "gaussian": 0.0}[family]
        t = default if theta is None else check_float(theta, "theta")
        _theta_ok(family, torch.tensor(t))
        if family == "gumbel":
            raw = _inv_softplus(t - 1) if t > 1 else -30.0
        elif family == "clayton":
            raw = _inv_softplus(t)
        elif family == "gaussian":
            raw = math.atanh(t)
        else:
            raw = t
        self.raw = nn.Parameter(torch.tensor(float(raw)))
        self.official_gumbel_density = bool(official_gumbel_density)

    @property
    def theta(self) -> Tensor:
        """The copula parameter (ρ for the Gaussian family)."""
        r = self.raw
        if self.family == "gumbel":
            return 1 + F.softplus(r)
        if self.family == "clayton":
            return F.softplus(r)
        if self.family == "gaussian":
            return torch.tanh(r)
        return r

    def log_cdf(self, log_u: Tensor, log_v: Tensor) -> Tensor:
        """``log C(u, v)`` elementwise."""
        return copula_log_cdf(self.family, log_u, log_v, self.theta)

    def log_density(self, log_u: Tensor, log_v: Tensor) -> Tensor:
        """``log c(u, v)`` elementwise (the log-CDF instead when ``official_gumbel_density``)."""
        if self.official_gumbel_density and self.family == "gumbel":
            return self.log_cdf(log_u, log_v)
        return copula_log_density(self.family, log_u, log_v, self.theta)

    def extra_repr(self) -> str:
        return f"family={self.family!r}, theta={float(self.theta):.4g}"


# ------------------------------------------------------------------------------------------ marginals
class GaussianMixtureMarginal(nn.Module):
    """``p(h) = Σ_k π_k N(h; μ_k, diag σ_k²)`` over ``R^dim`` with ``K = n_components``.

    ``π = softmax(logits)`` (init uniform), ``σ = min_std + softplus(raw_scale)`` (init ``init_std``; the floor
    bounds the likelihood of embeddings that an encoder could otherwise collapse onto ``μ``), ``μ`` init
    ``N(0, init_std²)`` drawn from ``seed`` (the official code starts every μ at 0, which leaves the ``K``
    components identical under gradient descent).
    """

    def __init__(
        self,
        dim: int,
        n_components: int = 3,
        init_std: float = 0.2,
        min_std: float = 1e-6,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim", low=1)
        self.n_components = check_int(n_components, "n_components", low=1)
        self.min_std = check_float(min_std, "min_std", low=0.0, low_open=True)
        init_std = check_float(init_std, "init_std", low=self.min_std, low_open=True)
        g = make_generator(seed)
        self.loc = nn.Parameter(init_std * torch.randn(self.n_components, self.dim, generator=g))
        raw = _inv_softplus(init_std - self.min_std)
        self.raw_scale = nn.Parameter(torch.full((self.n_components, self.dim), raw))
        self.logits = nn.Parameter(torch.zeros(self.n_components))

    @property
    def scale(self) -> Tensor:
        """Per-component, per-dimension standard deviations ``(K, dim)``."""
        return F.softplus(self.raw_scale) + self.min_std

    @property
    def log_weights(self) -> Tensor:
        """``log π`` ``(K,)``."""
        return torch.log_softmax(self.logits, 0)

    def _z(self, h: Tensor) -> Tensor:
        h = _float_tensor(h, "h", self.dim)
        return (h.unsqueeze(1).to(self.loc.dtype) - self.loc) / self.scale  # (B, K, dim)

    def log_prob_components(self, h: Tensor) -> Tensor:
        """``log N_k(h)`` ``(B, K)``."""
        z = self._z(h)
        return (-0.5 * z * z - torch.log(self.scale) - 0.5 * math.log(2 * math.pi)).sum(-1)

    def log_cdf_components(self, h: Tensor) -> Tensor:
        """``log F_k(h) = Σ_j log Φ((h_j − μ_kj)/σ_kj)`` ``(B, K)`` (exact in log space, no underflow)."""
        return torch.special.log_ndtr(self._z(h)).sum(-1)

    def log_prob(self, h: Tensor) -> Tensor:
        """``log p(h)`` ``(B,)``."""
        return torch.logsumexp(self.log_prob_components(h) + self.log_weights, -1)

    def posterior(self, h: Tensor) -> Tensor:
        """Component responsibilities ``p(k | h)`` ``(B, K)``."""
        return torch.softmax(self.log_prob_components(h) + self.log_weights, -1)

    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> Tensor:
        """``n`` draws ``(n, dim)`` from the mixture (detached)."""
        n = check_int(n, "n", low=1)
        g = make_generator(seed, generator)
        with torch.no_grad():
            k = torch.multinomial(self.log_weights.exp(), n, replacement=True, generator=g)
            eps = torch.randn(n, self.dim, generator=g, dtype=self.loc.dtype)
            return self.loc[k] + self.scale[k] * eps


# ---------------------------------------------------------------------------------------------- joint
class CopulaJoint(nn.Module):
    """CM² joint model of two embeddings: GMM marginals tied by a copula, components paired by index.

    ``forward(h_a, h_b)`` returns the per-sample ``ℓ(h_a, h_b)`` of the module docstring.
    ``normalize_weights=False`` uses the official unnormalised weights ``π^A_k π^B_k`` (their sum is not 1).
    """

    def __init__(
        self,
        dim_a: int,
        dim_b: int | None = None,
        n_components: int = 3,
        family: str = "gumbel",
        theta: float | None = None,
        init_std: float = 0.2,
        min_std: float = 1e-6,
        normalize_weights: bool = True,
        official_gumbel_density: bool = False,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        dim_b = dim_a if dim_b is None else dim_b
        seed_b = None if seed is None else seed + 1
        self.marginal_a = GaussianMixtureMarginal(dim_a, n_components, init_std, min_std, seed)
        self.marginal_b = GaussianMixtureMarginal(dim_b, n_components, init_std, min_std, seed_b)
        self.copula = BivariateCopula(family, theta, official_gumbel_density)
        self.normalize_weights = bool(normalize_weights)

    @property
    def log_weights(self) -> Tensor:
        """``log w_k`` of the paired components ``(K,)``."""
        lw = self.marginal_a.log_weights + self.marginal_b.log_weights
        return lw - torch.logsumexp(lw, 0) if self.normalize_weights else lw

    def component_terms(self, h_a: Tensor, h_b: Tensor) -> Tensor:
        """``log w_k + log c(F^A_k, F^B_k) + log N^A_k + log N^B_k`` ``(B, K)``."""
        h_a = _float_tensor(h_a, "h_a", self.marginal_a.dim)
        h_b = _float_tensor(h_b, "h_b", self.marginal_b.dim)
        if h_a.shape[0] != h_b.shape[0]:
            raise ValueError(
                f"h_a and h_b must have the same batch size, got {h_a.shape[0]} and {h_b.shape[0]}"
            )
        lc = self.copula.log_density(
            self.marginal_a.log_cdf_components(h_a), self.marginal_b.log_cdf_components(h_b)
        )
        return (
            lc + self.marginal_a.log_prob_components(h_a) + self.marginal_b.log_prob_components(h_b)
            + self.log_weights
        )  # fmt: skip

    def forward(self, h_a: Tensor, h_b: Tensor) -> Tensor:
        """Per-sample joint log-likelihood ``(B,)``."""
        return torch.logsumexp(self.component_terms(h_a, h_b), -1)

    def posterior(self, h_obs: Tensor, observed: Literal["A", "B"] = "A") -> Tensor:
        """``r_k ∝ w_k N_k(h_obs)`` ``(B, K)``: the component posterior given one modality (the copula
        integrates out of the other's marginal, so this is exact for ``d = 1``)."""
        m = self.marginal_a if observed == "A" else self.marginal_b
        return torch.softmax(m.log_prob_components(h_obs) + self.log_weights, -1)

    def impute(
        self,
        h_obs: Tensor,
        missing: Literal["A", "B"] = "B",
        mode: str = "conditional",
        sample: bool = False,
        generator: torch.Generator | None = None,
        detach: bool = True,
    ) -> Tensor:
        """An embedding of the ``missing`` modality for each row of the observed one's ``h_obs``.

        ``"conditional"``: ``Σ_k r_k μ_k`` of the missing modality (``r`` from :meth:`posterior`); with
        ``sample=True`` a component ``k ~ r`` and ``μ_k + σ_k ε``. ``"marginal_official"``: the official
        unconditional ``Σ_k π_k (μ_k + σ_k ε_k)`` (``ε = 0`` when ``sample=False``). ``"zeros"``: zeros.
        Detached (no gradient into the mixtures) unless ``detach=False``. Draws use ``generator`` (default: a
        generator seeded with 0, so repeated calls agree).
        """
        if missing not in ("A", "B"):
            raise ValueError(f"missing must be 'A' or 'B', got {missing!r}")
        mode = check_choice(mode, "mode", IMPUTE_MODES)
        observed = "A" if missing == "B" else "B"
        m_obs = self.marginal_a if observed == "A" else self.marginal_b
        m_mis = self.marginal_b if missing == "B" else self.marginal_a
        h_obs = _float_tensor(h_obs, "h_obs", m_obs.dim)
        n = h_obs.shape[0]
        if mode == "zeros":
            return torch.zeros(n, m_mis.dim, dtype=m_mis.loc.dtype)
        g = make_generator(0, generator) if sample else None
        with torch.set_grad_enabled(not detach and torch.is_grad_enabled()):
            if mode == "marginal_official":
                mix = m_mis.log_weights.exp()[:, None] * m_mis.loc  # (K, d)
                if sample:
                    eps = torch.randn(n, *m_mis.loc.shape, generator=g, dtype=m_mis.loc.dtype)
                    return (m_mis.log_weights.exp()[:, None] * (m_mis.loc + m_mis.scale * eps)).sum(1)
                return mix.sum(0).expand(n, -1).clone()
            r = self.posterior(h_obs, observed)
            if not sample:
                return r @ m_mis.loc
            k = torch.multinomial(r.detach(), 1, generator=g)[:, 0]
            eps = torch.randn(n, m_mis.dim, generator=g, dtype=m_mis.loc.dtype)
            return m_mis.loc[k] + m_mis.scale[k] * eps

    def init_from(self, h_a: Tensor, h_b: Tensor, generator: torch.Generator | None = None) -> CopulaJoint:
        """Data initialisation (like k-means' random seeding): the means of pair ``k`` are the embeddings of
        one random row ``(h_a[i_k], h_b[i_k])``, every scale the per-dimension std of the rows, weights
        uniform. Needs at least ``K`` rows; returns ``self``."""
        h_a = _float_tensor(h_a, "h_a", self.marginal_a.dim)
        h_b = _float_tensor(h_b, "h_b", self.marginal_b.dim)
        K = self.marginal_a.n_components
        if h_a.shape[0] != h_b.shape[0] or h_a.shape[0] < K:
            raise ValueError(
                f"h_a and h_b must have the same number of rows, at least n_components={K}; got "
                f"{h_a.shape[0]} and {h_b.shape[0]}"
            )
        idx = torch.randperm(h_a.shape[0], generator=make_generator(0, generator))[:K]
        with torch.no_grad():
            for m, h in ((self.marginal_a, h_a), (self.marginal_b, h_b)):
                h = h.detach().to(m.loc.dtype)
                std = h.std(0).clamp_min(2 * m.min_std) if h.shape[0] > 1 else torch.full_like(h[0], 1.0)
                m.loc.copy_(h[idx])
                m.raw_scale.copy_(torch.log(torch.expm1(std - m.min_std)).expand_as(m.raw_scale))
                m.logits.zero_()
        return self

    def fit(self, h_a: Tensor, h_b: Tensor, steps: int = 500, lr: float = 0.05) -> CopulaJoint:
        """Maximum likelihood by full-batch Adam on fixed embeddings (every parameter); returns ``self``."""
        steps = check_int(steps, "steps", low=1)
        lr = check_float(lr, "lr", low=0.0, low_open=True)
        h_a = _float_tensor(h_a, "h_a", self.marginal_a.dim)
        h_b = _float_tensor(h_b, "h_b", self.marginal_b.dim)
        opt = Adam(list(self.parameters()), lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            (-self(h_a, h_b).mean()).backward()
            opt.step()
        return self


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
        x_a, x_b = _float_tensor(x_a, "x_a"), _float_tensor(x_b, "x_b")
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
