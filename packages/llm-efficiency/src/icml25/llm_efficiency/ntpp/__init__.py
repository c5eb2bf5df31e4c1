"""NTPP: Next-Token-Pair Prediction — ICML 2025, P24: dual-channel spoken-dialogue modelling.

Wang et al., "NTPP: Generative Speech Language Modeling for Dual-Channel Spoken Dialogue via Next-Token-Pair
Prediction", ICML 2025 (arXiv 2506.00975; demo audio-3059.pages.dev; official code github.com/Chaos96/NTPP).
One decoder-only transformer models both speakers' token streams jointly:
``p(a, b) = Π_t p(a_t | h_<t) · p(b_t | h_<t)``, the two tokens of a frame conditionally independent given
the history of both channels; at inference each frame costs one forward pass.

* :func:`interleave_pairs`, :func:`deinterleave_pairs`, :func:`pair_causal_mask`, :func:`ntpp_loss`,
  :func:`swap_channels`, :class:`DualChannelCollator`, :func:`turn_taking_stats` (``core.py``, torch only);
* ``NTPPModel`` (pair-causal LM wrapper with the official channel embedding on queries and keys, token
  position ids and ``duplex_generate``) and ``flat_duplex_generate`` (the flattened next-token baseline's
  decode loop) (``hf.py``, extra ``[hf]``, imported on first access).
"""

from __future__ import annotations

from icml25.llm_efficiency.ntpp.core import (
    DualChannelCollator,
    deinterleave_pairs,
    interleave_pairs,
    ntpp_loss,
    pair_causal_mask,
    swap_channels,
    turn_taking_stats,
)

__all__ = [
    "DualChannelCollator",
    "NTPPModel",
    "deinterleave_pairs",
    "flat_duplex_generate",
    "interleave_pairs",
    "ntpp_loss",
    "pair_causal_mask",
    "swap_channels",
    "turn_taking_stats",
]

_HF = ("NTPPModel", "flat_duplex_generate")


def __getattr__(name: str) -> object:
    # Lazy: the transformers integration needs the optional dependency (extra [hf]).
    if name in _HF:
        from icml25.llm_efficiency.ntpp import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
