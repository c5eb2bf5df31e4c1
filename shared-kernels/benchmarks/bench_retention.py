"""Benchmark icml25.kernels.retention: chunkwise retention (reference and Triton) vs the parallel form.

Prints, for a few sequence lengths N (plain RetNet, ``n_agents = 1``, and a Sable-like ``n_agents = 4``
with resets and the decoder's causal mask), the time of

* ``parallel``: ``(Q Kᵀ ⊙ D) V`` with the full N × N decay matrix (:func:`retention_parallel`, the baseline);
* ``chunkwise``: the chunkwise reference (:func:`retention`, ``backend="reference"``, 64-token chunks);
* ``triton``: the Triton chunkwise kernel (CUDA only);

as speed ratios against the parallel form, and the max abs difference from it (float32). Forward only;
one CPU thread.
Run: ``python shared-kernels/benchmarks/bench_retention.py [--quick]``.
"""

from __future__ import annotations

import argparse

import torch
from _timing import median_time

from icml25.kernels import triton_available
from icml25.kernels.retention import default_kappas, retention, retention_parallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short sequences, few repetitions")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # the shared CPU machine makes multi-thread timings unusable
    if device == "cuda":
        lengths, B, H, D, reps = [1024, 4096, 16384], 8, 4, 64, 10
    else:
        lengths, B, H, D, reps = [256, 1024, 4096], 1, 4, 64, 3
    if args.quick:
        lengths, B, H, D, reps = [128, 512], 1, 2, 32, 2
    backends = ["reference"] + (["triton"] if device == "cuda" and triton_available() else [])
    kappa = default_kappas(H)
    g = torch.Generator().manual_seed(0)
    print(f"device={device}  B={B} H={H} Dk=Dv={D}  backends={backends}")
    print(
        f"{'A':>3} {'N':>6} | {'parallel ms':>11} | "
        + " | ".join(f"{b + ' ms':>13} {'x par':>7} {'max err':>8}" for b in backends)
    )
    for A, causal in ((1, False), (4, True)):
        for N in lengths:
            q, k, v = (torch.randn(B, H, N, D, generator=g).to(device) / D**0.5 for _ in range(3))
            dones = (torch.rand(B, N // A, generator=g) < 0.02).to(device)
            kw = {"n_agents": A, "dones": dones, "causal_agents": causal}
            t_par, (ref, _) = median_time(
                lambda q=q, k=k, v=v, kw=kw: retention_parallel(q, k, v, kappa, **kw), reps
            )
            cols = []
            for b in backends:
                chunk = 64 // A
                t, (out, _) = median_time(
                    lambda q=q, k=k, v=v, kw=kw, b=b, chunk=chunk: retention(
                        q, k, v, kappa, chunk_size=chunk, backend=b, **kw
                    ),
                    reps,
                )
                err = (out - ref).abs().max().item()
                cols.append(f"{t * 1e3:13.3f} {t_par / t:7.2f} {err:8.1e}")
            print(f"{A:>3} {N:>6} | {t_par * 1e3:11.3f} | " + " | ".join(cols))


if __name__ == "__main__":
    main()
