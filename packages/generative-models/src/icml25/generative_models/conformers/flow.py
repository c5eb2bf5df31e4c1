"""Efficient Molecular Conformer Generation with SO(3)-Averaged Flow Matching and Reflow — ICML 2025, P15: flow objectives.

Flow matching from a centred Gaussian cloud (t = 0) to a conformer (t = 1) on the linear path
``X_t = (1 − t) X₀ + t X₁Rᵀ`` (Cao et al., ICML 2025, arXiv 2507.09785):

* ``"condot"``: a Haar-random rotation ``R`` of the data, target ``X₁Rᵀ − X₀`` (conditional OT);
* ``"kabsch"``: ``R`` the Kabsch rotation of ``X₁`` onto ``X₀``, target ``X₁Rᵀ − X₀``;
* ``"avg"`` (AvgFlow): the target averaged over every rotation of the data, weighted by its posterior
  given ``X_t``: ``v* = (X₁ E[R]ᵀ − X_t) / (1 − t)`` with ``R ~ MatrixFisher(κ X_tᵀX₁)``, ``κ = t/(1 − t)²``
  (Rao–Blackwellised: ``E[L_condot] − E[L_avg] = E‖u_R − v*‖² ≥ 0`` for every model, same minimiser).

Reflow re-pairs prior draws with the model's own ODE samples and fine-tunes on those fixed pairs with the
plain target ``X̂ − Z``; distillation trains a one-step student ``X̂ ≈ Z + v(Z, 0)`` on the pairs.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from icml25.generative_models.conformers.egnn import MolGraph
from icml25.generative_models.conformers.so3 import (
    as_float_tensor,
    haar_rotations,
    kabsch_rotation,
    matrix_fisher_mean,
)
from icml25.generative_models.conformers.training import TrainingSchedule, optimise, velocity_loss
from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.rng import make_generator

__all__ = [
    "ConformerFlow",
    "ReflowPairs",
    "avgflow_target",
    "centre",
    "distill",
    "flow_target",
    "make_reflow_pairs",
    "reflow",
]

Objective = Literal["avg", "kabsch", "condot"]
_OBJECTIVES = ("avg", "kabsch", "condot")


def _mask_of(x: torch.Tensor, mask: torch.Tensor | None, name: str = "mask") -> torch.Tensor:
    if mask is None:
        return torch.ones(x.shape[:-1], dtype=torch.bool)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor of shape {tuple(x.shape[:-1])}, got {getattr(mask, 'dtype', type(mask).__name__)}"
        )
    if tuple(mask.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"{name} must have shape {tuple(x.shape[:-1])}, got {tuple(mask.shape)}")
    if mask.numel() and not bool(mask.any(-1).all()):
        raise ValueError(f"{name} must keep at least one atom per molecule, got an all-padded row")
    return mask


def _coords(x: object, name: str) -> torch.Tensor:
    x = as_float_tensor(x, name)
    if x.dim() != 3 or x.shape[-1] != 3:
        raise ValueError(f"{name} must have shape (B, N, 3), got {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one atom (N >= 1), got shape {tuple(x.shape)}")
    check_tensor(x, name)
    if x.numel() and float(x.abs().amax()) > 1e6:
        raise ValueError(
            f"{name} must be coordinates below 1e6 in magnitude, got max |{name}| = {float(x.abs().amax()):.3g}"
        )
    return x


def centre(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``x (B, N, 3)`` with the centre of mass of its real atoms (``mask (B, N)``) removed; padding set to 0."""
    return _centre(_coords(x, "x"), mask)


