"""Benchmark icml25.kernels.xor_lag: packed XOR/popcount counts vs the obvious unpacked boolean baseline.

Prints, for a few (streams, bits, lags) sizes, the time of the unpacked boolean PyTorch computation (one
broadcast per lag, the baseline) and of the packed reference, paired (``_timing``: warm-up, then ``--reps``
alternating calls, median of the per-pair ratios), plus the Triton kernel when a CUDA device is present and
the largest count difference (always 0: integer counts).

    python shared-kernels/benchmarks/bench_xor_lag.py [--quick] [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import Rows, bench_parser, median_time, paired_speedup, parse_bench_args

from icml25.kernels.xor_lag import pack_bits, xor_lag_counts, xor_lag_counts_bruteforce


def main(argv: list[str] | None = None) -> None:
    args = parse_bench_args(bench_parser(__doc__), argv)
    rows = Rows("xor_lag", args)
    cuda = torch.cuda.is_available()
    g = torch.Generator().manual_seed(0)
    sizes = (
        [(20, 1999, 6), (20, 1999, 100)] if args.quick else [(20, 1999, 6), (20, 1999, 100), (50, 999, 26)]
    )
    print(f"threads={torch.get_num_threads()} pairs={args.reps}")
    print(
        f"{'n':>5}{'bits':>7}{'L':>5}{'bool ms':>10}{'packed ms':>10}{'ratio':>8}{'triton ms':>10}{'max diff':>10}"
    )
    for n, n_bits, L in sizes:
        bits = torch.rand(n, n_bits, generator=g) < 0.5
        words = pack_bits(bits)
        s0, o0 = xor_lag_counts_bruteforce(bits, L)
        s1, o1 = xor_lag_counts(words, n_bits, L, backend="reference")
        diff = max(int((s0 - s1).abs().max()), int((o0 - o1).abs().max()))
        t_ref, t_bool, ratio = paired_speedup(
            partial(xor_lag_counts, words, n_bits, L, backend="reference"),
            partial(xor_lag_counts_bruteforce, bits, L),
            args.reps,
            cuda=False,
        )
        t_tri = float("nan")
        if cuda:
            t_tri, (s2, o2) = median_time(
                partial(xor_lag_counts, words.cuda(), n_bits, L, backend="triton"), args.reps
            )
            diff = max(diff, int((s2.cpu() - s1).abs().max()), int((o2.cpu() - o1).abs().max()))
        print(
            f"{n:>5}{n_bits:>7}{L:>5}{t_bool * 1e3:>10.2f}{t_ref * 1e3:>10.2f}{ratio:>7.1f}x{t_tri * 1e3:>10.3f}{diff:>10}"
        )
        rows.add(
            f"n={n} bits={n_bits} lags={L}", "packed reference", "unpacked bool", t_ref, t_bool, ratio,
            "XOR-lag agreement counts of all stream pairs and lags (ARROW's screen), CPU", max_diff=diff,
        )  # fmt: skip


if __name__ == "__main__":
    main()
