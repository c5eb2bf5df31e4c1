"""PENCIL: Long Thoughts with Short Memory — ICML 2025, P11: seeded trace generators (3-SAT, QBF, sequential sum).

Each generator returns examples ``{"prompt": [words], "trace": [words], "label": ...}``; the traces carry the
``[CALL]``/``[SEP]``/``[RETURN]`` markers, so one full trace serves both PENCIL (reduced) and chain of thought.
"""

from __future__ import annotations

from icml25.llm_efficiency.pencil.generators.arithmetic import generate_seqsum, seqsum_geometry, seqsum_words
from icml25.llm_efficiency.pencil.generators.qbf import brute_force_qbf, generate_qbf, qbf_trace
from icml25.llm_efficiency.pencil.generators.sat import brute_force_sat, dpll_trace, format_cnf, generate_sat

__all__ = [
    "brute_force_qbf",
    "brute_force_sat",
    "dpll_trace",
    "format_cnf",
    "generate_qbf",
    "generate_sat",
    "generate_seqsum",
    "qbf_trace",
    "seqsum_geometry",
    "seqsum_words",
]
