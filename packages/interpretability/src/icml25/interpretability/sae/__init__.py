"""The sparse-autoencoder toolkit of the interpretability papers: SAE zoo, training, metrics, interchange.

Sparse autoencoders for interpretability: a small zoo (TopK with AuxK, BatchTopK, ReLU+L1) that other
papers of this package reuse (P19 SAeUron), the Matryoshka-over-k SAE of P22 (:class:`MatryoshkaKSAE`),
its loss, evaluation metrics and Pareto curves, a training loop over any activation tensor or stream, and
SAELens interchange. Top-k decodes use the shared ``icml25.kernels.topk_decode`` op. Every SAE saves to a
folder (``sae.save(path)``: ``config.json`` + ``model.safetensors``) that ``SparseAutoencoder.load(path)``
rebuilds bit for bit.

>>> import torch
>>> from icml25.interpretability.sae import MatryoshkaKSAE, train_sae, pareto_curve
>>> X = torch.randn(2048, 32, generator=torch.Generator().manual_seed(0))
>>> sae = MatryoshkaKSAE(32, 128, ks=[4, 16, 128], seed=0)
>>> _ = train_sae(sae, X, steps=20, batch_size=256, seed=0, progress=False)
>>> [row["k"] for row in pareto_curve(sae, X, ks=[4, 16, None])]
[4, 16, None]
"""

from icml25.interpretability.sae.base import (
    BatchTopKSAE,
    ReLUSAE,
    SparseAutoencoder,
    TopKSAE,
    scatter_latents,
    topk_relu,
)
from icml25.interpretability.sae.data import sparse_dictionary_data
from icml25.interpretability.sae.losses import nmse, normalized_l1, reconstruction_loss
from icml25.interpretability.sae.matryoshka_k import (
    MatryoshkaKSAE,
    MatryoshkaSAE,
    level_weights,
    msae_loss,
    nesting_list,
)
from icml25.interpretability.sae.metrics import fvu_auc_log2k, pareto_curve, sae_metrics
from icml25.interpretability.sae.preprocessing import ActivationNormalizer
from icml25.interpretability.sae.saelens import from_saelens, to_saelens, to_saelens_sae
from icml25.interpretability.sae.training import train_sae

__all__ = [
    "ActivationNormalizer",
    "BatchTopKSAE",
    "MatryoshkaKSAE",
    "MatryoshkaSAE",
    "ReLUSAE",
    "SparseAutoencoder",
    "TopKSAE",
    "from_saelens",
    "fvu_auc_log2k",
    "level_weights",
    "msae_loss",
    "nesting_list",
    "nmse",
    "normalized_l1",
    "pareto_curve",
    "reconstruction_loss",
    "sae_metrics",
    "scatter_latents",
    "sparse_dictionary_data",
    "to_saelens",
    "to_saelens_sae",
    "topk_relu",
    "train_sae",
]
