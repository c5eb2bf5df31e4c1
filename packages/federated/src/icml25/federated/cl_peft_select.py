"""Exploiting Presentative Feature Distributions for Parameter-Efficient Continual Learning of Large Language Models — ICML 2025, P14: per-task LoRA blocks routed by running feature distributions.

Cheng, Ye, Xu, Yan, Zhang, Liu, Huang and Feng, ICML 2025 (PMLR 267; official code "Online-CL-LLMs",
public copy ``donggcao18/Online-CL-LLMs``, ``src/llama_prompt_new.py`` and ``src/cl_dataset.py``).

Continual learning of a frozen LLM with one LoRA block per task and no information leakage: no replay,
no stored examples and no task id at test time. Every wrapped projection ``p`` (``q_proj`` and ``v_proj``
by default) keeps, per task ``j``, a running diagonal Gaussian ``(μ, σ², n)`` of the *presentative
feature* ``f = mean over prompt tokens of W_p h`` (``W_p`` the frozen projection, ``h`` its input, i.e.
the normalised attention input). Each instance is routed, per projection and per layer, to the blocks
whose feature distribution is closest: ``w = softmax(−‖f − μ_j‖ / τ)``, top-k (default 1) renormalised,
and the projection outputs ``W_p h + Σ_j w_j (α/r) B_j A_j h``. The official ``--successor`` option
(``PresentativeCL(successor=...)``) lets the layers outside a given list reuse the previous layer's weights.

The wrapper :class:`SelectableLoRALinear` replaces ``nn.Linear`` modules in place, like ``peft`` does, with
peft's parameter layout (``base_layer``, ``lora_A.<adapter>``, ``lora_B.<adapter>``), so every task's
block exports to a ``peft`` ``LoraModel`` as one named adapter (:meth:`PresentativeCL.to_peft_model`,
extra ``peft``, imported lazily). The core needs only torch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from icml25.kernels.checks import check_choice, check_float, check_int, check_ints, check_tensor
from icml25.kernels.rng import isolated_rng

__all__ = [
    "DISTANCES",
    "PresentativeCL",
    "RunningDiagGaussian",
    "SelectableLoRALinear",
    "masked_mean",
    "routing_weights",
]

DISTANCES = ("l2", "gaussian", "dot", "cosine")
"""Routing scores of the official ``calculate_distances``: L2 (default), diagonal-Gaussian
log-likelihood, scaled dot product ("Attention" there) and cosine similarity."""


_MASK_DTYPES = ("bool", "int", "float")


def _check_routing_args(distance: object, temperature: object, top_k: object, top_p: object) -> None:
    """The routing settings shared by :func:`routing_weights` and the wrappers."""
    check_choice(distance, "distance", DISTANCES)
    check_float(temperature, "temperature", low=0.0, low_open=True)
    check_int(top_k, "top_k", low=1)
    if top_p is not None:
        check_float(top_p, "top_p", low=0.0, high=1.0, low_open=True)


def _check_prompt_mask(mask: object, shape: tuple[int, ...]) -> torch.Tensor:
    """A boolean or 0/1 ``prompt_mask`` of ``shape`` (B, T) that selects at least one token per row."""
    mask = check_tensor(mask, "prompt_mask", shape=shape, dtype=_MASK_DTYPES, finite=False, binary=True)
    empty = (mask != 0).sum(1) == 0
    if bool(empty.any()):
        rows = torch.nonzero(empty).flatten().tolist()
        raise ValueError(f"prompt_mask must select at least one token per row; rows {rows} are all zero")
    return mask


# ------------------------------------------------------------------------------------------ statistics
class RunningDiagGaussian:
    """Running mean and biased diagonal variance of ``(B, D)`` batches (parallel-variance merge).

    The state is ``mean (D,)``, ``var (D,)`` (float64) and the count ``n``; nothing else is kept, so no
    input row can be recovered (the information-leakage audit of :meth:`PresentativeCL.il_audit`).
    """

    def __init__(self, dim: int) -> None:
        self.dim = check_int(dim, "dim", low=1)
        self.mean = torch.zeros(dim, dtype=torch.float64)
        self.var = torch.zeros(dim, dtype=torch.float64)
        self.n = 0

    def update(self, x: torch.Tensor) -> RunningDiagGaussian:
        """Absorb a batch ``x (B, D)``: ``μ ← μ + (μ_b − μ) b/(n+b)``, ``σ² ← (nσ² + bσ²_b + nb/(n+b)(μ_b−μ)²)/(n+b)``."""
        x = check_tensor(x, "x", shape=(None, self.dim), non_empty=True).detach().to(torch.float64)
        b = x.shape[0]
        self._absorb(x.mean(0), x.var(0, unbiased=False), b)
        return self

    def _absorb(self, mean_b: torch.Tensor, var_b: torch.Tensor, b: int) -> None:
        n = self.n
        total = n + b
        delta = mean_b.cpu() - self.mean
        self.var = (n * self.var + b * var_b.cpu() + (n * b / total) * delta**2) / total
        self.mean = self.mean + delta * (b / total)
        self.n = total

    def merge(self, other: RunningDiagGaussian) -> RunningDiagGaussian:
        """A new distribution equal to the statistics of both streams together (order-invariant)."""
        if not isinstance(other, RunningDiagGaussian):
            raise TypeError(f"other must be a RunningDiagGaussian, got {type(other).__name__}")
        if other.dim != self.dim:
            raise ValueError(f"other must have dim {self.dim}, got {other.dim}")
        out = self.copy()
        if other.n > 0:
            out._absorb(other.mean, other.var, other.n)
        return out

    def copy(self) -> RunningDiagGaussian:
        """An independent copy."""
        out = RunningDiagGaussian(self.dim)
        out.mean, out.var, out.n = self.mean.clone(), self.var.clone(), self.n
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{"mean": (D,), "var": (D,), "n": ()}``."""
        return {"mean": self.mean.clone(), "var": self.var.clone(), "n": torch.tensor(self.n)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load :meth:`state_dict` output; the dimension must match."""
        if not isinstance(state, dict) or set(state) != {"mean", "var", "n"}:
            raise ValueError(f"state must be a dict with keys mean, var, n; got {state!r:.80}")
        mean, var = state["mean"], state["var"]
        for name, t in (("mean", mean), ("var", var)):
            check_tensor(t, f"state[{name!r}]", shape=(self.dim,), dtype=None, finite=False)
        self.mean, self.var = mean.detach().to(torch.float64).clone(), var.detach().to(torch.float64).clone()
        self.n = int(state["n"])


# ------------------------------------------------------------------------------------------- routing
def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x (B, T, D)`` over the tokens where ``mask (B, T)`` is true -> ``(B, D)``.

    ``mask=None`` averages every token. ``mask`` is boolean or holds only 0 and 1 (another value would
    weight the tokens). A row with no selected token raises (its feature is undefined; the official code
    raises on the resulting NaN).
    """
    x = check_tensor(x, "x", ndim=3, non_empty=True)
    if mask is None:
        return x.mean(1)
    m = _check_prompt_mask(mask, tuple(x.shape[:2])).to(x.dtype)
    count = m.sum(1)
    return (x * m.unsqueeze(-1)).sum(1) / count.unsqueeze(-1)


def routing_weights(
    features: torch.Tensor,
    means: torch.Tensor,
    variances: torch.Tensor | None = None,
    *,
    distance: str = "l2",
    temperature: float = 1.0,
    top_k: int | None = 1,
    top_p: float | None = None,
) -> torch.Tensor:
    """Routing weights of ``features (B, D)`` over ``K`` task distributions ``means (K, D)`` -> ``(B, K)``.

    ``w = softmax(s / τ)`` with ``s = −‖f − μ_j‖₂`` (``"l2"``), the diagonal-Gaussian log-likelihood
    (``"gaussian"``, needs ``variances (K, D)``), ``f·μ_j/√D`` (``"dot"``) or cosine similarity; then the
    ``top_k`` largest are kept (ties: lowest index) and, if ``top_p`` is given, the smallest prefix whose
    mass reaches ``top_p``; the kept weights are renormalised to sum to 1. ``top_k=None`` keeps all.
    ``variances`` must be finite and non-negative.
    """
    features = check_tensor(features, "features", ndim=2)
    means = check_tensor(means, "means", ndim=2)
    _check_routing_args(distance, temperature, 1 if top_k is None else top_k, top_p)
    if means.shape[0] == 0 or means.shape[1] != features.shape[1]:
        raise ValueError(
            f"means must have shape (K >= 1, D) with D = features.shape[1]; got means {tuple(means.shape)} "
            f"and features {tuple(features.shape)}"
        )
    f = features.to(torch.float64)
    mu = means.to(device=f.device, dtype=torch.float64)
    if distance == "l2":
        score = -(f[:, None, :] - mu[None]).norm(dim=-1)  # exact (cdist's matmul form loses digits)
    elif distance == "gaussian":
        if variances is None:
            raise ValueError(f"variances must be given, shape {tuple(means.shape)}, for distance='gaussian'")
        check_tensor(variances, "variances", shape=tuple(means.shape))
        if bool((variances < 0).any()):
            raise ValueError(f"variances must be >= 0, got a minimum of {float(variances.min())!r}")
        var = variances.to(device=f.device, dtype=torch.float64) + 1e-6
        diff2 = (f[:, None, :] - mu[None]) ** 2
        score = (-0.5 * (torch.log(2 * math.pi * var)[None] + diff2 / var[None])).sum(-1)
    elif distance == "dot":
        score = f @ mu.T / math.sqrt(f.shape[1])
    else:
        score = F.normalize(f, dim=1) @ F.normalize(mu, dim=1).T
    w = torch.softmax(score / temperature, dim=1)
    k = w.shape[1]
    # Stable descending sort: equal weights keep their index order, so ties go to the lowest index.
    order = torch.sort(w, dim=1, descending=True, stable=True).indices
    keep = torch.zeros_like(w, dtype=torch.bool)
    n_keep = k if top_k is None else min(top_k, k)
    keep.scatter_(1, order[:, :n_keep], True)
    if top_p is not None:
        sorted_w = torch.gather(w * keep, 1, order)
        cum = sorted_w.cumsum(1)
        # keep position i while the mass before it is below top_p (the first one always stays)
        before = cum - sorted_w
        keep_sorted = (before < top_p - 1e-12) & (sorted_w > 0)
        keep_sorted[:, 0] = True
        keep = torch.zeros_like(keep).scatter_(1, order, keep_sorted)
    w = w * keep
    return (w / w.sum(1, keepdim=True)).to(features.dtype)


# ------------------------------------------------------------------------------------------- modules
@dataclass
class _Context:
    """Per-forward state shared by every wrapped layer of one :class:`PresentativeCL`."""

    prompt_mask: torch.Tensor | None = None
    route: torch.Tensor | None = None
    log: dict[str, torch.Tensor] = field(default_factory=dict)


class SelectableLoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus one LoRA pair and one :class:`RunningDiagGaussian` per task.

    Parameters follow peft's ``LoraLayer``: ``base_layer``, ``lora_A[task]`` (``(r, in)``, Kaiming-uniform
    a=√5) and ``lora_B[task]`` (``(out, r)``, zeros), scaling ``α/r``. ``forward(h (B, T, in))`` returns
    ``base(h) + Σ_j w_j (α/r) B_j A_j h`` (B, T, out); ``w (B, K)`` comes from the feature
    ``masked_mean(base(h), prompt_mask)`` (see :func:`routing_weights`) unless the owner forces a route.
    With ``route_from`` (the official successor option, set by :class:`PresentativeCL`) the layer reuses
    the weights that the wrapped layer of that path used in the same forward pass instead of routing on its
    own feature; in training it still updates its own statistics first, as the official code does.
    """

    def __init__(
        self,
        base_layer: nn.Linear,
        *,
        r: int,
        alpha: float,
        distance: str = "l2",
        temperature: float = 1.0,
        top_k: int = 1,
        top_p: float | None = None,
        name: str = "",
        context: _Context | None = None,
        route_from: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(base_layer, nn.Linear):
            raise TypeError(f"base_layer must be an nn.Linear, got {type(base_layer).__name__}")
        _check_routing_args(distance, temperature, top_k, top_p)
        self.base_layer = base_layer
        for p in base_layer.parameters():
            p.requires_grad_(False)
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.distance, self.temperature, self.top_k, self.top_p = distance, temperature, top_k, top_p
        self.name = name
        self.context = context if context is not None else _Context()
        if route_from is not None and not isinstance(route_from, str):
            raise TypeError(f"route_from must be a wrapped layer's path (str) or None, got {route_from!r}")
        self.route_from = route_from
        self.lora_A = nn.ModuleDict()
        self.lora_B = nn.ModuleDict()
        self.stats: dict[str, RunningDiagGaussian] = {}
        self.tasks: list[str] = []
        self.current: str | None = None

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def add_task(self, task: str, seed: int | None) -> None:
        """Add a fresh LoRA pair (B = 0) and empty statistics for ``task``; freeze every earlier block."""
        for p in self.parameters():
            p.requires_grad_(False)
        w = self.base_layer.weight
        with isolated_rng(seed):
            a = nn.Linear(self.in_features, self.r, bias=False, device=w.device, dtype=w.dtype)
            nn.init.kaiming_uniform_(a.weight, a=math.sqrt(5))
        b = nn.Linear(self.r, self.out_features, bias=False, device=w.device, dtype=w.dtype)
        nn.init.zeros_(b.weight)
        self.lora_A[task], self.lora_B[task] = a, b
        self.stats[task] = RunningDiagGaussian(self.out_features)
        self.tasks.append(task)
        self.current = task

    def lora(self, task: str, h: torch.Tensor) -> torch.Tensor:
        """``(α/r) B A h`` of one task's block: ``(B, T, in) -> (B, T, out)``."""
        return self.lora_B[task](self.lora_A[task](h)) * self.scaling

    def candidates(self) -> list[int]:
        """Indices (into :attr:`tasks`) of the blocks an instance may be routed to now."""
        if self.training:
            return list(range(len(self.tasks)))
        return [j for j, t in enumerate(self.tasks) if self.stats[t].n > 0]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        check_tensor(h, "h", finite=bool(self.tasks))
        if h.ndim < 2 or h.shape[-1] != self.in_features:
            raise ValueError(f"h must be a tensor of shape (B, T, {self.in_features}), got {tuple(h.shape)}")
        out = self.base_layer(h)
        if not self.tasks:
            return out
        if self.training and self.current is None:
            raise RuntimeError(
                f"{self.name or 'SelectableLoRALinear'}: forward in train mode needs a current task: "
                "call begin_task(name) first (or eval() for inference)"
            )
        flat = out.reshape(out.shape[0], -1, out.shape[-1]) if out.ndim != 3 else out
        feature = masked_mean(flat.detach(), self.context.prompt_mask)  # (B, out)
        if self.training:
            self.stats[self.current].update(feature)  # official order: update, then route
        if self.route_from is not None and self.context.route is None:
            weights = self._reused_weights(feature.shape[0])
        else:
            weights = self._weights(feature)  # (B, K) over self.tasks
        self.context.log[self.name] = weights.detach()
        total = out
        for j, task in enumerate(self.tasks):
            wj = weights[:, j]
            if not bool((wj != 0).any()):
                continue
            scale = wj.to(out.dtype).reshape(-1, *([1] * (out.ndim - 1)))
            if self.training and task == self.current:
                total = total + scale * self.lora(task, h)
            else:
                with torch.no_grad():
                    total = total + scale * self.lora(task, h)
        return total

    def _reused_weights(self, batch: int) -> torch.Tensor:
        """The weights ``route_from`` used in this forward pass (official successor: layer idx − 1's)."""
        weights = self.context.log.get(self.route_from)  # type: ignore[arg-type]
        if weights is None or weights.shape != (batch, len(self.tasks)):
            raise RuntimeError(
                f"{self.name or 'SelectableLoRALinear'} reuses the routing weights of {self.route_from!r}, "
                "which has not run in this forward pass: call the model through PresentativeCL, whose "
                "wrapped layers run in layer order"
            )
        return weights

    def _weights(self, feature: torch.Tensor) -> torch.Tensor:
        b, k = feature.shape[0], len(self.tasks)
        route = self.context.route
        if route is not None:
            if route.ndim == 1:
                return F.one_hot(route.to(torch.long), k).to(feature.dtype)
            return route.to(feature.dtype)
        cand = self.candidates()
        w = torch.zeros(b, k, dtype=feature.dtype, device=feature.device)
        if len(self.tasks) == 1 or len(cand) <= 1:
            # The first task (or the only block with statistics) is applied directly, without routing.
            w[:, cand[0] if cand else k - 1] = 1.0
            return w
        # Candidate order [current] + previous as in the official code only affects ties; we use task order.
        means = torch.stack([self.stats[self.tasks[j]].mean for j in cand]).to(feature.device)
        var = torch.stack([self.stats[self.tasks[j]].var for j in cand]).to(feature.device)
        wc = routing_weights(
            feature.to(torch.float64),
            means,
            var,
            distance=self.distance,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
        )
        w[:, cand] = wc.to(feature.dtype)
        return w


