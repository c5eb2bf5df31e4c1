"""Benchmark: sparse top-k decode vs the dense ``z @ W_dec`` of a sparse autoencoder.

Prints, for SAE-like shapes, the time of

* ``dense``: ``z @ W_dec`` with ``z`` already dense [B, n] (the usual SAE decode; scatter not counted; the
  baseline);
* ``reference``: ``topk_decode`` via ``F.embedding_bag`` (any device);
* ``triton``: the Triton kernel (CUDA only);
* ``prefix``: all L nested levels from one top-k (``topk_decode_prefix``) vs L dense decodes;

with speed ratios against the dense baseline (paired: warm-up, then ``--reps`` alternating calls, median of
the per-pair ratios) and the max abs error against it.

    python shared-kernels/benchmarks/bench_topk_decode.py [--quick] [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

import torch
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.kernels import triton_available
from icml25.kernels.topk_decode import topk_decode, topk_decode_prefix


def main(argv: list[str] | None = None) -> None:
    args = parse_bench_args(bench_parser(__doc__), argv)
    rows = Rows("topk_decode", args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    torch.manual_seed(0)
    if cuda:
        shapes = [(4096, 16384, 768, 32), (4096, 65536, 768, 64), (8192, 32768, 1024, 128)]
    else:
        shapes = [(1024, 4096, 256, 32), (1024, 16384, 512, 64)]
    if args.quick:
        shapes = [(256, 2048, 128, 16), (512, 8192, 256, 32)]
    backends = ["reference"] + (["triton"] if cuda and triton_available() else [])
    print(f"device={device}  backends={backends}  threads={torch.get_num_threads()} pairs={args.reps}")
    header = f"{'B':>6} {'n':>6} {'d':>5} {'k':>4} | " + " | ".join(
        f"{'dense ms':>9} {b + ' ms':>13} {'x dense':>8} {'max err':>8}" for b in backends
    )
    print(header)
    for B, n, d, k in shapes:
        W = torch.randn(n, d, device=device) / d**0.5
        pre = torch.randn(B, n, device=device)
        values, idx = torch.topk(pre, k, dim=-1)
        z = torch.zeros_like(pre).scatter(-1, idx, values)
        dense = z @ W
        cols = []
        for b in backends:
            err = (topk_decode(values, idx, W, backend=b) - dense).abs().max().item()
            t, t_dense, ratio = paired_speedup(
                lambda b=b, values=values, idx=idx, W=W: topk_decode(values, idx, W, backend=b),
                lambda z=z, W=W: z @ W,
                args.reps,
                cuda=cuda,
            )
            cols.append(f"{t_dense * 1e3:9.3f} {t * 1e3:13.3f} {ratio:8.2f} {err:8.1e}")
            rows.add(
                f"B={B} n={n} d={d} k={k} ({device})", f"topk_decode {b}", "dense z @ W_dec", t, t_dense, ratio,
                "SAE decoder output from k active latents (dense z given to the baseline for free)", max_err=err,
            )  # fmt: skip
        print(f"{B:>6} {n:>6} {d:>5} {k:>4} | " + " | ".join(cols))

    # Nested levels (MSAE): one sorted top-k_max, all prefix decodes vs one dense decode per level.
    B, n, d = shapes[0][:3]
    ks = [4, 8, 16, 32, 64, 128] if not args.quick else [2, 4, 8, 16]
    W = torch.randn(n, d, device=device) / d**0.5
    pre = torch.randn(B, n, device=device)
    values, idx = torch.topk(pre, ks[-1], dim=-1)
    zs = [torch.zeros_like(pre).scatter(-1, idx[:, :k], values[:, :k]) for k in ks]
    print(f"\nprefix decode, ks={ks}, B={B} n={n} d={d}")
    for b in backends:
        out = topk_decode_prefix(values, idx, W, ks, backend=b)
        err = max((out[i] - zs[i] @ W).abs().max().item() for i in range(len(ks)))
        t, t_dense, ratio = paired_speedup(
            lambda b=b: topk_decode_prefix(values, idx, W, ks, backend=b),
            lambda: [z @ W for z in zs],
            args.reps,
            cuda=cuda,
        )
        print(
            f"  {b:>9}: {t * 1e3:.3f} ms vs {len(ks)} dense decodes {t_dense * 1e3:.3f} ms "
            f"({ratio:.2f}x, max err {err:.1e})"
        )
        rows.add(
            f"B={B} n={n} d={d} levels={ks} ({device})", f"topk_decode_prefix {b}", f"{len(ks)} dense decodes",
            t, t_dense, ratio, "all nested (Matryoshka) levels' decodes from one top-k", max_err=err,
        )  # fmt: skip


if __name__ == "__main__":
    main()
