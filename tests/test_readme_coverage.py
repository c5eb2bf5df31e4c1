"""Every README's ```python blocks are executed by a test: each package's own `tests/test_readme_examples.py`
runs its README's blocks in that package's session (its wheel, its extras); the top-level README and
CONTRIBUTING.md carry none (commands only), which this checks, so a block added there cannot go untested."""

from __future__ import annotations

import re
import sys
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


@pytest.mark.parametrize("name", list(MEMBERS))
def test_each_install_line_names_the_extras_its_examples_use(name: str) -> None:
    """A reader who copies the package README's install line can run its examples: the line names every extra
    a block declares (``# extra: X``), from the checkout and in the PyPI form."""
    folder = MEMBERS[name].folder
    readme = ROOT / folder / "README.md"
    used = {x for e in readme_examples(readme, f"icml25-{name}") for x in e.extras}
    text = readme.read_text(encoding="utf-8")
    top = text[: text.index("```python")]  # the install block comes before the first example
    for form in (rf'"\./{re.escape(folder)}\[([^\]]*)\]"', rf'"icml25-{name}\[([^\]]*)\]"'):
        match = re.search(form, top)
        if not used and match is None:
            continue
        assert match, f"{folder}/README.md: no install line {form} above the first example"
        assert used <= set(match.group(1).split(",")), (folder, sorted(used))
    assert "pip install ./shared-kernels" in top, f"{folder}/README.md: lead with the checkout install"


def test_the_top_level_readme_leads_with_the_install_that_works_from_a_checkout() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_pip = text.index("pip install ")
    assert text[first_pip:].startswith("pip install torch --index-url") or text.index(
        "pip install ./shared-kernels"
    ) < text.index("pip install icml25-"), "the first install command must work without PyPI"
    assert text.index("icml25 reproduce --only P05") < text.index("Once published on PyPI")
    for name, member in MEMBERS.items():
        if name == "kernels":
            continue
        readme = ROOT / member.folder / "README.md"
        (line,) = re.findall(
            rf'pip install \./shared-kernels "\./{member.folder}\[[^\]]*\]"', readme.read_text()
        )
        assert line in text, f"README.md's area table lacks {line}"


# import name of an extra's requirement, where it differs from the distribution name
_IMPORT_NAMES = {"causal-learn": "causallearn", "sae-lens": "sae_lens", "flwr": "flwr"}


@pytest.mark.parametrize("name", list(MEMBERS))
def test_a_block_that_imports_an_extras_library_declares_the_extra(name: str) -> None:
    """``from transformers import ...`` in a block without ``# extra: hf`` would fail, not skip, where the extra
    is missing; a ``# requires:`` module (a library no extra is needed for) is also accepted."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same parser, from PyPI (an icml25-kernels dependency there)
        import tomli as tomllib

    folder = ROOT / MEMBERS[name].folder
    extras = tomllib.loads((folder / "pyproject.toml").read_text())["project"].get(
        "optional-dependencies", {}
    )
    modules: dict[str, set[str]] = {}
    for extra, reqs in extras.items():
        for req in reqs:
            dist = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req).group(0).lower()
            modules.setdefault(_IMPORT_NAMES.get(dist, dist.replace("-", "_")), set()).add(extra)
    undeclared = []
    for example in readme_examples(folder / "README.md", f"icml25-{name}"):
        for module in re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", example.code, re.M):
            if (
                module in modules
                and not (modules[module] & set(example.extras))
                and module not in example.requires
            ):
                undeclared.append(f"{example.id}: imports {module} (extra {sorted(modules[module])})")
    assert undeclared == []
