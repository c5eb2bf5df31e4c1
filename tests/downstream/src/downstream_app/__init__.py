"""A downstream user of icml25-causal-discovery: imports the public API, typed through ``py.typed``."""

from __future__ import annotations

import numpy as np

from icml25.causal_discovery import ARROW
from icml25.kernels import Report, select_backend


def lagged_parents(x: np.ndarray, lag_max: int = 4) -> dict[tuple[int, int], int]:
    """``{(cause, effect): smallest lag}`` found by ARROW in front of a linear Granger base."""
    model = ARROW(base="granger", lag_max=lag_max).fit(x)
    graph = model.to_networkx()
    return {(int(u), int(v)): int(data["lag"]) for u, v, data in graph.edges(data=True) if u != v}


def summarize(report: Report) -> str:
    """One line about a reproduction report."""
    return f"{report.paper}: {'PASS' if report.passed else 'FAIL'}"


def backend_name() -> str:
    import torch

    return select_backend(torch.zeros(1))
