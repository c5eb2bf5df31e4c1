"""Benchmark: low-bit group quantization vs a naive per-tensor min-max quantizer.

For a KV-cache-like tensor (batch, heads, tokens, head_dim) with outlier channels, prints for every
bits/group size: quantize and dequantize throughput (GB/s of memory moved: input read + output written),
storage bits per value and relative MSE, and the ratios against the naive torch per-tensor quantizer
(one scale/zero for the whole tensor, uint8 codes, no packing) in one run. On CUDA both the Triton
kernels and the reference run; on CPU the reference (the Triton interpreter is far too slow to time).
Timing: paired (warm-up, then ``--reps`` alternating calls of the method and the naive quantizer, median of
the per-pair ratios); ``--threads`` (default 1) pins torch's CPU threads.

    python shared-kernels/benchmarks/bench_quantization.py --quick            # CPU, < 30 s
    python shared-kernels/benchmarks/bench_quantization.py --device cuda      # 8x32x4096x128 fp16
"""

from __future__ import annotations

import torch
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.kernels import triton_available
from icml25.kernels.quantization import dequantize, quantize

SHAPES = {  # (device, quick) -> KV-cache-like (batch, heads, tokens, head_dim)
    ("cuda", False): (8, 32, 4096, 128),
    ("cuda", True): (4, 32, 1024, 128),
    ("cpu", False): (4, 8, 1024, 128),
    ("cpu", True): (2, 8, 256, 128),
}


def kv_like(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """Gaussian values with per-channel log-normal scales and offsets (the outlier channels of keys)."""
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    channel_scale = torch.exp(torch.randn(d, generator=g))
    channel_offset = torch.randn(d, generator=g)
    x = torch.randn(shape, generator=g) * channel_scale + channel_offset
    return x.to(device=device, dtype=dtype)


def naive_quantize(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-tensor asymmetric min-max quantization to uint8 codes (the obvious baseline)."""
    lo, hi = x.min().float(), x.max().float()
    scale = (hi - lo).clamp_min(1e-12) / (2**bits - 1)
    codes = torch.round((x.float() - lo) / scale).clamp_(0, 2**bits - 1).to(torch.uint8)
    return codes, scale, lo


def naive_dequantize(
    codes: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    return (codes.float() * scale + lo).to(dtype)


def rel_mse(x_hat: torch.Tensor, x: torch.Tensor) -> float:
    x64 = x.double()
    return float(((x_hat.double() - x64) ** 2).sum() / (x64**2).sum())


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                        help="default: float16 on CUDA, float32 on CPU")  # fmt: skip
    args = parse_bench_args(parser, argv)
    rows = Rows("quantization", args)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda requested but CUDA is not available")
    cuda = args.device == "cuda"
    dtype = getattr(torch, args.dtype or ("float16" if cuda else "float32"))
    shape = SHAPES[(args.device, args.quick)]
    backends = ["reference"]
    if cuda and triton_available():
        backends.insert(0, "triton")

    torch.set_grad_enabled(False)
    x = kv_like(shape, dtype, args.device)
    in_bytes = x.numel() * x.element_size()
    print(
        f"device={args.device} shape={tuple(shape)} dtype={dtype} ({in_bytes / 2**20:.0f} MiB) pairs={args.reps} threads={torch.get_num_threads()}"
    )
    print(
        "ratios: speed = naive time / ours (higher is faster); err = naive relMSE / ours (higher is more accurate)"
    )
    header = (
        f"{'backend':>9} {'bits':>4} {'group':>5} {'bits/val':>8} {'quant ms':>9} {'naive ms':>9} {'q speed':>7} "
        f"{'deq ms':>8} {'naive ms':>9} {'dq speed':>8} | {'relMSE':>9} {'naive MSE':>9} {'err':>7}"
    )
    print(header)
    print("-" * len(header))
    bit_list, group_list = ((2, 4), (32, 128)) if args.quick else ((2, 3, 4, 8), (32, 64, 128))
    for bits in bit_list:
        codes, n_scale, n_lo = naive_quantize(x, bits)
        naive_err = rel_mse(naive_dequantize(codes, n_scale, n_lo, dtype), x)
        for group in group_list:
            for backend in backends:
                q = quantize(x, bits, group, backend=backend)
                err = rel_mse(dequantize(q, backend=backend), x)
                t_q, t_nq, r_q = paired_speedup(
                    lambda b=backend, bits=bits, g=group: quantize(x, bits, g, backend=b),
                    lambda bits=bits: naive_quantize(x, bits),
                    args.reps,
                    cuda=cuda,
                )
                t_dq, t_ndq, r_dq = paired_speedup(
                    lambda b=backend, q=q: dequantize(q, backend=b),
                    lambda c=codes, s=n_scale, lo=n_lo: naive_dequantize(c, s, lo, dtype),
                    args.reps,
                    cuda=cuda,
                )
                print(
                    f"{backend:>9} {bits:>4} {group:>5} {q.bits_per_value:>8.3f} {t_q * 1e3:>9.3f} {t_nq * 1e3:>9.3f} "
                    f"{r_q:>6.2f}x {t_dq * 1e3:>8.3f} {t_ndq * 1e3:>9.3f} {r_dq:>7.2f}x | {err:>9.2e} {naive_err:>9.2e} "
                    f"{naive_err / err:>6.1f}x"
                )
                setting = f"{bits}-bit group {group}, {tuple(shape)} {str(dtype).removeprefix('torch.')} ({args.device})"
                rows.add(setting, f"quantize {backend}", "naive per-tensor min-max (uint8 codes)", t_q, t_nq, r_q,
                         "group quantization of a KV-cache-like tensor with outlier channels (packed codes)",
                         bits_per_value=q.bits_per_value, err_ratio_naive_over_ours=naive_err / err)  # fmt: skip
                rows.add(setting, f"dequantize {backend}", "naive dequantize", t_dq, t_ndq, r_dq,
                         "dequantization of the same tensor")  # fmt: skip


if __name__ == "__main__":
    main()
