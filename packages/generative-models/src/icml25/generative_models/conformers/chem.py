"""Efficient Molecular Conformer Generation with SO(3)-Averaged Flow Matching and Reflow — ICML 2025, P15: molecules and metrics.

RDKit in and out (the ``[chem]`` extra, imported lazily inside the functions that need it): SMILES to
heavy-atom molecules with ETKDG + MMFF reference conformers, molecules to padded :class:`MolGraph` batches,
generated coordinates back into an RDKit ``Mol`` as conformers (hydrogens optionally re-added with
coordinates), and the GEOM conformer metrics COV/AMR (recall and precision) from heavy-atom RMSD after
alignment, symmetry-aware through ``rdkit.Chem.rdMolAlign.GetBestRMS`` when a molecule is given (plain
Kabsch RMSD otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from icml25.generative_models.conformers.egnn import MolGraph
from icml25.generative_models.conformers.so3 import kabsch_rotation
from icml25.kernels.checks import check_int, check_tensor

__all__ = [
    "ATOM_TYPES",
    "conformer_coords",
    "coverage_amr",
    "embed_conformers",
    "mols_to_graph",
    "rmsd_matrix",
    "sample_conformers",
    "with_conformers",
]

ATOM_TYPES = (6, 7, 8, 9, 15, 16, 17, 35, 1)
"""Atomic numbers of the atom classes of :func:`mols_to_graph` (index = class): C N O F P S Cl Br H."""

_BOND = {"SINGLE": 1, "DOUBLE": 2, "TRIPLE": 3, "AROMATIC": 4}


def _rdkit() -> tuple[Any, Any, Any]:
    try:
        from rdkit import Chem
        from rdkit.Chem import AllChem, rdMolAlign
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "RDKit molecules and symmetry-aware RMSD need rdkit: pip install 'icml25-generative-models[chem]'"
        ) from exc
    return Chem, AllChem, rdMolAlign


def _check_mol(mol: object, name: str = "mol") -> Any:
    Chem, _, _ = _rdkit()
    if not isinstance(mol, Chem.Mol):
        raise TypeError(f"{name} must be an rdkit.Chem.Mol, got {type(mol).__name__}")
    if mol.GetNumAtoms() == 0:
        raise ValueError(f"{name} must have at least one atom, got an empty molecule")
    return mol


def embed_conformers(smiles: str, n: int, *, seed: int = 0, mmff: bool = True) -> Any:
    """A heavy-atom RDKit ``Mol`` of ``smiles`` carrying ``n`` ETKDG conformers (MMFF-relaxed with
    hydrogens when ``mmff``), the reference conformers of the reproduction."""
    Chem, AllChem, _ = _rdkit()
    if not isinstance(smiles, str) or not smiles:
        raise ValueError(f"smiles must be a non-empty SMILES string, got {smiles!r}")
    n = check_int(n, "n", low=1)
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"smiles must be a valid SMILES string, got {smiles!r} (RDKit could not parse it)")
    molh = Chem.AddHs(mol)
    params = AllChem.ETKDGv3()
    params.randomSeed = int(seed)
    ids = list(AllChem.EmbedMultipleConfs(molh, numConfs=n, params=params))
    if len(ids) < n:
        raise ValueError(f"ETKDG embedded only {len(ids)} of n={n} conformers for {smiles!r}")
    if mmff:
        AllChem.MMFFOptimizeMoleculeConfs(molh, maxIters=500)
    return Chem.RemoveHs(molh)


def conformer_coords(mol: Any) -> np.ndarray:
    """The coordinates ``(K, N, 3)`` (float64, Å) of the ``K`` conformers of ``mol``."""
    mol = _check_mol(mol)
    confs = list(mol.GetConformers())
    if not confs:
        raise ValueError("mol must carry at least one conformer, got none")
    return np.stack([c.GetPositions() for c in confs]).astype(np.float64)


def mols_to_graph(mols: Sequence[Any], n_atoms: int | None = None) -> MolGraph:
    """Pad molecules into a :class:`MolGraph` (atom classes from :data:`ATOM_TYPES`, bond classes 1–4).

    ``n_atoms`` is the padded size ``N`` (default: the largest molecule)."""
    _rdkit()
    if isinstance(mols, (str, bytes)) or not isinstance(mols, Sequence) or len(mols) == 0:
        raise ValueError(f"mols must be a non-empty sequence of rdkit Mol, got {type(mols).__name__}")
    mols = [_check_mol(m, f"mols[{i}]") for i, m in enumerate(mols)]
    big = max(m.GetNumAtoms() for m in mols)
    N = big if n_atoms is None else n_atoms
    if isinstance(N, bool) or not isinstance(N, int) or N < big:
        raise ValueError(f"n_atoms must be an int >= the largest molecule ({big} atoms), got {n_atoms!r}")
    B = len(mols)
    atoms = torch.zeros(B, N, dtype=torch.int64)
    bonds = torch.zeros(B, N, N, dtype=torch.int64)
    mask = torch.zeros(B, N, dtype=torch.bool)
    for b, m in enumerate(mols):
        for a in m.GetAtoms():
            z = a.GetAtomicNum()
            if z not in ATOM_TYPES:
                raise ValueError(f"mols[{b}] has element Z={z}; supported atomic numbers are {ATOM_TYPES}")
            atoms[b, a.GetIdx()] = ATOM_TYPES.index(z)
            mask[b, a.GetIdx()] = True
        for bd in m.GetBonds():
            i, j = bd.GetBeginAtomIdx(), bd.GetEndAtomIdx()
            bonds[b, i, j] = bonds[b, j, i] = _BOND.get(str(bd.GetBondType()), 1)
    return MolGraph(atoms, bonds, mask)


def with_conformers(mol: Any, coords: np.ndarray | torch.Tensor, *, add_hs: bool = False) -> Any:
    """A copy of ``mol`` whose conformers are ``coords (K, N, 3)`` (Å, ``N`` = the atoms of ``mol``);
    ``add_hs=True`` adds hydrogens with coordinates placed by RDKit."""
    Chem, _, _ = _rdkit()
    mol = _check_mol(mol)
    x = _float_array(coords, "coords").double()
    n = mol.GetNumAtoms()
    if x.dim() != 3 or tuple(x.shape[1:]) != (n, 3):
        raise ValueError(f"coords must have shape (K, {n}, 3) for this molecule, got {tuple(x.shape)}")
    check_tensor(x, "coords")
    out = Chem.Mol(mol)
    out.RemoveAllConformers()
    for k in range(x.shape[0]):
        conf = Chem.Conformer(n)
        for i in range(n):
            conf.SetAtomPosition(i, x[k, i].tolist())
        out.AddConformer(conf, assignId=True)
    if add_hs:
        out = Chem.AddHs(out, addCoords=True)
    return out


def sample_conformers(
    model: Any, mol: Any, n: int, *, n_steps: int = 20, seed: int = 0, add_hs: bool = False
) -> Any:
    """``n`` conformers of ``mol`` generated by a :class:`ConformerFlow` (``n_steps`` Euler steps), returned
    as a copy of ``mol`` carrying them (heavy atoms; ``add_hs`` re-adds hydrogens with coordinates)."""
    from icml25.generative_models.conformers.flow import ConformerFlow

    if not isinstance(model, ConformerFlow):
        raise TypeError(f"model must be a ConformerFlow, got {type(model).__name__}")
    mol = _check_mol(mol)
    n = check_int(n, "n", low=1)
    graph = mols_to_graph([mol]).repeat(n)
    x = model.sample(graph, n_steps, generator=torch.Generator().manual_seed(seed))
    return with_conformers(mol, x, add_hs=add_hs)


def _float_array(x: object, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x
    else:
        a = np.asarray(x)
        if a.dtype.kind not in "fiub":
            raise TypeError(f"{name} must hold float coordinates, got a {a.dtype} array")
        t = torch.from_numpy(np.ascontiguousarray(a))
    if not t.is_floating_point():
        raise TypeError(f"{name} must hold float coordinates, got dtype {t.dtype}")
    return t


def _stack(x: object, name: str) -> torch.Tensor:
    if isinstance(x, (list, tuple)):
        x = np.stack([np.asarray(a) for a in x]) if len(x) else np.zeros((0, 0, 3))
    t = _float_array(x, name)
    if not t.is_floating_point():
        raise TypeError(f"{name} must hold float coordinates, got dtype {t.dtype}")
    if t.dim() != 3 or t.shape[-1] != 3 or t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(f"{name} must have shape (K >= 1, N >= 1, 3), got {tuple(t.shape)}")
    check_tensor(t, name)
    return t.double()


def rmsd_matrix(gen: object, ref: object, mol: Any = None) -> np.ndarray:
    """Heavy-atom RMSD after optimal alignment, ``(G, R)``, between ``gen (G, N, 3)`` and ``ref (R, N, 3)``.

    With ``mol`` (an RDKit ``Mol`` of those ``N`` atoms) the RMSD is symmetry-aware
    (``rdMolAlign.GetBestRMS``: the best over the molecule's graph automorphisms); without it, plain
    Kabsch RMSD with atoms matched by index.
    """
    g, r = _stack(gen, "gen"), _stack(ref, "ref")
    if g.shape[1] != r.shape[1]:
        raise ValueError(f"gen and ref must have the same atoms, got N = {g.shape[1]} and {r.shape[1]}")
    if mol is None:
        a = r[None].expand(g.shape[0], *r.shape).reshape(-1, *r.shape[1:])
        b = g[:, None].expand(g.shape[0], r.shape[0], *g.shape[1:]).reshape(-1, *g.shape[1:])
        a = a - a.mean(1, keepdim=True)
        b = b - b.mean(1, keepdim=True)
        R = kabsch_rotation(a, b)
        d = ((a - b @ R.transpose(1, 2)) ** 2).sum(-1).mean(-1).sqrt()
        return d.reshape(g.shape[0], r.shape[0]).numpy()
    _, _, rdMolAlign = _rdkit()
    mol = _check_mol(mol)
    probe, target = with_conformers(mol, g), with_conformers(mol, r)
    out = np.zeros((g.shape[0], r.shape[0]))
    for i in range(g.shape[0]):
        for j in range(r.shape[0]):
            out[i, j] = rdMolAlign.GetBestRMS(probe, target, prbId=i, refId=j)
    return out


def coverage_amr(gen: object, ref: object, delta: float, mol: Any = None) -> dict[str, float]:
    """GEOM conformer metrics of generated ``gen (G, N, 3)`` against reference ``ref (R, N, 3)``.

    ``cov_r``: fraction of references within ``delta`` Å of some generated conformer; ``amr_r``: mean over
    references of the smallest RMSD; ``cov_p`` / ``amr_p``: the same with the roles swapped. RMSDs from
    :func:`rmsd_matrix` (symmetry-aware when ``mol`` is given).
    """
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not np.isfinite(delta) or delta <= 0:
        raise ValueError(f"delta must be a positive finite float (Å), got {delta!r}")
    d = rmsd_matrix(gen, ref, mol)
    return {
        "cov_r": float((d.min(0) <= delta).mean()),
        "amr_r": float(d.min(0).mean()),
        "cov_p": float((d.min(1) <= delta).mean()),
        "amr_p": float(d.min(1).mean()),
    }
