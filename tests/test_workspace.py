"""One source for the distributions and the version: tools/workspace.py reads the uv workspace."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import workspace
from conftest import AREAS, ROOT, VERSION


def test_every_version_agrees_and_no_package_hard_codes_it() -> None:
    assert workspace.version_problems(ROOT) == []


def test_the_workspace_lists_kernels_and_the_six_areas() -> None:
    members = workspace.members(ROOT)
    assert list(members) == ["kernels", *AREAS]
    assert len(AREAS) == 6 and all(
        m.folder.startswith("packages/") for n, m in members.items() if n != "kernels"
    )
    assert members["llm-efficiency"].test_extras == ("plots", "hf")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tests" / "downstream").mkdir(parents=True)
    shutil.copy(ROOT / "tests/downstream/pyproject.toml", tmp_path / "tests/downstream/pyproject.toml")
    for m in workspace.members(ROOT).values():
        init = Path(m.folder) / "src" / "icml25" / m.area / "__init__.py"
        for rel in (Path(m.folder) / "pyproject.toml", init):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_bump_sets_every_version_and_range_in_one_command(scratch: Path) -> None:
    changed = workspace.bump("0.2.0", scratch, lock=False)
    assert len(changed) == 2 + len(workspace.members(scratch))
    assert workspace.version(scratch) == "0.2.0" and workspace.version_problems(scratch) == []
    downstream = (scratch / "tests/downstream/pyproject.toml").read_text()
    assert '"icml25-causal-discovery>=0.2,<0.3"' in downstream
    assert '"icml25-kernels>=0.2,<0.3"' in (scratch / "packages/rl/pyproject.toml").read_text()
    with pytest.raises(ValueError, match="version must look like"):
        workspace.bump("v1", scratch, lock=False)


def test_a_disagreeing_version_or_literal_is_reported(scratch: Path) -> None:
    rl = scratch / "packages/rl/pyproject.toml"
    rl.write_text(rl.read_text().replace(f'version = "{VERSION}"', 'version = "9.9.9"'))
    assert any("versions disagree" in line for line in workspace.version_problems(scratch))
    rl.write_text(rl.read_text().replace('version = "9.9.9"', f'version = "{VERSION}"'))
    init = scratch / "packages/rl/src/icml25/rl/__init__.py"
    init.write_text(init.read_text() + f'\n__version__ = "{VERSION}"\n')
    assert workspace.version_problems(scratch) == [
        "packages/rl/src/icml25/rl/__init__.py: __version__ is a literal; read it from the metadata"
    ]
