"""Benchmark icml25.kernels.xor_lag: packed XOR/popcount counts vs the obvious unpacked boolean baseline.

Prints, for a few (streams, bits, lags) sizes, the time of the unpacked boolean PyTorch computation (one
broadcast per lag), of the packed reference, and of the Triton kernel when a CUDA device is present, plus
the largest count difference (always 0: integer counts).
"""

from __future__ import annotations

from functools import partial

import torch
from _timing import call_times

from icml25.kernels.xor_lag import pack_bits, xor_lag_counts, xor_lag_counts_bruteforce


def _time(fn, repeat: int = 3) -> tuple[float, object]:
    times, out = call_times(fn, repeat, cuda=torch.cuda.is_available())
    return min(times), out


def main() -> None:
    g = torch.Generator().manual_seed(0)
    print(
        f"{'n':>5}{'bits':>7}{'L':>5}{'bool s':>10}{'packed s':>10}{'ratio':>8}{'triton s':>10}{'max diff':>10}"
    )
    for n, n_bits, L in [(20, 1999, 6), (20, 1999, 100), (50, 999, 26)]:
        bits = torch.rand(n, n_bits, generator=g) < 0.5
        words = pack_bits(bits)
        t_bool, (s0, o0) = _time(partial(xor_lag_counts_bruteforce, bits, L), repeat=1)
        t_ref, (s1, o1) = _time(partial(xor_lag_counts, words, n_bits, L, backend="reference"))
        diff = max(int((s0 - s1).abs().max()), int((o0 - o1).abs().max()))
        t_tri = float("nan")
        if torch.cuda.is_available():
            t_tri, (s2, o2) = _time(partial(xor_lag_counts, words.cuda(), n_bits, L, backend="triton"))
            diff = max(diff, int((s2.cpu() - s1).abs().max()), int((o2.cpu() - o1).abs().max()))
        print(
            f"{n:>5}{n_bits:>7}{L:>5}{t_bool:>10.4f}{t_ref:>10.4f}{t_bool / t_ref:>7.1f}x{t_tri:>10.5f}{diff:>10}"
        )


if __name__ == "__main__":
    main()
