"""Empower Structure-Based Molecule Optimization with Gradient Guided Bayesian Flow Networks — ICML 2025, P40: MolJO, joint gradient guidance of a pocket-conditioned Bayesian Flow Network.

Qiu, Song, Yu, Ma, Cao, Zhang, Wu, Zheng, Zhou & Ma, ICML 2025 (arXiv 2411.13280; official code
``AlgoMole/MolCRAFT``, folder ``MolJO/``). A Bayesian Flow Network (BFN, Graves et al. 2023) generates a
ligand in a protein pocket by refining *distribution parameters*: Gaussian means ``μ`` for the coordinates
and categorical probabilities ``θ`` for the atom types. Both are continuous, so a property model
``E(μ, θ, t) ∈ (0, 1)`` gives gradients for coordinates **and** types jointly; MolJO adds them to the
network's estimates (``x̂ += w_pos ∇_μ log E (1 − γ)``, ``p̂ += w_type ∇_θ log E``) and redraws the parameters
from the Bayesian flow at the next time ("backward correction" over the full window, the official
``end_back_pmf``), or over a sliding window of the last ``k`` steps (``vanilla_back_k``; ``k = 1`` is the
plain guided BFN).

This module provides:

* :class:`BFNSchedule` and the Bayesian flows :func:`bayesian_flow_coord`, :func:`bayesian_flow_type`;
* :class:`Pocket` (fixed protein atoms) and :class:`LigandBFN`, a small E(3)-equivariant EGNN-style network
  ``Ψ(μ, θ, t, pocket) → (x̂, type logits)`` with the BFN training loss (:func:`train_bfn`);
* :func:`moljo_sample` (joint guidance, full or sliding window), :func:`bfn_sample` (the plain BFN sampler);
* objectives: any differentiable callable ``(mu [B, M, 3] Å, theta [B, M, K], t [B]) → [B]`` in (0, 1) (or
  logits with ``objective_kind="logit"``), :class:`ParamPropertyModel` (a learned predictor on BFN-noised
  parameters, the paper's choice; :func:`train_property_model`), :func:`through_network` (a data-space score
  evaluated on the network's prediction ``(x̂, p̂)``, differentiated w.r.t. the parameters);
* :class:`ToyPocketTask`: a 24-atom spherical pocket with a known, differentiable, type-dependent contact score
  for honest small-scale tests (the reproduction's task).

Coordinates at the public boundary are in Å in the pocket's frame; internally the BFN works on coordinates
centred on the pocket and divided by ``pos_scale`` (the official ``pos_normalizer`` 2.0), and parameter
gradients are taken w.r.t. those normalised means, as in the official code. RDKit I/O lives in
:mod:`icml25.generative_models.moljo_rdkit` (the ``chem`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "BFNSchedule",
    "LigandBFN",
    "MolJOSample",
    "ParamPropertyModel",
    "Pocket",
    "ToyPocketTask",
    "bayesian_flow_coord",
    "bayesian_flow_type",
    "bfn_sample",
    "moljo_sample",
    "through_network",
    "train_bfn",
    "train_property_model",
]

Objective = Callable[[Tensor, Tensor, Tensor], Tensor]


# ------------------------------------------------------------------------------------------ validation
def _float(name: str, value: object, *, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, hi_open: bool = False) -> float:  # fmt: skip
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo:g}, got {v:g}")
    if hi is not None and (v >= hi if hi_open else v > hi):
        raise ValueError(f"{name} must be {'<' if hi_open else '<='} {hi:g}, got {v:g}")
    return v


def _int(name: str, value: object, *, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    v = int(value)
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


def _tensor(name: str, x: object, ndim: int, *, floating: bool = True, last: int | None = None) -> Tensor:
    """A non-empty ``ndim``-dimensional tensor (``last`` columns if given): finite floats of magnitude
    <= 1e6 (coordinates in Å and features stay far from float32 overflow), or integers."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    shape = None if last is None else (*([None] * (ndim - 1)), last)
    return check_tensor(
        x, name, ndim=ndim, shape=shape, dtype="float" if floating else "int", non_empty=True,
        max_abs=1e6 if floating else None,
    )  # fmt: skip


def _simplex(name: str, p: Tensor, tol: float = 1e-4) -> Tensor:
    if (p < -tol).any() or ((p.sum(-1) - 1).abs() > tol).any():
        raise ValueError(f"{name} rows must be probability vectors (non-negative, summing to 1)")
    return p


def _time(t: object, batch: int, like: Tensor) -> Tensor:
    """``t`` as a ``[batch]`` tensor in [0, 1]."""
    if isinstance(t, Tensor):
        if t.is_floating_point() is False:
            raise TypeError(f"t must be a float or a floating tensor, got dtype {t.dtype}")
        if not torch.isfinite(t).all():
            raise ValueError("t must be finite")
        tt = t.to(like.dtype).reshape(-1)
        if tt.numel() == 1:
            tt = tt.expand(batch)
        if tt.numel() != batch:
            raise ValueError(f"t must be a scalar or have {batch} entries, got shape {tuple(t.shape)}")
    else:
        tt = torch.full((batch,), _float("t", t), dtype=like.dtype)
    if (tt < 0).any() or (tt > 1).any():
        raise ValueError(f"t must lie in [0, 1], got range [{float(tt.min()):g}, {float(tt.max()):g}]")
    return tt


