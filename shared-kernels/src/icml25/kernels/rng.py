"""Random state for library code, without touching the caller's global generators.

Library functions take ``seed=`` (or ``generator=``) and never reseed or draw from the process-wide
generators behind the caller's back: a user who seeds their own pipeline and then calls a fit function
must get the same random stream afterwards as if the call had not happened. Only an experiment's
``run`` seeds the globals, on purpose, through :func:`icml25.kernels.experiment.seed_everything`.

Two tools cover every case:

* :func:`make_generator` turns ``seed`` / ``generator`` arguments into a local ``torch.Generator``, for
  code that draws its own randomness (``torch.randn(..., generator=g)``, ``torch.randperm(n, generator=g)``).
* :func:`isolated_rng` runs a block under a seeded *fork* of torch's global generator, restored on exit,
  for code whose randomness comes from inside torch (``nn.Linear`` initialisation, ``nn.Dropout``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["global_rng_state", "isolated_rng", "make_generator"]


def _check_seed(seed: object, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__}")
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"{name} must be in [0, 2**63), got {int(seed)}")
    return int(seed)


def make_generator(
    seed: int | None = None, generator: torch.Generator | None = None, device: str | torch.device = "cpu"
) -> torch.Generator:
    """A local ``torch.Generator``: ``generator`` itself when given, else a new one seeded with ``seed``
    (a nondeterministic seed when ``seed`` is None). Never the global generator."""
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        return generator
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(_check_seed(seed))
    return g


@contextlib.contextmanager
def isolated_rng(seed: int | None, devices: list[int] | None = None) -> Iterator[None]:
    """Run the block under torch's global generator seeded with ``seed`` and restore the caller's state on
    exit (``torch.random.fork_rng``), so module initialisation and dropout inside are reproducible and the
    caller's stream is untouched. ``seed=None`` forks without reseeding (still restored on exit)."""
    if seed is not None:
        seed = _check_seed(seed)
    if devices is None:
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def global_rng_state() -> tuple[bytes, tuple, object]:
    """A comparable snapshot of the process-wide generators (torch CPU, NumPy legacy, Python ``random``)."""
    import random

    np_state = np.random.get_state()  # noqa: NPY002 - reading the legacy global state is the point
    return (
        torch.random.get_rng_state().numpy().tobytes(),
        (np_state[0], np_state[1].tobytes(), *np_state[2:]),
        random.getstate(),
    )
