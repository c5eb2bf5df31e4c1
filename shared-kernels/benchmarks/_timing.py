"""Wall-clock timing and reporting shared by the benchmarks (imported as a sibling module by the scripts here;
``packages/*/benchmarks`` scripts add this folder to ``sys.path``).

Every benchmark follows one protocol (:func:`bench_parser`, :func:`paired_speedup`, :class:`Rows`):

* ``--threads`` (default 1) pins torch's intra-op threads; ``--reps`` (default 5, at least 5) timed pairs;
* one warm-up call of the method and of its baseline (Triton compiles there), then ``reps`` alternating
  (method, baseline) calls in one process, so both see the same machine load; the reported ratio is the
  median of the per-pair ratios ``baseline / method`` (> 1: the method is faster), next to the median times;
* ``--quick``: a small CPU smoke run (under about a minute on one thread);
* ``--json``: each result row is also printed as one ``BENCH_ROW {...}`` line (and each note as
  ``BENCH_NOTE {...}``), which ``tools/bench_all.py`` collects into ``benchmarks/RESULTS.md``.

With ``cuda=True`` the device is synchronised around each call, so a time covers the kernels and not only
their launch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def call_times(fn: Callable[[], Any], reps: int, *, cuda: bool) -> tuple[list[float], Any]:
    """Seconds taken by each of ``reps`` calls of ``fn`` after a warm-up call, and the last call's result."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times, out


def median_time(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    """Median seconds per call of ``fn`` over ``reps`` calls after the warm-up call, synchronising CUDA when
    it is available, and the last call's result."""
    times, out = call_times(fn, reps, cuda=torch.cuda.is_available())
    return statistics.median(times), out


def paired_times(
    method: Callable[[], Any],
    baseline: Callable[[], Any],
    reps: int,
    *,
    cuda: bool,
    clock: Callable[[], float] = time.perf_counter,
    warmup: bool = True,
) -> tuple[list[float], list[float]]:
    """Seconds of ``reps`` alternating (method, baseline) call pairs, after one warm-up call of each
    (``warmup=False`` skips it, for calls that are seconds long and allocate nothing to warm up);
    ``clock`` is ``time.perf_counter`` (wall) or ``time.process_time`` (CPU seconds)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if warmup:
        for fn in (method, baseline):
            fn()
            sync()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, ts in zip((method, baseline), times):
            t0 = clock()
            fn()
            sync()
            ts.append(clock() - t0)
    return times


def paired_speedup(
    method: Callable[[], Any],
    baseline: Callable[[], Any],
    reps: int,
    *,
    cuda: bool,
    clock: Callable[[], float] = time.perf_counter,
    warmup: bool = True,
) -> tuple[float, float, float]:
    """``(method median s, baseline median s, median of the per-pair ratios baseline/method)``."""
    tm, tb = paired_times(method, baseline, reps, cuda=cuda, clock=clock, warmup=warmup)
    return speedup_of(tm, tb)


def speedup_of(tm: list[float], tb: list[float]) -> tuple[float, float, float]:
    """``(median method s, median baseline s, median of the per-pair ratios baseline/method)`` of paired
    times."""
    ratios = [b / m for m, b in zip(tm, tb)]
    return statistics.median(tm), statistics.median(tb), statistics.median(ratios)


def bench_parser(description: str | None, *, reps: int = 5) -> argparse.ArgumentParser:
    """The arguments every benchmark takes: ``--quick``, ``--threads``, ``--reps``, ``--json``."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small CPU smoke run (about a minute at most)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op CPU threads (default 1)")
    parser.add_argument(
        "--reps",
        type=int,
        default=reps,
        help=f"timed (method, baseline) pairs per row (>= 5, default {reps})",
    )
    parser.add_argument(
        "--json", action="store_true", help="also print BENCH_ROW/BENCH_NOTE json lines (tools/bench_all.py)"
    )
    return parser


def parse_bench_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse, enforce ``--reps >= 5`` and ``--threads >= 1``, and pin torch's threads."""
    args = parser.parse_args(argv)
    if args.reps < 5:
        parser.error(f"--reps must be >= 5 (a median of paired runs), got {args.reps}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    return args


def load_average() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


class Rows:
    """Result rows of one benchmark, printed as ``BENCH_ROW`` json lines when ``--json`` is on.

    A row is one (setting, method, baseline) comparison: median method and baseline seconds over the paired
    runs, the median per-pair ratio ``baseline / method`` and one line saying what the row measures. Extra
    keyword values (errors, sparsity, acceptance...) are kept in ``extra`` and shown in the table.
    """

    def __init__(self, bench: str, args: argparse.Namespace) -> None:
        self.bench, self.enabled = bench, bool(getattr(args, "json", False))
        self.threads, self.reps = getattr(args, "threads", None), getattr(args, "reps", None)

    def add(
        self,
        setting: str,
        method: str,
        baseline: str,
        method_s: float,
        baseline_s: float,
        ratio: float,
        measures: str,
        **extra: Any,
    ) -> None:
        if not self.enabled:
            return
        row = {
            "bench": self.bench,
            "setting": setting,
            "method": method,
            "baseline": baseline,
            "method_s": method_s,
            "baseline_s": baseline_s,
            "ratio": ratio,
            "measures": measures,
            "threads": self.threads,
            "reps": self.reps,
            "load": load_average(),
            "extra": {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in extra.items()},
        }
        print("BENCH_ROW " + json.dumps(row), flush=True)

    def note(self, text: str) -> None:
        """A paragraph for RESULTS.md under this benchmark's rows (the regime, a cause, a crossover)."""
        if self.enabled:
            print("BENCH_NOTE " + json.dumps({"bench": self.bench, "text": text}), flush=True)
