"""Benchmark icml25.kernels.selective_scan: the chunked reference and Triton vs the sequential reference.

Prints, for a few sequence lengths L (Mamba's layout, ``u [B, D, L]``, ``A [D, N]``, ``B, C [B, N, L]``,
softplus step, ``D`` skip and ``z`` gate), the time of

* ``sequential``: the recurrence one timestep at a time (:func:`selective_scan_reference`, the baseline);
* ``chunked``: the chunked closed form (:func:`selective_scan_chunked`, 16-step chunks);
* ``triton``: the Triton scan (CUDA only), forward and forward + backward;

as speed ratios against the sequential reference, and the max abs difference from it (float32).
One CPU thread. Run: ``python shared-kernels/benchmarks/bench_selective_scan.py [--quick]``.
"""

from __future__ import annotations

import argparse

import torch
from _timing import median_time

from icml25.kernels import triton_available
from icml25.kernels.selective_scan import selective_scan, selective_scan_chunked


def _inputs(Bs: int, D: int, L: int, N: int, device: str, g: torch.Generator) -> list[torch.Tensor]:
    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device)

    return [r(Bs, D, L), r(Bs, D, L) - 2.0, -torch.exp(r(D, N)), r(Bs, N, L), r(Bs, N, L), r(D), r(Bs, D, L)]


def _bench_length(
    L: int, Bs: int, D: int, N: int, device: str, g: torch.Generator, reps: int, use_triton: bool
) -> str:
    """One table row: the times and errors at sequence length ``L``."""
    u, delta, A, B, C, Dskip, z = _inputs(Bs, D, L, N, device, g)
    kw = {"delta_softplus": True}
    t_seq, ref = median_time(
        lambda: selective_scan(u, delta, A, B, C, Dskip, z, backend="reference", **kw), reps
    )
    t_ch, out = median_time(
        lambda: selective_scan_chunked(u, delta, A, B, C, Dskip, z, chunk_size=16, **kw), reps
    )
    row = f"{L:>6} | {t_seq * 1e3:13.2f} | {t_ch * 1e3:10.2f} {t_seq / t_ch:6.2f} {(out - ref).abs().max().item():8.1e}"
    if use_triton:
        t_tr, out = median_time(
            lambda: selective_scan(u, delta, A, B, C, Dskip, z, backend="triton", **kw), reps
        )
        row += f" | {t_tr * 1e3:9.3f} {t_seq / t_tr:6.1f} {(out - ref).abs().max().item():8.1e}"
        leaves = [t.clone().requires_grad_() for t in (u, delta, A, B, C)]

        def fwd_bwd(backend: str) -> None:
            y = selective_scan(*leaves, Dskip, z, backend=backend, **kw)
            torch.autograd.grad(y.sum(), leaves)

        t_sb, _ = median_time(lambda: fwd_bwd("reference"), reps)
        t_tb, _ = median_time(lambda: fwd_bwd("triton"), reps)
        row += f" | {t_sb * 1e3:14.2f} {t_tb * 1e3:8.3f} {t_sb / t_tb:6.1f}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short sequences, few repetitions")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # the shared CPU machine makes multi-thread timings unusable
    if device == "cuda":
        lengths, Bs, D, N, reps = [256, 1024, 4096], 8, 1536, 16, 10
    else:
        lengths, Bs, D, N, reps = [64, 256, 1024], 2, 128, 16, 3
    if args.quick:
        lengths, Bs, D, N, reps = [32, 128], 1, 64, 8, 2
    use_triton = device == "cuda" and triton_available()
    g = torch.Generator().manual_seed(0)
    print(f"device={device}  B={Bs} D={D} N={N}  triton={use_triton}")
    head = f"{'L':>6} | {'sequential ms':>13} | {'chunked ms':>10} {'x seq':>6} {'max err':>8}"
    if use_triton:
        head += (
            f" | {'triton ms':>9} {'x seq':>6} {'max err':>8} | {'fwd+bwd ms seq':>14} {'triton':>8} {'x':>6}"
        )
    print(head)
    for L in lengths:
        print(_bench_length(L, Bs, D, N, device, g, reps, use_triton))


if __name__ == "__main__":
    main()
