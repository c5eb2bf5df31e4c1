"""Compelling ReLU Networks to Exhibit Exponentially Many Linear Regions — ICML 2025, P23: the triangle-wave
reparameterisation of a width-4 ReLU network (the method; the region counter and the training recipe are
re-exported from their own modules).

Milkert, Hyde, Laine, "Compelling ReLU Networks to Exhibit Exponentially Many Linear Regions at
Initialization and During Training", ICML 2025 (arXiv 2311.18022; no official code was published).

A depth-``d`` :class:`TriangleNet` is a genuine width-4 ``Linear``/``ReLU`` stack whose weights are generated
from ``d`` *peak* parameters ``a_i = sigmoid(u_i)`` in ``(0, 1)`` and a few output coefficients. Each hidden
layer applies the asymmetric triangle map ``T_a(v) = v/a`` on ``[0, a]``, ``(1 - v)/(1 - a)`` on ``[a, 1]``
(two ReLUs: ``relu(v)/a - relu(v - a)/(a(1 - a))``) to the previous layer's wave, so ``W_i = T_{a_i} o ... o
T_{a_1}`` has ``2^i`` monotone pieces, and the network computes ``F(x) = c0 + c1 u + sum_i s_i W_i(u)`` with
``u`` the input rescaled from ``domain`` to ``[0, 1]``. With the paper's differentiability rule (Thm 3.1)
``s_{i+1} = s_i (1 - a_{i+1}) a_{i+2}`` every slope change of ``F`` has the sign of ``-s_1``: ``F`` is convex
(or concave) with exactly ``2^d`` linear pieces for *any* parameter values. Training
(:func:`~icml25.interpretability.relu_regions_training.fit_1d`) first moves the reparameterised parameters
("pretraining", the count cannot collapse), then converts to a plain MLP (:meth:`TriangleNet.to_mlp`) and fine-tunes the raw weights.

Our realisation (the paper's exact 4x4 layout is not given in a reproducible form): the four neurons of
hidden layer ``i`` are ``t1 = relu(W_{i-1})``, ``t2 = relu(W_{i-1} - a_i)``, a running-sum neuron
``relu(c1 u + sum_{j<i} s_j W_j + K)`` and a constant bias neuron (1), which supplies every shift so the
hidden ``Linear`` biases stay zero. The offset ``K = |c1| + sum_{j<d} |s_j|`` keeps the sum neuron's
pre-activation non-negative on the domain (a single ReLU would otherwise clip a partial sum that dips below
zero) and is subtracted again at the output through the bias neuron.

:class:`TriangleActivation` is the multidimensional extension: one learnable triangle-wave function per
feature (block-diagonal width-4 blocks, used like a KAN activation).

This module holds the method (the wave, the network, the baseline's initialisation, the extension). The
exact region counter, :func:`~icml25.interpretability.relu_regions_count.count_linear_regions_1d`, lives in
:mod:`icml25.interpretability.relu_regions_count` and the training recipe,
:func:`~icml25.interpretability.relu_regions_training.fit_1d`, in
:mod:`icml25.interpretability.relu_regions_training`; both are re-exported here (lazily: those modules
import this one).
"""

from __future__ import annotations

import importlib
import math
import numbers
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng

if TYPE_CHECKING:
    from icml25.interpretability.relu_regions_count import RegionCount, count_linear_regions_1d
    from icml25.interpretability.relu_regions_training import FitResult, fit_1d

__all__ = [
    "FitResult",
    "RegionCount",
    "TriangleActivation",
    "TriangleNet",
    "count_linear_regions_1d",
    "fit_1d",
    "kaiming_mlp",
    "triangle_wave",
]

MAX_ABS = 1e100
"""Largest |x| and |y| that :func:`~icml25.interpretability.relu_regions_training.fit_1d` accepts (squared
errors of larger values overflow float64)."""
PEAK_CLAMP = 1e-3
"""Peaks are clamped to ``[PEAK_CLAMP, 1 - PEAK_CLAMP]``: the coefficients ``1/(a(1 - a))`` stay bounded."""


