"""Benchmark: sparse top-k decode vs the dense ``z @ W_dec`` of a sparse autoencoder.

Prints, for SAE-like shapes, the time of

* ``dense``: ``z @ W_dec`` with ``z`` already dense [B, n] (the usual SAE decode; scatter not counted);
* ``reference``: ``topk_decode`` via ``F.embedding_bag`` (any device);
* ``triton``: the Triton kernel (CUDA only);
* ``prefix``: all L nested levels from one top-k (``topk_decode_prefix``) vs L dense decodes;

with speed ratios against the dense baseline and the max abs error against it. Run:
``python shared-kernels/benchmarks/bench_topk_decode.py [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _timing import call_times

from icml25.kernels import triton_available
from icml25.kernels.topk_decode import topk_decode, topk_decode_prefix


def _time(fn, reps: int) -> float:
    """Mean seconds per call over ``reps`` calls after one warm-up call (which compiles Triton)."""
    return statistics.fmean(call_times(fn, reps, cuda=torch.cuda.is_available())[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small shapes, few repetitions")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    if device == "cuda":
        shapes = [(4096, 16384, 768, 32), (4096, 65536, 768, 64), (8192, 32768, 1024, 128)]
        reps = 20
    else:
        shapes = [(1024, 4096, 256, 32), (1024, 16384, 512, 64)]
        reps = 5
    if args.quick:
        shapes, reps = [(256, 2048, 128, 16)], 3
    backends = ["reference"] + (["triton"] if device == "cuda" and triton_available() else [])
    print(f"device={device}  backends={backends}")
    header = f"{'B':>6} {'n':>6} {'d':>5} {'k':>4} | {'dense ms':>9} | " + " | ".join(
        f"{b + ' ms':>13} {'x dense':>8} {'max err':>8}" for b in backends
    )
    print(header)
    for B, n, d, k in shapes:
        W = torch.randn(n, d, device=device) / d**0.5
        pre = torch.randn(B, n, device=device)
        values, idx = torch.topk(pre, k, dim=-1)
        z = torch.zeros_like(pre).scatter(-1, idx, values)
        t_dense = _time(lambda z=z, W=W: z @ W, reps)
        dense = z @ W
        cols = []
        for b in backends:
            t = _time(lambda b=b, values=values, idx=idx, W=W: topk_decode(values, idx, W, backend=b), reps)
            err = (topk_decode(values, idx, W, backend=b) - dense).abs().max().item()
            cols.append(f"{t * 1e3:13.3f} {t_dense / t:8.2f} {err:8.1e}")
        print(f"{B:>6} {n:>6} {d:>5} {k:>4} | {t_dense * 1e3:9.3f} | " + " | ".join(cols))

    # Nested levels (MSAE): one sorted top-k_max, all prefix decodes vs one dense decode per level.
    B, n, d = shapes[0][:3]
    ks = [4, 8, 16, 32, 64, 128] if not args.quick else [2, 4, 8, 16]
    W = torch.randn(n, d, device=device) / d**0.5
    pre = torch.randn(B, n, device=device)
    values, idx = torch.topk(pre, ks[-1], dim=-1)
    zs = [torch.zeros_like(pre).scatter(-1, idx[:, :k], values[:, :k]) for k in ks]
    t_dense = _time(lambda: [z @ W for z in zs], reps)
    print(f"\nprefix decode, ks={ks}, B={B} n={n} d={d}: {len(ks)} dense decodes {t_dense * 1e3:.3f} ms")
    for b in backends:
        t = _time(lambda b=b: topk_decode_prefix(values, idx, W, ks, backend=b), reps)
        out = topk_decode_prefix(values, idx, W, ks, backend=b)
        err = max((out[i] - zs[i] @ W).abs().max().item() for i in range(len(ks)))
        print(f"  {b:>9}: {t * 1e3:.3f} ms  ({t_dense / t:.2f}x the dense decodes, max err {err:.1e})")


if __name__ == "__main__":
    main()
