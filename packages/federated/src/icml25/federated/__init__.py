"""icml25.federated — Federated learning: differentially private and distillation-based strategies, on Flower.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here, lazily: a name imports its module on first use, so importing the
package imports no paper module and a broken module breaks only its own names (:mod:`icml25.kernels.lazy`).
"""

from importlib.metadata import version as _distribution_version
from typing import TYPE_CHECKING

from icml25.kernels.lazy import lazy_namespace

if TYPE_CHECKING:  # the name -> module map of the lazy namespace (icml25.kernels.lazy)
    from icml25.federated.aggregation import FedAvgAggregator, check_client_states, check_uploads
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

    # The Flower integration (extra `[flower]`): imported only when one of its names is used, so
    # `import icml25.federated` never imports flwr; left out of __all__ so that
    # `from icml25.federated import *` works without it (`as`: re-exported for strict type checkers).
    from icml25.federated.fedgo_flower import FedGOStrategy as FedGOStrategy
    from icml25.federated.fedgo_flower import make_fedgo_client_app as make_fedgo_client_app
    from icml25.federated.fedgo_flower import run_fedgo_simulation as run_fedgo_simulation
    from icml25.federated.flower import AggregatorStrategy as AggregatorStrategy
    from icml25.federated.flower import DPFedAvgStrategy as DPFedAvgStrategy
    from icml25.federated.flower import FedCEOStrategy as FedCEOStrategy
    from icml25.federated.flower import make_client_app as make_client_app
    from icml25.federated.flower import make_server_app as make_server_app
    from icml25.federated.flower import run_flower_simulation as run_flower_simulation
    from icml25.federated.server import DPFedAvgServer, FedCEOServer, FederatedServer, History
    from icml25.federated.training import LocalTrainConfig, make_mlp, upload_noise_std
else:
    __getattr__, __dir__ = lazy_namespace(__name__, __file__)

__version__ = _distribution_version("icml25-federated")

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
    "check_client_states",
    "check_uploads",
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
