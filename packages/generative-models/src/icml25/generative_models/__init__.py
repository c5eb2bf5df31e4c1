"""icml25.generative_models — Generative models: diffusion, flows, emulators, token reduction for DiTs.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here.
"""

from importlib.metadata import version as _distribution_version

from icml25.generative_models.coupling_flow import CouplingFlow
from icml25.generative_models.systems import KSETDRK4, energy_spectrum, ks_simulate, lorenz96_simulate
from icml25.generative_models.tarflow import TarFlow, TrainResult, tarflow_loss, train_flow
from icml25.generative_models.thermalizer import (
    ResidualEmulator,
    RolloutResult,
    Thermalizer,
    choose_levels,
    cosine_beta_schedule,
    select_levels,
    spectral_reference,
    spectrum_rmse,
    stability_band,
    stable_mask,
    thermalized_rollout,
)

__version__ = _distribution_version("icml25-generative-models")

__all__ = [
    "KSETDRK4",
    "CouplingFlow",
    "ResidualEmulator",
    "RolloutResult",
    "TarFlow",
    "Thermalizer",
    "TrainResult",
    "__version__",
    "choose_levels",
    "cosine_beta_schedule",
    "energy_spectrum",
    "ks_simulate",
    "lorenz96_simulate",
    "select_levels",
    "spectral_reference",
    "spectrum_rmse",
    "stability_band",
    "stable_mask",
    "tarflow_loss",
    "thermalized_rollout",
    "train_flow",
]
