"""``torch_threads``: the intra-op thread pin that the paper experiments share.

It lives in ``icml25-kernels`` for the same reason as :class:`~icml25.kernels.Report`: that is the one
distribution every area package depends on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from icml25.kernels.checks import check_int


@contextmanager
def torch_threads(n: int = 1) -> Iterator[None]:
    """Run torch ops on ``n`` intra-op threads, then restore the caller's setting (also on error).

    Why experiments pin it: their networks are tiny, so extra threads only add synchronisation (on a
    2-core CI machine tiny multi-threaded matmuls are several times slower), and a fixed count makes
    reductions, hence chaotic rollouts, bit-identical across machines.
    """
    n = check_int(n, "n", low=1)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
