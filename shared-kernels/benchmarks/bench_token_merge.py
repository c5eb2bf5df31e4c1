"""Benchmark icml25.kernels.token_merge: ToMA's tiled selection + soft merge/unmerge vs ToMeSD's matching.

Prints, for token grids of N tokens (C features, B images) and merge ratios r, the time of

* ``tomesd``: ToMeSD's random 2×2 bipartite matching, merge and unmerge (argsort + gather +
  ``scatter_reduce``, :func:`bipartite_soft_matching_2d`; the baseline, r capped at 0.75);
* ``reference``: ToMA with the torch reference (greedy facility location per tile, soft merge, unmerge);
* ``triton``: ToMA with the Triton kernels (CUDA only);

as speed ratios against ToMeSD and against the ToMA reference, with the max abs difference of the Triton
merge/unmerge output from the reference one. Forward only; one CPU thread on CPU.
Run: ``python shared-kernels/benchmarks/bench_token_merge.py [--quick]``.
"""

from __future__ import annotations

import argparse
import math

import torch
from _timing import median_time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small grids, few repetitions")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # the shared CPU machine makes multi-thread timings unusable
    if device == "cuda":
        sides, B, C, reps, tps = [64, 128], 2, 3072, 10, 16  # N = 4096 / 16384, 16 / 64 tokens per tile
    else:
        sides, B, C, reps, tps = [32, 64], 1, 256, 3, 4
    if args.quick:
        sides, B, C, reps, tps = [16, 32], 1, 64, 2, 4
    backends = ["reference"] + (["triton"] if device == "cuda" and triton_available() else [])
    g = torch.Generator().manual_seed(0)
    print(f"device={device}  B={B} C={C} tiles={tps}x{tps}  backends={backends}")
    print(
        f"{'N':>6} {'r':>5} | {'tomesd ms':>9} | "
        + " | ".join(f"{b + ' ms':>13} {'x tomesd':>8}" for b in backends)
        + (" | x ref  max err" if "triton" in backends else "")
    )
    for side in sides:
        N = side * side
        x = torch.randn(B, N, C, generator=g).to(device)
        for r in (0.25, 0.5, 0.75):

            def tomesd(x=x, side=side, r=r, N=N):
                merge, unmerge = bipartite_soft_matching_2d(x, side, side, int(N * r), check_finite=False)
                return unmerge(merge(x))

            t_tome, _ = median_time(tomesd, reps)
            cols, outs, times = [], {}, {}
            for b in backends:
                t, out = median_time(
                    lambda x=x, side=side, r=r, b=b: toma_round_trip(x, side, tps, r, b), reps
                )
                outs[b], times[b] = out, t
                cols.append(f"{t * 1e3:13.3f} {t_tome / t:8.2f}")
            tail = ""
            if "triton" in outs:
                err = (outs["triton"] - outs["reference"]).abs().max().item()
                tail = f" | {times['reference'] / times['triton']:5.2f} {err:8.1e}"
            print(f"{N:>6} {r:>5.2f} | {t_tome * 1e3:9.3f} | " + " | ".join(cols) + tail)


if __name__ == "__main__":
    main()
