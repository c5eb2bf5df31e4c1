"""Joint MoE Scaling Laws: Mixture of Experts Can Be Memory Efficient — ICML 2025, P09: the joint law.

Ludziejewski et al., ICML 2025 (PMLR 267:41056–41073, arXiv:2502.05172; no official code release was
found). One law covers dense (``E = 1``) and Mixture-of-Experts models::

    L(N, D, E) = a · Ê^δ · N^(α + γ·ln Ê) + b · Ê^ω · D^(β + ζ·ln Ê) + c

with ``N`` the active parameters per token, ``D`` the training tokens and ``Ê`` a (optionally saturating)
transform of the expert count with ``Ê(1) = 1``, so that ``E = 1`` is Chinchilla's ``a·N^α + b·D^β + c``.

* :class:`JointMoEScalingLaw` — evaluation, a robust fitter (Huber loss on log-loss, L-BFGS from many
  random starts, Hoffmann et al. 2022's protocol, via ``torch.optim.LBFGS`` in float64 with autograd
  gradients), the compute-optimal allocation for a fixed ``E`` (closed form, cross-checked by a bounded
  search), the memory-constrained optimum over a set of expert counts, and a dense-vs-MoE comparison;
* :func:`total_params` — memory ``N_total = N·(1 + (E − k)·f/k)`` for top-``k`` routing with experts of
  the dense-FFN size (``f`` = FFN share of the active parameters);
* :func:`lr_rule` — the learning-rate rule reported with the law;
* :data:`PAPER_COEFFS_UNVERIFIED` — the coefficients as transcribed from a secondary source. Their
  magnitudes and signs could not be checked against the paper's table; the signs shipped here are the
  only pattern of the 16 candidates that gives MoE a loss gain at equal ``N`` and ``D``, gains that
  shrink as ``N`` grows, and compute-optimal tokens per active parameter that grow with ``E`` (a claim of
  the paper). **Re-check them against the paper before relying on their numbers.**

Training compute is ``F = k_F · N · D`` with ``k_F = 6`` by default (``flops_per_param_token``; the
attention and router FLOPs are not in the 6 and can be folded into a larger ``k_F``). The law assumes
unlimited unique data: pass ``unique_tokens`` to get a warning when an allocation would repeat data.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from typing import Any

import numpy as np
import torch

from icml25.kernels.checks import check_array
from icml25.kernels.threads import torch_threads

__all__ = [
    "PAPER_COEFFS_UNVERIFIED",
    "Allocation",
    "JointLawParams",
    "JointMoEScalingLaw",
    "lr_rule",
    "total_params",
]

_N_PARAMS = 9


@dataclass(frozen=True)
class JointLawParams:
    """The nine constants of the joint law (``N`` and ``D`` in raw counts, loss in nats).

    ``alpha``/``beta`` are the dense exponents (negative), ``gamma``/``zeta`` their log-linear change with
    ``ln Ê``, ``delta``/``omega`` the multiplicative ``Ê`` factors of the two terms, ``c`` the irreducible
    loss.
    """

    a: float
    alpha: float
    gamma: float
    delta: float
    b: float
    beta: float
    zeta: float
    omega: float
    c: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                raise TypeError(f"JointLawParams.{f.name} must be a real number, got {type(v).__name__}")
            if not math.isfinite(float(v)):
                raise ValueError(f"JointLawParams.{f.name} must be finite, got {v}")
            object.__setattr__(self, f.name, float(v))
        for name in ("a", "b"):
            if getattr(self, name) <= 0:
                raise ValueError(f"JointLawParams.{name} must be > 0, got {getattr(self, name)}")
        if self.c < 0:
            raise ValueError(f"JointLawParams.c must be >= 0, got {self.c}")

    def as_array(self) -> np.ndarray:
        """The constants as a ``(9,)`` float64 array in field order ``a, alpha, gamma, delta, b, beta,
        zeta, omega, c``."""
        return np.array(astuple(self), dtype=np.float64)


PAPER_COEFFS_UNVERIFIED = JointLawParams(
    a=35.91, alpha=-0.1889, gamma=0.0098, delta=-0.2285, b=35.98, beta=-0.1775, zeta=-0.0259, omega=0.5529,
    c=1.3637,
)  # fmt: skip
"""The joint law's constants as transcribed from a secondary source, **unverified** against the paper.

