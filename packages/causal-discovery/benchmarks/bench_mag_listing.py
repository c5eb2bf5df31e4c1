"""Polynomial-delay MAG listing with singleton background knowledge — ICML 2025, P07: benchmark of the time
to the first MAG, the max/median delay and the (reported, not gated) ratio to the pruned brute force.

Rows: all-circle complete PAGs (k = 3, 4, 5) and random PAGs at n = 7 binned by circle count, then
n = 12-15 instances (listing only, first 300 MAGs; brute force is out of reach). Each row times the
default listing (probing on) and the rules alone (``probing=False``) in the same run, so the ratios are
comparable even when the shared CPU's load swings. Times are CPU seconds (``time.process_time``) for the
listing and the brute force alike, with the imported libraries frozen out of the cyclic GC. The rows with a
brute force also time the full listing against it paired (one warm-up call of each, then ``--reps``
alternating calls, median of the per-pair ratios; the ``--json`` rows). Run:

    python packages/causal-discovery/benchmarks/bench_mag_listing.py [--quick] [--reps 5] [--json]
"""

from __future__ import annotations

import gc
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "shared-kernels" / "benchmarks"))
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.causal_discovery.mag_listing import (
    PAG,
    BruteForceStats,
    ListingStats,
    list_mags,
    list_mags_bruteforce,
    random_instance,
)


def _list(pag: PAG, probing: bool, limit: int | None = None) -> tuple[float, ListingStats]:
    stats = ListingStats()
    t0 = time.process_time()
    for _ in itertools.islice(list_mags(pag, probing=probing, stats=stats), limit):
        pass
    return time.process_time() - t0, stats


ROWS: Rows | None = None
REPS = 5


def _row(name: str, pag: PAG, with_bf: bool, summary: dict, limit: int | None = None) -> None:
    cells = [f"{name:<22}", f"c={pag.n_circles():>3}"]
    if with_bf:
        bst = BruteForceStats()
        t0 = time.process_time()
        n_bf = len(list_mags_bruteforce(pag, stats=bst))
        t_bf = time.process_time() - t0
        # leaves/MAG near 1: the pruned brute force is output-linear here, not 3^edges
        cells.append(
            f"#MAG={n_bf:>6}  bf={t_bf:7.3f}s bf leaves/MAG={bst.leaves / n_bf:4.2f} nodes/MAG={bst.nodes / n_bf:4.1f}"
        )
        t_l, t_b, ratio = paired_speedup(
            lambda: _list(pag, True),
            lambda: list_mags_bruteforce(pag),
            REPS,
            cuda=False,
            clock=time.process_time,
        )
        cells.append(f"paired bf/list={ratio:5.2f}x")
        if ROWS is not None:
            ROWS.add(
                f"{name} (circles {pag.n_circles()}, {n_bf} MAGs)", "list_mags (probing)", "pruned brute force",
                t_l, t_b, ratio, "CPU time to list every MAG of the PAG", n_mags=n_bf,
            )  # fmt: skip
    for probing in (True, False):
        t, st = _list(pag, probing, limit)
        med = np.median(st.delays[1:]) if len(st.delays) > 1 else float("nan")
        cells.append(
            f"[probe={int(probing)}] list={t:7.3f}s first={1e3 * st.time_to_first:7.1f}ms "
            f"med={1e3 * med:5.2f}ms max/med={st.delay_ratio():6.1f} dead={st.dead_ends}"
            + (f" bf/list={t_bf / t:5.2f}x bf/first={t_bf / st.time_to_first:7.1f}x" if with_bf else "")
        )
        key = (name.split()[0], probing)
        rows = summary.setdefault(key, [])
        rows.append(
            (st.time_to_first, st.delay_ratio(), t_bf if with_bf else np.nan, t, st.n_outputs, st.nodes)
        )
    print("  ".join(cells), flush=True)


def main(quick: bool = False) -> None:
    # Timing hygiene: move the imported libraries' objects out of the cyclic GC, so that a full collection
    # does not scan the whole interpreter heap inside a measured delay (seen as 100+ ms spikes).
    gc.collect()
    gc.freeze()
    summary: dict = {}
    for k in (3, 4) if quick else (3, 4, 5):
        pag = PAG(np.ones((k, k), dtype=np.int8) - np.eye(k, dtype=np.int8))
        _row(f"complete all-circle K{k}", pag, True, summary)
    rng = np.random.default_rng(0)
    bins = [(8, 11), (12, 15), (16, 40)]
    want = 1 if quick else 3
    found: dict[tuple[int, int], list[PAG]] = {b: [] for b in bins}
    while any(len(v) < want for v in found.values()):
        _, pag = random_instance(7, int(rng.integers(2, 5)), 0.4, rng, max_edges=13)
        for lo, hi in bins:
            if lo <= pag.n_circles() <= hi and len(found[(lo, hi)]) < want:
                found[(lo, hi)].append(pag)
    for (lo, hi), pags in found.items():
        for pag in pags:
            _row(f"n=7 circles {lo}-{hi}", pag, True, summary if lo >= 12 else {})
    for _ in range(2 if quick else 8):
        n = int(rng.integers(12, 16))
        _, pag = random_instance(n, int(rng.integers(2, 5)), 0.25, rng)
        _row(f"n={n} (first 300)", pag, False, summary, limit=300)
    print(
        "\nsummary (check 3: first < 50 ms and max/median <= 20 at n = 12-15; brute-force ratio at n = 7, "
        ">= 12 circles: reported only)"
    )
    for probing in (True, False):
        big = [
            r for (kind, p), rows in summary.items() if p == probing and kind.startswith("n=1") for r in rows
        ]
        n7 = summary.get(("n=7", probing), [])
        if big:
            first = [r[0] for r in big]
            ratio = [r[1] for r in big if not np.isnan(r[1])]
            print(
                f"  probing={probing!s:<5} check 3: first max {1e3 * max(first):6.1f} ms "
                f"(median {1e3 * float(np.median(first)):5.1f} ms), max/median delay max {max(ratio):5.1f}"
            )
        if n7:
            t_bf, t_list, outs = sum(r[2] for r in n7), sum(r[3] for r in n7), sum(r[4] for r in n7)
            print(
                f"  probing={probing!s:<5} brute force / listing (total) = {t_bf / t_list:5.2f}x, "
                f"brute force / first MAG = {t_bf / sum(r[0] for r in n7):7.1f}x; per MAG: brute force "
                f"{1e6 * t_bf / outs:5.0f} us, listing {1e6 * t_list / outs:5.0f} us "
                f"({sum(r[5] for r in n7) / outs:.1f} listing nodes/MAG)"
            )


if __name__ == "__main__":
    _args = parse_bench_args(bench_parser(__doc__))
    ROWS, REPS = Rows("mag_listing", _args), _args.reps
    main(_args.quick)
