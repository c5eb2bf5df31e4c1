"""Benchmark icml25.kernels.retention: chunkwise retention (reference and Triton) vs the parallel form.

Prints, for a few sequence lengths N (plain RetNet, ``n_agents = 1``, and a Sable-like ``n_agents = 4``
with resets and the decoder's causal mask), the time of

* ``parallel``: ``(Q Kᵀ ⊙ D) V`` with the full N × N decay matrix (:func:`retention_parallel`, the baseline);
* ``chunkwise``: the chunkwise reference (:func:`retention`, ``backend="reference"``, 64-token chunks);
* ``triton``: the Triton chunkwise kernel (CUDA only);

as speed ratios against the parallel form (paired: warm-up, then ``--reps`` alternating calls, median of the
per-pair ratios), and the max abs difference from it (float32). Forward only.

    python shared-kernels/benchmarks/bench_retention.py [--quick] [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

import torch
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.kernels import triton_available
from icml25.kernels.retention import default_kappas, retention, retention_parallel


def main(argv: list[str] | None = None) -> None:
    args = parse_bench_args(bench_parser(__doc__), argv)
    rows = Rows("retention", args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        lengths, B, H, D = [1024, 4096, 16384], 8, 4, 64
    else:
        lengths, B, H, D = [256, 1024, 4096], 1, 4, 64
    if args.quick:
        lengths, B, H, D = [128, 512, 2048], 1, 2, 32
    backends = ["reference"] + (["triton"] if device == "cuda" and triton_available() else [])
    kappa = default_kappas(H)
    g = torch.Generator().manual_seed(0)
    print(
        f"device={device}  B={B} H={H} Dk=Dv={D}  backends={backends}  threads={torch.get_num_threads()} pairs={args.reps}"
    )
    print(
        f"{'A':>3} {'N':>6} | "
        + " | ".join(f"{'parallel ms':>11} {b + ' ms':>13} {'x par':>7} {'max err':>8}" for b in backends)
    )
    for A, causal in ((1, False), (4, True)):
        for N in lengths:
            q, k, v = (torch.randn(B, H, N, D, generator=g).to(device) / D**0.5 for _ in range(3))
            dones = (torch.rand(B, N // A, generator=g) < 0.02).to(device)
            kw = {"n_agents": A, "dones": dones, "causal_agents": causal}
            ref, _ = retention_parallel(q, k, v, kappa, **kw)
            cols = []
            for b in backends:
                chunk = 64 // A
                out, _ = retention(q, k, v, kappa, chunk_size=chunk, backend=b, **kw)
                err = (out - ref).abs().max().item()
                t, t_par, ratio = paired_speedup(
                    lambda q=q, k=k, v=v, kw=kw, b=b, chunk=chunk: retention(
                        q, k, v, kappa, chunk_size=chunk, backend=b, **kw
                    ),
                    lambda q=q, k=k, v=v, kw=kw: retention_parallel(q, k, v, kappa, **kw),
                    args.reps,
                    cuda=device == "cuda",
                )
                cols.append(f"{t_par * 1e3:11.3f} {t * 1e3:13.3f} {ratio:7.2f} {err:8.1e}")
                rows.add(
                    f"agents={A} N={N} B={B} H={H} d={D} ({device})", f"chunkwise {b} ({chunk}-token chunks)",
                    "parallel form (N x N decay)", t, t_par, ratio,
                    "retention forward (RetNet / Sable multi-agent with resets)", max_err=err,
                )  # fmt: skip
            print(f"{A:>3} {N:>6} | " + " | ".join(cols))


if __name__ == "__main__":
    main()
