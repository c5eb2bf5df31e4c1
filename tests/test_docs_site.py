"""docs/build_site.py writes the API reference's sources: a page per area (its README, then a section per
implemented paper with its library and experiment modules) and a strict mkdocs config. The site itself is
built, warnings as errors, by ``nox -s docs``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import catalog
import pytest
from conftest import AREAS, ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "docs" / "build_site.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.OUT = tmp_path_factory.mktemp("docs")
    return module.build().parent


def test_one_page_per_area_and_one_section_per_implemented_paper(site: Path) -> None:
    config = json.loads((site / "mkdocs.yml").read_text())
    assert config["strict"] is True
    assert [next(iter(entry.values())) for entry in config["nav"]] == [
        "index.md", "kernels.md", *(f"{area}.md" for area in AREAS)
    ]  # fmt: skip
    for paper in catalog.load():
        if paper.status != "implemented":
            continue
        page = (site / "pages" / f"{paper.package}.md").read_text()
        assert f"\n### {paper.id} — {paper.title}\n" in page
        section = page.split(f"\n### {paper.id} — ")[1].split("\n### ")[0]
        assert f"::: {paper.module}\n" in section and f"::: {paper.entry_point}\n" in section


def test_each_area_page_starts_with_its_readme(site: Path) -> None:
    for area in AREAS:
        readme = (ROOT / "packages" / area / "README.md").read_text().splitlines()
        page = (site / "pages" / f"{area}.md").read_text()
        assert page.startswith(f"# icml25-{area}\n")
        assert readme[2] in page  # the README's first paragraph, below the page title
