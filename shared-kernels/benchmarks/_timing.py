"""Wall-clock timing shared by the kernel benchmarks (imported as a sibling module by the scripts here).

One warm-up call (Triton compiles there), then ``reps`` timed calls; with ``cuda=True`` the device is
synchronised around each call, so a time covers the kernels and not only their launch. On a shared, loaded
machine compare a method with its baseline through :func:`paired_times` (calls alternate, so both see the
same load) and report the median of the per-pair ratios.
"""

from __future__ import annotations

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
    method: Callable[[], Any], baseline: Callable[[], Any], reps: int, *, cuda: bool
) -> tuple[list[float], list[float]]:
    """Seconds of ``reps`` alternating (method, baseline) call pairs, after one warm-up call of each."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for fn in (method, baseline):
        fn()
        sync()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, ts in zip((method, baseline), times):
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)
    return times


def paired_speedup(
    method: Callable[[], Any], baseline: Callable[[], Any], reps: int, *, cuda: bool
) -> tuple[float, float, float]:
    """``(method median s, baseline median s, median of the per-pair ratios baseline/method)``."""
    tm, tb = paired_times(method, baseline, reps, cuda=cuda)
    ratios = [b / m for m, b in zip(tm, tb)]
    return statistics.median(tm), statistics.median(tb), statistics.median(ratios)
