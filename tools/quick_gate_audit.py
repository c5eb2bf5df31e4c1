"""Audit the quick gates: does each paper's ``run(quick=True)`` give the same verdict on any CPU?

A quick gate (the pass rule a package test asserts in quick mode) must hold for seeds 0-4, with 1 and 2
threads, and on every CPU vector path: ``ATEN_CPU_CAPABILITY=default`` makes PyTorch's CPU kernels take
the plain (non-AVX) path, which changes float rounding the way another CPU would. This script runs each
installed paper's quick reproduction (entry point group ``icml25.papers``) in a fresh subprocess per paper
and configuration, and records per seed: whether it passed, each check's result, the metrics and the wall
seconds, one JSON line per run.

Usage::

    # seed 0, plain vector path, 1 thread, every paper but two, results appended to audit.jsonl
    python tools/quick_gate_audit.py run --capability default --threads 1 --seeds 0 \\
        --exclude P00 --exclude P04 --jsonl audit.jsonl
    python tools/quick_gate_audit.py run --capability native --threads 2 --seeds 0 --only P53 --jsonl audit.jsonl
    # the table: one row per paper and configuration, a column per seed; --metrics adds every number
    python tools/quick_gate_audit.py table audit.jsonl [--metrics]

``--capability native`` leaves ``ATEN_CPU_CAPABILITY`` unset (the machine's best vector path); any other
value is passed through (``default``, ``avx2``, ``avx512``). ``--threads`` sets ``OMP_NUM_THREADS`` and
``torch.set_num_threads`` before the run (experiments that pin their own thread count with
``torch_threads`` keep it). A paper that raises or exceeds ``--timeout`` is recorded with ``error``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path

from icml25.kernels.reproduce import GROUP

# Runs in the child process: argv = module, threads, seeds (comma separated); one JSON line per seed.
_WORKER = r"""
import importlib, json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
module, threads, seeds = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
torch.set_num_threads(threads)
mod = importlib.import_module(module)
capability = torch.backends.cpu.get_cpu_capability()
for seed in seeds:
    start = time.perf_counter()
    try:
        report = mod.run(quick=True, seed=seed)
    except Exception as exc:  # recorded, the audit goes on
        line = {"seed": seed, "error": f"{type(exc).__name__}: {exc}"[:500]}
    else:
        line = {"seed": seed, "passed": report.passed, "checks": report.checks, "metrics": report.metrics}
    line["wall_s"] = round(time.perf_counter() - start, 2)
    line["cpu_capability"] = capability
    print("AUDIT " + json.dumps(line), flush=True)
"""


def papers() -> dict[str, str]:
    """``{paper id: experiment module}`` of every installed ``icml25.papers`` entry point."""
    return dict(sorted((ep.name, ep.value) for ep in entry_points(group=GROUP)))


def audit_one(
    paper: str, module: str, capability: str, threads: int, seeds: Sequence[int], timeout: float
) -> list[dict]:
    """Run ``paper``'s quick reproduction for ``seeds`` in one subprocess; one record per seed."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    base = {"paper": paper, "capability": capability, "threads": threads}
    cmd = [sys.executable, "-c", _WORKER, module, str(threads), ",".join(map(str, seeds))]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = f"timeout after {timeout:.0f} s"
    records = [
        {**base, **json.loads(line[len("AUDIT ") :])}
        for line in out.splitlines()
        if line.startswith("AUDIT ")
    ]
    done = {r["seed"] for r in records}
    for seed in seeds:
        if seed not in done:
            tail = err.strip().splitlines()[-1:] or ["no output"]
            records.append({**base, "seed": seed, "error": tail[0][:500], "wall_s": None})
    for r in records:
        r["process_s"] = round(time.perf_counter() - start, 1)
    return records


def _select(only: Sequence[str], exclude: Sequence[str]) -> dict[str, str]:
    found = papers()
    unknown = sorted(set(only) - set(found))
    if unknown:
        raise SystemExit(f"--only names papers that are not installed: {unknown}")
    return {p: m for p, m in found.items() if (not only or p in only) and p not in exclude}


