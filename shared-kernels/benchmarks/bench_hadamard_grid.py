"""Benchmark: Hadamard-rotation + grid quantization (HIGGS, AQUA-KV's quantizer) vs uniform 2-bit groups.

For KV-cache-like rows (tokens, c=1024) prints encode/decode time of the grid quantizer (Triton on CUDA,
the reference on CPU, and the reference on CUDA as the "obvious baseline"), its relative MSE and bits
per value, next to icml25.kernels.quantization's uniform 2-bit group quantizer at a similar bit width.

    python shared-kernels/benchmarks/bench_hadamard_grid.py --quick          # CPU, seconds
    python shared-kernels/benchmarks/bench_hadamard_grid.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from _timing import call_times

from icml25.kernels import triton_available
from icml25.kernels.hadamard_grid import grid_decode, grid_encode
from icml25.kernels.quantization import quantize_dequantize


def gaussian_grid(d: int, n: int, seed: int = 0) -> torch.Tensor:
    """Lloyd's k-means on Gaussian samples (same construction as AQUA-KV's make_gaussian_grid)."""
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(100_000, d, generator=gen)
    c = s[torch.randperm(len(s), generator=gen)[:n]].clone()
    for _ in range(30):
        a = (2 * s @ c.T - (c * c).sum(-1)).argmax(-1)
        cnt = torch.bincount(a, minlength=n).unsqueeze(-1)
        c = torch.where(cnt > 0, torch.zeros_like(c).index_add_(0, a, s) / cnt.clamp_min(1), c)
    return c


def timeit(fn: Callable[[], object], device: str, reps: int) -> float:
    """Mean seconds per call over ``reps`` calls after one warm-up call."""
    return statistics.fmean(call_times(fn, reps, cuda=device == "cuda")[0])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    dev = args.device
    rows = (4096 if args.quick else 65536) if dev == "cuda" else (256 if args.quick else 2048)
    x = torch.randn(rows, 1024, device=dev, dtype=torch.float16)
    reps = 5 if dev == "cuda" else 1
    print(f"device={dev} rows={rows} c=1024 fp16")
    for d, n, group in ((2, 16, 128), (4, 256, 128), (2, 16, 64)):
        grid = gaussian_grid(d, n).to(dev)
        backends = ["reference"] + (["triton"] if dev == "cuda" and triton_available() else [])
        res = {}
        for b in backends:
            idx, scale = grid_encode(x, grid, group, backend=b)
            enc = timeit(lambda b=b, g=grid, gs=group: grid_encode(x, g, gs, backend=b), dev, reps)
            dec = timeit(
                lambda b=b, i=idx, s=scale, g=grid, gs=group: grid_decode(
                    i, s, g, gs, torch.float16, backend=b
                ),
                dev,
                reps,
            )
            y = grid_decode(idx, scale, grid, group, torch.float16, backend=b)
            rel = float(((y.float() - x.float()) ** 2).sum() / (x.float() ** 2).sum())
            res[b] = (enc, dec, rel)
            print(
                f"  HIGGS d={d} n={n} g={group} [{b:9s}] encode {enc * 1e3:8.3f} ms  decode {dec * 1e3:8.3f} ms  relMSE {rel:.4f}  bits/value {(n.bit_length() - 1) / d + 16 / group:.3f}"
            )
        if "triton" in res:
            r, t = res["reference"], res["triton"]
            print(
                f"    triton speedup vs reference: encode x{r[0] / t[0]:.1f}, decode x{r[1] / t[1]:.1f}; relMSE ratio {t[2] / r[2]:.4f}"
            )
    # The uniform baseline is for error/bits at a similar width; its reference path keeps this script
    # independent of the quantization family's Triton kernels.
    for bits, group in ((2, 128), (2, 64)):
        y = quantize_dequantize(x, bits, group, backend="reference")
        rel = float(((y.float() - x.float()) ** 2).sum() / (x.float() ** 2).sum())
        t = timeit(
            lambda bits=bits, group=group: quantize_dequantize(x, bits, group, backend="reference"), dev, reps
        )
        print(
            f"  uniform {bits}-bit g={group}: quantize+dequantize {t * 1e3:8.3f} ms  relMSE {rel:.4f}  bits/value {bits + 32 / group:.3f}"
        )


if __name__ == "__main__":
    main()
