"""The catalog, README table, entry points and modules agree; the catalog's content is sane."""

from __future__ import annotations

import shutil
from pathlib import Path

import catalog
import pytest
from conftest import ROOT


def test_repository_is_consistent() -> None:
    assert catalog.check(ROOT) == []


def test_catalog_lists_all_55_papers_with_p47_out_of_scope() -> None:
    papers = catalog.load()
    assert [p.id for p in papers] == [f"P{i:02d}" for i in range(55)]
    by_id = {p.id: p for p in papers}
    assert by_id["P47"].status == "out-of-scope" and "no algorithm" in by_id["P47"].reason
    assert all(p.status in catalog.STATUSES for p in papers)


@pytest.fixture
def scratch_repo(tmp_path: Path) -> Path:
    """A copy of what catalog.check reads, to break on purpose."""
    for rel in ["README.md", "tools/catalog.toml"] + [
        f"{d}/pyproject.toml" for d in catalog.PACKAGE_DIRS.values()
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_check_reports_a_stale_readme(scratch_repo: Path) -> None:
    readme = scratch_repo / "README.md"
    readme.write_text(readme.read_text().replace("| P05 |", "| P5 |"))
    assert any("out of date" in line for line in catalog.check(scratch_repo))


def _planned_paper() -> catalog.Paper:
    return next(p for p in catalog.load() if p.status == "planned" and p.package in catalog.PACKAGE_DIRS)


def test_check_reports_an_entry_point_for_a_planned_paper(scratch_repo: Path) -> None:
    paper = _planned_paper()
    pyproject = scratch_repo / catalog.PACKAGE_DIRS[paper.package] / "pyproject.toml"
    group = '[project.entry-points."icml25.papers"]'
    target = f'{paper.id} = "icml25.{paper.area}.experiments.{paper.slug.replace("-", "_")}"'
    pyproject.write_text(pyproject.read_text().replace(group, f"{group}\n{target}"))
    problems = catalog.check(scratch_repo)
    assert any(line.startswith(f"{paper.id}:") and "registers an entry point" in line for line in problems)


def test_check_reports_an_implemented_paper_without_module(scratch_repo: Path) -> None:
    paper = _planned_paper()
    cat = scratch_repo / "tools/catalog.toml"
    text = cat.read_text()
    at = text.index(f'id = "{paper.id}"')
    name = paper.slug.replace("-", "_")
    implemented = (
        f'status = "implemented"\nmodule = "icml25.{paper.area}.{name}"\n'
        f'entry_point = "icml25.{paper.area}.experiments.{name}"'
    )
    cat.write_text(text[:at] + text[at:].replace('status = "planned"', implemented, 1))
    catalog.write_readme(catalog.load(cat), scratch_repo / "README.md")
    problems = catalog.check(scratch_repo)
    assert any(line.startswith(f"{paper.id}:") and "does not exist" in line for line in problems)
    assert any(line.startswith(f"{paper.id}:") and "pyproject has None" in line for line in problems)


def test_load_rejects_implemented_paper_without_entry_point(tmp_path: Path) -> None:
    text = (
        (ROOT / "tools/catalog.toml").read_text().replace('status = "planned"', 'status = "implemented"', 1)
    )
    (tmp_path / "catalog.toml").write_text(text)
    with pytest.raises(ValueError, match="P00: an implemented paper needs module"):
        catalog.load(tmp_path / "catalog.toml")
