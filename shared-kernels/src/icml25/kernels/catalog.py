"""The paper catalog shipped with icml25-kernels: which of the 55 papers are implemented, where, and what their
reproductions are expected to do.

``catalog.toml`` (package data next to this module, read through :mod:`importlib.resources`, so an installed
wheel has it) is the single source of truth for the README table, ``icml25 list`` and the expectations of
``icml25 reproduce``: ``expect = "pass"`` (the default) or ``expect = "miss"`` with ``miss_reason``, a
correct implementation that does not meet the paper's threshold at this scale; ``miss_in`` narrows a miss to
``["quick"]`` or ``["full"]``. ``scope`` says what an implemented paper's full gate tests: ``claim`` (the
paper's headline claim against its baseline), ``mechanism`` (the method's mechanism, while the headline
outcome is only reported) or ``partial`` (part of the paper is not built), with a one-line ``scope_note``
where it is not ``claim``. The repository's ``tools/catalog.py`` checks it against the packages, the README
and the results ledger.

``deviations.toml`` (package data too) lists, per implemented paper, how the implementation differs from the
paper's official code (:class:`Review`, :class:`Deviation`, :func:`load_deviations`). It is data, not code, so
adding an entry stales no ledger entry; ``tools/catalog.py --write-deviations`` renders each paper's list into
its package README and ``icml25 reproduce`` into ``REPORT.md``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

__all__ = [
    "EFFECTS",
    "EXPECTS",
    "MODES",
    "SCOPES",
    "STATUSES",
    "Deviation",
    "Paper",
    "Review",
    "deviations_block",
    "load",
    "load_deviations",
    "load_deviations_text",
    "load_text",
]

STATUSES = ("implemented", "planned", "out-of-scope")
EXPECTS = ("pass", "miss")
MODES = ("quick", "full")
SCOPES = ("claim", "mechanism", "partial")
N_PAPERS = 55


@dataclass(frozen=True)
class Paper:
    """One catalog entry."""

    id: str
    """Catalog id, ``P00`` ... ``P54``."""
    slug: str
    """Kebab-case short name; the module names use it with underscores (``mag-listing`` -> ``mag_listing``)."""
    package: str
    """The area distribution without its ``icml25-`` prefix (``rl``), or ``none`` for an out-of-scope paper."""
    title: str
    status: str
    """``implemented``, ``planned`` or ``out-of-scope``."""
    reason: str = ""
    """Why an out-of-scope paper is out of scope."""
    module: str = ""
    """The library module of an implemented paper (``icml25.rl.gas``)."""
    entry_point: str = ""
    """The experiment module an implemented paper registers (``icml25.rl.experiments.gas``)."""
    expect: str = "pass"
    """``pass``, or ``miss``: a known miss of a correct implementation, explained by ``miss_reason``."""
    miss_reason: str = ""
    miss_in: tuple[str, ...] = MODES
    """The modes (``quick``, ``full``) a known miss applies to."""
    scope: str = ""
    """What the full gate of an implemented paper tests: ``claim``, ``mechanism`` or ``partial``."""
    scope_note: str = ""
    """Why a ``mechanism`` or ``partial`` scope is not ``claim``: what is report-only, or not built."""
    off_ledger_numbers: tuple[str, ...] = ()
    """Numbers ``miss_reason`` quotes from outside the paper's ledger entry (the paper itself, an earlier or a
    side run), exactly as written there; every other decimal in it must come from the entry."""
    full_run_pending: str = ""
    """Why an implemented paper's current full run is not in the ledger yet (e.g. it ran past a session);
    while set, a missing or stale ledger entry is reported as pending instead of failing the check."""

    @property
    def area(self) -> str:
        """The import name below ``icml25.`` (``causal_discovery``)."""
        return self.package.replace("-", "_")

    @property
    def distribution(self) -> str:
        """The distribution that implements the paper (``icml25-rl``); empty for ``package = "none"``."""
        return "" if self.package == "none" else f"icml25-{self.package}"

    def expects_miss(self, mode: str) -> bool:
        """Whether the catalog records this paper's claim as a known miss in ``mode`` (quick | full)."""
        return self.expect == "miss" and mode in self.miss_in

    def expectation(self) -> str:
        """``pass``, ``miss``, ``miss (full)`` ... for an implemented paper; ``—`` for any other."""
        if self.status != "implemented":
            return "—"
        if self.expect == "pass":
            return "pass"
        return "miss" if set(self.miss_in) == set(MODES) else f"miss ({', '.join(self.miss_in)})"


