"""Efficient Molecular Conformer Generation with SO(3)-Averaged Flow Matching and Reflow — ICML 2025, P15: training loop.

How :meth:`~icml25.generative_models.conformers.flow.ConformerFlow.fit`,
:func:`~icml25.generative_models.conformers.flow.reflow` and
:func:`~icml25.generative_models.conformers.flow.distill` optimise and normalise their loss. The defaults
follow the official code (NVIDIA-Digital-Bio/avgflow, ``FlowMatcher`` and ``train.py``), scaled to a short
run: AdamW (optax's weight decay 1e-4) with a linear warmup and a cosine decay (``optax.
warmup_cosine_decay_schedule``, here :class:`torch.optim.lr_scheduler.LinearLR` then
:class:`~torch.optim.lr_scheduler.CosineAnnealingLR`), an exponential moving average of the weights (decay
0.999, started at the initial weights) that the model keeps for sampling, and a loss normalised per molecule.
:meth:`TrainingSchedule.constant` is the earlier choice: Adam at a constant rate, no averaging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from icml25.kernels.checks import check_choice, check_float, check_tensor

__all__ = ["TrainingSchedule", "velocity_loss"]

_NORMALISATIONS = ("molecule", "coordinate")


def velocity_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor,
    normalisation: Literal["molecule", "coordinate"] = "molecule",
) -> torch.Tensor:
    """Squared velocity error of a padded batch ``pred, target (B, N, 3)`` over the real atoms ``mask (B, N)``.

    ``"molecule"`` (the official ``FlowMatcher.loss_fn``): per molecule, the squared error summed over x, y, z
    and its atoms, divided by its atom count, then the mean over molecules. ``"coordinate"``: the mean over every
    real-atom coordinate of the batch (a larger molecule weighs more). When every molecule has the same atom
    count, ``"molecule"`` is exactly 3 × ``"coordinate"``. A molecule with no real atom counts as zero error.
    ``pred`` and ``target`` must be finite, non-empty and below 1e6 in magnitude.
    """
    pred = check_tensor(pred, "pred", ndim=3, max_abs=1e6, non_empty=True)
    target = check_tensor(target, "target", shape=tuple(pred.shape), max_abs=1e6)
    mask = check_tensor(mask, "mask", shape=tuple(pred.shape[:-1]), dtype="bool")
    check_choice(normalisation, "normalisation", _NORMALISATIONS)
    m = mask.to(pred.dtype)
    sq = ((pred - target) ** 2).sum(-1) * m  # (B, N)
    if normalisation == "coordinate":
        return sq.sum() / (3 * m.sum()).clamp_min(1.0)
    return (sq.sum(-1) / m.sum(-1).clamp_min(1.0)).mean()


@dataclass(frozen=True)
class TrainingSchedule:
    """Optimiser, learning-rate schedule and weight averaging of a flow fit (defaults: the official code's).

    The learning rate given to the fit is the peak: it rises linearly from ``lr_floor × lr`` to ``lr`` over
    the first ``warmup`` fraction of the steps (at least one step when ``warmup > 0``), then follows a cosine
    down to ``lr_floor × lr`` at the last step (official toy configuration: 1e-5 → 1e-4 over 500 warmup steps,
    cosine back to 1e-5 over 1M; the default ``warmup = 0.01`` is the fraction of the official default
    configuration, 10,000 of 1M steps). ``ema_decay`` (``None``: no averaging) keeps
    ``ema ← decay · ema + (1 − decay) · weights`` after every step, started at the initial weights as in the
    official ``train.py``; the fitted model ends with the averaged weights, which the official code samples
    with and fine-tunes from. The official decay 0.999 averages over ~1,000 steps of a run of up to 1M: in a
    run of ``n`` steps the average still holds ``0.999ⁿ`` of the initial weights (30 % after 1,200 steps), so
    a short fit wants a smaller decay (the P15 reproduction uses 0.99) or ``None``. ``normalisation`` is
    :func:`velocity_loss`'s.
    """

    optimizer: Literal["adamw", "adam"] = "adamw"
    """``"adamw"`` (official: optax.adamw) or ``"adam"`` (L2-free Adam)."""
    weight_decay: float = 1e-4
    """AdamW's decoupled weight decay (optax's default, 1e-4); must be 0 for ``"adam"``."""
    warmup: float = 0.01
    """Fraction of the steps with a linear warmup, in [0, 1)."""
    lr_floor: float = 0.1
    """Start and end learning rate as a fraction of the peak, in (0, 1] (1 = constant; official toy 0.1)."""
    ema_decay: float | None = 0.999
    """Decay of the weight average used for sampling, in (0, 1), or ``None`` (official 0.999)."""
    normalisation: Literal["molecule", "coordinate"] = "molecule"
    """Loss normalisation (:func:`velocity_loss`; official ``"molecule"``)."""

    def __post_init__(self) -> None:
        check_choice(self.optimizer, "optimizer", ("adamw", "adam"))
        check_float(self.weight_decay, "weight_decay", low=0.0)
        if self.optimizer == "adam" and self.weight_decay != 0.0:
            raise ValueError(f"weight_decay must be 0 with optimizer='adam', got {self.weight_decay!r}")
        check_float(self.warmup, "warmup", low=0.0, high=1.0, high_open=True)
        check_float(self.lr_floor, "lr_floor", low=0.0, high=1.0, low_open=True)
        if self.ema_decay is not None:
            check_float(self.ema_decay, "ema_decay", low=0.0, high=1.0, low_open=True, high_open=True)
        check_choice(self.normalisation, "normalisation", _NORMALISATIONS)

    @classmethod
    def constant(cls) -> TrainingSchedule:
        """The earlier training of this package: Adam at a constant learning rate, no weight averaging, the
        loss averaged over every real-atom coordinate of the batch."""
        return cls(optimizer="adam", weight_decay=0.0, warmup=0.0, lr_floor=1.0, ema_decay=None,
                   normalisation="coordinate")  # fmt: skip

    def warmup_steps(self, steps: int) -> int:
        """Warmup length of a ``steps``-step fit (0 when ``warmup = 0``, otherwise at least 1, below ``steps``)."""
        if self.warmup == 0.0 or steps < 2:
            return 0
        return min(steps - 1, max(1, round(self.warmup * steps)))

    def make_optimizer(
        self, params: list[nn.Parameter], lr: float, steps: int
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        """The optimiser and its per-step learning-rate scheduler for a ``steps``-step fit at peak ``lr``."""
        if self.optimizer == "adamw":
            opt: torch.optim.Optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=self.weight_decay)
        else:
            opt = torch.optim.Adam(params, lr=lr)
        warm = self.warmup_steps(steps)
        cosine = CosineAnnealingLR(opt, T_max=max(1, steps - 1 - warm), eta_min=self.lr_floor * lr)
        if warm == 0:
            return opt, cosine
        ramp = LinearLR(opt, start_factor=self.lr_floor, end_factor=1.0, total_iters=warm)
        return opt, SequentialLR(opt, [ramp, cosine], milestones=[warm])


def optimise(
    module: nn.Module,
    loss_fn: Callable[[int], torch.Tensor],
    steps: int,
    lr: float,
    schedule: TrainingSchedule,
    callback: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Minimise ``loss_fn(step)`` over ``module``'s parameters for ``steps`` steps with ``schedule``; returns the
    loss per step. With ``schedule.ema_decay`` the module ends with the averaged weights (arguments are the
    caller's, validated there)."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt, sched = schedule.make_optimizer(params, lr, steps)
    ema = None
    if schedule.ema_decay is not None:
        ema = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(schedule.ema_decay))
        ema.update_parameters(module)  # the first update copies: the average starts at the initial weights
    losses = []
    for step in range(steps):
        loss = loss_fn(step)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if ema is not None:
            ema.update_parameters(module)
        losses.append(float(loss.detach()))
        if callback is not None:
            callback(step, losses[-1])
    if ema is not None:
        with torch.no_grad():
            for p, q in zip(module.parameters(), ema.module.parameters()):
                p.copy_(q)
    return losses