Magnitudes as transcribed; signs chosen by the checks described in the module docstring (the exponents
``α, β < 0``; ``δ < 0, γ > 0``: the active-parameter term gains from experts, less so at large ``N``;
``ζ < 0``: the data exponent steepens with ``E``; ``ω > 0``). Known oddity: the dense compute-optimal
ratio is ≈ 3 tokens per parameter, far below Chinchilla's ≈ 20, a hint that the transcribed magnitudes or
units differ from the paper's table too.
"""


@dataclass(frozen=True)
class Allocation:
    """One training configuration and its predicted loss (all counts raw, not in billions)."""

    experts: float
    """Number of experts ``E`` (1 = dense)."""
    n_act: float
    """Active parameters per token ``N``."""
    tokens: float
    """Training tokens ``D``."""
    total_params: float
    """Parameters held in memory, :func:`total_params` (``nan`` when the expert count is not an integer)."""
    flops: float
    """Training compute ``flops_per_param_token · N · D``."""
    loss: float
    """Predicted final loss (nats)."""

    @property
    def tokens_per_param(self) -> float:
        """``D / N``."""
        return self.tokens / self.n_act


# ----------------------------------------------------------------------------------------- validation
def _as_positive(x: Any, name: str, *, allow_zero: bool = False) -> np.ndarray:
    """``x`` as a float64 array whose entries are all finite and > 0 (a clear error otherwise)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = check_array(x, name, dtype=("float", "int"), non_empty=True).astype(np.float64)
    low = arr < 0 if allow_zero else arr <= 0
    if low.any():
        raise ValueError(
            f"{name} must be {'>= 0' if allow_zero else '> 0'}; got min {arr.min()} (shape {arr.shape})"
        )
    return arr


def _as_scalar(x: Any, name: str) -> float:
    arr = _as_positive(x, name)
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar, got an array of shape {arr.shape}")
    return float(arr)


def _as_expert_count(experts: Any, name: str = "experts", *, top_k: int = 1) -> int:
    if isinstance(experts, (bool, np.bool_)) or not isinstance(
        experts, (int, np.integer, float, np.floating)
    ):
        raise TypeError(f"{name} must be an integer expert count, got {type(experts).__name__}")
    if not math.isfinite(float(experts)) or float(experts) != int(experts):
        raise ValueError(f"{name} must be an integer expert count, got {experts}")
    e = int(experts)
    if e < max(1, top_k):
        raise ValueError(f"{name} must be >= max(1, top_k) = {max(1, top_k)}, got {e}")
    return e


def _as_fraction(x: Any, name: str) -> float:
    v = _as_scalar(x, name)
    if v > 1:
        raise ValueError(f"{name} must be in (0, 1], got {v}")
    return v


def _as_top_k(top_k: Any) -> int:
    if isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, (int, np.integer)) or int(top_k) < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    return int(top_k)


# ------------------------------------------------------------------------------------------ functions
def total_params(n_act: Any, experts: Any, ffn_fraction: float = 2 / 3, top_k: int = 1) -> float:
    """Parameters held in memory by a top-``k`` MoE with ``n_act`` active parameters per token.

    The experts replace the FFN, which holds ``ffn_fraction`` of the active parameters (≈ 2/3 of the
    non-embedding parameters for ``d_ff = 4·d``), and each of the ``k`` active experts has ``1/k`` of
    that share: ``N_total = N · (1 + (E − k) · f / k)``. ``E = 1`` gives ``N``. ``experts`` must be an
    integer ``>= top_k``.
    """
    n = _as_scalar(n_act, "n_act")
    k = _as_top_k(top_k)
    e = _as_expert_count(experts, top_k=k)
    f = _as_fraction(ffn_fraction, "ffn_fraction")
    return n * (1.0 + (e - k) * f / k)


