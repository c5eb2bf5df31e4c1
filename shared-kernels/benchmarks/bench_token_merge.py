"""Benchmark icml25.kernels.token_merge: ToMA's tiled selection + soft merge/unmerge vs ToMeSD's matching.

Prints, for token grids of N tokens (C features, B images) and merge ratios r, the time of

* ``tomesd``: ToMeSD's random 2×2 bipartite matching, merge and unmerge (argsort + gather +
  ``scatter_reduce``, :func:`bipartite_soft_matching_2d`; the baseline, r capped at 0.75);
* ``reference``: ToMA with the torch reference (greedy facility location per tile, soft merge, unmerge);
* ``triton``: ToMA with the Triton kernels (CUDA only);

as speed ratios against ToMeSD (paired: warm-up, then ``--reps`` alternating calls, median of the per-pair
ratios) and against the ToMA reference, with the max abs difference of the Triton merge/unmerge output from
the reference one. Forward only. End-to-end latency in a diffusers UNet:
``packages/generative-models/benchmarks/bench_toma_unet.py``.

    python shared-kernels/benchmarks/bench_token_merge.py [--quick] [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

import math

import torch
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.kernels import triton_available
from icml25.kernels.token_merge import (
    bipartite_soft_matching_2d,
    facility_location_greedy,
    soft_unmerge,
    tile_soft_merge,
)


def toma_round_trip(
    x: torch.Tensor, side: int, tiles_per_side: int, ratio: float, backend: str
) -> torch.Tensor:
    """Tile, select, soft-merge and unmerge ``x [B, N, C]`` (the per-recompute cost of ToMA)."""
    B, N, C = x.shape
    t, th = tiles_per_side, side // tiles_per_side
    g = x.reshape(B, t, th, t, th, C).permute(0, 1, 3, 2, 4, 5).reshape(B * t * t, th * th, C)
    d = max(1, math.floor(th * th * (1 - ratio)))
    dst = facility_location_greedy(g, d, check_finite=False, backend=backend)
    merged, A = tile_soft_merge(g, dst, scale=1000.0, check_finite=False, backend=backend)
    back = soft_unmerge(merged, A)
    return back.reshape(B, t, t, th, th, C).permute(0, 1, 3, 2, 4, 5).reshape(B, N, C)


def main(argv: list[str] | None = None) -> None:
    args = parse_bench_args(bench_parser(__doc__), argv)
    rows = Rows("token_merge", args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        sides, B, C, tps = [64, 128], 2, 3072, 16  # N = 4096 / 16384, 16 / 64 tokens per tile
    else:
        sides, B, C, tps = [32, 64], 1, 256, 4
    if args.quick:
        sides, B, C, tps = [16, 32], 1, 64, 4
    backends = ["reference"] + (["triton"] if device == "cuda" and triton_available() else [])
    g = torch.Generator().manual_seed(0)
    print(
        f"device={device}  B={B} C={C} tiles={tps}x{tps}  backends={backends}  threads={torch.get_num_threads()} pairs={args.reps}"
    )
    print(
        f"{'N':>6} {'r':>5} | "
        + " | ".join(f"{'tomesd ms':>9} {b + ' ms':>13} {'x tomesd':>8}" for b in backends)
        + (" | x ref  max err" if "triton" in backends else "")
    )
    for side in sides:
        N = side * side
        x = torch.randn(B, N, C, generator=g).to(device)
        for r in (0.25, 0.5, 0.75):

            def tomesd(x=x, side=side, r=r, N=N):
                merge, unmerge = bipartite_soft_matching_2d(x, side, side, int(N * r), check_finite=False)
                return unmerge(merge(x))

            cols, outs, times = [], {}, {}
            for b in backends:
                fn = lambda x=x, side=side, r=r, b=b: toma_round_trip(x, side, tps, r, b)  # noqa: E731
                outs[b] = fn()
                t, t_tome, ratio = paired_speedup(fn, tomesd, args.reps, cuda=device == "cuda")
                times[b] = t
                cols.append(f"{t_tome * 1e3:9.3f} {t * 1e3:13.3f} {ratio:8.2f}")
                rows.add(
                    f"N={N} r={r} B={B} C={C} tiles={tps}x{tps} ({device})", f"ToMA {b} (select+merge+unmerge)",
                    "ToMeSD bipartite matching", t, t_tome, ratio,
                    "one merge-plan recompute + merge + unmerge round trip (kernel level)",
                )  # fmt: skip
            tail = ""
            if "triton" in outs:
                err = (outs["triton"] - outs["reference"]).abs().max().item()
                tail = f" | {times['reference'] / times['triton']:5.2f} {err:8.1e}"
            print(f"{N:>6} {r:>5.2f} | " + " | ".join(cols) + tail)


if __name__ == "__main__":
    main()
