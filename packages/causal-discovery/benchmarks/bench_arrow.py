"""Benchmark P54 ARROW: base PCMCI alone vs ARROW + PCMCI, wall time and F1 on the same data.

Two protocols in one run:

* same window: the brief's SVAR (2 parents, lags 1–5), both sides with lag window 5 (ARROW L = 6);
  ``--link sin --noise laplace --rescue dependence`` is the non-monotone setting of issue 21 (the XOR
  step drops most true cross pairs; the rescue screen adds them back);
* wide window (the paper's protocol): the repository-like VAR (lags 1–20), base tau_max = 25, ARROW L = 26.

Timing: each ``compare`` call fits ARROW and then the base alone on the same data (one pair); ``--reps``
pairs per data seed (default 5; no separate warm-up call: a pair takes seconds and allocates nothing that a
warm-up would keep), the ratio is the median of the per-pair ratios base / ARROW; ``--threads`` pins torch
(the CI tests of tigramite are numpy/scipy, single-threaded here through ``OMP_NUM_THREADS`` when set).

Usage::

    python packages/causal-discovery/benchmarks/bench_arrow.py --quick     # d=8/T=500 and d=6/T=500, 1 seed
    python packages/causal-discovery/benchmarks/bench_arrow.py             # d=12/T=1500 and d=10/T=1000
    python packages/causal-discovery/benchmarks/bench_arrow.py --d 20 --T 2000 --seeds 5   # brief §6 sizes
    python packages/causal-discovery/benchmarks/bench_arrow.py --d 20 --T 2000 --seeds 3 \
        --link sin --noise laplace --rescue dependence                                  # non-monotone
"""

from __future__ import annotations

import statistics
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "shared-kernels" / "benchmarks"))
from _timing import Rows, bench_parser, parse_bench_args

from icml25.causal_discovery.arrow import simulate_repository_var, simulate_svar
from icml25.causal_discovery.experiments.arrow import compare


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--d", type=int, default=None, help="variables, same-window protocol (12; quick 8)")
    parser.add_argument("--T", type=int, default=None, help="length, same-window protocol (1500; quick 500)")
    parser.add_argument("--wide-d", type=int, default=None, help="wide-window variables (10; quick 6)")
    parser.add_argument("--wide-T", type=int, default=None, help="wide-window length (1000; quick 500)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--link", choices=["linear", "tanh", "sin"], default="linear")
    parser.add_argument("--noise", choices=["gaussian", "laplace"], default="gaussian")
    parser.add_argument(
        "--rescue", choices=["none", "dependence"], default="none", help="ARROW's rescue option"
    )
    args = parse_bench_args(parser, argv)
    rows = Rows("arrow", args)
    d = args.d or (8 if args.quick else 12)
    T = args.T or (500 if args.quick else 1500)
    wd = args.wide_d or (6 if args.quick else 10)
    wT = args.wide_T or (500 if args.quick else 1000)

    print(
        f"{'protocol':<28}{'seed':>5}{'base s':>10}{'ARROW s':>10}{'ratio':>8}{'F1 base':>9}{'F1 ARROW':>10}"
        f"{'tau acc':>9}{'XOR pairs':>10}{'kept pairs':>11}"
    )
    for name in ("same-window", "wide-window"):
        for seed in range(args.seeds):
            if name == "same-window":
                X, truth = simulate_svar(d=d, T=T, link=args.link, noise=args.noise, rng=seed)
                run = partial(compare, X, truth, lag_max=6, base_tau_max=5, rescue=args.rescue)
                label = f"same (d={d},T={T},tau<=5)"
            else:
                X, truth = simulate_repository_var(d=wd, T=wT, rng=seed)
                run = partial(compare, X, truth, lag_max=26, base_tau_max=25, rescue=args.rescue)
                label = f"wide (d={wd},T={wT},tau<=25)"
            results = [run() for _ in range(args.reps)]
            r = results[-1]
            t_base = statistics.median(x["time_base"] for x in results)
            t_arrow = statistics.median(x["time_arrow"] for x in results)
            ratio = statistics.median(x["time_base"] / x["time_arrow"] for x in results)
            print(
                f"{label:<28}{seed:>5}{t_base:>10.2f}{t_arrow:>10.2f}{ratio:>7.1f}x{r['f1_base']:>9.3f}"
                f"{r['f1_arrow']:>10.3f}{r['tau_acc']:>9.3f}{r['xor_pair_recall']:>10.3f}{r['pair_recall']:>11.3f}",
                flush=True,
            )
            rows.add(
                f"{name} {label[label.index('(') :]} {args.link}/{args.noise} seed {seed}", "ARROW + PCMCI",
                "PCMCI alone", t_arrow, t_base, ratio, "causal graph discovery wall time on the same data",
                f1_arrow=float(np.round(r["f1_arrow"], 3)), f1_base=float(np.round(r["f1_base"], 3)),
            )  # fmt: skip


if __name__ == "__main__":
    main()
