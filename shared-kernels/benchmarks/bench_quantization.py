"""Benchmark: low-bit group quantization vs a naive per-tensor min-max quantizer.

For a KV-cache-like tensor (batch, heads, tokens, head_dim) with outlier channels, prints for every
bits/group size: quantize and dequantize throughput (GB/s of memory moved: input read + output written),
storage bits per value and relative MSE, and the ratios against the naive torch per-tensor quantizer
(one scale/zero for the whole tensor, uint8 codes, no packing) in one run. On CUDA both the Triton
kernels and the reference run; on CPU the reference (the Triton interpreter is far too slow to time).

    python shared-kernels/benchmarks/bench_quantization.py --quick            # CPU, < 30 s
    python shared-kernels/benchmarks/bench_quantization.py --device cuda      # 8x32x4096x128 fp16
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from _timing import call_times

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


def timeit(fn: Callable[[], object], device: str, reps: int) -> float:
    """Fastest of ``reps`` calls after one warm-up call (the minimum is robust to other processes' load)."""
    return min(call_times(fn, reps, cuda=device == "cuda")[0])


def rel_mse(x_hat: torch.Tensor, x: torch.Tensor) -> float:
    x64 = x.double()
    return float(((x_hat.double() - x64) ** 2).sum() / (x64**2).sum())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    parser.add_argument("--quick", action="store_true", help="smaller tensor and fewer repetitions")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                        help="default: float16 on CUDA, float32 on CPU")  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda requested but CUDA is not available")
    dtype = getattr(torch, args.dtype or ("float16" if args.device == "cuda" else "float32"))
    shape = SHAPES[(args.device, args.quick)]
    reps = 5 if args.quick else 20
    backends = ["reference"]
    if args.device == "cuda" and triton_available():
        backends.insert(0, "triton")

    torch.set_grad_enabled(False)
    x = kv_like(shape, dtype, args.device)
    in_bytes = x.numel() * x.element_size()
    print(
        f"device={args.device} shape={tuple(shape)} dtype={dtype} ({in_bytes / 2**20:.0f} MiB) reps={reps} threads={torch.get_num_threads()}"
    )
    print(
        "ratios: speed = ours / naive (higher is faster); err = naive relMSE / ours (higher is more accurate)"
    )
    header = (
        f"{'backend':>9} {'bits':>4} {'group':>5} {'bits/val':>8} {'quant GB/s':>10} {'deq GB/s':>9} "
        f"{'relMSE':>9} | {'naive q':>8} {'naive dq':>8} {'naive MSE':>9} | {'q speed':>7} {'dq speed':>8} {'err':>7}"
    )
    print(header)
    print("-" * len(header))
    for bits in (2, 3, 4, 8):
        codes, n_scale, n_lo = naive_quantize(x, bits)
        code_bytes = codes.numel() * codes.element_size()
        t_nq = timeit(lambda bits=bits: naive_quantize(x, bits), args.device, reps)
        t_ndq = timeit(
            lambda c=codes, s=n_scale, lo=n_lo: naive_dequantize(c, s, lo, dtype), args.device, reps
        )
        naive_q_gbs = (in_bytes + code_bytes) / t_nq / 1e9
        naive_dq_gbs = (in_bytes + code_bytes) / t_ndq / 1e9
        naive_err = rel_mse(naive_dequantize(codes, n_scale, n_lo, dtype), x)
        for group in (32, 64, 128):
            for backend in backends:
                q = quantize(x, bits, group, backend=backend)
                t_q = timeit(
                    lambda b=backend, bits=bits, g=group: quantize(x, bits, g, backend=b), args.device, reps
                )
                t_dq = timeit(lambda b=backend, q=q: dequantize(q, backend=b), args.device, reps)
                q_gbs = (in_bytes + q.nbytes) / t_q / 1e9
                dq_gbs = (in_bytes + q.nbytes) / t_dq / 1e9
                err = rel_mse(dequantize(q, backend=backend), x)
                print(
                    f"{backend:>9} {bits:>4} {group:>5} {q.bits_per_value:>8.3f} {q_gbs:>10.2f} {dq_gbs:>9.2f} "
                    f"{err:>9.2e} | {naive_q_gbs:>8.2f} {naive_dq_gbs:>8.2f} {naive_err:>9.2e} | "
                    f"{q_gbs / naive_q_gbs:>6.2f}x {dq_gbs / naive_dq_gbs:>7.2f}x {naive_err / err:>6.1f}x"
                )


if __name__ == "__main__":
    main()
