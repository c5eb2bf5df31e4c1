"""Efficient Molecular Conformer Generation with SO(3)-Averaged Flow Matching and Reflow — ICML 2025, P15: conformer flows.

Cao, Geiger, Costa, Reidenbach, Kreis, Geffner, Pellegrini, Zhou & Kucukbenli (NVIDIA), ICML 2025,
arXiv 2507.09785 (official code: NVIDIA-Digital-Bio/avgflow). Flow matching from a Gaussian cloud to a molecular
conformer whose target is averaged over the rotations of the data (the matrix-Fisher posterior of the
global rotation), against conditional-OT (random rotation) and Kabsch-aligned flows; reflow and one-step
distillation for few-step sampling; a small E(3)-equivariant network; RDKit I/O and COV/AMR metrics
(``[chem]`` extra, imported lazily).

* :mod:`~icml25.generative_models.conformers.so3`: Haar rotations, proper SVD, Kabsch, ``E[R]`` of the
  matrix-Fisher distribution (graded 1-D quadrature, exact at every concentration).
* :mod:`~icml25.generative_models.conformers.flow`: objectives, :class:`ConformerFlow`, reflow, distill.
* :mod:`~icml25.generative_models.conformers.training`: :class:`TrainingSchedule` (the official AdamW, warmup-cosine
  and weight average by default) and :func:`velocity_loss` (per-molecule normalisation by default).
* :mod:`~icml25.generative_models.conformers.egnn`: :class:`MolGraph`, :class:`EGNN`.
* :mod:`~icml25.generative_models.conformers.chem`: RDKit molecules, conformers and metrics.
"""

from icml25.generative_models.conformers.chem import (
    ATOM_TYPES,
    conformer_coords,
    coverage_amr,
    embed_conformers,
    mols_to_graph,
    rmsd_matrix,
    sample_conformers,
    with_conformers,
)
from icml25.generative_models.conformers.egnn import EGNN, MolGraph
from icml25.generative_models.conformers.flow import (
    ConformerFlow,
    ReflowPairs,
    avgflow_target,
    centre,
    distill,
    flow_target,
    make_reflow_pairs,
    reflow,
)
from icml25.generative_models.conformers.so3 import (
    check_rotation,
    haar_rotations,
    kabsch_rotation,
    matrix_fisher_mean,
    proper_svd,
    quaternion_to_matrix,
)
from icml25.generative_models.conformers.training import TrainingSchedule, velocity_loss

__all__ = [
    "ATOM_TYPES",
    "EGNN",
    "ConformerFlow",
    "MolGraph",
    "ReflowPairs",
    "TrainingSchedule",
    "avgflow_target",
    "centre",
    "check_rotation",
    "conformer_coords",
    "coverage_amr",
    "distill",
    "embed_conformers",
    "flow_target",
    "haar_rotations",
    "kabsch_rotation",
    "make_reflow_pairs",
    "matrix_fisher_mean",
    "mols_to_graph",
    "proper_svd",
    "quaternion_to_matrix",
    "reflow",
    "rmsd_matrix",
    "sample_conformers",
    "velocity_loss",
    "with_conformers",
]
