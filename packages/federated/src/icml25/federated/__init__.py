"""icml25.federated — Federated learning: differentially private and distillation-based strategies, on Flower.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here.
"""

from importlib.metadata import version as _distribution_version
from typing import Any

from icml25.federated.cl_peft_select import (
    PresentativeCL,
    RunningDiagGaussian,
    SelectableLoRALinear,
    masked_mean,
    routing_weights,
)
from icml25.federated.data import (
    FederatedData,
    dirichlet_split,
    iid_split,
    load_federated_arrays,
    load_federated_digits,
    load_federated_fashion_mnist,
    load_federated_npz,
)
from icml25.federated.dp import (
    DPConfig,
    FederatedPrivacyLedger,
    RDPAccountant,
    clip_update,
    per_sample_clipped_sum,
    privatize_update,
)
from icml25.federated.fedceo import (
    FedAvgAggregator,
    FedCEOAggregator,
    FedCEOConfig,
    fedceo_smooth,
    matricize,
    noise_threshold,
    svt,
    tau_schedule,
    tsvt,
)
from icml25.federated.fedgo import (
    FedGOAggregator,
    FedGOConfig,
    FedGOServer,
    GaussianGenerator,
    client_moments,
    discriminator_logits,
    distill,
    ensemble_pseudo_labels,
    ensemble_weights,
    fedgo_weights,
    fit_classifier,
    make_discriminator,
    predict_logits,
    train_discriminator,
    weight_entropy,
    weighted_mean_state,
)
from icml25.federated.server import DPFedAvgServer, FedCEOServer, FederatedServer, History
from icml25.federated.training import LocalTrainConfig, make_mlp, upload_noise_std

__version__ = _distribution_version("icml25-federated")

# The Flower integration (extra `[flower]`) is one lazy hop away, so that `import icml25.federated` never
# imports flwr; its names are left out of __all__ so that `from icml25.federated import *` works without it.
_FLOWER = (
    "AggregatorStrategy",
    "DPFedAvgStrategy",
    "FedCEOStrategy",
    "make_client_app",
    "make_server_app",
    "run_flower_simulation",
)
_FEDGO_FLOWER = ("FedGOStrategy", "make_fedgo_client_app", "run_fedgo_simulation")


def __getattr__(name: str) -> Any:
    if name in _FLOWER:
        from icml25.federated import flower

        return getattr(flower, name)
    if name in _FEDGO_FLOWER:
        from icml25.federated import fedgo_flower

        return getattr(fedgo_flower, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [  # noqa: RUF022 (grouped by paper)
    "__version__",
    # P50 FedCEO
    "DPConfig",
    "DPFedAvgServer",
    "FedAvgAggregator",
    "FedCEOAggregator",
    "FedCEOConfig",
    "FedCEOServer",
    "FederatedData",
    "FederatedPrivacyLedger",
    "FederatedServer",
    "History",
    "LocalTrainConfig",
    "RDPAccountant",
    "clip_update",
    "dirichlet_split",
    "fedceo_smooth",
    "iid_split",
    "load_federated_arrays",
    "load_federated_digits",
    "load_federated_fashion_mnist",
    "load_federated_npz",
    "make_mlp",
    "matricize",
    "noise_threshold",
    "per_sample_clipped_sum",
    "privatize_update",
    "svt",
    "tau_schedule",
    "tsvt",
    "upload_noise_std",
    # P10 FedGO
    "FedGOAggregator",
    "FedGOConfig",
    "FedGOServer",
    "GaussianGenerator",
    "client_moments",
    "discriminator_logits",
    "distill",
    "ensemble_pseudo_labels",
    "ensemble_weights",
    "fedgo_weights",
    "fit_classifier",
    "make_discriminator",
    "predict_logits",
    "train_discriminator",
    "weight_entropy",
    "weighted_mean_state",
    # P14 presentative-feature PEFT-block selection
    "PresentativeCL",
    "RunningDiagGaussian",
    "SelectableLoRALinear",
    "masked_mean",
    "routing_weights",
]
