"""Reproduce every installed paper's central claim at small scale (``icml25 reproduce``), write
``REPORT.md``, and record full runs in the results ledger (``results/<id>.json``).

Papers are discovered through the ``icml25.papers`` entry-point group: each installed icml25 package
registers ``<catalog id> = <experiment module>``, and the module's ``run(quick, seed, out_dir)`` returns an
:class:`icml25.kernels.Report` (read by attribute: ``passed``, ``metrics``, ``claim``, ``threshold``,
``headline``, ``baseline``, ``figures``, ``notes``, ``checks``, ``seeds``). ``REPORT.md`` also shows each
paper's deviations from its official code (``deviations.toml``, :func:`icml25.kernels.catalog.load_deviations`).

Each paper's outcome compares its verdict with what the catalog (:mod:`icml25.kernels.catalog`, shipped in
this wheel) expects:

=================  ==============================================================  =========
outcome            meaning                                                         exit code
=================  ==============================================================  =========
PASS               the threshold holds, as expected                                0
KNOWN-MISS         the threshold does not hold and the catalog records why         0
FAIL               the threshold does not hold but the catalog expects a pass      1
UNEXPECTED-PASS    the threshold holds but the catalog records a known miss        1
ERROR              the experiment raised or returned a malformed report            1
INCONCLUSIVE       a precondition failed: the baseline could not show the effect   1
                   (e.g. both arms at chance), so the run says nothing about the
                   claim; it is never recorded in the ledger: change the setting
=================  ==============================================================  =========

UNEXPECTED-PASS is strict on purpose (as pytest's ``xfail(strict=True)``): a miss that went away means the
catalog and the ledger are out of date. Exit code 2 is a usage error.

Usage::

    icml25 reproduce                                  # quick mode, every installed paper -> reports/
    icml25 reproduce --only P07 --only P54 --full --out reports
    icml25 reproduce --only P07 --full --record       # also write results/P07.json
    icml25 reproduce --only P07 --rejudge             # re-read results/P07.json's outcome from the catalog

``--rejudge`` runs nothing: after the catalog's expectation of a paper changed (a pass became a known miss,
or the reason was rewritten with the recorded numbers), it recomputes the recorded entry's ``outcome`` and
``miss_reason`` from the entry's measured ``passed`` and the current catalog, and notes the change in the
entry's ``rejudged`` field. The measurements, the source hash and the git provenance stay as recorded.

``python -m icml25.kernels reproduce`` is the same command; in a source checkout ``tools/reproduce.py``
runs it with the repository's ``results/`` folder as the ledger.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from icml25.kernels.report import ARROWS, clip, direction, format_value, short_line, summary_line

__all__ = [
    "FAILING",
    "GROUP",
    "Expectation",
    "Outcome",
    "add_arguments",
    "catalog_deviations",
    "catalog_expectations",
    "discover",
    "execute",
    "figures_available",
    "ledger_entry",
    "machine",
    "main",
    "plots_hint",
    "record",
    "rejudge",
    "run_folder",
    "run_one",
    "write_report",
]

GROUP = "icml25.papers"
Experiment = Callable[..., Any]
FAILING = ("FAIL", "UNEXPECTED-PASS", "ERROR", "INCONCLUSIVE")
LINE_WIDTH = 120
"""The widest line ``icml25 reproduce`` prints per paper; ``REPORT.md`` holds the full text."""


@dataclass(frozen=True)
class Expectation:
    """What the catalog expects of one paper: a pass, or a known miss (with its reason) in some modes."""

    miss_in: tuple[str, ...] = ()
    reason: str = ""
    scope: str = "claim"
    scope_note: str = ""

    def misses(self, quick: bool) -> bool:
        return ("quick" if quick else "full") in self.miss_in


def catalog_expectations() -> dict[str, Expectation]:
    """``{paper id: Expectation}`` from the shipped catalog (papers it does not list expect a pass)."""
    from icml25.kernels import catalog

    return {
        p.id: Expectation(p.miss_in if p.expect == "miss" else (), p.miss_reason, p.scope, p.scope_note)
        for p in catalog.load()
        if p.status == "implemented"
    }


def figures_available() -> bool:
    """Whether the experiments can draw their figures (matplotlib, the areas' ``[plots]`` extra, is
    installed); without it ``reproduce`` runs them with ``out_dir=None`` and says so, instead of failing."""
    return importlib.util.find_spec("matplotlib") is not None


def discover() -> dict[str, Experiment]:
    """``{paper id: run function}`` for every installed package's ``icml25.papers`` entry point."""
    found: dict[str, Experiment] = {}
    for ep in entry_points(group=GROUP):
        found[ep.name] = _lazy_run(
            ep.value, ep.dist.name if ep.dist else "", ep.dist.version if ep.dist else ""
        )
    return dict(sorted(found.items()))


