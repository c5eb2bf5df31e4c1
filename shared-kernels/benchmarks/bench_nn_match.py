"""Benchmark icml25.kernels.nn_match: nearest-neighbour matching without the dense similarity matrix.

Prints, for Ns sources and Nd destinations (C features per head, G = batch × heads), the time of

* ``dense``: the dense reference (the full ``Ns × Nd`` matrix, then ``argmax``; the baseline);
* ``chunked``: the streaming torch path (blocks of 1024, running max/argmax);
* ``triton``: the tiled running-argmax kernel (CUDA only);

as speed ratios against the dense reference (paired: warm-up, then ``--reps`` alternating calls, median
of the per-pair ratios), the dense matrix's size and whether the indices agree. Forward only.

    python shared-kernels/benchmarks/bench_nn_match.py [--quick] [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

import torch
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.kernels import triton_available
from icml25.kernels.nn_match import nearest_neighbor, nearest_neighbor_reference


def main(argv: list[str] | None = None) -> None:
    args = parse_bench_args(bench_parser(__doc__), argv)
    rows = Rows("nn_match", args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        shapes, G, C = [(2200, 15300), (8000, 8000)], 48, 64  # CogVideoX-5B-like, stride 2³
    else:
        shapes, G, C = [(512, 2048), (2048, 4096)], 4, 64
    if args.quick:
        shapes, G, C = [(256, 512), (1024, 2048), (2048, 8192)], 2, 64
    backends = ["chunked"] + (["triton"] if device == "cuda" and triton_available() else [])
    g = torch.Generator().manual_seed(0)
    print(
        f"device={device}  G={G} C={C}  backends={backends}  metric=euclidean  threads={torch.get_num_threads()} pairs={args.reps}"
    )
    print(
        f"{'Ns':>6} {'Nd':>6} {'dense MB':>9} | "
        + " | ".join(f"{'dense ms':>9} {b + ' ms':>12} {'x dense':>7} {'same idx':>8}" for b in backends)
    )
    for ns, nd in shapes:
        x = torch.randn(G, ns, C, generator=g).to(device)
        y = torch.randn(G, nd, C, generator=g).to(device)
        _, i_dense = nearest_neighbor_reference(x, y)
        mb = G * ns * nd * 4 / 2**20
        cols = []
        for b in backends:
            be = "reference" if b == "chunked" else "triton"
            _, i = nearest_neighbor(x, y, check_finite=False, backend=be)
            same = float((i == i_dense).float().mean())
            t, t_dense, ratio = paired_speedup(
                lambda x=x, y=y, be=be: nearest_neighbor(x, y, check_finite=False, backend=be),
                lambda x=x, y=y: nearest_neighbor_reference(x, y),
                args.reps,
                cuda=device == "cuda",
            )
            cols.append(f"{t_dense * 1e3:9.3f} {t * 1e3:12.3f} {ratio:7.2f} {same:8.4f}")
            rows.add(
                f"G={G} Ns={ns} Nd={nd} C={C} ({device})", b, "dense matrix + argmax", t, t_dense, ratio,
                f"nearest destination of every source without the {mb:.0f} MB dense similarity matrix",
                same_idx=same,
            )  # fmt: skip
        print(f"{ns:>6} {nd:>6} {mb:9.1f} | " + " | ".join(cols))


if __name__ == "__main__":
    main()
