"""Benchmark icml25.kernels.nn_match: nearest-neighbour matching without the dense similarity matrix.

Prints, for Ns sources and Nd destinations (C features per head, G = batch × heads), the time of

* ``dense``: the dense reference (the full ``Ns × Nd`` matrix, then ``argmax``; the baseline);
* ``chunked``: the streaming torch path (blocks of 1024, running max/argmax);
* ``triton``: the tiled running-argmax kernel (CUDA only);

as speed ratios against the dense reference, the dense matrix's size and whether the indices agree.
Forward only; one CPU thread on CPU. Run: ``python shared-kernels/benchmarks/bench_nn_match.py [--quick]``.
"""

from __future__ import annotations

import argparse

import torch
from _timing import median_time

from icml25.kernels import triton_available
from icml25.kernels.nn_match import nearest_neighbor, nearest_neighbor_reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small shapes, few repetitions")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # the shared CPU machine makes multi-thread timings unusable
    if device == "cuda":
        shapes, G, C, reps = [(2200, 15300), (8000, 8000)], 48, 64, 10  # CogVideoX-5B-like, stride 2³
    else:
        shapes, G, C, reps = [(512, 2048), (2048, 4096)], 4, 64, 3
    if args.quick:
        shapes, G, C, reps = [(256, 512), (1024, 2048)], 2, 64, 2
    backends = ["chunked"] + (["triton"] if device == "cuda" and triton_available() else [])
    g = torch.Generator().manual_seed(0)
    print(f"device={device}  G={G} C={C}  backends={backends}  metric=euclidean")
    print(
        f"{'Ns':>6} {'Nd':>6} {'dense MB':>9} | {'dense ms':>9} | "
        + " | ".join(f"{b + ' ms':>12} {'x dense':>7} {'same idx':>8}" for b in backends)
    )
    for ns, nd in shapes:
        x = torch.randn(G, ns, C, generator=g).to(device)
        y = torch.randn(G, nd, C, generator=g).to(device)
        t_dense, (_, i_dense) = median_time(lambda x=x, y=y: nearest_neighbor_reference(x, y), reps)
        cols = []
        for b in backends:
            be = "reference" if b == "chunked" else "triton"
            t, (_, i) = median_time(
                lambda x=x, y=y, be=be: nearest_neighbor(x, y, check_finite=False, backend=be), reps
            )
            cols.append(f"{t * 1e3:12.3f} {t_dense / t:7.2f} {float((i == i_dense).float().mean()):8.4f}")
        mb = G * ns * nd * 4 / 2**20
        print(f"{ns:>6} {nd:>6} {mb:9.1f} | {t_dense * 1e3:9.3f} | " + " | ".join(cols))


if __name__ == "__main__":
    main()