def _lazy_run(module_name: str, distribution: str = "", version: str = "") -> Experiment:
    def run(**kwargs: Any) -> Any:
        return importlib.import_module(module_name).run(**kwargs)

    run.__qualname__ = f"{module_name}.run"
    run.module = module_name  # type: ignore[attr-defined]
    run.distribution = (distribution, version)  # type: ignore[attr-defined]
    return run


@dataclass
class Outcome:
    paper: str
    status: str  # PASS | FAIL | KNOWN-MISS | UNEXPECTED-PASS | ERROR | INCONCLUSIVE
    seconds: float
    report: Any = None
    error: str = ""
    figures: list[Path] = field(default_factory=list)
    expectation: Expectation = Expectation()

    def line(self, width: int = LINE_WIDTH) -> str:
        """The result line (at most ``width`` characters; the known-miss reason and the other notes follow on
        a second line, cut to the same width: ``REPORT.md`` has the thresholds, checks and reasons in full)."""
        tail = f" {self.seconds:.1f}s"
        if self.report is None:
            last = self.error.strip().splitlines()[-1] if self.error else "unknown"
            line = clip(f"{self.paper} {self.status} error: {last}", width - len(tail)) + tail
        else:
            head = f"{self.paper} {self.status} {short_line(self.report, width - len(self.paper) - 20)}"
            failed = _failed_checks(self.report)
            if self.status == "INCONCLUSIVE":
                head += f" [precondition failed: {'; '.join(self.report.failed_preconditions)}]"
            elif failed and not self.report.passed:
                head += f" [failed: {'; '.join(failed)}]"
            line = clip(head, width - len(tail)) + tail
        if self.status == "PASS" and self.expectation.scope != "claim":
            line += "\n" + clip(f"    scope: {self.expectation.scope} ({self.expectation.scope_note})", width)
        if self.status == "KNOWN-MISS":
            line += "\n" + clip(f"    known miss: {self.expectation.reason}", width)
        elif self.status == "INCONCLUSIVE":
            line += "\n    inconclusive: the baseline could not show the effect here; change the setting"
        elif self.status == "UNEXPECTED-PASS":
            line += "\n    the catalog records a known miss: update the catalog (catalog.toml) and the ledger"
        return line


def _summary(report: Any) -> str:
    return summary_line(report)


def _fmt(x: float) -> str:
    return format_value(x)


def _failed_checks(report: Any) -> list[str]:
    return [name for name, ok in (getattr(report, "checks", None) or {}).items() if not ok]


def _verdict(passed: bool, expectation: Expectation, quick: bool) -> str:
    if expectation.misses(quick):
        return "UNEXPECTED-PASS" if passed else "KNOWN-MISS"
    return "PASS" if passed else "FAIL"


def run_one(
    paper: str,
    experiment: Experiment,
    *,
    quick: bool,
    seed: int,
    out_dir: Path,
    expectation: Expectation = Expectation(),
    figures: bool = True,
) -> Outcome:
    """Run one experiment; exceptions and malformed reports become an ERROR outcome, not a crash.

    With ``figures`` the experiment writes its figures into ``out_dir/<paper>``; without, it gets
    ``out_dir=None`` and draws none.
    """
    fig_dir = out_dir / paper
    if figures:
        fig_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        report = experiment(quick=quick, seed=seed, out_dir=fig_dir if figures else None)
        for attr in ("passed", "metrics", "claim", "threshold", "headline"):
            if not hasattr(report, attr):
                raise TypeError(f"run() returned {type(report).__name__} without the {attr!r} attribute")
        _summary(report)  # a headline/baseline that names no metric is an error of the experiment
        _check_threshold_text(experiment, report, quick)
    except Exception:
        return Outcome(
            paper, "ERROR", time.perf_counter() - start, error=traceback.format_exc(), expectation=expectation
        )
    seconds = time.perf_counter() - start
    written = [Path(f) for f in getattr(report, "figures", []) or []]
    if getattr(report, "inconclusive", False):
        status = "INCONCLUSIVE"
    else:
        status = _verdict(bool(report.passed), expectation, quick)
    return Outcome(paper, status, seconds, report=report, figures=written, expectation=expectation)


