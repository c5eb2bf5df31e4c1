"""Test configuration of icml25-federated."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Flower simulations start a Ray cluster (about a minute on 2 cores); they are also marked `slow`.
    config.addinivalue_line("markers", "integration: runs an external framework end to end (Flower + Ray)")
