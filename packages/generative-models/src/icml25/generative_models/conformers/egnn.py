"""Efficient Molecular Conformer Generation with SO(3)-Averaged Flow Matching and Reflow — ICML 2025, P15: EGNN backbone.

A small E(3)-equivariant graph network (Satorras, Hoogeboom & Welling, 2021) used as the velocity field
``v_θ(X_t, t, G)`` of the conformer flows: messages over the fully connected graph of a molecule's
(padded) atoms with the bond type as an edge feature, invariant feature updates and equivariant
coordinate updates. The paper's backbone is a larger equivariant network; this one is pure torch
(no torch_geometric) and small enough for CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from icml25.kernels.checks import check_int

__all__ = ["EGNN", "MolGraph"]

N_BOND_TYPES = 5
"""Bond classes of :class:`MolGraph`: 0 none, 1 single, 2 double, 3 triple, 4 aromatic."""


@dataclass(frozen=True)
class MolGraph:
    """A batch of padded molecular graphs.

    Attributes:
        atom_types: ``(B, N)`` int64 atom classes (padding: any value, ignored).
        bond_types: ``(B, N, N)`` int64 bond classes, symmetric, 0 = no bond (see :data:`N_BOND_TYPES`).
        mask: ``(B, N)`` bool, ``True`` for real atoms; every molecule has at least one atom.
    """

    atom_types: torch.Tensor
    bond_types: torch.Tensor
    mask: torch.Tensor

    def __post_init__(self) -> None:
        a, b, m = self.atom_types, self.bond_types, self.mask
        for name, x in (("atom_types", a), ("bond_types", b), ("mask", m)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"MolGraph.{name} must be a torch.Tensor, got {type(x).__name__}")
        if a.dim() != 2 or a.dtype != torch.int64:
            raise ValueError(
                f"MolGraph.atom_types must be int64 of shape (B, N), got {a.dtype} {tuple(a.shape)}"
            )
        B, N = a.shape
        if tuple(b.shape) != (B, N, N) or b.dtype != torch.int64:
            raise ValueError(
                f"MolGraph.bond_types must be int64 of shape {(B, N, N)}, got {b.dtype} {tuple(b.shape)}"
            )
        if tuple(m.shape) != (B, N) or m.dtype != torch.bool:
            raise ValueError(f"MolGraph.mask must be bool of shape {(B, N)}, got {m.dtype} {tuple(m.shape)}")
        if N == 0:
            raise ValueError(f"MolGraph must have at least one atom slot, got shape {(B, N)}")
        if B and not bool(m.any(-1).all()):
            raise ValueError("MolGraph.mask must keep at least one atom per molecule, got an all-padded row")
        if b.numel() and (int(b.min()) < 0 or int(b.max()) >= N_BOND_TYPES):
            raise ValueError(
                f"MolGraph.bond_types must lie in [0, {N_BOND_TYPES}), got [{int(b.min())}, {int(b.max())}]"
            )
        if a.numel() and int(a.min()) < 0:
            raise ValueError(f"MolGraph.atom_types must be non-negative, got min {int(a.min())}")

    @property
    def batch_size(self) -> int:
        return int(self.atom_types.shape[0])

    @property
    def n_atoms(self) -> int:
        """Padded number of atom slots ``N``."""
        return int(self.atom_types.shape[1])

    def index(self, idx: torch.Tensor | slice) -> MolGraph:
        """The sub-batch ``idx`` (a slice or an index tensor over ``B``)."""
        return MolGraph(self.atom_types[idx], self.bond_types[idx], self.mask[idx])

    def repeat(self, n: int) -> MolGraph:
        """Each molecule repeated ``n`` times consecutively (``B·n`` graphs)."""
        return MolGraph(
            self.atom_types.repeat_interleave(n, 0),
            self.bond_types.repeat_interleave(n, 0),
            self.mask.repeat_interleave(n, 0),
        )


def _time_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features ``(B, dim)`` of ``t (B,)`` in [0, 1]."""
    freqs = torch.exp(torch.linspace(0.0, math.log(100.0), dim // 2, dtype=t.dtype))
    ang = 2 * math.pi * t[:, None] * freqs
    return torch.cat([ang.sin(), ang.cos()], -1)


class _Layer(nn.Module):
    """One EGNN layer. The first edge linear map on ``[h_i, h_j, d_ij², e_ij]`` is split into per-node and
    per-edge parts (the same function, computed once per atom instead of once per pair)."""

    def __init__(self, hidden: int, edge_dim: int) -> None:
        super().__init__()
        self.src = nn.Linear(hidden, hidden)
        self.dst = nn.Linear(hidden, hidden, bias=False)
        self.edge = nn.Linear(edge_dim + 1, hidden, bias=False)
        self.phi_e = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.phi_x = nn.Linear(hidden, 1)
        self.phi_h = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(
        self, h: torch.Tensor, x: torch.Tensor, e: torch.Tensor, pair: torch.Tensor, inv_n: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        diff = x[:, :, None, :] - x[:, None, :, :]  # (B, N, N, 3)
        d2 = (diff**2).sum(-1, keepdim=True)
        pre = self.src(h)[:, :, None, :] + self.dst(h)[:, None, :, :] + self.edge(torch.cat([e, d2], -1))
        m = self.phi_e(pre) * pair[..., None]  # (B, N, N, H)
        coef = self.phi_x(m) * pair[..., None]
        x = x + (diff / ((d2 + 1e-8).sqrt() + 1.0) * coef).sum(2) * inv_n[:, None, None]
        h = h + self.phi_h(torch.cat([h, m.sum(2) * inv_n[:, None, None]], -1))
        return h, x


class EGNN(nn.Module):
    """E(3)-equivariant velocity network ``v_θ(X_t, t, G)``.

    ``forward(x (B, N, 3), t (B,), graph: MolGraph) -> (B, N, 3)``: centred (zero CoM over real atoms),
    zero at padded atoms, rotation-equivariant (``v(XQ) = v(X)Q``) and translation-invariant.
    Hidden features start from an atom-type embedding plus a sinusoidal time embedding; each of
    ``n_layers`` layers passes messages over all atom pairs with the bond type (embedded) as edge feature.
    """

    def __init__(
        self, n_atom_types: int = 16, hidden: int = 64, n_layers: int = 4, edge_dim: int = 16
    ) -> None:
        super().__init__()
        for name, v in (
            ("n_atom_types", n_atom_types),
            ("hidden", hidden),
            ("n_layers", n_layers),
            ("edge_dim", edge_dim),
        ):
            check_int(v, name, low=1)
        self.n_atom_types = n_atom_types
        self.atom_emb = nn.Embedding(n_atom_types, hidden)
        self.bond_emb = nn.Embedding(N_BOND_TYPES, edge_dim)
        self.time_mlp = nn.Sequential(nn.Linear(16, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.layers = nn.ModuleList(_Layer(hidden, edge_dim) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, t: torch.Tensor, graph: MolGraph) -> torch.Tensor:
        """Velocities ``(B, N, 3)``; NaN/Inf in ``x`` propagate (no host sync on the hot path)."""
        if not isinstance(graph, MolGraph):
            raise TypeError(f"graph must be a MolGraph, got {type(graph).__name__}")
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
        B, N = graph.batch_size, graph.n_atoms
        if tuple(x.shape) != (B, N, 3):
            raise ValueError(f"x must have shape {(B, N, 3)} to match graph, got {tuple(x.shape)}")
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (B,):
            raise ValueError(
                f"t must be a tensor of shape ({B},), got {getattr(t, 'shape', type(t).__name__)}"
            )
        if B and int(graph.atom_types.max()) >= self.n_atom_types:
            raise ValueError(
                f"graph.atom_types must be < n_atom_types={self.n_atom_types}, got max {int(graph.atom_types.max())}"
            )
        mask = graph.mask.to(x.dtype)
        pair = mask[:, :, None] * mask[:, None, :] * (1 - torch.eye(x.shape[1], dtype=x.dtype))
        inv_n = 1.0 / mask.sum(-1).clamp_min(2.0)
        h = (
            self.atom_emb(graph.atom_types.clamp(0, self.n_atom_types - 1))
            + self.time_mlp(_time_features(t.to(x.dtype), 16))[:, None, :]
        )
        e = self.bond_emb(graph.bond_types)
        x0 = x
        for layer in self.layers:
            h, x = layer(h, x, e, pair, inv_n)
        v = (x - x0) * mask[..., None]
        com = v.sum(1, keepdim=True) / mask.sum(-1).clamp_min(1.0)[:, None, None]
        return (v - com) * mask[..., None]
