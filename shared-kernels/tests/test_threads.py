"""``icml25.kernels.torch_threads``: the thread pin the paper experiments run under."""

from __future__ import annotations

import pytest
import torch

from icml25.kernels import torch_threads


def test_pins_and_restores_the_thread_count_also_on_error() -> None:
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"), torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ValueError), (-1, ValueError), (1.0, TypeError), (True, TypeError), ("1", TypeError)],
)
def test_bad_thread_count(bad: object, error: type[Exception]) -> None:
    before = torch.get_num_threads()
    with pytest.raises(error, match=r"n must be an int >= 1, got"), torch_threads(bad):  # type: ignore[arg-type]
        pass
    assert torch.get_num_threads() == before