def lr_rule(n_act: Any, experts: Any) -> np.ndarray | float:
    """The peak learning rate reported with the law, ``exp(8.39 − 0.81·ln N − 0.25·ln E)``.

    ``N`` = active non-embedding parameters. Coefficients transcribed from a secondary source and not
    verified against the paper. Vectorised over broadcastable ``n_act`` / ``experts`` (floats allowed).
    """
    n = _as_positive(n_act, "n_act")
    e = _as_positive(experts, "experts")
    try:
        n, e = np.broadcast_arrays(n, e)
    except ValueError:
        raise ValueError(f"n_act and experts must broadcast, got shapes {n.shape} and {e.shape}") from None
    out = np.exp(8.39 - 0.81 * np.log(n) - 0.25 * np.log(e))
    return float(out) if out.ndim == 0 else out


def _batched_lbfgs(
    fn: Any, x0: torch.Tensor, max_iter: int, history: int = 10, tol_grad: float = 1e-9
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Minimise ``K`` independent problems at once: ``fn`` maps ``(K, P)`` to ``(K,)`` objectives.

    L-BFGS (two-loop recursion, ``history`` pairs) per row, with a per-row backtracking Armijo line search;
    rows are independent (separate histories, steps and convergence). Autograd gives the gradients (the
    rows' objectives are separable, so the gradient of their sum is each row's gradient). Returns the
    final ``(K, P)`` points, their ``(K,)`` objectives and the number of iterations run.
    """
    K, P = x0.shape
    x = x0.clone()

    def value_grad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xr = x.detach().requires_grad_(True)
        f = fn(xr)
        (g,) = torch.autograd.grad(f.sum(), xr)
        return f.detach(), g

    f, g = value_grad(x)
    S = torch.zeros(history, K, P, dtype=x.dtype)
    Y = torch.zeros(history, K, P, dtype=x.dtype)
    rho = torch.zeros(history, K, dtype=x.dtype)
    gamma = 1.0 / g.norm(dim=1).clamp(min=1.0)
    active = torch.ones(K, dtype=torch.bool)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - the count is returned
        q = g.clone()
        alphas = []
        for j in range(history - 1, -1, -1):  # newest slot first (slots are rolled, newest last)
            a = rho[j] * (S[j] * q).sum(dim=1)
            q = q - a[:, None] * Y[j]
            alphas.append(a)
        r = gamma[:, None] * q
        for j, a in zip(range(history), reversed(alphas)):
            b = rho[j] * (Y[j] * r).sum(dim=1)
            r = r + S[j] * (a - b)[:, None]
        d = -r
        slope = (g * d).sum(dim=1)
        bad = ~(slope < 0) | ~torch.isfinite(slope)
        d = torch.where(bad[:, None], -g * gamma[:, None], d)
        slope = torch.where(bad, -(g * g).sum(dim=1) * gamma, slope)
        step = torch.where(active, torch.ones_like(f), torch.zeros_like(f))
        pending = active.clone()
        f_new = f.clone()
        for _ in range(40):  # backtracking: halve the step of the rows that fail Armijo's condition
            with torch.no_grad():
                trial = fn(x + step[:, None] * d)
            ok = torch.isfinite(trial) & (trial <= f + 1e-4 * step * slope)
            f_new = torch.where(pending & ok, trial, f_new)
            pending = pending & ~ok
            if not pending.any():
                break
            step = torch.where(pending, step * 0.5, step)
        step = torch.where(pending, torch.zeros_like(step), step)  # no decrease found: stay put
        x_new = x + step[:, None] * d
        f_new, g_new = value_grad(x_new)
        s_k, y_k = x_new - x, g_new - g
        sy = (s_k * y_k).sum(dim=1)
        good = sy > 1e-14
        S, Y, rho = S.roll(-1, 0), Y.roll(-1, 0), rho.roll(-1, 0)
        S[-1] = torch.where(good[:, None], s_k, torch.zeros_like(s_k))
        Y[-1] = torch.where(good[:, None], y_k, torch.zeros_like(y_k))
        rho[-1] = torch.where(good, 1.0 / sy.clamp(min=1e-300), torch.zeros_like(sy))
        gamma = torch.where(good, sy / (y_k * y_k).sum(dim=1).clamp(min=1e-300), gamma)
        converged = (g_new.abs().amax(dim=1) < tol_grad) | (step == 0) | ((f - f_new).abs() < 1e-15)
        x, f, g = x_new, f_new, g_new
        active = active & ~converged
        if not active.any():
            break
    return x, f, it


def _huber(r: torch.Tensor, delta: float) -> torch.Tensor:
    a = r.abs()
    return torch.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


# ------------------------------------------------------------------------------------------- the law
class JointMoEScalingLaw:
    """The joint dense/MoE scaling law: evaluation, robust fitting and budget optimisation.

    Args:
        params: the constants (:class:`JointLawParams`); ``None`` for an unfitted law to :meth:`fit`.
            :data:`PAPER_COEFFS_UNVERIFIED` holds the transcribed ones.
        expert_transform: ``"identity"`` (``Ê = E``) or ``"clark"``, the saturating transform of Clark
            et al. 2022, ``1/Ê = 1/(E − 1 + (1/(E_start − 1) − 1/E_max)^(−1)) + 1/E_max``, which is 1 at
            ``E = 1`` when ``e_start = 2`` and tends to ``E_max`` for large ``E``.
        e_start, e_max: the transform's constants (``e_max`` required for ``"clark"``, ``> e_start − 1``).
    """

    def __init__(
        self,
        params: JointLawParams | None = None,
        expert_transform: str = "identity",
        e_start: float = 2.0,
        e_max: float | None = None,
    ) -> None:
        if params is not None and not isinstance(params, JointLawParams):
            raise TypeError(f"params must be a JointLawParams or None, got {type(params).__name__}")
        if expert_transform not in ("identity", "clark"):
            raise ValueError(f"expert_transform must be 'identity' or 'clark', got {expert_transform!r}")
        e_start = _as_scalar(e_start, "e_start")
        if e_start <= 1:
            raise ValueError(f"e_start must be > 1, got {e_start}")
        if expert_transform == "clark":
            if e_max is None:
                raise ValueError("e_max must be given for expert_transform='clark', got None")
            e_max = _as_scalar(e_max, "e_max")
            if e_max <= e_start - 1:
                raise ValueError(f"e_max must be > e_start - 1 = {e_start - 1}, got {e_max}")
        elif e_max is not None:
            e_max = _as_scalar(e_max, "e_max")
        self.params_ = params
        self.expert_transform = expert_transform
        self.e_start = e_start
        self.e_max = e_max
        self.objective_: float | None = None
        self.n_iter_: int | None = None

    # ------------------------------------------------------------------------------------ evaluation
    def _params(self) -> JointLawParams:
        if self.params_ is None:
            raise ValueError("JointMoEScalingLaw is not fitted: call fit(...) first")
        return self.params_

    def transform(self, experts: Any) -> np.ndarray:
        """``Ê`` for broadcastable expert counts ``experts`` (floats ``>= 1`` allowed); same shape."""
        e = _as_positive(experts, "experts")
        if (e < 1).any():
            raise ValueError(f"experts must be >= 1, got min {e.min()}")
        return self._transform(e)

    def _transform(self, e: np.ndarray) -> np.ndarray:
        if self.expert_transform == "identity":
            return e
        inv = 1.0 / (e - 1.0 + 1.0 / (1.0 / (self.e_start - 1.0) - 1.0 / self.e_max)) + 1.0 / self.e_max
        return 1.0 / inv

    def _coeffs(self, e_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(A, α_E, B, β_E)`` at ``Ê``: the law is ``A·N^α_E + B·D^β_E + c``."""
        p = self._params()
        u = np.log(e_hat)
        return p.a * e_hat**p.delta, p.alpha + p.gamma * u, p.b * e_hat**p.omega, p.beta + p.zeta * u

    def loss(self, n_act: Any, tokens: Any, experts: Any) -> np.ndarray:
        """Predicted loss for broadcastable ``n_act``, ``tokens`` and ``experts`` (floats ``>= 1``).

        Returns a float64 array of the broadcast shape (0-d for scalar inputs).
        """
        n = _as_positive(n_act, "n_act")
        d = _as_positive(tokens, "tokens")
        e = _as_positive(experts, "experts")
        if (e < 1).any():
            raise ValueError(f"experts must be >= 1, got min {e.min()}")
        try:
            n, d, e = np.broadcast_arrays(n, d, e)
        except ValueError:
            raise ValueError(
                f"n_act, tokens and experts must broadcast, got shapes {n.shape}, {d.shape}, {e.shape}"
            ) from None
        A, aE, B, bE = self._coeffs(self._transform(e))
        with np.errstate(over="ignore", under="ignore"):
            out = A * n**aE + B * d**bE + self._params().c
        return np.asarray(out, dtype=np.float64)

    # ------------------------------------------------------------------------------------------- fit
    def objective(
        self, n_act: Any, tokens: Any, experts: Any, losses: Any, huber_delta: float = 1e-3
    ) -> float:
        """The fit's objective at the current constants: ``Σ Huber_δ(ln L_pred − ln L_obs)``."""
        n, d, e, y = self._check_data(n_act, tokens, experts, losses, min_points=1)
        delta = _as_scalar(huber_delta, "huber_delta")
        r = torch.from_numpy(np.log(self.loss(n, d, e)) - np.log(y))
        return float(_huber(r, delta).sum())

    @staticmethod
    def _check_data(
        n_act: Any, tokens: Any, experts: Any, losses: Any, min_points: int
    ) -> tuple[np.ndarray, ...]:
        arrs = []
        for name, x in (("n_act", n_act), ("tokens", tokens), ("experts", experts), ("losses", losses)):
            a = _as_positive(x, name)
            if a.ndim != 1:
                raise ValueError(f"{name} must be a 1-D array of runs, got shape {a.shape}")
            arrs.append(a)
        lens = {a.shape[0] for a in arrs}
        if len(lens) != 1:
            raise ValueError(
                "n_act, tokens, experts and losses must have the same length, got "
                f"{[a.shape[0] for a in arrs]}"
            )
        if arrs[0].shape[0] < min_points:
            raise ValueError(
                f"fit needs at least {min_points} runs (one per free constant), got {arrs[0].shape[0]}"
            )
        if (arrs[2] < 1).any():
            raise ValueError(f"experts must be >= 1, got min {arrs[2].min()}")
        if min_points > 1:
            for name, a in zip(("n_act", "tokens", "experts", "losses"), arrs):
                if np.ptp(a) == 0:
                    raise ValueError(
                        f"{name} must take at least 2 distinct values to identify the law's constants, got "
                        f"the constant {a[0]:.6g} for all {a.shape[0]} runs"
                    )
        return tuple(arrs)

    def fit(
        self,
        n_act: Any,
        tokens: Any,
        experts: Any,
        losses: Any,
        huber_delta: float = 1e-3,
        n_inits: int = 64,
        seed: int = 0,
        fit_interactions: bool = True,
        max_iter: int = 400,
    ) -> JointMoEScalingLaw:
        """Fit the constants to observed final losses of ``n`` runs (Hoffmann et al. 2022's protocol).

        Minimises ``Σ Huber_δ(ln L_pred − ln L_obs)`` with L-BFGS (float64, autograd gradients, a
        backtracking Armijo line search; all starts optimised at once, each with its own history and
        steps) from ``n_inits`` random starts drawn with ``seed`` and keeps the best. The
        law is fitted in log space, ``ln L = LSE(ln a + δ·u + α_E·ln N, ln b + ω·u + β_E·ln D, ln c)``
        with ``u = ln Ê`` and ``ln N``, ``ln D`` centred on the data (then mapped back), which keeps the
        problem well-conditioned. ``fit_interactions=False`` fixes ``γ = ζ = 0`` (an ablation).

        Args:
            n_act, tokens, experts, losses: ``(n,)`` arrays of the runs (all finite and > 0, ``E >= 1``).
            huber_delta: the Huber threshold on log-loss residuals (paper's protocol: 1e-3).
            n_inits: random starts (``>= 1``; 64 or more recommended).
            seed: seed of the starts (a local generator; global RNG untouched).
            fit_interactions: fit ``γ`` and ``ζ`` (default) or fix them at 0.
            max_iter: L-BFGS iterations per start.

        Returns ``self`` with ``params_``, ``objective_`` (best objective) and ``n_iter_`` set; a
        rejected call leaves them unchanged.
        """
        n_free = _N_PARAMS if fit_interactions else _N_PARAMS - 2
        n, d, e, y = self._check_data(n_act, tokens, experts, losses, min_points=n_free)
        delta = _as_scalar(huber_delta, "huber_delta")
        for name, v in (("n_inits", n_inits), ("max_iter", max_iter)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if not isinstance(fit_interactions, bool):
            raise TypeError(f"fit_interactions must be a bool, got {type(fit_interactions).__name__}")

        ln_n, ln_d = np.log(n), np.log(d)
        mu_n, mu_d = float(ln_n.mean()), float(ln_d.mean())
        x = torch.from_numpy(ln_n - mu_n)
        z = torch.from_numpy(ln_d - mu_d)
        u = torch.from_numpy(np.log(self._transform(e)))
        ly = torch.from_numpy(np.log(y))
        scale = 1.0 / (delta * len(y))  # a well-scaled objective (~ mean |r| / δ) for L-BFGS' tolerances

        rng = np.random.default_rng(int(seed))
        ly_min = float(np.log(y.min()))
        lows = np.array([-3.0, -0.6, -0.05, -0.5, -3.0, -0.6, -0.05, -0.5, min(-1.0, ly_min - 1.0)])
        highs = np.array([1.0, -0.05, 0.05, 0.5, 1.0, -0.05, 0.05, 0.5, ly_min])
        # Starts: ln of the N and D terms at the data's centre, alpha, gamma, delta/omega (centred), ln c.
        inits = rng.uniform(lows, highs, size=(int(n_inits), _N_PARAMS))
        mask = torch.ones(_N_PARAMS, dtype=torch.float64)
        if not fit_interactions:
            mask[[2, 6]] = 0.0

        def objective(t: torch.Tensor) -> torch.Tensor:
            """``(K,)`` objectives of ``K`` parameter vectors ``t`` ``(K, 9)``."""
            t = t * mask
            la, al, ga, de, lb, be, ze, om, lc = (t[:, i : i + 1] for i in range(_N_PARAMS))
            t1 = la + de * u + (al + ga * u) * x
            t2 = lb + om * u + (be + ze * u) * z
            pred = torch.logsumexp(torch.stack([t1, t2, lc.expand_as(t1)]), dim=0)
            return _huber(pred - ly, delta).sum(dim=1) * scale

        with torch_threads(1):  # tiny tensors: one thread is fastest and bit-identical across machines
            t, vals, iters = _batched_lbfgs(objective, torch.from_numpy(inits), max_iter=int(max_iter))
        vals = torch.where(torch.isfinite(t).all(dim=1), vals, torch.full_like(vals, math.inf))
        k_best = int(torch.argmin(vals))
        best_val = float(vals[k_best])
        if not math.isfinite(best_val):
            raise RuntimeError("every L-BFGS start diverged; the data may not follow the law's form")
        best_t = (t[k_best] * mask).numpy()
        la, al, ga, de, lb, be, ze, om, lc = best_t
        if not fit_interactions:
            ga = ze = 0.0
        # Undo the centring: (α + γu)(ln N − μ) = (α + γu) ln N − αμ − γμ u.
        params = JointLawParams(
            a=math.exp(la - al * mu_n), alpha=al, gamma=ga, delta=de - ga * mu_n,
            b=math.exp(lb - be * mu_d), beta=be, zeta=ze, omega=om - ze * mu_d, c=math.exp(lc),
        )  # fmt: skip
        self.params_ = params
        self.objective_ = best_val / scale
        self.n_iter_ = iters
        return self

    # -------------------------------------------------------------------------------- optimisation
    def _fixed_e(self, experts: Any) -> tuple[float, float, float, float, float]:
        e = _as_scalar(experts, "experts")
        if e < 1:
            raise ValueError(f"experts must be >= 1, got {e}")
        A, aE, B, bE = (float(v) for v in self._coeffs(self._transform(np.asarray(e))))
        if aE >= 0 or bE >= 0:
            raise ValueError(
                f"the law has non-negative exponents at experts={e} (alpha_E={aE:.4g}, beta_E={bE:.4g}): "
                "loss does not fall with N and D there, so no compute-optimal allocation exists"
            )
        return e, A, aE, B, bE

    def _allocation(
        self, e: float, n: float, f: float, k_f: float, ffn_fraction: float, top_k: int
    ) -> Allocation:
        d = f / (k_f * n)
        is_int = float(e).is_integer() and e >= top_k
        mem = n * (1.0 + (e - top_k) * ffn_fraction / top_k) if is_int else float("nan")
        return Allocation(float(e), n, d, mem, f, float(self.loss(n, d, e)))

    def _optimal_n(self, f: float, A: float, aE: float, B: float, bE: float, k_f: float) -> float:
        # L(N) = A N^aE + B (F/(k N))^bE: dL/dN = 0 at N^(aE+bE) = (bE B)/(aE A) (F/k)^bE.
        log_n = (math.log(bE * B / (aE * A)) + bE * math.log(f / k_f)) / (aE + bE)
        return math.exp(log_n)

    def compute_optimal(
        self,
        flops: float,
        experts: float = 1,
        method: str = "closed_form",
        flops_per_param_token: float = 6.0,
        ffn_fraction: float = 2 / 3,
        top_k: int = 1,
        unique_tokens: float | None = None,
    ) -> Allocation:
        """The loss-optimal ``(N, D)`` for ``E = experts`` under ``flops_per_param_token · N · D = flops``.

        ``method="closed_form"``: Chinchilla's stationary point of ``A·N^α_E + B·(F/(k_F N))^β_E``,
        ``N* = ((β_E B)/(α_E A))^(1/(α_E+β_E)) · (F/k_F)^(β_E/(α_E+β_E))``; ``"search"``: a golden-section
        search over ``ln N`` (the loss is convex in ``ln N`` along the constraint), a cross-check.
        ``ffn_fraction``/``top_k`` only enter the reported ``total_params``. ``unique_tokens`` warns when
        ``D*`` exceeds it (the law assumes unlimited unique data).
        """
        f = _as_scalar(flops, "flops")
        k_f = _as_scalar(flops_per_param_token, "flops_per_param_token")
        ffn = _as_fraction(ffn_fraction, "ffn_fraction")
        k = _as_top_k(top_k)
        if method not in ("closed_form", "search"):
            raise ValueError(f"method must be 'closed_form' or 'search', got {method!r}")
        e, A, aE, B, bE = self._fixed_e(experts)
        if method == "closed_form":
            n = self._optimal_n(f, A, aE, B, bE, k_f)
        else:
            n = self._search_n(f, e, k_f, 0.0, math.log(f / k_f))
        alloc = self._allocation(e, n, f, k_f, ffn, k)
        _warn_data(alloc, unique_tokens)
        return alloc

    def _search_n(self, f: float, e: float, k_f: float, lo: float, hi: float, iters: int = 200) -> float:
        """Golden-section search of ``ln N`` in ``[lo, hi]`` for the loss along ``k_F N D = F``."""
        lo, hi = min(lo, hi), max(lo, hi)

        def g(t: float) -> float:
            n = math.exp(t)
            return float(self.loss(n, f / (k_f * n), e))

        r = (math.sqrt(5.0) - 1.0) / 2.0
        x1, x2 = hi - r * (hi - lo), lo + r * (hi - lo)
        g1, g2 = g(x1), g(x2)
        for _ in range(iters):
            if hi - lo < 1e-13:
                break
            if g1 <= g2:
                hi, x2, g2 = x2, x1, g1
                x1 = hi - r * (hi - lo)
                g1 = g(x1)
            else:
                lo, x1, g1 = x1, x2, g2
                x2 = lo + r * (hi - lo)
                g2 = g(x2)
        return math.exp((lo + hi) / 2.0)

    def memory_constrained_optimal(
        self,
        flops: float,
        max_total_params: float,
        expert_choices: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
        ffn_fraction: float = 2 / 3,
        top_k: int = 1,
        flops_per_param_token: float = 6.0,
        max_active_params: float | None = None,
        min_active_params: float = 1e6,
        unique_tokens: float | None = None,
        return_all: bool = False,
    ) -> Allocation | list[Allocation]:
        """The loss-optimal ``(E, N, D)`` under compute ``flops`` and memory ``max_total_params``.

        For each ``E`` in ``expert_choices`` the memory bound caps ``N ≤ M / (1 + (E − k)·f/k)`` (and
        ``max_active_params``, an inference-cost cap, when given); since the loss along the compute
        constraint is convex in ``ln N``, the optimum is the compute-optimal ``N*`` clipped to
        ``[min_active_params, cap]``. Expert counts whose cap is below ``min_active_params`` are
        infeasible; if all are, a ``ValueError`` says so. Returns the best :class:`Allocation` (ties go
        to the smaller ``E``), or with ``return_all=True`` the feasible per-``E`` optima in the order of
        ``expert_choices``.
        """
        f = _as_scalar(flops, "flops")
        m = _as_scalar(max_total_params, "max_total_params")
        k_f = _as_scalar(flops_per_param_token, "flops_per_param_token")
        ffn = _as_fraction(ffn_fraction, "ffn_fraction")
        k = _as_top_k(top_k)
        n_min = _as_scalar(min_active_params, "min_active_params")
        n_cap_inf = (
            math.inf if max_active_params is None else _as_scalar(max_active_params, "max_active_params")
        )
        if (
            isinstance(expert_choices, (str, bytes))
            or not isinstance(expert_choices, Sequence)
            or not expert_choices
        ):
            raise ValueError(f"expert_choices must be a non-empty sequence of ints, got {expert_choices!r}")
        choices = [_as_expert_count(e, "expert_choices entry", top_k=k) for e in expert_choices]
        if len(set(choices)) != len(choices):
            raise ValueError(f"expert_choices must not repeat a value, got {list(expert_choices)}")
        out = []
        for e in choices:
            cap = min(m / (1.0 + (e - k) * ffn / k), n_cap_inf)
            if cap < n_min:
                continue
            _, A, aE, B, bE = self._fixed_e(e)
            n = min(max(self._optimal_n(f, A, aE, B, bE, k_f), n_min), cap)
            out.append(self._allocation(e, n, f, k_f, ffn, k))
        if not out:
            raise ValueError(
                f"infeasible: max_total_params={m:.4g} (max_active_params={max_active_params}) is below the "
                f"smallest model (min_active_params={n_min:.4g}) for every expert count in {choices}"
            )
        if return_all:
            return out
        best = min(out, key=lambda a: (a.loss, a.experts))
        _warn_data(best, unique_tokens)
        return best

    def compare_dense_vs_moe(
        self,
        flops: float,
        max_total_params: float,
        expert_choices: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
        ffn_fraction: float = 2 / 3,
        top_k: int = 1,
        flops_per_param_token: float = 6.0,
        min_active_params: float = 1e6,
    ) -> dict[str, Any]:
        """The best MoE and the best dense model at the same compute and memory budgets.

        Returns ``{"best": Allocation, "dense": Allocation, "per_expert": list[Allocation],
        "loss_gain": dense.loss − best.loss}`` (``loss_gain >= 0``: the best over a set that contains
        ``E = 1``; 1 is added to ``expert_choices`` if missing).
        """
        choices = list(expert_choices) if isinstance(expert_choices, Sequence) else expert_choices
        if isinstance(choices, list) and 1 not in choices:
            choices = [1, *choices]
        per = self.memory_constrained_optimal(
            flops, max_total_params, choices, ffn_fraction, top_k, flops_per_param_token,
            min_active_params=min_active_params, return_all=True,
        )  # fmt: skip
        dense = [a for a in per if a.experts == 1]
        if not dense:
            raise ValueError(
                f"infeasible: no dense model fits max_total_params={max_total_params:.4g} with "
                f"min_active_params={min_active_params:.4g}"
            )
        best = min(per, key=lambda a: (a.loss, a.experts))
        return {"best": best, "dense": dense[0], "per_expert": per, "loss_gain": dense[0].loss - best.loss}


def _warn_data(alloc: Allocation, unique_tokens: float | None) -> None:
    if unique_tokens is None:
        return
    u = _as_scalar(unique_tokens, "unique_tokens")
    if alloc.tokens > u:
        warnings.warn(
            f"the allocation trains on {alloc.tokens:.3g} tokens, {alloc.tokens / u:.2f} epochs of the "
            f"{u:.3g} unique tokens available; the law assumes unlimited unique data, so the predicted loss "
            "is optimistic",
            UserWarning,
            stacklevel=3,
        )
