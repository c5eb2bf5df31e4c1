"""Compelling ReLU Networks to Exhibit Exponentially Many Linear Regions — ICML 2025, P23: the training recipe.

Milkert, Hyde, Laine, "Compelling ReLU Networks to Exhibit Exponentially Many Linear Regions at
Initialization and During Training", ICML 2025 (arXiv 2311.18022; no official code was published).

:func:`fit_1d` is the paper's recipe: full-batch MSE with Adam, first on the reparameterised parameters of a
:class:`~icml25.interpretability.relu_regions.TriangleNet` ("pretraining": the region count cannot collapse),
then on the raw weights of its :meth:`~icml25.interpretability.relu_regions.TriangleNet.to_mlp`
("fine-tuning"); several models train side by side as one stacked batch, with the exact region count
logged along the way.
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from icml25.interpretability.relu_regions import MAX_ABS, TriangleNet, apply_stack
from icml25.interpretability.relu_regions_count import count_linear_regions_1d, linear_relu_layers
from icml25.kernels.checks import check_int, check_tensor

__all__ = ["STAGES", "FitResult", "fit_1d"]


# ------------------------------------------------------------------------------------------ validation
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
    check_tensor(x, name, max_abs=MAX_ABS)  # beyond MAX_ABS the squared error overflows: rescale the data
    return x.detach().to(dtype)


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
            linear_relu_layers(m)  # only Linear/ReLU-like modules
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
    if log_every is not None:
        log_every = check_int(log_every, "log_every", low=1)
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
    for m in linear_relu_layers(current[0]):
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
        return apply_stack(layers, acts, X)[..., 0]

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
