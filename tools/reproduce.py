"""Reproduce every installed paper's central claim at small scale and write ``reports/REPORT.md``.

Papers are discovered through the ``icml25.papers`` entry-point group: each installed icml25 package
registers ``<catalog id> = <experiment module>``, and the module's ``run(quick, seed, out_dir)`` returns an
:class:`icml25.kernels.Report` (read by attribute: ``passed``, ``metrics``, ``claim``, ``threshold``,
``headline``, ``baseline``, ``figures``, ``notes``).

Usage::

    python tools/reproduce.py                     # quick mode, every installed paper
    python tools/reproduce.py --only P07 --only P54 --full --out reports

Prints one line per paper (``P07 PASS <headline>=<value> (baseline <value>, threshold <rule>) 3.2s``) and
exits 1 when a selected paper fails its threshold or raises, 2 on a usage error, 0 otherwise (also when no
paper is installed, which it says plainly).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

GROUP = "icml25.papers"
Experiment = Callable[..., Any]


def discover() -> dict[str, Experiment]:
    """``{paper id: run function}`` for every installed package's ``icml25.papers`` entry point."""
    found: dict[str, Experiment] = {}
    for ep in entry_points(group=GROUP):
        found[ep.name] = _lazy_run(ep.value)
    return dict(sorted(found.items()))


def _lazy_run(module_name: str) -> Experiment:
    def run(**kwargs: Any) -> Any:
        return importlib.import_module(module_name).run(**kwargs)

    run.__qualname__ = f"{module_name}.run"
    return run


@dataclass
class Outcome:
    paper: str
    status: str  # PASS | FAIL | ERROR
    seconds: float
    report: Any = None
    error: str = ""
    figures: list[Path] = field(default_factory=list)

    def line(self) -> str:
        if self.report is None:
            detail = f"error: {self.error.strip().splitlines()[-1] if self.error else 'unknown'}"
        else:
            detail = _summary(self.report)
        return f"{self.paper} {self.status} {detail} {self.seconds:.1f}s"


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _summary(report: Any) -> str:
    metrics = report.metrics
    head = f"{report.headline}={_fmt(metrics[report.headline])}"
    base = "n/a" if report.baseline is None else _fmt(metrics[report.baseline])
    return f"{head} (baseline {base}, threshold {report.threshold})"


def run_one(paper: str, experiment: Experiment, *, quick: bool, seed: int, out_dir: Path) -> Outcome:
    """Run one experiment; exceptions and malformed reports become an ERROR outcome, not a crash."""
    fig_dir = out_dir / paper
    fig_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        report = experiment(quick=quick, seed=seed, out_dir=fig_dir)
        for attr in ("passed", "metrics", "claim", "threshold", "headline"):
            if not hasattr(report, attr):
                raise TypeError(f"run() returned {type(report).__name__} without the {attr!r} attribute")
        _summary(report)  # a headline/baseline that names no metric is an error of the experiment
    except Exception:
        return Outcome(paper, "ERROR", time.perf_counter() - start, error=traceback.format_exc())
    seconds = time.perf_counter() - start
    figures = [Path(f) for f in getattr(report, "figures", []) or []]
    return Outcome(paper, "PASS" if report.passed else "FAIL", seconds, report=report, figures=figures)


def write_report(outcomes: list[Outcome], out_dir: Path, *, quick: bool, seed: int) -> Path:
    """Write ``REPORT.md`` into ``out_dir``: a summary table, then one section per paper."""
    mode = "quick" if quick else "full"
    lines = [
        "# icml25 reproduction report",
        "",
        f"Mode: **{mode}**, seed {seed}. {sum(o.status == 'PASS' for o in outcomes)}/{len(outcomes)} passed.",
        "",
        "| paper | result | headline | baseline | threshold | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        if o.report is None:
            lines.append(f"| {o.paper} | {o.status} | — | — | — | {o.seconds:.1f} |")
            continue
        r = o.report
        base = "—" if r.baseline is None else f"{r.baseline}={_fmt(r.metrics[r.baseline])}"
        lines.append(
            f"| {o.paper} | {o.status} | {r.headline}={_fmt(r.metrics[r.headline])} | {base} "
            f"| {r.threshold} | {o.seconds:.1f} |"
        )
    for o in outcomes:
        lines += ["", f"## {o.paper} — {o.status}", ""]
        if o.report is None:
            lines += ["```", o.error.strip(), "```"]
            continue
        r = o.report
        lines += [f"**Claim.** {r.claim}", "", f"**Threshold.** {r.threshold}", ""]
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in r.metrics.items()]
        notes = getattr(r, "notes", "")
        if notes:
            lines += ["", notes]
        for fig in o.figures:
            rel = fig.relative_to(out_dir) if fig.is_relative_to(out_dir) else fig
            lines += ["", f"![{o.paper} {fig.stem}]({rel.as_posix()})"]
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None, discover: Callable[[], Mapping[str, Experiment]] = discover) -> int:
    parser = argparse.ArgumentParser(description="Reproduce the installed icml25 papers at small scale.")
    parser.add_argument("--only", action="append", metavar="PID", help="paper id to run (repeatable)")
    parser.add_argument(
        "--full", action="store_true", help="full small-scale setting (minutes) instead of quick"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    args = parser.parse_args(argv)

    experiments = dict(discover())
    if args.only:
        missing = sorted(set(args.only) - set(experiments))
        if missing:
            installed = ", ".join(experiments) or "none"
            print(f"--only: {', '.join(missing)} not installed (installed: {installed})", file=sys.stderr)
            return 2
        experiments = {pid: experiments[pid] for pid in sorted(set(args.only))}
    if not experiments:
        print("No paper is implemented in the installed icml25 packages yet: nothing to reproduce.")
        return 0

    from tqdm.auto import tqdm

    args.out.mkdir(parents=True, exist_ok=True)
    quick = not args.full
    outcomes: list[Outcome] = []
    bar = tqdm(experiments.items(), desc="reproduce", unit="paper", file=sys.stderr)
    for pid, experiment in bar:
        bar.set_postfix_str(pid)
        outcome = run_one(pid, experiment, quick=quick, seed=args.seed, out_dir=args.out)
        tqdm.write(outcome.line())
        outcomes.append(outcome)
    path = write_report(outcomes, args.out, quick=quick, seed=args.seed)
    print(f"report: {path}")
    return 0 if all(o.status == "PASS" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
