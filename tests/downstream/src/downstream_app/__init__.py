"""A downstream user of icml25-causal-discovery: imports the public API, typed through ``py.typed``."""

from __future__ import annotations

import icml25.causal_discovery as cd
from icml25.kernels import Report, select_backend


def summarize(report: Report) -> str:
    """One line about a reproduction report."""
    return f"{report.paper}: {'PASS' if report.passed else 'FAIL'} ({cd.__version__})"


def backend_name() -> str:
    import torch

    return select_backend(torch.zeros(1))