# ------------------------------------------------------------------------------------------ validation
def _check_domain(domain: Any, name: str = "domain") -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in domain)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair of floats (lo, hi), got {domain!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
        raise ValueError(f"{name} must be finite with lo < hi, got ({lo}, {hi})")
    return lo, hi


def _check_peaks(peaks: Any, depth: int, name: str) -> torch.Tensor:
    """``peaks`` as a float64 ``(depth,)`` tensor of values strictly inside (0, 1)."""
    if isinstance(peaks, numbers.Real) and not isinstance(peaks, bool):
        t = torch.full((depth,), float(peaks), dtype=torch.float64)
    elif isinstance(peaks, (torch.Tensor, np.ndarray, Sequence)) and not isinstance(peaks, str):
        try:
            t = torch.as_tensor(np.asarray(peaks, dtype=np.float64) if not isinstance(peaks, torch.Tensor)
                                else peaks.detach().to(torch.float64))  # fmt: skip
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be a float or {depth} floats in (0, 1), got {peaks!r}") from None
        if t.shape != (depth,):
            raise ValueError(f"{name} must hold depth={depth} peaks, got shape {tuple(t.shape)}")
    else:
        raise TypeError(f"{name} must be a float or a sequence of {depth} floats in (0, 1), got {peaks!r}")
    if not bool(torch.isfinite(t).all()) or bool(((t <= 0) | (t >= 1)).any()):
        raise ValueError(f"{name} must lie strictly inside (0, 1), got {t.tolist()}")
    return t


# ------------------------------------------------------------------------------------------ the wave
def triangle_wave(u: torch.Tensor, peaks: torch.Tensor) -> torch.Tensor:
    """The composed triangle waves ``W_1..W_d`` at ``u`` (closed form, not the ReLU stack).

    Args:
        u: points in ``[0, 1]``, shape ``(...)``; broadcast against ``peaks[..., i]``.
        peaks: ``(..., d)`` peaks ``a_i`` in (0, 1) (a leading feature axis broadcasts against ``u``'s last).

    Returns:
        ``(d, ...)``: ``W_i(u) = T_{a_i}(W_{i-1}(u))`` with ``W_0 = u`` and ``T_a(v) = min(v/a, (1-v)/(1-a))``.
    """
    for name, t in (("u", u), ("peaks", peaks)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(
                f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}"
            )
    if peaks.ndim < 1 or peaks.shape[-1] < 1:
        raise ValueError(f"peaks must have shape (..., d) with d >= 1, got {tuple(peaks.shape)}")
    if not bool(((peaks > 0) & (peaks < 1)).all()):
        raise ValueError(
            f"peaks must lie strictly inside (0, 1), got {peaks.detach().flatten()[:8].tolist()}"
        )
    check_tensor(u, "u")
    try:
        torch.broadcast_shapes(u.shape, peaks.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"peaks' leading shape {tuple(peaks.shape[:-1])} must broadcast against u's {tuple(u.shape)}"
        ) from None
    waves, v = [], u
    for i in range(peaks.shape[-1]):
        a = peaks[..., i]
        v = torch.minimum(v / a, (1 - v) / (1 - a))
        waves.append(v)
    return torch.stack(waves)


def _scale_law(s1: torch.Tensor, ext: torch.Tensor) -> torch.Tensor:
    """Thm 3.1 scales ``s_1..s_d`` from ``s_1 (...)`` and the peaks ``a_1..a_{d+1}`` ``(..., d+1)``:
    ``s_{i+1} = s_i (1 - a_{i+1}) a_{i+2}``."""
    d = ext.shape[-1] - 1
    factors = (1 - ext[..., 1:d]) * ext[..., 2 : d + 1]
    ones = torch.ones_like(ext[..., :1])
    return s1[..., None] * torch.cumprod(torch.cat([ones, factors], dim=-1), dim=-1)


def _closed_form_u(u: torch.Tensor, a: torch.Tensor, s: torch.Tensor, c0: torch.Tensor,
                   c1: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``c0 + c1 u + sum_i s_i W_i(u)``; ``u (...)`` broadcasts against the params' leading shape."""
    waves = triangle_wave(u, a)  # (d, ...)
    s_t = s.movedim(-1, 0)  # (d, *lead): align the leading parameter axes with u's trailing ones
    s_t = s_t.reshape(s_t.shape[:1] + (1,) * (waves.ndim - s_t.ndim) + s_t.shape[1:])
    return c0 + c1 * u + (s_t * waves).sum(0)


def _end_slopes(a: torch.Tensor, s: torch.Tensor, c1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``dF/du`` on the first and on the last piece of ``[0, 1]`` (for the linear continuation)."""
    left = torch.cumprod(1 / a, dim=-1)  # W_i'(0+) = prod_{j<=i} 1/a_j
    right = -torch.cumprod(torch.cat([1 / (1 - a[..., :1]), 1 / a[..., 1:]], dim=-1), dim=-1)
    return c1 + (s * left).sum(-1), c1 + (s * right).sum(-1)


# ------------------------------------------------------------------------------------------ TriangleNet
class TriangleNet(nn.Module):
    """A width-4, depth-``depth`` ReLU network with exactly ``2^depth`` linear regions on ``domain``.

    Parameters (the "pretraining" space): ``peak_logits (d,)`` (``a = clamp(sigmoid(.), 1e-3, 1 - 1e-3)``),
    ``scale`` (``s_1``; with ``enforce_smoothness=False`` instead ``scales (d,)``, all free), ``offset``
    (``c0``), ``slope`` (``c1``), and with ``tail_peak=None`` a learnable ``tail_logit`` (``a_{d+1}``).
    The input affine map ``domain -> [0, 1]`` is fixed (the guarantee lives on ``domain``).

    Args:
        depth: number of hidden ReLU layers ``d >= 1``.
        domain: ``(lo, hi)``, the interval the guarantee covers.
        enforce_smoothness: tie the scales by the paper's Thm 3.1 (``s_{i+1} = s_i (1 - a_{i+1}) a_{i+2}``);
            then every kink has the sign of ``-s_1`` and the fit is convex (``s_1 < 0``) or concave.
        init_peaks: a float or ``depth`` floats strictly inside (0, 1).
        init_scale, init_offset, init_slope: initial ``s_1``, ``c0``, ``c1``. The defaults with peaks 1/2
            are Yarotsky's construction: the piecewise-linear interpolant of ``u^2`` on the ``2^d`` grid.
        tail_peak: the ``a_{d+1}`` of the last scale (a float in (0, 1)) or ``None`` (learnable).
        dtype: parameter dtype (float64 default: the fine structure of deep waves is ~4^-d).

    ``forward(x)`` runs the realised ``Linear``/``ReLU`` stack on ``x (..., 1)`` and returns ``(..., 1)``.
    """

    def __init__(
        self,
        depth: int,
        domain: tuple[float, float] = (0.0, 1.0),
        enforce_smoothness: bool = True,
        init_peaks: float | Sequence[float] | torch.Tensor = 0.5,
        *,
        init_scale: float = -0.25,
        init_offset: float = 0.0,
        init_slope: float = 1.0,
        tail_peak: float | None = 0.5,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        d = check_int(depth, "depth", low=1)
        lo, hi = _check_domain(domain)
        if not isinstance(enforce_smoothness, bool):
            raise TypeError(f"enforce_smoothness must be a bool, got {type(enforce_smoothness).__name__}")
        peaks = _check_peaks(init_peaks, d, "init_peaks")
        scale = check_float(init_scale, "init_scale")
        offset = check_float(init_offset, "init_offset")
        slope = check_float(init_slope, "init_slope")
        if tail_peak is not None:
            tail_peak = float(_check_peaks(check_float(tail_peak, "tail_peak"), 1, "tail_peak")[0])
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.depth, self.domain, self.enforce_smoothness = d, (lo, hi), enforce_smoothness
        self.tail_peak = tail_peak
        clamp = peaks.clamp(PEAK_CLAMP, 1 - PEAK_CLAMP)
        self.peak_logits = nn.Parameter(torch.logit(clamp).to(dtype))
        self.tail_logit = (
            nn.Parameter(torch.zeros((), dtype=dtype)) if tail_peak is None else None
        )  # sigmoid(0) = 1/2
        s1 = torch.tensor(scale, dtype=torch.float64)
        if enforce_smoothness:
            self.scale = nn.Parameter(s1.to(dtype))
        else:  # free scales, started where the scale law would put them
            tail = torch.tensor([0.5 if tail_peak is None else tail_peak], dtype=torch.float64)
            self.scales_free = nn.Parameter(_scale_law(s1, torch.cat([clamp, tail])).to(dtype))
        self.offset = nn.Parameter(torch.tensor(offset, dtype=dtype))
        self.slope = nn.Parameter(torch.tensor(slope, dtype=dtype))
        self._warned = False

    # ---------------------------------------------------------------- parameters in the paper's terms
    def peaks(self) -> torch.Tensor:
        """The peaks ``a_1..a_d``, shape ``(d,)``, in ``[1e-3, 1 - 1e-3]``."""
        return torch.sigmoid(self.peak_logits).clamp(PEAK_CLAMP, 1 - PEAK_CLAMP)

    def _tail(self, a: torch.Tensor) -> torch.Tensor:
        """``a_{d+1}``, shape ``(..., 1)`` like ``a[..., :1]``."""
        if self.tail_logit is None:
            return torch.full_like(a[..., :1], self.tail_peak)
        return torch.sigmoid(self.tail_logit).clamp(PEAK_CLAMP, 1 - PEAK_CLAMP)[..., None]

    def scales(self) -> torch.Tensor:
        """The output scales ``s_1..s_d``, shape ``(d,)`` (Thm 3.1's law, or the free ones)."""
        if not self.enforce_smoothness:
            return self.scales_free
        a = self.peaks()
        return _scale_law(self.scale, torch.cat([a, self._tail(a)], dim=-1))

    def _u(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi = self.domain
        return (x - lo) / (hi - lo)

    def _check_input(self, x: Any) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a tensor of shape (..., 1), got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor of shape (..., 1), got dtype {x.dtype}")
        if x.ndim < 1 or x.shape[-1] != 1:
            raise ValueError(f"x must have shape (..., 1) (one input feature), got {tuple(x.shape)}")
        check_tensor(x, "x", max_abs=MAX_ABS)
        lo, hi = self.domain
        if x.numel() and not self._warned and bool(((x < lo) | (x > hi)).any()):
            self._warned = True
            warnings.warn(
                f"TriangleNet: inputs outside domain ({lo:g}, {hi:g}) (min {float(x.min()):g}, max "
                f"{float(x.max()):g}); the 2^depth guarantee and closed_form hold on the domain only",
                stacklevel=3,
            )
        return x.to(self.peak_logits.dtype)

    # ---------------------------------------------------------------- the realised ReLU stack
    def _triangle_coefficients(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(alpha, beta)`` with ``T_a(v) = alpha relu(v) + beta relu(v - a)`` on [0, 1]."""
        return 1 / a, -1 / (a * (1 - a))

    def layer_weights(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The generated ``(weight, bias)`` of every ``Linear`` (``(4, 1)``, ``(4, 4)`` x (d-1), ``(1, 4)``),
        differentiable in the reparameterised parameters. Neurons: ``[t1, t2, sum, bias]``.

        Parameters with a leading batch shape (several nets stacked, as
        :func:`~icml25.interpretability.relu_regions_training.fit_1d` does) give weights
        ``(..., out, in)`` and biases ``(..., out)``."""
        a, s = self.peaks(), self.scales()
        c0, c1 = self.offset, self.slope
        lo, hi = self.domain
        width = hi - lo
        # Offset of the sum neuron: |partial sums| <= |c1| + sum_{j<d} |s_j| on [0, 1] since 0 <= W_j <= 1.
        K = (c1.abs() + s[..., :-1].abs().sum(-1)).detach()
        zero, one = torch.zeros_like(c0), torch.ones_like(c0)
        alpha, beta = self._triangle_coefficients(a)

        def row(*entries: torch.Tensor) -> torch.Tensor:
            return torch.stack(entries, dim=-1)

        w1 = row(one, one, c1, zero)[..., None] / width
        b1 = row(-lo / width * one, -lo / width - a[..., 0], -c1 * lo / width + K, one)
        layers = [(w1, b1)]
        if self.depth > 1:  # all hidden 4x4 layers at once: (..., d-1, 4, 4)
            al, be, si, nxt = alpha[..., :-1], beta[..., :-1], s[..., :-1], a[..., 1:]
            z, o = torch.zeros_like(al), torch.ones_like(al)
            hidden = torch.stack(
                [row(al, be, z, z), row(al, be, z, -nxt), row(si * al, si * be, o, z), row(z, z, z, o)],
                dim=-2,
            )
            zeros4 = torch.zeros_like(b1)
            layers += [(hidden[..., i, :, :], zeros4) for i in range(self.depth - 1)]
        w_out = row(s[..., -1] * alpha[..., -1], s[..., -1] * beta[..., -1], one, c0 - K)[..., None, :]
        layers.append((w_out, torch.zeros_like(c0)[..., None]))
        return layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The realised width-4 ReLU stack at ``x (..., 1)``; returns ``(..., 1)``."""
        x = self._check_input(x)
        if x.ndim == 1:  # one point, as nn.Linear takes it
            return self(x[None])[0]
        layers = self.layer_weights()
        acts: list[float | None] = [0.0] * (len(layers) - 1) + [None]
        return apply_stack(layers, acts, x)

    def closed_form(self, x: torch.Tensor) -> torch.Tensor:
        """``c0 + c1 u + sum_i s_i W_i(u)`` evaluated directly at ``x (..., 1)``; returns ``(..., 1)``."""
        x = self._check_input(x)
        return _closed_form_u(self._u(x), self.peaks(), self.scales(), self.offset, self.slope)

    def to_mlp(self) -> nn.Sequential:
        """The same function as a plain ``Sequential`` of ``Linear``/``ReLU`` (detached copies of the
        generated weights), for ordinary raw-weight fine-tuning."""
        layers = self.layer_weights()
        mods: list[nn.Module] = []
        for k, (w, b) in enumerate(layers):
            lin = nn.Linear(w.shape[1], w.shape[0], dtype=w.dtype, device="meta").to_empty(device=w.device)
            with torch.no_grad():
                lin.weight.copy_(w)
                lin.bias.copy_(b)
            mods.append(lin)
            if k < len(layers) - 1:
                mods.append(nn.ReLU())
        return nn.Sequential(*mods)

    @torch.no_grad()
    def breakpoints(self) -> torch.Tensor:
        """The analytic breakpoints of ``W_d`` in input coordinates, sorted, shape ``(2^d - 1,)``.

        Recursively the preimages: those of ``W_{i-1}`` plus, on each monotone piece, the point where
        ``W_{i-1} = a_i``. These are the kinks of ``F`` (every one is a kink under the scale law)."""
        a = self.peaks().to(torch.float64)
        pts = torch.tensor([0.0, 1.0], dtype=torch.float64)
        vals = torch.tensor([0.0, 1.0], dtype=torch.float64)
        for i in range(self.depth):
            new = pts[:-1] + (a[i] - vals[:-1]) / (vals[1:] - vals[:-1]) * (pts[1:] - pts[:-1])
            pts = torch.stack([pts[:-1], new], dim=1).reshape(-1)
            pts = torch.cat([pts, torch.ones(1, dtype=torch.float64)])
            vals = torch.zeros_like(pts)
            vals[1::2] = 1.0
        lo, hi = self.domain
        return lo + (hi - lo) * pts[1:-1]

    def extra_repr(self) -> str:
        return (
            f"depth={self.depth}, domain={self.domain}, enforce_smoothness={self.enforce_smoothness}, "
            f"tail_peak={self.tail_peak}"
        )


def apply_stack(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]], acts: Sequence[float | None], h: torch.Tensor
) -> torch.Tensor:
    """``Linear`` layers ``(W (..., out, in), b (..., out))``, each followed by a (leaky) ReLU of that
    negative slope (``None``: none), applied to ``h (..., n, in)``; leading batch axes broadcast."""
    for (w, b), neg in zip(layers, acts):
        h = h @ w.mT + b.unsqueeze(-2)
        if neg is not None:
            h = torch.relu(h) if neg == 0.0 else nn.functional.leaky_relu(h, neg)
    return h


# ------------------------------------------------------------------------------------------ baseline
def kaiming_mlp(
    depth: int, width: int = 4, *, seed: int | None = None, dtype: torch.dtype = torch.float64
) -> nn.Sequential:
    """The unconstrained baseline of the same shape: ``1 -> width -> ... -> width -> 1`` with ``depth``
    hidden ReLU layers, He-normal (Kaiming, fan-in) weights and PyTorch's default uniform biases.

    ``seed`` makes the initialisation reproducible without touching the global random state."""
    d = check_int(depth, "depth", low=1)
    width = check_int(width, "width", low=1)
    with isolated_rng(seed):
        mods: list[nn.Module] = []
        fan = 1
        for _ in range(d):
            lin = nn.Linear(fan, int(width), dtype=dtype)
            nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
            mods += [lin, nn.ReLU()]
            fan = int(width)
        mods.append(nn.Linear(fan, 1, dtype=dtype))
    return nn.Sequential(*mods)


# ------------------------------------------------------------------------------------------ extension
class TriangleActivation(nn.Module):
    """A learnable 1-D triangle-wave function per feature (the paper's multidimensional use: width-4
    blocks placed block-diagonally, like a KAN activation), each with exactly ``2^depth`` linear pieces on
    ``domain`` and continued linearly outside it.

    Feature ``k`` computes ``c0_k + c1_k u + sum_i s_{k,i} W_i(u; a_k)`` with ``u = (x - lo)/(hi - lo)``
    and Thm 3.1's scales (``tail_peak`` 1/2). :meth:`block` returns feature ``k`` as a :class:`TriangleNet`.

    Args:
        num_features: features ``F``; ``forward`` maps ``(..., F) -> (..., F)``.
        depth: triangle layers per feature.
        domain: the interval of the guarantee (default (-1, 1)).
        init_peaks, init_scale, init_offset, init_slope: as :class:`TriangleNet` (shared by all features;
            peaks may also be an ``(F, depth)`` tensor).
        dtype: parameter dtype.
    """

    def __init__(
        self,
        num_features: int,
        depth: int = 4,
        domain: tuple[float, float] = (-1.0, 1.0),
        init_peaks: float | torch.Tensor = 0.5,
        *,
        init_scale: float = -0.25,
        init_offset: float = 0.0,
        init_slope: float = 1.0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        check_int(num_features, "num_features", low=1)
        d = check_int(depth, "depth", low=1)
        F = int(num_features)
        lo, hi = _check_domain(domain)
        if isinstance(init_peaks, torch.Tensor) and init_peaks.ndim == 2:
            if init_peaks.shape != (F, d):
                raise ValueError(f"init_peaks must have shape ({F}, {d}), got {tuple(init_peaks.shape)}")
            peaks = torch.stack([_check_peaks(row, d, "init_peaks") for row in init_peaks])
        else:
            peaks = _check_peaks(init_peaks, d, "init_peaks").expand(F, d)
        self.num_features, self.depth, self.domain = F, d, (lo, hi)
        self.peak_logits = nn.Parameter(
            torch.logit(peaks.clamp(PEAK_CLAMP, 1 - PEAK_CLAMP)).to(dtype).clone()
        )
        self.scale = nn.Parameter(torch.full((F,), check_float(init_scale, "init_scale"), dtype=dtype))
        self.offset = nn.Parameter(torch.full((F,), check_float(init_offset, "init_offset"), dtype=dtype))
        self.slope = nn.Parameter(torch.full((F,), check_float(init_slope, "init_slope"), dtype=dtype))

    def peaks(self) -> torch.Tensor:
        """``(F, depth)`` peaks."""
        return torch.sigmoid(self.peak_logits).clamp(PEAK_CLAMP, 1 - PEAK_CLAMP)

    def scales(self) -> torch.Tensor:
        """``(F, depth)`` scales by Thm 3.1 (``a_{d+1} = 1/2``)."""
        a = self.peaks()
        return _scale_law(self.scale, torch.cat([a, torch.full_like(a[:, :1], 0.5)], dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., F) -> (..., F)``: each feature through its own triangle-wave function."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(
                f"x must be a floating-point tensor of shape (..., {self.num_features}), got {x!r}"
            )
        if x.ndim < 1 or x.shape[-1] != self.num_features:
            raise ValueError(f"x must have shape (..., {self.num_features}), got {tuple(x.shape)}")
        check_tensor(x, "x")
        lo, hi = self.domain
        u = (x.to(self.peak_logits.dtype) - lo) / (hi - lo)
        a, s = self.peaks(), self.scales()
        inside = _closed_form_u(u.clamp(0, 1), a, s, self.offset, self.slope)
        left, right = _end_slopes(a, s, self.slope)
        return inside + left * (u.clamp(max=0)) + right * (u - 1).clamp(min=0)

    def block(self, k: int) -> TriangleNet:
        """Feature ``k``'s function as a :class:`TriangleNet` (same values on the domain; ``to_mlp`` gives
        its width-4 ReLU block)."""
        k = check_int(k, "k", low=0, high=self.num_features - 1)
        net = TriangleNet(self.depth, self.domain, True, 0.5, dtype=self.peak_logits.dtype)
        with torch.no_grad():
            net.peak_logits.copy_(self.peak_logits[k])
            net.scale.copy_(self.scale[k])
            net.offset.copy_(self.offset[k])
            net.slope.copy_(self.slope[k])
        return net

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, depth={self.depth}, domain={self.domain}"


# ------------------------------------------------------------------------------------------ re-exports
_MOVED = {
    "RegionCount": "icml25.interpretability.relu_regions_count",
    "count_linear_regions_1d": "icml25.interpretability.relu_regions_count",
    "FitResult": "icml25.interpretability.relu_regions_training",
    "fit_1d": "icml25.interpretability.relu_regions_training",
}


def __getattr__(name: str) -> Any:
    """The counter and the training recipe (PEP 562): imported on first access, since both modules import
    this one (an import at the top would be circular)."""
    if name in _MOVED:
        value = getattr(importlib.import_module(_MOVED[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
