"""icml25.kernels.provenance: the source closure of an experiment module and its hash (the results ledger's
``source_hash``), on a small fake ``icml25`` tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from icml25.kernels import provenance


def _tree(tmp_path: Path, files: dict[str, str]) -> provenance.Finder:
    for rel, text in files.items():
        path = tmp_path / "icml25" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return provenance.find_in_tree([tmp_path])


FILES = {
    # an area root re-exporting two papers: never hashed, followed only for the names asked for
    "area/__init__.py": "from icml25.area.paper_a import fit_a\nfrom icml25.area.paper_b import fit_b\n",
    "area/paper_a.py": "from .common import helper\nfrom icml25.kernels.ops import op\ndef fit_a(): ...\n",
    "area/paper_b.py": "def fit_b(): ...\n",
    "area/common.py": "import numpy\ndef helper(): ...\n",
    "area/experiments/__init__.py": "",
    "area/experiments/a.py": (
        "from icml25.area import fit_a\nfrom icml25.kernels.experiment import Check\n"
        "def run():\n    from icml25.area.lazy_extra import hf  # a lazy import is code the run may use\n"
    ),
    "area/lazy_extra.py": "hf = 1\n",
    "kernels/__init__.py": "from icml25.kernels.report import Report\n",
    "kernels/ops.py": "def op(): ...\n",
    "kernels/experiment.py": "class Check: ...\n",
    "kernels/report.py": "class Report: ...\n",
}


def test_the_closure_follows_imports_but_not_roots_other_papers_or_plumbing(tmp_path: Path) -> None:
    find = _tree(tmp_path, FILES)
    assert sorted(provenance.source_closure("icml25.area.experiments.a", find)) == [
        "icml25.area.common",
        "icml25.area.experiments",
        "icml25.area.experiments.a",
        "icml25.area.lazy_extra",
        "icml25.area.paper_a",
        "icml25.kernels.ops",
    ]


@pytest.mark.parametrize(
    ("rel", "changes"),
    [
        ("area/common.py", True),  # the paper's shared helper
        ("kernels/ops.py", True),  # a kernel it calls
        ("area/paper_b.py", False),  # another paper of the area
        ("area/__init__.py", False),  # the area root (a new export)
        ("kernels/report.py", False),  # reporting plumbing
    ],
)
def test_the_hash_changes_exactly_when_the_closure_does(tmp_path: Path, rel: str, changes: bool) -> None:
    find = _tree(tmp_path, FILES)
    before = provenance.source_hash("icml25.area.experiments.a", find)
    path = tmp_path / "icml25" / rel
    path.write_text(path.read_text() + "\n# edited\n")
    after = provenance.source_hash("icml25.area.experiments.a", provenance.find_in_tree([tmp_path]))
    assert (after != before) is changes


def test_the_installed_finder_agrees_with_the_tree(tmp_path: Path) -> None:
    import icml25.kernels

    src = Path(icml25.kernels.__file__).parent.parent.parent
    module = "icml25.kernels.sparse_attention"
    assert provenance.source_hash(module) == provenance.source_hash(module, provenance.find_in_tree([src]))


def test_an_unknown_module_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"module must be an icml25 module that can be found, got 'icml25\.nope'"
    ):
        provenance.source_closure("icml25.nope", _tree(tmp_path, FILES))


def test_a_lazy_root_is_followed_through_its_type_checking_block_like_an_eager_one(tmp_path: Path) -> None:
    """An area root that is a lazy namespace (icml25.kernels.lazy) binds its names in ``if TYPE_CHECKING:``:
    the closure is the one its eager form gives, and the lazy helper itself is never part of it."""
    eager = provenance.source_closure("icml25.area.experiments.a", _tree(tmp_path / "eager", FILES))
    lazy_root = (
        "from typing import TYPE_CHECKING\nfrom icml25.kernels.lazy import lazy_namespace\n"
        "if TYPE_CHECKING:\n    from icml25.area.paper_a import fit_a\n    from icml25.area.paper_b import fit_b\n"
        "else:\n    __getattr__, __dir__ = lazy_namespace(__name__, __file__)\n"
    )
    files = {**FILES, "area/__init__.py": lazy_root, "kernels/lazy.py": "def lazy_namespace(): ...\n"}
    lazy = provenance.source_closure("icml25.area.experiments.a", _tree(tmp_path / "lazy", files))
    assert lazy == eager
    assert "icml25.kernels.lazy" in provenance.PLUMBING