def load(path: str | Path | None = None, *, packages: Collection[str] | None = None) -> list[Paper]:
    """Read and validate the catalog (the shipped ``catalog.toml`` unless ``path`` is given).

    ``packages``, when given, is the set of valid ``package`` names (the repository's tools pass the uv
    workspace's areas); without it a package name need only be kebab-case.

    Raises:
        ValueError: a malformed entry, naming the paper (or entry index) and the field.
    """
    return load_text(_read_data("catalog.toml", path), packages=packages)


def _read_data(shipped: str, path: str | Path | None) -> str:
    """The text of ``path``, or of the data file ``shipped`` inside the installed ``icml25.kernels``."""
    if path is None:
        return resources.files("icml25.kernels").joinpath(shipped).read_text(encoding="utf-8")
    return Path(path).read_text(encoding="utf-8")


def load_text(text: str, *, packages: Collection[str] | None = None) -> list[Paper]:
    """:func:`load` from the catalog's TOML text."""
    raw = tomllib.loads(text)
    known = {f.name for f in fields(Paper)}
    papers: list[Paper] = []
    for i, entry in enumerate(raw.get("paper", [])):
        unknown = set(entry) - known
        if unknown:
            raise ValueError(f"catalog entry {i}: unknown fields {sorted(unknown)}")
        for name in ("miss_in", "off_ledger_numbers"):
            if name in entry:
                entry = {**entry, name: tuple(entry[name])}
        try:
            paper = Paper(**entry)
        except TypeError as err:
            raise ValueError(f"catalog entry {i}: {err}") from None
        _validate(paper, packages)
        papers.append(paper)
    ids = [p.id for p in papers]
    expected = [f"P{i:02d}" for i in range(N_PAPERS)]
    if ids != expected:
        raise ValueError(f"catalog ids must be P00..P{N_PAPERS - 1} in order, got {ids}")
    return papers


def _validate(p: Paper, packages: Collection[str] | None) -> None:
    if not re.fullmatch(r"P\d\d", p.id):
        raise ValueError(f"{p.id}: id must look like P07")
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", p.slug):
        raise ValueError(f"{p.id}: slug must be kebab-case, got {p.slug!r}")
    if p.status not in STATUSES:
        raise ValueError(f"{p.id}: status must be one of {STATUSES}, got {p.status!r}")
    if p.full_run_pending and p.status != "implemented":
        raise ValueError(f"{p.id}: full_run_pending is only for implemented papers, got status {p.status!r}")
    if p.package == "none":
        if p.status != "out-of-scope":
            raise ValueError(f"{p.id}: package 'none' is only for an out-of-scope paper")
    elif packages is not None and p.package not in packages:
        raise ValueError(f"{p.id}: package must be one of {sorted(packages)}, got {p.package!r}")
    elif not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", p.package):
        raise ValueError(f"{p.id}: package must be a kebab-case area name, got {p.package!r}")
    if p.status == "out-of-scope" and not p.reason:
        raise ValueError(f"{p.id}: an out-of-scope paper needs a reason")
    if p.status == "implemented":
        prefix = f"icml25.{p.area}."
        if not p.module.startswith(prefix) or not p.entry_point.startswith(prefix + "experiments."):
            raise ValueError(
                f"{p.id}: an implemented paper needs module {prefix}<name> and entry_point "
                f"{prefix}experiments.<name>, got {p.module!r} and {p.entry_point!r}"
            )
    elif p.module or p.entry_point:
        raise ValueError(f"{p.id}: only implemented papers have module/entry_point (status {p.status!r})")
    if p.status == "implemented" and p.scope not in SCOPES:
        raise ValueError(f"{p.id}: an implemented paper needs scope, one of {SCOPES}, got {p.scope!r}")
    if p.status != "implemented" and (p.scope or p.scope_note):
        raise ValueError(f"{p.id}: only implemented papers have a scope (status {p.status!r})")
    if p.scope in ("mechanism", "partial") and not p.scope_note.strip():
        raise ValueError(f"{p.id}: scope {p.scope!r} needs a scope_note saying what the gate does not test")
    if p.scope == "claim" and p.scope_note:
        raise ValueError(f"{p.id}: scope_note is for a 'mechanism' or 'partial' scope, got scope 'claim'")
    if p.expect not in EXPECTS:
        raise ValueError(f"{p.id}: expect must be one of {EXPECTS}, got {p.expect!r}")
    if p.expect == "miss" and (p.status != "implemented" or not p.miss_reason.strip()):
        raise ValueError(f"{p.id}: expect = 'miss' needs an implemented paper and a miss_reason")
    if p.expect == "pass" and p.miss_reason:
        raise ValueError(f"{p.id}: miss_reason given but expect = 'pass'")
    unquoted = [n for n in p.off_ledger_numbers if n not in p.miss_reason]
    if unquoted:
        raise ValueError(f"{p.id}: off_ledger_numbers must be quoted in miss_reason, {unquoted} are not")
    if not p.miss_in or set(p.miss_in) - set(MODES):
        raise ValueError(f"{p.id}: miss_in must be a non-empty subset of {MODES}, got {list(p.miss_in)}")


