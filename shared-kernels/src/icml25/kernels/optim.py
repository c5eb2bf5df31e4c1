"""Adam (Kingma & Ba, ICLR 2015) without ``torch.optim``: the one optimiser the packages' small fits share.

The first ``torch.optim`` step imports ``torch._dynamo``, seconds of CPU that dominate the quick
reproductions of tiny models. :class:`Adam` is the update of ``torch.optim.Adam`` (L2 ``weight_decay``
added to the gradient, bias-corrected moments, ``eps`` outside the square root), tested against it, for
parameters with ``.grad`` (``loss.backward(); opt.step()``) or for explicit gradients
(``opt.step(torch.autograd.grad(loss, params))``), descending or, with ``maximize=True``, ascending.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

__all__ = ["Adam"]


def _check_rate(name: str, value: object, *, low: float, high: float | None, low_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__}")
    x = float(value)
    above = x > low if low_open else x >= low
    if not math.isfinite(x) or not above or (high is not None and not x < high):
        bound = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'})"
        raise ValueError(f"{name} must be a finite number in {bound}; got {value!r}")
    return x


class Adam:
    """Adam over a list of tensors; the update of ``torch.optim.Adam`` (non-amsgrad, non-fused).

    Args:
        params: tensors to optimise (``nn.Parameter`` or leaf tensors); those with ``requires_grad=False``
            are skipped.
        lr: step size, > 0.
        betas: decay rates of the first and second moment estimates, each in ``[0, 1)``.
        eps: added to the root of the second moment, > 0.
        weight_decay: L2 penalty ``λ`` added to the gradient (``g + λ p``; Adam's, not AdamW's), ≥ 0.
        maximize: ascend instead of descend (the gradient's sign is flipped, as in ``torch.optim``).

    Attributes:
        params: the optimised tensors; ``m``, ``v``: their moment estimates; ``t``: steps taken.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        maximize: bool = False,
    ) -> None:
        if isinstance(params, torch.Tensor):
            raise TypeError("params must be an iterable of tensors (e.g. model.parameters()); got one Tensor")
        params = list(params)
        bad = [type(p).__name__ for p in params if not isinstance(p, torch.Tensor)]
        if bad:
            raise TypeError(f"params must hold tensors; got {bad[0]}")
        self.lr = _check_rate("lr", lr, low=0.0, high=None, low_open=True)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2); got {betas!r}")
        b1 = _check_rate("betas[0]", betas[0], low=0.0, high=1.0, low_open=False)
        b2 = _check_rate("betas[1]", betas[1], low=0.0, high=1.0, low_open=False)
        self.betas = (b1, b2)
        self.eps = _check_rate("eps", eps, low=0.0, high=None, low_open=True)
        self.weight_decay = _check_rate("weight_decay", weight_decay, low=0.0, high=None, low_open=False)
        if not isinstance(maximize, bool):
            raise TypeError(f"maximize must be a bool; got {type(maximize).__name__}")
        self.maximize = maximize
        self.params = [p for p in params if p.requires_grad]
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    def zero_grad(self) -> None:
        """Drop the parameters' ``.grad`` (``set_to_none``, like ``torch.optim``)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor | None] | None = None) -> None:
        """One Adam step, from ``grads`` (one per parameter, ``None`` to skip one) or from the ``.grad`` fields."""
        if grads is None:
            grads = [p.grad for p in self.params]
        else:
            grads = list(grads)
            if len(grads) != len(self.params):
                raise ValueError(
                    f"grads must hold one tensor per parameter ({len(self.params)}); got {len(grads)}"
                )
            for i, (g, p) in enumerate(zip(grads, self.params)):
                if g is not None and g.shape != p.shape:
                    raise ValueError(f"grads[{i}] must have the shape {tuple(p.shape)}; got {tuple(g.shape)}")
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            if g is None:
                continue
            if self.maximize:
                g = -g
            if self.weight_decay:
                g = g + self.weight_decay * p
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)