def _centre(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    m = _mask_of(x, mask).to(x.dtype)
    com = (x * m[..., None]).sum(1, keepdim=True) / m.sum(1).clamp_min(1.0)[:, None, None]
    return (x - com) * m[..., None]


def _centred(x: torch.Tensor, mask: torch.Tensor, name: str, strict: bool) -> torch.Tensor:
    xc = _centre(x, mask)
    scale = float(x.abs().amax()) if x.numel() else 0.0
    if x.numel() and float((xc - x * mask[..., None]).abs().amax()) > 1e-4 * max(1.0, scale):
        if strict:
            raise ValueError(f"{name} must be centred (zero centre of mass over real atoms) when strict=True")
        warnings.warn(f"{name} was not centred: its centre of mass was removed", stacklevel=3)
    return xc


def _times(t: object, batch: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(t, (float, int)) and not isinstance(t, bool):
        t = torch.full((batch,), float(t), dtype=dtype)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(
            f"t must be a float or a floating-point tensor of shape ({batch},), got {getattr(t, 'dtype', type(t).__name__)}"
        )
    if t.dim() == 0:
        t = t.expand(batch)
    if tuple(t.shape) != (batch,):
        raise ValueError(f"t must have shape ({batch},), got {tuple(t.shape)}")
    check_tensor(t, "t")
    return t.to(dtype)


def avgflow_target(
    x_t: torch.Tensor,
    x1: torch.Tensor,
    t: torch.Tensor | float,
    mask: torch.Tensor | None = None,
    *,
    strict: bool = False,
) -> torch.Tensor:
    """The SO(3)-averaged velocity ``v*(X_t, X₁) = (X₁ E[R]ᵀ − X_t)/(1 − t)``, ``(B, N, 3)``.

    ``x_t, x1 (B, N, 3)``, ``t (B,)`` or a float in ``[0, 1)``, optional ``mask (B, N)`` (``True`` = real
    atom; padded rows of the result are 0). Inputs are centred over real atoms (a warning when they were
    not; ``strict=True`` raises instead). ``E[R]`` is the mean of ``MatrixFisher(κ X_tᵀX₁)``, ``κ = t/(1−t)²``:
    at ``t = 0`` it is 0 (target ``−X_t``), as ``t → 1`` it tends to the Kabsch rotation. ``t = 1`` has no
    finite target and raises. Fewer than 3 atoms or collinear atoms make ``E[R]`` degenerate (some singular
    values of ``X_tᵀX₁`` vanish): the result is still the exact posterior mean, finite.
    """
    x_t = _coords(x_t, "x_t")
    x1 = _coords(x1, "x1")
    if x_t.shape != x1.shape:
        raise ValueError(f"x_t and x1 must have the same shape, got {tuple(x_t.shape)} and {tuple(x1.shape)}")
    mask = _mask_of(x_t, mask)
    t = _times(t, x_t.shape[0], x_t.dtype)
    if bool((t >= 1).any()) or bool((t < 0).any()):
        raise ValueError(
            f"t must lie in [0, 1) (no finite target at t = 1), got range [{float(t.min()):g}, {float(t.max()):g}]"
        )
    x_t = _centred(x_t, mask, "x_t", strict)
    x1 = _centred(x1, mask, "x1", strict)
    td = t.double()
    kappa = td / (1 - td) ** 2
    F = kappa[:, None, None] * (x_t.double().transpose(1, 2) @ x1.double())
    ER = matrix_fisher_mean(F)
    v = (x1.double() @ ER.transpose(1, 2) - x_t.double()) / (1 - td)[:, None, None]
    return (v * mask[..., None]).to(x_t.dtype)


def flow_target(
    x0: torch.Tensor,
    x1: torch.Tensor,
    t: torch.Tensor | float,
    kind: Objective = "avg",
    mask: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_t, target)``, each ``(B, N, 3)``, of one flow-matching objective.

    ``x0`` prior draws and ``x1`` conformers ``(B, N, 3)`` (centred here), ``t (B,)`` in ``[0, 1)``.
    ``kind="condot"`` rotates ``x1`` by Haar-random rotations from ``generator``; ``"kabsch"`` by the
    rotation aligning it to ``x0``; ``"avg"`` uses a Haar-random rotation too and regresses onto
    :func:`avgflow_target` (which does not depend on that rotation).
    """
    x0 = _coords(x0, "x0")
    x1 = _coords(x1, "x1")
    if x0.shape != x1.shape:
        raise ValueError(f"x0 and x1 must have the same shape, got {tuple(x0.shape)} and {tuple(x1.shape)}")
    if kind not in _OBJECTIVES:
        raise ValueError(f"kind must be one of {_OBJECTIVES}, got {kind!r}")
    mask = _mask_of(x0, mask)
    t = _times(t, x0.shape[0], x0.dtype)
    if bool((t >= 1).any()) or bool((t < 0).any()):
        raise ValueError(f"t must lie in [0, 1), got range [{float(t.min()):g}, {float(t.max()):g}]")
    x0 = _centre(x0, mask)
    x1 = _centre(x1, mask)
    if kind == "kabsch":
        R = kabsch_rotation(x0, x1, mask)
    else:
        R = haar_rotations(x0.shape[0], generator=generator, dtype=x0.dtype)
    x1r = x1 @ R.transpose(1, 2)
    tt = t[:, None, None]
    x_t = ((1 - tt) * x0 + tt * x1r) * mask[..., None]
    if kind == "avg":
        return x_t, avgflow_target(x_t, x1r, t, mask)
    return x_t, (x1r - x0) * mask[..., None]


def _check_graph(graph: object, batch: int | None, n: int | None, name: str = "x1") -> MolGraph:
    if not isinstance(graph, MolGraph):
        raise TypeError(f"graph must be a MolGraph, got {type(graph).__name__}")
    if batch is not None and graph.batch_size != batch:
        raise ValueError(
            f"{name} must hold one conformer per molecule of graph ({graph.batch_size}), got {batch}"
        )
    if n is not None and graph.n_atoms != n:
        raise ValueError(f"{name} must have N = {graph.n_atoms} atom slots like graph, got {n}")
    return graph


def _check_schedule(schedule: object) -> TrainingSchedule:
    if schedule is None:
        return TrainingSchedule()
    if not isinstance(schedule, TrainingSchedule):
        raise TypeError(f"schedule must be a TrainingSchedule or None, got {type(schedule).__name__}")
    return schedule


class ConformerFlow(nn.Module):
    """A conformer generator ``X₁ = Φ(X₀)`` trained by flow matching with one of three objectives.

    ``net(x (B, N, 3), t (B,), graph) -> (B, N, 3)`` is the velocity network (e.g. :class:`EGNN`);
    ``objective`` is ``"avg"`` (AvgFlow), ``"kabsch"`` or ``"condot"`` (:func:`flow_target`); training
    times are drawn uniformly in ``[0, 1 − t_eps)`` (the official ``U(0, 1) × 0.999`` with the default
    ``t_eps = 1e-3``).
    """

    def __init__(self, net: nn.Module, objective: Objective = "avg", t_eps: float = 1e-3) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be an nn.Module, got {type(net).__name__}")
        if objective not in _OBJECTIVES:
            raise ValueError(f"objective must be one of {_OBJECTIVES}, got {objective!r}")
        if not isinstance(t_eps, float) or not 0.0 < t_eps < 0.5:
            raise ValueError(f"t_eps must be a float in (0, 0.5), got {t_eps!r}")
        self.net = net
        self.objective = objective
        self.t_eps = t_eps

    def velocity(self, x: torch.Tensor, t: torch.Tensor, graph: MolGraph) -> torch.Tensor:
        """The network's velocity ``(B, N, 3)``, centred and zero on padding."""
        return _centre(self.net(x, t, graph), graph.mask)

    def target(
        self,
        x0: torch.Tensor,
        x1: torch.Tensor,
        t: torch.Tensor,
        mask: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x_t, target)`` of this model's objective (:func:`flow_target`)."""
        return flow_target(x0, x1, t, self.objective, mask, generator=generator)

    def draw_times(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` training times, uniform in ``[0, 1 − t_eps)``."""
        return (1 - self.t_eps) * torch.rand(n, generator=generator)

    def prior(self, graph: MolGraph, generator: torch.Generator | None = None) -> torch.Tensor:
        """Centred standard Gaussian clouds ``(B, N, 3)`` on the real atoms of ``graph``."""
        z = torch.randn(graph.batch_size, graph.n_atoms, 3, generator=generator)
        return _centre(z, graph.mask)

    def loss(
        self,
        x1: torch.Tensor,
        graph: MolGraph,
        *,
        generator: torch.Generator | None = None,
        x0: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        normalisation: str = "molecule",
    ) -> torch.Tensor:
        """Squared velocity error of a batch of conformers ``x1 (B, N, 3)``, normalised per molecule (the
        official loss) or per real-atom coordinate (:func:`~icml25.generative_models.conformers.training.velocity_loss`).

        ``x0`` and ``t`` default to fresh draws from ``generator``.
        """
        x1 = _coords(x1, "x1")
        graph = _check_graph(graph, x1.shape[0], x1.shape[1])
        gen = make_generator(None, generator)
        if x0 is None:
            x0 = self.prior(graph, gen)
        if t is None:
            t = self.draw_times(x1.shape[0], gen)
        x_t, target = self.target(x0, x1, t, graph.mask, gen)
        return velocity_loss(self.velocity(x_t, t, graph), target, graph.mask, normalisation)

    def fit(
        self,
        x1: torch.Tensor,
        graph: MolGraph,
        steps: int,
        *,
        batch_size: int = 64,
        lr: float = 1e-3,
        seed: int = 0,
        callback: Callable[[int, float], None] | None = None,
        schedule: TrainingSchedule | None = None,
    ) -> list[float]:
        """Flow matching on minibatches of the dataset ``x1 (M, N, 3)`` with graphs ``graph`` (batch ``M``);
        returns the loss per step. ``lr`` is the peak learning rate of ``schedule``
        (:class:`~icml25.generative_models.conformers.training.TrainingSchedule`; default: the official AdamW with
        warmup, cosine decay and a weight average of decay 0.999, which the model ends with, and the loss
        per molecule; ``TrainingSchedule.constant()``: Adam at a constant rate). Inputs are validated before any
        parameter changes."""
        x1 = _coords(x1, "x1")
        graph = _check_graph(graph, x1.shape[0], x1.shape[1])
        if x1.shape[0] == 0:
            raise ValueError("x1 must hold at least one conformer, got an empty batch")
        steps = check_int(steps, "steps", low=1)
        batch_size = check_int(batch_size, "batch_size", low=1)
        lr = check_float(lr, "lr", low=0.0, low_open=True)
        schedule = _check_schedule(schedule)
        x1 = _centre(x1, graph.mask)
        gen = make_generator(seed)

        def step_loss(_: int) -> torch.Tensor:
            idx = torch.randint(0, x1.shape[0], (batch_size,), generator=gen)
            return self.loss(x1[idx], graph.index(idx), generator=gen, normalisation=schedule.normalisation)

        return optimise(self, step_loss, steps, lr, schedule, callback)

    @torch.no_grad()
    def sample(
        self,
        graph: MolGraph,
        n_steps: int = 50,
        *,
        generator: torch.Generator | None = None,
        x0: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Euler integration of the learned ODE from ``t = 0`` to 1: conformers ``(B, N, 3)`` for ``graph``.

        ``x0`` (centred here) defaults to :meth:`prior` draws from ``generator``; padding rows are 0.
        """
        graph = _check_graph(graph, None, None)
        n_steps = check_int(n_steps, "n_steps", low=1)
        if x0 is None:
            x = self.prior(graph, make_generator(None, generator))
        else:
            x0 = _coords(x0, "x0")
            _check_graph(graph, x0.shape[0], x0.shape[1], "x0")
            x = _centre(x0, graph.mask)
        dt = 1.0 / n_steps
        for k in range(n_steps):
            t = torch.full((graph.batch_size,), k * dt, dtype=x.dtype)
            x = x + dt * self.velocity(x, t, graph)
        return x


@dataclass(frozen=True)
class ReflowPairs:
    """Fixed (noise, sample) couplings for reflow/distillation: ``z, x (M, N, 3)`` and ``graph`` (batch M)."""

    z: torch.Tensor
    x: torch.Tensor
    graph: MolGraph


def make_reflow_pairs(
    model: ConformerFlow,
    graph: MolGraph,
    n_steps: int = 100,
    *,
    generator: torch.Generator | None = None,
    batch_size: int = 512,
) -> ReflowPairs:
    """Draw ``Z`` from the prior for each molecule of ``graph`` and integrate the learned ODE with
    ``n_steps`` Euler steps (many: few-step pairs bake the integration error into the student)."""
    if not isinstance(model, ConformerFlow):
        raise TypeError(f"model must be a ConformerFlow, got {type(model).__name__}")
    graph = _check_graph(graph, None, None)
    n_steps = check_int(n_steps, "n_steps", low=1)
    batch_size = check_int(batch_size, "batch_size", low=1)
    gen = make_generator(None, generator)
    z = model.prior(graph, gen)
    xs = [
        model.sample(graph.index(slice(i, i + batch_size)), n_steps, x0=z[i : i + batch_size])
        for i in range(0, graph.batch_size, batch_size)
    ]
    return ReflowPairs(z, torch.cat(xs) if xs else torch.zeros_like(z), graph)


def _check_pairs(pairs: object) -> ReflowPairs:
    if not isinstance(pairs, ReflowPairs):
        raise TypeError(f"pairs must be ReflowPairs (from make_reflow_pairs), got {type(pairs).__name__}")
    _coords(pairs.z, "pairs.z")
    _coords(pairs.x, "pairs.x")
    if pairs.z.shape != pairs.x.shape or pairs.z.shape[0] == 0:
        raise ValueError(
            f"pairs.z and pairs.x must have the same non-empty shape, got {tuple(pairs.z.shape)} and {tuple(pairs.x.shape)}"
        )
    _check_graph(pairs.graph, pairs.z.shape[0], pairs.z.shape[1], "pairs.z")
    return pairs


def _train_on_pairs(
    model: ConformerFlow,
    pairs: ReflowPairs,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    one_step: bool,
    schedule: TrainingSchedule | None,
) -> ConformerFlow:
    pairs = _check_pairs(pairs)
    steps = check_int(steps, "steps", low=1)
    batch_size = check_int(batch_size, "batch_size", low=1)
    lr = check_float(lr, "lr", low=0.0, low_open=True)
    schedule = _check_schedule(schedule)
    student = copy.deepcopy(model)
    gen = make_generator(seed)
    mask = pairs.graph.mask

    def step_loss(_: int) -> torch.Tensor:
        idx = torch.randint(0, pairs.z.shape[0], (batch_size,), generator=gen)
        z, x, g = pairs.z[idx], pairs.x[idx], pairs.graph.index(idx)
        if one_step:
            t = torch.zeros(batch_size)
            pred, target = z + student.velocity(z, t, g), x
        else:
            t = student.draw_times(batch_size, gen)
            x_t = (1 - t[:, None, None]) * z + t[:, None, None] * x
            pred, target = student.velocity(x_t, t, g), x - z
        return velocity_loss(pred, target, mask[idx], schedule.normalisation)

    optimise(student, step_loss, steps, lr, schedule)
    return student


def reflow(
    model: ConformerFlow,
    pairs: ReflowPairs,
    steps: int,
    *,
    batch_size: int = 64,
    lr: float = 5e-4,
    seed: int = 0,
    schedule: TrainingSchedule | None = None,
) -> ConformerFlow:
    """A copy of ``model`` fine-tuned on the fixed couplings ``pairs`` with the plain target ``X̂ − Z``
    (the pair is already coupled, so no rotation averaging); its ODE is straighter, so few Euler steps
    suffice. ``model`` itself is left unchanged. ``lr`` and ``schedule`` as in :meth:`ConformerFlow.fit` (the
    official fine-tuning uses the same optimiser, schedule and weight average as training)."""
    if not isinstance(model, ConformerFlow):
        raise TypeError(f"model must be a ConformerFlow, got {type(model).__name__}")
    return _train_on_pairs(model, pairs, steps, batch_size, lr, seed, one_step=False, schedule=schedule)


def distill(
    model: ConformerFlow,
    pairs: ReflowPairs,
    steps: int,
    *,
    batch_size: int = 64,
    lr: float = 5e-4,
    seed: int = 0,
    schedule: TrainingSchedule | None = None,
) -> ConformerFlow:
    """A one-step student (a copy of ``model``) trained so that ``Z + v(Z, 0) ≈ X̂`` on ``pairs`` (MSE):
    sample it with ``n_steps=1``. ``model`` itself is left unchanged; ``lr`` and ``schedule`` as in
    :meth:`ConformerFlow.fit`."""
    if not isinstance(model, ConformerFlow):
        raise TypeError(f"model must be a ConformerFlow, got {type(model).__name__}")
    return _train_on_pairs(model, pairs, steps, batch_size, lr, seed, one_step=True, schedule=schedule)
