"""icml25.generative_models — Generative models: diffusion, flows, emulators, token reduction for DiTs.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here.
"""

from importlib.metadata import version as _distribution_version

from icml25.generative_models.coupling_flow import CouplingFlow
from icml25.generative_models.density_guidance import (
    DriftTerms,
    EDMSchedule,
    GaussianMixture,
    SampleResult,
    ScoreMLP,
    VPSchedule,
    denoiser_to_score,
    density_guidance_sample,
    density_guided_drift,
    eps_to_score,
    exact_laplacian,
    guidance_offset,
    hutchinson_laplacian,
    log_density_rate,
    pf_ode_drift,
    pf_ode_log_density,
    pf_ode_sample,
    prior_guidance_sample,
    rescale_latents,
    score_alignment,
    stochastic_density_guidance_sample,
    time_grid,
    train_score_model,
)
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
    "DriftTerms",
    "EDMSchedule",
    "GaussianMixture",
    "ResidualEmulator",
    "RolloutResult",
    "SampleResult",
    "ScoreMLP",
    "TarFlow",
    "Thermalizer",
    "TrainResult",
    "VPSchedule",
    "__version__",
    "choose_levels",
    "cosine_beta_schedule",
    "denoiser_to_score",
    "density_guidance_sample",
    "density_guided_drift",
    "energy_spectrum",
    "eps_to_score",
    "exact_laplacian",
    "guidance_offset",
    "hutchinson_laplacian",
    "ks_simulate",
    "log_density_rate",
    "lorenz96_simulate",
    "pf_ode_drift",
    "pf_ode_log_density",
    "pf_ode_sample",
    "prior_guidance_sample",
    "rescale_latents",
    "score_alignment",
    "select_levels",
    "spectral_reference",
    "spectrum_rmse",
    "stability_band",
    "stable_mask",
    "stochastic_density_guidance_sample",
    "tarflow_loss",
    "thermalized_rollout",
    "time_grid",
    "train_flow",
    "train_score_model",
]