def _check_threshold_text(experiment: Experiment, report: Any, quick: bool) -> None:
    """The threshold a run reports must be the one its module states (``threshold(quick)``), which is what
    the results ledger is checked against."""
    module_name = getattr(experiment, "module", None)
    if module_name is None:
        return
    stated = getattr(importlib.import_module(module_name), "threshold", None)
    if stated is not None and stated(quick=quick) != report.threshold:
        raise ValueError(
            f"{module_name}.run reported threshold {report.threshold!r} but "
            f"{module_name}.threshold(quick={quick}) states {stated(quick=quick)!r}"
        )


def catalog_deviations() -> dict[str, str]:
    """``{paper id: its deviations from the official code, as markdown}`` from the shipped
    ``deviations.toml`` (:func:`icml25.kernels.catalog.load_deviations`)."""
    from icml25.kernels import catalog

    return {pid: review.markdown() for pid, review in catalog.load_deviations().items()}


def write_report(
    outcomes: list[Outcome],
    out_dir: Path,
    *,
    quick: bool,
    seed: int,
    deviations: Mapping[str, str] | None = None,
) -> Path:
    """Write ``REPORT.md`` into ``out_dir``: a summary table, the known misses, then one section per paper,
    with the paper's deviations from its official code (``deviations``: ``{paper id: markdown}``, default
    :func:`catalog_deviations`)."""
    deviations = catalog_deviations() if deviations is None else deviations
    mode = "quick" if quick else "full"
    counts = _counts(outcomes)
    lines = [
        "# icml25 reproduction report",
        "",
        f"Mode: **{mode}**, seed {seed}. {counts}.",
        "",
        "↑ / ↓ after a headline: higher / lower is better.",
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
        arrow = ARROWS.get(direction(r) or "", "")
        lines.append(
            f"| {o.paper} | {o.status} | {r.headline}={_fmt(r.metrics[r.headline])}{' ' + arrow if arrow else ''} "
            f"| {base} | {r.threshold} | {o.seconds:.1f} |"
        )
    misses = [o for o in outcomes if o.status == "KNOWN-MISS"]
    if misses:
        lines += ["", "## Known misses", ""]
        lines += [f"- **{o.paper}**: {o.expectation.reason}" for o in misses]
    for o in outcomes:
        lines += ["", f"## {o.paper} — {o.status}", ""]
        if o.report is None:
            lines += ["```", o.error.strip(), "```"]
            continue
        r = o.report
        lines += [f"**Claim.** {r.claim}", "", f"**Threshold.** {r.threshold}", ""]
        scope = o.expectation.scope
        lines += [f"**Scope.** {scope}" + (f": {o.expectation.scope_note}" if scope != "claim" else ""), ""]
        if o.status == "KNOWN-MISS":
            lines += [f"**Known miss.** {o.expectation.reason}", ""]
        if o.paper in deviations:
            lines += [deviations[o.paper], ""]
        preconditions = getattr(r, "preconditions", None) or {}
        if preconditions:
            lines += ["| precondition | holds |", "|---|---|"]
            lines += [f"| {name} | {'yes' if ok else '**no**'} |" for name, ok in preconditions.items()]
            lines += [""]
        checks = getattr(r, "checks", None) or {}
        if checks:
            lines += ["| check | holds |", "|---|---|"]
            lines += [f"| {name} | {'yes' if ok else '**no**'} |" for name, ok in checks.items()]
            lines += [""]
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


def run_folder(out: Path, *, quick: bool, now: dt.datetime | None = None) -> Path:
    """A new folder for one run's ``REPORT.md`` and figures: ``<out>/<YYYYmmdd-HHMMSS>-<mode>`` (local time;
    ``-2``, ``-3``... when that exists already), so a later run never overwrites an earlier one's report."""
    stamp = f"{(now or dt.datetime.now()):%Y%m%d-%H%M%S}-{'quick' if quick else 'full'}"
    out.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = out / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free run folder {stamp}-N under {out}")


def _counts(outcomes: list[Outcome]) -> str:
    order = ("PASS", "KNOWN-MISS", "FAIL", "UNEXPECTED-PASS", "ERROR", "INCONCLUSIVE")
    parts = [
        f"{sum(o.status == s for o in outcomes)} {s}" for s in order if any(o.status == s for o in outcomes)
    ]
    return f"{len(outcomes)} papers: " + ", ".join(parts)


# ---------------------------------------------------------------------------------------------------------
# the results ledger


def _finite_or_text(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _git(*args: str, repo: Path | None = None) -> str:
    try:
        result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def machine() -> dict[str, Any]:
    """CPU model, cores, GPU (if any), OS, Python and torch versions of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        # timing claims (speed-ups, delays) are measured against a baseline in the same run, but a loaded
        # machine still shifts them: the 1-minute load average when the entry was written says how loaded
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def _dirty(repo: Path | None, results: Path | None) -> bool:
    # Tracked files changed in the checkout, the ledger folder excluded: a `--record` run of several
    # papers writes results/<id>.json as it goes, which must not mark the later papers' code as modified.
    spec = ["--"]
    if results is not None:
        root = _git("rev-parse", "--show-toplevel", repo=repo)
        try:
            relative = Path(results).resolve().relative_to(Path(root).resolve()) if root else None
        except ValueError:
            relative = None  # the ledger lives outside the checkout
        if relative is not None and str(relative) != ".":
            spec += [":/", f":(top,exclude){relative.as_posix()}"]
    return bool(_git("status", "--porcelain", "--untracked-files=no", *spec, repo=repo))


def ledger_entry(
    outcome: Outcome,
    experiment: Experiment,
    *,
    seed: int,
    note: str = "",
    repo: Path | None = None,
    results: Path | None = None,
) -> dict[str, Any]:
    """The ``results/<id>.json`` record of one full run; ``git_commit``/``git_dirty`` describe the git
    checkout at ``repo`` (default: the current directory), empty/None outside one. ``git_dirty`` ignores
    the ledger folder ``results`` (the run itself writes there). ``source_hash`` is
    :func:`icml25.kernels.provenance.source_hash` of the experiment module as imported here: the ledger
    check recomputes it and names the entry stale once the paper's code changes."""
    if outcome.status == "INCONCLUSIVE" or outcome.report is None:
        raise ValueError(f"{outcome.paper}: an {outcome.status} run is not a result and is never recorded")
    r = outcome.report
    distribution, version = getattr(experiment, "distribution", ("", ""))
    commit = _git("rev-parse", "HEAD", repo=repo)
    entry = {
        "paper": outcome.paper,
        "mode": "full",
        "outcome": outcome.status,
        "claim": r.claim,
        "threshold": r.threshold,
        "passed": bool(r.passed),
        "checks": dict(getattr(r, "checks", None) or {}),
        "preconditions": dict(getattr(r, "preconditions", None) or {}),
        "headline": r.headline,
        "baseline": r.baseline,
        "metrics": {k: _finite_or_text(float(v)) for k, v in r.metrics.items()},
        "seed": seed,
        "seeds": list(getattr(r, "seeds", None) or [seed]),
        "wall_seconds": round(outcome.seconds, 1),
        "package": distribution,
        "package_version": version,
        "source_hash": _source_hash(experiment),
        "git_commit": commit,
        "git_dirty": _dirty(repo, results) if commit else None,
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "notes": getattr(r, "notes", ""),
    }
    if outcome.status == "KNOWN-MISS":
        entry["miss_reason"] = outcome.expectation.reason
    if note:
        entry["note"] = note
    return entry


def _source_hash(experiment: Experiment) -> str | None:
    module = getattr(experiment, "module", None)
    if module is None:
        return None
    from icml25.kernels.provenance import source_hash

    return source_hash(module)


def _write_entry(path: Path, entry: dict[str, Any]) -> None:
    """The ledger's one file format (indented JSON, no NaN), shared by :func:`record` and :func:`rejudge`."""
    path.write_text(json.dumps(entry, indent=2, allow_nan=False) + "\n")


def record(
    outcome: Outcome,
    experiment: Experiment,
    results: Path,
    *,
    seed: int,
    note: str = "",
    repo: Path | None = None,
) -> Path:
    """Write ``results/<id>.json`` (:func:`ledger_entry`) and return its path."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{outcome.paper}.json"
    entry = ledger_entry(outcome, experiment, seed=seed, note=note, repo=repo, results=results)
    _write_entry(path, entry)
    return path


def rejudge(paper: str, expectation: Expectation, results: Path) -> tuple[str, str, Path]:
    """Recompute the outcome of the recorded full run ``results/<paper>.json`` from its measured ``passed``
    and ``expectation`` (the catalog's, now), without running anything; returns ``(old, new, path)``.

    A known miss gets the catalog's reason as its ``miss_reason`` (any other outcome loses the field); the
    entry's ``rejudged`` field records the date and the previous outcome. Metrics, checks, ``source_hash``
    and the git provenance are left as recorded: they describe the run, which did not change."""
    path = results / f"{paper}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{paper}: no recorded full run at {path} (record one: --full --record)")
    entry = json.loads(path.read_text())
    if (
        entry.get("paper") != paper
        or entry.get("mode") != "full"
        or not isinstance(entry.get("passed"), bool)
    ):
        raise ValueError(f"{path}: not a full-run ledger entry of {paper} with a boolean 'passed'")
    old = str(entry.get("outcome"))
    new = _verdict(entry["passed"], expectation, quick=False)
    entry["outcome"] = new
    if new == "KNOWN-MISS":
        entry["miss_reason"] = expectation.reason
    else:
        entry.pop("miss_reason", None)
    entry["rejudged"] = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "was": old}
    _write_entry(path, entry)
    return old, new, path


# ---------------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, *, results: Path = Path("results")) -> None:
    """The options of ``icml25 reproduce``; ``results`` is the default ledger folder."""
    parser.add_argument("--only", action="append", metavar="PID", help="paper id to run (repeatable)")
    parser.add_argument(
        "--full", action="store_true", help="full small-scale setting (minutes) instead of quick"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    parser.add_argument(
        "--record", action="store_true", help="with --full: write each run to the results ledger"
    )
    parser.add_argument("--results", type=Path, default=results, help=f"ledger folder (default: {results})")
    parser.add_argument(
        "--note", default="", help="with --record: a note stored in each entry (e.g. fewer seeds)"
    )
    parser.add_argument(
        "--rejudge",
        action="store_true",
        help="with --only: run nothing; recompute each recorded entry's outcome (and miss reason) from the "
        "current catalog",
    )


DESCRIPTION = "Reproduce the installed icml25 papers at small scale."


def _why_absent(pid: str, experiments: Mapping[str, Experiment]) -> str:
    """Why ``--only pid`` names nothing to run: an id the catalog does not know, a paper not implemented yet,
    or an implemented one whose package is not installed here (with the command that installs it)."""
    from icml25.kernels import catalog

    papers = {p.id: p for p in catalog.load()}
    paper = papers.get(pid)
    if paper is None:
        ids = sorted(papers)
        return f"unknown paper (the catalog lists {ids[0]} to {ids[-1]}: icml25 list)"
    if paper.status != "implemented":
        return f"{paper.title}: not implemented ({paper.status}; icml25 list)"
    return (
        f"{paper.title} is in {paper.distribution}, which is not installed here: "
        f"pip install '{paper.distribution}[plots]' ([plots]: the figures)"
    )


def plots_hint(experiments: Iterable[Experiment] = ()) -> str:
    """``pip install '<area>[plots]'`` for the areas of ``experiments`` (their ``distribution``), or plain
    matplotlib when none is known."""
    areas = sorted(
        {
            dist
            for e in experiments
            if (dist := getattr(e, "distribution", ("", ""))[0]).startswith("icml25-")
            and dist != "icml25-kernels"
        }
    )
    if not areas:
        return "pip install matplotlib"
    return "pip install " + " ".join(f"'{a}[plots]'" for a in areas)


def main(
    argv: Sequence[str] | None = None,
    discover: Callable[[], Mapping[str, Experiment]] = discover,
    expectations: Callable[[], Mapping[str, Expectation]] = catalog_expectations,
    *,
    results: Path = Path("results"),
    repo: Path | None = None,
    prog: str | None = None,
) -> int:
    """``icml25 reproduce [--only PID]... [--full] [--seed N] [--out DIR] [--record --results DIR --note TEXT]``.

    ``discover`` and ``expectations`` default to the installed entry points and the shipped catalog;
    ``results`` is the default ledger folder and ``repo`` the git checkout the ledger's provenance is read
    from (default: the current directory).
    """
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser, results=results)
    args = parser.parse_args(argv)
    return execute(args, parser, discover=discover, expectations=expectations, repo=repo)


def execute(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    *,
    discover: Callable[[], Mapping[str, Experiment]] = discover,
    expectations: Callable[[], Mapping[str, Expectation]] = catalog_expectations,
    repo: Path | None = None,
) -> int:
    """Run the parsed ``icml25 reproduce`` command; returns the exit code."""
    if args.record and not args.full:
        parser.error("--record records full runs only: add --full")
    if args.rejudge:
        if not args.only or args.record:
            parser.error("--rejudge needs --only PID (and runs nothing, so no --record)")
        expected = dict(expectations())
        for pid in sorted({pid.strip().upper() for pid in args.only}):
            try:
                old, new, path = rejudge(pid, expected.get(pid, Expectation()), args.results)
            except (FileNotFoundError, ValueError) as err:
                print(f"--rejudge {pid}: {err}", file=sys.stderr)
                return 2
            print(f"{pid}: {old} -> {new} ({path})")
        return 0

    experiments = dict(discover())
    if args.only:
        wanted = sorted({pid.strip().upper() for pid in args.only})
        missing = [pid for pid in wanted if pid not in experiments]
        if missing:
            for pid in missing:
                print(f"--only {pid}: {_why_absent(pid, experiments)}", file=sys.stderr)
            return 2
        experiments = {pid: experiments[pid] for pid in wanted}
    if not experiments:
        print("No paper is implemented in the installed icml25 packages yet: nothing to reproduce.")
        return 0
    expected = dict(expectations())

    from tqdm.auto import tqdm

    quick = not args.full
    out_dir = run_folder(args.out, quick=quick)
    figures = figures_available()
    if not figures:
        print(
            f"figures off: matplotlib is not installed ({plots_hint(experiments.values())})", file=sys.stderr
        )
    outcomes: list[Outcome] = []
    bar = tqdm(experiments.items(), desc="reproduce", unit="paper", file=sys.stderr)
    for pid, experiment in bar:
        bar.set_postfix_str(pid)
        outcome = run_one(
            pid,
            experiment,
            quick=quick,
            seed=args.seed,
            out_dir=out_dir,
            expectation=expected.get(pid, Expectation()),
            figures=figures,
        )
        tqdm.write(outcome.line())
        if args.record and outcome.status == "INCONCLUSIVE":
            tqdm.write("    not recorded: an inconclusive run is not a result")
        elif args.record and outcome.report is not None:
            tqdm.write(
                "    recorded: "
                f"{record(outcome, experiment, args.results, seed=args.seed, note=args.note, repo=repo)}"
            )
        outcomes.append(outcome)
    path = write_report(outcomes, out_dir, quick=quick, seed=args.seed)
    print(f"\n{_counts(outcomes)} (↑ / ↓: higher / lower is better)")
    for o in outcomes:
        if o.status == "KNOWN-MISS":
            print(clip(f"  known miss {o.paper}: {o.expectation.reason}", LINE_WIDTH))
        elif o.status == "INCONCLUSIVE":
            print(f"  INCONCLUSIVE {o.paper}: {'; '.join(o.report.failed_preconditions)}")
        elif o.status in FAILING:
            print(f"  {o.status} {o.paper}")
    print(f"report: {path} (thresholds, checks and reasons in full)")
    return 1 if any(o.status in FAILING for o in outcomes) else 0
