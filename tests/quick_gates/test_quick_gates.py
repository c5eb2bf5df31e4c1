"""Every implemented paper's quick gate on another CPU's arithmetic (``nox -s quick-gates``).

The package sessions run each quick reproduction with the machine's native vector kernels and one thread.
This session runs them again with ``ATEN_CPU_CAPABILITY=default`` (PyTorch's scalar kernels: other
reduction orders, as on a CPU with other vector units) and two threads, and asserts the outcome the catalog
expects in quick mode. A gate tuned to one machine's rounding flips here, as it did between the AMD EPYC it
was written on and an Intel Xeon. Not collected by the integration session (it needs every package's
extras); ``nox -s quick-gates`` sets the environment, and refuses to run without it.
"""

from __future__ import annotations

import importlib
import os

import catalog
import pytest

from icml25.kernels import reproduce

PAPERS = [p for p in catalog.load() if p.status == "implemented"]


@pytest.fixture(scope="module", autouse=True)
def _another_cpu() -> None:
    if os.environ.get("ATEN_CPU_CAPABILITY") != "default":
        pytest.fail(
            "run through `nox -s quick-gates`, which sets ATEN_CPU_CAPABILITY=default before torch loads"
        )


@pytest.mark.parametrize("paper", PAPERS, ids=[p.id for p in PAPERS])
def test_the_quick_gate_gives_the_expected_outcome_on_the_default_cpu_path(paper: catalog.Paper) -> None:
    import torch

    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
    expectation = reproduce.catalog_expectations()[paper.id]
    report = importlib.import_module(paper.entry_point).run(quick=True, seed=0)
    assert not report.inconclusive, f"{paper.id}: preconditions failed: {report.failed_preconditions}"
    expected_pass = not expectation.misses(quick=True)
    assert report.passed is expected_pass, (
        f"{paper.id} quick {'missed' if expected_pass else 'passed'} on the default CPU path "
        f"(failed checks: {report.failed_checks}; metrics: {report.metrics})"
    )
