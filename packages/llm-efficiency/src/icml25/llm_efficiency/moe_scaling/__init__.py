"""Joint MoE Scaling Laws: Mixture of Experts Can Be Memory Efficient — ICML 2025, P09: law, fitter, budgets, tiny MoE.

Ludziejewski et al., ICML 2025 (arXiv:2502.05172; no official code release was found).

* :mod:`.law` — :class:`JointMoEScalingLaw` (evaluation, Huber/L-BFGS fitter, compute-optimal and
  memory-constrained optimisers), :func:`total_params`, :func:`lr_rule`, :data:`PAPER_COEFFS_UNVERIFIED`;
* :mod:`.table` — :func:`budget_table`, the per-expert-count table for a user's budget, also
  ``python -m icml25.llm_efficiency.moe_scaling --flops 1e21 --memory 2e9``;
* :mod:`.tiny` — a top-k MoE FFN with the Switch load-balancing loss, a tiny decoder and a synthetic
  topic-bigram corpus for a CPU-scale empirical check;
* :mod:`.hf` — :func:`hf_moe_shape` / :class:`MoEShape`: the law's ``N``, ``E``, ``k`` and total parameters
  counted on a transformers model or config (extra ``[hf]``, imported on first access).
"""

from __future__ import annotations

from icml25.llm_efficiency.moe_scaling.law import (
    PAPER_COEFFS_UNVERIFIED,
    Allocation,
    JointLawParams,
    JointMoEScalingLaw,
    lr_rule,
    total_params,
)
from icml25.llm_efficiency.moe_scaling.table import budget_table
from icml25.llm_efficiency.moe_scaling.tiny import MoEFFN, TinyDecoder, TopicBigramCorpus

__all__ = [
    "PAPER_COEFFS_UNVERIFIED",
    "Allocation",
    "JointLawParams",
    "JointMoEScalingLaw",
    "MoEFFN",
    "MoEShape",
    "TinyDecoder",
    "TopicBigramCorpus",
    "budget_table",
    "hf_moe_shape",
    "lr_rule",
    "total_params",
]


def __getattr__(name: str) -> object:
    # Lazy: the transformers integration needs the optional dependency (extra [hf]).
    if name in ("hf_moe_shape", "MoEShape"):
        from icml25.llm_efficiency.moe_scaling import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
