"""icml25.kernels: GPU kernels (Triton) with readable PyTorch reference paths.

Every op family is a subpackage with ``reference.py`` (plain PyTorch, the specification and test oracle),
``triton.py`` (the kernels and launch wrappers, imported lazily) and a public op in ``__init__.py`` that
dispatches through :func:`select_backend` (Triton for CUDA tensors, reference otherwise;
``ICML25_KERNELS_BACKEND=reference|triton`` forces one).
"""

from importlib.metadata import version as _distribution_version

from icml25.kernels._dispatch import BACKEND_ENV, select_backend, triton_available, triton_interpret
from icml25.kernels.report import Report
from icml25.kernels.threads import torch_threads

__version__ = _distribution_version("icml25-kernels")

__all__ = [
    "BACKEND_ENV",
    "Report",
    "__version__",
    "select_backend",
    "torch_threads",
    "triton_available",
    "triton_interpret",
]
