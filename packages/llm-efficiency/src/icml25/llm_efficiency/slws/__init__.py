"""Stochastic Layer-Wise Shuffle for Vision Mamba — ICML 2025, P13: SLWS, its schedules, a small Vision Mamba.

SLWS (Huang et al., "Stochastic Layer-Wise Shuffle for Improving Vision Mamba Training", ICML 2025,
arXiv 2408.17081; official code ``huangzizheng01/ShuffleMamba``): a training-only regulariser that runs
layer ``l`` on a randomly permuted token sequence with probability ``P · l / (N - 1)`` and restores the
order of its outputs.

* ``shuffle.py`` — :func:`shuffle_forward`, :class:`ShuffledLayer`, :class:`StochasticLayerShuffle`,
  :func:`apply_slws`, :func:`linear_shuffle_schedule`, :func:`constant_shuffle_schedule`;
* ``vim.py`` — :class:`VimTiny`, :class:`VimBlock`, :class:`BiMambaMixer` on the selective-scan kernel
  :func:`icml25.kernels.selective_scan.selective_scan`;
* ``hf.py`` — :func:`apply_slws_hf` for transformers Mamba models (extra ``[hf]``, imported on first use).
"""

from __future__ import annotations

from typing import Any

from icml25.llm_efficiency.slws.shuffle import (
    ShuffledLayer,
    StochasticLayerShuffle,
    apply_slws,
    constant_shuffle_schedule,
    linear_shuffle_schedule,
    shuffle_forward,
)
from icml25.llm_efficiency.slws.vim import BiMambaMixer, VimBlock, VimTiny

__all__ = [
    "BiMambaMixer",
    "ShuffledLayer",
    "StochasticLayerShuffle",
    "VimBlock",
    "VimTiny",
    "apply_slws",
    "apply_slws_hf",
    "constant_shuffle_schedule",
    "linear_shuffle_schedule",
    "shuffle_forward",
]


def __getattr__(name: str) -> Any:
    if name == "apply_slws_hf":  # the [hf] extra: transformers is imported on first use only
        from icml25.llm_efficiency.slws.hf import apply_slws_hf

        return apply_slws_hf
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
