"""icml25.generative_models — Generative models: diffusion, flows, emulators, token reduction for DiTs.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here.
"""

from importlib.metadata import version as _distribution_version

from icml25.generative_models.systems import KSETDRK4, energy_spectrum, ks_simulate, lorenz96_simulate
from icml25.generative_models.tarflow import TarFlow, tarflow_loss
from icml25.generative_models.thermalizer import (
    ResidualEmulator,
    RolloutResult,
    Thermalizer,
    cosine_beta_schedule,
    thermalized_rollout,
)

__version__ = _distribution_version("icml25-generative-models")

__all__ = [
    "KSETDRK4",
    "ResidualEmulator",
    "RolloutResult",
    "TarFlow",
    "Thermalizer",
    "__version__",
    "cosine_beta_schedule",
    "energy_spectrum",
    "ks_simulate",
    "lorenz96_simulate",
    "tarflow_loss",
    "thermalized_rollout",
]
