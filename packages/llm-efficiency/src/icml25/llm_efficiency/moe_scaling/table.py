"""Joint MoE Scaling Laws: Mixture of Experts Can Be Memory Efficient — ICML 2025, P09: budget table and CLI.

Ludziejewski et al., ICML 2025 (arXiv:2502.05172). For a user's compute and memory budget,
:func:`budget_table` lists the memory-constrained optimum for each expert count (``E*``, active
parameters, tokens, tokens per parameter, total parameters, predicted loss) and marks the best one and the
dense optimum at the same memory. ``python -m icml25.llm_efficiency.moe_scaling --flops 1e21 --memory 2e9``
prints it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from icml25.llm_efficiency.moe_scaling.law import (
    PAPER_COEFFS_UNVERIFIED,
    Allocation,
    JointMoEScalingLaw,
)

__all__ = ["budget_table", "main"]


def _row(a: Allocation, mark: str) -> str:
    return (
        f"{int(a.experts):>4d} {a.n_act:>11.3e} {a.tokens:>11.3e} {a.tokens_per_param:>9.1f} "
        f"{a.total_params:>11.3e} {a.loss:>8.4f} {mark}"
    )


def budget_table(
    flops: float,
    max_total_params: float,
    expert_choices: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    law: JointMoEScalingLaw | None = None,
    ffn_fraction: float = 2 / 3,
    top_k: int = 1,
    flops_per_param_token: float = 6.0,
    min_active_params: float = 1e6,
) -> str:
    """The per-expert-count optima under ``flops`` and ``max_total_params`` as a text table.

    ``law`` defaults to the law with :data:`PAPER_COEFFS_UNVERIFIED` (its numbers are unverified against
    the paper: fit your own runs with :meth:`JointMoEScalingLaw.fit` for decisions). Rows: ``E``, active
    parameters ``N``, tokens ``D``, ``D/N``, total parameters, predicted loss; ``*`` marks the best row
    and ``dense`` the ``E = 1`` row. Expert counts whose memory cap is below ``min_active_params`` are
    left out; a budget that fits no model raises ``ValueError`` ("infeasible").
    """
    if law is None:
        law = JointMoEScalingLaw(PAPER_COEFFS_UNVERIFIED)
    elif not isinstance(law, JointMoEScalingLaw):
        raise TypeError(f"law must be a JointMoEScalingLaw or None, got {type(law).__name__}")
    per = law.memory_constrained_optimal(
        flops, max_total_params, expert_choices, ffn_fraction, top_k, flops_per_param_token,
        min_active_params=min_active_params, return_all=True,
    )  # fmt: skip
    best = min(per, key=lambda a: (a.loss, a.experts))
    head = (
        f"compute {flops:.3g} FLOPs ({flops_per_param_token:g}·N·D), memory {max_total_params:.3g} params, "
        f"top-{top_k}, FFN share {ffn_fraction:.3g}\n"
        f"{'E':>4} {'N_active':>11} {'tokens':>11} {'D/N':>9} {'N_total':>11} {'loss':>8}"
    )
    rows = [_row(a, ("*" if a is best else "") + (" dense" if a.experts == 1 else "")) for a in per]
    return "\n".join([head, *rows])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m icml25.llm_efficiency.moe_scaling --flops F --memory M [--experts 1 2 4 ...]``."""
    p = argparse.ArgumentParser(
        prog="python -m icml25.llm_efficiency.moe_scaling",
        description="Loss-optimal MoE/dense configurations under a compute and memory budget "
        "(joint MoE scaling law, Ludziejewski et al., ICML 2025; default constants unverified).",
    )
    p.add_argument("--flops", type=float, required=True, help="training compute in FLOPs")
    p.add_argument("--memory", type=float, required=True, help="max total parameters held in memory")
    p.add_argument("--experts", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--ffn-fraction", type=float, default=2 / 3, help="FFN share of the active parameters")
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--flops-per-param-token", type=float, default=6.0)
    args = p.parse_args(argv)
    try:
        print(
            budget_table(
                args.flops, args.memory, args.experts, ffn_fraction=args.ffn_fraction, top_k=args.top_k,
                flops_per_param_token=args.flops_per_param_token,
            )
        )  # fmt: skip
    except ValueError as err:
        p.error(str(err))
    return 0