# ------------------------------------------------------------------------------------------ schedule
@dataclass(frozen=True)
class BFNSchedule:
    """Accuracy schedules of the coordinate (continuous) and atom-type (discrete) Bayesian flows.

    Coordinates: ``γ(t) = 1 − σ₁^{2t}``, precision ``ρ_i = σ₁^{−2 i/n}``, per-step accuracy
    ``α_i = σ₁^{−2i/n}(1 − σ₁^{2/n})``. Types: ``β(t) = β₁ t²``, ``α_i = β₁ (2i − 1)/n²``.
    Defaults are the official ones (σ₁ = 0.03, β₁ = 1.5, 200 sampling steps).
    """

    sigma1: float = 0.03
    beta1: float = 1.5
    n_steps: int = 200

    def __post_init__(self) -> None:
        _float("sigma1", self.sigma1, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        _float("beta1", self.beta1, lo=0.0, lo_open=True)
        _int("n_steps", self.n_steps, lo=1)

    def _step(self, i: object) -> int:
        return _int("i", i, lo=0, hi=self.n_steps)

    def gamma(self, t: float) -> float:
        """``γ(t) = 1 − σ₁^{2t}``."""
        return 1.0 - self.sigma1 ** (2.0 * _float("t", t, lo=0.0, hi=1.0))

    def beta(self, t: float) -> float:
        """``β(t) = β₁ t²``."""
        return self.beta1 * _float("t", t, lo=0.0, hi=1.0) ** 2

    def rho(self, i: int) -> float:
        """Coordinate precision after ``i`` steps, ``ρ_i = σ₁^{−2i/n}`` (``ρ₀ = 1``)."""
        return self.sigma1 ** (-2.0 * self._step(i) / self.n_steps)

    def alpha_coord(self, i: int) -> float:
        """Coordinate accuracy of step ``i ≥ 1``: ``σ₁^{−2i/n}(1 − σ₁^{2/n})`` (= ``ρ_i − ρ_{i−1}``)."""
        i = self._step(i)
        if i < 1:
            raise ValueError(f"i must be >= 1 for a step's accuracy, got {i}")
        return self.sigma1 ** (-2.0 * i / self.n_steps) * (1.0 - self.sigma1 ** (2.0 / self.n_steps))

    def alpha_type(self, i: int) -> float:
        """Type accuracy of step ``i ≥ 1``: ``β₁(2i − 1)/n²`` (= ``β(t_i) − β(t_{i−1})``)."""
        i = self._step(i)
        if i < 1:
            raise ValueError(f"i must be >= 1 for a step's accuracy, got {i}")
        return self.beta1 * (2 * i - 1) / self.n_steps**2

    def window(self, i: int, k: int) -> int:
        """The effective window at step ``i``: ``min(k, i)`` (a window longer than the steps taken is clipped)."""
        return min(_int("k", k, lo=1), self._step(i))

    def alpha_coord_sum(self, i: int, k: int) -> float:
        """Summed coordinate accuracy of steps ``i−k+1 .. i``: ``ρ_i − ρ_{i−k}`` (``k`` clipped to ``i``)."""
        k = self.window(i, k)
        return self.sigma1 ** (-2.0 * i / self.n_steps) * (1.0 - self.sigma1 ** (2.0 * k / self.n_steps))

    def alpha_type_sum(self, i: int, k: int) -> float:
        """Summed type accuracy of steps ``i−k+1 .. i``: ``β₁(i² − (i−k)²)/n²`` (``k`` clipped to ``i``)."""
        k = self.window(i, k)
        return self.beta1 * k * (2 * i - k) / self.n_steps**2


def bayesian_flow_coord(x: Tensor, t: float | Tensor, sigma1: float = 0.03, *, eps: Tensor | None = None,
                        generator: torch.Generator | None = None) -> Tensor:  # fmt: skip
    """A draw of the coordinate Bayesian flow ``p_F(μ | x; t) = N(γ(t) x, γ(t)(1 − γ(t)) I)``.

    Args:
        x: ``[B, M, 3]`` (or any ``[B, ...]``) data.
        t: a float or ``[B]`` times in [0, 1].
        sigma1: σ₁ ∈ (0, 1).
        eps: optional standard normal noise of ``x``'s shape (else drawn from ``generator``).
    Returns: ``μ`` of ``x``'s shape.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    x = _tensor("x", x, max(x.ndim, 1))
    sigma1 = _float("sigma1", sigma1, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    tt = _time(t, x.shape[0], x).reshape(-1, *[1] * (x.ndim - 1))
    gamma = 1.0 - sigma1 ** (2.0 * tt)
    if eps is None:
        eps = torch.randn(x.shape, generator=make_generator(None, generator), dtype=x.dtype)
    elif eps.shape != x.shape:
        raise ValueError(f"eps must have x's shape {tuple(x.shape)}, got {tuple(eps.shape)}")
    return gamma * x + (gamma * (1 - gamma)).sqrt() * eps


def bayesian_flow_type(p: Tensor, t: float | Tensor, beta1: float = 1.5, *, eps: Tensor | None = None,
                       generator: torch.Generator | None = None) -> Tensor:  # fmt: skip
    """A draw of the discrete Bayesian flow ``θ = softmax(y)``, ``y ~ N(β(t)(K p − 1), β(t) K I)``.

    ``p`` is one-hot data (or, as in the official ``end_back_pmf``, a soft estimate ``p̂`` that may leave the
    simplex after guidance).

    Args:
        p: ``[B, M, K]`` class probabilities.
        t: a float or ``[B]`` times in [0, 1].
        beta1: β₁ > 0.
        eps: optional standard normal noise of ``p``'s shape.
    Returns: ``θ`` ``[B, M, K]`` on the simplex.
    """
    p = _tensor("p", p, 3)
    beta1 = _float("beta1", beta1, lo=0.0, lo_open=True)
    K = p.shape[-1]
    tt = _time(t, p.shape[0], p).reshape(-1, 1, 1)
    beta = beta1 * tt**2
    if eps is None:
        eps = torch.randn(p.shape, generator=make_generator(None, generator), dtype=p.dtype)
    elif eps.shape != p.shape:
        raise ValueError(f"eps must have p's shape {tuple(p.shape)}, got {tuple(eps.shape)}")
    return torch.softmax(beta * (K * p - 1) + (beta * K).sqrt() * eps, dim=-1)


# ------------------------------------------------------------------------------------------ pocket, network
@dataclass(frozen=True)
class Pocket:
    """Fixed protein atoms: ``coords [P, 3]`` in Å and integer ``types [P]`` in ``0 .. n_types − 1``."""

    coords: Tensor
    types: Tensor

    def __post_init__(self) -> None:
        c = _tensor("pocket coords", self.coords, 2, last=3)
        t = _tensor("pocket types", self.types, 1, floating=False)
        if t.shape[0] != c.shape[0]:
            raise ValueError(f"pocket types must have one entry per atom ({c.shape[0]}), got {t.shape[0]}")
        if (t < 0).any():
            raise ValueError("pocket types must be >= 0")
        object.__setattr__(self, "coords", c.detach().float())
        object.__setattr__(self, "types", t.detach().long())

    @property
    def center(self) -> Tensor:
        """The centroid ``[3]``: the frame the BFN is centred on."""
        return self.coords.mean(0)

    def rotated(self, R: Tensor) -> Pocket:
        """The pocket rotated by ``R [3, 3]`` about its centroid."""
        c = self.center
        return Pocket((self.coords - c) @ R.T + c, self.types)


def _rbf(d2: Tensor, n: int, cutoff: float) -> Tensor:
    mu = torch.linspace(0.0, cutoff, n, dtype=d2.dtype)
    width = cutoff / n
    return torch.exp(-(((d2.clamp_min(0) + 1e-6).sqrt()[..., None] - mu) ** 2) / (2 * width**2))


class _EGNNLayer(nn.Module):
    """One E(n)-equivariant layer: ligand nodes receive messages from ligand and (fixed) pocket nodes."""

    def __init__(self, hidden: int, n_rbf: int) -> None:
        super().__init__()
        self.src = nn.Linear(hidden, hidden)
        self.dst = nn.Linear(hidden, hidden, bias=False)
        self.dist = nn.Linear(n_rbf, hidden, bias=False)
        self.edge = nn.Linear(hidden, hidden)
        self.coord = nn.Linear(hidden, 1)
        self.node = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.norm = nn.LayerNorm(hidden)
        self.n_rbf = n_rbf

    def forward(self, h: Tensor, x: Tensor, hp: Tensor, xp: Tensor) -> tuple[Tensor, Tensor]:
        B, M, _ = h.shape
        hn = torch.cat([h, hp.expand(B, -1, -1)], 1)  # [B, N, H]
        xn = torch.cat([x, xp.expand(B, -1, -1)], 1)  # [B, N, 3]
        diff = x[:, :, None] - xn[:, None]  # [B, M, N, 3]
        d2 = (diff**2).sum(-1)
        m = F.silu(self.src(h)[:, :, None] + self.dst(hn)[:, None] + self.dist(_rbf(d2, self.n_rbf, 4.0)))
        m = F.silu(self.edge(m))  # [B, M, N, H]
        mask = torch.ones(M, xn.shape[1], dtype=h.dtype)
        mask[:, :M] -= torch.eye(M, dtype=h.dtype)
        m = m * mask[None, :, :, None]
        w = torch.tanh(self.coord(m)) * mask[None, :, :, None]  # bounded coordinate steps
        x = x + (diff / (d2[..., None] + 1.0).sqrt() * w).sum(2) / mask.sum(1)[None, :, None]
        h = self.norm(h + self.node(torch.cat([h, m.sum(2) / mask.sum(1)[None, :, None]], -1)))
        return h, x


class LigandBFN(nn.Module):
    """``Ψ(μ, θ, t, pocket) → (x̂, type logits)``: a pocket-conditioned EGNN-style BFN network.

    E(3)-equivariant in the coordinates (rotations/translations of the pocket and ``μ`` move ``x̂`` with
    them; the logits are invariant). Ligand node features: ``θ``, an atom-index embedding (atoms are an
    ordered chain in the toy task; users' ligands may ignore it) and ``t``; pocket nodes: a type embedding,
    fixed (messages flow pocket → ligand). The official backbone is a 9-layer UniTransformer (hidden 128,
    16 heads, kNN 32); this is the CPU-scale stand-in.

    Args:
        n_types: K, ligand atom types.
        n_pocket_types: protein atom types.
        max_atoms: the largest ligand (atom-index embedding size).
        hidden, n_layers: width and depth.
        sigma1, beta1: the BFN hyper-parameters (σ₁ ∈ (0, 1), β₁ > 0).
        pos_scale: coordinates are divided by this after centring on the pocket (official 2.0).
        seed: initialisation seed (``None``: torch's global generator, the PyTorch convention).
    """

    def __init__(self, n_types: int, n_pocket_types: int, max_atoms: int = 16, hidden: int = 64, n_layers: int = 4,
                 sigma1: float = 0.03, beta1: float = 1.5, pos_scale: float = 2.0, seed: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.n_types = _int("n_types", n_types, lo=2)
        self.n_pocket_types = _int("n_pocket_types", n_pocket_types, lo=1)
        self.max_atoms = _int("max_atoms", max_atoms, lo=1)
        hidden = _int("hidden", hidden, lo=1)
        n_layers = _int("n_layers", n_layers, lo=1)
        self.sigma1 = _float("sigma1", sigma1, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        self.beta1 = _float("beta1", beta1, lo=0.0, lo_open=True)
        self.pos_scale = _float("pos_scale", pos_scale, lo=0.0, lo_open=True)
        with isolated_rng(seed) if seed is not None else nullcontext():
            self.type_in = nn.Linear(self.n_types, hidden)
            self.index = nn.Embedding(self.max_atoms, hidden)
            self.time = nn.Linear(16, hidden)
            self.pocket_emb = nn.Embedding(self.n_pocket_types, hidden)
            self.layers = nn.ModuleList(_EGNNLayer(hidden, 16) for _ in range(n_layers))
            self.type_out = nn.Sequential(
                nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, self.n_types)
            )

    # -- frames
    def to_internal(self, x: Tensor, pocket: Pocket) -> Tensor:
        """Å in the pocket frame → the BFN's normalised frame ``(x − centre) / pos_scale``."""
        return (x - pocket.center) / self.pos_scale

    def to_angstrom(self, x: Tensor, pocket: Pocket) -> Tensor:
        """The BFN's normalised frame → Å (inverse of :meth:`to_internal`)."""
        return x * self.pos_scale + pocket.center

    def check_pocket(self, pocket: object) -> Pocket:
        if not isinstance(pocket, Pocket):
            raise TypeError(f"pocket must be a Pocket, got {type(pocket).__name__}")
        if int(pocket.types.max()) >= self.n_pocket_types:
            raise ValueError(
                f"pocket types must be < n_pocket_types={self.n_pocket_types}, got max {int(pocket.types.max())}"
            )
        return pocket

    def check_data(self, coords: object, types: object) -> tuple[Tensor, Tensor]:
        """Validate reference ligands ``coords [N, M, 3]`` Å and ``types [N, M]`` in ``0 .. K − 1``."""
        coords = _tensor("coords", coords, 3, last=3)
        types = _tensor("types", types, 2, floating=False)
        if types.shape != coords.shape[:2]:
            raise ValueError(f"types must have shape {tuple(coords.shape[:2])}, got {tuple(types.shape)}")
        if (types < 0).any() or (types >= self.n_types).any():
            raise ValueError(f"types must lie in 0 .. {self.n_types - 1}")
        if coords.shape[1] > self.max_atoms:
            raise ValueError(
                f"coords must have at most max_atoms={self.max_atoms} atoms, got {coords.shape[1]}"
            )
        return coords, types

    def _features(self, theta: Tensor, t: Tensor) -> Tensor:
        M = theta.shape[1]
        freqs = torch.arange(8, dtype=theta.dtype)
        tf = torch.cat(
            [torch.sin(t[:, None] * math.pi * 2**freqs / 8), torch.cos(t[:, None] * math.pi * 2**freqs / 8)],
            -1,
        )
        return self.type_in(theta * 2 - 1) + self.index.weight[:M][None] + self.time(tf)[:, None]

    def forward_internal(self, mu: Tensor, theta: Tensor, t: Tensor, pocket: Pocket) -> tuple[Tensor, Tensor]:
        """Ψ on normalised means ``mu [B, M, 3]``; returns normalised ``x̂ [B, M, 3]`` and logits ``[B, M, K]``.

        No input checks (the samplers' inner loop); use :meth:`forward` at a user boundary.
        """
        xp = ((pocket.coords - pocket.center) / self.pos_scale).to(mu.dtype)[None]
        hp = self.pocket_emb(pocket.types)[None]
        h = self._features(theta, t)
        x = mu
        for layer in self.layers:
            h, x = layer(h, x, hp, xp)
        return x, self.type_out(h)

    def forward(self, mu: Tensor, theta: Tensor, t: float | Tensor, pocket: Pocket) -> tuple[Tensor, Tensor]:
        """``(x̂ [B, M, 3] Å, type logits [B, M, K])`` from parameters ``mu [B, M, 3]`` (Å, pocket frame),
        ``theta [B, M, K]`` (rows on the simplex) and ``t`` (float or ``[B]`` in [0, 1])."""
        pocket = self.check_pocket(pocket)
        mu = _tensor("mu", mu, 3, last=3)
        theta = _simplex("theta", _tensor("theta", theta, 3, last=self.n_types))
        if theta.shape[:2] != mu.shape[:2]:
            raise ValueError(
                f"theta must match mu's [B, M] = {tuple(mu.shape[:2])}, got {tuple(theta.shape[:2])}"
            )
        if mu.shape[1] > self.max_atoms:
            raise ValueError(f"mu must have at most max_atoms={self.max_atoms} atoms, got {mu.shape[1]}")
        tt = _time(t, mu.shape[0], mu)
        x_hat, logits = self.forward_internal(self.to_internal(mu, pocket), theta, tt, pocket)
        return self.to_angstrom(x_hat, pocket), logits

    def loss(self, coords: Tensor, types: Tensor, pocket: Pocket, *, n_train_steps: int = 1000,
             weighting: Literal["bfn", "uniform"] = "bfn", generator: torch.Generator | None = None) -> Tensor:  # fmt: skip
        """BFN training loss of a batch of reference ligands (a scalar).

        ``t = (i − 1)/n_train_steps`` with ``i`` uniform (the official discrete time, 1000 steps);
        ``μ ~ p_F(·| x; t)``, ``θ ~ p_F(·| e_x; t)``. ``weighting="bfn"``: Graves et al.'s continuous-time
        weights ``−ln σ₁ · σ₁^{−2t} ‖x − x̂‖²`` and ``K β₁ t ‖e_x − p̂‖²``; ``"uniform"``: ``‖x − x̂‖²`` plus the
        cross-entropy (a CPU-budget variant that converges in fewer steps).

        Args:
            coords: ``[B, M, 3]`` Å. types: ``[B, M]`` ints in ``0 .. K − 1``.
        """
        pocket = self.check_pocket(pocket)
        coords, types = self.check_data(coords, types)
        if weighting not in ("bfn", "uniform"):
            raise ValueError(f"weighting must be 'bfn' or 'uniform', got {weighting!r}")
        n_train_steps = _int("n_train_steps", n_train_steps, lo=1)
        g = make_generator(None, generator)
        B = coords.shape[0]
        x = self.to_internal(coords.float(), pocket)
        e = F.one_hot(types.long(), self.n_types).float()
        t = torch.randint(0, n_train_steps, (B,), generator=g).float() / n_train_steps
        mu = bayesian_flow_coord(x, t, self.sigma1, eps=torch.randn(x.shape, generator=g))
        theta = bayesian_flow_type(e, t, self.beta1, eps=torch.randn(e.shape, generator=g))
        x_hat, logits = self.forward_internal(mu, theta, t, pocket)
        sq = ((x - x_hat) ** 2).sum(-1).mean(-1)  # [B]
        if weighting == "uniform":
            return sq.mean() + F.cross_entropy(logits.reshape(-1, self.n_types), types.reshape(-1).long())
        w_x = -math.log(self.sigma1) * self.sigma1 ** (-2 * t)
        l_h = ((e - torch.softmax(logits, -1)) ** 2).sum(-1).mean(-1)
        return (w_x * sq).mean() + (self.n_types * self.beta1 * t * l_h).mean()


def _batches(n: int, batch_size: int, steps: int, g: torch.Generator):
    for _ in range(steps):
        yield torch.randint(0, n, (batch_size,), generator=g)


def train_bfn(bfn: LigandBFN, coords: Tensor, types: Tensor, pocket: Pocket, *, steps: int = 1500,
              batch_size: int = 128, lr: float = 2e-3, weighting: Literal["bfn", "uniform"] = "bfn",
              seed: int = 0) -> list[float]:  # fmt: skip
    """Train ``bfn`` on reference ligands with Adam (cosine-decayed lr); returns the loss per step.

    Args:
        coords: ``[N, M, 3]`` Å. types: ``[N, M]``. steps, batch_size, lr: optimisation. weighting: see
        :meth:`LigandBFN.loss`. seed: the minibatch and noise stream.
    """
    if not isinstance(bfn, LigandBFN):
        raise TypeError(f"bfn must be a LigandBFN, got {type(bfn).__name__}")
    steps = _int("steps", steps, lo=1)
    batch_size = _int("batch_size", batch_size, lo=1)
    lr = _float("lr", lr, lo=0.0, lo_open=True)
    # validate everything once, before any parameter changes
    pocket = bfn.check_pocket(pocket)
    coords, types = bfn.check_data(coords, types)
    if weighting not in ("bfn", "uniform"):
        raise ValueError(f"weighting must be 'bfn' or 'uniform', got {weighting!r}")
    seed = _int("seed", seed, lo=0)
    g = torch.Generator().manual_seed(_int("seed", seed, lo=0))
    opt = torch.optim.Adam(bfn.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses = []
    bfn.train()
    for idx in _batches(coords.shape[0], batch_size, steps, g):
        loss = bfn.loss(coords[idx], types[idx], pocket, weighting=weighting, generator=g)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(bfn.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    bfn.eval()
    return losses


# ------------------------------------------------------------------------------------------ objectives
class ParamPropertyModel(nn.Module):
    """A learned property predictor on BFN parameters: ``E(μ, θ, t, pocket) ∈ (0, 1)`` per molecule.

    Same EGNN-style encoder as :class:`LigandBFN`, a sigmoid head mean-pooled over ligand atoms (the official
    ``expert_pred``). Train it with :func:`train_property_model` on parameters drawn from the Bayesian flow of
    reference ligands at random ``t``, regressing a property normalised to (0, 1).
    """

    def __init__(self, n_types: int, n_pocket_types: int, max_atoms: int = 16, hidden: int = 32, n_layers: int = 2,
                 pos_scale: float = 2.0, seed: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.encoder = LigandBFN(
            n_types, n_pocket_types, max_atoms, hidden, n_layers, pos_scale=pos_scale, seed=seed
        )
        with isolated_rng(seed) if seed is not None else nullcontext():
            self.head = nn.Linear(hidden, 1)
        self.n_types = self.encoder.n_types

    def _pred_internal(self, mu: Tensor, theta: Tensor, t: Tensor, pocket: Pocket) -> Tensor:
        enc = self.encoder
        xp = ((pocket.coords - pocket.center) / enc.pos_scale).to(mu.dtype)[None]
        hp = enc.pocket_emb(pocket.types)[None]
        h, x = enc._features(theta, t), mu
        for layer in enc.layers:
            h, x = layer(h, x, hp, xp)
        return torch.sigmoid(self.head(h).mean(1)).squeeze(-1)

    def forward(self, mu: Tensor, theta: Tensor, t: float | Tensor, pocket: Pocket) -> Tensor:
        """``E [B]`` in (0, 1) from ``mu [B, M, 3]`` Å, ``theta [B, M, K]`` and ``t``."""
        pocket = self.encoder.check_pocket(pocket)
        mu = _tensor("mu", mu, 3, last=3)
        theta = _tensor("theta", theta, 3, last=self.n_types)
        tt = _time(t, mu.shape[0], mu)
        return self._pred_internal(self.encoder.to_internal(mu, pocket), theta, tt, pocket)

    def bind(self, pocket: Pocket) -> Objective:
        """This model as an objective ``(mu Å, theta, t) → E`` for :func:`moljo_sample`."""
        pocket = self.encoder.check_pocket(pocket)

        def objective(mu: Tensor, theta: Tensor, t: Tensor) -> Tensor:
            return self._pred_internal(self.encoder.to_internal(mu, pocket), theta, t, pocket)

        objective.n_types = self.n_types  # type: ignore[attr-defined]
        return objective


def train_property_model(model: ParamPropertyModel, coords: Tensor, types: Tensor, y: Tensor, pocket: Pocket, *,
                         sigma1: float = 0.03, beta1: float = 1.5, steps: int = 500, batch_size: int = 128,
                         lr: float = 5e-4, seed: int = 0) -> list[float]:  # fmt: skip
    """Fit ``model`` by MSE to ``y [N]`` in (0, 1) on Bayesian-flow-noised parameters (``t`` uniform on the
    official 1000-step grid) of the ligands ``coords [N, M, 3]`` Å, ``types [N, M]``; returns the losses."""
    if not isinstance(model, ParamPropertyModel):
        raise TypeError(f"model must be a ParamPropertyModel, got {type(model).__name__}")
    pocket = model.encoder.check_pocket(pocket)
    coords = _tensor("coords", coords, 3, last=3)
    types = _tensor("types", types, 2, floating=False)
    y = _tensor("y", y, 1)
    if types.shape != coords.shape[:2] or y.shape[0] != coords.shape[0]:
        raise ValueError(f"types [N, M] and y [N] must match coords {tuple(coords.shape)}, got "
                         f"{tuple(types.shape)} and {tuple(y.shape)}")  # fmt: skip
    if (types < 0).any() or (types >= model.n_types).any():
        raise ValueError(f"types must lie in 0 .. {model.n_types - 1}")
    if (y <= 0).any() or (y >= 1).any():
        raise ValueError("y must lie strictly inside (0, 1) (a normalised property)")
    sigma1 = _float("sigma1", sigma1, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    beta1 = _float("beta1", beta1, lo=0.0, lo_open=True)
    steps, batch_size = _int("steps", steps, lo=1), _int("batch_size", batch_size, lo=1)
    lr = _float("lr", lr, lo=0.0, lo_open=True)
    g = torch.Generator().manual_seed(_int("seed", seed, lo=0))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for idx in _batches(coords.shape[0], batch_size, steps, g):
        x = model.encoder.to_internal(coords[idx].float(), pocket)
        e = F.one_hot(types[idx].long(), model.n_types).float()
        t = torch.randint(0, 1000, (len(idx),), generator=g).float() / 1000
        mu = bayesian_flow_coord(x, t, sigma1, eps=torch.randn(x.shape, generator=g))
        theta = bayesian_flow_type(e, t, beta1, eps=torch.randn(e.shape, generator=g))
        loss = F.mse_loss(model._pred_internal(mu, theta, t, pocket), y[idx].float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def through_network(bfn: LigandBFN, score: Callable[[Tensor, Tensor], Tensor], pocket: Pocket) -> Objective:
    """A parameter-space objective from a data-space score: ``E(μ, θ, t) = score(Ψ(μ, θ, t))``.

    ``score(x [B, M, 3] Å, p [B, M, K]) → [B]`` in (0, 1) is evaluated on the network's prediction
    ``(x̂, p̂ = softmax(logits))`` and differentiated through ``Ψ`` w.r.t. the parameters, so guidance is still
    in parameter space. Use it for an analytic score (evaluating one on ``μ/γ(t)`` is pure noise early on).
    """
    if not isinstance(bfn, LigandBFN):
        raise TypeError(f"bfn must be a LigandBFN, got {type(bfn).__name__}")
    if not callable(score):
        raise TypeError(f"score must be callable, got {type(score).__name__}")
    pocket = bfn.check_pocket(pocket)

    def objective(mu: Tensor, theta: Tensor, t: Tensor) -> Tensor:
        x_hat, logits = bfn.forward_internal(bfn.to_internal(mu, pocket), theta, t, pocket)
        return score(bfn.to_angstrom(x_hat, pocket), torch.softmax(logits, -1))

    objective.n_types = bfn.n_types  # type: ignore[attr-defined]
    return objective


# ------------------------------------------------------------------------------------------ samplers
@dataclass
class MolJOSample:
    """What :func:`moljo_sample` returns.

    Attributes:
        coords: ``[B, M, 3]`` Å, the final ``x̂``. types: ``[B, M]`` argmax of the final ``p̂``.
        type_probs: ``[B, M, K]`` the final ``p̂``. objective: ``[B]`` mean objective at the final parameters
        (NaN when no objective was given). trajectory: per step ``(x̂, p̂)`` (when requested).
    """

    coords: Tensor
    types: Tensor
    type_probs: Tensor
    objective: Tensor
    trajectory: list[tuple[Tensor, Tensor]] = field(default_factory=list)


def _n_atoms(n_atoms: object, max_atoms: int) -> int:
    n = _int("n_atoms", n_atoms)
    if n <= 0 or n > max_atoms:
        raise ValueError(f"n_atoms must be in 1 .. max_atoms={max_atoms}, got {n}")
    return n


def _objectives(objectives: object, K: int) -> list[Objective]:
    if objectives is None:
        return []
    if callable(objectives):
        objectives = [objectives]
    if not isinstance(objectives, Sequence):
        raise TypeError(
            f"objectives must be a callable or a sequence of callables, got {type(objectives).__name__}"
        )
    out = []
    for j, f in enumerate(objectives):
        if isinstance(f, ParamPropertyModel):
            raise TypeError(f"objectives[{j}] is a ParamPropertyModel: pass model.bind(pocket)")
        if not callable(f):
            raise TypeError(f"objectives[{j}] must be callable, got {type(f).__name__}")
        k = getattr(f, "n_types", None)
        if k is not None and k != K:
            raise ValueError(f"objectives[{j}] expects K={k} atom types but the backbone has K={K}")
        out.append(f)
    return out


def _log_objective(
    f: Objective, j: int, mu: Tensor, theta: Tensor, t: Tensor, kind: str, step: int
) -> Tensor:
    v = f(mu, theta, t)
    if not isinstance(v, Tensor) or v.shape != (mu.shape[0],):
        raise ValueError(f"objectives[{j}] must return a [B] = [{mu.shape[0]}] tensor, got "
                         f"{tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__}")  # fmt: skip
    if not torch.isfinite(v).all():
        raise ValueError(f"objectives[{j}] returned non-finite values at step {step}")
    if kind == "logit":
        return F.logsigmoid(v)
    if (v <= 0).any() or (v >= 1).any():
        raise ValueError(
            f"objectives[{j}] must return values in (0, 1) for log E (got range [{float(v.detach().min()):g}, "
            f"{float(v.detach().max()):g}] at step {step}); return logits with objective_kind='logit'"
        )
    return v.log()


def moljo_sample(bfn: LigandBFN, objectives: Objective | Sequence[Objective] | None, pocket: Pocket,
                 n_atoms: int, n_samples: int = 1, n_steps: int = 200, w_pos: float = 50.0,
                 w_type: float = 50.0, window: int | Literal["full"] = "full", *, guide_types: bool = True,
                 guide_coords: bool = True, objective_kind: Literal["prob", "logit"] = "prob",
                 renormalize_types: bool = False, return_trajectory: bool = False,
                 generator: torch.Generator | None = None) -> MolJOSample:  # fmt: skip
    """MolJO: sample ligands with joint gradient guidance of coordinates and atom types.

    Step ``i = 1 .. n`` (``t_{i−1} = (i − 1)/n``): ``(x̂, p̂) = Ψ(μ_{i−1}, θ_{i−1}, t_{i−1})``; for ``i > 1`` the
    gradients ``g_x = ∇_μ log E``, ``g_h = ∇_θ log E`` (``E`` at ``(μ_{i−1}, θ_{i−1}, t_{i−1})``; the mean
    over objectives: weight an objective by scaling its log yourself) are taken w.r.t. the normalised means and
    the type probabilities. Then

    * ``window="full"`` (official ``end_back_pmf``): ``x̂ ← x̂ + w_pos g_x (1 − γ(t_{i−1}))``,
      ``p̂ ← p̂ + w_type g_h`` (not renormalised unless ``renormalize_types``: clamp at 1e-6 and divide by the
      row sum), and the parameters are redrawn from the Bayesian flow at ``t_i``:
      ``μ_i ~ p_F(·| x̂; t_i)``, ``θ_i = softmax(β(t_i)(K p̂ − 1) + √(β(t_i) K) ε)``;
    * ``window=k`` (official ``vanilla_back_k``): ``x̂ ← x̂ + w_pos g_x / ρ_i``, ``p̂ ← softmax(log p̂ +
      w_type g_h)``; restart from ``(μ_{i−k}, θ_{i−k})``: ``y ~ N(x̂, 1/α_sum)``,
      ``μ_i = (ρ_{i−k} μ_{i−k} + α_sum y)/ρ_i`` with ``α_sum = ρ_i − ρ_{i−k}``; ``k' ~ Cat(p̂)``,
      ``y_h ~ N(α'_sum (K e_{k'} − 1), α'_sum K)``, ``θ_i ∝ e^{y_h} θ_{i−k}``. A window longer than the steps
      taken is clipped to ``i`` (restart from the prior). ``k = 1`` is the plain guided BFN.

    The result is ``Ψ(μ_n, θ_n, 1)``: coordinates ``x̂`` and types ``argmax p̂``.

    Args:
        bfn: a trained :class:`LigandBFN` (put in eval mode; its parameters are not changed).
        objectives: ``None``, one callable or a sequence; each maps ``(mu [B, M, 3] Å, theta [B, M, K],
            t [B]) → [B]``, in (0, 1) (``objective_kind="prob"``) or logits (``"logit"``: ``log σ(·)`` is used).
        pocket: the :class:`Pocket`.
        n_atoms: ligand size M in ``1 .. bfn.max_atoms`` (the atom count is the caller's: the official
            ``sample_num_atoms`` is ``"prior"``, a draw from a size prior of the pocket; ``"ref"`` uses the
            reference ligand's; pass either explicitly).
        n_samples: B. n_steps: n. w_pos, w_type: guidance weights ≥ 0 (official 50, 50).
        window: ``"full"`` or a window length ``k ≥ 1``.
        guide_types, guide_coords: switch off one gradient (``guide_types=False`` is coordinate-only guidance).
        return_trajectory: keep ``(x̂, p̂)`` of every step.
        generator: the noise stream (the global generator is never used).

    Raises ValueError for non-finite gradients (naming the step).
    """
    if not isinstance(bfn, LigandBFN):
        raise TypeError(f"bfn must be a LigandBFN, got {type(bfn).__name__}")
    pocket = bfn.check_pocket(pocket)
    M = _n_atoms(n_atoms, bfn.max_atoms)
    B = _int("n_samples", n_samples, lo=1)
    n = _int("n_steps", n_steps, lo=1)
    w_pos = _float("w_pos", w_pos, lo=0.0)
    w_type = _float("w_type", w_type, lo=0.0)
    if window != "full":
        window = _int("window", window, lo=1)
    if objective_kind not in ("prob", "logit"):
        raise ValueError(f"objective_kind must be 'prob' or 'logit', got {objective_kind!r}")
    for name, flag in (("guide_types", guide_types), ("guide_coords", guide_coords),
                       ("renormalize_types", renormalize_types), ("return_trajectory", return_trajectory)):  # fmt: skip
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    K = bfn.n_types
    objs = _objectives(objectives, K)
    g = make_generator(None, generator)
    sch = BFNSchedule(bfn.sigma1, bfn.beta1, n)
    scale = bfn.pos_scale

    def ang(mu: Tensor) -> Tensor:
        return mu * scale + pocket.center

    mu = torch.zeros(B, M, 3)
    theta = torch.full((B, M, K), 1.0 / K)
    history: list[tuple[Tensor, Tensor]] = []
    traj: list[tuple[Tensor, Tensor]] = []
    guide = bool(objs) and ((w_pos > 0 and guide_coords) or (w_type > 0 and guide_types))
    with torch.no_grad():
        for i in range(1, n + 1):
            t_prev = torch.full((B,), (i - 1) / n)
            x_hat, logits = bfn.forward_internal(mu, theta, t_prev, pocket)
            p_hat = torch.softmax(logits, -1).clamp_min(1e-6)
            history.append((mu, theta))
            g_x = torch.zeros_like(mu)
            g_h = torch.zeros_like(theta)
            if guide and i > 1:
                with torch.enable_grad():
                    m_ = mu.detach().requires_grad_(True)
                    th_ = theta.detach().requires_grad_(True)
                    for j, f in enumerate(objs):
                        lv = _log_objective(f, j, ang(m_), th_, t_prev, objective_kind, i)
                        gx, gh = torch.autograd.grad(lv.sum(), (m_, th_), allow_unused=True)
                        g_x += torch.zeros_like(mu) if gx is None else gx
                        g_h += torch.zeros_like(theta) if gh is None else gh
                g_x, g_h = g_x / len(objs), g_h / len(objs)
                if not (torch.isfinite(g_x).all() and torch.isfinite(g_h).all()):
                    raise ValueError(f"the objective's gradient is non-finite at step {i} of {n}")
                if not guide_coords:
                    g_x.zero_()
                if not guide_types:
                    g_h.zero_()
            t_next = i / n
            k_eff = i if window == "full" else min(window, i)
            if window == "full":
                x_g = x_hat + w_pos * g_x * (1 - sch.gamma((i - 1) / n))
                p_g = p_hat + w_type * g_h
                if renormalize_types:
                    p_g = p_g.clamp_min(1e-6)
                    p_g = p_g / p_g.sum(-1, keepdim=True)
                gam, beta = sch.gamma(t_next), sch.beta(t_next)
                mu = gam * x_g + math.sqrt(gam * (1 - gam)) * torch.randn(mu.shape, generator=g)
                theta = torch.softmax(
                    beta * (K * p_g - 1) + math.sqrt(beta * K) * torch.randn(p_g.shape, generator=g), -1
                )
            else:
                rho_i = sch.rho(i)
                x_g = x_hat + w_pos * g_x / rho_i
                p_g = torch.softmax(p_hat.log() + w_type * g_h, -1)
                mu_b, theta_b = history[i - k_eff]
                a_x, a_h = sch.alpha_coord_sum(i, k_eff), sch.alpha_type_sum(i, k_eff)
                y = x_g + torch.randn(x_g.shape, generator=g) / math.sqrt(a_x)
                mu = (sch.rho(i - k_eff) * mu_b + a_x * y) / rho_i
                k = torch.multinomial(p_g.reshape(-1, K), 1, generator=g).reshape(B, M)
                e_k = F.one_hot(k, K).to(p_g.dtype)
                y_h = a_h * (K * e_k - 1) + math.sqrt(a_h * K) * torch.randn(e_k.shape, generator=g)
                theta = torch.softmax(y_h + theta_b.log(), -1)
            if return_trajectory:
                traj.append((ang(x_g), p_g))
        t1 = torch.ones(B)
        x_hat, logits = bfn.forward_internal(mu, theta, t1, pocket)
        p_hat = torch.softmax(logits, -1)
        if objs:
            vals = []
            for f in objs:
                v = f(ang(mu), theta, t1)
                vals.append(torch.sigmoid(v) if objective_kind == "logit" else v)
            obj = torch.stack(vals).mean(0)
        else:
            obj = torch.full((B,), float("nan"))
    return MolJOSample(ang(x_hat), p_hat.argmax(-1), p_hat, obj, traj)


def bfn_sample(bfn: LigandBFN, pocket: Pocket, n_atoms: int, n_samples: int = 1, n_steps: int = 200, *,
               generator: torch.Generator | None = None) -> MolJOSample:  # fmt: skip
    """The plain (unguided) BFN sampler of Graves et al. (Algorithms 3 and 9): per step
    ``y ~ N(x̂, 1/α_i)``, ``μ_i = (ρ_{i−1} μ_{i−1} + α_i y)/ρ_i``; ``k ~ Cat(p̂)``,
    ``y_h ~ N(α_i(K e_k − 1), α_i K)``, ``θ_i ∝ e^{y_h} θ_{i−1}``. Same arguments as :func:`moljo_sample`
    (the same generator draws make ``moljo_sample(window=1)`` without guidance equal to it bit for bit)."""
    if not isinstance(bfn, LigandBFN):
        raise TypeError(f"bfn must be a LigandBFN, got {type(bfn).__name__}")
    pocket = bfn.check_pocket(pocket)
    M = _n_atoms(n_atoms, bfn.max_atoms)
    B = _int("n_samples", n_samples, lo=1)
    n = _int("n_steps", n_steps, lo=1)
    g = make_generator(None, generator)
    sch = BFNSchedule(bfn.sigma1, bfn.beta1, n)
    K = bfn.n_types
    mu = torch.zeros(B, M, 3)
    theta = torch.full((B, M, K), 1.0 / K)
    with torch.no_grad():
        for i in range(1, n + 1):
            x_hat, logits = bfn.forward_internal(mu, theta, torch.full((B,), (i - 1) / n), pocket)
            p_hat = torch.softmax(logits, -1).clamp_min(1e-6)
            p_hat = torch.softmax(p_hat.log(), -1)
            a_x, a_h = sch.alpha_coord(i), sch.alpha_type(i)
            y = x_hat + torch.randn(x_hat.shape, generator=g) / math.sqrt(a_x)
            mu = (sch.rho(i - 1) * mu + a_x * y) / sch.rho(i)
            k = torch.multinomial(p_hat.reshape(-1, K), 1, generator=g).reshape(B, M)
            e_k = F.one_hot(k, K).to(p_hat.dtype)
            y_h = a_h * (K * e_k - 1) + math.sqrt(a_h * K) * torch.randn(e_k.shape, generator=g)
            theta = torch.softmax(y_h + theta.log(), -1)
        x_hat, logits = bfn.forward_internal(mu, theta, torch.ones(B), pocket)
        p_hat = torch.softmax(logits, -1)
    return MolJOSample(
        bfn.to_angstrom(x_hat, pocket), p_hat.argmax(-1), p_hat, torch.full((B,), float("nan"))
    )


# ------------------------------------------------------------------------------------------ toy task
class ToyPocketTask:
    """The reproduction's toy structure-based task: a spherical pocket and a known contact score.

    Pocket: ``n_pocket`` atoms on a Fibonacci sphere of radius ``radius`` Å with ``n_pocket_types`` types
    (seeded). Ligands: chains of ``n_atoms`` atoms, 1.5 Å bonds, bond angle ~ 110°, random torsions, centred
    near the pocket centre; types i.i.d. with ``type_freq``. Score (differentiable, data space)::

        score(x, p) = Σ_l Σ_a p[l, a] Σ_q A[a, type_q] exp(−(r_lq − 3.5)²)
                      − Σ_{l,q} relu(2 − r_lq) − Σ_{non-bonded l<l'} relu(2 − r_ll')

    with ``p`` one-hot types or soft probabilities (the expected score). ``A [K, n_pocket_types]`` has
    type-specific signs; the best type ``l*`` maximises ``Σ_q A[l, type_q]``.
    """

    A_DEFAULT = ((0.6, -0.6, 0.2), (1.0, 0.8, 0.6), (-0.8, 0.4, -0.6), (0.2, -0.4, 0.8))

    def __init__(self, n_pocket: int = 24, n_pocket_types: int = 3, radius: float = 4.0, n_atoms: int = 7,
                 type_freq: Sequence[float] = (0.5, 0.2, 0.2, 0.1), A: Sequence[Sequence[float]] | None = None,
                 seed: int = 0) -> None:  # fmt: skip
        self.n_pocket = _int("n_pocket", n_pocket, lo=1)
        self.n_pocket_types = _int("n_pocket_types", n_pocket_types, lo=1)
        self.radius = _float("radius", radius, lo=0.0, lo_open=True)
        self.n_atoms = _int("n_atoms", n_atoms, lo=2)
        freq = torch.as_tensor(np.asarray(type_freq, dtype=np.float64))
        if (
            freq.ndim != 1
            or freq.numel() < 2
            or not torch.isfinite(freq).all()
            or (freq < 0).any()
            or freq.sum() <= 0
        ):
            raise ValueError(f"type_freq must be >= 2 non-negative finite weights, got {list(type_freq)}")
        self.type_freq = (freq / freq.sum()).float()
        self.n_types = freq.numel()
        A_t = torch.as_tensor(np.asarray(self.A_DEFAULT if A is None else A, dtype=np.float32))
        if A_t.shape != (self.n_types, self.n_pocket_types) or not torch.isfinite(A_t).all():
            raise ValueError(
                f"A must be a finite [{self.n_types}, {self.n_pocket_types}] matrix, got shape {tuple(A_t.shape)}"
            )
        self.A = A_t
        g = torch.Generator().manual_seed(_int("seed", seed, lo=0))
        k = torch.arange(self.n_pocket, dtype=torch.float64) + 0.5
        phi = torch.arccos(1 - 2 * k / self.n_pocket)
        th = math.pi * (1 + 5**0.5) * k
        pts = torch.stack(
            [torch.cos(th) * torch.sin(phi), torch.sin(th) * torch.sin(phi), torch.cos(phi)], -1
        )
        types = torch.randint(0, self.n_pocket_types, (self.n_pocket,), generator=g)
        self.pocket = Pocket((self.radius * pts).float(), types)
        counts = torch.bincount(types, minlength=self.n_pocket_types).float()
        self.best_type = int((self.A @ counts).argmax())

    def sample_ligands(self, n: int, *, seed: int = 0) -> tuple[Tensor, Tensor]:
        """``n`` reference ligands: ``coords [n, M, 3]`` Å and ``types [n, M]``."""
        n = _int("n", n, lo=1)
        g = torch.Generator().manual_seed(_int("seed", seed, lo=0))
        M, bond, ang = self.n_atoms, 1.5, math.radians(110.0)
        x = torch.zeros(n, M, 3, dtype=torch.float64)
        x[:, 1, 0] = bond
        x[:, 2, 0] = bond - bond * math.cos(ang)
        x[:, 2, 1] = bond * math.sin(ang)
        for j in range(3, M):
            a, b, c = x[:, j - 3], x[:, j - 2], x[:, j - 1]
            tors = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * math.pi
            bc = F.normalize(c - b, dim=-1)
            nrm = F.normalize(torch.cross(b - a, bc, dim=-1), dim=-1)
            m = torch.cross(nrm, bc, dim=-1)
            d = torch.stack([-bond * math.cos(ang) * torch.ones(n, dtype=torch.float64),
                             bond * math.sin(ang) * torch.cos(tors), bond * math.sin(ang) * torch.sin(tors)], -1)  # fmt: skip
            x[:, j] = c + d[:, :1] * bc + d[:, 1:2] * m + d[:, 2:3] * nrm
        x = x - x.mean(1, keepdim=True)
        q, _ = torch.linalg.qr(torch.randn(n, 3, 3, generator=g, dtype=torch.float64))
        x = x @ q + 0.5 * torch.randn(n, 1, 3, generator=g, dtype=torch.float64)
        types = torch.multinomial(self.type_freq, n * M, replacement=True, generator=g).reshape(n, M)
        return (x.float() + self.pocket.center), types

    def score(self, x: Tensor, p: Tensor) -> Tensor:
        """The toy score ``[B]`` of coordinates ``x [B, M, 3]`` Å and types ``p`` (``[B, M]`` ints or
        ``[B, M, K]`` probabilities)."""
        x = _tensor("x", x, 3, last=3)
        if not p.is_floating_point():
            p = F.one_hot(_tensor("p", p, 2, floating=False).long(), self.n_types).to(x.dtype)
        p = _tensor("p", p, 3, last=self.n_types)
        return self._score(x, p)

    def _score(self, x: Tensor, p: Tensor) -> Tensor:
        xp = self.pocket.coords.to(x.dtype)
        r = ((x[:, :, None] - xp[None, None]) ** 2).sum(-1).clamp_min(1e-12).sqrt()  # [B, M, P]
        affinity = p @ self.A.to(x.dtype)[:, self.pocket.types]  # [B, M, P]
        contact = (affinity * torch.exp(-((r - 3.5) ** 2))).sum((1, 2))
        clash_p = F.relu(2.0 - r).sum((1, 2))
        M = x.shape[1]
        rl = ((x[:, :, None] - x[:, None]) ** 2).sum(-1).clamp_min(1e-12).sqrt()
        nb = torch.triu(torch.ones(M, M, dtype=torch.bool), diagonal=2)
        clash_l = F.relu(2.0 - rl[:, nb]).sum(1)
        return contact - clash_p - clash_l

    def objective(self, center: float, scale: float) -> Callable[[Tensor, Tensor], Tensor]:
        """The normalised score ``σ((score − center)/scale) ∈ (0, 1)`` as a data-space callable
        ``(x, p) → [B]`` (wrap it with :func:`through_network` for guidance)."""
        center = _float("center", center)
        scale = _float("scale", scale, lo=0.0, lo_open=True)

        def fn(x: Tensor, p: Tensor) -> Tensor:
            return torch.sigmoid((self._score(x, p) - center) / scale).clamp(1e-7, 1 - 1e-7)

        fn.n_types = self.n_types  # type: ignore[attr-defined]
        return fn

    def metrics(self, coords: Tensor, types: Tensor, score_threshold: float) -> dict[str, Tensor]:
        """Per-molecule ``score``, ``valid`` (no contact < 1.0 Å to the pocket or between non-bonded ligand
        atoms, and every chain bond 1.2–1.8 Å), ``success`` (valid and score ≥ ``score_threshold``) and
        ``best_type_frac`` (the fraction of atoms of type ``l*``)."""
        coords = _tensor("coords", coords, 3, last=3)
        types = _tensor("types", types, 2, floating=False)
        score = self.score(coords, types)
        r = torch.cdist(coords, self.pocket.coords[None].expand(coords.shape[0], -1, -1))
        rl = torch.cdist(coords, coords)
        M = coords.shape[1]
        nb = torch.triu(torch.ones(M, M, dtype=torch.bool), diagonal=2)
        bonds = rl[:, torch.arange(M - 1), torch.arange(1, M)]
        valid = (
            (r.amin((1, 2)) >= 1.0)
            & (rl[:, nb].amin(1) >= 1.0)
            & (bonds >= 1.2).all(1)
            & (bonds <= 1.8).all(1)
        )
        return {
            "score": score,
            "valid": valid,
            "success": valid & (score >= score_threshold),
            "best_type_frac": (types == self.best_type).float().mean(1),
        }
