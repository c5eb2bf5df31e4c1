"""P40 MolJO with a real RDKit: pocket from a PDB block, ligand from a Mol and back (bonds from geometry),
and a sampled ligand written out as a Mol."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("rdkit")

from rdkit import Chem
from rdkit.Chem import AllChem

from icml25.generative_models import LigandBFN, ToyPocketTask, moljo_sample
from icml25.generative_models.moljo_rdkit import ligand_from_mol, ligand_to_mol, pocket_from_pdb_block

ELEMENTS = ["C", "N", "O", "S"]


def _ligand() -> Chem.Mol:
    mol = Chem.AddHs(Chem.MolFromSmiles("OCC(=O)NC"))
    AllChem.EmbedMolecule(mol, randomSeed=7)
    return Chem.RemoveHs(mol)


def test_ligand_round_trip_recovers_the_connectivity():
    mol = _ligand()
    coords, types = ligand_from_mol(mol, ELEMENTS)
    assert coords.shape == (6, 3) and types.tolist() == [2, 0, 0, 2, 1, 0]
    back = ligand_to_mol(coords, types, ELEMENTS)
    bonds = {tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()))) for b in back.GetBonds()}
    ref = {tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()))) for b in mol.GetBonds()}
    assert bonds == ref
    assert torch.allclose(torch.tensor(back.GetConformer().GetPositions(), dtype=torch.float32), coords)


def test_pocket_from_pdb_block_types_and_radius():
    mol = Chem.AddHs(Chem.MolFromSequence("GAS"))
    AllChem.EmbedMolecule(mol, randomSeed=3)
    block = Chem.MolToPDBBlock(mol)
    pocket = pocket_from_pdb_block(block, ELEMENTS)
    heavy = [a.GetSymbol() for a in Chem.RemoveHs(mol).GetAtoms()]
    assert pocket.coords.shape == (len(heavy), 3)
    assert pocket.types.tolist() == [ELEMENTS.index(s) for s in heavy]
    c = pocket.coords[0].tolist()
    near = pocket_from_pdb_block(block, ELEMENTS, center=c, radius=2.0)
    assert 1 <= near.coords.shape[0] < pocket.coords.shape[0]
    with_h = pocket_from_pdb_block(block, ELEMENTS, keep_hydrogens=True)
    assert (with_h.types == len(ELEMENTS)).sum() == mol.GetNumAtoms() - len(heavy)  # H: the "other" type


def test_sampled_ligand_becomes_a_mol():
    task = ToyPocketTask(seed=0)
    bfn = LigandBFN(4, 3, max_atoms=8, hidden=8, n_layers=1, seed=0)
    r = moljo_sample(bfn, None, task.pocket, 5, 1, 5, generator=torch.Generator().manual_seed(0))
    mol = ligand_to_mol(r.coords[0], r.types[0], ELEMENTS)
    assert mol.GetNumAtoms() == 5 and mol.GetNumConformers() == 1


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="pdb_block must be a non-empty PDB string"):
        pocket_from_pdb_block("   ", ELEMENTS)
    with pytest.raises(ValueError, match="pdb_block must hold at least one atom"):
        pocket_from_pdb_block("END\n", ELEMENTS)
    with pytest.raises(ValueError, match=r"elements must hold element symbols .* got 'Xx'"):
        ligand_from_mol(_ligand(), ["C", "Xx"])
    with pytest.raises(ValueError, match=r"mol has elements \['N', 'O'\] that are not in elements"):
        ligand_from_mol(_ligand(), ["C"])
    with pytest.raises(ValueError, match="coords must be finite"):
        ligand_to_mol(torch.tensor([[0.0, 0, float("nan")]]), torch.tensor([0]), ELEMENTS)
    with pytest.raises(ValueError, match=r"types must index elements \(0 \.\. 3\)"):
        ligand_to_mol(torch.zeros(2, 3), torch.tensor([0, 9]), ELEMENTS)
    with pytest.raises(ValueError, match="no pocket atom lies within"):
        pocket_from_pdb_block(Chem.MolToPDBBlock(_ligand()), ELEMENTS, center=[100.0, 0, 0], radius=1.0)
