"""Benchmark: Hadamard-rotation + grid quantization (HIGGS, AQUA-KV's quantizer) vs uniform 2-bit groups.

For KV-cache-like rows (tokens, c=1024) prints encode/decode time of the grid quantizer (Triton on CUDA,
the reference on CPU, and the reference on CUDA as the "obvious baseline"), its relative MSE and bits
per value, next to icml25.kernels.quantization's uniform 2-bit group quantizer at a similar bit width (the
baseline): the grid round trip (encode + decode) and the uniform quantize + dequantize round trip are timed
paired (warm-up, then ``--reps`` alternating calls, median of the per-pair ratios).

    python shared-kernels/benchmarks/bench_hadamard_grid.py --quick          # CPU, seconds
    python shared-kernels/benchmarks/bench_hadamard_grid.py --device cuda [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

import torch
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

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


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parse_bench_args(p, argv)
    rows = Rows("hadamard_grid", args)
    dev = args.device
    cuda = dev == "cuda"
    n_rows = (4096 if args.quick else 65536) if cuda else (256 if args.quick else 2048)
    x = torch.randn(n_rows, 1024, device=dev, dtype=torch.float16)
    print(f"device={dev} rows={n_rows} c=1024 fp16 threads={torch.get_num_threads()} pairs={args.reps}")
    uniform = {g: rel for g in (128, 64) for rel in [
        float(((quantize_dequantize(x, 2, g, backend="reference").float() - x.float()) ** 2).sum() / (x.float() ** 2).sum())
    ]}  # fmt: skip
    for bits, group in ((2, 128), (2, 64)):
        print(
            f"  uniform {bits}-bit g={group}: relMSE {uniform[group]:.4f}  bits/value {bits + 32 / group:.3f}"
        )
    for d, n, group in ((2, 16, 128), (4, 256, 128), (2, 16, 64)):
        grid = gaussian_grid(d, n).to(dev)
        backends = ["reference"] + (["triton"] if cuda and triton_available() else [])
        for b in backends:
            idx, scale = grid_encode(x, grid, group, backend=b)
            y = grid_decode(idx, scale, grid, group, torch.float16, backend=b)
            rel = float(((y.float() - x.float()) ** 2).sum() / (x.float() ** 2).sum())

            def round_trip(b=b, g=grid, gs=group):
                i, s = grid_encode(x, g, gs, backend=b)
                return grid_decode(i, s, g, gs, torch.float16, backend=b)

            t, t_u, ratio = paired_speedup(
                round_trip,
                lambda gs=group: quantize_dequantize(x, 2, gs, backend="reference"),
                args.reps,
                cuda=cuda,
            )
            bpv = (n.bit_length() - 1) / d + 16 / group
            print(
                f"  HIGGS d={d} n={n} g={group} [{b:9s}] encode+decode {t * 1e3:8.3f} ms  uniform 2-bit {t_u * 1e3:8.3f} ms "
                f"({ratio:.2f}x)  relMSE {rel:.4f} (uniform {uniform[group]:.4f})  bits/value {bpv:.3f}"
            )
            rows.add(
                f"d={d} n={n} group={group}, {n_rows}x1024 fp16 ({dev})", f"Hadamard+grid encode/decode {b}",
                f"uniform 2-bit group {group} (reference)", t, t_u, ratio,
                "quantize+dequantize round trip of KV-like rows at ~2-2.25 bits/value",
                rel_mse=rel, uniform_rel_mse=uniform[group], bits_per_value=bpv,
            )  # fmt: skip


if __name__ == "__main__":
    main()
