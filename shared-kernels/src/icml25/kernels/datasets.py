"""Real-data loaders shared by every area: Fashion-MNIST from local files, never downloaded by default.

Fashion-MNIST (Xiao, Rasul & Vollgraf, 2017: 70,000 28×28 grey images of 10 clothing classes) is the one
real image set available on every machine of this project: Debian ships it (``apt-get install
dataset-fashion-mnist`` puts the four IDX files in ``/usr/share/datasets/fashion-mnist``), and torchvision
users have it in ``<root>/FashionMNIST/raw``. The files are parsed with numpy and checked against the
official content (SHA-256 of the decompressed IDX payload), so a truncated or corrupted file is an error,
not a silently wrong training set.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch

DATA_ENV = "ICML25_DATA"
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

# file stem -> (IDX magic number, shape, SHA-256 of the decompressed file); the official release's content
_FILES = {
    "train-images-idx3-ubyte": (2051, (60000, 28, 28), "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
    "train-labels-idx1-ubyte": (2049, (60000,), "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
    "t10k-images-idx3-ubyte": (2051, (10000, 28, 28), "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
    "t10k-labels-idx1-ubyte": (2049, (10000,), "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
}  # fmt: skip
_SPLITS = {"train": "train", "test": "t10k"}


def _candidate_dirs(root: str | Path | None) -> list[Path]:
    """Where to look, in order: ``root``, ``$ICML25_DATA``, Debian's folder; each also as a parent folder."""
    bases = [Path(root)] if root is not None else []
    if os.environ.get(DATA_ENV):
        bases.append(Path(os.environ[DATA_ENV]))
    dirs = []
    for base in bases:
        dirs += [
            base,
            base / "fashion-mnist",
            base / "FashionMNIST" / "raw",
        ]  # plain, Debian-like, torchvision
    dirs.append(DEBIAN_DIR)
    return dirs


def _find(stem: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        for name in (stem, stem + ".gz"):
            if (d / name).is_file():
                return d / name
    return None


def read_idx(path: str | Path, *, expect_magic: int | None = None) -> np.ndarray:
    """Parse one IDX file (optionally gzip-compressed) into a uint8 array of the shape its header declares.

    Raises ``ValueError`` naming the file when the header is not IDX/uint8 or the payload is truncated.
    """
    path = Path(path)
    raw = _read_bytes(path)
    return _parse_idx(raw, path, expect_magic)


def _read_bytes(path: Path) -> bytes:
    try:
        return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise ValueError(
            f"{path}: cannot read it as {'gzip' if path.suffix == '.gz' else 'IDX'} ({err})"
        ) from None


def _parse_idx(raw: bytes, path: Path, expect_magic: int | None) -> np.ndarray:
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (header {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    magic = int.from_bytes(raw[:4], "big")
    if expect_magic is not None and magic != expect_magic:
        raise ValueError(
            f"{path}: IDX magic {magic} where {expect_magic} was expected (images 2051, labels 2049)"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        raise ValueError(
            f"{path}: {len(raw)} bytes where its header {shape} needs {expected}: the file is truncated or corrupted"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _load_file(path: Path, stem: str, verify: bool) -> np.ndarray:
    magic, shape, sha256 = _FILES[stem]
    raw = _read_bytes(path)
    array = _parse_idx(raw, path, magic)
    if array.shape != shape:
        raise ValueError(f"{path}: shape {array.shape} where Fashion-MNIST's {stem} has {shape}")
    if verify and hashlib.sha256(raw).hexdigest() != sha256:
        raise ValueError(
            f"{path}: content differs from the official Fashion-MNIST file (SHA-256 mismatch): "
            "re-install it (apt-get install --reinstall dataset-fashion-mnist) or pass verify=False"
        )
    return array


def load_fashion_mnist(
    root: str | Path | None = None,
    split: Literal["train", "test"] = "train",
    *,
    download: bool = False,
    verify: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fashion-MNIST images and labels from local IDX files.

    Args:
        root: a folder holding the four IDX files (``.gz`` or not), or a parent of ``fashion-mnist/`` or of
            torchvision's ``FashionMNIST/raw/``. Searched first; then ``$ICML25_DATA`` (same forms), then
            Debian's ``/usr/share/datasets/fashion-mnist``.
        split: ``"train"`` (60,000 images) or ``"test"`` (10,000).
        download: fetch the files into ``root`` through torchvision when they are nowhere to be found (needs
            torchvision and a network; the default never downloads).
        verify: compare each file's content with the official release's SHA-256.

    Returns:
        ``(images, labels)``: images ``(N, 28, 28)`` float32 in ``[0, 1]``, labels ``(N,)`` int64 in
        ``0..9`` (names in :data:`FASHION_MNIST_CLASSES`).
    """
    if split not in _SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path (str or os.PathLike) or None, got {type(root).__name__}")
    prefix = _SPLITS[split]
    stems = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
    dirs = _candidate_dirs(root)
    paths = [_find(stem, dirs) for stem in stems]
    if any(p is None for p in paths) and download:
        _download(root)
        paths = [_find(stem, dirs) for stem in stems]
    if any(p is None for p in paths):
        looked = ", ".join(str(d) for d in dirs)
        raise FileNotFoundError(
            f"Fashion-MNIST {split} files ({stems[0]}[.gz], {stems[1]}[.gz]) not found; looked in: {looked}. "
            "Install them with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or pass root= a folder "
            f"holding them, or set {DATA_ENV}, or pass download=True with torchvision installed."
        )
    images = _load_file(paths[0], stems[0], verify)
    labels = _load_file(paths[1], stems[1], verify)
    if labels.max() > 9:
        raise ValueError(f"{paths[1]}: labels must be in 0..9, found {int(labels.max())}")
    return torch.from_numpy(images.astype(np.float32) / 255.0), torch.from_numpy(labels.astype(np.int64))


def _download(root: str | Path | None) -> None:
    if root is None:
        raise ValueError("download=True needs root= a folder to download into")
    try:
        from torchvision.datasets import FashionMNIST
    except ImportError:
        raise ImportError(
            "download=True delegates to torchvision (pip install torchvision); without a network use "
            "`apt-get install dataset-fashion-mnist`"
        ) from None
    for train in (True, False):
        FashionMNIST(str(root), train=train, download=True)
