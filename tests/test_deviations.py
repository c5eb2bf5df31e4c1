"""Each implemented paper's deviations from its official code (``deviations.toml``, read by
:func:`icml25.kernels.catalog.load_deviations`): well formed, complete, and shown in the package READMEs."""

from __future__ import annotations

import shutil
from pathlib import Path

import catalog
import pytest
from conftest import ROOT

from icml25.kernels import catalog as shipped

ISSUE_85 = ("P01", "P03", "P05", "P22", "P36", "P54")
"""The papers whose official code was read line by line against ours (issue 85)."""


def test_every_implemented_paper_has_a_review_and_reviewed_ones_say_what_was_compared() -> None:
    papers = catalog.load()
    reviews = catalog.load_deviations()
    implemented = [p.id for p in papers if p.status == "implemented"]
    assert sorted(reviews) == implemented
    for pid, review in reviews.items():
        assert review.repository == "none" or "/" in review.repository, pid
        if review.reviewed:
            assert review.read.strip(), f"{pid}: a reviewed paper names what was compared"
        else:  # an unread official repository is said to be unread, never shown as an empty list
            assert "not yet compared line by line" in review.markdown(), pid
            assert "None found" not in review.markdown(), pid
        for d in review.deviations:
            assert d.paper == pid and d.effect in shipped.EFFECTS
            assert all(getattr(d, f).strip() for f in ("what", "official", "where", "ours", "why", "impact"))


def test_the_papers_read_against_their_official_code_list_their_deviations() -> None:
    reviews = catalog.load_deviations()
    for pid in ISSUE_85:
        assert reviews[pid].reviewed and reviews[pid].repository != "none", pid
        assert len(reviews[pid].deviations) >= 2, pid
    whats = {d.what for d in reviews["P54"].deviations}
    assert {"Official protocol", "PCMCI test settings"} <= whats
    assert not {"Lag-1 self-links", "Edge readout"} & whats  # aligned: the official behaviour is the default


def test_the_installed_icml25_kernels_ships_the_same_list() -> None:
    assert shipped.load_deviations() == catalog.load_deviations()


def _entry(**fields: object) -> str:
    base = {
        "paper": "P05",
        "what": "Low-level policy",
        "official": "an actor-critic",
        "where": "gas.py:1",
        "ours": "behaviour cloning",
        "why": "CPU budget",
        "effect": "expected",
        "impact": "not measured",
    }
    base.update(fields)
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in base.items() if v is not None)
    return '[[review]]\npaper = "P05"\nrepository = "o/r"\nreviewed = false\n\n[[deviation]]\n' + body + "\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_entry(why=" "), "why must not be empty"),
        (_entry(impact=None), "missing 1 required positional argument: 'impact'"),
        (_entry(effect="large"), "effect must be one of"),
        (_entry(colour="red"), r"unknown fields \['colour'\]"),
        (_entry(paper="P47"), "paper 'P47' has no"),
        (_entry().replace('paper = "P05"\nrepository', 'paper = "P47"\nrepository', 1), "implemented paper"),
        (_entry().replace('"o/r"', '"a repository"'), "repository must be owner/name or 'none'"),
        (_entry().replace("reviewed = false", "reviewed = true"), "needs read"),
        (_entry().replace("reviewed = false", 'reviewed = "no"'), "reviewed must be true or false"),
        ('[[review]]\npaper = "P05"\nrepository = "none"\nreviewed = false\n' * 2, "a second"),
    ],
)
def test_load_rejects_a_malformed_entry(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shipped.load_deviations_text(text, papers=["P05"])


def test_an_empty_list_is_a_claim_only_after_the_official_code_was_read() -> None:
    unread = '[[review]]\npaper = "P05"\nrepository = "o/r"\nreviewed = false\n'
    read = '[[review]]\npaper = "P05"\nrepository = "o/r"\nreviewed = true\nread = "gas.py"\n'
    assert shipped.load_deviations_text(unread, papers=["P05"])["P05"].markdown().endswith("None listed yet.")
    assert shipped.load_deviations_text(read, papers=["P05"])["P05"].markdown().endswith("None found.")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """What write_deviations and deviation_problems read, to break on purpose."""
    for rel in [catalog.CATALOG_PATH, catalog.DEVIATIONS_PATH] + [
        f"{d}/README.md" for d in catalog.PACKAGE_DIRS.values()
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_the_package_readmes_show_every_list_as_generated(scratch: Path) -> None:
    assert catalog.deviation_problems(ROOT) == []
    assert catalog.write_deviations(scratch) == []  # nothing to regenerate


def test_an_edited_list_is_out_of_date_until_regenerated(scratch: Path) -> None:
    data = scratch / catalog.DEVIATIONS_PATH
    data.write_text(data.read_text().replace('what = "Base input"', 'what = "Base in-put"'))
    problems = catalog.deviation_problems(scratch)
    assert problems == [
        "packages/causal-discovery/README.md: the deviation list of P54 is out of date "
        "(python tools/catalog.py --write-deviations)"
    ]
    assert catalog.write_deviations(scratch) == [scratch / "packages/causal-discovery/README.md"]
    assert catalog.deviation_problems(scratch) == []
    assert "**Base in-put.**" in (scratch / "packages/causal-discovery/README.md").read_text()


def test_a_missing_block_or_review_is_reported(scratch: Path) -> None:
    readme = scratch / "packages/rl/README.md"
    start, end = shipped.deviations_block("P05")
    text = readme.read_text()
    readme.write_text(text[: text.index(start)] + text[text.index(end) + len(end) :])
    data = scratch / catalog.DEVIATIONS_PATH
    text = data.read_text()
    i = text.index('[[review]]\npaper = "P43"')
    data.write_text(text[:i] + text[text.index("[[review]]", i + 1) :])
    problems = catalog.deviation_problems(scratch)
    assert any("0 deviation blocks for P05" in line for line in problems)
    assert any(line.startswith("P43: no [[review]]") for line in problems)


def test_a_block_outside_its_papers_section_is_reported(scratch: Path) -> None:
    readme = scratch / "packages/rl/README.md"
    start, end = shipped.deviations_block("P05")
    text = readme.read_text()
    block = text[text.index(start) : text.index(end) + len(end)]
    text = text.replace(block, "")
    readme.write_text(text.replace("## Tests", block + "\n\n## Tests", 1))
    assert any("not in its section" in line for line in catalog.deviation_problems(scratch))
