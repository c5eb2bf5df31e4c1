"""Run every benchmark script (shared-kernels/benchmarks, packages/*/benchmarks) and write one table.

Each ``bench_*.py`` is run in its own process as ``python SCRIPT --quick --json --threads N`` (the shared
protocol of ``shared-kernels/benchmarks/_timing.py``: warm-up, median of >= 5 paired method/baseline runs);
its ``BENCH_ROW`` / ``BENCH_NOTE`` lines become rows and notes of ``benchmarks/RESULTS.md``, with the
machine (CPU model, cores, torch version, load average at start and end, date, git commit). A script that
fails or times out is listed with its last output line instead of rows.

    python tools/bench_all.py [--out benchmarks/RESULTS.md] [--threads 1] [--timeout 600] [--only NAME ...]
    python tools/bench_all.py --only bench_rapid --full --append     # add a full-size run as its own section
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def scripts() -> list[Path]:
    return sorted((ROOT / "shared-kernels" / "benchmarks").glob("bench_*.py")) + sorted(
        ROOT.glob("packages/*/benchmarks/bench_*.py")
    )


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def git_commit() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        dirty = subprocess.run(  # the table being written does not count
            ["git", "status", "--porcelain", "--", ".", ":!benchmarks/RESULTS.md"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        return rev.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def run_script(path: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(path), "--json", "--threads", str(args.threads)]
    if not args.full:
        cmd.append("--quick")
    elif '"--full"' in path.read_text():  # a script whose default size is not yet its largest
        cmd.append("--full")
    env = dict(
        os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1"
    )
    start = time.perf_counter()
    rows, notes, lines, status = [], [], [], "ok"
    try:
        proc = subprocess.run(
            cmd, cwd=path.parent, env=env, capture_output=True, text=True, timeout=args.timeout
        )
        out, err = proc.stdout, proc.stderr
        if proc.returncode:
            status = f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        status = f"timed out after {args.timeout} s"
    for line in out.splitlines():
        if line.startswith("BENCH_ROW "):
            rows.append(json.loads(line[len("BENCH_ROW ") :]))
        elif line.startswith("BENCH_NOTE "):
            notes.append(json.loads(line[len("BENCH_NOTE ") :])["text"])
        else:
            lines.append(line)
    tail = [ln for ln in (err or "").splitlines() if ln.strip()][-1:] if status != "ok" else []
    return {
        "script": str(path.relative_to(ROOT)),
        "status": status,
        "seconds": time.perf_counter() - start,
        "rows": rows,
        "notes": notes,
        "tail": tail,
        "output": lines,
    }


def fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def fmt_extra(extra: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())


def machine_lines(info: dict) -> list[str]:
    return [
        f"- date: {info['date']}",
        f"- CPU: {info['cpu']} ({info['cores']} logical cores visible); torch {info['torch']}, "
        f"Python {info['python']}; torch threads per benchmark: {info['threads']}",
        f"- load average (1/5/15 min): start {info['load_start']}, end {info['load_end']}",
        f"- git commit: {info['commit']}; total wall time {info['total']:.0f} s",
    ]


def table(results: list[dict]) -> list[str]:
    out = [
        "| benchmark | setting | method | baseline | method ms | baseline ms | ratio | measures | extra |",
        "|---|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in results:
        name = Path(r["script"]).stem.removeprefix("bench_")
        if not r["rows"]:
            out.append(f"| {name} | — | — | — | — | — | — | {r['status']}: {' '.join(r['tail'])} | |")
        for row in r["rows"]:
            out.append(
                f"| {row['bench']} | {row['setting']} | {row['method']} | {row['baseline']} | {fmt_ms(row['method_s'])} | "
                f"{fmt_ms(row['baseline_s'])} | **{row['ratio']:.2f}x** | {row['measures']} | {fmt_extra(row['extra'])} |"
            )
    return out


def notes_and_runs(results: list[dict]) -> list[str]:
    out = ["", "## Notes", ""]
    for r in results:
        for text in r["notes"]:
            out += [f"- **{Path(r['script']).stem.removeprefix('bench_')}**: {text}"]
    out += ["", "## Runs", "", "| script | status | wall s | rows |", "|---|---|---:|---:|"]
    for r in results:
        out.append(f"| `{r['script']}` | {r['status']} | {r['seconds']:.0f} | {len(r['rows'])} |")
    return out


def render_appendix(results: list[dict], info: dict, mode: str) -> str:
    """A section appended to an existing RESULTS.md (``--append``): its own machine lines, table and notes."""
    names = ", ".join(f"`{Path(r['script']).name}`" for r in results)
    out = ["", f"## Additional run: {names} ({mode})", "", *machine_lines(info), "", *table(results)]
    body = notes_and_runs(results)
    return "\n".join(out + [line.replace("## ", "### ") for line in body]) + "\n"


def render(results: list[dict], info: dict) -> str:
    out = [
        "# Benchmark results",
        "",
        "Generated by `python tools/bench_all.py` (`uvx nox -s bench`): every `bench_*.py` with `--quick --json`. "
        "**The machine was shared and loaded** (other sessions' jobs ran at the same time, see the load "
        "averages): absolute times are not claims. Each ratio is the median over >= 5 alternating (method, "
        "baseline) pairs in one process, after a warm-up call of each, so both arms saw the same load; "
        "ratio = baseline time / method time (> 1: the method is faster). Quick settings are smoke-test sizes; "
        "each script's `--help` and docstring give its full sizes.",
        "",
    ]
    return "\n".join(out + machine_lines(info) + [""] + table(results) + notes_and_runs(results)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per script")
    parser.add_argument("--full", action="store_true", help="scripts' full sizes (hours on CPU), not --quick")
    parser.add_argument("--only", nargs="*", default=None, help="script stems to run (bench_rapid ...)")
    parser.add_argument(
        "--append", action="store_true", help="append this run as a section of --out instead of rewriting it"
    )
    args = parser.parse_args(argv)
    from icml25.kernels.reproduce import machine  # the ledger's own machine description

    paths = [p for p in scripts() if not args.only or p.stem in args.only]
    host = machine()
    info = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": host["cpu"],
        "cores": host["cores"],
        "torch": host.get("torch", "not installed"),
        "python": host["python"],
        "threads": args.threads,
        "load_start": load(),
        "commit": git_commit(),
    }
    start, results = time.perf_counter(), []
    for path in paths:
        print(f"== {path.relative_to(ROOT)}", flush=True)
        r = run_script(path, args)
        results.append(r)
        for line in r["output"]:
            print("   " + line)
        print(f"   -> {r['status']}, {len(r['rows'])} rows, {r['seconds']:.0f} s", flush=True)
    info["load_end"], info["total"] = load(), time.perf_counter() - start
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.append:
        mode = "--full" if args.full else "--quick"
        with Path(args.out).open("a") as fh:
            fh.write(render_appendix(results, info, mode))
    else:
        Path(args.out).write_text(render(results, info))
    print(f"wrote {args.out}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
