"""Backend selection shared by every op family in :mod:`icml25.kernels`.

Each op family has a readable PyTorch ``reference`` (the executable specification, runs anywhere) and a
Triton implementation. The public op calls :func:`select_backend` with its tensor arguments:

* ``ICML25_KERNELS_BACKEND=reference`` forces the reference path;
* ``ICML25_KERNELS_BACKEND=triton`` forces Triton, which needs CUDA tensors unless ``TRITON_INTERPRET=1``
  (the Triton interpreter, used to test kernels on CPU);
* unset (or ``auto``): Triton when it is installed and every tensor is on a CUDA device, else the reference.

A per-call ``backend=`` argument takes precedence over the environment variable.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Literal

import torch

Backend = Literal["reference", "triton"]
BACKEND_ENV = "ICML25_KERNELS_BACKEND"
_CHOICES = ("auto", "reference", "triton")


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported.

    PyTorch's CUDA builds for Linux bring triton; elsewhere it is the ``[triton]`` extra
    (``pip install 'icml25-kernels[triton]'``, Linux only), needed for the CPU interpreter.
    """
    return importlib.util.find_spec("triton") is not None


def triton_interpret() -> bool:
    """Whether Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def select_backend(*tensors: torch.Tensor, backend: str | None = None) -> Backend:
    """Choose the implementation for an op called on ``tensors``.

    Args:
        tensors: the op's tensor arguments; Triton is chosen automatically only when all are on CUDA.
        backend: ``"auto"``, ``"reference"`` or ``"triton"``; ``None`` reads ``ICML25_KERNELS_BACKEND``.

    Raises:
        ValueError: unknown backend name.
        RuntimeError: Triton forced but not installed, or forced on non-CUDA tensors outside interpret mode.
    """
    source = "backend" if backend is not None else BACKEND_ENV
    choice = (
        backend if backend is not None else os.environ.get(BACKEND_ENV, "auto")
    ).strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{source} must be one of {_CHOICES}, got {choice!r}")
    if choice == "reference":
        return "reference"
    on_cuda = bool(tensors) and all(t.is_cuda for t in tensors)
    if choice == "triton":
        if not triton_available():
            raise RuntimeError(
                f"{source}='triton' but the triton package is not installed: "
                "pip install 'icml25-kernels[triton]' (Linux; PyTorch's CUDA builds include it)"
            )
        if not on_cuda and not triton_interpret():
            devices = sorted({str(t.device) for t in tensors})
            raise RuntimeError(
                f"{source}='triton' needs CUDA tensors (got devices {devices}); "
                "set TRITON_INTERPRET=1 to run the Triton kernels in the CPU interpreter"
            )
        return "triton"
    return "triton" if on_cuda and triton_available() else "reference"
