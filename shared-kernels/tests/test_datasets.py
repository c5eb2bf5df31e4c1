"""Fashion-MNIST loader: IDX parsing, the search order, verification, and the real Debian files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from icml25.kernels import datasets
from icml25.kernels.datasets import DATA_ENV, load_fashion_mnist, read_idx

REAL = all((datasets.DEBIAN_DIR / f"{stem}.gz").is_file() for stem in datasets._FILES)


def _idx(array: np.ndarray, magic_ndim: int) -> bytes:
    header = bytes([0, 0, 0x08, magic_ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _write_split(
    folder: Path, prefix: str, n: int, *, gz: bool, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    for stem, payload in (
        (f"{prefix}-images-idx3-ubyte", _idx(images, 3)),
        (f"{prefix}-labels-idx1-ubyte", _idx(labels, 1)),
    ):
        (folder / (stem + (".gz" if gz else ""))).write_bytes(gzip.compress(payload) if gz else payload)
    return images, labels


@pytest.fixture
def fake_official(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrink the official sizes to 5 test / 7 train images so small synthetic files count as complete."""
    files = {
        stem: (magic, (7 if stem.startswith("train") else 5, *shape[1:]), "")
        for stem, (magic, shape, _) in datasets._FILES.items()
    }
    monkeypatch.setattr(datasets, "_FILES", files)
    monkeypatch.setattr(datasets, "DEBIAN_DIR", Path("/nonexistent-debian-dir"))
    monkeypatch.delenv(DATA_ENV, raising=False)


@pytest.mark.parametrize("gz", [True, False])
def test_idx_files_round_trip_values_gz_or_raw(tmp_path: Path, fake_official: None, gz: bool) -> None:
    images, labels = _write_split(tmp_path, "t10k", 5, gz=gz)
    x, y = load_fashion_mnist(tmp_path, "test", verify=False)
    assert x.dtype == torch.float32 and x.shape == (5, 28, 28) and y.dtype == torch.int64
    assert torch.equal((x * 255).round().to(torch.uint8), torch.from_numpy(images))
    assert torch.equal(y, torch.from_numpy(labels.astype(np.int64)))


def test_search_order_env_var_and_torchvision_layout(
    tmp_path: Path, fake_official: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, labels = _write_split(tmp_path / "env" / "FashionMNIST" / "raw", "train", 7, gz=False, seed=1)
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "env"))
    assert torch.equal(
        load_fashion_mnist(split="train", verify=False)[1], torch.from_numpy(labels.astype(np.int64))
    )
    _, first = _write_split(tmp_path / "given" / "fashion-mnist", "train", 7, gz=True, seed=2)
    got = load_fashion_mnist(tmp_path / "given", split="train", verify=False)[1]
    assert torch.equal(got, torch.from_numpy(first.astype(np.int64)))  # root= wins over the variable


def test_a_truncated_file_is_an_error_naming_it(tmp_path: Path, fake_official: None) -> None:
    _write_split(tmp_path, "t10k", 5, gz=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte: .* truncated or corrupted"):
        load_fashion_mnist(tmp_path, "test", verify=False)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"\x89PNG not idx")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "t10k-images-idx3-ubyte")


def test_a_corrupted_file_fails_verification(
    tmp_path: Path, fake_official: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    images, labels = _write_split(tmp_path, "t10k", 5, gz=True)
    import hashlib

    good = {
        "t10k-images-idx3-ubyte": hashlib.sha256(_idx(images, 3)).hexdigest(),
        "t10k-labels-idx1-ubyte": hashlib.sha256(_idx(labels, 1)).hexdigest(),
    }
    files = {stem: (m, s, good.get(stem, "")) for stem, (m, s, _) in datasets._FILES.items()}
    monkeypatch.setattr(datasets, "_FILES", files)
    assert load_fashion_mnist(tmp_path, "test")[0].shape == (5, 28, 28)  # verified
    flipped = images.copy()
    flipped[0, 0, 0] ^= 0xFF
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(flipped, 3)))
    with pytest.raises(ValueError, match="SHA-256 mismatch"):
        load_fashion_mnist(tmp_path, "test")


def test_missing_data_error_names_the_fix(tmp_path: Path, fake_official: None) -> None:
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist") as exc:
        load_fashion_mnist(tmp_path, "test")
    assert (
        DATA_ENV in str(exc.value) and "download=True" in str(exc.value) and str(tmp_path) in str(exc.value)
    )


def test_bad_arguments_name_themselves(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'val'"):
        load_fashion_mnist(tmp_path, "val")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="root must be a path"):
        load_fashion_mnist(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="download=True needs root="):
        datasets._download(None)


@pytest.mark.skipif(
    not REAL, reason="Debian's dataset-fashion-mnist is not installed (.ci/run installs it where apt works)"
)
def test_the_real_splits_are_verified_balanced_and_have_the_known_statistics() -> None:
    x, y = load_fashion_mnist(split="test")
    assert x.shape == (10000, 28, 28) and 0.0 <= float(x.min()) and float(x.max()) == 1.0
    assert torch.bincount(y).tolist() == [1000] * 10
    train, labels = load_fashion_mnist(split="train")
    assert train.shape == (60000, 28, 28) and torch.bincount(labels).tolist() == [6000] * 10
    # the normalisation constants everyone uses for Fashion-MNIST: train mean 0.2860, std 0.3530
    assert abs(float(train.mean()) - 0.2860) < 5e-4 and abs(float(train.std()) - 0.3530) < 5e-4
