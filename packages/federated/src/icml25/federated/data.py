"""Federated data utilities: IID and Dirichlet label-skew splits of sklearn's bundled digits.

Shared by the federated experiments of this package (FedCEO, P50; reusable by FedGO, P10). Nothing is
downloaded: ``sklearn.datasets.load_digits`` ships with scikit-learn (1797 images of 8×8 pixels, 10 classes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["FederatedData", "dirichlet_split", "iid_split", "load_federated_digits"]


def _check_int(name: str, x: object, lo: int) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {x!r}")


def iid_split(n_samples: int, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``range(n_samples)`` and cut it into ``n_clients`` near-equal parts (sizes differ by ≤ 1)."""
    _check_int("n_clients", n_clients, 1)
    _check_int("n_samples", n_samples, n_clients)
    return [np.sort(part) for part in np.array_split(rng.permutation(n_samples), n_clients)]


def dirichlet_split(
    labels: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator, min_size: int = 1
) -> list[np.ndarray]:
    """Label-skewed split: each class is divided among clients with proportions ~ Dirichlet(α·1).

    Small α gives clients few classes; α → ∞ approaches IID. The draw is repeated until every client
    holds at least ``min_size`` samples (the usual convention of Hsu et al. 2019 / Li et al. 2021).

    Args:
        labels: ``[n]`` integer class labels.
        n_clients: number of clients K ≥ 1.
        alpha: concentration > 0.
        rng: numpy generator.
        min_size: minimum samples per client.

    Returns:
        K sorted index arrays partitioning ``range(n)``.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array of class ids, got shape {labels.shape}")
    _check_int("n_clients", n_clients, 1)
    _check_int("min_size", min_size, 0)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
        raise ValueError(f"alpha must be a number > 0, got {alpha!r}")
    if n_clients * min_size > labels.size:
        raise ValueError(
            f"n_clients*min_size must be <= the number of samples {labels.size}, got {n_clients * min_size}"
        )
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(n_clients, float(alpha)))) * idx.size).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ValueError(
        f"could not draw a Dirichlet(alpha={alpha}) split with min_size={min_size} in 1000 tries"
    )


@dataclass
class FederatedData:
    """Client partitions plus held-out validation and test sets (float32 features in [0, 1]).

    Attributes:
        clients: K pairs ``(x [n_k, 64], y [n_k])``.
        x_val, y_val: validation set (for hyper-parameter selection), possibly empty.
        x_test, y_test: test set.
    """

    clients: list[tuple[Tensor, Tensor]]
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor

    @property
    def n_features(self) -> int:
        return int(self.x_test.shape[1])

    @property
    def n_classes(self) -> int:
        return 10


def load_federated_digits(
    n_clients: int = 20,
    *,
    split: str = "iid",
    alpha: float = 0.5,
    test_size: float = 0.3,
    val_size: float = 0.0,
    seed: int = 0,
) -> FederatedData:
    """sklearn digits, stratified train/test (and optional validation) split, train part spread over clients.

    Args:
        n_clients: K ≥ 1.
        split: ``"iid"`` or ``"dirichlet"`` (label skew with concentration ``alpha``).
        alpha: Dirichlet concentration (``split="dirichlet"`` only).
        test_size: fraction of all samples held out for testing.
        val_size: fraction of the remaining training samples held out for validation.
        seed: seeds the splits.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if split not in ("iid", "dirichlet"):
        raise ValueError(f"split must be 'iid' or 'dirichlet', got {split!r}")
    for name, frac in (("test_size", test_size), ("val_size", val_size)):
        if not isinstance(frac, (int, float)) or not 0 <= frac < 1:
            raise ValueError(f"{name} must be a fraction in [0, 1), got {frac!r}")
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    if val_size > 0:
        x_tr, x_va, y_tr, y_va = train_test_split(
            x_tr, y_tr, test_size=val_size, random_state=seed, stratify=y_tr
        )
    else:
        x_va, y_va = x_tr[:0], y_tr[:0]
    rng = np.random.default_rng(seed)
    if split == "iid":
        parts = iid_split(len(y_tr), n_clients, rng)
    else:
        parts = dirichlet_split(y_tr, n_clients, alpha, rng)

    def t(a: np.ndarray, y: bool = False) -> Tensor:
        return torch.as_tensor(a, dtype=torch.long if y else torch.float32)

    return FederatedData(
        clients=[(t(x_tr[p]), t(y_tr[p], True)) for p in parts],
        x_val=t(x_va),
        y_val=t(y_va, True),
        x_test=t(x_te),
        y_test=t(y_te, True),
    )
