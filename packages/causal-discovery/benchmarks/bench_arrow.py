"""Benchmark P54 ARROW: base PCMCI alone vs ARROW + PCMCI, wall time and F1 on the same data.

Two protocols in one run:

* same window: the brief's SVAR (2 parents, lags 1–5), both sides with lag window 5 (ARROW L = 6);
  ``--link sin --noise laplace --rescue dependence`` is the non-monotone setting of issue 21 (the XOR
  step drops most true cross pairs; the rescue screen adds them back);
* wide window (the paper's protocol): the repository-like VAR (lags 1–20), base tau_max = 25, ARROW L = 26.

Usage::

    python packages/causal-discovery/benchmarks/bench_arrow.py            # d=12/T=1500 and d=10/T=1000, 1 seed
    python packages/causal-discovery/benchmarks/bench_arrow.py --d 20 --T 2000 --seeds 5   # brief §6 sizes
    python packages/causal-discovery/benchmarks/bench_arrow.py --d 20 --T 2000 --seeds 3 \
        --link sin --noise laplace --rescue dependence                                  # non-monotone
"""

from __future__ import annotations

import argparse

import numpy as np

from icml25.causal_discovery.arrow import simulate_repository_var, simulate_svar
from icml25.causal_discovery.experiments.arrow import compare


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--d", type=int, default=12, help="variables, same-window protocol")
    parser.add_argument("--T", type=int, default=1500, help="length, same-window protocol")
    parser.add_argument("--wide-d", type=int, default=10)
    parser.add_argument("--wide-T", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--link", choices=["linear", "tanh", "sin"], default="linear")
    parser.add_argument("--noise", choices=["gaussian", "laplace"], default="gaussian")
    parser.add_argument(
        "--rescue", choices=["none", "dependence"], default="none", help="ARROW's rescue option"
    )
    args = parser.parse_args()

    print(
        f"{'protocol':<28}{'seed':>5}{'base s':>10}{'ARROW s':>10}{'ratio':>8}{'F1 base':>9}{'F1 ARROW':>10}"
        f"{'tau acc':>9}{'XOR pairs':>10}{'kept pairs':>11}"
    )
    for name in ("same-window", "wide-window"):
        rows = []
        for seed in range(args.seeds):
            if name == "same-window":
                X, truth = simulate_svar(d=args.d, T=args.T, link=args.link, noise=args.noise, rng=seed)
                r = compare(X, truth, lag_max=6, base_tau_max=5, rescue=args.rescue)
                label = f"same (d={args.d},T={args.T},tau<=5)"
            else:
                X, truth = simulate_repository_var(d=args.wide_d, T=args.wide_T, rng=seed)
                r = compare(X, truth, lag_max=26, base_tau_max=25, rescue=args.rescue)
                label = f"wide (d={args.wide_d},T={args.wide_T},tau<=25)"
            rows.append(r)
            print(
                f"{label:<28}{seed:>5}{r['time_base']:>10.2f}{r['time_arrow']:>10.2f}"
                f"{r['time_base'] / r['time_arrow']:>7.1f}x{r['f1_base']:>9.3f}{r['f1_arrow']:>10.3f}{r['tau_acc']:>9.3f}"
                f"{r['xor_pair_recall']:>10.3f}{r['pair_recall']:>11.3f}"
            )
        ratio = sum(r["time_base"] for r in rows) / sum(r["time_arrow"] for r in rows)
        f1a, f1b = np.mean([r["f1_arrow"] for r in rows]), np.mean([r["f1_base"] for r in rows])
        print(f"{name}: speedup {ratio:.1f}x  F1 ARROW {f1a:.3f} vs base {f1b:.3f}\n")


if __name__ == "__main__":
    main()
