"""Compelling ReLU Networks to Exhibit Exponentially Many Linear Regions — ICML 2025, P23: the triangle-wave
reparameterisation of a width-4 ReLU network, an exact 1-D linear-region counter and the training recipe.

Milkert, Hyde, Laine, "Compelling ReLU Networks to Exhibit Exponentially Many Linear Regions at
Initialization and During Training", ICML 2025 (arXiv 2311.18022; no official code was published).

A depth-``d`` :class:`TriangleNet` is a genuine width-4 ``Linear``/``ReLU`` stack whose weights are generated
from ``d`` *peak* parameters ``a_i = sigmoid(u_i)`` in ``(0, 1)`` and a few output coefficients. Each hidden
layer applies the asymmetric triangle map ``T_a(v) = v/a`` on ``[0, a]``, ``(1 - v)/(1 - a)`` on ``[a, 1]``
(two ReLUs: ``relu(v)/a - relu(v - a)/(a(1 - a))``) to the previous layer's wave, so ``W_i = T_{a_i} o ... o
T_{a_1}`` has ``2^i`` monotone pieces, and the network computes ``F(x) = c0 + c1 u + sum_i s_i W_i(u)`` with
``u`` the input rescaled from ``domain`` to ``[0, 1]``. With the paper's differentiability rule (Thm 3.1)
``s_{i+1} = s_i (1 - a_{i+1}) a_{i+2}`` every slope change of ``F`` has the sign of ``-s_1``: ``F`` is convex
(or concave) with exactly ``2^d`` linear pieces for *any* parameter values. Training (:func:`fit_1d`)
first moves the reparameterised parameters ("pretraining", the count cannot collapse), then converts to a
plain MLP (:meth:`TriangleNet.to_mlp`) and fine-tunes the raw weights.

Our realisation (the paper's exact 4x4 layout is not given in a reproducible form): the four neurons of
hidden layer ``i`` are ``t1 = relu(W_{i-1})``, ``t2 = relu(W_{i-1} - a_i)``, a running-sum neuron
``relu(c1 u + sum_{j<i} s_j W_j + K)`` and a constant bias neuron (1), which supplies every shift so the
hidden ``Linear`` biases stay zero. The offset ``K = |c1| + sum_{j<d} |s_j|`` keeps the sum neuron's
pre-activation non-negative on the domain (a single ReLU would otherwise clip a partial sum that dips below
zero) and is subtracted again at the output through the bias neuron.

:func:`count_linear_regions_1d` counts the activation and linear regions of any 1-input ``Linear``/``ReLU``/
``LeakyReLU`` ``Sequential`` on an interval exactly, by propagating a breakpoint partition layer by layer
(float64 with snapping, or exact rationals with ``exact=True``). :class:`TriangleActivation` is the
multidimensional extension: one learnable triangle-wave function per feature (block-diagonal width-4
blocks, used like a KAN activation).
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import nn

from icml25.kernels.rng import isolated_rng

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
"""Largest |x| and |y| that :func:`fit_1d` accepts (squared errors of larger values overflow float64)."""
PEAK_CLAMP = 1e-3
"""Peaks are clamped to ``[PEAK_CLAMP, 1 - PEAK_CLAMP]``: the coefficients ``1/(a(1 - a))`` stay bounded."""


# ------------------------------------------------------------------------------------------ validation
def _check_depth(depth: Any) -> int:
    if isinstance(depth, bool) or not isinstance(depth, numbers.Integral):
        raise TypeError(f"depth must be an int >= 1, got {type(depth).__name__}")
    if depth < 1:
        raise ValueError(f"depth must be an int >= 1, got {depth}")
    return int(depth)


def _check_domain(domain: Any, name: str = "domain") -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in domain)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair of floats (lo, hi), got {domain!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
        raise ValueError(f"{name} must be finite with lo < hi, got ({lo}, {hi})")
    return lo, hi


def _check_real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


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


def _as_column(x: Any, name: str, dtype: torch.dtype) -> torch.Tensor:
    """A ``(n,)`` or ``(n, 1)`` float array as a ``(n,)`` tensor of ``dtype`` (finite, n >= 1)."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "fiu":
            raise TypeError(f"{name} must be a float array, got dtype {x.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor or array of shape (n,) or (n, 1), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 1:
        raise ValueError(f"{name} must have shape (n,) or (n, 1), got {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must hold at least 2 points, got an empty tensor of shape {tuple(x.shape)}")
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        raise ValueError(f"{name} must be finite; got {int(bad.sum())} non-finite values of {x.numel()}")
    if float(x.abs().max()) > MAX_ABS:
        raise ValueError(
            f"{name} must have |values| <= {MAX_ABS:g} (its squared error would overflow), got max "
            f"{float(x.abs().max()):g}: rescale the data"
        )
    return x.detach().to(dtype)


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
    if u.numel() and not bool(torch.isfinite(u).all()):
        raise ValueError(f"u must be finite; got {int((~torch.isfinite(u)).sum())} non-finite values")
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
        d = _check_depth(depth)
        lo, hi = _check_domain(domain)
        if not isinstance(enforce_smoothness, bool):
            raise TypeError(f"enforce_smoothness must be a bool, got {type(enforce_smoothness).__name__}")
        peaks = _check_peaks(init_peaks, d, "init_peaks")
        scale = _check_real(init_scale, "init_scale")
        offset = _check_real(init_offset, "init_offset")
        slope = _check_real(init_slope, "init_slope")
        if tail_peak is not None:
            tail_peak = float(_check_peaks(_check_real(tail_peak, "tail_peak"), 1, "tail_peak")[0])
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
        if x.numel() and not bool(torch.isfinite(x).all()):
            raise ValueError(f"x must be finite; got {int((~torch.isfinite(x)).sum())} non-finite values")
        if x.numel() and float(x.abs().max()) > MAX_ABS:
            raise ValueError(f"x must have |values| <= {MAX_ABS:g}, got max {float(x.abs().max()):g}")
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

        Parameters with a leading batch shape (several nets stacked, as :func:`fit_1d` does) give weights
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
        return _apply_stack(layers, acts, x)

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


def _apply_stack(
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
    d = _check_depth(depth)
    if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
        raise ValueError(f"width must be an int >= 1, got {width!r}")
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


# ------------------------------------------------------------------------------------------ counting
@dataclass(frozen=True)
class RegionCount:
    """Regions of a 1-D piecewise-linear network on ``[lo, hi]``.

    ``activation_regions``: intervals of constant ReLU pattern; ``linear_regions``: maximal intervals on
    which the output is affine (neighbours with equal slope merged); ``breakpoints``: the interior kinks of
    the output (floats, or ``Fraction`` with ``exact=True``); ``activation_breakpoints``: the interior
    pattern changes; ``slopes``: the output slope on each activation region.
    """

    activation_regions: int
    linear_regions: int
    breakpoints: tuple
    activation_breakpoints: tuple = ()
    slopes: tuple = field(default=(), repr=False)


_ALLOWED = (nn.Linear, nn.ReLU, nn.LeakyReLU, nn.Identity)


def _layers_of(model: Any) -> list[nn.Module]:
    if isinstance(model, TriangleNet):
        model = model.to_mlp()
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"model must be an nn.Sequential of Linear/ReLU/LeakyReLU (or a TriangleNet), got "
            f"{type(model).__name__}"
        )
    mods = []
    for name, m in model.named_children():
        if isinstance(m, nn.Sequential):
            mods += _layers_of(m)
        elif isinstance(m, nn.Dropout) and not m.training:
            continue  # eval-mode dropout is the identity
        elif not isinstance(m, _ALLOWED):
            mode = " in train mode" if isinstance(m, nn.Dropout) else ""
            raise TypeError(
                f"model holds an unsupported module {name!r}: {type(m).__name__}{mode}; "
                "count_linear_regions_1d handles Linear, ReLU, LeakyReLU (and eval-mode Dropout) only"
            )
        else:
            mods.append(m)
    return mods


def count_linear_regions_1d(
    model: nn.Sequential | TriangleNet,
    lo: float,
    hi: float,
    exact: bool = False,
    merge_tol: float = 1e-12,
    snap_tol: float = 1e-13,
) -> RegionCount:
    """Exact linear-region count of a 1-input ReLU network on ``[lo, hi]`` by breakpoint propagation.

    On every interval of the current partition each neuron is affine in ``x``; a ReLU/LeakyReLU splits an
    interval where its pre-activation crosses zero strictly inside it. Cost O(depth x width x #intervals).

    Args:
        model: an ``nn.Sequential`` of ``Linear`` (the first with ``in_features == 1``), ``ReLU``,
            ``LeakyReLU``, ``Identity`` and eval-mode ``Dropout`` (nested ``Sequential`` allowed), or a
            :class:`TriangleNet` (counted through :meth:`~TriangleNet.to_mlp`).
        lo, hi: the interval, ``lo < hi``.
        exact: rational arithmetic (``fractions.Fraction`` of the float weights, no tolerances): the exact
            count of the float network as written. Slow; for small networks.
        merge_tol: neighbouring pieces merge into one linear region when their slopes differ by at most
            ``merge_tol * max(1, max |slope|)`` (float mode; exact mode merges equal slopes only).
        snap_tol: float mode drops zero crossings within ``snap_tol * (hi - lo)`` of a breakpoint (float
            error at points where a pre-activation touches zero without crossing, e.g. a wave's valley).

    Returns:
        :class:`RegionCount`.
    """
    mods = _layers_of(model)
    lo_f, hi_f = _check_real(lo, "lo"), _check_real(hi, "hi")
    if lo_f >= hi_f:
        raise ValueError(f"lo must be < hi, got lo={lo_f} and hi={hi_f}")
    if not isinstance(exact, bool):
        raise TypeError(f"exact must be a bool, got {type(exact).__name__}")
    merge_tol, snap_tol = _check_real(merge_tol, "merge_tol"), _check_real(snap_tol, "snap_tol")
    if merge_tol < 0 or snap_tol < 0:
        raise ValueError(f"merge_tol and snap_tol must be >= 0, got {merge_tol} and {snap_tol}")
    linears = [m for m in mods if isinstance(m, nn.Linear)]
    if not linears:
        raise TypeError("model must contain at least one nn.Linear layer")
    if linears[0].in_features != 1:
        raise TypeError(
            f"model's first Linear must take one input feature (a 1-D network), got in_features="
            f"{linears[0].in_features}"
        )

    def conv(t: torch.Tensor) -> np.ndarray:
        arr = t.detach().to("cpu", torch.float64).numpy()
        if not np.isfinite(arr).all():
            raise ValueError("model has non-finite weights; regions are undefined")
        if exact:
            return np.vectorize(Fraction, otypes=[object])(arr) if arr.size else arr.astype(object)
        return arr

    num = Fraction if exact else float
    pts = [num(lo_f), num(hi_f)]  # partition points, sorted
    A = np.array([[num(1)]], dtype=object if exact else np.float64)  # (intervals, width): h = A x + B
    B = np.array([[num(0)]], dtype=object if exact else np.float64)
    snap = 0.0 if exact else snap_tol * (hi_f - lo_f)
    for m in mods:
        if isinstance(m, nn.Linear):
            W = conv(m.weight)
            b = conv(m.bias) if m.bias is not None else np.zeros(W.shape[0], dtype=W.dtype)
            if W.shape[1] != A.shape[1]:
                raise TypeError(
                    f"model's Linear {W.shape[1]}->{W.shape[0]} does not fit the previous width {A.shape[1]}"
                )
            A, B = A @ W.T, B @ W.T + b
            continue
        if isinstance(m, nn.Identity):
            continue
        neg = num(float(m.negative_slope)) if isinstance(m, nn.LeakyReLU) else num(0)
        if not exact and not math.isfinite(float(neg)):
            raise ValueError("LeakyReLU negative_slope must be finite")
        # Zero crossings strictly inside each interval.
        new_pts: list = []
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # |z| = inf is out of range
            crossings = -B / np.where(A == 0, 1, A) if not exact else None
        for k in range(len(pts) - 1):
            left, right = pts[k], pts[k + 1]
            for j in range(A.shape[1]):
                a_kj = A[k, j]
                if a_kj == 0:
                    continue
                z = -B[k, j] / a_kj if exact else crossings[k, j]
                if left + snap < z < right - snap:
                    new_pts.append(z)
        if new_pts:
            merged = sorted(set(pts) | set(new_pts))
            if not exact and snap > 0:  # drop crossings closer than snap to an accepted point
                keep = [merged[0]]
                for p in merged[1:-1]:
                    if p - keep[-1] > snap:
                        keep.append(p)
                if merged[-1] - keep[-1] <= snap and len(keep) > 1:
                    keep.pop()
                keep.append(merged[-1])
                merged = keep
            parent = np.searchsorted(np.asarray([float(p) for p in pts]), [float(p) for p in merged[:-1]],
                                     side="right") - 1  # fmt: skip
            if exact:  # float searchsorted can misplace nearly equal rationals: recompute exactly
                parent = np.array([_parent_exact(pts, p) for p in merged[:-1]])
            A, B, pts = A[parent], B[parent], merged
        mids = np.array([(pts[k] + pts[k + 1]) / 2 for k in range(len(pts) - 1)], dtype=A.dtype)
        active = (A * mids[:, None] + B) > 0
        factor = np.where(active, num(1), neg).astype(A.dtype)
        A, B = A * factor, B * factor
    if A.shape[1] != 1:
        slopes_all = [tuple(row) for row in A]
    else:
        slopes_all = [row[0] for row in A]
    n_act = len(pts) - 1
    kinks: list = []
    if exact:
        for k in range(n_act - 1):
            if slopes_all[k] != slopes_all[k + 1]:
                kinks.append(pts[k + 1])
    else:
        S = np.asarray(A, dtype=np.float64)
        scale = max(1.0, float(np.abs(S).max()) if S.size else 1.0)
        for k in range(n_act - 1):
            if float(np.abs(S[k] - S[k + 1]).max()) > merge_tol * scale:
                kinks.append(float(pts[k + 1]))
    inner = tuple(pts[1:-1]) if exact else tuple(float(p) for p in pts[1:-1])
    return RegionCount(
        activation_regions=n_act,
        linear_regions=len(kinks) + 1,
        breakpoints=tuple(kinks),
        activation_breakpoints=inner,
        slopes=tuple(slopes_all),
    )


def _parent_exact(pts: list, p: Any) -> int:
    lo, hi = 0, len(pts) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pts[mid] <= p:
            lo = mid
        else:
            hi = mid
    return lo


# ------------------------------------------------------------------------------------------ training
STAGES = ("pretrain", "finetune")


@dataclass
class FitResult:
    """Outcome of :func:`fit_1d` on ``n`` models trained side by side.

    ``models``: the trained models (a :class:`TriangleNet` after pretraining only, else the fine-tuned
    ``Sequential``); ``loss[stage]``: ``(n_logs, n)`` full-batch MSE at ``steps[stage]``;
    ``regions[stage]``: ``(n_logs, n)`` exact linear-region counts there; ``final_loss``: ``(n,)``.
    """

    models: list[nn.Module]
    stages: tuple[str, ...]
    steps: dict[str, list[int]]
    loss: dict[str, torch.Tensor]
    regions: dict[str, torch.Tensor]
    final_loss: torch.Tensor

    @property
    def model(self) -> nn.Module:
        """The first (for a single model, the only) trained model."""
        return self.models[0]


def _per_stage(value: Any, stages: tuple[str, ...], name: str, kind: type) -> list:
    vals = list(value) if isinstance(value, (tuple, list)) else [value] * len(stages)
    if len(vals) != len(stages):
        raise ValueError(f"{name} must be one value or one per stage {stages}, got {value!r}")
    out = []
    for v in vals:
        if kind is int:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise ValueError(f"{name} must be ints >= 0, got {value!r}")
            out.append(int(v))
        else:
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be finite floats > 0, got {value!r}")
            out.append(float(v))
    return out


def _is_convex_or_concave(x: torch.Tensor, y: torch.Tensor) -> bool:
    order = torch.argsort(x)
    xs, ys = x[order], y[order]
    dx = xs[1:] - xs[:-1]
    ok = dx > 0
    if int(ok.sum()) < 2:
        return True
    slopes = (ys[1:] - ys[:-1])[ok] / dx[ok]
    ds = slopes[1:] - slopes[:-1]
    tol = 1e-8 * float(slopes.abs().max().clamp_min(1e-300))
    return bool((ds >= -tol).all()) or bool((ds <= tol).all())


def fit_1d(
    model: nn.Module | Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    stages: Sequence[str] | None = None,
    steps: int | Sequence[int] = 3000,
    lr: float | Sequence[float] | None = None,
    *,
    log_every: int | None = None,
    desc: str | None = None,
) -> FitResult:
    """The paper's recipe: full-batch MSE with Adam, first on the reparameterised parameters
    (``"pretrain"``, a :class:`TriangleNet`: exactly ``2^d`` regions throughout), then on the raw weights of
    :meth:`TriangleNet.to_mlp` (``"finetune"``). A plain ``Sequential`` trains with ``("finetune",)``.

    Several models (a sequence, all of one kind and shape) train side by side as one vmapped batch: each
    model's loss, gradient and Adam state are its own, exactly as if trained alone.

    Args:
        model: a :class:`TriangleNet`, an ``nn.Sequential`` with one input and one output, or a sequence.
        x, y: ``(n,)`` or ``(n, 1)`` float data, ``n >= 2``, ``x`` not constant.
        stages: ``("pretrain", "finetune")`` (default for a TriangleNet), ``("pretrain",)`` or
            ``("finetune",)`` (default for a Sequential).
        steps: Adam steps, one int or one per stage (default 3000).
        lr: one float or one per stage (default 1e-2 for pretraining, 1e-3 for fine-tuning).
        log_every: steps between logged losses and exact region counts (default ``steps // 10``).
        desc: progress-bar label (a bar shows in a terminal only).

    Returns:
        :class:`FitResult`. TriangleNets are trained in place; fine-tuning works on new ``Sequential``
        copies, a given ``Sequential`` is trained in place.
    """
    models = [model] if isinstance(model, nn.Module) else list(model) if isinstance(model, Sequence) else None
    if not models:
        raise TypeError(
            f"model must be a TriangleNet, an nn.Sequential or a non-empty sequence, got {model!r}"
        )
    kinds = {type(m) for m in models}
    if len(kinds) != 1 or not all(isinstance(m, (TriangleNet, nn.Sequential)) for m in models):
        raise TypeError(
            f"model must be TriangleNet(s) or nn.Sequential(s) of one kind, got {sorted(map(str, kinds))}"
        )
    tri = isinstance(models[0], TriangleNet)
    if tri and len({(m.depth, m.domain, m.enforce_smoothness, m.tail_peak) for m in models}) != 1:
        raise ValueError("model: the TriangleNets must share depth, domain, enforce_smoothness and tail_peak")
    if not tri:
        for m in models:
            _layers_of(m)  # only Linear/ReLU-like modules
    if stages is None:
        stages = STAGES if tri else ("finetune",)
    if isinstance(stages, str) or not all(s in STAGES for s in stages) or not stages:
        raise ValueError(f"stages must be a non-empty sequence of {STAGES}, got {stages!r}")
    stages = tuple(stages)
    if list(stages) not in (["pretrain"], ["finetune"], ["pretrain", "finetune"]):
        raise ValueError(
            f"stages must be ('pretrain',), ('finetune',) or ('pretrain', 'finetune'), got {stages}"
        )
    if "pretrain" in stages and not tri:
        raise ValueError(
            f"stages {stages} include 'pretrain', which needs TriangleNet models, got Sequential"
        )
    n_steps = _per_stage(steps, stages, "steps", int)
    default_lr = {"pretrain": 1e-2, "finetune": 1e-3}
    lrs = [default_lr[s] for s in stages] if lr is None else _per_stage(lr, stages, "lr", float)
    if log_every is not None and (
        isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1
    ):
        raise ValueError(f"log_every must be an int >= 1, got {log_every!r}")
    dtype = next(models[0].parameters()).dtype
    xs, ys = _as_column(x, "x", dtype), _as_column(y, "y", dtype)
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must hold the same number of points, got {xs.numel()} and {ys.numel()}")
    if xs.numel() < 2 or float(xs.max() - xs.min()) == 0.0:
        raise ValueError(f"x must hold at least 2 distinct points, got {xs.numel()} points spanning 0")
    if tri and models[0].enforce_smoothness and "pretrain" in stages and not _is_convex_or_concave(xs, ys):
        warnings.warn(
            "fit_1d: the target is neither convex nor concave; with enforce_smoothness=True the TriangleNet "
            "fits convex (or concave) functions only: the 2^d guarantee covers convex fits",
            stacklevel=2,
        )
    lo, hi = float(xs.min()), float(xs.max())
    if tri and (lo < models[0].domain[0] or hi > models[0].domain[1]):
        raise ValueError(
            f"x must lie in the TriangleNet's domain {models[0].domain} (the 2^d guarantee holds there), got "
            f"[{lo:g}, {hi:g}]: build the net with domain=(x.min(), x.max())"
        )
    X = xs[:, None]

    current = models
    log_steps: dict[str, list[int]] = {}
    loss_log: dict[str, torch.Tensor] = {}
    region_log: dict[str, torch.Tensor] = {}
    final = torch.zeros(len(models), dtype=dtype)
    for stage, total, rate in zip(stages, n_steps, lrs):
        if stage == "finetune" and tri:
            current = [m.to_mlp() for m in current]
        every = log_every or max(total // 10, 1)
        steps_k, losses, regions, final = _train_stage(
            current, X, ys, total, rate, every, (lo, hi), desc or f"fit_1d {stage}"
        )
        log_steps[stage] = steps_k
        loss_log[stage] = losses
        region_log[stage] = regions
    return FitResult(current, stages, log_steps, loss_log, region_log, final)


def _stacked_predictor(current: list[nn.Module], leaves: dict[str, torch.Tensor], X: torch.Tensor):
    """A function returning the ``(n_models, n)`` predictions of the stacked parameters ``leaves``."""
    names = list(leaves)
    if isinstance(current[0], TriangleNet):
        template = copy.deepcopy(current[0])
        for name in names:
            template._parameters[name] = leaves[name]
        return lambda: template(X)[..., 0]
    lin_names = [n for n, m in current[0].named_modules() if isinstance(m, nn.Linear)]
    acts: list[float | None] = []
    for m in _layers_of(current[0]):
        if isinstance(m, nn.Linear):
            acts.append(None)
        elif isinstance(m, (nn.ReLU, nn.LeakyReLU)):
            if not acts or acts[-1] is not None:
                raise TypeError("model: fit_1d needs Linear layers each followed by at most one activation")
            acts[-1] = float(getattr(m, "negative_slope", 0.0))

    def predict() -> torch.Tensor:
        layers = []
        for n in lin_names:
            w = leaves[f"{n}.weight"]
            b = leaves.get(f"{n}.bias")
            layers.append((w, torch.zeros_like(w[..., 0]) if b is None else b))
        return _apply_stack(layers, acts, X)[..., 0]

    return predict


def _train_stage(
    current: list[nn.Module], X: torch.Tensor, ys: torch.Tensor, total: int, rate: float, every: int,
    interval: tuple[float, float], desc: str,
) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Adam on all models as one stacked batch: parameters ``(n_models, ...)`` as leaves."""
    from icml25.kernels.experiment import progress

    names = [name for name, _ in current[0].named_parameters()]
    leaves = {
        name: torch.stack([dict(m.named_parameters())[name].detach() for m in current]).requires_grad_()
        for name in names
    }
    predict = _stacked_predictor(current, leaves, X)
    opt = torch.optim.Adam(list(leaves.values()), lr=rate, foreach=True)
    steps_k: list[int] = []
    losses: list[torch.Tensor] = []
    regions: list[torch.Tensor] = []

    def log(step: int, mse: torch.Tensor) -> None:
        _write_back(current, leaves)
        steps_k.append(step)
        losses.append(mse.detach().clone())
        counts = [count_linear_regions_1d(m, *interval).linear_regions for m in current]
        regions.append(torch.tensor(counts))

    for step in progress(range(total), desc=desc, total=total):
        mse = ((predict() - ys) ** 2).mean(-1)  # (n_models,)
        if step % every == 0:
            log(step, mse)
        opt.zero_grad(set_to_none=True)
        mse.sum().backward()  # the sum: each model gets exactly its own gradient
        opt.step()
    with torch.no_grad():
        final = ((predict() - ys) ** 2).mean(-1)
    log(total, final)
    return steps_k, torch.stack(losses), torch.stack(regions), final.detach().clone()


@torch.no_grad()
def _write_back(models: list[nn.Module], params: dict[str, torch.Tensor]) -> None:
    for k, m in enumerate(models):
        for name, p in m.named_parameters():
            p.copy_(params[name][k])


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
        if (
            isinstance(num_features, bool)
            or not isinstance(num_features, numbers.Integral)
            or num_features < 1
        ):
            raise ValueError(f"num_features must be an int >= 1, got {num_features!r}")
        d = _check_depth(depth)
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
        self.scale = nn.Parameter(torch.full((F,), _check_real(init_scale, "init_scale"), dtype=dtype))
        self.offset = nn.Parameter(torch.full((F,), _check_real(init_offset, "init_offset"), dtype=dtype))
        self.slope = nn.Parameter(torch.full((F,), _check_real(init_slope, "init_slope"), dtype=dtype))

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
        if x.numel() and not bool(torch.isfinite(x).all()):
            raise ValueError(f"x must be finite; got {int((~torch.isfinite(x)).sum())} non-finite values")
        lo, hi = self.domain
        u = (x.to(self.peak_logits.dtype) - lo) / (hi - lo)
        a, s = self.peaks(), self.scales()
        inside = _closed_form_u(u.clamp(0, 1), a, s, self.offset, self.slope)
        left, right = _end_slopes(a, s, self.slope)
        return inside + left * (u.clamp(max=0)) + right * (u - 1).clamp(min=0)

    def block(self, k: int) -> TriangleNet:
        """Feature ``k``'s function as a :class:`TriangleNet` (same values on the domain; ``to_mlp`` gives
        its width-4 ReLU block)."""
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k < self.num_features:
            raise ValueError(f"k must be a feature index in [0, {self.num_features}), got {k!r}")
        net = TriangleNet(self.depth, self.domain, True, 0.5, dtype=self.peak_logits.dtype)
        with torch.no_grad():
            net.peak_logits.copy_(self.peak_logits[k])
            net.scale.copy_(self.scale[k])
            net.offset.copy_(self.offset[k])
            net.slope.copy_(self.slope[k])
        return net

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, depth={self.depth}, domain={self.domain}"
