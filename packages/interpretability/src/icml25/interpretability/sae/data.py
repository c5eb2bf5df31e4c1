"""Synthetic activations for SAEs: a known sparse dictionary with heavy-tailed, variable sparsity.

CLIP embeddings cannot be downloaded here, so the reproduction uses embeddings with a known sparse
dictionary structure and *variable* sparsity — the regime where a single-k TopK SAE is mis-specified:

* ``n_features`` ground-truth unit directions in R^d;
* per sample, a heavy-tailed number of active features: geometric with the given mean, capped;
* active features drawn without replacement with power-law (Zipf) frequencies;
* log-normal magnitudes; Gaussian noise at ``noise`` × the signal norm.
"""

from __future__ import annotations

import torch


def sparse_dictionary_data(
    n_samples: int,
    d: int = 64,
    n_features: int = 512,
    mean_active: float = 8.0,
    max_active: int = 48,
    zipf_exponent: float = 1.0,
    magnitude_sigma: float = 0.5,
    noise: float = 0.01,
    seed: int = 0,
    dictionary: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``X`` [n_samples, d] from a sparse dictionary; returns ``(X, dictionary [n_features, d])``.

    Pass the returned ``dictionary`` back to draw a test set from the same features.
    """
    for name, v, lo in (("n_samples", n_samples, 1), ("d", d, 1), ("n_features", n_features, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if not (1 <= max_active <= n_features):
        raise ValueError(f"max_active must be in [1, n_features={n_features}], got {max_active}")
    if not (mean_active >= 1):
        raise ValueError(f"mean_active must be >= 1 (geometric on 1, 2, ...), got {mean_active}")
    g = torch.Generator().manual_seed(seed)
    if dictionary is None:
        D = torch.randn(n_features, d, generator=g)
        D = D / D.norm(dim=1, keepdim=True)
    else:
        if dictionary.shape != (n_features, d):
            raise ValueError(
                f"dictionary must be [n_features={n_features}, d={d}], got {tuple(dictionary.shape)}"
            )
        D = dictionary
    # Number of active features: geometric on {1, 2, ...} with the requested mean, capped.
    p = 1.0 / mean_active
    u = torch.rand(n_samples, generator=g).clamp_min(1e-12)
    counts = (torch.floor(torch.log(u) / torch.log1p(torch.tensor(-p))) + 1).clamp(1, max_active).long()
    # Which features: without replacement, power-law frequencies (a prefix of a sample is a sample).
    freq = (torch.arange(n_features, dtype=torch.float64) + 1.0).pow(-zipf_exponent)
    probs = (freq / freq.sum()).float().expand(n_samples, n_features)
    feats = torch.multinomial(probs, max_active, replacement=False, generator=g)
    active = torch.arange(max_active)[None, :] < counts[:, None]
    mags = torch.exp(magnitude_sigma * torch.randn(n_samples, max_active, generator=g)) * active
    signal = torch.einsum("bk,bkd->bd", mags, D[feats])
    eps = torch.randn(n_samples, d, generator=g)
    eps = eps / eps.norm(dim=1, keepdim=True) * signal.norm(dim=1, keepdim=True) * noise
    return signal + eps, D
