"""The ``icml25`` command (also ``python -m icml25.kernels``), shipped with icml25-kernels.

* ``icml25 list`` — the catalog's papers: status, package, whether it is installed here, and what its
  reproduction is expected to do (``pass``, or a known ``miss``);
* ``icml25 reproduce`` — run the installed papers' reproductions (:mod:`icml25.kernels.reproduce`);
* ``icml25 cite`` — the BibTeX entry of a paper (``citations.bib``, shipped next to the catalog).

Usage::

    icml25 list                                   # all 55 papers
    icml25 list --installed                       # the papers this environment can reproduce
    icml25 reproduce --only P05                   # quick mode -> reports/<date-time>-quick/REPORT.md
    icml25 reproduce --only P07 --full --record --results results --note "3 seeds"
    icml25 cite P05                               # the paper's BibTeX entry (ids are case-insensitive)
    icml25 cite --all > icml25.bib                # every implemented paper's entry
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import resources
from importlib.metadata import entry_points
from pathlib import Path

from icml25.kernels import catalog, reproduce

__all__ = ["citations", "cite", "installed_papers", "list_papers", "main"]


def installed_papers() -> dict[str, str]:
    """``{paper id: distribution}`` for every ``icml25.papers`` entry point of the installed packages."""
    found = {}
    for ep in entry_points(group=reproduce.GROUP):
        found[ep.name] = ep.dist.name if ep.dist is not None else "?"
    return found


def list_papers(*, implemented: bool = False, installed: bool = False) -> list[str]:
    """The lines ``icml25 list`` prints: a header, one row per paper, and a count."""
    papers = catalog.load()
    present = installed_papers()
    rows = [("id", "status", "package", "installed", "expect", "scope", "title")]
    for p in papers:
        if (implemented and p.status != "implemented") or (installed and p.id not in present):
            continue
        here = "yes" if p.id in present else ("no" if p.status == "implemented" else "—")
        rows.append((p.id, p.status, p.distribution or "—", here, p.expectation(), p.scope or "—", p.title))
    known = {p.id for p in papers}
    for pid in sorted(set(present) - known):  # an installed package newer than this catalog
        rows.append((pid, "not in catalog", present[pid], "yes", "pass", "—", "—"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]
    counts = {s: sum(p.status == s for p in papers) for s in catalog.STATUSES}
    n_installed = sum(p.id in present for p in papers if p.status == "implemented")
    lines.append("")
    lines.append(
        f"{len(papers)} papers: {counts['implemented']} implemented ({n_installed} installed here), "
        f"{counts['planned']} planned, {counts['out-of-scope']} out of scope. "
        "Install an area from a clone of the repository: pip install ./shared-kernels ./packages/<area> "
        "(pip install <package> once it is on PyPI)."
    )
    return lines


def citations() -> dict[str, str]:
    """``{paper id: BibTeX entry}`` from the shipped ``citations.bib`` (keys ``icml25:<id>``)."""
    text = resources.files("icml25.kernels").joinpath("citations.bib").read_text(encoding="utf-8")
    entries = {}
    for chunk in text.split("\n@")[1:]:
        entry = "@" + chunk.strip()
        key = entry[entry.index("{") + 1 : entry.index(",")]
        entries[key.removeprefix("icml25:")] = entry
    return entries


def cite(ids: Sequence[str], *, all_papers: bool = False) -> tuple[list[str], list[str]]:
    """The BibTeX entries of ``ids`` (case-insensitive) or of every implemented paper, and the error lines for
    ids without one (an unknown id, or a paper that is not implemented)."""
    entries = citations()
    papers = {p.id: p for p in catalog.load()}
    wanted = sorted(entries) if all_papers else [pid.strip().upper() for pid in ids]
    found, errors = [], []
    for pid in dict.fromkeys(wanted):
        if pid in entries:
            found.append(entries[pid])
        elif pid in papers:
            errors.append(f"{pid}: {papers[pid].title}: no citation ({papers[pid].status}, not implemented)")
        else:
            ids_ = sorted(papers)
            errors.append(f"{pid}: unknown paper (the catalog lists {ids_[0]} to {ids_[-1]}: icml25 list)")
    return found, errors


def _version() -> str:
    from icml25.kernels import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``icml25`` command line; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="icml25", description="Small-scale reproductions of ICML 2025 papers (icml25 packages)."
    )
    parser.add_argument("--version", action="version", version=f"icml25-kernels {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="{list,reproduce,cite}")
    commands.required = True
    listing = commands.add_parser("list", help="the catalog's papers, their status and what is installed")
    listing.add_argument("--implemented", action="store_true", help="only implemented papers")
    listing.add_argument("--installed", action="store_true", help="only papers installed here")
    repro = commands.add_parser("reproduce", help=reproduce.DESCRIPTION, description=reproduce.DESCRIPTION)
    reproduce.add_arguments(repro, results=Path("results"))
    citing = commands.add_parser("cite", help="the BibTeX entry of a paper (icml25 cite P05)")
    citing.add_argument("ids", nargs="*", metavar="PID", help="paper ids (case-insensitive)")
    citing.add_argument("--all", action="store_true", help="every implemented paper")
    args = parser.parse_args(argv)
    if args.command == "list":
        print("\n".join(list_papers(implemented=args.implemented, installed=args.installed)))
        return 0
    if args.command == "cite":
        if not args.ids and not args.all:
            citing.error("name a paper id (icml25 cite P05) or --all")
        found, errors = cite(args.ids, all_papers=args.all)
        if found:
            print("\n\n".join(found))
        for line in errors:
            print(f"icml25 cite: {line}", file=sys.stderr)
        return 2 if errors else 0
    return reproduce.execute(args, repro)


if __name__ == "__main__":
    sys.exit(main())