def _resolve_targets(model: nn.Module, targets: Sequence[str]) -> list[tuple[str, nn.Linear]]:
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    found: list[tuple[str, nn.Linear]] = []
    for t in targets:
        hits = [(n, m) for n, m in linears if n == t or n.endswith("." + t)]
        if not hits:
            names = sorted({n.rsplit(".", 1)[-1] for n, _ in linears})
            raise ValueError(
                f"targets entry {t!r} matches no nn.Linear module of model; available names: {names}"
            )
        found.extend(hits)
    return sorted(found, key=lambda nm: nm[0])


def _layer_index(path: str) -> tuple[int, str] | None:
    """``"model.layers.3.self_attn.q_proj"`` -> ``(3, "model.layers.{}.self_attn.q_proj")``: the first
    integer component of a module path (the decoder layer) and the path with it left out (the projection)."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return int(part), ".".join([*parts[:i], "{}", *parts[i + 1 :]])
    return None


def _successor_sources(paths: Sequence[str], successor: object) -> dict[str, str | None]:
    """Per wrapped path, the path whose routing weights it reuses (None: it routes on its own feature).

    The official ``--successor`` list (``LlamaModel.forward``): a layer ``idx`` in the list routes on its
    own feature; any other layer takes the weights of the same projection in layer ``idx − 1`` (here the
    nearest lower wrapped layer), itself possibly reused, so a run of layers shares the weights of the
    last listed layer below it."""
    if successor is None:
        return dict.fromkeys(paths)
    chosen = set(check_ints(successor, "successor", low=0))
    located = {p: _layer_index(p) for p in paths}
    unindexed = [p for p, li in located.items() if li is None]
    if unindexed:
        raise ValueError(
            f"successor needs wrapped modules inside numbered layers (a path like 'layers.3.q_proj'); "
            f"{unindexed[:3]} have no layer index"
        )
    indices = sorted({li[0] for li in located.values() if li is not None})
    unknown = sorted(chosen - set(indices))
    if unknown:
        raise ValueError(f"successor entries must be wrapped layer indices {indices}; got {unknown} too")
    if indices[0] not in chosen:
        # Official: layer 0 outside the list would read the last layer's weights of the previous call.
        raise ValueError(
            f"successor must include the first wrapped layer, {indices[0]}, which has no earlier layer "
            f"to reuse; got {sorted(chosen)}"
        )
    by_key = {(li[0], li[1]): p for p, li in located.items() if li is not None}
    out: dict[str, str | None] = {}
    for p, li in located.items():
        assert li is not None
        idx, key = li
        if idx in chosen:
            out[p] = None
            continue
        lower = [j for j in indices if j < idx and (j, key) in by_key]
        if not lower:
            raise ValueError(f"successor: {p!r} has no wrapped projection of its kind in an earlier layer")
        out[p] = by_key[(lower[-1], key)]
    return out


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, child = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


class PresentativeCL(nn.Module):
    """Continual learning with presentative-feature routing over per-task LoRA blocks (no task id, no replay).

    Wraps every ``nn.Linear`` of ``model`` whose name ends with one of ``targets`` in place with a
    :class:`SelectableLoRALinear` and freezes all of ``model``'s own parameters. Call :meth:`begin_task`
    before training each task (adds and unfreezes its blocks), train with ordinary forward passes in
    ``train()`` mode (each updates the current task's statistics), then :meth:`end_task`. In ``eval()``
    mode nothing is updated and every instance is routed over all learned tasks.

    ``forward(input_ids (B, T), prompt_mask=None (B, T), route=None, **kwargs)`` calls ``model``.
    ``prompt_mask`` marks the tokens that make the feature (prompt tokens; labels and padding excluded;
    None: all). ``route`` forces the weights instead: task indices ``(B,)`` (the oracle) or weights ``(B, K)``.

    ``successor`` is the official ``--successor`` option: the decoder-layer indices (the first integer in a
    wrapped module's path, ``layers.<i>.``) whose projections route on their own feature; a projection in
    any other layer reuses the weights of the same projection in the previous wrapped layer (so
    ``successor=(0,)`` routes every layer like layer 0). The list must include the first wrapped layer.
    ``None`` (default, the official default): every wrapped layer routes on its own feature.
    """

    def __init__(
        self,
        model: nn.Module,
        targets: Sequence[str] = ("q_proj", "v_proj"),
        r: int = 4,
        alpha: float = 32,
        distance: str = "l2",
        temperature: float = 1.0,
        top_k: int = 1,
        top_p: float | None = None,
        seed: int | None = 0,
        successor: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(targets, str) or not isinstance(targets, Sequence) or not targets:
            raise TypeError(f"targets must be a non-empty sequence of module names, got {targets!r}")
        check_int(r, "r", low=1)
        check_float(alpha, "alpha", low=0.0, low_open=True)
        _check_routing_args(distance, temperature, top_k, top_p)
        found = _resolve_targets(model, targets)
        if any(isinstance(model.get_submodule(n), SelectableLoRALinear) for n, _ in found):
            raise ValueError("model is already wrapped by a PresentativeCL")
        sources = _successor_sources([n for n, _ in found], successor)
        self.targets = tuple(targets)
        self.r, self.alpha = r, alpha
        self.distance, self.temperature, self.top_k, self.top_p = distance, temperature, top_k, top_p
        self.seed = seed
        self.successor = None if successor is None else tuple(sorted({int(i) for i in successor}))
        self.context = _Context()
        for p in model.parameters():
            p.requires_grad_(False)
        self.layer_names: list[str] = []
        for path, lin in found:
            wrapped = SelectableLoRALinear(
                lin,
                r=r,
                alpha=alpha,
                distance=distance,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                name=path,
                context=self.context,
                route_from=sources[path],
            )
            _set_submodule(model, path, wrapped)
            self.layer_names.append(path)
        self.model = model
        self.tasks: list[str] = []
        self.current: str | None = None

    # -------------------------------------------------------------------------------- task protocol
    def wrapped(self) -> Iterator[tuple[str, SelectableLoRALinear]]:
        """``(module path, wrapper)`` of every wrapped projection, in path order."""
        for name in self.layer_names:
            yield name, self.model.get_submodule(name)  # type: ignore[misc]

    def begin_task(self, name: str) -> None:
        """Start task ``name``: a fresh LoRA pair and empty statistics per wrapped layer; older blocks frozen."""
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"name must be a non-empty str without '.', got {name!r}")
        if name in self.tasks:
            raise ValueError(f"name must be a new task name; {name!r} is already in {self.tasks}")
        if self.current is not None:
            raise RuntimeError(f"task {self.current!r} is still open: call end_task() first")
        for i, (_, layer) in enumerate(self.wrapped()):
            seed = None if self.seed is None else self.seed + 1000 * len(self.tasks) + i
            layer.add_task(name, seed)
        self.tasks.append(name)
        self.current = name

    def end_task(self) -> None:
        """Close the current task: its LoRA blocks and statistics are frozen from now on."""
        if self.current is None:
            raise RuntimeError("end_task() without an open task: call begin_task(name) first")
        for _, layer in self.wrapped():
            for p in layer.parameters():
                p.requires_grad_(False)
            layer.current = None
        self.current = None

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The current task's LoRA parameters (the only ones that receive gradients)."""
        return [p for p in self.parameters() if p.requires_grad]

    # ---------------------------------------------------------------------------------- forward
    def _check_batch(
        self, input_ids: torch.Tensor, prompt_mask: torch.Tensor | None, route: torch.Tensor | None
    ) -> None:
        input_ids = check_tensor(input_ids, "input_ids", ndim=2, dtype=None, finite=False)
        b = input_ids.shape[0]
        if prompt_mask is not None:
            _check_prompt_mask(prompt_mask, tuple(input_ids.shape))
        if route is not None:  # (B,) task indices or (B, K) weights
            k = len(self.tasks)
            check_tensor(route, "route", ndim=(1, 2), dtype=None, finite=False)
            if route.ndim == 1:
                check_tensor(route, "route", shape=(b,), dtype="int")
                if bool(((route < 0) | (route >= k)).any()):
                    raise ValueError(f"route indices must be in [0, {k}), got {route.tolist()}")
            else:
                check_tensor(route, "route", shape=(b, k))
        if self.training and self.current is None:
            raise RuntimeError(
                "forward in train mode needs a current task: call begin_task(name) first (or eval())"
            )

    def forward(
        self,
        input_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None = None,
        route: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        self._check_batch(input_ids, prompt_mask, route)
        self.context.prompt_mask = None if prompt_mask is None else prompt_mask.to(input_ids.device).bool()
        self.context.route = route
        self.context.log = {}
        try:
            return self.model(input_ids, **kwargs)
        finally:
            self.context.prompt_mask = None
            self.context.route = None

    @torch.no_grad()
    def routing(
        self, input_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """Per wrapped layer, the test-time routing weights ``(B, K)`` over :attr:`tasks` (no update)."""
        was_training = self.training
        self.eval()
        try:
            self(input_ids, prompt_mask=prompt_mask, **kwargs)
            return dict(self.context.log)
        finally:
            self.train(was_training)

    def last_routing(self) -> dict[str, torch.Tensor]:
        """The weights ``(B, K)`` each wrapped layer used in the latest forward pass."""
        return dict(self.context.log)

    # ---------------------------------------------------------------------------- state and audit
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """Only LoRA tensors and ``(μ, σ², n)``: ``{"tasks", "adapters": {peft-style key: tensor},
        "statistics": {"<path>.<task>.mean|var|n": tensor}}``. No input or feature row is stored."""
        adapters: dict[str, torch.Tensor] = {}
        stats: dict[str, torch.Tensor] = {}
        for path, layer in self.wrapped():
            for t in layer.tasks:
                adapters[f"{path}.lora_A.{t}.weight"] = layer.lora_A[t].weight.detach().clone()
                adapters[f"{path}.lora_B.{t}.weight"] = layer.lora_B[t].weight.detach().clone()
                for k, v in layer.stats[t].state_dict().items():
                    stats[f"{path}.{t}.{k}"] = v
        return {"tasks": list(self.tasks), "adapters": adapters, "statistics": stats}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True, assign: bool = False) -> Any:  # type: ignore[override]
        """Load :meth:`state_dict` output into a fresh wrapper of the same base (all tasks closed).

        Every shape is checked against this model first (a feature dimension that mismatches raises), so a
        rejected state leaves the wrapper unchanged."""
        if not isinstance(state, dict) or not {"tasks", "adapters", "statistics"} <= set(state):
            raise ValueError(
                "state must be a PresentativeCL.state_dict() with keys tasks, adapters, statistics"
            )
        if self.tasks:
            raise RuntimeError(f"load_state_dict needs a wrapper without tasks; this one has {self.tasks}")
        tasks, adapters, stats = list(state["tasks"]), state["adapters"], state["statistics"]
        for path, layer in self.wrapped():
            for t in tasks:
                expect = {
                    f"{path}.lora_A.{t}.weight": (self.r, layer.in_features),
                    f"{path}.lora_B.{t}.weight": (layer.out_features, self.r),
                }
                for key, shape in expect.items():
                    if key not in adapters:
                        raise ValueError(f"state['adapters'] lacks {key!r}")
                    if tuple(adapters[key].shape) != shape:
                        raise ValueError(
                            f"state['adapters'][{key!r}] must have shape {shape}, got {tuple(adapters[key].shape)}"
                        )
                for s in ("mean", "var"):
                    key = f"{path}.{t}.{s}"
                    if key not in stats:
                        raise ValueError(f"state['statistics'] lacks {key!r}")
                    if tuple(stats[key].shape) != (layer.out_features,):
                        raise ValueError(
                            f"state['statistics'][{key!r}] must have feature dimension ({layer.out_features},), "
                            f"got {tuple(stats[key].shape)}"
                        )
        for t in tasks:
            self.begin_task(t)
            for path, layer in self.wrapped():
                with torch.no_grad():
                    layer.lora_A[t].weight.copy_(adapters[f"{path}.lora_A.{t}.weight"])
                    layer.lora_B[t].weight.copy_(adapters[f"{path}.lora_B.{t}.weight"])
                layer.stats[t].load_state_dict({s: stats[f"{path}.{t}.{s}"] for s in ("mean", "var", "n")})
            self.end_task()
        return None

    def il_audit(self, dataset_size: int | None = None) -> list[str]:
        """Information-leakage audit: the problems found in :meth:`state_dict` (empty list: clean).

        The state may hold only LoRA matrices ``(r, in)`` / ``(out, r)`` and per-layer ``(D,)`` means and
        variances with a scalar count; any other tensor, or one whose leading dimension is ``dataset_size``,
        is reported."""
        problems = []
        state = self.state_dict()
        allowed = {(self.r, lay.in_features) for _, lay in self.wrapped()} | {
            (lay.out_features, self.r) for _, lay in self.wrapped()
        }
        for key, t in state["adapters"].items():
            if tuple(t.shape) not in allowed:
                problems.append(f"adapter {key} has shape {tuple(t.shape)}")
        for key, t in state["statistics"].items():
            if t.ndim > 1 or (key.endswith(".n") and t.ndim != 0):
                problems.append(f"statistic {key} has shape {tuple(t.shape)}")
        if dataset_size is not None:
            for group in ("adapters", "statistics"):
                for key, t in state[group].items():
                    if t.ndim >= 1 and t.shape[0] == dataset_size:
                        problems.append(
                            f"{group} {key} has leading dimension {dataset_size} (= dataset size)"
                        )
        return problems

    # --------------------------------------------------------------------------------------- peft
    def unwrapped_copy(self) -> nn.Module:
        """A deep copy of the base model with the original ``nn.Linear`` modules back in place."""
        model = copy.deepcopy(self.model)
        for path in self.layer_names:
            _set_submodule(model, path, model.get_submodule(path).base_layer)
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def peft_state_dict(self, task: str) -> dict[str, torch.Tensor]:
        """Task ``task``'s block in the format of ``peft.get_peft_model_state_dict`` (adapter name
        removed): ``base_model.model.<path>.lora_A.weight`` / ``.lora_B.weight``."""
        if task not in self.tasks:
            raise ValueError(f"task must be one of {self.tasks}, got {task!r}")
        out = {}
        for path, layer in self.wrapped():
            out[f"base_model.model.{path}.lora_A.weight"] = layer.lora_A[task].weight.detach().clone()
            out[f"base_model.model.{path}.lora_B.weight"] = layer.lora_B[task].weight.detach().clone()
        return out

    def to_peft_model(self) -> Any:
        """A ``peft.PeftModel`` over :meth:`unwrapped_copy` with one named LoRA adapter per task (same r,
        α, targets; dropout 0), loaded with this wrapper's weights. Needs the ``peft`` extra."""
        try:
            import peft
        except ImportError as err:  # pragma: no cover - exercised only without the extra
            raise ImportError(
                "PresentativeCL.to_peft_model needs peft: pip install 'icml25-federated[peft]'"
            ) from err
        if not self.tasks:
            raise ValueError("to_peft_model needs at least one task: call begin_task(name) first")
        config = peft.LoraConfig(
            r=self.r, lora_alpha=self.alpha, target_modules=list(self.targets), lora_dropout=0.0, bias="none"
        )
        base = self.unwrapped_copy()
        pm = peft.get_peft_model(base, copy.deepcopy(config), adapter_name=self.tasks[0])
        for t in self.tasks[1:]:
            pm.add_adapter(t, copy.deepcopy(config))
        for t in self.tasks:
            result = peft.set_peft_model_state_dict(pm, self.peft_state_dict(t), adapter_name=t)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise RuntimeError(f"peft did not accept adapter {t!r}: unexpected keys {unexpected[:3]}")
        pm.eval()
        return pm

    @classmethod
    def from_peft_model(
        cls,
        peft_model: Any,
        statistics: dict[str, torch.Tensor],
        **kwargs: Any,
    ) -> PresentativeCL:
        """Rebuild a wrapper from a ``peft.PeftModel`` (one adapter per task, the order of
        ``statistics``'s tasks) and the ``statistics`` part of :meth:`state_dict`."""
        try:
            import peft
        except ImportError as err:  # pragma: no cover
            raise ImportError("from_peft_model needs peft: pip install 'icml25-federated[peft]'") from err
        names = list(peft_model.peft_config)
        cfg = peft_model.peft_config[names[0]]
        base = copy.deepcopy(peft_model).unload()
        targets = (
            tuple(sorted(cfg.target_modules))
            if not isinstance(cfg.target_modules, str)
            else (cfg.target_modules,)
        )
        cl = cls(base, targets=targets, r=cfg.r, alpha=cfg.lora_alpha, **kwargs)
        adapters = {}
        for t in names:
            sd = peft.get_peft_model_state_dict(peft_model, adapter_name=t)
            for key, v in sd.items():
                path, _, rest = key.removeprefix("base_model.model.").rpartition(".lora_")
                adapters[f"{path}.lora_{rest.removesuffix('.weight')}.{t}.weight"] = v
        cl.load_state_dict({"tasks": names, "adapters": adapters, "statistics": statistics})
        return cl