def _fmt(r: dict) -> str:
    if "error" in r:
        return "ERROR"
    failed = [name for name, ok in r["checks"].items() if not ok]
    return "pass" if r["passed"] else f"FAIL({len(failed)}/{len(r['checks'])})"


def table(records: Sequence[dict], metrics: bool = False) -> str:
    """One row per (paper, capability, threads): the verdict per seed, the seconds, flips marked ``!``."""
    rows: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in records:
        rows[(r["paper"], r["capability"], r["threads"])][r["seed"]] = r  # the latest record wins
    seeds = sorted({s for by_seed in rows.values() for s in by_seed})
    by_paper: dict[str, set[str]] = defaultdict(set)
    for (paper, _, _), by_seed in rows.items():
        by_paper[paper].update(_fmt(r) for r in by_seed.values())
    head = f"{'paper':6} {'config':12} " + " ".join(f"{'seed ' + str(s):11}" for s in seeds) + " max s"
    lines = [head, "-" * len(head)]
    for (paper, cap, threads), by_seed in sorted(rows.items()):
        flip = "!" if len(by_paper[paper]) > 1 else " "
        cells = [_fmt(by_seed[s]) if s in by_seed else "-" for s in seeds]
        walls = [r["wall_s"] for r in by_seed.values() if r.get("wall_s") is not None]
        wall = f"{max(walls):5.1f}" if walls else "    -"
        lines.append(
            f"{paper:5}{flip} {cap + '/' + str(threads) + 't':12} "
            + " ".join(f"{c:11}" for c in cells)
            + f" {wall}"
        )
        for s in seeds:
            r = by_seed.get(s)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"{'':20}seed {s}: {r['error']}")
                continue
            failed = [name for name, ok in r["checks"].items() if not ok]
            if failed and (metrics or flip == "!"):
                lines.append(f"{'':20}seed {s} failed: " + "; ".join(failed))
            if metrics or (flip == "!" and failed):
                nums = ", ".join(f"{k}={v:.4g}" for k, v in r["metrics"].items())
                lines.append(f"{'':20}seed {s}: {nums}")
    lines.append("'!' after the id: the verdicts of this paper differ between seeds or configurations.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run quick reproductions and append JSON lines")
    run_p.add_argument(
        "--capability", default="native", help="native (unset) or an ATEN_CPU_CAPABILITY value"
    )
    run_p.add_argument("--threads", type=int, default=1)
    run_p.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2,3,4")
    run_p.add_argument("--only", action="append", default=[], help="paper id (repeatable)")
    run_p.add_argument("--exclude", action="append", default=[], help="paper id to skip (repeatable)")
    run_p.add_argument("--timeout", type=float, default=900.0, help="seconds per paper and configuration")
    run_p.add_argument("--jsonl", type=Path, required=True, help="file the records are appended to")
    table_p = sub.add_parser("table", help="print the table of one or more JSON-lines files")
    table_p.add_argument("jsonl", type=Path, nargs="+")
    table_p.add_argument("--metrics", action="store_true", help="list every run's metrics and failed checks")
    args = parser.parse_args(argv)

    if args.command == "table":
        records = [json.loads(line) for path in args.jsonl for line in path.read_text().splitlines() if line]
        print(table(records, metrics=args.metrics))
        return 0

    seeds = [int(s) for s in args.seeds.split(",")]
    selected = _select(args.only, args.exclude)
    with args.jsonl.open("a") as sink:
        for paper, module in selected.items():
            records = audit_one(paper, module, args.capability, args.threads, seeds, args.timeout)
            for r in records:
                sink.write(json.dumps(r) + "\n")
            sink.flush()
            cells = " ".join(f"s{r['seed']}={_fmt(r)}" for r in sorted(records, key=lambda r: r["seed"]))
            print(
                f"{paper} {args.capability}/{args.threads}t {cells} ({records[0]['process_s']} s)", flush=True
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
