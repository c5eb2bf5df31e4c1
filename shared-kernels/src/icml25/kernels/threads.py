"""``torch_threads``: the intra-op thread pin that the paper experiments share.

It lives in ``icml25-kernels`` for the same reason as :class:`~icml25.kernels.Report`: that is the one
distribution every area package depends on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int = 1) -> Iterator[None]:
    """Run torch ops on ``n`` intra-op threads, then restore the caller's setting (also on error).

    Why experiments pin it: their networks are tiny, so extra threads only add synchronisation (on a
    2-core CI machine tiny multi-threaded matmuls are several times slower), and a fixed count makes
    reductions, hence chaotic rollouts, bit-identical across machines.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
