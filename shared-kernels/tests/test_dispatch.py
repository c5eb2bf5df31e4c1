"""Backend selection (``icml25.kernels.select_backend``), independent of any op family."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import icml25.kernels._dispatch as dispatch
from icml25.kernels import BACKEND_ENV, select_backend

CPU = torch.zeros(2)
# select_backend only reads ``.is_cuda`` and ``.device``, so CUDA placement can be simulated without a GPU.
FAKE_CUDA = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)


@pytest.fixture
def with_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)


@pytest.fixture
def without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)


def test_auto_picks_reference_for_cpu_and_empty(with_triton: None) -> None:
    assert select_backend(CPU) == "reference"
    assert select_backend() == "reference"
    assert select_backend(FAKE_CUDA, CPU) == "reference"  # mixed devices: never guess


def test_auto_picks_triton_only_for_all_cuda_with_triton(with_triton: None) -> None:
    assert select_backend(FAKE_CUDA, FAKE_CUDA) == "triton"
    assert select_backend(FAKE_CUDA, backend="  AUTO ") == "triton"  # case and whitespace insensitive


def test_auto_falls_back_without_triton(without_triton: None) -> None:
    assert select_backend(FAKE_CUDA) == "reference"


def test_env_forces_reference_even_on_cuda(with_triton: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKEND_ENV, "reference")
    assert select_backend(FAKE_CUDA) == "reference"
    # A per-call backend wins over the environment.
    assert select_backend(FAKE_CUDA, backend="auto") == "triton"


def test_forced_triton_needs_cuda_or_interpreter(with_triton: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKEND_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(
        RuntimeError, match=r"ICML25_KERNELS_BACKEND='triton' needs CUDA tensors \(got devices \['cpu'\]\)"
    ):
        select_backend(CPU)
    assert select_backend(FAKE_CUDA) == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_backend(CPU) == "triton"


def test_forced_triton_without_triton_installed(without_triton: None) -> None:
    with pytest.raises(RuntimeError, match="not installed"):
        select_backend(FAKE_CUDA, backend="triton")


def test_unknown_backend_names_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        ValueError, match=r"backend must be one of \('auto', 'reference', 'triton'\), got 'cuda'"
    ):
        select_backend(CPU, backend="cuda")
    monkeypatch.setenv(BACKEND_ENV, "fast")
    with pytest.raises(ValueError, match=r"ICML25_KERNELS_BACKEND must be one of .* got 'fast'"):
        select_backend(CPU)
    monkeypatch.setenv(BACKEND_ENV, "")
    assert select_backend(CPU) == "reference"  # empty means auto
