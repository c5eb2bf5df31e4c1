"""Model folders on disk: ``config.json`` + ``model.safetensors``, nothing pickled.

The one save/load layout of the icml25 packages (the GAS agent of icml25-rl, the SAEs of
icml25-interpretability): a folder with

* ``config.json`` — ``{"format": <format name>, "version": <int>, ...}`` plus whatever the owner stores
  (hyper-parameters, network shapes);
* ``model.safetensors`` — named tensors (weights, buffers, fitted arrays), with the format name in its
  metadata.

:func:`read_folder` checks the layout, the format name and the version and raises clear errors, so each
owner only rebuilds its object from ``(config, tensors)``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "as_folder", "read_folder", "write_folder"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def as_folder(path: Any) -> Path:
    """``path`` as a ``Path``: ``TypeError`` when it is not a str or ``os.PathLike``, ``ValueError`` when empty."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike folder, got {type(path).__name__} {path!r}")
    if str(path) == "":
        raise ValueError("path must be a non-empty folder path, got ''")
    return Path(path)


def write_folder(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any],
    *,
    format: str,
    version: int,
) -> Path:
    """Write ``tensors`` and ``{"format": format, "version": version, **config}`` into the folder ``path``
    (created if needed; the two files are overwritten); return the folder.

    Raises ``NotADirectoryError`` when ``path`` is an existing file.
    """
    folder = as_folder(path)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"path must be a folder (existing or new), got the file {str(folder)!r}")
    folder.mkdir(parents=True, exist_ok=True)
    cpu = {key: t.detach().cpu().contiguous().clone() for key, t in tensors.items()}
    save_file(cpu, str(folder / WEIGHTS_NAME), metadata={"format": format})
    header = {"format": format, "version": version, **config}
    (folder / CONFIG_NAME).write_text(json.dumps(header, indent=2) + "\n")
    return folder


def read_folder(
    path: str | os.PathLike,
    *,
    format: str,
    version: int,
    writer: str,
    package: str,
    device: str | torch.device = "cpu",
) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor]]:
    """``(folder, config, tensors)`` of a folder written by :func:`write_folder` with this ``format`` and a
    version in ``1..version``. ``writer`` (e.g. ``"GASAgent.save"``) and ``package`` (e.g. ``"icml25-rl"``)
    only word the errors.

    Raises:
        FileNotFoundError: the folder or one of its two files does not exist.
        NotADirectoryError: ``path`` is a file.
        ValueError: not this format (another ``format``, a newer version, corrupt JSON or safetensors).
    """
    folder = as_folder(path)
    expected = f"a folder written by {writer} (with {CONFIG_NAME} and {WEIGHTS_NAME})"
    if not folder.exists():
        raise FileNotFoundError(f"path {str(folder)!r} does not exist: expected {expected}")
    if not folder.is_dir():
        raise NotADirectoryError(f"path must be {expected}, got the file {str(folder)!r}")
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{str(folder)!r} has no {name}: expected {expected}")
    try:
        config = json.loads((folder / CONFIG_NAME).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{folder / CONFIG_NAME} is not valid JSON ({err}): expected {expected}") from None
    if not isinstance(config, dict) or config.get("format") != format:
        got = config.get("format") if isinstance(config, dict) else type(config).__name__
        raise ValueError(f"{folder / CONFIG_NAME} must have format {format!r}, got {got!r}")
    found = config.get("version")
    if isinstance(found, bool) or not isinstance(found, int) or not 1 <= found <= version:
        raise ValueError(
            f"{folder / CONFIG_NAME} has format version {found!r}; this {package} reads versions "
            f"1..{version} (upgrade {package} to load newer files)"
        )
    try:
        tensors = load_file(str(folder / WEIGHTS_NAME), device=str(device))
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{folder / WEIGHTS_NAME} is not a readable safetensors file: {err}") from None
    return folder, config, tensors
