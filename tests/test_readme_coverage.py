"""Every README's ```python blocks are executed by a test: each package's own `tests/test_readme_examples.py`
runs its README's blocks in that package's session (its wheel, its extras); the top-level README and
CONTRIBUTING.md carry none (commands only), which this checks, so a block added there cannot go untested."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, workspace

from icml25.kernels.readme_examples import readme_examples

MEMBERS = workspace.members(ROOT)


@pytest.mark.parametrize("name", list(MEMBERS))
def test_each_package_runs_every_block_of_its_readme(name: str) -> None:
    folder = ROOT / MEMBERS[name].folder
    test = folder / "tests" / "test_readme_examples.py"
    assert test.is_file(), f"{test.relative_to(ROOT)} is missing: copy it from another package"
    assert f'readme_params(README, "icml25-{name}")' in test.read_text(encoding="utf-8")
    readme = folder / "README.md"
    examples = readme_examples(readme, f"icml25-{name}")
    assert len(examples) == readme.read_text(encoding="utf-8").count("```python") > 0
    print(name, [e.id for e in examples])  # the list of blocks, shown with -s


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md"])
def test_top_level_documents_have_no_untested_python_blocks(doc: str) -> None:
    assert readme_examples(Path(ROOT / doc)) == [], f"{doc}: move Python examples to a package README"
