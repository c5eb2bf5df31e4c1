"""SAE folders on disk: ``config.json`` + ``model.safetensors``, nothing pickled.

The helpers behind :meth:`SparseAutoencoder.save` / :meth:`SparseAutoencoder.load` (and the dtype names
shared with the SAELens interchange). A saved SAE is a folder with two files, nothing pickled:

* ``config.json`` — ``{"format": "icml25.interpretability.sae", "version": 1, "class": <class name>,
  "config": <constructor keyword arguments>, "dtype": "float32", "normalizer": null | {...}}``;
* ``model.safetensors`` — the model's ``state_dict()`` (parameters and buffers: the dead-latent counters,
  BatchTopK's threshold) and, when an :class:`ActivationNormalizer` was saved with it, ``normalizer.mean``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from icml25.kernels import serialization
from icml25.kernels.serialization import CONFIG_NAME, WEIGHTS_NAME

__all__ = [
    "CONFIG_NAME",
    "DTYPES",
    "SAVE_FORMAT",
    "SAVE_VERSION",
    "WEIGHTS_NAME",
    "dtype_from_name",
    "dtype_name",
    "read_folder",
    "write_folder",
]

SAVE_FORMAT = "icml25.interpretability.sae"
#: Versions this code reads are ``1..SAVE_VERSION``; it writes ``SAVE_VERSION``.
SAVE_VERSION = 1

#: dtype names as written in configs (``str(dtype)`` without ``torch.``), here and in SAELens cfgs.
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: Any, *, default: torch.dtype | None = None) -> torch.dtype:
    """The floating dtype a config names (``"float32"`` or ``"torch.float32"``); ``default`` if unknown."""
    dtype = DTYPES.get(str(name).removeprefix("torch."), default)
    if dtype is None:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return dtype


def write_folder(path: str | os.PathLike, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """Write ``config`` (with the format and version) and ``tensors`` into the folder ``path``; return it."""
    return serialization.write_folder(path, tensors, config, format=SAVE_FORMAT, version=SAVE_VERSION)


def read_folder(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> tuple[Path, dict, dict]:
    """``(folder, config, tensors)`` of a folder written by :func:`write_folder`, with clear errors
    (:func:`icml25.kernels.serialization.read_folder`)."""
    return serialization.read_folder(
        path,
        format=SAVE_FORMAT,
        version=SAVE_VERSION,
        writer="SparseAutoencoder.save",
        package="icml25-interpretability",
        device=device,
    )
