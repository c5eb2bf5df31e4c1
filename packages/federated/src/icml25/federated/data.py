"""Federated data utilities: IID and Dirichlet label-skew splits of any labelled array data.

Shared by the federated experiments of this package (FedCEO, P50; reusable by FedGO, P10). Nothing is
downloaded: ``load_federated_digits`` uses sklearn's bundled digits (1797 images of 8×8 pixels, 10
classes); ``load_federated_arrays`` splits arrays the caller already holds, and ``load_federated_npz``
reads them from a ``.npz`` file (e.g. EMNIST or CIFAR-10 exported once by the user).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from icml25.kernels.checks import check_float, check_int

__all__ = [
    "FederatedData",
    "dirichlet_split",
    "iid_split",
    "load_federated_arrays",
    "load_federated_digits",
    "load_federated_fashion_mnist",
    "load_federated_npz",
]


@contextlib.contextmanager
def _global_random_kept() -> Iterator[None]:
    """Import scikit-learn modules without letting the import touch Python's global ``random`` state.

    scikit-learn >= 1.9 imports ``rich`` on first use of ``sklearn.model_selection`` or ``sklearn.datasets``,
    and that import draws from the global ``random`` generator; a caller's seeded stream must not move
    because one of our loaders ran (library code never touches global random state).
    """
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


def iid_split(n_samples: int, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``range(n_samples)`` and cut it into ``n_clients`` near-equal parts (sizes differ by ≤ 1)."""
    check_int(n_clients, "n_clients", low=1)
    check_int(n_samples, "n_samples", low=n_clients)
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
    check_int(n_clients, "n_clients", low=1)
    check_int(min_size, "min_size", low=0)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
        raise ValueError(f"alpha must be a number > 0, got {alpha!r}")
    if n_clients * min_size > labels.size:
        raise ValueError(
            f"labels must hold at least n_clients*min_size = {n_clients * min_size} samples, got {labels.size}"
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
    """Client partitions plus held-out validation and test sets (float32 features, int64 labels).

    Attributes:
        clients: K pairs ``(x [n_k, d], y [n_k])``.
        x_val, y_val: validation set (for hyper-parameter selection), possibly empty.
        x_test, y_test: test set.
        n_classes: number of classes (labels are ``0 .. n_classes - 1``).
    """

    clients: list[tuple[Tensor, Tensor]]
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    n_classes: int = 10

    @property
    def n_features(self) -> int:
        return int(self.x_test.shape[1])


def _check_fraction(name: str, frac: object) -> None:
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1:
        raise ValueError(f"{name} must be a fraction in [0, 1), got {frac!r}")


def _as_features(x: object, name: str) -> np.ndarray:
    """``[n, ...]`` numeric array → ``[n, d]`` float32 (images are flattened)."""
    a = np.asarray(x)
    if a.ndim < 2 or a.size == 0 or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise ValueError(
            f"{name} must be a non-empty numeric array [n, d] or [n, *image], got {a.dtype} {a.shape}"
        )
    a = a.reshape(a.shape[0], -1).astype(np.float32)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite, got NaN or inf entries")
    return a


def _as_labels(y: object, n: int, name: str) -> np.ndarray:
    a = np.asarray(y)
    if a.shape != (n,) or not np.issubdtype(a.dtype, np.integer) or (a.size and a.min() < 0):
        raise ValueError(f"{name} must be [{n}] non-negative integer class ids, got {a.dtype} {a.shape}")
    return a.astype(np.int64)


def load_federated_arrays(
    x: np.ndarray,
    y: np.ndarray,
    n_clients: int = 20,
    *,
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
    split: str = "iid",
    alpha: float = 0.5,
    test_size: float = 0.3,
    val_size: float = 0.0,
    seed: int = 0,
) -> FederatedData:
    """Spread labelled arrays over clients, holding out test (and optional validation) samples.

    Args:
        x: ``[n, d]`` features or ``[n, *image]`` (flattened to ``[n, d]``), already scaled as the model
            expects (no normalisation is applied).
        y: ``[n]`` integer labels ``0 .. n_classes - 1``.
        n_clients: K ≥ 1.
        x_test, y_test: a given test split (as for EMNIST/CIFAR-10); if ``None``, a stratified
            ``test_size`` fraction of ``(x, y)`` is held out.
        split: ``"iid"`` or ``"dirichlet"`` (label skew with concentration ``alpha``).
        alpha: Dirichlet concentration (``split="dirichlet"`` only).
        test_size: fraction held out for testing when no test split is given.
        val_size: fraction of the remaining training samples held out for validation (stratified).
        seed: seeds the splits.
    """
    with _global_random_kept():
        from sklearn.model_selection import train_test_split

    if split not in ("iid", "dirichlet"):
        raise ValueError(f"split must be 'iid' or 'dirichlet', got {split!r}")
    _check_fraction("test_size", test_size)
    _check_fraction("val_size", val_size)
    x_tr = _as_features(x, "x")
    y_tr = _as_labels(y, x_tr.shape[0], "y")
    if (x_test is None) != (y_test is None):
        raise ValueError("x_test and y_test must be given together, got only one of them")
    if x_test is None:
        x_tr, x_te, y_tr, y_te = train_test_split(
            x_tr, y_tr, test_size=test_size, random_state=seed, stratify=y_tr
        )
    else:
        x_te = _as_features(x_test, "x_test")
        y_te = _as_labels(y_test, x_te.shape[0], "y_test")
        if x_te.shape[1] != x_tr.shape[1]:
            raise ValueError(f"x_test must have {x_tr.shape[1]} features like x, got {x_te.shape[1]}")
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

    def t(a: np.ndarray, labels: bool = False) -> Tensor:
        return torch.as_tensor(a, dtype=torch.long if labels else torch.float32)

    return FederatedData(
        clients=[(t(x_tr[p]), t(y_tr[p], True)) for p in parts],
        x_val=t(x_va),
        y_val=t(y_va, True),
        x_test=t(x_te),
        y_test=t(y_te, True),
        n_classes=int(max(y_tr.max(), y_te.max())) + 1,
    )


def load_federated_npz(path: str | os.PathLike[str], n_clients: int = 20, **kwargs: Any) -> FederatedData:
    """:func:`load_federated_arrays` on the arrays of a ``.npz`` file (read locally, nothing downloaded).

    The file holds ``x`` and ``y`` and, optionally, ``x_test`` and ``y_test`` (a given test split), e.g.
    ``np.savez(path, x=train_images / 255.0, y=train_labels, x_test=test_images / 255.0, y_test=test_labels)``.
    ``kwargs`` go to :func:`load_federated_arrays` (``split``, ``alpha``, ``test_size``, ``val_size``, ``seed``).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    with np.load(path, allow_pickle=False) as f:
        missing = {"x", "y"} - set(f.files)
        if missing:
            raise ValueError(f"{os.fspath(path)!r} must hold arrays 'x' and 'y', got {sorted(f.files)}")
        arrays = {k: f[k] for k in ("x", "y", "x_test", "y_test") if k in f.files}
    return load_federated_arrays(arrays.pop("x"), arrays.pop("y"), n_clients, **arrays, **kwargs)


def load_federated_digits(
    n_clients: int = 20,
    *,
    split: str = "iid",
    alpha: float = 0.5,
    test_size: float = 0.3,
    val_size: float = 0.0,
    seed: int = 0,
) -> FederatedData:
    """sklearn digits scaled to [0, 1] (``[1797, 64]``), split by :func:`load_federated_arrays`.

    Args:
        n_clients: K ≥ 1.
        split: ``"iid"`` or ``"dirichlet"`` (label skew with concentration ``alpha``).
        alpha: Dirichlet concentration (``split="dirichlet"`` only).
        test_size: fraction of all samples held out for testing.
        val_size: fraction of the remaining training samples held out for validation.
        seed: seeds the splits.
    """
    with _global_random_kept():
        from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    return load_federated_arrays(
        x / 16.0,
        y,
        n_clients,
        split=split,
        alpha=alpha,
        test_size=test_size,
        val_size=val_size,
        seed=seed,
    )


FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530  # pixel statistics of the training split


def load_federated_fashion_mnist(
    n_clients: int = 100,
    *,
    split: str = "iid",
    alpha: float = 0.5,
    local_train_fraction: float = 0.8,
    local_val_fraction: float = 0.1,
    root: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> FederatedData:
    """Fashion-MNIST (60,000 training and 10,000 test images, 28×28, 10 classes) spread over clients.

    The protocol of the official FedCEO code for its 28×28 task (EMNIST): the training split is divided
    among ``n_clients`` clients (IID by default), each client trains on the first ``local_train_fraction``
    of its shuffled shard (the official ``LocalUpdate`` keeps 80% for training and holds out 10% + 10%,
    which no reported number uses); the next ``local_val_fraction`` of every shard, never trained on, is
    pooled into the validation set (for tuning, e.g. FedCEO's λ), the official test split is the test set, and pixels are standardised
    as the official transform does (here with Fashion-MNIST's mean 0.2860 and std 0.3530). Images are
    flattened to ``[n, 784]``.

    The files come from :func:`icml25.kernels.datasets.load_fashion_mnist` (``root``, ``$ICML25_DATA``,
    Debian's ``apt-get install dataset-fashion-mnist``); nothing is downloaded.

    Args:
        n_clients: K >= 1.
        split: ``"iid"`` or ``"dirichlet"`` (label skew with concentration ``alpha``).
        alpha: Dirichlet concentration (``split="dirichlet"`` only).
        local_train_fraction: fraction of each client's shard it trains on, in (0, 1].
        local_val_fraction: fraction of each client's shard held out for validation, in [0, 1], with
            ``local_train_fraction + local_val_fraction <= 1``.
        root: folder holding the IDX files (see ``load_fashion_mnist``).
        seed: seeds the split and the shuffling of each shard.
    """
    from icml25.kernels.datasets import load_fashion_mnist

    if split not in ("iid", "dirichlet"):
        raise ValueError(f"split must be 'iid' or 'dirichlet', got {split!r}")
    if (
        isinstance(local_train_fraction, bool)
        or not isinstance(local_train_fraction, (int, float))
        or not 0 < local_train_fraction <= 1
    ):
        raise ValueError(f"local_train_fraction must be a fraction in (0, 1], got {local_train_fraction!r}")
    check_float(local_val_fraction, "local_val_fraction", low=0.0, high=1.0)
    if local_train_fraction + local_val_fraction > 1 + 1e-12:
        raise ValueError(
            f"local_train_fraction + local_val_fraction must be <= 1, got {local_train_fraction!r} + "
            f"{local_val_fraction!r}"
        )
    check_int(n_clients, "n_clients", low=1)
    x, y = load_fashion_mnist(root, "train")
    x_te, y_te = load_fashion_mnist(root, "test")

    def standardise(images: Tensor) -> Tensor:
        return ((images - FASHION_MNIST_MEAN) / FASHION_MNIST_STD).reshape(images.shape[0], -1)

    x, x_te = standardise(x), standardise(x_te)
    rng = np.random.default_rng(seed)
    parts = (
        iid_split(len(y), n_clients, rng)
        if split == "iid"
        else dirichlet_split(y.numpy(), n_clients, alpha, rng)
    )
    clients, val = [], []
    for part in parts:
        shard = torch.as_tensor(rng.permutation(part))
        n_keep = max(1, int(local_train_fraction * len(shard)))
        keep = shard[:n_keep]
        clients.append((x[keep].contiguous(), y[keep].contiguous()))
        val.append(shard[n_keep : n_keep + int(local_val_fraction * len(shard))])
    val_idx = torch.cat(val) if val else torch.zeros(0, dtype=torch.long)
    return FederatedData(
        clients=clients,
        x_val=x[val_idx].contiguous(),
        y_val=y[val_idx].contiguous(),
        x_test=x_te,
        y_test=y_te,
        n_classes=10,
    )
