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
* :class:`~icml25.generative_models.copula_multimodal_fusion.CopulaFusionNet` — encoders → (L2-normalised)
  embeddings → imputation of a missing modality → concat or LSTM fusion head; loss
  ``CE + λ_cop · (−mean ℓ)``.
* :class:`~icml25.generative_models.copula_multimodal_fusion.CopulaFusionClassifier` — a scikit-learn
  classifier over two array modalities stacked as the columns of ``X`` (a modality is missing in a row when
  all its columns are NaN).

The fusion network and the classifier (with its training loop) are in
:mod:`icml25.generative_models.copula_multimodal_fusion` and re-exported here (lazily: that module imports
this one).

With ``d = 1`` and normalised weights the joint is an exact density (a test integrates it); for ``d > 1``
the copula of products of per-dimension CDFs is, as in the paper, a model term, not a normalised density.
"""

from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from icml25.kernels.checks import (
    check_choice,
    check_float,
    check_int,
    check_tensor,
)
from icml25.kernels.optim import Adam
from icml25.kernels.rng import make_generator

if TYPE_CHECKING:
    from icml25.generative_models.copula_multimodal_fusion import (
        CopulaFusionClassifier as CopulaFusionClassifier,
    )
    from icml25.generative_models.copula_multimodal_fusion import CopulaFusionNet as CopulaFusionNet

__all__ = [
    "BivariateCopula",
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


# The fusion network and the classifier import this module (the joint, the constants), so they are
# re-exported lazily (PEP 562).
_MOVED = {
    "CopulaFusionClassifier": "icml25.generative_models.copula_multimodal_fusion",
    "CopulaFusionNet": "icml25.generative_models.copula_multimodal_fusion",
}


def __getattr__(name: str) -> Any:
    """``CopulaFusionNet`` / ``CopulaFusionClassifier`` from
    :mod:`icml25.generative_models.copula_multimodal_fusion`, imported on first access."""
    if name in _MOVED:
        value = getattr(importlib.import_module(_MOVED[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
