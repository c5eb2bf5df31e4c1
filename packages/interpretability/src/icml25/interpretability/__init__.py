"""icml25.interpretability — Interpretability: sparse autoencoders, probes, attention-head analysis.

Each paper is one module (its docstring cites the paper and its catalog id); the public API of every
implemented paper is re-exported here.
"""

from importlib.metadata import version as _distribution_version

from icml25.interpretability.sae import (
    ActivationNormalizer,
    BatchTopKSAE,
    MatryoshkaKSAE,
    MatryoshkaSAE,
    ReLUSAE,
    SparseAutoencoder,
    TopKSAE,
    from_saelens,
    pareto_curve,
    sae_metrics,
    to_saelens,
    train_sae,
)

__version__ = _distribution_version("icml25-interpretability")

__all__ = [
    "ActivationNormalizer",
    "BatchTopKSAE",
    "MatryoshkaKSAE",
    "MatryoshkaSAE",
    "ReLUSAE",
    "SparseAutoencoder",
    "TopKSAE",
    "__version__",
    "from_saelens",
    "pareto_curve",
    "sae_metrics",
    "to_saelens",
    "train_sae",
]
