"""Empower Structure-Based Molecule Optimization with Gradient Guided Bayesian Flow Networks — ICML 2025, P40: RDKit ligand and pocket I/O.

Qiu et al., ICML 2025 (arXiv 2411.13280; official code ``AlgoMole/MolCRAFT``, folder ``MolJO/``, which reads
pockets from PDB files and rebuilds ligand bonds with OpenBabel). Here: a :class:`~icml25.generative_models.
moljo.Pocket` from a PDB block (``Chem.MolFromPDBBlock``), a ligand ``(coords, types)`` from an RDKit ``Mol``
with a conformer, and sampled ``(coords, types)`` back to a ``Mol`` whose bonds RDKit's ``rdDetermineBonds``
infers from the geometry (connectivity only, or bond orders too). Needs the ``chem`` extra.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

try:
    from rdkit import Chem
    from rdkit.Chem import rdDetermineBonds
    from rdkit.Geometry import Point3D
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "MolJO's ligand and pocket I/O needs RDKit: pip install 'icml25-generative-models[chem]'"
    ) from exc

from icml25.generative_models.moljo import Pocket

__all__ = ["ligand_from_mol", "ligand_to_mol", "pocket_from_pdb_block"]


def _elements(name: str, elements: Sequence[str]) -> list[str]:
    if isinstance(elements, str) or not isinstance(elements, Sequence) or not elements:
        raise TypeError(f"{name} must be a non-empty sequence of element symbols, got {elements!r}")
    out = []
    table = Chem.GetPeriodicTable()
    known = {table.GetElementSymbol(z) for z in range(1, 119)}
    for e in elements:
        if not isinstance(e, str) or e not in known:
            raise ValueError(f"{name} must hold element symbols such as 'C', got {e!r}")
        out.append(e)
    return out


def pocket_from_pdb_block(pdb_block: str, elements: Sequence[str], *, center: Sequence[float] | None = None,
                          radius: float | None = None, keep_hydrogens: bool = False) -> Pocket:  # fmt: skip
    """A :class:`Pocket` from a PDB block: atom coordinates (Å) and type = index of the element in
    ``elements`` (elements not listed get the extra type ``len(elements)``).

    ``center``/``radius``: keep only atoms within ``radius`` Å of ``center`` (the official pocket is the
    residues within 10 Å of the reference ligand).
    """
    if not isinstance(pdb_block, str) or not pdb_block.strip():
        raise ValueError("pdb_block must be a non-empty PDB string")
    elements = _elements("elements", elements)
    mol = Chem.MolFromPDBBlock(pdb_block, removeHs=False, sanitize=False)
    if mol is None or mol.GetNumAtoms() == 0 or mol.GetNumConformers() == 0:
        raise ValueError("pdb_block must hold at least one atom with coordinates (RDKit parsed none)")
    keep_atoms = [a.GetIdx() for a in mol.GetAtoms() if keep_hydrogens or a.GetAtomicNum() != 1]
    if not keep_atoms:
        raise ValueError("pdb_block must hold at least one heavy atom (or pass keep_hydrogens=True)")
    coords = torch.as_tensor(np.asarray(mol.GetConformer().GetPositions())[keep_atoms], dtype=torch.float32)
    index = {e: i for i, e in enumerate(elements)}
    symbols = [mol.GetAtomWithIdx(i).GetSymbol() for i in keep_atoms]
    types = torch.tensor([index.get(s, len(elements)) for s in symbols], dtype=torch.long)
    if center is not None or radius is not None:
        if center is None or radius is None:
            raise ValueError("center and radius must be given together")
        c = torch.as_tensor(np.asarray(center, dtype=np.float64), dtype=torch.float32)
        if c.shape != (3,) or not torch.isfinite(c).all():
            raise ValueError(f"center must be 3 finite numbers, got {center!r}")
        if not (isinstance(radius, (int, float)) and np.isfinite(radius) and radius > 0):
            raise ValueError(f"radius must be a positive finite number of Å, got {radius!r}")
        keep = (coords - c).norm(dim=1) <= radius
        if not keep.any():
            raise ValueError(f"no pocket atom lies within radius={radius} Å of center={list(center)}")
        coords, types = coords[keep], types[keep]
    return Pocket(coords, types)


def ligand_from_mol(mol: Chem.Mol, elements: Sequence[str]) -> tuple[Tensor, Tensor]:
    """``(coords [M, 3] Å, types [M])`` of a ligand ``Mol`` with a conformer (heavy atoms; every element
    must be in ``elements``)."""
    if not isinstance(mol, Chem.Mol):
        raise TypeError(f"mol must be an rdkit Chem.Mol, got {type(mol).__name__}")
    elements = _elements("elements", elements)
    mol = Chem.RemoveHs(mol, sanitize=False)
    if mol.GetNumAtoms() == 0 or mol.GetNumConformers() == 0:
        raise ValueError("mol must have at least one heavy atom and a 3D conformer")
    index = {e: i for i, e in enumerate(elements)}
    missing = sorted({a.GetSymbol() for a in mol.GetAtoms()} - set(index))
    if missing:
        raise ValueError(f"mol has elements {missing} that are not in elements={elements}")
    coords = torch.as_tensor(np.asarray(mol.GetConformer().GetPositions()), dtype=torch.float32)
    types = torch.tensor([index[a.GetSymbol()] for a in mol.GetAtoms()], dtype=torch.long)
    return coords, types


def ligand_to_mol(coords: Tensor, types: Tensor, elements: Sequence[str], *, bond_orders: bool = False,
                  charge: int = 0) -> Chem.Mol:  # fmt: skip
    """An RDKit ``Mol`` from sampled ``coords [M, 3]`` Å and ``types [M]`` (indices into ``elements``), with
    bonds inferred from the geometry (``rdDetermineBonds.DetermineConnectivity``; ``bond_orders=True`` also
    assigns orders with ``DetermineBondOrders``, which may fail on a non-chemical geometry: ValueError)."""
    elements = _elements("elements", elements)
    if not isinstance(coords, Tensor) or not isinstance(types, Tensor):
        raise TypeError(
            f"coords and types must be torch tensors, got {type(coords).__name__}, {type(types).__name__}"
        )
    if coords.ndim != 2 or coords.shape[-1] != 3 or coords.shape[0] == 0:
        raise ValueError(f"coords must have shape [M, 3] with M >= 1, got {tuple(coords.shape)}")
    if not torch.isfinite(coords).all():
        raise ValueError("coords must be finite")
    if types.shape != coords.shape[:1] or types.is_floating_point():
        raise ValueError(
            f"types must be [M] = [{coords.shape[0]}] integers, got {tuple(types.shape)} {types.dtype}"
        )
    if (types < 0).any() or (types >= len(elements)).any():
        raise ValueError(f"types must index elements (0 .. {len(elements) - 1})")
    rw = Chem.RWMol()
    conf = Chem.Conformer(coords.shape[0])
    for j, (t, xyz) in enumerate(zip(types.tolist(), coords.double().tolist())):
        rw.AddAtom(Chem.Atom(elements[t]))
        conf.SetAtomPosition(j, Point3D(*xyz))
    rw.AddConformer(conf, assignId=True)
    mol = rw.GetMol()
    try:
        if bond_orders:
            rdDetermineBonds.DetermineBonds(mol, charge=int(charge))
        else:
            rdDetermineBonds.DetermineConnectivity(mol)
    except (ValueError, RuntimeError) as err:
        raise ValueError(f"RDKit could not determine the bonds of this geometry: {err}") from None
    return mol