# --- deviations from the official code (deviations.toml) ------------------------------------------------------

EFFECTS = ("measured", "expected", "none")
"""How a deviation's effect on the reported numbers is known: measured, expected (not measured) or none."""
_REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_./-]+)?")


@dataclass(frozen=True)
class Deviation:
    """One way an implementation differs from the official code (or, where there is none, from the paper)."""

    paper: str
    what: str
    """The topic, in a few words (``Low-level policy``)."""
    official: str
    """What the official code does (the paper, for a paper without public code)."""
    where: str
    """Where it does it: ``file:line`` in the official repository, or the paper's section."""
    ours: str
    """What this implementation does."""
    why: str
    """Why it differs (the CPU budget, a bug in the official code, an alignment still to do ...)."""
    effect: str
    """``measured``, ``expected`` (not measured) or ``none`` (no effect on the reported numbers)."""
    impact: str
    """The measured difference, the expected one, or why there is none."""

    def markdown(self, reference: str = "Official") -> str:
        """One list item: what, the reference's behaviour (where), ours, why, effect. ``reference`` names
        what ours is compared with (``Official``; ``Paper`` where no official code is public)."""
        return (
            f"- **{_sentence(self.what)}** {reference} ({self.where}): {_sentence(self.official)} "
            f"Ours: {_sentence(self.ours)} Why: {_sentence(self.why)} "
            f"Effect ({self.effect}): {_sentence(self.impact)}"
        )


@dataclass(frozen=True)
class Review:
    """How far a paper's implementation was compared with its official code, and the deviations found."""

    paper: str
    repository: str
    """``owner/name`` of the official repository on GitHub (a sub-folder may follow), or ``none`` when no
    official code is public (the deviations are then from the paper)."""
    reviewed: bool
    """Whether the official code (the paper, where there is none) was compared with this implementation, so
    the deviations are the complete list for what ``read`` names: an empty list of a reviewed paper is a
    claim. ``False``: the comparison is still to do; the entries so far come from the paper and
    the experiment's ``Setting``."""
    read: str = ""
    """What was compared (official files, the paper's sections); required when ``reviewed``."""
    note: str = ""
    """Anything a reader needs besides the list (what could not be read, where the list stops)."""
    deviations: tuple[Deviation, ...] = ()

    def markdown(self) -> str:
        """The list as the package README and ``REPORT.md`` show it."""
        if self.repository == "none":
            title, source, reference = "Deviations from the paper", "no official code is public", "the paper"
        else:
            owner, name, *folder = self.repository.split("/")
            url = f"https://github.com/{owner}/{name}" + (f"/tree/HEAD/{'/'.join(folder)}" if folder else "")
            title, source, reference = (
                "Deviations from the official code",
                f"[`{self.repository}`]({url})",
                "",
            )
        if self.reviewed:
            state = f"compared: {self.read}"
        else:
            state = f"**not yet compared line by line{' with ' + reference if reference else ''}**"
            state += f" (read so far: {self.read})" if self.read else ""
        head = f"**{title}** ({source}; {state})."
        if self.note:
            head += f" {_sentence(self.note)}"
        if not self.deviations:
            return head + (" None found." if self.reviewed else " None listed yet.")
        reference = "Paper" if self.repository == "none" else "Official"
        return "\n".join([head, "", *(d.markdown(reference) for d in self.deviations)])


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def deviations_block(pid: str) -> tuple[str, str]:
    """The start and end markers of paper ``pid``'s generated deviation list in its package README."""
    return (
        f"<!-- deviations:{pid}:start (generated by tools/catalog.py --write-deviations; "
        "edit shared-kernels/src/icml25/kernels/deviations.toml) -->",
        f"<!-- deviations:{pid}:end -->",
    )


