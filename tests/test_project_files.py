"""The files people look for at the top of the repository: LICENSE, CITATION.cff, CHANGELOG.md."""

from __future__ import annotations

import re

from conftest import ROOT, VERSION


def _cff_fields(text: str) -> dict[str, str]:
    """The top-level ``key: value`` scalars of CITATION.cff (plain YAML; no YAML library needed)."""
    fields = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z-]+):\s*(.*?)\s*$", line)
        if match:
            fields[match.group(1)] = match.group(2).strip('"')
    return fields


def test_citation_cff_describes_this_release() -> None:
    fields = _cff_fields((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert fields["cff-version"] == "1.2.0" and fields["type"] == "software"
    assert fields["license"] == "MIT" and fields["version"] == VERSION
    assert fields["title"] and "message" in fields and "authors" in fields
    assert "icml25 cite" in (ROOT / "CITATION.cff").read_text(encoding="utf-8")


def test_changelog_keeps_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n") and "keepachangelog.com" in text
    assert "## [Unreleased]" in text
    sections = re.findall(r"^### (\w+)$", text, re.M)
    assert sections and set(sections) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_license_is_mit_as_every_package_declares() -> None:
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License\n")
    for pyproject in [
        ROOT / "shared-kernels/pyproject.toml",
        *sorted(ROOT.glob("packages/*/pyproject.toml")),
    ]:
        text = pyproject.read_text(encoding="utf-8")
        assert 'license = "MIT"' in text and 'license-files = ["LICENSE"]' in text, pyproject
