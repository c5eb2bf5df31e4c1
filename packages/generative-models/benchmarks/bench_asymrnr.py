"""AsymRnR: Video DiT Acceleration with Asymmetric Reduction and Restoration — ICML 2025, P21: where the
token reduction pays on CPU.

Times one attention call of :func:`icml25.generative_models.asymrnr.asymrnr_attention` (split, nearest-
destination matching, reduction of queries and keys/values, SDPA on the reduced tokens, restoration of the
queries) against plain ``F.scaled_dot_product_attention`` on the same **contiguous** ``[B, H, L, d]``
q, k, v (an earlier 2.5-4.5x came from non-contiguous inputs, which slow SDPA, not from the method), on
video-shaped token grids ``(F, H, W)`` (stride 2×2×2, no text tokens, float32), for equal query and
key/value ratios ρ:

* ``fresh``: the split and matching are computed in the call (the first step of each ``cache_steps`` window);
* ``cached``: a :class:`~icml25.generative_models.asymrnr.MatchCache` hit (the other steps of the window,
  the official default reuses a matching for 5 steps): only gather, SDPA and restore are paid.

Attention's cost grows as L² while the matching grows as L·L/8 (each source against the destinations) and
the gathers as L, so the reduction pays once SDPA dominates: the rows say at which L and ρ. The paired ratio
is SDPA time / AsymRnR time (> 1: AsymRnR is faster). Sizes: quick L = 1024, 4608 at ρ = 0.5, 0.75; default
L up to 8192 at ρ = 0.25, 0.5, 0.75 (CogVideoX's 13×30×45 = 17550 tokens is ``--grid 13 30 45``: several
seconds per SDPA call on one CPU thread).

    python packages/generative-models/benchmarks/bench_asymrnr.py [--quick] [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "shared-kernels" / "benchmarks"))
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.generative_models.asymrnr import MatchCache, asymrnr_attention


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument(
        "--grid", type=int, nargs=3, default=None, help="one (F, H, W) grid instead of the list"
    )
    args = parse_bench_args(parser, argv)
    rows = Rows("asymrnr", args)
    if args.quick:
        grids, ratios = [(4, 16, 16), (8, 24, 24)], (0.5, 0.75)
    else:
        grids, ratios = [(4, 16, 16), (8, 24, 24), (8, 32, 32)], (0.25, 0.5, 0.75)
    if args.grid:
        grids = [tuple(args.grid)]
    H, d = args.heads, args.dim
    g = torch.Generator().manual_seed(0)
    torch.set_grad_enabled(False)
    print(
        f"B=1 H={H} d={d} float32 contiguous, stride 2x2x2, threads={torch.get_num_threads()} pairs={args.reps}"
    )
    print(
        f"{'grid':>12} {'L':>6} {'rho':>5} | {'sdpa ms':>8} {'fresh ms':>9} {'x sdpa':>7} | {'sdpa ms':>8} {'cached ms':>9} {'x sdpa':>7} {'rel err':>8}"
    )
    for grid in grids:
        L = grid[0] * grid[1] * grid[2]
        # smooth "video" tokens (neighbouring tokens similar), as the method assumes
        base = torch.randn(1, H, grid[0] // 2 + 1, grid[1] // 4 + 1, grid[2] // 4 + 1, d, generator=g)
        field = (
            base.repeat_interleave(2, 2)
            .repeat_interleave(4, 3)
            .repeat_interleave(4, 4)[:, :, : grid[0], : grid[1], : grid[2]]
        )
        q, k, v = (
            (field + 0.3 * torch.randn(field.shape, generator=g)).reshape(1, H, L, d).contiguous()
            for _ in range(3)
        )
        assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        dense = F.scaled_dot_product_attention(q, k, v)
        sdpa = partial(F.scaled_dot_product_attention, q, k, v)
        for rho in ratios:
            kw = {"ratio_q": rho, "ratio_kv": rho, "check_finite": False}
            gen = torch.Generator().manual_seed(1)
            fresh = partial(asymrnr_attention, q, k, v, grid, generator=gen, **kw)
            t_f, t_s1, r_f = paired_speedup(fresh, sdpa, args.reps, cuda=False)
            cache = MatchCache(cache_steps=10**9, generator=torch.Generator().manual_seed(1))
            cached = partial(asymrnr_attention, q, k, v, grid, cache=cache, cache_key="b0", step=1, **kw)
            out = cached()  # fills the cache (the warm-up call repeats it as a hit)
            err = float((out - dense).norm() / dense.norm())
            t_c, t_s2, r_c = paired_speedup(cached, sdpa, args.reps, cuda=False)
            print(
                f"{grid!s:>12} {L:>6} {rho:>5.2f} | {t_s1 * 1e3:8.2f} {t_f * 1e3:9.2f} {r_f:7.2f} | "
                f"{t_s2 * 1e3:8.2f} {t_c * 1e3:9.2f} {r_c:7.2f} {err:8.3f}",
                flush=True,
            )
            setting = f"grid {grid} L={L} rho_q=rho_kv={rho} H={H} d={d}"
            rows.add(setting, "AsymRnR attention (fresh matching)", "SDPA (contiguous)", t_f, t_s1, r_f,
                     "one attention call incl. split + matching + reduce + restore (CPU)")  # fmt: skip
            rows.add(setting, "AsymRnR attention (cached matching)", "SDPA (contiguous)", t_c, t_s2, r_c,
                     "one attention call with a MatchCache hit (reduce + SDPA + restore)", rel_err=err)  # fmt: skip
            t_a = (t_f + 4 * t_c) / 5  # one fresh + four cached calls: the official 5-step reuse window
            rows.add(setting, "AsymRnR, 5-step window (1 fresh + 4 cached)", "SDPA (contiguous)", t_a, (t_s1 + t_s2) / 2,
                     (t_s1 + t_s2) / 2 / t_a, "derived from the two medians above (not a paired ratio)")  # fmt: skip
    rows.note(
        "AsymRnR (CPU, float32, contiguous q/k/v, equal q and kv ratios): the reduction shrinks SDPA's L^2 work by "
        "(1-rho)^2 but pays a nearest-destination matching (~L^2/8 distances per head) when the matching is "
        "fresh and gathers/restores either way; read the rows for the L and rho where the ratio passes 1."
    )


if __name__ == "__main__":
    main()