def load_deviations(
    path: str | Path | None = None, *, papers: Collection[str] | None = None
) -> dict[str, Review]:
    """Read and validate ``deviations.toml`` (the shipped one unless ``path`` is given): ``{paper id: Review}``.

    ``papers``: the ids that may have an entry (default: the shipped catalog's implemented papers).

    Raises:
        ValueError: a malformed entry, naming the paper (or entry index) and the field.
    """
    text = _read_data("deviations.toml", path)
    if papers is None:
        papers = [p.id for p in load() if p.status == "implemented"]
    return load_deviations_text(text, papers=papers)


def load_deviations_text(text: str, *, papers: Collection[str]) -> dict[str, Review]:
    """:func:`load_deviations` from the TOML text."""
    raw = tomllib.loads(text)
    unknown_tables = set(raw) - {"review", "deviation"}
    if unknown_tables:
        raise ValueError(
            f"deviations: unknown tables {sorted(unknown_tables)} (only [[review]] and [[deviation]])"
        )
    known = set(papers)
    reviews: dict[str, Review] = {}
    for i, entry in enumerate(raw.get("review", [])):
        where = f"deviations review {i} ({entry.get('paper', '?')})"
        review = _build(Review, entry, where, exclude={"deviations"})
        if review.paper not in known:
            raise ValueError(f"{where}: paper must be an implemented paper's id, got {review.paper!r}")
        if review.paper in reviews:
            raise ValueError(f"{where}: a second [[review]] for {review.paper}")
        if not isinstance(review.reviewed, bool):
            raise ValueError(f"{where}: reviewed must be true or false, got {review.reviewed!r}")
        if review.repository != "none" and not _REPOSITORY.fullmatch(review.repository):
            raise ValueError(f"{where}: repository must be owner/name or 'none', got {review.repository!r}")
        if review.reviewed and not review.read:
            raise ValueError(f"{where}: a reviewed paper needs read (what was compared)")
        reviews[review.paper] = review
    found: dict[str, list[Deviation]] = {pid: [] for pid in reviews}
    for i, entry in enumerate(raw.get("deviation", [])):
        where = f"deviation {i} ({entry.get('paper', '?')}: {entry.get('what', '?')})"
        deviation = _build(Deviation, entry, where)
        if deviation.paper not in reviews:
            raise ValueError(f"{where}: paper {deviation.paper!r} has no [[review]] entry")
        if deviation.effect not in EFFECTS:
            raise ValueError(f"{where}: effect must be one of {EFFECTS}, got {deviation.effect!r}")
        found[deviation.paper].append(deviation)
    return {
        pid: Review(
            **{**{f.name: getattr(r, f.name) for f in fields(Review)}, "deviations": tuple(found[pid])}
        )
        for pid, r in sorted(reviews.items())
    }


_Entry = TypeVar("_Entry", "Review", "Deviation")


def _build(cls: type[_Entry], entry: dict[str, Any], where: str, exclude: Collection[str] = ()) -> _Entry:
    allowed = {f.name for f in fields(cls)} - set(exclude)
    unknown = set(entry) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    for name, value in entry.items():
        if isinstance(value, str) and not value.strip():
            raise ValueError(f"{where}: {name} must not be empty")
        if name != "reviewed" and not isinstance(value, str):
            raise ValueError(f"{where}: {name} must be a string, got {type(value).__name__}")
    try:
        return cls(**entry)
    except TypeError as err:
        raise ValueError(f"{where}: {err}") from None
